// MindSpore aot custom-op kernels of 1-bit routing (CPU), over moe/routing_bits.h.
//
// Kernel signature (MindSpore aot): inputs then outputs in `params`, 0 = success.
//   MsHyperPackRouting(mask: bool|uint8 [T, E]) -> out: uint8 [ceil(T*E/8)]
//   MsHyperUnpackRouting(packed: uint8 [ceil(T*E/8)]) -> out: bool|uint8 [T, E]
#include <cstdint>
#include <cstdio>
#include <string>

#include "moe/routing_bits.h"

namespace {

int Fail(const char* op, const std::string& why) {
  std::fprintf(stderr, "[mindspore_hyper] %s failed: %s\n", op, why.c_str());
  return 1;
}

bool OneByte(const char* dtype) {
  const std::string d = dtype ? dtype : "";
  return d == "bool" || d == "uint8";
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int MsHyperPackRouting(int nparam, void** params, int* ndims,
                                                                          int64_t** shapes, const char** dtypes,
                                                                          void* /*stream*/, void* /*extra*/) {
  if (nparam != 2 || ndims[0] != 2 || ndims[1] != 1) return Fail("MsHyperPackRouting", "expects mask [T, E] -> [bytes]");
  if (!OneByte(dtypes[0]) || std::string(dtypes[1]) != "uint8") {
    return Fail("MsHyperPackRouting", "mask must be bool or uint8 and the output uint8");
  }
  const auto t = static_cast<std::size_t>(shapes[0][0]);
  const auto e = static_cast<std::size_t>(shapes[0][1]);
  if (static_cast<std::size_t>(shapes[1][0]) != mshyper::moe::PackedRoutingBytes(t, e)) {
    return Fail("MsHyperPackRouting", "output size is not ceil(T*E/8)");
  }
  std::string error;
  if (!mshyper::moe::PackRouting(static_cast<const std::uint8_t*>(params[0]), t, e,
                                 static_cast<std::uint8_t*>(params[1]), &error)) {
    return Fail("MsHyperPackRouting", error);
  }
  return 0;
}

extern "C" __attribute__((visibility("default"))) int MsHyperUnpackRouting(int nparam, void** params, int* ndims,
                                                                            int64_t** shapes, const char** dtypes,
                                                                            void* /*stream*/, void* /*extra*/) {
  if (nparam != 2 || ndims[0] != 1 || ndims[1] != 2) return Fail("MsHyperUnpackRouting", "expects [bytes] -> [T, E]");
  if (std::string(dtypes[0]) != "uint8" || !OneByte(dtypes[1])) {
    return Fail("MsHyperUnpackRouting", "input must be uint8 and the output bool or uint8");
  }
  const auto t = static_cast<std::size_t>(shapes[1][0]);
  const auto e = static_cast<std::size_t>(shapes[1][1]);
  if (static_cast<std::size_t>(shapes[0][0]) != mshyper::moe::PackedRoutingBytes(t, e)) {
    return Fail("MsHyperUnpackRouting", "input size is not ceil(T*E/8)");
  }
  std::string error;
  if (!mshyper::moe::UnpackRouting(static_cast<const std::uint8_t*>(params[0]), t, e,
                                   static_cast<std::uint8_t*>(params[1]), &error)) {
    return Fail("MsHyperUnpackRouting", error);
  }
  return 0;
}
