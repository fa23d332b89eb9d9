// Chooses the kernels' instruction set once, and the public conversions of dp.hpp.
#include "dp/kernels.h"

#include "dp/error.h"

namespace braid::dp::kernels {
namespace {

const KernelTable& chosen() {
  static const KernelTable& table = []() -> const KernelTable& {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return avx2::table();
#endif
    return generic::table();
  }();
  return table;
}

}  // namespace

void failUnsupportedType(braidDataType_t type) {
  fail(braidInvalidArgument,
       "braid::dp: element type {} is not supported (expected braidFloat32={}, braidFloat16={} "
       "or braidBfloat16={})",
       static_cast<int>(type), static_cast<int>(braidFloat32), static_cast<int>(braidFloat16),
       static_cast<int>(braidBfloat16));
}

void scale(void* data, braidDataType_t type, size_t count, float factor) {
  chosen().scale(data, type, count, factor);
}
void add(void* dst, const void* src, braidDataType_t type, size_t count) {
  chosen().add(dst, src, type, count);
}
Inspection inspect(const void* data, braidDataType_t type, size_t count) {
  return chosen().inspect(data, type, count);
}
void update(const UpdateArgs& args, const void* grad, float* master, float* moment1, float* moment2,
            void* working, size_t count) {
  chosen().update(args, grad, master, moment1, moment2, working, count);
}

}  // namespace braid::dp::kernels

namespace braid::dp {

void convertToFloat(const void* src, braidDataType_t type, float* dst, size_t count) {
  kernels::chosen().toFloat(src, type, dst, count);
}
void convertFromFloat(const float* src, void* dst, braidDataType_t type, size_t count) {
  kernels::chosen().fromFloat(src, dst, type, count);
}
void accumulateFromFloat(const float* src, void* dst, braidDataType_t type, size_t count) {
  kernels::chosen().accumulate(src, dst, type, count);
}

size_t elementSize(braidDataType_t type) {
  switch (type) {
    case braidFloat32: return 4;
    case braidFloat16:
    case braidBfloat16: return 2;
    default: kernels::failUnsupportedType(type);
  }
}

}  // namespace braid::dp
