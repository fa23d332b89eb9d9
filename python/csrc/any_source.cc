#include "any_source.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

namespace braid_torch {
namespace {

using Clock = std::chrono::steady_clock;

// A failure of the backend's, as check() raises them (a DistBackendError), to complete a Work with.
std::exception_ptr backendError(const std::string& message) {
  try {
    failBackend(message);
  } catch (...) {
    return std::current_exception();
  }
}

std::exception_ptr shutDownError(int rank) {
  return backendError("braid backend: a receive from any source on rank " + std::to_string(rank) +
                      " ended: the process group was shut down");
}

// What the probes of one receive share: who took it, and until when they look. While they look
// (it lives as long as they do), the receive counts as a meeting in flight if a channel it probes
// has yet to meet.
struct Race {
  std::optional<PeerChannels::MeetingInFlight> inFlight;
  c10::intrusive_ptr<AnySourceWork> work;
  at::Tensor tensor;
  Clock::time_point deadline;
  ReceiveOn receive;
  std::atomic<bool> decided{false};

  // The first caller ends the race (and then completes the Work); the others stand down.
  bool claim() {
    bool expected = false;
    return decided.compare_exchange_strong(expected, true);
  }
  void fail(const std::exception_ptr& error) {
    if (claim()) work->complete(error);
  }
};

// One peer's probe, on the channel of receives from it. The channel's first message makes its
// communicator, so until the peer's first send to this rank there is nothing to probe.
void probe(PeerChannels& channels, const std::shared_ptr<Race>& race, int peer, int rank,
           std::chrono::milliseconds timeout) {
  auto pause = std::chrono::microseconds(10);
  while (!race->decided.load()) {
    if (braidComm_t comm = channels.receiveCommIfSenderCame(peer)) {
      int waiting = 0;
      check(comm, braidProbe(0, comm, &waiting, nullptr, nullptr), "braidProbe");
      if (waiting != 0 && race->claim()) {
        try {
          race->receive(comm, race->tensor);
        } catch (...) {
          race->work->complete(std::current_exception());
          return;
        }
        race->work->completeFrom(peer);
        return;
      }
    }
    if (Clock::now() > race->deadline) {
      race->fail(backendError("braid backend: a receive from any source on rank " +
                              std::to_string(rank) + ": Timed out after " +
                              std::to_string(timeout.count()) + " ms, no rank sent to it"));
      return;
    }
    if (channels.closing()) {
      race->fail(shutDownError(rank));
      return;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> receiveFromAnySource(PeerChannels& channels,
                                                    const at::Tensor& tensor, int rank, int size,
                                                    ReceiveOn receive) {
  const std::chrono::milliseconds timeout = channels.waitLimit();
  TORCH_CHECK(size > 1, "braid backend: a receive from any source on rank ", rank,
              " of a group of one (expected another rank to send)");
  TORCH_CHECK(tensor.numel() > 0, "braid backend: a receive from any source on rank ", rank,
              " of an empty tensor (a send of no elements carries nothing, so its sender cannot be "
              "known)");
  auto race = std::make_shared<Race>();
  if (!channels.receivesMet(size)) race->inFlight.emplace(channels);
  race->work = c10::make_intrusive<AnySourceWork>(std::vector<at::Tensor>{tensor});
  race->tensor = tensor;
  race->deadline = Clock::now() + timeout;
  race->receive = std::move(receive);
  // Posted on one of these channels' threads (a completing receive's callback), that channel's
  // probe runs at once: the others are posted first, so that they look meanwhile.
  std::vector<int> peers;
  for (bool onItsThread : {false, true})
    for (int peer = 0; peer < size; ++peer)
      if (peer != rank && channels.onThreadOf(peer, false) == onItsThread) peers.push_back(peer);
  for (int peer : peers) {
    auto body = withCallerState([&channels, race, peer, rank, timeout] {
      try {
        probe(channels, race, peer, rank, timeout);
      } catch (...) {
        race->fail(std::current_exception());
      }
    });
    if (!channels.post(peer, false, std::move(body), PeerChannels::Meeting::NotCounted))
      race->fail(shutDownError(rank));
  }
  return race->work;
}

}  // namespace braid_torch
