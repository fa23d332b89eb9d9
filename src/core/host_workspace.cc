#include "core/host_workspace.h"

namespace braid {

void HostWorkspace::setDirectMaxBytes(size_t bytes) {
  directMaxBytes_ = bytes;
  scratch_.resize(bytes);
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

void HostWorkspace::releaseLargeInput() {
  // Not "= {}": that assigns an empty list and keeps the capacity.
  if (preMulSumInput_.capacity() > directMaxBytes_) preMulSumInput_ = std::vector<uint8_t>();
}

}  // namespace braid
