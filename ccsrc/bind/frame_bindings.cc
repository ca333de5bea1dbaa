// Python bindings of the message framing (comm submodule): the limits and the parser of P2P
// message descriptors, so that mindspore_hyper.comm.p2p validates what a peer announces with the
// same code the fuzz driver (ccsrc/tools/comm_fuzz.cc) exercises.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bind/bindings.h"
#include "comm/frame.h"

namespace py = pybind11;

namespace mshyper::bind {

using namespace mshyper::comm;

namespace {

py::tuple Ints(const std::vector<int64_t>& v) {
  py::tuple t(v.size());
  for (size_t i = 0; i < v.size(); ++i) t[i] = py::int_(v[i]);
  return t;
}

}  // namespace

void BindFrame(py::module_& m) {
  py::dict limits;
  limits["head_words"] = kP2PHeadWords;
  limits["max_tag"] = kP2PMaxTag;
  limits["max_meta"] = kP2PMaxMeta;
  limits["max_dims"] = kP2PMaxDims;
  limits["max_arrays"] = kP2PMaxArrays;
  limits["max_descriptor_words"] = P2PMaxDescriptorWords();
  py::list names;
  for (int c = 0; c < kP2PNumDTypes; ++c) names.append(P2PDTypeName(c));
  limits["dtypes"] = py::tuple(names);
  m.attr("P2P_LIMITS") = limits;

  m.def("p2p_descriptor_length", &CheckP2PDescriptorLength, py::arg("n"),
        "The descriptor length word of a P2P frame's head, checked (FrameError naming the field).");
  m.def("parse_p2p_descriptor", [](py::array_t<int64_t, py::array::c_style | py::array::forcecast> words,
                                   uint64_t max_message_bytes) {
          if (words.ndim() != 1) throw py::value_error("parse_p2p_descriptor: words must be 1-D");
          // microseconds of work: cheaper with the GIL held than releasing and taking it again
          const P2PFrame f = ParseP2PDescriptor(words.data(), static_cast<size_t>(words.shape(0)), max_message_bytes);
          py::list layout;
          for (const auto& a : f.arrays) layout.append(py::make_tuple(a.code, Ints(a.shape)));
          return py::make_tuple(Ints(f.tag), Ints(f.meta), layout, f.payload_bytes);
        }, py::arg("words"), py::arg("max_message_bytes"),
        "(tag, meta, [(dtype code, shape)], payload bytes) of a P2P descriptor; FrameError naming the field "
        "when it breaks the framing or its limits.");
}

}  // namespace mshyper::bind
