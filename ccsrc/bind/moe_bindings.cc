// Python bindings of the MoE helpers (1-bit routing masks). The packing loops run without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "bind/bindings.h"
#include "moe/routing_bits.h"

namespace py = pybind11;

namespace mshyper::bind {

void BindMoe(py::module_& m) {
  m.def(
      "pack_routing",
      [](py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast> mask) {
        if (mask.ndim() != 2) throw py::value_error("pack_routing: mask must be 2-D [tokens, experts]");
        const auto t = static_cast<std::size_t>(mask.shape(0));
        const auto e = static_cast<std::size_t>(mask.shape(1));
        py::array_t<std::uint8_t> out(static_cast<py::ssize_t>(moe::PackedRoutingBytes(t, e)));
        std::string error;
        bool ok;
        {
          py::gil_scoped_release release;
          ok = moe::PackRouting(mask.data(), t, e, out.mutable_data(), &error);
        }
        if (!ok) throw py::value_error("pack_routing: " + error);
        return out;
      },
      py::arg("mask"), "Pack a [T, E] 0/1 mask into ceil(T*E/8) bytes (uint8 array).");
  m.def(
      "unpack_routing",
      [](py::array_t<std::uint8_t, py::array::c_style> packed, long long num_tokens, long long num_experts) {
        if (num_tokens < 0 || num_experts < 0) throw py::value_error("unpack_routing: sizes must be >= 0");
        const auto t = static_cast<std::size_t>(num_tokens);
        const auto e = static_cast<std::size_t>(num_experts);
        std::size_t entries = 0;
        if (__builtin_mul_overflow(t, e, &entries) || entries > (std::size_t{1} << 62)) {
          throw py::value_error("unpack_routing: a " + std::to_string(t) + " x " + std::to_string(e) +
                                " mask is too large");
        }
        if (packed.ndim() != 1 || static_cast<std::size_t>(packed.shape(0)) != moe::PackedRoutingBytes(t, e)) {
          throw py::value_error("unpack_routing: packed holds " + std::to_string(packed.size()) + " bytes; a " +
                                std::to_string(t) + " x " + std::to_string(e) + " mask needs " +
                                std::to_string(moe::PackedRoutingBytes(t, e)));
        }
        py::array_t<std::uint8_t> mask({static_cast<py::ssize_t>(t), static_cast<py::ssize_t>(e)});
        std::string error;
        bool ok;
        {
          py::gil_scoped_release release;
          ok = moe::UnpackRouting(packed.data(), t, e, mask.mutable_data(), &error);
        }
        if (!ok) throw py::value_error("unpack_routing: " + error);
        return mask;
      },
      py::arg("packed"), py::arg("num_tokens"), py::arg("num_experts"),
      "Unpack ceil(T*E/8) bytes into a [T, E] uint8 0/1 mask.");
}

}  // namespace mshyper::bind
