// Adam's element-wise update on host float32 arrays, in one pass (the host rule of an offloaded
// group's update; see mindspore_hyper/offload/host_optimizer.py). The arithmetic is MindSpore's
// CPU Adam kernel's, operation for operation:
//   m += (g - m) * (1 - beta1);  v += (g * g - v) * (1 - beta2)
//   param -= lr_t * (nesterov ? m * beta1 + (1 - beta1) * g : m) / (eps + sqrt(v))
#pragma once

#include <cstddef>

namespace mshyper::optim {

void AdamStep(float* param, float* m, float* v, const float* grad, size_t n, float lr_t, float beta1,
              float beta2, float eps, bool nesterov);

}  // namespace mshyper::optim
