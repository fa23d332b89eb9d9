// Shared by the multirank tests: the C type behind each braid dtype, fp16/bf16 conversions written
// here and fp8 ones in reference/fp8.h (independent of braid), input generators whose reductions
// are exact in every type, and the reference result of every reduction computed from those
// generators alone.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "braid/braid.h"
#include "reference/fp8.h"

namespace braid_test {

// 16-bit float formats carried as their bit patterns.
struct Half {
  uint16_t bits;
};
struct Bfloat16 {
  uint16_t bits;
};
// 8-bit float formats, likewise.
struct Float8e4m3 {
  uint8_t bits;
};
struct Float8e5m2 {
  uint8_t bits;
};

inline float floatFromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline uint32_t bitsOfFloat(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    return floatFromBits(bitsOfFloat(static_cast<float>(mantissa) * 0x1p-24f) | sign);
  }
  if (exponent == 31) return floatFromBits(sign | 0x7f800000 | (mantissa << 13));
  return floatFromBits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// Round to nearest, ties to even.
inline uint16_t floatToHalf(float f) {
  uint32_t bits = bitsOfFloat(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  bits &= 0x7fffffff;
  if (bits > 0x7f800000) return sign | 0x7e00;   // NaN
  if (bits >= 0x477ff000) return sign | 0x7c00;  // from halfway between 65504 and 2^16: infinity
  if (bits < 0x38800000) {
    // Below 2^-14 the result is subnormal: adding 0.5 leaves the value in a binade whose ulp is
    // 2^-24, the subnormal step, so the hardware addition rounds it exactly once.
    return sign | static_cast<uint16_t>(bitsOfFloat(floatFromBits(bits) + 0.5f) - 0x3f000000);
  }
  // Rebias the exponent, then round the 13 dropped bits; a carry moves into the exponent.
  bits += (static_cast<uint32_t>(15 - 127) << 23) + 0xfff + ((bits >> 13) & 1);
  return sign | static_cast<uint16_t>(bits >> 13);
}

inline float bfloat16ToFloat(uint16_t b) {
  return floatFromBits(static_cast<uint32_t>(b) << 16);
}

inline uint16_t floatToBfloat16(float f) {
  uint32_t bits = bitsOfFloat(f);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);  // ties to even, carrying into the exponent when needed
  return static_cast<uint16_t>(bits >> 16);
}

// Calls f(T{}) with the C type that holds one element of `type`.
template <typename F>
decltype(auto) visitDtype(braidDataType_t type, F&& f) {
  switch (type) {
    case braidInt8: return f(int8_t{});
    case braidUint8: return f(uint8_t{});
    case braidInt32: return f(int32_t{});
    case braidUint32: return f(uint32_t{});
    case braidInt64: return f(int64_t{});
    case braidUint64: return f(uint64_t{});
    case braidFloat16: return f(Half{});
    case braidFloat32: return f(float{});
    case braidFloat64: return f(double{});
    case braidBfloat16: return f(Bfloat16{});
    case braidFloat8e4m3: return f(Float8e4m3{});
    case braidFloat8e5m2: return f(Float8e5m2{});
    default: break;
  }
  std::fprintf(stderr, "visitDtype: unknown braidDataType_t %d\n", static_cast<int>(type));
  std::abort();
}

inline constexpr braidDataType_t kAllDtypes[] = {
    braidInt8,    braidUint8,   braidInt32,   braidUint32,   braidInt64,      braidUint64,
    braidFloat16, braidFloat32, braidFloat64, braidBfloat16, braidFloat8e4m3, braidFloat8e5m2};
// PreMulSum stands for the operator braidRedOpCreatePreMulSum makes (a different id on every
// communicator): every rank's input times its premulScalar, summed.
inline constexpr braidRedOp_t kPreMulSum = static_cast<braidRedOp_t>(braidNumOps);
inline constexpr braidRedOp_t kAllOps[] = {braidSum, braidProd, braidMax,
                                           braidMin, braidAvg,  kPreMulSum};

inline const char* dtypeName(braidDataType_t type) {
  static const char* const kNames[] = {"int8",    "uint8",    "int32",   "uint32",
                                       "int64",   "uint64",   "float16", "float32",
                                       "float64", "bfloat16", "f8e4m3",  "f8e5m2"};
  return type >= 0 && type < braidNumTypes ? kNames[type] : "bad-dtype";
}
inline const char* opName(braidRedOp_t op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
  return op >= 0 && op <= kPreMulSum ? kNames[op] : "bad-op";
}
inline size_t dtypeSize(braidDataType_t type) {
  return visitDtype(type, [](auto element) { return sizeof element; });
}

// The float formats C++ has no type for, carried as bit patterns.
template <typename T>
inline constexpr bool kIsNarrowFloat =
    std::is_same_v<T, Half> || std::is_same_v<T, Bfloat16> || std::is_same_v<T, Float8e4m3> ||
    std::is_same_v<T, Float8e5m2>;
template <typename T>
inline constexpr bool kIsFloat = kIsNarrowFloat<T> || std::is_floating_point_v<T>;

template <typename T>
double toDouble(T v) {
  if constexpr (std::is_same_v<T, Half>)
    return halfToFloat(v.bits);
  else if constexpr (std::is_same_v<T, Bfloat16>)
    return bfloat16ToFloat(v.bits);
  else if constexpr (std::is_same_v<T, Float8e4m3>)
    return e4m3ToFloat(v.bits);
  else if constexpr (std::is_same_v<T, Float8e5m2>)
    return e5m2ToFloat(v.bits);
  else
    return static_cast<double>(v);
}

// Exact when `v` is representable in T, which every reference value below is by construction.
template <typename T>
T fromDouble(double v) {
  if constexpr (std::is_same_v<T, Half>)
    return Half{floatToHalf(static_cast<float>(v))};
  else if constexpr (std::is_same_v<T, Bfloat16>)
    return Bfloat16{floatToBfloat16(static_cast<float>(v))};
  else if constexpr (std::is_same_v<T, Float8e4m3>)
    return Float8e4m3{floatToE4m3(static_cast<float>(v))};
  else if constexpr (std::is_same_v<T, Float8e5m2>)
    return Float8e5m2{floatToE5m2(static_cast<float>(v))};
  else
    return static_cast<T>(v);
}

template <typename T>
bool sameBits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <typename T>
std::string formatElement(const T& v) {
  char text[64];
  if constexpr (kIsFloat<T>) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof v);
    std::snprintf(text, sizeof text, "%.9g (0x%0*llx)", toDouble(v), static_cast<int>(2 * sizeof v),
                  static_cast<unsigned long long>(bits));
  } else if constexpr (std::is_signed_v<T>) {
    std::snprintf(text, sizeof text, "%lld", static_cast<long long>(v));
  } else {
    std::snprintf(text, sizeof text, "%llu", static_cast<unsigned long long>(v));
  }
  return text;
}

