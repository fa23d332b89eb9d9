// Where DataParallel keeps the optimizer's state (the owned shard's fp32 master weights and
// moments) and how the step reaches one segment's of it: resident in the backend's memory, or in
// a file per rank paged in and out around each segment's update (OffloadTier::kFile).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "braid/dp.hpp"
#include "dp/backend.h"

namespace braid::dp {

// One segment's state as the update takes it; null where the optimizer keeps no such array
// (master: fp32 precision, whose working copy is the master).
struct SegmentState {
  float* master = nullptr;
  float* moment1 = nullptr;
  float* moment2 = nullptr;
};

// Which arrays there are and how the shard is cut: segment i holds `count` elements from
// `offset` of every array.
struct StateLayout {
  bool master = false, moment1 = false, moment2 = false;
  size_t ownedCount = 0;
  struct Range {
    size_t offset, count;
  };
  std::vector<Range> segments;
  size_t arrays() const { return size_t{master} + moment1 + moment2; }
};

class StateStore {
 public:
  virtual ~StateStore() = default;
  // The step visits the segments in order: prefetch(i + 1) may run while segment i is updated.
  virtual void prefetch(size_t segment) = 0;
  // Segment i's state, once it is in memory; valid until release(i).
  virtual SegmentState acquire(size_t segment) = 0;
  // The update of segment i is done: its state may go back.
  virtual void release(size_t segment) = 0;
  // Waits until every segment released is stored again (the end of a step).
  virtual void flush() = 0;
  // Initial master weights: `count` values at element `offset` of the shard.
  virtual void setMaster(size_t offset, const float* values, size_t count) = 0;
  virtual size_t residentBytes() const = 0;
  virtual size_t offloadedBytes() const = 0;
};

// The state in the backend's memory (host, or a CUDA device's).
std::unique_ptr<StateStore> makeResidentStore(Backend& backend, const StateLayout& layout);
// The state in a file under `directory` (removed when the store goes), two segments' worth in
// host memory; the reads and writes run on a thread of the store's own. Fails (braidSystemError)
// naming the file where it cannot be made, read or written.
std::unique_ptr<StateStore> makeFileStore(const StateLayout& layout, const std::string& directory,
                                          int rank);

}  // namespace braid::dp
