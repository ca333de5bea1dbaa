// Handles of the tensor stores the MindSpore kernels serve: a kernel's id input names the store
// (its handle) and the tensor, so several stores in one process each serve their own kernels.
#pragma once

#include <cstdint>
#include <memory>

#include "store/tensor_store.h"

namespace mshyper::store {

// A fresh handle for `store` (never 0, never reused in the process); the registry keeps the store
// alive until the handle is released.
uint64_t RegisterTensorStore(std::shared_ptr<TensorStore> store);
// Forgets `handle` (no-op if unknown). A kernel already running keeps its own reference.
void ReleaseTensorStore(uint64_t handle);
// The store of `handle`, or nullptr if it was never given or has been released.
std::shared_ptr<TensorStore> FindTensorStore(uint64_t handle);

}  // namespace mshyper::store