// What the inputs of one case look like. Every reducing op gets values whose reduction is exact in
// the element type, whatever order the library reduces in:
//  Data   (no reduction): random bit patterns of the whole element.
//  Sum    integers: random full-width values, so sums wrap (modular, exact in any order);
//         floats: multiples of 1/4 in [-8, 8] (bf16: integers in [-16, 16]; fp8 E4M3: in
//         [-2, 2], E5M2: in [-1, 1]); every partial sum of 8 ranks stays within the significant
//         bits (fp16 11, bf16 8, E4M3 4, E5M2 3).
//  Prod   integers: from {0 (rarely), ±1, 2, ±3, 7, 255, -129, 65537}, wrapping too;
//         floats: from {0 (rarely), ±1/2, ±1, ±2}: 8 ranks stay within 2^-8 .. 2^8 (16 ranks
//         within 2^-16 .. 2^16, which fp16 and the fp8 formats cannot hold).
//  MaxMin integers: random full-width values (signedness matters);
//         floats: random bit patterns, NaN and -0 replaced so max/min are unambiguous (fp8:
//         also infinity, which the saturating conversion turns into the largest finite value).
//  PreMulSum  as Sum, each rank's input times premulScalar (1, or -1 for floats and 3 for
//         integers on ranks past the first, as the case's salt says), which keeps every sum as
//         exact as Sum's.
//  Avg    floats: as Sum; integers: [-15, 15] signed, [0, 31] unsigned, so the sum of 8 ranks
//         never wraps and only the division rounds (C truncation toward zero).
enum class InputKind { Data, Sum, Prod, MaxMin, Avg };

