// The kernels of kernels_impl.h built for AVX2 + F16C CPUs (8-wide fp16 conversion).
#include "dp/kernels_impl.h"

namespace braid::dp::kernels::avx2 {

const KernelTable& table() {
  static const KernelTable kTable = makeTable();
  return kTable;
}

}  // namespace braid::dp::kernels::avx2
