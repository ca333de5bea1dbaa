// Python module mindspore_hyper._core: one shared library holding the Python bindings of every
// C++ component (and, from the offload work on, the MindSpore aot kernels that share its state).
#include <pybind11/pybind11.h>

#include "bind/bindings.h"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "mindspore_hyper C++ core: block store, prefetch scheduler, communication library";
  m.def("build_info", []() {
    py::dict info;
    info["cxx_standard"] = __cplusplus;
    info["compiler"] = __VERSION__;
    return info;
  }, "Compiler facts of this build (C++ standard as __cplusplus, compiler version string).");
  mshyper::bind::RegisterAll(m);
}
