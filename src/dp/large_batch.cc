#include "dp/error.h"

namespace braid::dp {

double scaleLearningRate(double baseLearningRate, int baseBatch, int globalBatch) {
  if (baseBatch < 1 || globalBatch < 1)
    fail(braidInvalidArgument,
         "scaleLearningRate: baseBatch {} and globalBatch {} (expected both >= 1)", baseBatch,
         globalBatch);
  return baseLearningRate * globalBatch / baseBatch;
}

double warmupLearningRate(double startLearningRate, double targetLearningRate, int step,
                          int warmupSteps) {
  if (step < 0 || warmupSteps < 0)
    fail(braidInvalidArgument,
         "warmupLearningRate: step {} and warmupSteps {} (expected both >= 0)", step, warmupSteps);
  if (step >= warmupSteps) return targetLearningRate;
  return startLearningRate +
         (targetLearningRate - startLearningRate) * static_cast<double>(step) / warmupSteps;
}

}  // namespace braid::dp
