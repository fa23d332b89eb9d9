// The one implementation of every host reduction kernel (dtype x op), written once over GCC vector
// extensions and instantiated by each instruction-set translation unit (host_reduce_scalar.cc,
// _avx2.cc, _avx512.cc) with its own vector width and fp16 conversions. Include only from those
// files, the dispatcher and tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/host_reduce.h"

namespace braid::kernels {

// One instruction set's kernels, indexed [type][op].
struct ReduceTable {
  ReduceFn fn[braidNumTypes][braidNumOps];
  ReduceFn streamingFn[braidNumTypes][braidNumOps];  // dst written with streaming stores
};

namespace scalar {
const ReduceTable& table();
}
namespace avx2 {
const ReduceTable& table();
}
namespace avx512 {
const ReduceTable& table();
}

// Internal linkage on purpose, although this is a header: each instruction set's translation unit
// compiles its own copy with its own -m flags, and the linker must never pick an AVX-512 copy of a
// shared (inline or template) function for the code that runs on an AVX2-only CPU. The small
// helpers are forced inline: a call per vector (passing vectors through memory) halves speed.
namespace {

template <class T, size_t kBytes>
struct VectorOf {
  typedef T type __attribute__((vector_size(kBytes)));
};
template <class T, size_t kBytes>
using Vector = typename VectorOf<T, kBytes>::type;

// Unaligned loads and stores of whole vectors (memcpy compiles to one move).
template <class V>
[[gnu::always_inline]] inline V loadVector(const char* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V>
[[gnu::always_inline]] inline void storeVector(char* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

template <class V>
[[gnu::always_inline]] inline V broadcast(typename std::remove_reference_t<decltype(V{}[0])> x) {
  return V{} + x;
}

// N compute vectors from one storage vector of narrow floats (N = 2 for 16-bit, 4 for 8-bit
// formats): each 32-bit lane holds N elements, and part[k] holds the k-th of every lane (from the
// low end). Splitting and joining lanes with shifts and masks avoids the widening shuffles that
// contiguous narrow -> 32-bit conversion costs.
template <class V, size_t N>
struct Split {
  V part[N];
};

// IEEE binary16 (in the low 16 bits of each lane, the rest zero) -> binary32, with integer
// vector code, for instruction sets without F16C.
template <size_t kBytes>
[[gnu::always_inline]] inline Vector<float, kBytes> softHalfToFloat(Vector<int32_t, kBytes> half) {
  using Int = Vector<int32_t, kBytes>;
  using Float = Vector<float, kBytes>;
  const Int sign = (half & 0x8000) << 16;
  const Int magnitude = half & 0x7fff;
  Int bits = (magnitude << 13) + ((127 - 15) << 23);              // normal: rebias exponent
  bits = magnitude >= 0x7c00 ? bits + ((128 - 16) << 23) : bits;  // inf/NaN: exponent all ones
  const Float subnormal = __builtin_convertvector(magnitude, Float) * 0x1p-24f;  // exact
  bits = magnitude < 0x400 ? (Int)subnormal : bits;
  return (Float)(bits | sign);
}

// IEEE binary32 -> binary16 in the low 16 bits of each lane (the rest zero): round to nearest
// even, overflow to inf, NaN stays a (quiet) NaN.
template <size_t kBytes>
[[gnu::always_inline]] inline Vector<int32_t, kBytes> softFloatToHalf(Vector<float, kBytes> value) {
  using Int = Vector<int32_t, kBytes>;
  using Float = Vector<float, kBytes>;
  const Int bits = (Int)value;
  const Int sign = (bits >> 16) & 0x8000;
  const Int magnitude = bits & 0x7fffffff;
  // Normal results: rebias, then round the 13 dropped bits to nearest even; carries may reach inf.
  Int normal = (magnitude - ((127 - 15) << 23) + 0xfff + ((magnitude >> 13) & 1)) >> 13;
  normal = normal > 0x7c00 ? broadcast<Int>(0x7c00) : normal;
  // Subnormal results: adding 0.5 (whose ulp is 2^-24, the fp16 subnormal step) lets the FPU
  // round; a float denormal input flushed by DAZ still correctly becomes zero.
  const Int subnormal = (Int)((Float)magnitude + 0.5f) - 0x3f000000;
  const Int nanPayload = 0x200 | ((magnitude >> 13) & 0x3ff);
  const Int special = 0x7c00 | (magnitude > 0x7f800000 ? nanPayload : Int{});
  Int half = magnitude < (113 << 23) ? subnormal : normal;
  half = magnitude >= 0x7f800000 ? special : half;
  return half | sign;
}

// binary32 -> bfloat16 in the top 16 bits of each lane (the low 16 bits are left over for the
// caller to discard): round the 16 dropped bits to nearest even. A NaN is kept a NaN (rounding
// could carry its payload into inf or into the sign bit) by truncating it and setting the quiet
// bit.
template <size_t kBytes>
[[gnu::always_inline]] inline Vector<uint32_t, kBytes> roundToBfloat16High(
    Vector<float, kBytes> value) {
  using Bits = Vector<uint32_t, kBytes>;
  const Bits bits = (Bits)value;
  const Bits rounded = bits + 0x7fff + ((bits >> 16) & 1);
  return value != value ? bits | 0x400000 : rounded;
}

// Element types reduced in their own type: vectors of kBytes.
template <class T, size_t kBytes>
struct NativeCodec {
  using Compute = T;
  using Vec = Vector<T, kBytes>;
  static constexpr size_t kElementBytes = sizeof(T);
  [[gnu::always_inline]] static Vec load(const char* p) { return loadVector<Vec>(p); }
  [[gnu::always_inline]] static Vec encode(Vec v) { return v; }
};

// 16-bit floats are widened to fp32, reduced, and rounded once when stored.

// fp16 with the instruction set's conversions (F16C, AVX-512): contiguous lanes.
template <class Isa>
struct HardwareHalfCodec {
  static constexpr size_t kBytes = Isa::kVectorBytes;
  using Compute = float;
  using Vec = Vector<float, kBytes>;
  static constexpr size_t kElementBytes = 2;
  [[gnu::always_inline]] static Vec load(const char* p) {
    return Isa::halfToFloat(loadVector<Vector<uint16_t, kBytes / 2>>(p));
  }
  [[gnu::always_inline]] static auto encode(Vec v) { return Isa::floatToHalf(v); }
};

// fp16 converted in software, two per lane.
template <size_t kBytes>
struct SoftHalfCodec {
  using Compute = float;
  using Int = Vector<int32_t, kBytes>;
  using Vec = Split<Vector<float, kBytes>, 2>;
  static constexpr size_t kElementBytes = 2;
  [[gnu::always_inline]] static Vec load(const char* p) {
    const Int lanes = loadVector<Int>(p);
    return {softHalfToFloat<kBytes>(lanes & 0xffff),
            softHalfToFloat<kBytes>((lanes >> 16) & 0xffff)};
  }
  [[gnu::always_inline]] static Int encode(Vec v) {
    return softFloatToHalf<kBytes>(v.part[0]) | (softFloatToHalf<kBytes>(v.part[1]) << 16);
  }
};

// bfloat16, two per lane: widened with a shift and a mask, joined with a shift and an or.
template <size_t kBytes>
struct Bfloat16Codec {
  using Compute = float;
  using Float = Vector<float, kBytes>;
  using Bits = Vector<uint32_t, kBytes>;
  using Vec = Split<Float, 2>;
  static constexpr size_t kElementBytes = 2;
  [[gnu::always_inline]] static Vec load(const char* p) {
    const Bits lanes = loadVector<Bits>(p);
    return {(Float)(lanes << 16), (Float)(lanes & 0xffff0000)};
  }
  [[gnu::always_inline]] static Bits encode(Vec v) {
    return (roundToBfloat16High<kBytes>(v.part[1]) & 0xffff0000) |
           (roundToBfloat16High<kBytes>(v.part[0]) >> 16);
  }
};

// The OCP 8-bit floats of nccl.h (ncclFloat8e4m3, ncclFloat8e5m2), four per lane: widened to fp32
// exactly, reduced, and rounded once to nearest even with the saturating conversion NCCL's kernels
// use (CUDA's __NV_SATFINITE): a result beyond the largest finite value, an infinity included,
// becomes that value with its sign; a NaN stays a NaN. E5M2 is IEEE-like (infinities, NaNs);
// E4M3 has no infinity, and S.1111.111 is its only NaN, so its largest finite value is 0x7e.
template <size_t kBytes, int kExponentBits, int kMantissaBits>
struct Fp8Codec {
  using Compute = float;
  using Float = Vector<float, kBytes>;
  using Bits = Vector<uint32_t, kBytes>;
  using Vec = Split<Float, 4>;
  static constexpr size_t kElementBytes = 1;
  static constexpr uint32_t kBias = (1u << (kExponentBits - 1)) - 1;
  static constexpr bool kHasInfinity = kExponentBits == 5;
  static constexpr uint32_t kLargestFinite = kHasInfinity ? 0x7b : 0x7e;
  static constexpr int kDroppedBits = 23 - kMantissaBits;  // fp32 mantissa bits that fp8 lacks
  // The subnormal step, 2^(1 - bias - mantissa bits); and a float whose ulp is that step.
  static constexpr float kSubnormalStep = 1.0f / (1u << (kBias - 1 + kMantissaBits));
  static constexpr uint32_t kSubnormalAnchorBits = (127 + kDroppedBits + 1 - kBias) << 23;

  [[gnu::always_inline]] static Float widen(Bits byte) {
    const Bits sign = (byte & 0x80) << 24;
    const Bits magnitude = byte & 0x7f;
    Bits bits = (magnitude << kDroppedBits) + ((127 - kBias) << 23);  // normal: rebias
    if constexpr (kHasInfinity) {
      bits = magnitude >= 0x7c ? bits | 0x7f800000 : bits;  // all-ones exponent: inf or NaN
    } else {
      bits = magnitude == 0x7f ? broadcast<Bits>(0x7fc00000) : bits;  // the NaN
    }
    const Float subnormal = __builtin_convertvector(magnitude, Float) * kSubnormalStep;  // exact
    bits = magnitude < (1u << kMantissaBits) ? (Bits)subnormal : bits;
    return (Float)(bits | sign);
  }

  // The fp8 pattern in the low 8 bits of each lane, the rest zero.
  [[gnu::always_inline]] static Bits narrow(Float value) {
    const Bits bits = (Bits)value;
    const Bits sign = (bits >> 24) & 0x80;
    const Bits magnitude = bits & 0x7fffffff;
    // Normal results: rebias, round the dropped bits to nearest even, saturate (infinity too).
    Bits normal = (magnitude - ((127 - kBias) << 23) + ((1u << (kDroppedBits - 1)) - 1) +
                   ((magnitude >> kDroppedBits) & 1)) >>
                  kDroppedBits;
    normal = normal > kLargestFinite ? broadcast<Bits>(kLargestFinite) : normal;
    // Subnormal results: adding the anchor lets the FPU round to the subnormal step once.
    const Bits subnormal = (Bits)((Float)magnitude + (Float)broadcast<Bits>(kSubnormalAnchorBits)) -
                           kSubnormalAnchorBits;
    Bits result = magnitude < ((128 - kBias) << 23) ? subnormal : normal;
    result = magnitude > 0x7f800000 ? broadcast<Bits>(0x7f) : result;  // NaN
    return result | sign;
  }

  [[gnu::always_inline]] static Vec load(const char* p) {
    const Bits lanes = loadVector<Bits>(p);
    return {widen(lanes & 0xff), widen((lanes >> 8) & 0xff), widen((lanes >> 16) & 0xff),
            widen(lanes >> 24)};
  }
  [[gnu::always_inline]] static Bits encode(Vec v) {
    return narrow(v.part[0]) | (narrow(v.part[1]) << 8) | (narrow(v.part[2]) << 16) |
           (narrow(v.part[3]) << 24);
  }
};

// Isa may supply halfToFloat/floatToHalf for its vector width; without them fp16 is converted in
// software.
template <class Isa>
constexpr bool kHasHalfConversions = requires {
  &Isa::halfToFloat;
};

template <class Isa>
using HalfCodec = std::conditional_t<kHasHalfConversions<Isa>, HardwareHalfCodec<Isa>,
                                     SoftHalfCodec<Isa::kVectorBytes>>;

enum class Op { Sum, Prod, Max, Min };

template <Op kOp, class T, class V>
[[gnu::always_inline]] inline V combine(V a, V b) {
  if constexpr (std::is_integral_v<T>) {
    // Integer sums and products wrap: computed unsigned, where overflow is defined.
    using Unsigned = Vector<std::make_unsigned_t<T>, sizeof(V)>;
    if constexpr (kOp == Op::Sum) return (V)((Unsigned)a + (Unsigned)b);
    if constexpr (kOp == Op::Prod) return (V)((Unsigned)a * (Unsigned)b);
  } else {
    if constexpr (kOp == Op::Sum) return a + b;
    if constexpr (kOp == Op::Prod) return a * b;
  }
  // Max/Min: a NaN in either input gives a NaN, so a NaN gradient is never hidden. A NaN `a` is
  // picked by (a != a); a NaN `b` fails every comparison and is picked as the "else". Equal
  // inputs (+0 and -0) give b. For integers (a != a) is always false.
  if constexpr (kOp == Op::Max) return ((a > b) | (a != a)) ? a : b;
  if constexpr (kOp == Op::Min) return ((a < b) | (a != a)) ? a : b;
}

// result / divisor with C semantics: truncating for integers, in the type C promotes to (int for
// 8-bit types, so a divisor above 127 is still exact), then converted back. Integers of up to 32
// bits divide in floating point instead, which vectorizes: while |value| < 2^24 (float) or 2^53
// (double), the rounded quotient never crosses an integer, so truncating it gives C's quotient.
// 8-bit lanes widen one size at a time: GCC 12 scalarizes conversions that skip sizes.
template <class T, class V>
[[gnu::always_inline]] inline V divide(V value, int divisor) {
  constexpr size_t kLanes = sizeof(V) / sizeof(T);
  if constexpr (std::is_integral_v<T> && sizeof(T) == 1) {
    using Short = Vector<std::conditional_t<std::is_signed_v<T>, int16_t, uint16_t>, kLanes * 2>;
    using Int = Vector<int32_t, kLanes * 4>;
    using Float = Vector<float, kLanes * 4>;
    const Int wide = __builtin_convertvector(__builtin_convertvector(value, Short), Int);
    const Float quotient = __builtin_convertvector(wide, Float) / static_cast<float>(divisor);
    return __builtin_convertvector(
        __builtin_convertvector(__builtin_convertvector(quotient, Int), Short), V);
  } else {
    using Quotient = std::conditional_t<std::is_integral_v<T> && sizeof(T) == 4, double,
                                        decltype(T{} / divisor)>;
    using Wide = Vector<Quotient, kLanes * sizeof(Quotient)>;
    const Wide quotient = __builtin_convertvector(value, Wide) / static_cast<Quotient>(divisor);
    return __builtin_convertvector(quotient, V);
  }
}

template <Op kOp, class T, class V, size_t N>
[[gnu::always_inline]] inline Split<V, N> combine(Split<V, N> a, Split<V, N> b) {
  Split<V, N> result;
  for (size_t k = 0; k < N; ++k) result.part[k] = combine<kOp, T>(a.part[k], b.part[k]);
  return result;
}

template <class T, class V, size_t N>
[[gnu::always_inline]] inline Split<V, N> divide(Split<V, N> value, int divisor) {
  for (size_t k = 0; k < N; ++k) value.part[k] = divide<T>(value.part[k], divisor);
  return value;
}

// Stores one encoded vector. Streaming (non-temporal) stores skip the read-for-ownership and the
// cache: for outputs too large to stay cached, they cut the memory traffic of a write by half.
// They need an aligned address; the caller fences once after the last one (streamFence).
template <bool kStream, class Encoded>
[[gnu::always_inline]] inline void storeEncoded(char* p, Encoded v) {
#if defined(__x86_64__)
  if constexpr (kStream && sizeof(Encoded) == 64) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p), (__m512i)v);
  } else if constexpr (kStream && sizeof(Encoded) == 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), (__m256i)v);
  } else if constexpr (kStream && sizeof(Encoded) == 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), (__m128i)v);
  } else {
    storeVector(p, v);
  }
