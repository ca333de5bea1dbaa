// Python bindings of the offload store (block store, tensor store, prefetch scheduler).
// Every call that copies data, does I/O or may wait releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <string>
#include <vector>

#include "aot/kernel_fence.h"
#include "aot/tensor_mailbox.h"
#include "optim/adam.h"
#include "bind/bindings.h"
#include "prefetch/background_thread.h"
#include "prefetch/prefetch_scheduler.h"
#include "store/block_store.h"
#include "store/crc32c.h"
#include "store/tensor_store.h"

namespace py = pybind11;

namespace mshyper::bind {
namespace {

using prefetch::PrefetchScheduler;
using prefetch::PrefetchStats;
using store::BlockStore;
using store::StoreConfig;
using store::StoreStats;
using store::TensorStore;
using store::Tier;

Tier ParseTier(const std::string& name) {
  if (name == "device") return Tier::kDevice;
  if (name == "host") return Tier::kHost;
  if (name == "disk") return Tier::kDisk;
  throw py::value_error("tier must be 'device', 'host' or 'disk', got '" + name + "'");
}

struct ConstBytes {
  const void* ptr;
  uint64_t len;
};

// A C-contiguous buffer of any dtype viewed as bytes.
ConstBytes BytesOf(const py::buffer& buf, py::buffer_info& info) {
  info = buf.request();
  ssize_t expect = info.itemsize;
  for (ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expect) {
      throw py::value_error("buffer must be C-contiguous");
    }
    expect *= info.shape[d];
  }
  return ConstBytes{info.ptr, static_cast<uint64_t>(info.size * info.itemsize)};
}

void* WritableBytesOf(const py::buffer& buf, py::buffer_info& info, uint64_t* len) {
  info = buf.request(true);
  ConstBytes b = BytesOf(buf, info);
  *len = b.len;
  return info.ptr;
}

// A mailbox / fence wait's timeout: any number of seconds (<= 0: no wait; inf: no limit) but NaN.
void CheckTimeoutArg(double timeout_s) {
  if (std::isnan(timeout_s)) throw py::value_error("timeout_s must be a number of seconds, got nan");
}

// An array that adam_step updates in place: a writeable C-contiguous float32 numpy array as it is
// (never a converted copy, whose update the caller would not see).
py::array_t<float, 0> InPlaceFloat32(const py::object& obj, const char* name) {
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error(std::string("adam_step: ") + name + " must be a float32 numpy array (updated in place), got " +
                         py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>());
  }
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!py::isinstance<py::array_t<float, 0>>(a)) {
    throw py::type_error(std::string("adam_step: ") + name + " must be float32 (updated in place), got " +
                         py::str(a.dtype()).cast<std::string>());
  }
  if (!(a.flags() & py::array::c_style)) {
    throw py::value_error(std::string("adam_step: arrays must be C-contiguous float32; ") + name + " is not");
  }
  if (!a.writeable()) throw py::value_error(std::string("adam_step: param, m and v must be writeable; ") + name + " is not");
  return py::reinterpret_borrow<py::array_t<float, 0>>(a);
}

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

py::dict PrefetchStatsDict(const PrefetchStats& s) {
  py::dict d;
  d["hits"] = s.hits;
  d["late"] = s.late;
  d["misses"] = s.misses;
  d["stall_ns"] = s.stall_ns;
  d["issued"] = s.issued;
  d["completed"] = s.completed;
  d["cancelled"] = s.cancelled;
  d["dropped"] = s.dropped;
  d["trace_invalidations"] = s.trace_invalidations;
  d["written_back"] = s.written_back;
  d["steps"] = s.steps;
  d["trace_length"] = s.trace_length;
  d["trace_valid"] = s.trace_valid;
  d["last_error"] = s.last_error;
  return d;
}

}  // namespace