constexpr InputKind inputKindFor(braidRedOp_t op) {
  if (op == kPreMulSum) return InputKind::Sum;
  switch (op) {
    case braidSum: return InputKind::Sum;
    case braidProd: return InputKind::Prod;
    case braidMax:
    case braidMin: return InputKind::MaxMin;
    default: return InputKind::Avg;
  }
}

// Calls f(std::integral_constant<InputKind, kind>{}): generators and references are compiled
// once per kind and op, so the per-element loops do not branch on them.
template <typename F>
decltype(auto) visitKind(InputKind kind, F&& f) {
  switch (kind) {
    case InputKind::Data: return f(std::integral_constant<InputKind, InputKind::Data>{});
    case InputKind::Sum: return f(std::integral_constant<InputKind, InputKind::Sum>{});
    case InputKind::Prod: return f(std::integral_constant<InputKind, InputKind::Prod>{});
    case InputKind::MaxMin: return f(std::integral_constant<InputKind, InputKind::MaxMin>{});
    case InputKind::Avg: break;
  }
  return f(std::integral_constant<InputKind, InputKind::Avg>{});
}

template <typename F>
decltype(auto) visitOp(braidRedOp_t op, F&& f) {
  switch (op) {
    case braidSum: return f(std::integral_constant<braidRedOp_t, braidSum>{});
    case braidProd: return f(std::integral_constant<braidRedOp_t, braidProd>{});
    case braidMax: return f(std::integral_constant<braidRedOp_t, braidMax>{});
    case braidMin: return f(std::integral_constant<braidRedOp_t, braidMin>{});
    case braidAvg: return f(std::integral_constant<braidRedOp_t, braidAvg>{});
    default: break;
  }
  if (op == kPreMulSum) return f(std::integral_constant<braidRedOp_t, kPreMulSum>{});
  std::fprintf(stderr, "visitOp: unknown braidRedOp_t %d\n", static_cast<int>(op));
  std::abort();
}

inline uint64_t mixBits(uint64_t salt, int rank, size_t index) {
  uint64_t x = salt + (static_cast<uint64_t>(rank) + 1) * 0xc2b2ae3d27d4eb4fULL +
               (static_cast<uint64_t>(index) + 1) * 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

template <typename T>
T bitsAs(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof v);  // little-endian: the low bytes
  return v;
}

// Float Sum/Avg inputs are whole multiples of a unit (1/4; bf16 and fp8: 1): `sumSteps` of them.
template <typename T>
inline constexpr int kSumStepRange = std::is_same_v<T, Bfloat16>     ? 16
                                     : std::is_same_v<T, Float8e4m3> ? 2
                                     : std::is_same_v<T, Float8e5m2> ? 1
                                                                     : 32;
template <typename T>
inline constexpr double kSumUnit =
    std::is_same_v<T, Bfloat16> || std::is_same_v<T, Float8e4m3> || std::is_same_v<T, Float8e5m2>
        ? 1.0
        : 0.25;

template <typename T>
int sumSteps(uint64_t r) {
  return static_cast<int>(r % (2 * kSumStepRange<T> + 1)) - kSumStepRange<T>;
}

// Float Prod inputs: 0 (one in 64) or +-2^exponent with exponent in {-1, 0, 1}.
struct ProdFactor {
  bool zero;
  bool negative;
  int exponent;
};

inline ProdFactor prodFactor(uint64_t r) {
  static constexpr ProdFactor kFactors[] = {{false, false, 0}, {false, false, 1},
                                            {false, true, 0},  {false, false, -1},
                                            {false, true, 1},  {false, true, -1}};
  if (r % 64 == 0) return {true, false, 0};
  return kFactors[(r >> 8) % 6];
}

inline double signedPowerOfTwo(bool negative, int exponent) {
  return (negative ? -1 : 1) * std::ldexp(1.0, exponent);
}

// The bits of a float element, mapped so that unsigned order is numeric order (for non-NaN values;
// -0 sorts below +0, and the generators never put both at one index).
template <typename T>
auto orderKey(const T& v) {
  using Bits = std::conditional_t<
      sizeof(T) == 1, uint8_t,
      std::conditional_t<sizeof(T) == 2, uint16_t,
                         std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
  Bits bits;
  std::memcpy(&bits, &v, sizeof bits);
  constexpr Bits kSign = Bits{1} << (8 * sizeof(Bits) - 1);
  return static_cast<Bits>(bits & kSign ? ~bits : bits | kSign);
}

