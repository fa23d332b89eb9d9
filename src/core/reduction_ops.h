// A communicator's PreMulSum operators (braidRedOpCreatePreMulSum): each an id from braidNumOps
// up, a datatype and a scalar, read at every call (braidScalarDevice: the pointer is kept) or at
// creation (braidScalarHostImmediate: its bytes are kept). Also braidAvg of each floating type as
// NCCL runs it, a PreMulSum by 1/nranks, under ids of its own above the users'. Thread-safe: any
// thread may create, destroy or use them while collectives run.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "braid/braid.h"

namespace braid {

class ReductionOps {
 public:
  struct PreMulSum {
    braidDataType_t type = braidFloat32;
    const void* scalar = nullptr;  // read at every call (braidScalarDevice)
    uint8_t immediate[8] = {};  // the scalar's bytes, read at creation (braidScalarHostImmediate)
    bool isImmediate = false;
    // Where the scalar's bytes are now.
    const void* value() const { return isImmediate ? immediate : scalar; }
  };

  explicit ReductionOps(int rank) : rank_(rank) {}

  braidRedOp_t create(const void* scalar, braidDataType_t type, bool immediate);
  // braidAvg of floating `type` over `nranks` ranks: the PreMulSum operator whose scalar is
  // 1/nranks rounded to the type (each input times it, then a sum, so an average whose sum would
  // overflow the type does not), made on first use; braidAvg itself for the integer types (they
  // divide the sum).
  braidRedOp_t average(braidDataType_t type, int nranks);
  // Fails (braidInvalidArgument, naming braidRedOpDestroy and the rank) where `op` is not one of
  // these operators.
  void destroy(braidRedOp_t op);
  // Whether `op` is one of the operators braidRedOpCreatePreMulSum made, for `type`.
  bool has(braidRedOp_t op, braidDataType_t type) const;
  // The operator `op` (the API checked that it exists: braidInternalError otherwise).
  PreMulSum get(braidRedOp_t op) const;
  // `count` elements at `input`, each multiplied by op's scalar, into `output` (which may be
  // `input`).
  void scale(braidRedOp_t op, const void* input, void* output, size_t count) const;
  // The same into `scaled`, sized to fit; returns its data.
  const void* scaled(braidRedOp_t op, const void* input, size_t count,
                     std::vector<uint8_t>& scaled) const;

 private:
  const int rank_;
  mutable std::mutex mutex_;
  std::map<int, PreMulSum> ops_;
  int next_ = braidNumOps;
  // average()'s ids: kFirstAverage + type, above every id create() gives.
  static constexpr int kFirstAverage = INT_MAX - braidNumTypes;
};

}  // namespace braid
