#include "core/reduction_ops.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "base/error.h"
#include "kernels/host_reduce.h"

namespace braid {

braidRedOp_t ReductionOps::create(const void* scalar, braidDataType_t type, bool immediate) {
  PreMulSum op{type, scalar, {}, immediate};
  std::memcpy(op.immediate, scalar, kernels::typeSize(type));
  const std::lock_guard<std::mutex> lock(mutex_);
  if (next_ == INT_MAX) fail(braidInternalError, "rank {}: no reduction operator ids left", rank_);
  ops_[next_] = op;
  return static_cast<braidRedOp_t>(next_++);
}

void ReductionOps::destroy(braidRedOp_t op) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (ops_.erase(static_cast<int>(op)) == 0)
    fail(braidInvalidArgument,
         "braidRedOpDestroy on rank {}: op {} is not an operator of this communicator (expected "
         "one braidRedOpCreatePreMulSum made and that was not destroyed)",
         rank_, static_cast<int>(op));
}

bool ReductionOps::has(braidRedOp_t op, braidDataType_t type) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  auto it = ops_.find(static_cast<int>(op));
  return it != ops_.end() && it->second.type == type;
}

ReductionOps::PreMulSum ReductionOps::get(braidRedOp_t op) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  auto it = ops_.find(static_cast<int>(op));
  if (it == ops_.end())
    fail(braidInternalError, "rank {}: op {} is no operator of this communicator", rank_,
         static_cast<int>(op));
  return it->second;
}

const void* ReductionOps::scaled(braidRedOp_t op, const void* input, size_t count,
                                 std::vector<uint8_t>& scaled) const {
  const PreMulSum pre = get(op);
  const size_t elem = kernels::typeSize(pre.type);
  // A block of scalars, so that the product kernel scales the input block by block.
  constexpr size_t kBlock = 1024;
  std::vector<uint8_t> scalars(kBlock * elem);
  for (size_t i = 0; i < kBlock; ++i) std::memcpy(scalars.data() + i * elem, pre.value(), elem);
  scaled.resize(count * elem);
  const kernels::ReduceFn multiply = kernels::reduceFn(pre.type, braidProd);
  const auto* in = static_cast<const uint8_t*>(input);
  for (size_t done = 0; done < count; done += kBlock) {
    const size_t n = std::min(kBlock, count - done);
    multiply(scaled.data() + done * elem, nullptr, in + done * elem, scalars.data(), n, 1);
  }
  return scaled.data();
}

}  // namespace braid
