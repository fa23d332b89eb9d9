// CUDA runtime failures as braid's errors: the call, the runtime's name for the error and its
// sentence, under braidUnhandledCudaError. Only for sources built where nvcc is.
#pragma once

#include <cuda_runtime_api.h>

#include <string_view>

#include "base/error.h"

namespace braid {

inline void checkCuda(cudaError_t error, std::string_view what) {
  if (error != cudaSuccess)
    fail(braidUnhandledCudaError, "{} failed: {} ({})", what, cudaGetErrorName(error),
         cudaGetErrorString(error));
}

}  // namespace braid
