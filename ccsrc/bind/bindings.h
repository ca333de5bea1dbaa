// Registration entry points of each component's Python bindings, called by module.cc.
#pragma once
#include <pybind11/pybind11.h>

namespace mshyper::bind {

// Calls every component's registration function below; defined in registry.cc.
void RegisterAll(pybind11::module_& m);

// Offload: block store, tensor store, prefetch scheduler (store_bindings.cc).
void BindStore(pybind11::module_& m);

// Communication library: topology, cost model, transports, aggregator (comm_bindings.cc).
void BindComm(pybind11::module_& m);

// MoE: 1-bit routing masks (moe_bindings.cc).
void BindMoe(pybind11::module_& m);

}  // namespace mshyper::bind
