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

// The ranks one thread drives as the sweeps see them: braid's communicators (perf/bench.cc, -g
// of them, consecutive ranks from rank()) or a peer library's (one). Calls take the index of the
// thread's rank (`local`, 0 .. localRanks()-1).
class BenchComm {
 public:
  virtual ~BenchComm() = default;
  virtual int rank() const = 0;  // the first of the thread's ranks
  virtual int localRanks() const { return 1; }
  virtual int nranks() const = 0;
  // Returns once every rank has entered it.
  virtual void barrier() = 0;
  // values[i] = the largest values[i] over the ranks, on every rank.
  virtual void maxOverRanks(double* values, int count) = 0;
  // Every rank's pid and host, in rank order.
  virtual std::vector<RankInfo> rankInfo() = 0;
  // One call of the options' collective by one of the thread's ranks on a Layout's paramCount;
  // it may complete later. The calls of every local rank come between startGroup() and
  // endGroup() (they wait for each other, so one thread must issue them together); with -m, each
  // rank's -m calls too.
  virtual void launch(int local, const void* send, void* recv, size_t count, braidDataType_t type,
                      braidRedOp_t op) = 0;
  virtual void startGroup() {}
  virtual void endGroup() {}
  // Returns once every launched call has completed (nothing to do where calls block).
  virtual void complete() {}
  // The planner's predicted busbw for a row of `bytes`, or -1 where there is none.
  virtual double predictedBusbw(size_t bytes) { return -1; }
  // Where the calls' buffers live: host memory, unless the communicator is on a device. Then
  // they are its memory, and the sweeps fill inputs and check outputs in host mirrors copied up
  // and down.
  virtual bool buffersOnDevice() const { return false; }
  virtual void* allocateBuffer(int local, size_t bytes) { return nullptr; }
  virtual void freeBuffer(int local, void* buffer) {}
  virtual void upload(int local, void* buffer, const void* host, size_t bytes) {}
  virtual void download(int local, void* host, const void* buffer, size_t bytes) {}
  // Bytes per second (reads and writes together) a device-to-device copy reaches on the first
  // rank's device, and how many ranks of the run share that device; 0: not on a device.
  virtual double deviceCopyGBs() { return 0; }
  virtual int ranksOnFirstDevice() { return 1; }
};

// Runs every datatype x op sweep the options ask for; rank 0 prints with `run` as the header
// (its ranks filled here). Returns the number of wrong elements over all rows, the same on every
// rank. Throws RunError when a call fails.
int64_t runSweeps(const Options& options, BenchComm& comm, RunInfo run);

}  // namespace braid_perf
