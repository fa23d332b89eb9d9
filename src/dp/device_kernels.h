// The step's arithmetic on device memory: the kernels of device_kernels.cu, launched on a CUDA
// stream. A plain header (no CUDA headers), so that the CPU side of braid_dp can call it; the
// stream is a cudaStream_t passed as void*. Each function returns the launch's cudaError_t as
// an int (0: queued). Results are bit for bit those of kernels.h, except inspection's sum of
// squares, which adds in another order (device_kernels.cuh says by how much it can differ).
#pragma once

#include <cstddef>

#include "dp/kernels.h"

namespace braid::dp::device {

// Where the ranks' inspections meet: each rank's kernel adds into its own, then the ranks
// all-reduce the flag (max) and, under ZeRO, the sum (sum). Zeroed before the first inspection.
struct Verdict {
  float overflowFlag;  // 1 when some element is inf or NaN
  double sumSquares;   // of the values as stored (still loss-scaled)
};

int launchToFloat(const void* src, braidDataType_t type, float* dst, size_t count, void* stream);
int launchFromFloat(const float* src, void* dst, braidDataType_t type, size_t count, void* stream);
int launchAccumulate(const float* src, void* dst, braidDataType_t type, size_t count, void* stream);
int launchScale(void* data, braidDataType_t type, size_t count, float factor, void* stream);
int launchAdd(void* dst, const void* src, braidDataType_t type, size_t count, void* stream);
// Adds this range's flag and sum of squares into *verdict (device memory).
int launchInspect(const void* data, braidDataType_t type, size_t count, Verdict* verdict,
                  void* stream);
int launchUpdate(const kernels::UpdateArgs& args, const void* grad, float* master, float* moment1,
                 float* moment2, void* working, size_t count, void* stream);

// Loads every kernel above into the current device's context. CUDA loads a kernel at its first
// launch by default (CUDA_MODULE_LOADING=LAZY), and loading may wait for the kernels running on
// the device: where ranks share a GPU, a peer's collective may be waiting for this rank's next
// launch, which would then never come.
int loadKernels();

}  // namespace braid::dp::device
