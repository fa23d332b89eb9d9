// The backend's point-to-point traffic, one direction of one pair of ranks at a time.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>

#include "braid/braid.h"
#include "operation_queue.h"

namespace braid_torch {

// Sends from this rank to a peer run over a two-rank braid communicator of their own (this rank
// its rank 0), receives from a peer over the peer's (this rank its rank 1), each direction on a
// thread of its own, made on first use. So the k-th send from a to b meets the k-th receive at b
// from a whatever else either rank posted before or between them, alone or batched (MPI's order
// of messages between a pair, tags aside, as NCCL), and a send and a receive larger than braid's
// FIFOs never wait for each other: on one communicator, one runs only after the other ends.
class PeerChannels {
 public:
  // device: the channels' communicators' ("cpu", or "cuda" on the device current where they are
  // made: their operations choose it).
  PeerChannels(c10::intrusive_ptr<c10d::Store> store, int rank, std::chrono::milliseconds timeout,
               std::string device)
      : store_(std::move(store)), rank_(rank), timeout_(timeout), device_(std::move(device)) {}
  ~PeerChannels();

  // Drains every channel (each operation ends or fails within the timeout) and refuses
  // operations from then on; the communicators live until the channels are destroyed.
  void close();

  // Queues op on the channel of sends to (send) or receives from (!send) peer, or runs it at once
  // when called on that channel's thread (an operation a completing one's callback issues: queued
  // behind that callback it would wait for ever). False (op dropped) once closed.
  [[nodiscard]] bool post(int peer, bool send, std::function<void()> op);
  // Whether the caller is the thread of that channel (post would run op at once).
  bool onThreadOf(int peer, bool send);
  // Whether close() has been called: a long operation may stop early.
  bool closing();
  // How long an operation waits for a peer: the group's timeout, or the store's where it has none.
  std::chrono::milliseconds waitLimit() const;

  // The channel's communicator, made on first use; called by its operations, on its thread.
  // Throws braid's error if it cannot be made (then every later operation on it fails alike).
  braidComm_t comm(int peer, bool send);
  // The communicator of receives from `peer` if its sender has come (its first send published the
  // channel's id; this rank said it waits, so that it may), without waiting for it: nullptr until
  // then. On that channel's thread.
  braidComm_t receiveCommIfSenderCame(int peer);

 private:
  struct Channel {
    braidComm_t comm = nullptr;
    std::string failure;        // why the communicator could not be made
    bool receiverSaid = false;  // a receive channel: its key that this rank waits is set
    std::unique_ptr<OperationQueue> queue = std::make_unique<OperationQueue>();
  };
  Channel* channel(int peer, bool send);
  braidComm_t connect(int peer, bool send);
  std::string channelKey(int peer,
                         bool send) const;  // the store's keys of the channel begin with it
  void awaitKey(const std::string& key, const char* what, int peer);

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::string device_;
  std::mutex mutex_;  // guards closed_ and the map channels_ (not the channels)
  bool closed_ = false;
  std::map<std::pair<int, bool>, std::unique_ptr<Channel>> channels_;  // (peer, send)
};

}  // namespace braid_torch
