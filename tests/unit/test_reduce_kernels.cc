// Host reduction kernels against a scalar reference written here (one element at a time, fp16
// through the compiler's _Float16 soft-float, bf16 by comparing distances), for every instruction
// set this CPU supports x dtype x op x awkward counts and alignments, plus chosen fp16/bf16
// rounding cases, exhaustive 16-bit sweeps, and the fp32 -> fp16/bf16 primitives on sampled fp32
// bit patterns (every NaN payload shape included); fp8 (E4M3, E5M2) exhaustively against a
// reference decoded from the format's fields, itself checked against the CUDA toolkit's
// conversions (cuda_fp8.h, NCCL's rules) where that header is found.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kernels/host_reduce.h"
#include "kernels/host_reduce_impl.h"  // the conversion primitives, at the baseline width
#include "reference/fp8.h"

#if __has_include(<cuda_fp8.h>)
#include <cuda_fp8.h>  // host conversions, the authority for NCCL's fp8 rounding and saturation
#define BRAID_TEST_HAVE_CUDA_FP8 1
#endif

namespace braid::kernels {
namespace {

using braid_test::e4m3ToFloat;
using braid_test::e5m2ToFloat;
using braid_test::floatToE4m3;
using braid_test::floatToE5m2;
using braid_test::floatToFp8;
using braid_test::fp8ToFloat;
using braid_test::kE4m3;
using braid_test::kE5m2;

constexpr Isa kIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512};
constexpr braidRedOp_t kOps[] = {braidSum, braidProd, braidMax, braidMin, braidAvg};
constexpr braidDataType_t kTypes[] = {
    braidInt8,    braidUint8,   braidInt32,   braidUint32,   braidInt64,      braidUint64,
    braidFloat16, braidFloat32, braidFloat64, braidBfloat16, braidFloat8e4m3, braidFloat8e5m2};

const char* isaLabel(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

const char* typeLabel(braidDataType_t type) {
  static const char* const kNames[] = {"int8",    "uint8",    "int32",   "uint32",
                                       "int64",   "uint64",   "float16", "float32",
                                       "float64", "bfloat16", "f8e4m3",  "f8e5m2"};
  return kNames[type];
}

const char* opLabel(braidRedOp_t op) {
  static const char* const kNames[] = {"sum", "prod", "max", "min", "avg"};
  return kNames[op];
}

template <class To, class From>
To bitCast(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

// ---- Reference ----

// fp16 through GCC's _Float16, converted in software by libgcc (this file gets no -mf16c).
float halfToFloat(uint16_t bits) {
  return static_cast<float>(bitCast<_Float16>(bits));
}
uint16_t floatToHalf(float value) {
  return bitCast<uint16_t>(static_cast<_Float16>(value));
}

float bfloat16ToFloat(uint16_t bits) {
  return bitCast<float>(static_cast<uint32_t>(bits) << 16);
}

// Nearest bfloat16 by comparing the distances to the two neighbours in double; ties to the even
// one; above the largest finite value (ties included) the upper neighbour is infinity.
uint16_t floatToBfloat16(float value) {
  if (std::isnan(value)) return 0x7fc0;
  const uint32_t bits = bitCast<uint32_t>(value);
  const uint16_t sign = (bits >> 16) & 0x8000;
  const uint32_t magnitude = bits & 0x7fffffff;
  const uint16_t below = magnitude >> 16;
  if ((magnitude & 0xffff) == 0) return sign | below;
  const int biasedExponent = std::max(1, static_cast<int>(below >> 7));
  const double step = std::ldexp(1.0, biasedExponent - 127 - 7);
  const double low = bfloat16ToFloat(below);
  const double distanceDown = std::fabs(value) - low;
  const double distanceUp = low + step - std::fabs(value);
  const bool up = distanceUp < distanceDown || (distanceUp == distanceDown && (below & 1) != 0);
  return sign | static_cast<uint16_t>(below + (up ? 1 : 0));
}

template <class F>
F referenceFloat(F a, F b, braidRedOp_t op, int divisor) {
  switch (op) {
    case braidMax:
    case braidMin:
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<F>::quiet_NaN();
      return op == braidMax ? std::max(a, b) : std::min(a, b);
    case braidProd: return a * b;
    case braidAvg:
      if (divisor > 1) return (a + b) / static_cast<F>(divisor);
      return a + b;
    default: return a + b;
  }
}

template <class T>
T referenceInteger(T a, T b, braidRedOp_t op, int divisor) {
  // Exact in 128 bits, then reduced modulo 2^bits by the conversion (defined since C++20).
  const __int128 wideA = a;
  const __int128 wideB = b;
  switch (op) {
    case braidMax: return a > b ? a : b;
    case braidMin: return a < b ? a : b;
    case braidProd:
      return static_cast<T>(static_cast<unsigned __int128>(wideA) *
                            static_cast<unsigned __int128>(wideB));
    case braidAvg:
      if (divisor > 1) return static_cast<T>(static_cast<T>(wideA + wideB) / divisor);
      return static_cast<T>(wideA + wideB);
    default: return static_cast<T>(wideA + wideB);
  }
}

// One element type as seen by the tests: reference, comparison and random values, on raw bytes.
struct TypeInfo {
  size_t size;
  void (*reference)(void* out, const void* a, const void* b, braidRedOp_t op, int divisor);
  bool (*isNan)(const void* value);  // false for integers
  bool (*isZero)(const void* value);
  void (*random)(void* out, std::mt19937_64& rng);
};

template <class T>
T load(const void* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

template <class T>
TypeInfo integerInfo() {
  return {sizeof(T),
          [](void* out, const void* a, const void* b, braidRedOp_t op, int divisor) {
            const T result = referenceInteger<T>(load<T>(a), load<T>(b), op, divisor);
            std::memcpy(out, &result, sizeof result);
          },
          [](const void*) { return false; }, [](const void* v) { return load<T>(v) == 0; },
          [](void* out, std::mt19937_64& rng) {
            const uint64_t bits = rng();
            std::memcpy(out, &bits, sizeof(T));
          }};
}

// Mostly moderate values with random exponents (so sums round), sometimes any bit pattern
// (NaN, infinities, subnormals, extremes).
template <class F>
TypeInfo floatInfo() {
  return {sizeof(F),
          [](void* out, const void* a, const void* b, braidRedOp_t op, int divisor) {
            const F result = referenceFloat<F>(load<F>(a), load<F>(b), op, divisor);
            std::memcpy(out, &result, sizeof result);
          },
          [](const void* v) { return std::isnan(load<F>(v)); },
          [](const void* v) { return load<F>(v) == 0; },
          [](void* out, std::mt19937_64& rng) {
            const uint64_t bits = rng();
            F value;
            if (bits % 16 == 0) {
              std::memcpy(&value, &bits, sizeof value);
            } else {
              const double mantissa = 1.0 + static_cast<double>(bits >> 12) * 0x1p-52;
              const int exponent = static_cast<int>((bits >> 4) % 41) - 20;
              value = static_cast<F>(std::ldexp((bits & 2) ? -mantissa : mantissa, exponent));
            }
            std::memcpy(out, &value, sizeof value);
          }};
}

// 16- and 8-bit floats (Bits: their storage): reduced in fp32 and rounded once. kBias is the
// format's exponent bias and kMantissaBits its stored mantissa width.
template <class Bits, float (*kWiden)(Bits), Bits (*kNarrow)(float), int kBias, int kMantissaBits>
TypeInfo narrowFloatInfo() {
  return {sizeof(Bits),
          [](void* out, const void* a, const void* b, braidRedOp_t op, int divisor) {
            const float wide =
                referenceFloat<float>(kWiden(load<Bits>(a)), kWiden(load<Bits>(b)), op, divisor);
            const Bits result = kNarrow(wide);
            std::memcpy(out, &result, sizeof result);
          },
          [](const void* v) { return std::isnan(kWiden(load<Bits>(v))); },
          [](const void* v) { return kWiden(load<Bits>(v)) == 0; },
          [](void* out, std::mt19937_64& rng) {
            const uint64_t bits = rng();
            auto value = static_cast<Bits>(bits);
            if (bits % 8 != 0) {
              constexpr Bits kSign = Bits{1} << (8 * sizeof(Bits) - 1);
              const auto exponent = static_cast<Bits>(kBias - 4 + (bits >> 16) % 9);
              const auto mantissa = static_cast<Bits>((bits >> 24) & ((1u << kMantissaBits) - 1));
              value = static_cast<Bits>((value & kSign) | (exponent << kMantissaBits) | mantissa);
            }
            std::memcpy(out, &value, sizeof value);
          }};
}

const TypeInfo& typeInfo(braidDataType_t type) {
  static const TypeInfo kInfos[] = {
      integerInfo<int8_t>(),
      integerInfo<uint8_t>(),
      integerInfo<int32_t>(),
      integerInfo<uint32_t>(),
      integerInfo<int64_t>(),
      integerInfo<uint64_t>(),
      narrowFloatInfo<uint16_t, halfToFloat, floatToHalf, 15, 10>(),
      floatInfo<float>(),
      floatInfo<double>(),
      narrowFloatInfo<uint16_t, bfloat16ToFloat, floatToBfloat16, 127, 7>(),
      narrowFloatInfo<uint8_t, e4m3ToFloat, floatToE4m3, 7, 3>(),
      narrowFloatInfo<uint8_t, e5m2ToFloat, floatToE5m2, 15, 2>()};
  return kInfos[type];
}

std::string hexBytes(const unsigned char* p, size_t size) {
  std::string text = "0x";
  static const char kDigits[] = "0123456789abcdef";
  for (size_t i = size; i-- > 0;) {  // little-endian: most significant byte last
    text += kDigits[p[i] >> 4];
    text += kDigits[p[i] & 15];
  }
  return text;
}

// Same value: equal bits, or both NaN (payloads may differ), or for max/min both zeros (which of
// +0 and -0 an equal comparison keeps is unspecified).
bool sameResult(const TypeInfo& info, const unsigned char* expected, const unsigned char* got,
                braidRedOp_t op) {
  if (info.isNan(expected)) return info.isNan(got);
  if ((op == braidMax || op == braidMin) && info.isZero(expected) && info.isZero(got)) return true;
  return std::memcmp(expected, got, info.size) == 0;
}

// ---- Buffers ----

constexpr unsigned char kPoison = 0xa5;
constexpr size_t kSlack = 128;  // bytes around every region, poisoned and checked

// A region of `bytes` at `offset` from a 64-byte boundary, with poisoned slack on both sides.
class Region {
 public:
  Region(size_t bytes, size_t offset) : storage_(bytes + 2 * kSlack + 64, kPoison) {
    auto base = reinterpret_cast<uintptr_t>(storage_.data()) + kSlack;
    base = (base + 63) / 64 * 64;
    data_ = reinterpret_cast<unsigned char*>(base) + offset;
    bytes_ = bytes;
  }
  unsigned char* data() { return data_; }
  // Nothing outside [data, data + bytes) was written.
  bool slackIntact() const {
    for (size_t i = 0; i < storage_.size(); ++i) {
      const unsigned char* p = storage_.data() + i;
      if ((p < data_ || p >= data_ + bytes_) && *p != kPoison) return false;
    }
    return true;
  }

 private:
  std::vector<unsigned char> storage_;
  unsigned char* data_;
  size_t bytes_;
};

enum class Placement { OutOfPlace, WithSecondDst, IntoA, IntoB };

struct Offsets {
  size_t a, b, dst, dst2;  // in elements when `elements`, else in bytes
  bool elements;
};

const Offsets kOffsets[] = {{0, 0, 0, 0, true}, {1, 3, 5, 7, true}, {1, 2, 3, 5, false}};
const size_t kCounts[] = {0, 1, 3, 15, 16, 17, 31, 33, 1000, 4099};

::testing::AssertionResult runCase(ReduceFn fn, braidDataType_t type, braidRedOp_t op, size_t count,
                                   const Offsets& offsets, Placement placement, int divisor,
                                   std::mt19937_64& rng) {
  const TypeInfo& info = typeInfo(type);
  const size_t bytes = count * info.size;
  const size_t unit = offsets.elements ? info.size : 1;
  Region a(bytes, offsets.a * unit), b(bytes, offsets.b * unit);
  Region dst(bytes, offsets.dst * unit), dst2(bytes, offsets.dst2 * unit);
  for (size_t i = 0; i < count; ++i) {
    info.random(a.data() + i * info.size, rng);
    info.random(b.data() + i * info.size, rng);
  }
  std::vector<unsigned char> expected(bytes), inA(a.data(), a.data() + bytes),
      inB(b.data(), b.data() + bytes);
  for (size_t i = 0; i < count; ++i) {
    const size_t at = i * info.size;
    info.reference(expected.data() + at, inA.data() + at, inB.data() + at, op, divisor);
  }

  unsigned char* out = placement == Placement::IntoA   ? a.data()
                       : placement == Placement::IntoB ? b.data()
                                                       : dst.data();
  unsigned char* out2 = placement == Placement::WithSecondDst ? dst2.data() : nullptr;
  fn(out, out2, a.data(), b.data(), count, divisor);

  for (unsigned char* result : {out, out2}) {
    if (result == nullptr) continue;
    for (size_t i = 0; i < count; ++i) {
      const size_t at = i * info.size;
      if (!sameResult(info, expected.data() + at, result + at, op)) {
        return ::testing::AssertionFailure()
               << (result == out ? "dst" : "dst2") << "[" << i
               << "]: a=" << hexBytes(inA.data() + at, info.size)
               << " b=" << hexBytes(inB.data() + at, info.size) << " expected "
               << hexBytes(expected.data() + at, info.size) << ", got "
               << hexBytes(result + at, info.size);
      }
    }
  }
  if (placement != Placement::IntoA && std::memcmp(a.data(), inA.data(), bytes) != 0)
    return ::testing::AssertionFailure() << "input a was modified";
  if (placement != Placement::IntoB && std::memcmp(b.data(), inB.data(), bytes) != 0)
    return ::testing::AssertionFailure() << "input b was modified";
  if (!a.slackIntact() || !b.slackIntact() || !dst.slackIntact() || !dst2.slackIntact())
    return ::testing::AssertionFailure() << "bytes outside the arrays were written";
  if (placement != Placement::OutOfPlace && placement != Placement::WithSecondDst) {
    if (!std::all_of(dst.data(), dst.data() + bytes, [](unsigned char c) { return c == kPoison; }))
      return ::testing::AssertionFailure() << "unused dst was written";
  }
  return ::testing::AssertionSuccess();
}

// ---- Every instruction set x dtype x op ----

// The last element: dst written with streaming (non-temporal) stores.
using KernelCase = std::tuple<Isa, braidDataType_t, braidRedOp_t, bool>;

class ReduceKernelTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(ReduceKernelTest, MatchesReferenceForAnyCountAlignmentAndPlacement) {
  const auto [isa, type, op, streaming] = GetParam();
  if (!isaSupported(isa)) GTEST_SKIP() << "this CPU does not support " << isaLabel(isa);
  const ReduceFn fn = reduceFnFor(isa, type, op, streaming);
  ASSERT_NE(fn, nullptr);
  std::mt19937_64 rng(1000 * type + 10 * op + static_cast<int>(isa));
  const std::vector<int> divisors = op == braidAvg ? std::vector<int>{1, 3, 200} : std::vector{1};
  for (size_t count : kCounts) {
    for (const Offsets& offsets : kOffsets) {
      for (Placement placement :
           {Placement::OutOfPlace, Placement::WithSecondDst, Placement::IntoA, Placement::IntoB}) {
        for (int divisor : divisors) {
          SCOPED_TRACE(::testing::Message()
                       << "count " << count << ", offsets a/b/dst/dst2 " << offsets.a << "/"
                       << offsets.b << "/" << offsets.dst << "/" << offsets.dst2
                       << (offsets.elements ? " elements" : " bytes") << ", placement "
                       << static_cast<int>(placement) << ", divisor " << divisor);
          ASSERT_TRUE(runCase(fn, type, op, count, offsets, placement, divisor, rng));
        }
      }
    }
  }
}

std::string kernelCaseName(const ::testing::TestParamInfo<KernelCase>& info) {
  const auto [isa, type, op, streaming] = info.param;
  return std::string(isaLabel(isa)) + "_" + typeLabel(type) + "_" + opLabel(op) +
         (streaming ? "_streaming" : "");
}

INSTANTIATE_TEST_SUITE_P(AllKernels, ReduceKernelTest,
                         ::testing::Combine(::testing::ValuesIn(kIsas), ::testing::ValuesIn(kTypes),
                                            ::testing::ValuesIn(kOps), ::testing::Bool()),
                         kernelCaseName);

// ---- fp16 / bf16 rounding on chosen values ----

struct RoundingCase {
  braidDataType_t type;
  braidRedOp_t op;
  uint16_t a, b;
  int divisor;
  uint16_t expected;  // exact bits, or any NaN when expectNan
  bool expectNan;
  const char* why;
};

const RoundingCase kRoundingCases[] = {
    // fp16: 1.0 = 0x3c00, ulp(1) = 2^-10; 2^-11 = 0x1000.
    {braidFloat16, braidSum, 0x3c00, 0x1000, 1, 0x3c00, false, "tie rounds down to even"},
    {braidFloat16, braidSum, 0x3c01, 0x1000, 1, 0x3c02, false, "tie rounds up to even"},
    {braidFloat16, braidSum, 0x3c00, 0x1001, 1, 0x3c01, false, "above the tie rounds up"},
    {braidFloat16, braidSum, 0x7bff, 0x4c00, 1, 0x7c00, false, "65504+16 is a tie: inf"},
    {braidFloat16, braidSum, 0x7bff, 0x4800, 1, 0x7bff, false, "65504+8 stays finite"},
    {braidFloat16, braidSum, 0xfbff, 0xcc00, 1, 0xfc00, false, "negative overflow: -inf"},
    {braidFloat16, braidProd, 0x5c00, 0x5c00, 1, 0x7c00, false, "256 * 256 overflows to inf"},
    {braidFloat16, braidSum, 0x0001, 0x0001, 1, 0x0002, false, "subnormal sum"},
    {braidFloat16, braidProd, 0x0001, 0x3800, 1, 0x0000, false, "2^-25: tie to even zero"},
    {braidFloat16, braidProd, 0x0003, 0x3800, 1, 0x0002, false, "1.5 * 2^-24: tie to even 2"},
    {braidFloat16, braidProd, 0x0400, 0x3800, 1, 0x0200, false, "normal to subnormal"},
    {braidFloat16, braidAvg, 0x3c00, 0x3c00, 3, 0x3955, false, "(1+1)/3 rounded once"},
    {braidFloat16, braidSum, 0x7e00, 0x3c00, 1, 0, true, "NaN + 1"},
    {braidFloat16, braidSum, 0x7c00, 0xfc00, 1, 0, true, "inf - inf"},
    {braidFloat16, braidMax, 0x7e00, 0x3c00, 1, 0, true, "max(NaN, 1)"},
    {braidFloat16, braidMax, 0x3c00, 0x7e00, 1, 0, true, "max(1, NaN)"},
    {braidFloat16, braidMin, 0x3c00, 0x7d00, 1, 0, true, "min(1, signalling NaN)"},
    {braidFloat16, braidMax, 0xfc00, 0x0001, 1, 0x0001, false, "max(-inf, tiny)"},
    // bf16: 1.0 = 0x3f80, ulp(1) = 2^-7; 2^-8 = 0x3b80.
    {braidBfloat16, braidSum, 0x3f80, 0x3b80, 1, 0x3f80, false, "tie rounds down to even"},
    {braidBfloat16, braidSum, 0x3f81, 0x3b80, 1, 0x3f82, false, "tie rounds up to even"},
    {braidBfloat16, braidSum, 0x3f80, 0x3b81, 1, 0x3f81, false, "above the tie rounds up"},
    {braidBfloat16, braidSum, 0x7f7f, 0x7b00, 1, 0x7f80, false, "max + half ulp: tie to inf"},
    {braidBfloat16, braidSum, 0x7f7f, 0x7a80, 1, 0x7f7f, false, "max + quarter ulp stays"},
    {braidBfloat16, braidSum, 0xff7f, 0xff7f, 1, 0xff80, false, "negative overflow: -inf"},
    {braidBfloat16, braidAvg, 0x3f80, 0x3f80, 3, 0x3f2b, false, "(1+1)/3 rounded once"},
    {braidBfloat16, braidSum, 0x7fc0, 0x3f80, 1, 0, true, "NaN + 1"},
    {braidBfloat16, braidSum, 0x7f81, 0x3f80, 1, 0, true, "signalling NaN + 1"},
    {braidBfloat16, braidMax, 0x3f80, 0x7fff, 1, 0, true, "max(1, NaN with full payload)"},
    {braidBfloat16, braidMin, 0xffff, 0x3f80, 1, 0, true, "min(negative NaN, 1)"},
    {braidBfloat16, braidProd, 0x7f80, 0x0000, 1, 0, true, "inf * 0"},
};

bool isNanBits(braidDataType_t type, uint16_t bits) {
  return type == braidFloat16 ? (bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0
                              : (bits & 0x7f80) == 0x7f80 && (bits & 0x7f) != 0;
}

class RoundingTest : public ::testing::TestWithParam<Isa> {};

TEST_P(RoundingTest, ChosenValuesRoundOnceToNearestEven) {
  const Isa isa = GetParam();
  if (!isaSupported(isa)) GTEST_SKIP() << "this CPU does not support " << isaLabel(isa);
  // Alone (tail path) and in a run long enough for the vector body.
  for (size_t count : {size_t{1}, size_t{77}}) {
    for (const RoundingCase& c : kRoundingCases) {
      SCOPED_TRACE(::testing::Message() << typeLabel(c.type) << " " << opLabel(c.op) << ": "
                                        << c.why << ", count " << count);
      const std::vector<uint16_t> a(count, c.a), b(count, c.b);
      std::vector<uint16_t> out(count, 0x1234);
      reduceFnFor(isa, c.type, c.op)(out.data(), nullptr, a.data(), b.data(), count, c.divisor);
      for (uint16_t got : out) {
        if (c.expectNan) {
          EXPECT_TRUE(isNanBits(c.type, got)) << std::hex << "got 0x" << got;
        } else {
          EXPECT_EQ(got, c.expected)
              << std::hex << "got 0x" << got << ", expected 0x" << c.expected;
        }
      }
    }
  }
}

// Every 16-bit pattern against a few partners, for each op: catches conversion errors anywhere
// in the range (subnormals, the normal/subnormal boundary, infinities, NaN payloads).
TEST_P(RoundingTest, EveryHalfAndBfloat16PatternMatchesReference) {
  const Isa isa = GetParam();
  if (!isaSupported(isa)) GTEST_SKIP() << "this CPU does not support " << isaLabel(isa);
  std::vector<uint16_t> all(1 << 16);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (braidDataType_t type : {braidFloat16, braidBfloat16}) {
    const TypeInfo& info = typeInfo(type);
    const std::vector<uint16_t> partners =
        type == braidFloat16
            ? std::vector<uint16_t>{0x3c00, 0x1000, 0x0001, 0x3555, 0xc400, 0x7bff}
            : std::vector<uint16_t>{0x3f80, 0x3b80, 0x0001, 0x3eab, 0xc080, 0x7f7f};
    for (braidRedOp_t op : kOps) {
      for (uint16_t partner : partners) {
        const int divisor = op == braidAvg ? 3 : 1;
        const std::vector<uint16_t> b(all.size(), partner);
        std::vector<uint16_t> out(all.size());
        reduceFnFor(isa, type, op)(out.data(), nullptr, all.data(), b.data(), all.size(), divisor);
        int failures = 0;
        for (size_t i = 0; i < all.size() && failures < 5; ++i) {
          uint16_t expected;
          info.reference(&expected, &all[i], &partner, op, divisor);
          if (!sameResult(info, reinterpret_cast<const unsigned char*>(&expected),
                          reinterpret_cast<const unsigned char*>(&out[i]), op)) {
            ++failures;
            ADD_FAILURE() << std::hex << typeLabel(type) << " " << opLabel(op) << "(0x" << all[i]
                          << ", 0x" << partner << "): expected 0x" << expected << ", got 0x"
                          << out[i];
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, RoundingTest, ::testing::ValuesIn(kIsas),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(isaLabel(info.param));
                         });

// ---- fp32 -> 16-bit rounding primitives ----

// Sampled fp32 patterns: a stride through all 2^32, each also with its low bits set to an fp16
// tie, a bf16 tie, and all ones (NaNs whose payload lies only in the bits rounding drops).
std::vector<uint32_t> sampledFloatBits() {
  std::vector<uint32_t> samples;
  for (uint64_t bits = 0; bits <= 0xffffffff; bits += 4093) {
    const auto b = static_cast<uint32_t>(bits);
    for (uint32_t sample : {b, (b & ~0x1fffu) | 0x1000u, (b & ~0xffffu) | 0x8000u, b | 0xffffu})
      samples.push_back(sample);
  }
  for (uint32_t nan : {0x7f800001u, 0x7f80ffffu, 0x7fffffffu, 0xff800001u, 0xffffffffu})
    samples.push_back(nan);
  return samples;
}

TEST(RoundingPrimitives, FloatToBfloat16MatchesReferenceAndKeepsNan) {
  using Float = Vector<float, 16>;
  for (uint32_t bits : sampledFloatBits()) {
    const float value = bitCast<float>(bits);
    const Float lanes = Float{} + value;
    const auto got = static_cast<uint16_t>(roundToBfloat16High<16>(lanes)[0] >> 16);
    if (std::isnan(value)) {
      ASSERT_TRUE(std::isnan(bfloat16ToFloat(got))) << std::hex << bits << " gave " << got;
    } else {
      ASSERT_EQ(got, floatToBfloat16(value)) << std::hex << bits;
    }
  }
}

TEST(RoundingPrimitives, SoftFloatToHalfMatchesCompilerConversion) {
  using Float = Vector<float, 16>;
  for (uint32_t bits : sampledFloatBits()) {
    const float value = bitCast<float>(bits);
    const auto got = static_cast<uint16_t>(softFloatToHalf<16>(Float{} + value)[0]);
    if (std::isnan(value)) {
      ASSERT_TRUE(std::isnan(halfToFloat(got))) << std::hex << bits << " gave " << got;
    } else {
      ASSERT_EQ(got, floatToHalf(value)) << std::hex << bits;
    }
  }
}

// ---- fp8 ----

// Chosen fp8 cases. E4M3: 1 = 0x38, ulp(1) = 2^-3, largest 448 = 0x7e, NaN 0x7f, smallest
// subnormal 2^-9 = 0x01. E5M2: 1 = 0x3c, largest 57344 = 0x7b, inf 0x7c, smallest 2^-16 = 0x01.
struct Fp8Case {
  braidDataType_t type;
  braidRedOp_t op;
  uint8_t a, b;
  int divisor;
  uint8_t expected;  // exact bits, or any NaN when expectNan
  bool expectNan;
  const char* why;
};

const Fp8Case kFp8Cases[] = {
    {braidFloat8e4m3, braidSum, 0x38, 0x18, 1, 0x38, false, "1 + 2^-4: tie rounds down to even"},
    {braidFloat8e4m3, braidSum, 0x39, 0x18, 1, 0x3a, false, "1.125 + 2^-4: tie rounds up to even"},
    {braidFloat8e4m3, braidSum, 0x7e, 0x7e, 1, 0x7e, false, "448 + 448 saturates to 448"},
    {braidFloat8e4m3, braidSum, 0xfe, 0xfe, 1, 0xfe, false, "-448 - 448 saturates to -448"},
    {braidFloat8e4m3, braidProd, 0x7e, 0x40, 1, 0x7e, false, "448 * 2 saturates"},
    {braidFloat8e4m3, braidSum, 0x01, 0x01, 1, 0x02, false, "subnormal sum"},
    {braidFloat8e4m3, braidProd, 0x01, 0x30, 1, 0x00, false, "2^-10: tie to even zero"},
    {braidFloat8e4m3, braidProd, 0x03, 0x30, 1, 0x02, false, "1.5 * 2^-9: tie to even 2"},
    {braidFloat8e4m3, braidProd, 0x08, 0x30, 1, 0x04, false, "normal to subnormal"},
    {braidFloat8e4m3, braidAvg, 0x38, 0x38, 3, 0x33, false, "(1+1)/3 rounded once"},
    {braidFloat8e4m3, braidSum, 0x7f, 0x38, 1, 0, true, "NaN + 1"},
    {braidFloat8e4m3, braidMax, 0x38, 0xff, 1, 0, true, "max(1, negative NaN)"},
    {braidFloat8e4m3, braidMin, 0x7e, 0xfe, 1, 0xfe, false, "min(448, -448)"},
    {braidFloat8e5m2, braidSum, 0x3c, 0x30, 1, 0x3c, false, "1 + 2^-3: tie rounds down to even"},
    {braidFloat8e5m2, braidSum, 0x7b, 0x7b, 1, 0x7b, false, "57344 + 57344 saturates"},
    {braidFloat8e5m2, braidSum, 0x7c, 0x3c, 1, 0x7b, false, "inf + 1 saturates to 57344"},
    {braidFloat8e5m2, braidMax, 0xfc, 0x80, 1, 0x80, false, "max(-inf, -0)"},
    {braidFloat8e5m2, braidMin, 0xfc, 0x3c, 1, 0xfb, false, "min(-inf, 1) saturates to -57344"},
    {braidFloat8e5m2, braidSum, 0x7c, 0xfc, 1, 0, true, "inf - inf"},
    {braidFloat8e5m2, braidProd, 0x7c, 0x00, 1, 0, true, "inf * 0"},
    {braidFloat8e5m2, braidSum, 0x7d, 0x3c, 1, 0, true, "signalling NaN + 1"},
    {braidFloat8e5m2, braidProd, 0x01, 0x38, 1, 0x00, false, "2^-17: tie to even zero"},
    {braidFloat8e5m2, braidAvg, 0x3c, 0x3c, 3, 0x39, false, "(1+1)/3 rounded once"},
};

class Fp8Test : public ::testing::TestWithParam<Isa> {};

TEST_P(Fp8Test, ChosenValuesRoundOnceAndSaturate) {
  const Isa isa = GetParam();
  if (!isaSupported(isa)) GTEST_SKIP() << "this CPU does not support " << isaLabel(isa);
  for (size_t count : {size_t{1}, size_t{77}}) {
    for (const Fp8Case& c : kFp8Cases) {
      SCOPED_TRACE(::testing::Message() << typeLabel(c.type) << " " << opLabel(c.op) << ": "
                                        << c.why << ", count " << count);
      const std::vector<uint8_t> a(count, c.a), b(count, c.b);
      std::vector<uint8_t> out(count, 0x5a);
      reduceFnFor(isa, c.type, c.op)(out.data(), nullptr, a.data(), b.data(), count, c.divisor);
      const TypeInfo& info = typeInfo(c.type);
      for (uint8_t got : out) {
        if (c.expectNan) {
          EXPECT_TRUE(info.isNan(&got)) << std::hex << "got 0x" << int{got};
        } else {
          EXPECT_EQ(got, c.expected)
              << std::hex << "got 0x" << int{got} << ", expected 0x" << int{c.expected};
        }
      }
    }
  }
}

// Every pair of fp8 patterns, for each op.
TEST_P(Fp8Test, EveryPairOfPatternsMatchesReference) {
  const Isa isa = GetParam();
  if (!isaSupported(isa)) GTEST_SKIP() << "this CPU does not support " << isaLabel(isa);
  std::vector<uint8_t> a(1 << 16), b(1 << 16);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<uint8_t>(i);
    b[i] = static_cast<uint8_t>(i >> 8);
  }
  for (braidDataType_t type : {braidFloat8e4m3, braidFloat8e5m2}) {
    const TypeInfo& info = typeInfo(type);
    for (braidRedOp_t op : kOps) {
      const int divisor = op == braidAvg ? 3 : 1;
      std::vector<uint8_t> out(a.size());
      reduceFnFor(isa, type, op)(out.data(), nullptr, a.data(), b.data(), a.size(), divisor);
      int failures = 0;
      for (size_t i = 0; i < a.size() && failures < 5; ++i) {
        uint8_t expected;
        info.reference(&expected, &a[i], &b[i], op, divisor);
        if (!sameResult(info, &expected, &out[i], op)) {
          ++failures;
          ADD_FAILURE() << std::hex << typeLabel(type) << " " << opLabel(op) << "(0x" << int{a[i]}
                        << ", 0x" << int{b[i]} << "): expected 0x" << int{expected} << ", got 0x"
                        << int{out[i]};
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, Fp8Test, ::testing::ValuesIn(kIsas),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(isaLabel(info.param));
                         });

#ifdef BRAID_TEST_HAVE_CUDA_FP8
// The reference above agrees with the CUDA toolkit's conversions, which NCCL's kernels use:
// every pattern widened, and sampled fp32 values (ties, saturation, infinities) narrowed with
// __NV_SATFINITE.
TEST(Fp8Reference, AgreesWithTheCudaToolkit) {
  for (auto [format, interpretation] : {std::pair{kE4m3, __NV_E4M3}, std::pair{kE5m2, __NV_E5M2}}) {
    for (int bits = 0; bits < 256; ++bits) {
      const __half_raw raw =
          __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(bits), interpretation);
      const float cuda = halfToFloat(raw.x);
      const float ours = fp8ToFloat(static_cast<uint8_t>(bits), format);
      if (std::isnan(cuda)) {
        ASSERT_TRUE(std::isnan(ours)) << std::hex << bits;
      } else {
        ASSERT_EQ(bitCast<uint32_t>(cuda), bitCast<uint32_t>(ours)) << std::hex << bits;
      }
    }
    for (uint32_t bits : sampledFloatBits()) {
      const float value = bitCast<float>(bits);
      const uint8_t cuda = __nv_cvt_float_to_fp8(value, __NV_SATFINITE, interpretation);
      const uint8_t ours = floatToFp8(value, format);
      if (std::isnan(value)) {
        ASSERT_TRUE(std::isnan(fp8ToFloat(cuda, format)) && std::isnan(fp8ToFloat(ours, format)));
      } else {
        ASSERT_EQ(int{cuda}, int{ours}) << std::hex << bits;
      }
    }
  }
}
#endif

// ---- Dispatcher, copy2, typeSize ----

TEST(Dispatch, ChoosesTheBestSupportedIsaUnlessBraidSimdAsksForLess) {
  EXPECT_TRUE(isaSupported(Isa::Scalar));
  Isa expected = Isa::Scalar;
  for (Isa isa : kIsas)
    if (isaSupported(isa)) expected = isa;
  const char* wanted = std::getenv("BRAID_SIMD");
  for (Isa isa : kIsas) {
    if (wanted != nullptr && std::string(wanted) == isaLabel(isa) && isaSupported(isa))
      expected = isa;
  }
  EXPECT_STREQ(isaName(), isaLabel(expected));
  for (braidDataType_t type : kTypes) {
    for (braidRedOp_t op : kOps) {
      EXPECT_EQ(reduceFn(type, op), reduceFnFor(expected, type, op));
      EXPECT_NE(reduceFn(type, op), nullptr);
    }
    EXPECT_EQ(reduceFn(type, braidAvg), reduceFn(type, braidSum)) << "avg is the sum kernel";
  }
}

TEST(Dispatch, UnsupportedIsaAndBadEnumsGiveNoKernel) {
  for (Isa isa : kIsas) {
    EXPECT_EQ(reduceFnFor(isa, braidFloat32, braidSum) != nullptr, isaSupported(isa))
        << isaLabel(isa);
  }
  EXPECT_EQ(reduceFn(braidNumTypes, braidSum), nullptr);
  EXPECT_EQ(reduceFn(static_cast<braidDataType_t>(-1), braidSum), nullptr);
  EXPECT_EQ(reduceFn(braidFloat32, braidNumOps), nullptr);
  EXPECT_EQ(reduceFn(braidFloat32, static_cast<braidRedOp_t>(-1)), nullptr);
}

TEST(Copy2, CopiesToOneOrTwoDestinations) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{4099}}) {
    std::vector<unsigned char> src(bytes);
    for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
    std::vector<unsigned char> dst(bytes + 1, kPoison), dst2(bytes + 1, kPoison);
    copy2(dst.data(), nullptr, src.data(), bytes);
    EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin())) << bytes;
    EXPECT_EQ(dst[bytes], kPoison);
    std::fill(dst.begin(), dst.end(), kPoison);
    copy2(dst.data(), dst2.data(), src.data(), bytes);
    EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin())) << bytes;
    EXPECT_TRUE(std::equal(src.begin(), src.end(), dst2.begin())) << bytes;
    EXPECT_EQ(dst[bytes], kPoison);
    EXPECT_EQ(dst2[bytes], kPoison);
    copy2(src.data(), nullptr, src.data(), bytes);  // onto itself: unchanged
    EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin())) << bytes;
  }
}

TEST(Copy2, StreamingOutputCopiesAtAnyAlignment) {
  for (size_t bytes : {size_t{0}, size_t{15}, size_t{64}, size_t{1000}, size_t{70001}})
    for (size_t offset : {size_t{0}, size_t{1}, size_t{5}, size_t{16}}) {
      std::vector<unsigned char> src(bytes), dst(bytes + offset + 1, kPoison);
      for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 13 + 5);
      copy2(dst.data() + offset, nullptr, src.data(), bytes, /*streamingOutput=*/true);
      streamFence();
      EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin() + offset))
          << bytes << "+" << offset;
      EXPECT_EQ(dst[bytes + offset], kPoison);
      for (size_t i = 0; i < offset; ++i) EXPECT_EQ(dst[i], kPoison);
    }
}

TEST(TypeSize, MatchesTheElementTypes) {
  EXPECT_EQ(typeSize(braidInt8), 1u);
  EXPECT_EQ(typeSize(braidUint8), 1u);
  EXPECT_EQ(typeSize(braidInt32), 4u);
  EXPECT_EQ(typeSize(braidUint32), 4u);
  EXPECT_EQ(typeSize(braidInt64), 8u);
  EXPECT_EQ(typeSize(braidUint64), 8u);
  EXPECT_EQ(typeSize(braidFloat16), 2u);
  EXPECT_EQ(typeSize(braidFloat32), 4u);
  EXPECT_EQ(typeSize(braidFloat64), 8u);
  EXPECT_EQ(typeSize(braidBfloat16), 2u);
  EXPECT_EQ(typeSize(braidFloat8e4m3), 1u);
  EXPECT_EQ(typeSize(braidFloat8e5m2), 1u);
  EXPECT_EQ(typeSize(braidNumTypes), 0u);
  EXPECT_EQ(typeSize(static_cast<braidDataType_t>(-1)), 0u);
}

}  // namespace
}  // namespace braid::kernels
