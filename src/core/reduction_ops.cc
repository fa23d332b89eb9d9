#include "core/reduction_ops.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "base/error.h"
#include "kernels/element_reduce.h"
#include "kernels/host_reduce.h"

namespace braid {
namespace {

// 1/n in floating `type`'s bits, rounded as NCCL rounds its Avg scalar: through the type's compute
// type (fp32; fp64 for fp64); false for the integer types.
template <braidDataType_t kType>
void storeInverse(int n, uint8_t* bits) {
  using Element = kernels::ElementOf<kType>;
  const typename Element::Storage value =
      Element::narrow(static_cast<typename Element::Compute>(1.0 / n));
  std::memcpy(bits, &value, sizeof value);
}

bool inverseOf(int n, braidDataType_t type, uint8_t* bits) {
  switch (type) {
    case braidFloat16: storeInverse<braidFloat16>(n, bits); return true;
    case braidBfloat16: storeInverse<braidBfloat16>(n, bits); return true;
    case braidFloat8e4m3: storeInverse<braidFloat8e4m3>(n, bits); return true;
    case braidFloat8e5m2: storeInverse<braidFloat8e5m2>(n, bits); return true;
    case braidFloat32: storeInverse<braidFloat32>(n, bits); return true;
    case braidFloat64: storeInverse<braidFloat64>(n, bits); return true;
    default: return false;
  }
}

}  // namespace

braidRedOp_t ReductionOps::create(const void* scalar, braidDataType_t type, bool immediate) {
  PreMulSum op{type, scalar, {}, immediate};
  std::memcpy(op.immediate, scalar, kernels::typeSize(type));
  const std::lock_guard<std::mutex> lock(mutex_);
  if (next_ == kFirstAverage)
    fail(braidInternalError, "rank {}: no reduction operator ids left", rank_);
  ops_[next_] = op;
  return static_cast<braidRedOp_t>(next_++);
}

braidRedOp_t ReductionOps::average(braidDataType_t type, int nranks) {
  PreMulSum op{type, nullptr, {}, true};
  if (!inverseOf(nranks, type, op.immediate)) return braidAvg;
  const int id = kFirstAverage + static_cast<int>(type);
  const std::lock_guard<std::mutex> lock(mutex_);
  ops_.try_emplace(id, op);
  return static_cast<braidRedOp_t>(id);
}

void ReductionOps::destroy(braidRedOp_t op) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (static_cast<int>(op) >= kFirstAverage || ops_.erase(static_cast<int>(op)) == 0)
    fail(braidInvalidArgument,
         "braidRedOpDestroy on rank {}: op {} is not an operator of this communicator (expected "
         "one braidRedOpCreatePreMulSum made and that was not destroyed)",
         rank_, static_cast<int>(op));
}

bool ReductionOps::has(braidRedOp_t op, braidDataType_t type) const {
  if (static_cast<int>(op) >= kFirstAverage) return false;
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

void ReductionOps::scale(braidRedOp_t op, const void* input, void* output, size_t count) const {
  const PreMulSum pre = get(op);
  const size_t elem = kernels::typeSize(pre.type);
  // A block of scalars, so that the product kernel scales the input block by block.
  constexpr size_t kBlock = 1024;
  std::vector<uint8_t> scalars(kBlock * elem);
  for (size_t i = 0; i < kBlock; ++i) std::memcpy(scalars.data() + i * elem, pre.value(), elem);
  const kernels::ReduceFn multiply = kernels::reduceFn(pre.type, braidProd);
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  for (size_t done = 0; done < count; done += kBlock) {
    const size_t n = std::min(kBlock, count - done);
    multiply(out + done * elem, nullptr, in + done * elem, scalars.data(), n, 1);
  }
}

const void* ReductionOps::scaled(braidRedOp_t op, const void* input, size_t count,
                                 std::vector<uint8_t>& scaled) const {
  scaled.resize(count * kernels::typeSize(get(op).type));
  scale(op, input, scaled.data(), count);
  return scaled.data();
}

}  // namespace braid
