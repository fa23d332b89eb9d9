// The step's element loops for a CUDA grid, written once as __host__ __device__ templates over a
// thread block B: unsigned thread(), threads() (the block's size), block(), blocks() (the grid's
// size) and sync() (every thread of the block reaches it before any leaves: __syncthreads, or a
// std::barrier when tests/dp/test_dp_device_form.cc runs a block as CPU threads). Every thread
// walks the elements grid-stride; the per-element arithmetic is kernels_impl.h's (the fp32 codec
// round trip, optimizer_math.h), so results equal the CPU kernels' bit for bit, except the sum of
// squares: see inspectThread. The only __CUDA_ARCH__ split is fp16's element load and store.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cuda/atomic>
#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

#include "dp/device_kernels.h"
#include "dp/optimizer_math.h"
#include "kernels/float_formats.h"

namespace braid::dp::device {

// One element to fp32 and back, as kernels_impl.h's codecs convert whole blocks.
struct Fp32Element {
  using Storage = float;
  BRAID_HD static float load(float x) { return x; }
  BRAID_HD static float store(float x) { return x; }
};
// IEEE binary16, round to nearest even: the GPU's conversions on a device, the compiler's
// _Float16 (the CPU generic build's) on the host. NaN payloads may differ between the two.
struct Fp16Element {
  using Storage = uint16_t;
  BRAID_HD static float load(uint16_t bits) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(bits));
#else
    return static_cast<float>(std::bit_cast<_Float16>(bits));
#endif
  }
  BRAID_HD static uint16_t store(float x) {
#if defined(__CUDA_ARCH__)
    return __half_as_ushort(__float2half_rn(x));
#else
    return std::bit_cast<uint16_t>(static_cast<_Float16>(x));
#endif
  }
};
// The library's bf16 rounding (kernels/float_formats.h), the same code on both sides.
struct Bf16Element {
  using Storage = uint16_t;
  BRAID_HD static float load(uint16_t bits) { return braid::kernels::bfloat16ToFloat(bits); }
  BRAID_HD static uint16_t store(float x) { return braid::kernels::floatToBfloat16(x); }
};

// Host side: calls fn(element) with the element of `type`.
template <typename Fn>
decltype(auto) withElement(braidDataType_t type, Fn&& fn) {
  switch (type) {
    case braidFloat32: return fn(Fp32Element{});
    case braidFloat16: return fn(Fp16Element{});
    case braidBfloat16: return fn(Bf16Element{});
    default: kernels::failUnsupportedType(type);
  }
}

// The optimizer's branch, chosen on the host (the same for every element of a launch).
enum class UpdateRule { kSgd, kSgdMomentum, kAdam, kAdamW };

inline UpdateRule updateRule(OptimizerKind kind, bool hasMomentum) {
  switch (kind) {
    case OptimizerKind::kSgd: return hasMomentum ? UpdateRule::kSgdMomentum : UpdateRule::kSgd;
    case OptimizerKind::kAdam: return UpdateRule::kAdam;
    default: return UpdateRule::kAdamW;
  }
}

template <class B>
BRAID_HD size_t firstElement(const B& b) {
  return static_cast<size_t>(b.block()) * b.threads() + b.thread();
}
template <class B>
BRAID_HD size_t elementStride(const B& b) {
  return static_cast<size_t>(b.blocks()) * b.threads();
}

template <class E, class B>
BRAID_HD void toFloatThread(const B& b, const typename E::Storage* src, float* dst, size_t count) {
  for (size_t i = firstElement(b); i < count; i += elementStride(b)) dst[i] = E::load(src[i]);
}

template <class E, class B>
BRAID_HD void fromFloatThread(const B& b, const float* src, typename E::Storage* dst,
                              size_t count) {
  for (size_t i = firstElement(b); i < count; i += elementStride(b)) dst[i] = E::store(src[i]);
}

// dst[i] += src[i], rounded once.
template <class E, class B>
BRAID_HD void accumulateThread(const B& b, const float* src, typename E::Storage* dst,
                               size_t count) {
  for (size_t i = firstElement(b); i < count; i += elementStride(b))
    dst[i] = E::store(E::load(dst[i]) + src[i]);
}

template <class E, class B>
BRAID_HD void scaleThread(const B& b, typename E::Storage* data, size_t count, float factor) {
  for (size_t i = firstElement(b); i < count; i += elementStride(b))
    data[i] = E::store(E::load(data[i]) * factor);
}

template <class E, class B>
BRAID_HD void addThread(const B& b, typename E::Storage* dst, const typename E::Storage* src,
                        size_t count) {
  for (size_t i = firstElement(b); i < count; i += elementStride(b))
    dst[i] = E::store(E::load(dst[i]) + E::load(src[i]));
}

