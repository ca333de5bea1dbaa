// Python binding of the host Adam update (in place on numpy arrays, GIL released).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "bind/bindings.h"
#include "optim/adam.h"

namespace py = pybind11;

namespace mshyper::bind {
namespace {

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

}  // namespace

void BindOptim(py::module_& m) {
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
}

}  // namespace mshyper::bind
