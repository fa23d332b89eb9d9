// Kernels for any CPU: the baseline instruction set only (16-byte vectors, SSE2 on x86-64) and
// fp16 conversions in software.
#include "kernels/host_reduce_impl.h"

namespace braid::kernels::scalar {
namespace {

struct Baseline {
  static constexpr size_t kVectorBytes = 16;
};

constexpr ReduceTable kTable = makeTable<Baseline>();

}  // namespace

const ReduceTable& table() {
  return kTable;
}

}  // namespace braid::kernels::scalar