// The sum of squares in double, then the block's sums added in a tree through `blockSums` (shared
// memory, b.threads() of them), then one atomic per block into *verdict. Every square of an fp32
// value is exact in double, and all terms are >= 0, so any order of the n additions is within
// (n - 1) * 2^-53 of the exact sum, relatively: the CPU's eight lanes and this grid differ by at
// most twice that. inf or NaN in any element makes its block's sum inf or NaN (squares cannot
// cancel it), which is how the CPU kernel flags overflow too.
//
// The atomics are at device scope, on purpose: the only threads that race on *verdict are this
// kernel's blocks, on this GPU; what reads it next (the ranks' all-reduce, the host's copy) runs
// after the kernel on the stream, and a kernel's completion publishes its writes. System scope
// would only make the additions slower.
template <class E, class B>
BRAID_HD void inspectThread(B& b, const typename E::Storage* data, size_t count, double* blockSums,
                            Verdict* verdict) {
  double sum = 0;
  for (size_t i = firstElement(b); i < count; i += elementStride(b)) {
    const float x = E::load(data[i]);
    sum += static_cast<double>(x) * x;
  }
  const unsigned t = b.thread();
  blockSums[t] = sum;
  b.sync();
  for (unsigned width = b.threads(); width > 1;) {
    const unsigned half = (width + 1) / 2;
    if (t + half < width) blockSums[t] += blockSums[t + half];
    b.sync();
    width = half;
  }
  if (t != 0) return;
  const double blockSum = blockSums[0];
  if (!std::isfinite(blockSum))
    cuda::atomic_ref<float, cuda::thread_scope_device>(verdict->overflowFlag)
        .store(1.0f, cuda::memory_order_relaxed);
  cuda::atomic_ref<double, cuda::thread_scope_device>(verdict->sumSquares)
      .fetch_add(blockSum, cuda::memory_order_relaxed);
}

// One optimizer step's launch: what every thread needs, decided on the host. `working` receives
// the updated parameters in W, unless it is null (fp32 precision: the master is the working
// copy); moment1 is null for SGD without momentum, moment2 for SGD.
template <class G, class W>
struct UpdateLaunch {
  UpdateRule rule;
  kernels::UpdateConstants constants;
  const typename G::Storage* grad;
  float* master;
  float* moment1;
  float* moment2;
  typename W::Storage* working;
  size_t count;
};

// Host side, shared by launchUpdate and the CPU test: kernels.h's update arguments as the
// UpdateLaunch of their element types, passed to run(launch).
template <typename Run>
decltype(auto) prepareUpdate(const kernels::UpdateArgs& args, const void* grad, float* master,
                             float* moment1, float* moment2, void* working, size_t count,
                             Run&& run) {
  const UpdateRule rule = updateRule(args.optimizer.kind, moment1 != nullptr);
  const kernels::UpdateConstants constants =
      kernels::updateConstants(args.optimizer, args.step, args.gradFactor);
  const bool writeWorking = working != static_cast<void*>(master);
  return withElement(args.gradientType, [&]<class G>(G) {
    return withElement(args.parameterType, [&]<class W>(W) {
      return run(UpdateLaunch<G, W>{
          rule, constants, static_cast<const typename G::Storage*>(grad), master, moment1, moment2,
          writeWorking ? static_cast<typename W::Storage*>(working) : nullptr, count});
    });
  });
}

// The optimizer_math.h step on this thread's elements.
template <class G, class W, class B>
BRAID_HD void updateThread(const B& b, const UpdateLaunch<G, W>& u) {
  for (size_t i = firstElement(b); i < u.count; i += elementStride(b)) {
    const float g = G::load(u.grad[i]);
    float& p = u.master[i];
    switch (u.rule) {
      case UpdateRule::kSgd: {
        float noMomentum = 0;
        kernels::sgdElement<false>(u.constants, g, p, noMomentum);
        break;
      }
      case UpdateRule::kSgdMomentum:
        kernels::sgdElement<true>(u.constants, g, p, u.moment1[i]);
        break;
      case UpdateRule::kAdam:
        kernels::adamElement<false>(u.constants, g, p, u.moment1[i], u.moment2[i]);
        break;
      case UpdateRule::kAdamW:
        kernels::adamElement<true>(u.constants, g, p, u.moment1[i], u.moment2[i]);
        break;
    }
    if (u.working != nullptr) u.working[i] = W::store(p);
  }
}

}  // namespace braid::dp::device
