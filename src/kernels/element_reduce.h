// Reductions one element at a time with the library's semantics, for the device form of the
// engine (GPU kernels, and the CPU threads that stand in for them in tests): integers wrap, Max
// and Min of floats give NaN when either input is NaN, 16- and 8-bit floats are reduced in fp32
// and rounded once, Avg sums and then divides (in the element's C promotion; narrow floats in
// fp32) on the step that finishes the reduction. The host's SIMD kernels (host_reduce.h) keep the
// same semantics over whole vectors.
#pragma once

#include <cstdint>
#include <type_traits>

#include "braid/braid.h"
#include "kernels/float_formats.h"

namespace braid::kernels {

// How an element is stored and computed on.
template <braidDataType_t kType>
struct ElementOf;
#define BRAID_NATIVE_ELEMENT(type, T)           \
  template <>                                   \
  struct ElementOf<type> {                      \
    using Storage = T;                          \
    using Compute = T;                          \
    BRAID_HD static T widen(T v) { return v; }  \
    BRAID_HD static T narrow(T v) { return v; } \
  };
BRAID_NATIVE_ELEMENT(braidInt8, int8_t)
BRAID_NATIVE_ELEMENT(braidUint8, uint8_t)
BRAID_NATIVE_ELEMENT(braidInt32, int32_t)
BRAID_NATIVE_ELEMENT(braidUint32, uint32_t)
BRAID_NATIVE_ELEMENT(braidInt64, int64_t)
BRAID_NATIVE_ELEMENT(braidUint64, uint64_t)
BRAID_NATIVE_ELEMENT(braidFloat32, float)
BRAID_NATIVE_ELEMENT(braidFloat64, double)
#undef BRAID_NATIVE_ELEMENT

template <class Bits, class Format, bool kSaturate>
struct NarrowElement {
  using Storage = Bits;
  using Compute = float;
  BRAID_HD static float widen(Bits v) { return Format::widen(v); }
  BRAID_HD static Bits narrow(float v) {
    return static_cast<Bits>(Format::template narrow<kSaturate>(v));
  }
};
template <>
struct ElementOf<braidFloat16> : NarrowElement<uint16_t, Binary16, false> {};
template <>
struct ElementOf<braidFloat8e4m3> : NarrowElement<uint8_t, Float8e4m3, true> {};
template <>
struct ElementOf<braidFloat8e5m2> : NarrowElement<uint8_t, Float8e5m2, true> {};
template <>
struct ElementOf<braidBfloat16> {
  using Storage = uint16_t;
  using Compute = float;
  BRAID_HD static float widen(uint16_t v) { return bfloat16ToFloat(v); }
  BRAID_HD static uint16_t narrow(float v) { return floatToBfloat16(v); }
};

// a OP b for one element; `divisor` > 1 divides the result (Avg's last step).
template <braidDataType_t kTypeOf, braidRedOp_t kOp>
struct ElementReduce {
  static constexpr braidDataType_t kType = kTypeOf;
  static constexpr braidRedOp_t kOperator = kOp;
  using Element = ElementOf<kType>;
  using Storage = typename Element::Storage;
  using Compute = typename Element::Compute;

  BRAID_HD static Storage apply(Storage a, Storage b, int divisor) {
    const Compute x = Element::widen(a), y = Element::widen(b);
    Compute r;
    if constexpr (std::is_integral_v<Compute>) {
      using Unsigned = std::make_unsigned_t<Compute>;
      if constexpr (kOp == braidProd) {
        r = static_cast<Compute>(static_cast<Unsigned>(x) * static_cast<Unsigned>(y));
      } else if constexpr (kOp == braidMax) {
        r = x > y ? x : y;
      } else if constexpr (kOp == braidMin) {
        r = x < y ? x : y;
      } else {
        r = static_cast<Compute>(static_cast<Unsigned>(x) + static_cast<Unsigned>(y));
        if (kOp == braidAvg && divisor > 1) {
          using Promoted = decltype(r / divisor);  // C's: int for 8-bit types
          r = static_cast<Compute>(static_cast<Promoted>(r) / divisor);
        }
      }
    } else {
      if constexpr (kOp == braidProd) {
        r = x * y;
      } else if constexpr (kOp == braidMax) {
        r = (x > y || x != x) ? x : y;  // a NaN in either input gives a NaN
      } else if constexpr (kOp == braidMin) {
        r = (x < y || x != x) ? x : y;
      } else {
        r = x + y;
        if (kOp == braidAvg && divisor > 1) r = r / static_cast<Compute>(divisor);
      }
    }
    return Element::narrow(r);
  }
};

}  // namespace braid::kernels
