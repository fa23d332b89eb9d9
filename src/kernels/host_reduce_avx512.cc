// Kernels for AVX-512 (F, BW, VL, DQ) CPUs: 64-byte vectors, fp16 through the 512-bit conversions.
#include <immintrin.h>

#include "kernels/host_reduce_impl.h"

namespace braid::kernels::avx512 {
namespace {

struct Avx512 {
  static constexpr size_t kVectorBytes = 64;
  static Vector<float, 64> halfToFloat(Vector<uint16_t, 32> half) {
    // The masked forms with an all-ones mask are the plain instructions; the unmasked intrinsics
    // trip GCC 12's -Wmaybe-uninitialized on their undefined pass-through operand.
    return (Vector<float, 64>)_mm512_mask_cvtph_ps(_mm512_setzero_ps(), 0xffff, (__m256i)half);
  }
  static Vector<uint16_t, 32> floatToHalf(Vector<float, 64> value) {
    return (Vector<uint16_t, 32>)_mm512_mask_cvtps_ph(_mm256_setzero_si256(), 0xffff, (__m512)value,
                                                      _MM_FROUND_TO_NEAREST_INT);
  }
};

constexpr ReduceTable kTable = makeTable<Avx512>();

}  // namespace

const ReduceTable& table() {
  return kTable;
}

}  // namespace braid::kernels::avx512
