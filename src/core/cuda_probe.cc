#include "core/cuda_probe.h"

#if BRAID_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "transport/cuda_check.h"
#endif

namespace braid {

namespace {

std::string askTheRuntime() {
#if BRAID_HAVE_CUDA
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess) return "cudaGetDeviceCount failed with " + cudaErrorText(error);
  return devices == 0 ? "the CUDA runtime finds no device" : "";
#else
  return "this build of braid has no CUDA (no nvcc was found when it was built)";
#endif
}

}  // namespace

// Asked once: where the driver is missing, every later question would get the same answer.
std::string cudaUnavailableReason() {
  static const std::string reason = askTheRuntime();
  return reason;
}

}  // namespace braid