// Bit patterns of the float formats: the sign, and the largest magnitude Max/Min inputs take:
// +infinity (any larger magnitude is a NaN), for fp8 the largest finite value.
template <typename T>
inline constexpr uint64_t kSignBit = uint64_t{1} << (8 * sizeof(T) - 1);
template <typename T>
inline constexpr uint64_t kLargestMaxMinBits = std::is_same_v<T, Half>         ? 0x7c00
                                               : std::is_same_v<T, Bfloat16>   ? 0x7f80
                                               : std::is_same_v<T, Float8e4m3> ? 0x7e
                                               : std::is_same_v<T, Float8e5m2> ? 0x7b
                                               : std::is_same_v<T, float>      ? 0x7f800000
                                                                               : 0x7ff0000000000000;

template <typename T, InputKind kKind>
T inputValue(uint64_t salt, int rank, size_t index) {
  const uint64_t r = mixBits(salt, rank, index);
  if constexpr (kKind == InputKind::Data) {
    return bitsAs<T>(r);
  } else if constexpr (kKind == InputKind::MaxMin) {
    if constexpr (kIsFloat<T>) {
      const uint64_t magnitude = r & (kSignBit<T> - 1);
      if (magnitude > kLargestMaxMinBits<T>) {
        return fromDouble<T>(static_cast<double>(r % 1000));  // NaN (fp8: or infinity)
      }
      if (magnitude == 0) return T{};  // no -0 next to +0
    }
    return bitsAs<T>(r);
  } else if constexpr (kIsFloat<T>) {
    if constexpr (kKind == InputKind::Prod) {
      const ProdFactor f = prodFactor(r);
      return f.zero ? T{} : fromDouble<T>(signedPowerOfTwo(f.negative, f.exponent));
    } else {
      return fromDouble<T>(sumSteps<T>(r) * kSumUnit<T>);
    }
  } else if constexpr (kKind == InputKind::Sum) {
    return bitsAs<T>(r);
  } else if constexpr (kKind == InputKind::Prod) {
    static constexpr int64_t kFactors[] = {1, -1, 2, 3, -3, 7, 255, -129, 65537};
    return static_cast<T>(r % 64 == 0 ? 0 : kFactors[(r >> 8) % 9]);
  } else if constexpr (std::is_signed_v<T>) {  // Avg
    return static_cast<T>(static_cast<int>(r % 31) - 15);
  } else {
    return static_cast<T>(r % 32);
  }
}

// PreMulSum's scalar of each rank in the case of `salt`: 1, or on ranks past the first as the
// salt's bits say, -1 for floats (exact, so the Sum inputs' sums stay exact) and 3 for integers
// (which wrap, exactly). Calls of one kernel launch (a work list) thus carry different scalars.
// Rank 0's stays 1: a lone rank's 0 times -1 is -0, which the reference (in integers) writes 0.
inline int premulFactor(bool isFloat, int rank, uint64_t salt) {
  const bool scaled = rank > 0 && ((salt >> (rank % 64)) & 1) != 0;
  return !scaled ? 1 : isFloat ? -1 : 3;
}
template <typename T>
T premulScalar(int rank, uint64_t salt) {
  return fromDouble<T>(premulFactor(kIsFloat<T>, rank, salt));
}

