#include "coll/device_launch.h"

namespace braid {
namespace {

// The engines whose kernels run a list of calls: the ring's and the tree's.
bool runsLists(DeviceAlgorithm algorithm) {
  return algorithm != DeviceAlgorithm::Direct;
}

// Avg's kernels run one call (coll/ring_engine.h's kOneWorkPerList).
bool isAvg(const KernelCall& call) {
  return call.reduces && call.op == braidAvg;
}

}  // namespace

KernelCall kernelCallOf(const CollArgs& a, bool scaled, DeviceAlgorithm algorithm) {
  const bool prescaled = scaled || a.op >= braidNumOps;
  return {algorithm, a.type, prescaled ? braidSum : a.op, reduces(a.coll), prescaled};
}

bool runsInKernelOf(std::span<const KernelCall> run, const KernelCall& next) {
  const KernelCall& first = run.front();
  if (!runsLists(next.algorithm) || next.algorithm != first.algorithm || next.type != first.type ||
      next.prescaled != first.prescaled || isAvg(next) || isAvg(first))
    return false;
  if (next.prescaled) return next.reduces;
  if (!next.reduces) return true;
  for (const KernelCall& c : run)
    if (c.reduces && c.op != next.op) return false;
  return true;
}

std::vector<size_t> launchSizes(std::span<const KernelCall> calls, size_t maxCalls) {
  std::vector<size_t> sizes;
  std::vector<KernelCall> run;
  for (const KernelCall& call : calls) {
    if (!run.empty() && (run.size() == maxCalls || !runsInKernelOf(run, call))) {
      sizes.push_back(run.size());
      run.clear();
    }
    run.push_back(call);
  }
  if (!run.empty()) sizes.push_back(run.size());
  return sizes;
}

}  // namespace braid