#else
  storeVector(p, v);
#endif
}

template <class Codec, Op kOp, bool kDivide, bool kSecondDst, bool kStream>
struct Kernel {
  using Vec = typename Codec::Vec;
  using Compute = typename Codec::Compute;
  static constexpr size_t kLanes = sizeof(Vec) / sizeof(Compute);
  static constexpr size_t kStride = kLanes * Codec::kElementBytes;  // stored bytes per vector
  static constexpr size_t kUnroll = 4;

  [[gnu::always_inline]] static Vec compute(const char* a, const char* b, int divisor) {
    const Vec result = combine<kOp, Compute>(Codec::load(a), Codec::load(b));
    if constexpr (kDivide) return divide<Compute>(result, divisor);
    return result;
  }

  // Fewer than kLanes elements go through zeroed stack vectors, so heads and tails run the same
  // arithmetic (and rounding) as the body. Inputs are copied before dst is written (dst may be a).
  static void partial(char* dst, char* dst2, const char* a, const char* b, size_t bytes,
                      int divisor) {
    alignas(64) char inA[kStride] = {};
    alignas(64) char inB[kStride] = {};
    alignas(64) char out[kStride];
    std::memcpy(inA, a, bytes);
    std::memcpy(inB, b, bytes);
    storeVector(out, Codec::encode(compute(inA, inB, divisor)));
    std::memcpy(dst, out, bytes);
    if constexpr (kSecondDst) std::memcpy(dst2, out, bytes);
  }

