// Registered windows of a CUDA communicator whose ranks reach each other's memory (ranks sharing
// one GPU in one process): every rank registers its windows together (braidCommWindowRegister is
// collective, as ncclCommWindowRegister), so the k-th window of every rank is one window, and
// each rank knows where every peer's part of it starts. A call whose buffers lie in windows can
// then run the direct engine with each rank launched on its own: a rank reaches a peer's buffer
// at the same offset of the peer's part of the window (NCCL's symmetric windows). The call's
// signature, compared on the device before anything is read (DirectBarrier), catches a peer whose
// buffers lie elsewhere.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "coll/call.h"

namespace braid {

// The most ranks a window call reaches: one launch's pointer table (kMaxLaunchBlocks).
constexpr int kMaxWindowRanks = 32;

// Where a direct call of a rank launched on its own reaches every rank's buffers, and what its
// barrier compares.
struct WindowCall {
  std::array<const void*, kMaxWindowRanks> inputs{};  // by rank
  std::array<void*, kMaxWindowRanks> outputs{};       // by rank
  uint64_t signature = 0;
};

// What the direct engine's barrier compares for a call launched with every rank (no windows):
// the collective, datatype, operator and count.
uint64_t directSignature(const CollArgs& a);

class WindowTable {
 public:
  explicit WindowTable(int rank, int nranks) : rank_(rank), nranks_(nranks) {}

  // Window `id` (the same on every rank): this rank's part is `bases[rank]`, `size` bytes; every
  // rank's part starts at bases[r].
  void add(uint64_t id, size_t size, std::vector<uintptr_t> bases);
  void remove(uint64_t id);
  // The call's buffers, reached on every rank through the windows that hold them whole here, or
  // nullopt when a buffer it uses lies in no window (the call then runs the ring). Windows that
  // overlap: the oldest that holds the buffer, on every rank alike.
  std::optional<WindowCall> locate(const CollArgs& a) const;

 private:
  struct Window {
    uint64_t id;
    size_t size;
    std::vector<uintptr_t> bases;  // by rank
  };
  struct Place {
    const Window* window;
    size_t offset;
  };
  std::optional<Place> find(const void* p, size_t bytes) const;

  const int rank_, nranks_;
  mutable std::mutex mutex_;  // registration and calls may come from different threads
  std::vector<Window> windows_;
};

}  // namespace braid
