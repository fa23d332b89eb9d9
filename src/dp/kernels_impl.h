// The element loops of a step, compiled once per instruction set (kernels_generic.cc,
// kernels_avx2.cc) and chosen at run time by kernels.cc. Everything here has internal linkage on
// purpose: each including file gets its own copy built with its own flags, so no copy compiled
// for AVX2 can be picked by the linker for the generic path.
//
// Element types are handled as codecs: blocks are converted to fp32, worked on, converted back,
// so the arithmetic is the same fp32 code for every type (and vectorizes). This is the one place
// fp16 and bf16 are converted: fp16 is the compiler's _Float16 (IEEE binary16, round to nearest
// even), through F16C's 8-wide instructions where available; bf16 is the upper half of an fp32,
// rounded to nearest even by the library's own element format (kernels/float_formats.h).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "dp/kernels.h"
#include "dp/optimizer_math.h"
#include "kernels/float_formats.h"

namespace braid::dp::kernels {
namespace {

struct Fp32 {
  using Storage = float;
  static void load(const float* in, float* out, size_t n) { std::memcpy(out, in, n * 4); }
  static void store(const float* in, float* out, size_t n) { std::memcpy(out, in, n * 4); }
};

struct Fp16 {
  using Storage = _Float16;
  static void load(const _Float16* in, float* out, size_t n) {
    size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
    for (; i < n; ++i) out[i] = static_cast<float>(in[i]);
  }
  static void store(const float* in, _Float16* out, size_t n) {
    size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; ++i) out[i] = static_cast<_Float16>(in[i]);
  }
};

// The library's bf16 rounding (kernels/float_formats.h): nearest even, NaN kept quiet.
struct Bf16 {
  using Storage = uint16_t;
  static void load(const uint16_t* in, float* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = braid::kernels::bfloat16ToFloat(in[i]);
  }
  static void store(const float* in, uint16_t* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = braid::kernels::floatToBfloat16(in[i]);
  }
};

// Calls fn(codec) with the codec of `type`.
template <typename Fn>
decltype(auto) withCodec(braidDataType_t type, Fn&& fn) {
  switch (type) {
    case braidFloat32: return fn(Fp32{});
    case braidFloat16: return fn(Fp16{});
    case braidBfloat16: return fn(Bf16{});
    default: failUnsupportedType(type);
  }
}

// Walks `count` elements in blocks that stay in L1: body(first, n, block...) with one fp32 block
// per array.
constexpr size_t kBlock = 512;

template <typename Body>
void blocks(size_t count, Body&& body) {
  for (size_t first = 0; first < count; first += kBlock)
    body(first, std::min(kBlock, count - first));
}

void toFloatImpl(const void* src, braidDataType_t type, float* dst, size_t count) {
  withCodec(type, [&]<typename C>(C) {
    C::load(static_cast<const typename C::Storage*>(src), dst, count);
  });
}

void fromFloatImpl(const float* src, void* dst, braidDataType_t type, size_t count) {
  withCodec(type,
            [&]<typename C>(C) { C::store(src, static_cast<typename C::Storage*>(dst), count); });
}

void accumulateImpl(const float* src, void* dst, braidDataType_t type, size_t count) {
  withCodec(type, [&]<typename C>(C) {
    auto* d = static_cast<typename C::Storage*>(dst);
    blocks(count, [&](size_t first, size_t n) {
      float sum[kBlock];
      C::load(d + first, sum, n);
      for (size_t i = 0; i < n; ++i) sum[i] += src[first + i];
      C::store(sum, d + first, n);
    });
  });
}

void scaleImpl(void* data, braidDataType_t type, size_t count, float factor) {
  withCodec(type, [&]<typename C>(C) {
    auto* x = static_cast<typename C::Storage*>(data);
    blocks(count, [&](size_t first, size_t n) {
      float v[kBlock];
      C::load(x + first, v, n);
      for (size_t i = 0; i < n; ++i) v[i] *= factor;
      C::store(v, x + first, n);
    });
  });
}

void addImpl(void* dst, const void* src, braidDataType_t type, size_t count) {
  withCodec(type, [&]<typename C>(C) {
    auto* d = static_cast<typename C::Storage*>(dst);
    const auto* s = static_cast<const typename C::Storage*>(src);
    blocks(count, [&](size_t first, size_t n) {
      float a[kBlock], b[kBlock];
      C::load(d + first, a, n);
      C::load(s + first, b, n);
      for (size_t i = 0; i < n; ++i) a[i] += b[i];
      C::store(a, d + first, n);
    });
  });
}

Inspection inspectImpl(const void* data, braidDataType_t type, size_t count) {
  return withCodec(type, [&]<typename C>(C) {
    const auto* x = static_cast<const typename C::Storage*>(data);
    // Eight partial sums in a fixed pattern: vectorizable, and the same result on every ISA.
    constexpr size_t kLanes = 8;
    double lanes[kLanes] = {};
    blocks(count, [&](size_t first, size_t n) {
      float v[kBlock + kLanes] = {};
      C::load(x + first, v, n);
      for (size_t i = 0; i < n; i += kLanes)
        for (size_t k = 0; k < kLanes; ++k) lanes[k] += static_cast<double>(v[i + k]) * v[i + k];
    });
    Inspection result;
    for (double lane : lanes) result.sumSquares += lane;
    // inf or NaN anywhere makes the sum inf or NaN: one test instead of one per element.
    result.nonFinite = !std::isfinite(result.sumSquares);
    return result;
  });
}

// One optimizer step per element (optimizer_math.h, shared with the CUDA kernels), a block of
// gradients converted to fp32 at a time. G: the gradients' codec, W: the working copy's.
void updateImpl(const UpdateArgs& a, const void* grad, float* master, float* moment1,
                float* moment2, void* working, size_t count) {
  withCodec(a.gradientType, [&]<typename G>(G) {
    withCodec(a.parameterType, [&]<typename W>(W) {
      const auto* gradIn = static_cast<const typename G::Storage*>(grad);
      auto* workingOut = static_cast<typename W::Storage*>(working);
      const bool writeWorking = working != static_cast<void*>(master);
      const UpdateConstants c = updateConstants(a.optimizer, a.step, a.gradFactor);
      const OptimizerKind kind = a.optimizer.kind;
      blocks(count, [&](size_t first, size_t n) {
        float g[kBlock];
        G::load(gradIn + first, g, n);
        float* p = master + first;
        if (kind == OptimizerKind::kSgd && moment1 == nullptr) {
          float noMomentum = 0;
          for (size_t i = 0; i < n; ++i) sgdElement<false>(c, g[i], p[i], noMomentum);
        } else if (kind == OptimizerKind::kSgd) {
          float* m = moment1 + first;
          for (size_t i = 0; i < n; ++i) sgdElement<true>(c, g[i], p[i], m[i]);
        } else if (kind == OptimizerKind::kAdamW) {
          float *m = moment1 + first, *v = moment2 + first;
          for (size_t i = 0; i < n; ++i) adamElement<true>(c, g[i], p[i], m[i], v[i]);
        } else {
          float *m = moment1 + first, *v = moment2 + first;
          for (size_t i = 0; i < n; ++i) adamElement<false>(c, g[i], p[i], m[i], v[i]);
        }
        if (writeWorking) W::store(p, workingOut + first, n);
      });
    });
  });
}

KernelTable makeTable() {
  return KernelTable{toFloatImpl, fromFloatImpl, accumulateImpl, scaleImpl,
                     addImpl,     inspectImpl,   updateImpl};
}

}  // namespace
}  // namespace braid::dp::kernels
