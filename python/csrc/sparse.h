// Sparse COO tensors summed over a braid communicator's ranks (DDP's sparse gradients).
#pragma once

#include <torch/extension.h>

#include "braid/braid.h"

namespace braid_torch {

// The sum over every rank of `input`, a sparse COO tensor of the same sizes on every rank,
// coalesced. Every rank's indices and values are gathered (each padded to the largest count of
// entries), then added here in rank order, so every rank ends with the same tensor.
at::Tensor sparseSum(braidComm_t comm, int nranks, const at::Tensor& input);

}  // namespace braid_torch
