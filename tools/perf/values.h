// The data of a checked run (-c 1): what every rank puts in its input and what each output
// element must then hold. Values are chosen per datatype and operation so that the exact result
// is representable and no order of reduction or rounding step can change it: small integers for
// sum, max and min; products of +-1, 2 and 1/2 for prod; sums that are multiples of the rank
// count for avg. Any difference from the expected value is therefore a wrong element, but for avg
// of floats: braid runs it as NCCL does (each input times 1/n rounded to the type, then a sum), so
// the order of the sum may move the result by the roundings its partial sums take.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "braid/braid.h"
#include "perf/types.h"

namespace braid_perf {

// What an output element must hold: `value`, or within `slack` of it.
struct Expected {
  double value;
  double slack = 0;
};

class ValueModel {
 public:
  ValueModel(braidDataType_t type, braidRedOp_t op, int nranks, uint64_t seed);

  // What `rank` contributes at element `index` of the global data.
  double input(int rank, size_t index) const;
  // The operation applied over every rank's input at `index`.
  Expected reduced(size_t index) const;

 private:
  uint64_t hash(uint64_t stream, size_t index) const;
  Expected premultipliedAverage(size_t index) const;

  braidDataType_t type_;
  braidRedOp_t op_;
  int nranks_;
  uint64_t seed_;
  bool signed_;
  int64_t perRankMagnitude_;  // |input| bound for sum and avg: the sum over ranks stays exact
  int prodRanks_;             // ranks that may contribute a factor of 2 (or 1/2) to a product
  bool halves_;               // prod may use 1/2 (floating-point types)
  int significandBits_;       // floats: the implicit bit included
  int subnormalExponent_;     // floats: the exponent of the smallest subnormal
  int64_t extremeMagnitude_;  // |input| bound for max and min: exact in the type
};

inline double elementToDouble(_Float16 v) {
  return static_cast<double>(v);
}
inline double elementToDouble(Bfloat16 v) {
  return toFloat(v);
}
template <class Format>
double elementToDouble(Fp8<Format> v) {
  return Format::widen(v.bits);
}
template <typename T>
double elementToDouble(T v) {
  return static_cast<double>(v);
}

template <typename T>
T elementFromDouble(double v) {
  if constexpr (std::is_same_v<T, Bfloat16>) {
    return toBfloat16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, Fp8E4M3> || std::is_same_v<T, Fp8E5M2>) {
    return T{static_cast<uint8_t>(T::Format::template narrow<true>(static_cast<float>(v)))};
  } else {
    return static_cast<T>(v);
  }
}

// buf[i] = value(i) for i < count, converted to `type`. The values are exact in every type.
template <typename ValueAt>
void fillElements(void* buf, size_t count, braidDataType_t type, ValueAt value) {
  withElementType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = static_cast<T*>(buf);
    for (size_t i = 0; i < count; ++i) out[i] = elementFromDouble<T>(value(i));
  });
}

// Overwrites count elements with a value no checked run can legitimately produce (NaN for
// floating-point types, the most negative or largest integer otherwise), so an element the
// collective failed to write is counted wrong.
void poisonElements(void* buf, size_t count, braidDataType_t type);

// How many of the count elements lie further from expected(i) than its slack. NaN is never near
// anything.
template <typename ExpectedAt>
size_t countWrongElements(const void* buf, size_t count, braidDataType_t type,
                          ExpectedAt expected) {
  return withElementType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(buf);
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      const Expected want{expected(i)};
      wrong += !(std::fabs(elementToDouble(in[i]) - want.value) <= want.slack);
    }
    return wrong;
  });
}

}  // namespace braid_perf
