// Names and sizes of braid's datatypes and reduction operations as braid-perf prints and parses
// them (nccl-tests' spellings), and the host element type behind each datatype.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "braid/braid.h"
#include "kernels/float_formats.h"

namespace braid_perf {

struct DatatypeInfo {
  braidDataType_t type;
  const char* name;  // as printed in the "type" column
  size_t size;
};

// nccl-tests' order, which is also what `-d all` runs.
inline constexpr DatatypeInfo kDatatypes[] = {
    {braidInt8, "int8", 1},         {braidUint8, "uint8", 1},       {braidInt32, "int32", 4},
    {braidUint32, "uint32", 4},     {braidInt64, "int64", 8},       {braidUint64, "uint64", 8},
    {braidFloat16, "half", 2},      {braidFloat32, "float", 4},     {braidFloat64, "double", 8},
    {braidBfloat16, "bfloat16", 2}, {braidFloat8e4m3, "f8e4m3", 1}, {braidFloat8e5m2, "f8e5m2", 1},
};

inline const DatatypeInfo& datatypeInfo(braidDataType_t type) {
  for (const DatatypeInfo& info : kDatatypes)
    if (info.type == type) return info;
  return kDatatypes[0];  // unreachable: every braidDataType_t value is in the table
}

inline constexpr const char* kOpNames[braidNumOps] = {"sum", "prod", "max", "min", "avg"};
// What the "redop" column shows for collectives that do not reduce.
inline constexpr const char* kNoOpName = "none";

// bfloat16 as stored: the upper half of a float32.
struct Bfloat16 {
  uint16_t bits;
};
inline Bfloat16 toBfloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((bits >> 16) | 0x40)};
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  return {static_cast<uint16_t>(bits >> 16)};
}
inline float toFloat(Bfloat16 value) {
  uint32_t bits = static_cast<uint32_t>(value.bits) << 16;
  float result;
  std::memcpy(&result, &bits, sizeof result);
  return result;
}

// fp8 as stored, in the library's own formats (kernels/float_formats.h: E4M3, E5M2).
template <class F>
struct Fp8 {
  using Format = F;
  uint8_t bits;
};
using Fp8E4M3 = Fp8<braid::kernels::Float8e4m3>;
using Fp8E5M2 = Fp8<braid::kernels::Float8e5m2>;

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) with T the host element type of `type`.
template <typename Fn>
decltype(auto) withElementType(braidDataType_t type, Fn&& fn) {
  switch (type) {
    case braidInt8: return fn(TypeTag<int8_t>{});
    case braidUint8: return fn(TypeTag<uint8_t>{});
    case braidInt32: return fn(TypeTag<int32_t>{});
    case braidUint32: return fn(TypeTag<uint32_t>{});
    case braidInt64: return fn(TypeTag<int64_t>{});
    case braidUint64: return fn(TypeTag<uint64_t>{});
    case braidFloat16: return fn(TypeTag<_Float16>{});
    case braidFloat32: return fn(TypeTag<float>{});
    case braidFloat64: return fn(TypeTag<double>{});
    case braidFloat8e4m3: return fn(TypeTag<Fp8E4M3>{});
    case braidFloat8e5m2: return fn(TypeTag<Fp8E5M2>{});
    default: return fn(TypeTag<Bfloat16>{});
  }
}

}  // namespace braid_perf
