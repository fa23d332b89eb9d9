#include "core/host_workspace.h"

#include <algorithm>

namespace braid {

void HostWorkspace::setLimits(size_t directMaxBytes, size_t scratchBytes) {
  directMaxBytes_ = directMaxBytes;
  scratch_.resize(std::max(directMaxBytes, scratchBytes));
}

void HostWorkspace::lendTo(CollContext& ctx, bool collective) {
  ctx.directMaxBytes = directMaxBytes_;
  ctx.scratch = scratch_.data();
  ctx.slotStores = &slotStores_;
  if (collective) ctx.sequence = ++collectives_;
}

const void* HostWorkspace::scaled(const ReductionOps& ops, braidRedOp_t op, const void* input,
                                  size_t count) {
  return ops.scaled(op, input, count, preMulSumInput_);
}

uint8_t* HostWorkspace::staging(size_t bytes) {
  if (stagingBytes_ < bytes) {
    staging_ = std::make_unique_for_overwrite<uint8_t[]>(bytes);
    stagingBytes_ = bytes;
  }
  return staging_.get();
}

void HostWorkspace::releaseLargeBuffers() {
  // Not "= {}": that assigns an empty list and keeps the capacity.
  if (preMulSumInput_.capacity() > directMaxBytes_) preMulSumInput_ = std::vector<uint8_t>();
  if (stagingBytes_ > kKeptStagingBytes) {
    staging_.reset();
    stagingBytes_ = 0;
  }
}

}  // namespace braid
