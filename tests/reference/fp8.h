// The OCP 8-bit float formats of nccl.h (ncclFloat8e4m3, ncclFloat8e5m2), written here for the
// tests, independent of braid: each pattern's value from its fields, and rounding by comparing the
// distances to the two neighbouring patterns (ties to the even one). Beyond the largest finite
// value, infinity included, the result saturates to it: NCCL converts with CUDA's __NV_SATFINITE.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace braid_test {

struct Fp8Format {
  int exponentBits, mantissaBits;
  bool hasInfinity;  // E5M2; E4M3 has none, and S.1111.111 is its only NaN
  uint8_t largestFinite() const { return hasInfinity ? 0x7b : 0x7e; }
};
inline constexpr Fp8Format kE4m3{4, 3, false}, kE5m2{5, 2, true};

inline float fp8ToFloat(uint8_t bits, Fp8Format format) {
  const int bias = (1 << (format.exponentBits - 1)) - 1;
  const int allOnes = (1 << format.exponentBits) - 1;
  const int exponent = (bits >> format.mantissaBits) & allOnes;
  const int mantissa = bits & ((1 << format.mantissaBits) - 1);
  const float sign = (bits & 0x80) != 0 ? -1.0f : 1.0f;
  if (format.hasInfinity && exponent == allOnes) {
    return mantissa != 0 ? std::numeric_limits<float>::quiet_NaN()
                         : sign * std::numeric_limits<float>::infinity();
  }
  if (!format.hasInfinity && (bits & 0x7f) == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) {
    return sign * std::ldexp(static_cast<float>(mantissa), 1 - bias - format.mantissaBits);
  }
  return sign * std::ldexp(static_cast<float>(mantissa + (1 << format.mantissaBits)),
                           exponent - bias - format.mantissaBits);
}

inline uint8_t floatToFp8(float value, Fp8Format format) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  const double magnitude = std::fabs(static_cast<double>(value));
  uint8_t below = 0;  // the largest non-negative pattern not above the magnitude
  while (below < format.largestFinite() && fp8ToFloat(below + 1, format) <= magnitude) ++below;
  if (below == format.largestFinite()) return sign | below;
  const double distanceDown = magnitude - fp8ToFloat(below, format);
  const double distanceUp = fp8ToFloat(below + 1, format) - magnitude;
  const bool up = distanceUp < distanceDown || (distanceUp == distanceDown && (below & 1) != 0);
  return sign | static_cast<uint8_t>(below + (up ? 1 : 0));
}

inline float e4m3ToFloat(uint8_t bits) {
  return fp8ToFloat(bits, kE4m3);
}
inline uint8_t floatToE4m3(float value) {
  return floatToFp8(value, kE4m3);
}
inline float e5m2ToFloat(uint8_t bits) {
  return fp8ToFloat(bits, kE5m2);
}
inline uint8_t floatToE5m2(float value) {
  return floatToFp8(value, kE5m2);
}

}  // namespace braid_test
