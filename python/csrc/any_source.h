// A receive from whichever rank's send comes first (torch's recvAnysource; MPI's MPI_ANY_SOURCE).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "braid/braid.h"
#include "operation_queue.h"
#include "peer_channels.h"

namespace braid_torch {

// A receive's Work that says which rank sent what it received (Work.source_rank()).
class AnySourceWork : public AsyncWork {
 public:
  using AsyncWork::AsyncWork;
  int sourceRank() const override { return source_.load(); }
  void completeFrom(int source) {
    source_.store(source);
    complete(nullptr);
  }

 private:
  std::atomic<int> source_{-1};
};

// Receives into `tensor` from the first of the other ranks to send to this one. On each peer's
// receive channel, behind the receives posted there before it, a probe waits (polling braidProbe
// on the channel's communicator once its sender has come) for a send from that peer; the first
// to see one takes it with `receive` on its communicator, the others stand down, and a later
// receive from them takes their sends. Fails the Work at the channels' waitLimit() if no rank
// sent. CPU
// communicators only: a CUDA communicator is not probed.
using ReceiveOn = std::function<void(braidComm_t comm, const at::Tensor& tensor)>;
c10::intrusive_ptr<c10d::Work> receiveFromAnySource(PeerChannels& channels,
                                                    const at::Tensor& tensor, int rank, int size,
                                                    ReceiveOn receive);

}  // namespace braid_torch
