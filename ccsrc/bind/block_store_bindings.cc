// Python bindings of the block store, its errors and CRC32C. Every call that copies data, does
// I/O or may wait releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "bind/arg_helpers.h"
#include "bind/bindings.h"
#include "store/block_store.h"
#include "store/crc32c.h"

namespace py = pybind11;

namespace mshyper::bind {
namespace {

using store::BlockStore;
using store::StoreConfig;
using store::StoreStats;
using store::Tier;

py::dict StoreStatsDict(const StoreStats& s, uint64_t block_size) {
  py::dict d;
  const char* names[] = {"device", "host", "disk"};
  for (int t = 0; t < store::kNumTiers; ++t) {
    py::dict tier;
    tier["capacity_blocks"] = s.tiers[t].capacity_blocks;
    tier["used_blocks"] = s.tiers[t].used_blocks;
    tier["peak_blocks"] = s.tiers[t].peak_blocks;
    tier["peak_bytes"] = s.tiers[t].peak_blocks * block_size;
    tier["evictions"] = s.tiers[t].evictions;
    d[names[t]] = tier;
  }
  py::dict bytes, copies, copy_ns;
  for (int a = 0; a < store::kNumTiers; ++a) {
    for (int b = 0; b < store::kNumTiers; ++b) {
      if (a == b) continue;
      std::string key = std::string(names[a]) + "->" + names[b];
      bytes[py::str(key)] = s.bytes_moved[a][b];
      copies[py::str(key)] = s.copies[a][b];
      copy_ns[py::str(key)] = s.copy_ns[a][b];
    }
  }
  d["bytes_moved"] = bytes;
  d["copies"] = copies;
  d["copy_ns"] = copy_ns;
  d["transfer_busy_ns"] = s.transfer_busy_ns;
  d["reads"] = s.reads;
  d["writes"] = s.writes;
  d["read_retries"] = s.read_retries;
  d["crc_failures"] = s.crc_failures;
  d["coalesced_reads"] = s.coalesced_reads;
  d["blocks"] = s.blocks;
  d["block_size"] = block_size;
  return d;
}

}  // namespace

void BindBlockStore(py::module_& m) {
  auto store_error = py::register_exception<store::StoreError>(m, "StoreError", PyExc_RuntimeError);
  py::register_exception<store::CapacityError>(m, "CapacityError", store_error.ptr());
  py::register_exception<store::DiskError>(m, "DiskError", store_error.ptr());
  py::register_exception<store::CorruptBlockError>(m, "CorruptBlockError", store_error.ptr());

  m.def("crc32c", [](py::buffer data, uint32_t crc) {
    py::buffer_info info;
    ConstBytes b = BytesOf(data, info);
    py::gil_scoped_release nogil;
    return store::Crc32c(b.ptr, b.len, crc);
  }, py::arg("data"), py::arg("crc") = 0, "CRC32C of a contiguous buffer (hardware if available).");
  m.def("crc32c_software", [](py::buffer data, uint32_t crc) {
    py::buffer_info info;
    ConstBytes b = BytesOf(data, info);
    py::gil_scoped_release nogil;
    return store::Crc32cSoftware(b.ptr, b.len, crc);
  }, py::arg("data"), py::arg("crc") = 0, "Table-driven CRC32C (reference implementation).");
  m.def("crc32c_hardware", &store::Crc32cHardware, "True when crc32c uses the SSE4.2 instruction.");
  m.def("crc32c_chunks", [](py::buffer data, uint64_t chunk_bytes) {
    if (chunk_bytes == 0) throw py::value_error("chunk_bytes: expected an int >= 1, got 0");
    py::buffer_info info;
    ConstBytes b = BytesOf(data, info);
    const uint64_t n = (b.len + chunk_bytes - 1) / chunk_bytes;
    py::array_t<uint32_t> out(static_cast<py::ssize_t>(n));
    uint32_t* crcs = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      const auto* p = static_cast<const uint8_t*>(b.ptr);
      for (uint64_t i = 0; i < n; ++i) {
        crcs[i] = store::Crc32c(p + i * chunk_bytes, std::min<uint64_t>(chunk_bytes, b.len - i * chunk_bytes));
      }
    }
    return out;
  }, py::arg("data"), py::arg("chunk_bytes"),
     "CRC32C of every chunk_bytes piece of a contiguous buffer (the last may be shorter), as uint32.");
  m.def("copy_crc32c_chunks", [](py::buffer src, py::buffer dst, uint64_t chunk_bytes) {
    if (chunk_bytes == 0) throw py::value_error("chunk_bytes: expected an int >= 1, got 0");
    py::buffer_info src_info, dst_info;
    ConstBytes s = BytesOf(src, src_info, "src");
    uint64_t dst_len = 0;
    void* d = WritableBytesOf(dst, dst_info, &dst_len);
    if (dst_len != s.len) {
      throw py::value_error("dst: expected " + std::to_string(s.len) + " bytes (as src), got " +
                            std::to_string(dst_len));
    }
    const uint64_t n = (s.len + chunk_bytes - 1) / chunk_bytes;
    py::array_t<uint32_t> out(static_cast<py::ssize_t>(n));
    uint32_t* crcs = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      // copy a block, then checksum the copy while it is still in the cache: one pass over memory
      constexpr uint64_t kBlock = 64 << 10;
      const auto* from = static_cast<const uint8_t*>(s.ptr);
      auto* to = static_cast<uint8_t*>(d);
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t begin = i * chunk_bytes, end = std::min<uint64_t>(begin + chunk_bytes, s.len);
        uint32_t crc = 0;
        for (uint64_t at = begin; at < end; at += kBlock) {
          const uint64_t len = std::min<uint64_t>(kBlock, end - at);
          std::memcpy(to + at, from + at, len);
          crc = store::Crc32c(to + at, len, crc);
        }
        crcs[i] = crc;
      }
    }
    return out;
  }, py::arg("src"), py::arg("dst"), py::arg("chunk_bytes"),
     "Copy the contiguous buffer src into dst (same size) and return the CRC32C of every chunk_bytes piece "
     "of the copy (as crc32c_chunks(dst)), in one pass over memory.");

  py::class_<BlockStore, std::shared_ptr<BlockStore>>(m, "BlockStore",
      "Versioned cache-block store over device / host / disk tiers (see docs/offload.md).")
      .def(py::init([](uint64_t block_size, uint64_t device_capacity, uint64_t host_capacity,
                       const std::string& disk_dir, uint64_t disk_capacity, uint32_t blocks_per_file,
                       bool drop_page_cache, bool direct_io) {
             StoreConfig c;
             c.block_size = block_size;
             c.device_capacity = device_capacity;
             c.host_capacity = host_capacity;
             c.disk_dir = disk_dir;
             c.disk_capacity = disk_capacity;
             c.blocks_per_file = blocks_per_file;
             c.drop_page_cache = drop_page_cache;
             c.direct_io = direct_io;
             return std::make_shared<BlockStore>(c);
           }),
           py::arg("block_size"), py::arg("device_capacity"), py::arg("host_capacity"),
           py::arg("disk_dir") = "", py::arg("disk_capacity") = 0, py::arg("blocks_per_file") = 8,
           py::arg("drop_page_cache") = false, py::arg("direct_io") = true)
      .def_property_readonly("block_size", &BlockStore::block_size)
      .def_property_readonly("disk_dir", [](const BlockStore& s) { return s.config().disk_dir; })
      .def("allocate", &BlockStore::Allocate, py::call_guard<py::gil_scoped_release>())
      .def("free", &BlockStore::Free, py::call_guard<py::gil_scoped_release>())
      .def("read", [](BlockStore& s, uint64_t id, uint64_t offset, py::object length) {
             const uint64_t len = length.is_none() ? s.block_size() - std::min(offset, s.block_size())
                                                   : length.cast<uint64_t>();
             py::array_t<uint8_t> out(static_cast<ssize_t>(len));
             uint8_t* p = out.mutable_data();
             {
               py::gil_scoped_release nogil;
               s.Read(id, offset, p, len);
             }
             return out;
           }, py::arg("id"), py::arg("offset") = 0, py::arg("length") = py::none(),
           "Copy of bytes [offset, offset+length) as a uint8 array.")
      .def("read_into", [](BlockStore& s, uint64_t id, py::buffer out, uint64_t offset) {
             py::buffer_info info;
             uint64_t len;
             void* p = WritableBytesOf(out, info, &len);
             py::gil_scoped_release nogil;
             s.Read(id, offset, p, len);
           }, py::arg("id"), py::arg("out"), py::arg("offset") = 0)
      .def("read_pinned_into", [](BlockStore& s, uint64_t id, const std::string& tier, py::buffer out,
                                  uint64_t offset) {
             py::buffer_info info;
             uint64_t len;
             void* p = WritableBytesOf(out, info, &len);
             const Tier t = ParseTier(tier);
             py::gil_scoped_release nogil;
             s.ReadPinned(id, t, offset, p, len);
           }, py::arg("id"), py::arg("tier"), py::arg("out"), py::arg("offset") = 0)
      .def("write", [](BlockStore& s, uint64_t id, py::buffer data, uint64_t offset) {
             py::buffer_info info;
             ConstBytes b = BytesOf(data, info);
             py::gil_scoped_release nogil;
             s.Write(id, offset, b.ptr, b.len);
           }, py::arg("id"), py::arg("data"), py::arg("offset") = 0)
      .def("pin", [](BlockStore& s, uint64_t id, const std::string& tier) {
             const Tier t = ParseTier(tier);
             py::gil_scoped_release nogil;
             s.Pin(id, t);
           }, py::arg("id"), py::arg("tier") = "device")
      .def("unpin", [](BlockStore& s, uint64_t id, const std::string& tier) {
             const Tier t = ParseTier(tier);
             py::gil_scoped_release nogil;
             s.Unpin(id, t);
           }, py::arg("id"), py::arg("tier") = "device")
      .def("fetch", [](BlockStore& s, std::vector<uint64_t> ids, const std::string& tier) {
             const Tier t = ParseTier(tier);
             py::gil_scoped_release nogil;
             s.Fetch(ids, t);
           }, py::arg("ids"), py::arg("tier") = "device")
      .def("evict", [](BlockStore& s, uint64_t id, const std::string& tier) {
             const Tier t = ParseTier(tier);
             py::gil_scoped_release nogil;
             return s.Evict(id, t);
           }, py::arg("id"), py::arg("tier"))
      .def("discard", &BlockStore::Discard, py::arg("id"), py::call_guard<py::gil_scoped_release>())
      .def("set_priority", &BlockStore::SetPriority, py::arg("id"), py::arg("priority"))
      .def("write_back", &BlockStore::WriteBack, py::arg("max_blocks"), py::call_guard<py::gil_scoped_release>())
      .def("version", &BlockStore::Version)
      .def("has_valid_copy", [](BlockStore& s, uint64_t id, const std::string& tier) {
             return s.HasValidCopy(id, ParseTier(tier));
           }, py::arg("id"), py::arg("tier"))
      .def("pin_count", [](BlockStore& s, uint64_t id, const std::string& tier) {
             return s.PinCount(id, ParseTier(tier));
           }, py::arg("id"), py::arg("tier") = "device")
      .def("disk_location", &BlockStore::DiskLocation)
      .def("lru_order", [](BlockStore& s, const std::string& tier) { return s.LruOrder(ParseTier(tier)); })
      .def("stats", [](BlockStore& s) { return StoreStatsDict(s.Stats(), s.block_size()); })
      .def("reset_peaks", &BlockStore::ResetPeaks);
}

}  // namespace mshyper::bind
