// Registration entry points of each component's Python bindings, called by registry.cc.
#pragma once
#include <pybind11/pybind11.h>

namespace mshyper::bind {

// Calls every component's registration function below; defined in registry.cc.
void RegisterAll(pybind11::module_& m);

// Offload store: errors, CRC32C, BlockStore (block_store_bindings.cc).
void BindBlockStore(pybind11::module_& m);
// TensorStore and the store handles the kernels use (tensor_store_bindings.cc).
void BindTensorStore(pybind11::module_& m);
// PrefetchScheduler and the background-thread helpers (prefetch_bindings.cc).
void BindPrefetch(pybind11::module_& m);
// Host side of the MindSpore kernels: kernel fences, tensor mailboxes (kernel_bindings.cc).
void BindKernels(pybind11::module_& m);
// The host Adam update (optim_bindings.cc).
void BindOptim(pybind11::module_& m);

// Communication library, as the submodule `comm` (comm_bindings.cc: errors, topology, cost
// model; it calls the three below with the submodule).
void BindComm(pybind11::module_& m);
// Aggregator and its request handles (aggregator_bindings.cc).
void BindAggregator(pybind11::module_& comm);
// Shared-memory group member, one per process (shm_communicator_bindings.cc).
void BindShmCommunicator(pybind11::module_& comm);
// In-process group, every rank in this process (inproc_communicator_bindings.cc).
void BindInProcCommunicator(pybind11::module_& comm);
// Message framing: P2P descriptor limits and parser (frame_bindings.cc).
void BindFrame(pybind11::module_& comm);

// MoE: 1-bit routing masks (moe_bindings.cc).
void BindMoe(pybind11::module_& m);

}  // namespace mshyper::bind
