// What every part of the braid backend shares: torch's element types as braid's, a braid call's
// result as a Python exception with braid's sentence, and tensors as a braid call reads them.
#pragma once

#include <torch/extension.h>

#include <stdexcept>
#include <string>

#include "braid/braid.h"

namespace braid_torch {

inline braidDataType_t braidType(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return braidFloat32;
    case at::kDouble: return braidFloat64;
    case at::kHalf: return braidFloat16;
    case at::kBFloat16: return braidBfloat16;
    case at::kChar: return braidInt8;
    case at::kByte:
    case at::kBool: return braidUint8;
    case at::kInt: return braidInt32;
    case at::kLong: return braidInt64;
    case at::kFloat8_e4m3fn: return braidFloat8e4m3;
    case at::kFloat8_e5m2: return braidFloat8e5m2;
    default:
      throw std::invalid_argument("braid backend: tensors of type " +
                                  std::string(c10::toString(t.scalar_type())) +
                                  " are not supported (expected a float, integer or bool type)");
  }
}

// Throws braid's error, with the communicator's last-error sentence, unless the call succeeded.
inline void check(braidComm_t comm, braidResult_t result, const char* what) {
  if (result != braidSuccess)
    throw std::runtime_error(std::string("braid backend: ") + what + " failed: " +
                             braidGetErrorString(result) + ": " + braidGetLastError(comm));
}

// A tensor as a braid call reads and writes it: itself when contiguous on the CPU, else a
// contiguous copy whose contents are copied back where it is an output (as torch's own backends).
struct Flat {
  at::Tensor user, flat;
  explicit Flat(const at::Tensor& t) : user(t) {
    TORCH_CHECK(t.device().is_cpu(), "braid backend: tensor on ", t.device(),
                " (expected a CPU tensor; CUDA tensors "
                "go through CUDA communicators, not yet wired to this backend)");
    TORCH_CHECK(t.layout() == at::kStrided, "braid backend: a ", t.layout(),
                " tensor (expected a dense one; sparse COO tensors are taken by all_reduce with "
                "SUM only)");
    flat = t.is_contiguous() ? t : t.contiguous();
  }
  void* data() const { return flat.data_ptr(); }
  size_t count() const { return static_cast<size_t>(flat.numel()); }
  void writeBack() {
    if (!flat.is_same(user)) user.copy_(flat);
  }
};

}  // namespace braid_torch
