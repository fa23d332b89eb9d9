// CUDA runtime failures in braid's words: the runtime's name for the error and its sentence, the
// one way the library states them (raised under braidUnhandledCudaError, warned, or handed to a
// peer). Only for sources built where nvcc is. src/dp and braid-perf, clients of braid.h alone
// (docs/layering.md), say it the same way with their own lines.
#pragma once

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <string>
#include <string_view>

#include "base/error.h"

namespace braid {

// "cudaErrorInvalidValue (invalid argument)".
inline std::string cudaErrorText(cudaError_t error) {
  return fmt::format("{} ({})", cudaGetErrorName(error), cudaGetErrorString(error));
}

inline void checkCuda(cudaError_t error, std::string_view what) {
  if (error != cudaSuccess)
    fail(braidUnhandledCudaError, "{} failed: {}", what, cudaErrorText(error));
}

}  // namespace braid