  static void run(char* dst, char* dst2, const char* a, const char* b, size_t count, int divisor) {
    const size_t bytes = count * Codec::kElementBytes;
    // Align the stores when elements allow it: a store split across cache lines costs two.
    const auto dstAddress = reinterpret_cast<uintptr_t>(dst);
    const bool alignable = dstAddress % Codec::kElementBytes == 0;
    // Streaming stores need the alignment; without it they would fault.
    if (kStream && !alignable)
      return Kernel<Codec, kOp, kDivide, kSecondDst, false>::run(dst, dst2, a, b, count, divisor);
    size_t head = alignable ? -dstAddress % kStride : 0;
    if (head > bytes) head = bytes;
    if (head > 0) partial(dst, dst2, a, b, head, divisor);
    size_t offset = head;
    for (; offset + kUnroll * kStride <= bytes; offset += kUnroll * kStride) {
      // All loads before any store: correct when dst is exactly a or b, and lets loads run ahead.
      Vec results[kUnroll];
      for (size_t u = 0; u < kUnroll; ++u)
        results[u] = compute(a + offset + u * kStride, b + offset + u * kStride, divisor);
      for (size_t u = 0; u < kUnroll; ++u) {
        storeEncoded<kStream>(dst + offset + u * kStride, Codec::encode(results[u]));
        if constexpr (kSecondDst)
          storeEncoded<false>(dst2 + offset + u * kStride, Codec::encode(results[u]));
      }
    }
    for (; offset + kStride <= bytes; offset += kStride) {
      const Vec result = compute(a + offset, b + offset, divisor);
      storeEncoded<kStream>(dst + offset, Codec::encode(result));
      if constexpr (kSecondDst) storeEncoded<false>(dst2 + offset, Codec::encode(result));
    }
    if (offset < bytes) {
      partial(dst + offset, kSecondDst ? dst2 + offset : nullptr, a + offset, b + offset,
              bytes - offset, divisor);
    }
  }
};

