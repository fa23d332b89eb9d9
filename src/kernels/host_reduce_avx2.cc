// Kernels for AVX2 + FMA + F16C CPUs: 32-byte vectors, fp16 through vcvtph2ps/vcvtps2ph.
#include <immintrin.h>

#include "kernels/host_reduce_impl.h"

namespace braid::kernels::avx2 {
namespace {

struct Avx2 {
  static constexpr size_t kVectorBytes = 32;
  static Vector<float, 32> halfToFloat(Vector<uint16_t, 16> half) {
    return (Vector<float, 32>)_mm256_cvtph_ps((__m128i)half);
  }
  static Vector<uint16_t, 16> floatToHalf(Vector<float, 32> value) {
    return (Vector<uint16_t, 16>)_mm256_cvtps_ph((__m256)value, _MM_FROUND_TO_NEAREST_INT);
  }
};

constexpr ReduceTable kTable = makeTable<Avx2>();

}  // namespace

const ReduceTable& table() {
  return kTable;
}

}  // namespace braid::kernels::avx2
