// MindSpore aot custom-op kernels over the tensor stores (the same instances the Python API uses,
// since these kernels live in mindspore_hyper._core). A tensor is named by `ref` = [store handle,
// tensor id] (store_handles.h), so each store serves the kernels of its own tensors.
//
// Kernel signature (MindSpore aot): inputs then outputs in `params`, 0 = success.
//   MsHyperStoreFetch(ref: int64[2]) -> out           copies the stored tensor into out
//   MsHyperStorePut(x, ref: int64[2]) -> out          stores x as the tensor, out = x
//   MsHyperFence(id: int64[1]) -> out: int64[1]        marks kernel fence `id` as passed, out = id
//   MsHyperCopyOut(x, id: int64[1]) -> out: int64[1]   delivers a copy of x to mailbox `id`, out = id
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>

#include "kernels/kernel_fence.h"
#include "kernels/tensor_mailbox.h"
#include "store/store_handles.h"

namespace {

uint64_t DtypeSize(const char* dtype) {
  const std::string d = dtype ? dtype : "";
  if (d == "float64" || d == "int64" || d == "uint64" || d == "complex64") return 8;
  if (d == "float32" || d == "int32" || d == "uint32") return 4;
  if (d == "float16" || d == "bfloat16" || d == "int16" || d == "uint16") return 2;
  if (d == "int8" || d == "uint8" || d == "bool") return 1;
  return 0;
}

// Bytes of a tensor argument; throws (the kernel then fails naming it) for an unknown dtype, a
// negative rank or dimension, or a size that overflows 64 bits.
uint64_t Bytes(int ndim, const int64_t* shape, const char* dtype, const char* arg) {
  uint64_t n = DtypeSize(dtype);
  if (n == 0) throw std::runtime_error(std::string(arg) + ": unsupported dtype " + (dtype ? dtype : "(null)"));
  if (ndim < 0) throw std::runtime_error(std::string(arg) + ": negative rank " + std::to_string(ndim));
  for (int i = 0; i < ndim; ++i) {
    if (shape[i] < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(shape[i]), &n)) {
      throw std::runtime_error(std::string(arg) + ": dimension " + std::to_string(i) + " = " +
                               std::to_string(shape[i]) + " is negative or overflows the size");
    }
  }
  return n;
}

// Whether a kernel argument is the int64[1] holding an id.
bool IsId(int ndim, const int64_t* shape, const char* dtype) {
  return ndim == 1 && shape[0] == 1 && dtype != nullptr && std::string(dtype) == "int64";
}

int Fail(const char* op, const std::string& why) {
  std::fprintf(stderr, "[mindspore_hyper] %s failed: %s\n", op, why.c_str());
  return 1;
}

// The store and tensor id a `ref` input names; throws if the store handle is unknown.
std::shared_ptr<mshyper::store::TensorStore> StoreOf(const void* ref, uint64_t* tid) {
  int64_t v[2];
  std::memcpy(v, ref, sizeof(v));
  auto store = mshyper::store::FindTensorStore(static_cast<uint64_t>(v[0]));
  if (!store) {
    throw std::runtime_error("unknown tensor store handle " + std::to_string(v[0]) +
                             " (its OffloadStore was closed?)");
  }
  *tid = static_cast<uint64_t>(v[1]);
  return store;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int MsHyperStoreFetch(int nparam, void** params, int* ndims, int64_t** shapes,
                                 const char** dtypes, void* /*stream*/, void* /*extra*/) {
  try {
    if (nparam != 2) return Fail("MsHyperStoreFetch", "expects 1 input and 1 output");
    if (ndims[0] != 1 || shapes[0][0] != 2) return Fail("MsHyperStoreFetch", "ref must be int64[2]");
    uint64_t tid = 0;
    auto store = StoreOf(params[0], &tid);
    store->Get(tid, params[1], Bytes(ndims[1], shapes[1], dtypes[1], "out"));
    return 0;
  } catch (const std::exception& e) {
    return Fail("MsHyperStoreFetch", e.what());
  } catch (...) {
    return Fail("MsHyperStoreFetch", "unknown error");
  }
}

extern "C" __attribute__((visibility("default"))) int MsHyperStorePut(int nparam, void** params, int* ndims, int64_t** shapes,
                               const char** dtypes, void* /*stream*/, void* /*extra*/) {
  try {
    if (nparam != 3) return Fail("MsHyperStorePut", "expects 2 inputs and 1 output");
    if (ndims[1] != 1 || shapes[1][0] != 2) return Fail("MsHyperStorePut", "ref must be int64[2]");
    const uint64_t n = Bytes(ndims[0], shapes[0], dtypes[0], "x");
    uint64_t tid = 0;
    auto store = StoreOf(params[1], &tid);
    store->Update(tid, params[0], n);
    if (params[2] != params[0]) std::memcpy(params[2], params[0], n);
    return 0;
  } catch (const std::exception& e) {
    return Fail("MsHyperStorePut", e.what());
  } catch (...) {
    return Fail("MsHyperStorePut", "unknown error");
  }
}

extern "C" __attribute__((visibility("default"))) int MsHyperFence(int nparam, void** params, int* ndims,
                                 int64_t** shapes, const char** dtypes, void* /*stream*/,
                                 void* /*extra*/) {
  if (nparam != 2) return Fail("MsHyperFence", "expects 1 input and 1 output");
  if (!IsId(ndims[0], shapes[0], dtypes[0]) || !IsId(ndims[1], shapes[1], dtypes[1])) {
    return Fail("MsHyperFence", "id and out must be int64[1]");
  }
  int64_t id;
  std::memcpy(&id, params[0], sizeof(id));
  std::memcpy(params[1], &id, sizeof(id));
  mshyper::kernels::FenceSignal(static_cast<uint64_t>(id));
  return 0;
}

extern "C" __attribute__((visibility("default"))) int MsHyperCopyOut(int nparam, void** params, int* ndims,
                                   int64_t** shapes, const char** dtypes, void* /*stream*/,
                                   void* /*extra*/) {
  try {
    if (nparam != 3) return Fail("MsHyperCopyOut", "expects 2 inputs and 1 output");
    if (!IsId(ndims[1], shapes[1], dtypes[1]) || !IsId(ndims[2], shapes[2], dtypes[2])) {
      return Fail("MsHyperCopyOut", "id and out must be int64[1]");
    }
    const uint64_t n = Bytes(ndims[0], shapes[0], dtypes[0], "x");
    int64_t id;
    std::memcpy(&id, params[1], sizeof(id));
    mshyper::kernels::MailboxDeliver(static_cast<uint64_t>(id), params[0], n);
    std::memcpy(params[2], &id, sizeof(id));
    return 0;
  } catch (const std::exception& e) {
    return Fail("MsHyperCopyOut", e.what());
  } catch (...) {
    return Fail("MsHyperCopyOut", "unknown error");
  }
}
