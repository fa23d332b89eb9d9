#include "perf/values.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace braid_perf {
namespace {

struct TypeLimits {
  int64_t sumLimit;   // largest magnitude any partial sum may reach and stay exact
  int prodDoublings;  // largest power of two a product may reach (and, for floats, its inverse)
  bool isSigned;
  bool isFloat;
  int significandBits = 0;  // floats: the implicit bit included
  int subnormalExponent = 0;
};

TypeLimits limitsOf(braidDataType_t type) {
  switch (type) {
    case braidInt8: return {127, 6, true, false};
    case braidUint8: return {254, 7, false, false};  // 255 is the poison value
    case braidInt32: return {1 << 20, 30, true, false};
    case braidUint32: return {1 << 20, 31, false, false};
    case braidInt64: return {1 << 20, 62, true, false};
    case braidUint64: return {1 << 20, 63, false, false};
    case braidFloat16: return {2048, 14, true, true, 11, -24};  // 2^-14 is normal
    case braidFloat32: return {1 << 20, 100, true, true, 24, -149};
    case braidFloat64: return {1 << 20, 1000, true, true, 53, -1074};
    // fp8: products within the normal range (2^-6, 2^-14 and up).
    case braidFloat8e4m3: return {16, 6, true, true, 4, -9};
    case braidFloat8e5m2: return {8, 14, true, true, 3, -16};
    default: return {256, 100, true, true, 8, -133};  // bfloat16
  }
}

// Max and min need no headroom: values in +-100 are exact in every type but fp8, whose exact
// integers end at its sum limit.
constexpr int64_t kExtremeMagnitude = 100;

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

ValueModel::ValueModel(braidDataType_t type, braidRedOp_t op, int nranks, uint64_t seed)
    : type_(type), op_(op), nranks_(nranks), seed_(seed) {
  const TypeLimits limits = limitsOf(type);
  significandBits_ = limits.significandBits;
  subnormalExponent_ = limits.subnormalExponent;
  signed_ = limits.isSigned;
  perRankMagnitude_ = limits.sumLimit / std::max(nranks, 1);
  prodRanks_ = limits.prodDoublings;
  halves_ = limits.isFloat;
  extremeMagnitude_ = std::min(kExtremeMagnitude, limits.sumLimit);
}

uint64_t ValueModel::hash(uint64_t stream, size_t index) const {
  return mix(seed_ * 0x9e3779b97f4a7c15ull + stream * 0xd6e8feb86659fd93ull + index);
}

double ValueModel::input(int rank, size_t index) const {
  const int64_t m = perRankMagnitude_;
  const uint64_t h = hash(static_cast<uint64_t>(rank) + 1, index);
  switch (op_) {
    case braidSum:
      return signed_ ? static_cast<double>(static_cast<int64_t>(h % (2 * m + 1)) - m)
                     : static_cast<double>(h % (m + 1));
    case braidProd: {
      const double sign = (signed_ && (h & 1)) ? -1.0 : 1.0;
      if (rank >= prodRanks_) return sign;
      const uint64_t pick = (h >> 1) % (halves_ ? 3 : 2);
      return sign * (pick == 0 ? 1.0 : pick == 1 ? 2.0 : 0.5);
    }
    case braidMax:
    case braidMin:
      return signed_ ? static_cast<double>(static_cast<int64_t>(h % (2 * extremeMagnitude_ + 1)) -
                                           extremeMagnitude_)
                     : static_cast<double>(h % (2 * extremeMagnitude_ + 1));
    default: {
      // avg: a shared centre a per element; ranks in pairs add +c and -c, so the sum is
      // exactly nranks * a and the average is a, whether it divides at the end or not at all.
      // At least 1 where the bound allows it, so ranks differ even in a narrow type (fp8).
      const int64_t spread = std::max<int64_t>(std::min<int64_t>(1, m), m / 4);
      const int64_t centreRange = m - spread;
      const uint64_t hc = hash(0, index);
      const int64_t centre = signed_
                                 ? static_cast<int64_t>(hc % (2 * centreRange + 1)) - centreRange
                                 : spread + static_cast<int64_t>(hc % (centreRange - spread + 1));
      if (rank >= nranks_ - nranks_ % 2) return static_cast<double>(centre);
      const int64_t c = static_cast<int64_t>(
          hash(static_cast<uint64_t>(rank / 2) + (1ull << 32), index) % (spread + 1));
      return static_cast<double>(rank % 2 == 0 ? centre + c : centre - c);
    }
  }
}

Expected ValueModel::reduced(size_t index) const {
  if (op_ == braidAvg && significandBits_ > 0 && nranks_ > 1) return premultipliedAverage(index);
  double acc = input(0, index);
  for (int r = 1; r < nranks_; ++r) {
    const double v = input(r, index);
    switch (op_) {
      case braidSum:
      case braidAvg: acc += v; break;
      case braidProd: acc *= v; break;
      case braidMax: acc = std::max(acc, v); break;
      default: acc = std::min(acc, v); break;
    }
  }
  return {op_ == braidAvg ? acc / nranks_ : acc};
}

// Avg of floats as braid runs it, NCCL's way: each input times 1/n rounded to the type (the
// product rounded once), then a sum in the algorithm's order. The products' exact sum, and the
// n - 1 roundings of partial sums, each at most half an ulp of the products' magnitudes together
// (twice that for fp64, whose products are summed here in fp64 too).
Expected ValueModel::premultipliedAverage(size_t index) const {
  return withElementType(type_, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto rounded = [](double v) { return elementToDouble(elementFromDouble<T>(v)); };
    const double scale =
        rounded(type_ == braidFloat64 ? 1.0 / nranks_ : static_cast<float>(1.0 / nranks_));
    double exact = 0, bound = 0;
    for (int r = 0; r < nranks_; ++r) {
      const double product = rounded(input(r, index) * scale);
      exact += product;
      bound += std::fabs(product);
    }
    const double halfUlp =
        std::max(std::ldexp(bound, -significandBits_), std::ldexp(1.0, subnormalExponent_ - 1));
    return Expected{exact, (type_ == braidFloat64 ? 2 : 1) * (nranks_ - 1) * halfUlp};
  });
}

void poisonElements(void* buf, size_t count, braidDataType_t type) {
  withElementType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T poison;
    if constexpr (std::is_same_v<T, Bfloat16>) {
      poison = Bfloat16{0x7fc1};
    } else if constexpr (std::is_same_v<T, Fp8E4M3> || std::is_same_v<T, Fp8E5M2>) {
      poison = T{0x7f};  // NaN in both formats
    } else if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, _Float16>) {
      poison = static_cast<T>(std::numeric_limits<float>::quiet_NaN());
    } else if constexpr (std::is_signed_v<T>) {
      poison = std::numeric_limits<T>::min();
    } else {
      poison = std::numeric_limits<T>::max();
    }
    std::fill_n(static_cast<T*>(buf), count, poison);
  });
}

}  // namespace braid_perf