// The reduction with kOp over ranks 0..nranks-1 of their inputs at `index`. Floats are reduced in
// integers (steps of the Sum unit, exponents and signs of the Prod factors, order keys) and
// converted once, so the reference is exact and cheap.
template <typename T, braidRedOp_t kOp>
T referenceReduce(uint64_t salt, int nranks, size_t index) {
  auto input = [&](int rank) { return inputValue<T, inputKindFor(kOp)>(salt, rank, index); };
  if constexpr (kOp == braidMax || kOp == braidMin) {
    T best = input(0);
    for (int rank = 1; rank < nranks; ++rank) {
      const T v = input(rank);
      if constexpr (kIsFloat<T>) {
        if (kOp == braidMax ? orderKey(v) > orderKey(best) : orderKey(v) < orderKey(best)) best = v;
      } else {
        if (kOp == braidMax ? v > best : v < best) best = v;
      }
    }
    return best;
  } else if constexpr (kIsFloat<T> && kOp == braidProd) {
    bool zero = false, negative = false;
    int exponent = 0;
    for (int rank = 0; rank < nranks; ++rank) {
      const ProdFactor f = prodFactor(mixBits(salt, rank, index));
      zero |= f.zero;
      negative ^= f.negative;  // the sign of an IEEE product, zeros included
      exponent += f.exponent;
    }
    return zero ? fromDouble<T>(negative ? -0.0 : 0.0)
                : fromDouble<T>(signedPowerOfTwo(negative, exponent));
  } else if constexpr (kIsFloat<T>) {  // Sum, Avg, PreMulSum
    int steps = 0;
    for (int rank = 0; rank < nranks; ++rank) {
      const int factor = kOp == kPreMulSum ? premulFactor(true, rank, salt) : 1;
      steps += factor * sumSteps<T>(mixBits(salt, rank, index));
    }
    const double exact = steps * kSumUnit<T>;
    if constexpr (kOp != braidAvg) return fromDouble<T>(exact);
    // Avg: the exact sum divided once in the element type (16- and 8-bit floats: in fp32, then
    // rounded).
    else if constexpr (std::is_same_v<T, double>)
      return exact / nranks;
    else if constexpr (std::is_same_v<T, float>)
      return static_cast<float>(exact) / nranks;
    else
      return fromDouble<T>(static_cast<float>(exact) / static_cast<float>(nranks));
  } else if constexpr (kOp == braidAvg) {  // the inputs keep this sum inside T
    int64_t sum = 0;
    for (int rank = 0; rank < nranks; ++rank) sum += static_cast<int64_t>(input(rank));
    return static_cast<T>(sum / nranks);
  } else {
    uint64_t wrapped = kOp == braidProd ? 1 : 0;  // modulo 2^64, truncated to T's width below
    for (int rank = 0; rank < nranks; ++rank) {
      auto v = static_cast<uint64_t>(static_cast<int64_t>(input(rank)));
      if (kOp == kPreMulSum) v *= static_cast<uint64_t>(premulFactor(false, rank, salt));
      wrapped = kOp == braidProd ? wrapped * v : wrapped + v;
    }
    return static_cast<T>(static_cast<std::make_unsigned_t<T>>(wrapped));
  }
}

// Each float format's significand bits (the implicit one included) and the exponent of its
// subnormal step.
struct FloatPrecision {
  int significandBits;
  int subnormalExponent;
};
template <typename T>
constexpr FloatPrecision precisionOf() {
  if constexpr (std::is_same_v<T, Half>) return {11, -24};
  if constexpr (std::is_same_v<T, Bfloat16>) return {8, -133};
  if constexpr (std::is_same_v<T, Float8e4m3>) return {4, -9};
  if constexpr (std::is_same_v<T, Float8e5m2>) return {3, -16};
  if constexpr (std::is_same_v<T, float>) return {24, -149};
  return {53, -1074};
}

// braidAvg of floats through the API, run as NCCL runs it: each rank's input times 1/n rounded to
// T (the product rounded once), then summed in whatever order the algorithm takes (the engines
// alone divide the sum once: referenceReduce). Accepts `got` within the n - 1 roundings of that
// sum, each at most half an ulp of a partial sum no larger than the products' magnitudes together;
// twice that for fp64, whose products this sums in fp64 too.
template <typename T>
bool acceptsApiAverage(const T& got, uint64_t salt, int nranks, size_t index) {
  const double scale = toDouble(
      fromDouble<T>(std::is_same_v<T, double> ? 1.0 / nranks : static_cast<float>(1.0 / nranks)));
  double exact = 0, bound = 0;
  for (int rank = 0; rank < nranks; ++rank) {
    const T input = inputValue<T, inputKindFor(braidAvg)>(salt, rank, index);
    const double product = toDouble(fromDouble<T>(toDouble(input) * scale));
    exact += product;
    bound += std::fabs(product);
  }
  constexpr FloatPrecision kPrecision = precisionOf<T>();
  const double halfUlp = std::max(std::ldexp(bound, -kPrecision.significandBits),
                                  std::ldexp(1.0, kPrecision.subnormalExponent - 1));
  const double slack = (std::is_same_v<T, double> ? 2 : 1) * (nranks - 1) * halfUlp;
  return std::fabs(toDouble(got) - exact) <= slack;
}

}  // namespace braid_test