// The ReduceFn: picks the variant once per call, outside the loop.
template <class Codec, Op kOp, bool kStream>
void reduce(void* dst, void* dst2, const void* a, const void* b, size_t count, int divisor) {
  auto* d = static_cast<char*>(dst);
  auto* d2 = static_cast<char*>(dst2);
  const auto* pa = static_cast<const char*>(a);
  const auto* pb = static_cast<const char*>(b);
  if constexpr (kOp == Op::Sum) {
    if (divisor > 1) {
      if (d2 != nullptr)
        return Kernel<Codec, kOp, true, true, kStream>::run(d, d2, pa, pb, count, divisor);
      return Kernel<Codec, kOp, true, false, kStream>::run(d, d2, pa, pb, count, divisor);
    }
  }
  if (d2 != nullptr)
    return Kernel<Codec, kOp, false, true, kStream>::run(d, d2, pa, pb, count, divisor);
  Kernel<Codec, kOp, false, false, kStream>::run(d, d2, pa, pb, count, divisor);
}

template <class Codec, bool kStream>
constexpr void fillOps(ReduceFn (&fn)[braidNumOps]) {
  fn[braidSum] = &reduce<Codec, Op::Sum, kStream>;
  fn[braidProd] = &reduce<Codec, Op::Prod, kStream>;
  fn[braidMax] = &reduce<Codec, Op::Max, kStream>;
  fn[braidMin] = &reduce<Codec, Op::Min, kStream>;
  fn[braidAvg] = &reduce<Codec, Op::Sum, kStream>;  // divides when given divisor > 1
}

