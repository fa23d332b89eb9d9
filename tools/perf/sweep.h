// nccl-tests' TimeTest/BenchTime once, for braid-perf and for the peer drivers of bench/peers:
// warm-up, the timed loop (time per op = the loop's time / -n, the slowest rank's), the checked
// run, and the table rank 0 prints. What differs between libraries is the communicator, behind
// BenchComm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "braid/braid.h"
#include "perf/options.h"
#include "perf/report.h"

namespace braid_perf {

// A communicator as the sweeps drive it: braid's (perf/bench.cc) or a peer library's.
class BenchComm {
 public:
  virtual ~BenchComm() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  // Returns once every rank has entered it.
  virtual void barrier() = 0;
  // values[i] = the largest values[i] over the ranks, on every rank.
  virtual void maxOverRanks(double* values, int count) = 0;
  // Every rank's pid and host, in rank order.
  virtual std::vector<RankInfo> rankInfo() = 0;
  // One call of the options' collective on a Layout's paramCount; it may complete later.
  virtual void launch(const void* send, void* recv, size_t count, braidDataType_t type,
                      braidRedOp_t op) = 0;
  // Returns once every launched call has completed (nothing to do where calls block).
  virtual void complete() {}
  // The planner's predicted busbw for a row of `bytes`, or -1 where there is none.
  virtual double predictedBusbw(size_t bytes) { return -1; }
  // Where the calls' buffers live: host memory, unless the communicator is on a device. Then
  // they are its memory, and the sweeps fill inputs and check outputs in host mirrors copied up
  // and down.
  virtual bool buffersOnDevice() const { return false; }
  virtual void* allocateBuffer(size_t bytes) { return nullptr; }
  virtual void freeBuffer(void* buffer) {}
  virtual void upload(void* buffer, const void* host, size_t bytes) {}
  virtual void download(void* host, const void* buffer, size_t bytes) {}
};

// Runs every datatype x op sweep the options ask for; rank 0 prints with `run` as the header
// (its ranks filled here). Returns the number of wrong elements over all rows, the same on every
// rank. Throws RunError when a call fails.
int64_t runSweeps(const Options& options, BenchComm& comm, RunInfo run);

}  // namespace braid_perf
