// The list of components bound into mindspore_hyper._core. Each component adds one line.
#include "bind/bindings.h"

namespace mshyper::bind {

void RegisterAll(pybind11::module_& m) {
  BindBlockStore(m);
  BindTensorStore(m);
  BindPrefetch(m);
  BindKernels(m);
  BindOptim(m);
  BindComm(m);
  BindMoe(m);
}

}  // namespace mshyper::bind
