// Host reduction kernels, vectorized, chosen at run time by CPU features (AVX-512, AVX2, scalar).
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/braid.h"

namespace braid::kernels {

// dst[i] = a[i] OP b[i], for i < count; also written to dst2 when dst2 != nullptr.
// When divisor > 1 (only for braidAvg, on the final reduction) the result is divided by it:
// the sum is computed first, then divided, then rounded once to the element type.
// float16/bfloat16 are widened to fp32, reduced, and rounded to nearest-even once.
// dst may be the same pointer as a or b; no other overlap is allowed.
// Integer sums and products wrap. Max/Min of floats give NaN when either input is NaN.
using ReduceFn = void (*)(void* dst, void* dst2, const void* a, const void* b, size_t count,
                          int divisor);

// braidAvg uses the sum kernel (with divisor on the final step). Returns nullptr for bad enums.
// With streamingOutput, dst (not dst2) is written with non-temporal stores that bypass the cache:
// for outputs too large to stay cached; call streamFence() after the last such call.
ReduceFn reduceFn(braidDataType_t type, braidRedOp_t op, bool streamingOutput = false);

// dst = src and, when dst2 != nullptr, dst2 = src. With streamingOutput, dst as above.
void copy2(void* dst, void* dst2, const void* src, size_t bytes, bool streamingOutput = false);

// Orders earlier streaming stores before whatever this thread does next.
void streamFence();

// Size in bytes of one element; 0 for an invalid type.
size_t typeSize(braidDataType_t type);

// "avx512", "avx2" or "scalar": the instruction set the dispatcher chose (BRAID_SIMD may force
// a lower one).
const char* isaName();

// Instruction sets with a kernel table, lowest first. "Scalar" is the baseline instruction set
// (SSE2 on x86-64); Avx2 also needs FMA and F16C; Avx512 needs F, BW, VL and DQ.
enum class Isa { Scalar, Avx2, Avx512 };

// Whether this CPU (and OS) can run that instruction set's kernels.
bool isaSupported(Isa isa);

// The kernel of one instruction set, bypassing the dispatcher (tests, benchmarks). nullptr for bad
// enums or an instruction set this CPU does not support.
ReduceFn reduceFnFor(Isa isa, braidDataType_t type, braidRedOp_t op, bool streamingOutput = false);

}  // namespace braid::kernels