template <class Codec>
constexpr void fillType(ReduceTable& table, braidDataType_t type) {
  fillOps<Codec, false>(table.fn[type]);
  fillOps<Codec, true>(table.streamingFn[type]);
}

// Isa: kVectorBytes, and optionally fp16 conversions (see HalfCodec).
template <class Isa>
constexpr ReduceTable makeTable() {
  constexpr size_t kBytes = Isa::kVectorBytes;
  ReduceTable table{};
  fillType<NativeCodec<int8_t, kBytes>>(table, braidInt8);
  fillType<NativeCodec<uint8_t, kBytes>>(table, braidUint8);
  fillType<NativeCodec<int32_t, kBytes>>(table, braidInt32);
  fillType<NativeCodec<uint32_t, kBytes>>(table, braidUint32);
  fillType<NativeCodec<int64_t, kBytes>>(table, braidInt64);
  fillType<NativeCodec<uint64_t, kBytes>>(table, braidUint64);
  fillType<HalfCodec<Isa>>(table, braidFloat16);
  fillType<NativeCodec<float, kBytes>>(table, braidFloat32);
  fillType<NativeCodec<double, kBytes>>(table, braidFloat64);
  fillType<Bfloat16Codec<kBytes>>(table, braidBfloat16);
  fillType<Fp8Codec<kBytes, 4, 3>>(table, braidFloat8e4m3);
  fillType<Fp8Codec<kBytes, 5, 2>>(table, braidFloat8e5m2);
  return table;
}

}  // namespace
}  // namespace braid::kernels
