// The kernels of kernels_impl.h built for any x86-64 (or other) CPU.
#include "dp/kernels_impl.h"

namespace braid::dp::kernels::generic {

const KernelTable& table() {
  static const KernelTable kTable = makeTable();
  return kTable;
}

}  // namespace braid::dp::kernels::generic
