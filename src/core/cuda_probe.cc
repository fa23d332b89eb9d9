#include "core/cuda_probe.h"

#include <fmt/format.h>

#if BRAID_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace braid {

std::string cudaUnavailableReason() {
#if BRAID_HAVE_CUDA
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess)
    return fmt::format("cudaGetDeviceCount failed with {} ({})", cudaGetErrorName(error),
                       cudaGetErrorString(error));
  return devices == 0 ? "the CUDA runtime finds no device" : "";
#else
  return "this build of braid has no CUDA (no nvcc was found when it was built)";
#endif
}

}  // namespace braid
