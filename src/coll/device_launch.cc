#include "coll/device_launch.h"

namespace braid {
namespace {

bool isRing(DeviceAlgorithm algorithm) {
  return algorithm == DeviceAlgorithm::Simple || algorithm == DeviceAlgorithm::LowLatency ||
         algorithm == DeviceAlgorithm::Segmented;
}

// Avg's kernels run one call (coll/ring_engine.h's kOneWorkPerList).
bool isAvg(const RingKernelCall& call) {
  return call.reduces && call.op == braidAvg;
}

}  // namespace

RingKernelCall ringKernelCallOf(const CollArgs& a, bool scaled, DeviceAlgorithm algorithm) {
  const bool prescaled = scaled || a.op >= braidNumOps;
  return {algorithm, a.type, prescaled ? braidSum : a.op, reduces(a.coll), prescaled};
}

bool runsInRingKernelOf(std::span<const RingKernelCall> run, const RingKernelCall& next) {
  const RingKernelCall& first = run.front();
  if (!isRing(next.algorithm) || next.algorithm != first.algorithm || next.type != first.type ||
      next.prescaled != first.prescaled || isAvg(next) || isAvg(first))
    return false;
  if (next.prescaled) return next.reduces;
  if (!next.reduces) return true;
  for (const RingKernelCall& c : run)
    if (c.reduces && c.op != next.op) return false;
  return true;
}

std::vector<size_t> ringLaunchSizes(std::span<const RingKernelCall> calls, size_t maxCalls) {
  std::vector<size_t> sizes;
  std::vector<RingKernelCall> run;
  for (const RingKernelCall& call : calls) {
    if (!run.empty() && (run.size() == maxCalls || !runsInRingKernelOf(run, call))) {
      sizes.push_back(run.size());
      run.clear();
    }
    run.push_back(call);
  }
  if (!run.empty()) sizes.push_back(run.size());
  return sizes;
}

}  // namespace braid
