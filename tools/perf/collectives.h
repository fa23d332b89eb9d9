// What braid-perf knows about each collective: how a message size becomes buffer counts (as
// nccl-tests computes them), the bus-bandwidth factor, how to call it, and what a checked run's
// input and output hold.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

#include "braid/braid.h"
#include "perf/values.h"

namespace braid_perf {

// Element counts for one message size; in-place offsets are multiplied by the rank.
struct Layout {
  size_t sendCount = 0;
  size_t recvCount = 0;
  size_t paramCount = 0;  // the count argument of the call, printed in the "count" column
  size_t sendInPlaceOffset = 0;
  size_t recvInPlaceOffset = 0;

  // Bytes the row reports as its size and divides by the time for algbw.
  size_t bytes(size_t typeSize) const { return std::max(sendCount, recvCount) * typeSize; }
  // Elements an in-place run touches from the start of the receive buffer.
  size_t inPlaceExtent(int rank) const {
    return std::max(sendCount + sendInPlaceOffset * rank, recvCount + recvInPlaceOffset * rank);
  }
};

struct CallArgs {
  const void* send;
  void* recv;
  size_t count;
  braidDataType_t type;
  braidRedOp_t op;
  int root;
  int rank;
  int nranks;
  braidComm_t comm;
  braidStream_t stream;
};

struct Collective {
  const char* name;
  bool reduces;        // takes -o; otherwise the redop column says "none"
  bool rooted;         // takes -r; otherwise the root column says -1
  bool checksInPlace;  // false for exchanges whose in-place result is undefined (nccl-tests: N/A)
  Layout (*layout)(size_t count, int nranks);
  double (*busFactor)(int nranks);
  braidResult_t (*call)(const CallArgs& args);
  // Element i of this rank's send buffer in a checked run.
  double (*input)(const ValueModel& model, const Layout& layout, int rank, size_t i);
  // Element i of this rank's receive buffer after a checked run.
  Expected (*expected)(const ValueModel& model, const Layout& layout, int rank, int nranks,
                       int root, size_t i);
  // Whether this rank's receive buffer holds a defined result (reduce: only the root's).
  bool (*hasOutput)(int rank, int root);
  // What braidCommPredict prices it as; -1 when the planner has no model of it (alltoall).
  int planned = -1;
};

// The subcommands, in the order `braid-perf --help` lists them.
extern const Collective kCollectives[7];

// nullptr if `name` is not a subcommand.
const Collective* findCollective(std::string_view name);

}  // namespace braid_perf
