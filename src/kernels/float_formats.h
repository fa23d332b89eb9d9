// The narrow float formats one element at a time, for code that runs on a host thread or a GPU
// thread alike (the device form of the engine; the host's SIMD kernels convert whole vectors in
// host_reduce_impl.h): IEEE binary16, bfloat16 and the OCP FP8 formats, widened to fp32 exactly
// and narrowed with round to nearest even. fp16 and bf16 overflow to infinity; fp8 saturates to
// its largest finite value, infinity included, as NCCL's __NV_SATFINITE. A NaN stays a NaN.
#pragma once

#include <cstdint>
#include <cstring>

#include "base/host_device.h"

namespace braid::kernels {

BRAID_HD inline float floatFromBits(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}
BRAID_HD inline uint32_t bitsOfFloat(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return bits;
}

// A binary float of kExponentBits and kMantissaBits (stored) in the low bits of a uint32_t.
// kIeee: the all-ones exponent holds infinities and NaNs (binary16, E5M2); otherwise (E4M3) only
// the all-ones pattern is a NaN and there is no infinity.
template <int kExponentBits, int kMantissaBits, bool kIeee>
struct NarrowFloat {
  static constexpr uint32_t kBias = (1u << (kExponentBits - 1)) - 1;
  static constexpr uint32_t kSignBit = 1u << (kExponentBits + kMantissaBits);
  static constexpr uint32_t kMagnitude = kSignBit - 1;
  static constexpr uint32_t kAllOnesExponent = ((1u << kExponentBits) - 1) << kMantissaBits;
  static constexpr int kDroppedBits = 23 - kMantissaBits;

  BRAID_HD static float widen(uint32_t bits) {
    const uint32_t sign = (bits & kSignBit) << (31 - kExponentBits - kMantissaBits);
    const uint32_t magnitude = bits & kMagnitude;
    uint32_t wide;
    if (magnitude < (1u << kMantissaBits)) {  // zero or subnormal: exact in fp32
      const float step = floatFromBits((127 + 1 - kBias - kMantissaBits) << 23);
      wide = bitsOfFloat(static_cast<float>(magnitude) * step);
    } else if (kIeee && magnitude >= kAllOnesExponent) {
      wide = 0x7f800000u | ((magnitude & ((1u << kMantissaBits) - 1)) << kDroppedBits);
    } else if (!kIeee && magnitude == kMagnitude) {
      wide = 0x7fc00000u;
    } else {
      wide = (magnitude << kDroppedBits) + ((127 - kBias) << 23);
    }
    return floatFromBits(wide | sign);
  }

  // kSaturate: results beyond the largest finite value become it (fp8); else infinity.
  template <bool kSaturate>
  BRAID_HD static uint32_t narrow(float value) {
    const uint32_t bits = bitsOfFloat(value);
    const uint32_t sign = (bits >> (31 - kExponentBits - kMantissaBits)) & kSignBit;
    const uint32_t magnitude = bits & 0x7fffffffu;
    const uint32_t largest = kIeee ? kAllOnesExponent - 1 : kMagnitude - 1;
    if (magnitude > 0x7f800000u) return sign | kMagnitude;  // NaN (all ones: a NaN in every format)
    if (magnitude < ((128 - kBias) << 23)) {
      // Subnormal result: adding a float whose ulp is the subnormal step lets the FPU round once.
      const float anchor = floatFromBits((127 + kDroppedBits + 1 - kBias) << 23);
      return sign | (bitsOfFloat(floatFromBits(magnitude) + anchor) - bitsOfFloat(anchor));
    }
    if (magnitude == 0x7f800000u) return sign | (kSaturate ? largest : kAllOnesExponent);
    uint32_t rounded = (magnitude - ((127 - kBias) << 23) + ((1u << (kDroppedBits - 1)) - 1) +
                        ((magnitude >> kDroppedBits) & 1)) >>
                       kDroppedBits;
    if (rounded > largest) rounded = kSaturate ? largest : kAllOnesExponent;
    return sign | rounded;
  }
};

using Binary16 = NarrowFloat<5, 10, true>;
using Float8e4m3 = NarrowFloat<4, 3, false>;
using Float8e5m2 = NarrowFloat<5, 2, true>;

BRAID_HD inline float bfloat16ToFloat(uint16_t bits) {
  return floatFromBits(static_cast<uint32_t>(bits) << 16);
}
BRAID_HD inline uint16_t floatToBfloat16(float value) {
  const uint32_t bits = bitsOfFloat(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1)) >> 16);
}

}  // namespace braid::kernels
