// Dispatcher: picks the widest instruction set the CPU supports, once, unless BRAID_SIMD asks for
// a lower one.
#include "kernels/host_reduce.h"

#include <algorithm>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <string>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "kernels/host_reduce_impl.h"

namespace braid::kernels {
namespace {

const char* nameOf(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    case Isa::Scalar: return "scalar";
  }
  return "unknown";
}

Isa bestSupported() {
  if (isaSupported(Isa::Avx512)) return Isa::Avx512;
  if (isaSupported(Isa::Avx2)) return Isa::Avx2;
  return Isa::Scalar;
}

Isa chooseIsa() {
  const std::string& wanted = param::Simd();
  const Isa best = bestSupported();
  Isa chosen = best;
  if (wanted != "auto") {
    if (wanted == "avx512") {
      chosen = Isa::Avx512;
    } else if (wanted == "avx2") {
      chosen = Isa::Avx2;
    } else if (wanted == "scalar") {
      chosen = Isa::Scalar;
    } else {
      fail(braidInvalidArgument, "BRAID_SIMD='{}': expected auto, avx512, avx2 or scalar", wanted);
    }
    if (!isaSupported(chosen)) {
      BRAID_WARN(log::kInit, "BRAID_SIMD={} is not supported by this CPU; using {}", wanted,
                 nameOf(best));
      chosen = best;
    }
  }
  BRAID_INFO(log::kInit, "host reduction kernels: {}", nameOf(chosen));
  return chosen;
}

Isa chosenIsa() {
  static const Isa isa = chooseIsa();
  return isa;
}

const ReduceTable& tableOf(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return avx512::table();
    case Isa::Avx2: return avx2::table();
    case Isa::Scalar: break;
  }
  return scalar::table();
}

ReduceFn lookup(Isa isa, braidDataType_t type, braidRedOp_t op, bool streaming) {
  if (static_cast<unsigned>(type) >= braidNumTypes || static_cast<unsigned>(op) >= braidNumOps)
    return nullptr;
  const ReduceTable& table = tableOf(isa);
  return streaming ? table.streamingFn[type][op] : table.fn[type][op];
}

// memcpy with non-temporal stores for the 16-byte-aligned body.
void streamCopy(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  size_t head = std::min(bytes, -reinterpret_cast<uintptr_t>(d) % 16);
  std::memcpy(d, s, head);
  size_t offset = head;
  for (; offset + 64 <= bytes; offset += 64)
    for (size_t i = 0; i < 64; i += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + offset + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + offset + i)));
  std::memcpy(d + offset, s + offset, bytes - offset);
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace

bool isaSupported(Isa isa) {
  __builtin_cpu_init();  // cheap once done; needed if called before static constructors ran
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::Avx512:
      return isaSupported(Isa::Avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq");
  }
  return false;
}

ReduceFn reduceFnFor(Isa isa, braidDataType_t type, braidRedOp_t op, bool streamingOutput) {
  return isaSupported(isa) ? lookup(isa, type, op, streamingOutput) : nullptr;
}

ReduceFn reduceFn(braidDataType_t type, braidRedOp_t op, bool streamingOutput) {
  return lookup(chosenIsa(), type, op, streamingOutput);
}

const char* isaName() {
  return nameOf(chosenIsa());
}

void copy2(void* dst, void* dst2, const void* src, size_t bytes, bool streamingOutput) {
  // memcpy's contract excludes dst == src; a copy onto itself is simply nothing to do.
  if (dst != src) {
    if (streamingOutput)
      streamCopy(dst, src, bytes);
    else
      std::memcpy(dst, src, bytes);
  }
  if (dst2 != nullptr && dst2 != src) std::memcpy(dst2, src, bytes);
}

void streamFence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

size_t typeSize(braidDataType_t type) {
  switch (type) {
    case braidInt8:
    case braidUint8:
    case braidFloat8e4m3:
    case braidFloat8e5m2: return 1;
    case braidFloat16:
    case braidBfloat16: return 2;
    case braidInt32:
    case braidUint32:
    case braidFloat32: return 4;
    case braidInt64:
    case braidUint64:
    case braidFloat64: return 8;
    case braidNumTypes: break;
  }
  return 0;
}

}  // namespace braid::kernels
