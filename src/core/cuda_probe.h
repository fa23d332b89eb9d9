// Whether this process can use a CUDA device, asked of the CUDA runtime. Where the build had nvcc
// the runtime is linked statically and loads the driver itself when first called, so a machine
// without a driver or a GPU runs every CPU path and gets the runtime's own words for why not.
#pragma once

#include <string>

namespace braid {

// Why no CUDA device can be used here, or "" when one can.
std::string cudaUnavailableReason();

}  // namespace braid
