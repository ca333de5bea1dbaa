#include "optim/adam.h"

#include <cmath>

namespace mshyper::optim {

void AdamStep(float* param, float* m, float* v, const float* grad, size_t n, float lr_t, float beta1,
              float beta2, float eps, bool nesterov) {
  const float one_minus_beta1 = 1.0f - beta1;
  const float one_minus_beta2 = 1.0f - beta2;
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i];
    m[i] += (g - m[i]) * one_minus_beta1;
    v[i] += (g * g - v[i]) * one_minus_beta2;
    const float num = nesterov ? m[i] * beta1 + one_minus_beta1 * g : m[i];
    param[i] -= lr_t * num / (eps + std::sqrt(v[i]));
  }
}

}  // namespace mshyper::optim
