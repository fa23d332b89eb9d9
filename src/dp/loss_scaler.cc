#include <algorithm>

#include "dp/error.h"

namespace braid::dp {

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options), scale_(options.initialScale), overflowsLeft_(options.hysteresis) {
  if (!(options.initialScale >= options.minScale && options.minScale > 0))
    fail(braidInvalidArgument,
         "LossScaler: initialScale {} and minScale {} (expected initialScale >= minScale > 0)",
         options.initialScale, options.minScale);
  if (!(options.growthFactor >= 1) || !(options.backoffFactor > 0 && options.backoffFactor < 1))
    fail(braidInvalidArgument,
         "LossScaler: growthFactor {} and backoffFactor {} (expected growthFactor >= 1 and "
         "0 < backoffFactor < 1)",
         options.growthFactor, options.backoffFactor);
  if (options.growthInterval < 1 || options.hysteresis < 1)
    fail(braidInvalidArgument,
         "LossScaler: growthInterval {} and hysteresis {} (expected both >= 1)",
         options.growthInterval, options.hysteresis);
}

void LossScaler::update(bool overflow) {
  if (overflow) {
    cleanSteps_ = 0;
    if (--overflowsLeft_ == 0) {
      scale_ = std::max(scale_ * options_.backoffFactor, options_.minScale);
      overflowsLeft_ = options_.hysteresis;
    }
    return;
  }
  overflowsLeft_ = options_.hysteresis;
  if (++cleanSteps_ == options_.growthInterval) {
    scale_ *= options_.growthFactor;
    cleanSteps_ = 0;
  }
}

}  // namespace braid::dp
