// One optimizer step on one element, written once for the CPU kernels (kernels_impl.h, whose
// loops call it per element and still vectorize) and the CUDA kernels (device_kernels.cuh):
// PyTorch's formulas (torch.optim.SGD / Adam / AdamW, single-tensor path) in fp32, so both give
// the same bits. No fused multiply-adds: the CPU builds have no -mfma and nvcc compiles the
// device code with -fmad=false (src/dp/CMakeLists.txt).
#pragma once

#include <cmath>

#include "braid/dp.hpp"
// BRAID_HD (base/host_device.h) comes with the element formats, which are BRAID_HD themselves.
#include "kernels/float_formats.h"

namespace braid::dp::kernels {

// The fp32 constants of one step, computed once on the host.
struct UpdateConstants {
  float gradFactor;  // unscale and clip folded into one factor
  float learningRate, weightDecay, momentum;
  float beta1, beta2, epsilon;
  float stepSize;     // Adam: lr / (1 - beta1^step)
  float correction2;  // Adam: sqrt(1 - beta2^step)
};

inline UpdateConstants updateConstants(const OptimizerOptions& o, int step, float gradFactor) {
  return UpdateConstants{
      gradFactor,
      static_cast<float>(o.learningRate),
      static_cast<float>(o.weightDecay),
      static_cast<float>(o.momentum),
      static_cast<float>(o.beta1),
      static_cast<float>(o.beta2),
      static_cast<float>(o.epsilon),
      // Bias corrections in double, as torch computes them from Python floats.
      static_cast<float>(o.learningRate / (1.0 - std::pow(o.beta1, step))),
      static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, step))),
  };
}

// SGD with L2 weight decay; kMomentum: with the momentum buffer m (no dampening, no Nesterov).
template <bool kMomentum>
BRAID_HD inline void sgdElement(const UpdateConstants& c, float grad, float& p, float& m) {
  float g = grad * c.gradFactor + c.weightDecay * p;
  if constexpr (kMomentum) g = m = c.momentum * m + g;
  p -= c.learningRate * g;
}

// Adam (L2 weight decay added to the gradient) or, kDecoupled, AdamW.
template <bool kDecoupled>
BRAID_HD inline void adamElement(const UpdateConstants& c, float grad, float& p, float& m,
                                 float& v) {
  float g = grad * c.gradFactor;
  if constexpr (kDecoupled)
    p *= 1.0f - c.learningRate * c.weightDecay;
  else
    g += c.weightDecay * p;
  m = c.beta1 * m + (1.0f - c.beta1) * g;
  v = c.beta2 * v + (1.0f - c.beta2) * g * g;
  p -= c.stepSize * m / (std::sqrt(v) / c.correction2 + c.epsilon);
}

}  // namespace braid::dp::kernels