void BindStore(py::module_& m) {
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

  py::class_<TensorStore, std::shared_ptr<TensorStore>>(m, "TensorStore",
      "Tensors over a BlockStore: large ones span blocks, small ones are packed.")
      .def(py::init<std::shared_ptr<BlockStore>>(), py::arg("block_store"))
      .def_property_readonly("block_store", &TensorStore::blocks)
      .def("put", [](TensorStore& s, py::buffer data) {
             py::buffer_info info;
             ConstBytes b = BytesOf(data, info);
             py::gil_scoped_release nogil;
             return s.Put(b.ptr, b.len);
           }, py::arg("data"))
      .def("update", [](TensorStore& s, uint64_t tid, py::buffer data) {
             py::buffer_info info;
             ConstBytes b = BytesOf(data, info);
             py::gil_scoped_release nogil;
             s.Update(tid, b.ptr, b.len);
           }, py::arg("tid"), py::arg("data"))
      .def("get_into", [](TensorStore& s, uint64_t tid, py::buffer out) {
             py::buffer_info info;
             uint64_t len;
             void* p = WritableBytesOf(out, info, &len);
             py::gil_scoped_release nogil;
             s.Get(tid, p, len);
           }, py::arg("tid"), py::arg("out"))
      .def("get_pinned_into", [](TensorStore& s, uint64_t tid, const std::string& tier, py::buffer out) {
             py::buffer_info info;
             uint64_t len;
             void* p = WritableBytesOf(out, info, &len);
             const Tier t = ParseTier(tier);
             py::gil_scoped_release nogil;
             s.GetPinned(tid, t, p, len);
           }, py::arg("tid"), py::arg("tier"), py::arg("out"))
      .def("get_bytes", [](TensorStore& s, uint64_t tid) {
             const uint64_t n = s.Size(tid);
             py::array_t<uint8_t> out(static_cast<ssize_t>(n));
             uint8_t* p = out.mutable_data();
             {
               py::gil_scoped_release nogil;
               s.Get(tid, p, n);
             }
             return out;
           }, py::arg("tid"))
      .def("size", &TensorStore::Size)
      .def("contains", &TensorStore::Contains)
      .def("extents", [](TensorStore& s, uint64_t tid) {
             py::list out;
             for (const auto& e : s.Extents(tid)) out.append(py::make_tuple(e.block, e.offset, e.length));
             return out;
           })
      .def("blocks", &TensorStore::Blocks)
      .def("erase", &TensorStore::Erase, py::call_guard<py::gil_scoped_release>())
      .def("discard", &TensorStore::Discard, py::arg("tid"), py::call_guard<py::gil_scoped_release>())
      .def("close_pack", &TensorStore::ClosePack, py::call_guard<py::gil_scoped_release>())
      .def("__len__", &TensorStore::Count);

  m.def("make_background_thread", &prefetch::MakeBackgroundThread, py::arg("name"), py::arg("nice"),
        "Names the calling thread and raises its nice value (0..19) so it yields the cores to the compute.");
  m.def("current_thread_nice", &prefetch::CurrentThreadNice, "The calling thread's nice value.");
  m.def("fence_new_id", &aot::FenceNewId, "A fresh kernel-fence id (see ops.KernelFence).");
  m.def("fence_signal", &aot::FenceSignal, py::arg("id"), "Marks a fence as passed (what the kernel does).");
  m.def("fence_poll", &aot::FencePoll, py::arg("id"), "True (and forgotten) if the fence has passed.");
  m.def("fence_wait", [](uint64_t id, double timeout_s) {
          CheckTimeoutArg(timeout_s);
          py::gil_scoped_release release;
          return aot::FenceWait(id, timeout_s);
        }, py::arg("id"), py::arg("timeout_s"),
        "Blocks (no spinning, GIL released) up to timeout_s for the fence; True (and forgotten) if it passed.");
  m.def("fence_forget", &aot::FenceForget, py::arg("id"), "Abandons a fence.");
  m.def("fence_pending", &aot::FencePending,
        "Fences passed but not consumed, plus those forgotten before they passed (a leak check).");

  m.def("mailbox_new_id", &aot::MailboxNewId, "A fresh tensor-mailbox id (see offload.TensorCopyOut).");
  m.def("mailbox_deliver", [](uint64_t id, py::buffer data) {
          py::buffer_info info = data.request();
          aot::MailboxDeliver(id, info.ptr, static_cast<size_t>(info.size * info.itemsize));
        }, py::arg("id"), py::arg("data"), "Delivers a copy of `data`'s bytes (what the kernel does).");
  m.def("mailbox_take", [](uint64_t id, double timeout_s) -> py::object {
          CheckTimeoutArg(timeout_s);
          std::vector<uint8_t> bytes;
          bool delivered;
          {
            py::gil_scoped_release release;
            delivered = aot::MailboxTake(id, timeout_s, &bytes);
          }
          if (!delivered) return py::none();
          auto* owned = new std::vector<uint8_t>(std::move(bytes));
          py::capsule owner(owned, [](void* p) { delete static_cast<std::vector<uint8_t>*>(p); });
          return py::array_t<uint8_t>({static_cast<py::ssize_t>(owned->size())}, {1}, owned->data(), owner);
        }, py::arg("id"), py::arg("timeout_s"),
        "Waits (GIL released) up to timeout_s for the mailbox: its bytes as a uint8 array (no copy), or None.");
  m.def("mailbox_forget", &aot::MailboxForget, py::arg("id"), "Abandons a mailbox.");
  m.def("mailbox_pending", &aot::MailboxPending,
        "Mailboxes delivered but not taken, plus those forgotten before delivery (a leak check).");

  m.def("adam_step", [](py::object param, py::object m_, py::object v, py::array_t<float, 0> grad, float lr_t,
                        float beta1, float beta2, float eps, bool nesterov) {
          py::array_t<float, 0> p = InPlaceFloat32(param, "param");
          py::array_t<float, 0> mv = InPlaceFloat32(m_, "m");
          py::array_t<float, 0> vv = InPlaceFloat32(v, "v");
          const py::ssize_t n = p.size();
          for (const auto* a : {&mv, &vv, &grad}) {
            if (a->size() != n) throw py::value_error("adam_step: param, m, v and grad must have the same size");
          }
          if (!(grad.flags() & py::array::c_style)) throw py::value_error("adam_step: arrays must be C-contiguous float32");
          float* pp = p.mutable_data();
          float* mp = mv.mutable_data();
          float* vp = vv.mutable_data();
          const float* gp = grad.data();
          py::gil_scoped_release release;
          optim::AdamStep(pp, mp, vp, gp, static_cast<size_t>(n), lr_t, beta1, beta2, eps, nesterov);
        }, py::arg("param"), py::arg("m"), py::arg("v"), py::arg("grad"), py::arg("lr_t"), py::arg("beta1"),
        py::arg("beta2"), py::arg("eps"), py::arg("nesterov"),
        "Adam's element-wise update in place on float32 arrays (GIL released); see ccsrc/optim/adam.h. param, m and v "
        "must be writeable C-contiguous float32 numpy arrays (TypeError otherwise: a converted copy would be updated "
        "and thrown away); grad may be anything convertible to float32 without loss.");

  m.def("set_default_tensor_store", &store::SetDefaultTensorStore, py::arg("store"),
        "Make `store` the instance the aot kernels use (None clears it).");
  m.def("default_tensor_store", &store::DefaultTensorStore);

  py::class_<PrefetchScheduler, std::shared_ptr<PrefetchScheduler>>(m, "PrefetchScheduler",
      "Trace-driven prefetcher with its own I/O worker threads.")
      .def(py::init([](std::shared_ptr<BlockStore> s, int depth, int workers, const std::string& target,
                       int max_batch, bool write_behind, int host_depth, int worker_nice) {
             return std::make_shared<PrefetchScheduler>(std::move(s), depth, workers, ParseTier(target),
                                                        max_batch, write_behind, host_depth, worker_nice);
           }),
           py::arg("store"), py::arg("depth"), py::arg("workers") = 2, py::arg("target") = "device",
           py::arg("max_batch") = 4, py::arg("write_behind") = true, py::arg("host_depth") = -1,
           py::arg("worker_nice") = 0)
      .def_property("depth", &PrefetchScheduler::depth, &PrefetchScheduler::SetDepth)
      .def_property("host_depth", &PrefetchScheduler::host_depth, &PrefetchScheduler::SetHostDepth)
      .def("begin_step", &PrefetchScheduler::BeginStep, py::call_guard<py::gil_scoped_release>())
      .def("acquire", &PrefetchScheduler::Acquire, py::arg("ids"), py::arg("record") = true,
           py::call_guard<py::gil_scoped_release>())
      .def("release", &PrefetchScheduler::Release, py::call_guard<py::gil_scoped_release>())
      .def("touch", &PrefetchScheduler::Touch, py::call_guard<py::gil_scoped_release>())
      .def("predict", &PrefetchScheduler::Predict)
      .def("trace", &PrefetchScheduler::Trace)
      .def("position", &PrefetchScheduler::Position)
      .def("drain", &PrefetchScheduler::Drain, py::call_guard<py::gil_scoped_release>())
      .def("stats", [](PrefetchScheduler& p) { return PrefetchStatsDict(p.Stats()); })
      .def("reset_stats", &PrefetchScheduler::ResetStats);
}

}  // namespace mshyper::bind
