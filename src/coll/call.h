// A collective or send/recv call as braid's C API takes it: what the layers above the executors
// pass around (checked by core/arguments.cc, tagged by coll/call_tag.h, grouped by core/groups.cc)
// and what the host executor (coll/host_executor.h) and the device executor
// (coll/device_executor.h) run. Its own header, so that describing a call needs neither executor.
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/braid.h"
#include "coll/schedule.h"

namespace braid {

struct CollArgs {
  Collective coll = Collective::AllReduce;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;  // the user's count argument (recvcount, sendcount, ...)
  braidDataType_t type = braidFloat32;
  braidRedOp_t op = braidSum;
  int root = 0;  // root of broadcast/reduce, peer of send/recv
  // The op the caller named where it differs from `op` (a PreMulSum operator runs as a sum of
  // scaled inputs): what the call's tag carries, so a rank using it against one using Sum fails.
  int namedOp = -1;
  // A group's fused pass (coll/group_plan.h): a digest of its calls' number and counts, which its
  // tag carries instead of the count, so that ranks whose groups differ fail; 0 for a call.
  uint64_t fusedCalls = 0;
};

inline bool reduces(Collective c) {
  return c == Collective::AllReduce || c == Collective::ReduceScatter || c == Collective::Reduce;
}
inline bool hasRoot(Collective c) {
  return c == Collective::Broadcast || c == Collective::Reduce || c == Collective::Gather ||
         c == Collective::Scatter;
}
inline bool isSendOrRecv(Collective c) {
  return c == Collective::Send || c == Collective::Recv;
}
// Whether the call's count is each rank's block (all-gather, reduce-scatter).
inline bool countsPerRank(Collective c) {
  return c == Collective::AllGather || c == Collective::ReduceScatter;
}

// Sends and receives, and the markers of the gathers and scatters built of them: what launches and
// runs as a group of point-to-point moves.
inline bool isPointToPoint(Collective c) {
  return c == Collective::Send || c == Collective::Recv || c == Collective::Gather ||
         c == Collective::Scatter;
}

// Whether two ranks' calls are the same collective, as one launch of several ranks needs:
// collective, datatype, count, root and operator (any two PreMulSum operators alike: each rank
// has a scalar of its own).
inline bool sameCollective(const CollArgs& a, const CollArgs& b) {
  const bool builtIn = a.op < braidNumOps;
  return a.coll == b.coll && a.type == b.type && a.count == b.count && a.root == b.root &&
         builtIn == (b.op < braidNumOps) && (!builtIn || a.op == b.op);
}

}  // namespace braid
