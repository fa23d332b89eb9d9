// Point-to-point messages of CPU tensors, matched by source and tag as Gloo (and MPI) match them.
#pragma once

#include <ATen/ThreadLocalState.h>
#include <torch/extension.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "braid/braid.h"
#include "operation_queue.h"
#include "peer_channels.h"

namespace braid_torch {

// What a CPU channel carries before each message: its tag and size, and the message itself
// where it fits (a small message costs one braid send, not two). Fixed in size, so that the
// receiver knows what to receive before it knows what comes.
struct MessageHeader {
  int64_t tag;
  int64_t numel;  // the sender's tensor's elements, as errors name them
  int64_t count;  // elements of `type` on the wire (bytes, for a type braid has none of)
  int64_t bytes;
  int32_t type;     // braidDataType_t
  int32_t dtype;    // the sender's c10::ScalarType
  int32_t inlined;  // 1: the message is the envelope's payload
  int32_t unused;
};
struct Envelope {
  static constexpr size_t kBytes = 1024;
  static constexpr size_t kPayloadBytes = kBytes - sizeof(MessageHeader);
  MessageHeader head;
  uint8_t payload[kPayloadBytes];
};
static_assert(sizeof(Envelope) == Envelope::kBytes);

// Sends `tensor` tagged `tag` on a channel of sends (its receiver is the channel's rank 1), on
// that channel's thread: its envelope, then the message where it did not fit.
void sendTagged(braidComm_t comm, const at::Tensor& tensor, int64_t tag);

// A receive's end: the rank whose message it took, or why it failed (source -1).
using ReceiveDone = std::function<void(int source, std::exception_ptr error)>;

// A receive from any source's Work, which says whose message it took (Work.source_rank()).
class AnySourceWork : public AsyncWork {
 public:
  using AsyncWork::AsyncWork;
  int sourceRank() const override { return source_.load(); }
  void completeFrom(int source, std::exception_ptr error) {
    source_.store(source);
    complete(std::move(error));
  }

 private:
  std::atomic<int> source_{-1};
};

// The receiving side of a rank's CPU channels. A receive takes the first message from its source
// (or from any rank) with its tag that no receive has taken, whatever the order of posting, as
// Gloo does: so messages of one tag between a pair meet in the order sent, and messages of other
// tags wait. A receive posted where no such message has come waits on its channel (every other
// rank's, for one from any source); the channel's thread takes each envelope that comes while the
// receive waits, hands its message to the first receive waiting there for its tag, or keeps it
// (in a buffer of its own) until a receive asks for it.
class Mailbox {
 public:
  Mailbox(PeerChannels& channels, int rank, int size)
      : channels_(channels), rank_(rank), size_(size), inboxes_(size) {}

  // Receives into `tensor` the first message from `peer` tagged `tag`. `done` runs where the
  // receive ends: here when that message had come already, else on the channel's thread. Fails
  // if none came within the channels' waitLimit() (at the first message or silence after it).
  void receive(int peer, int64_t tag, const at::Tensor& tensor, ReceiveDone done);
  // The same, from whichever other rank such a message comes first. A channel that fails stands
  // down; the receive fails with its error once every channel has.
  void receiveFromAnySource(int64_t tag, const at::Tensor& tensor, ReceiveDone done);
  // Fails every receive still waiting (after the channels closed: nothing will take them).
  void close();

 private:
  using Clock = std::chrono::steady_clock;
  struct Posted {
    Posted(int64_t tag, at::Tensor tensor, ReceiveDone done, Clock::time_point deadline,
           bool anySource)
        : tag(tag),
          tensor(std::move(tensor)),
          done(std::move(done)),
          deadline(deadline),
          anySource(anySource) {}
    int64_t tag;
    at::Tensor tensor;
    ReceiveDone done;
    Clock::time_point deadline;
    bool anySource;
    at::ThreadLocalState state;  // the poster's: the tensor is written as it would write it
    // A receive from any source counts as a meeting in flight until it ends (see PeerChannels).
    std::optional<PeerChannels::MeetingInFlight> inFlight;
  };
  struct Arrived {
    MessageHeader head;
    at::Tensor data;  // the message, as the sender's type
  };
  struct Inbox {
    std::deque<std::shared_ptr<Posted>> posted;  // in posting order; any-source ones in each
    std::deque<Arrived> arrived;                 // in arrival order
  };

  // On the channel of receives from `peer`, until `receive` has ended there: takes the messages
  // that come (for whichever receive waits for them). Each receive posts one, so every receive
  // waiting on a channel has one queued or running there; one run at once on the channel's
  // thread (a completing receive's callback posted it) ends with its own receive.
  void pump(int peer, const std::shared_ptr<Posted>& receive);
  void schedulePump(int peer, const std::shared_ptr<Posted>& receive,
                    PeerChannels::Meeting meeting);
  // The envelope's message handed to the first receive waiting for its tag, or kept.
  void take(int peer, braidComm_t comm, const Envelope& envelope);
  void deliverFromWire(int peer, braidComm_t comm, const Envelope& envelope, Posted& receive);
  void deliver(int peer, const Arrived& message, Posted& receive);
  template <typename Fill>
  std::exception_ptr writeInto(int peer, const MessageHeader& head, Posted& receive, Fill fill);
  void finish(Posted& receive, int source, std::exception_ptr error);
  // Fails the receives waiting on `peer` whose time is up (and those from any source, once the
  // channels close).
  void expire(int peer);
  // `receive`'s wait on `peer` failed with `error`: it fails, or, from any source, stands down
  // there (failing once no channel is left to it).
  void failOn(int peer, const std::shared_ptr<Posted>& receive, std::exception_ptr error);
  // Fails `receive` unless it has ended (its channel refused it).
  void abandon(const std::shared_ptr<Posted>& receive, std::exception_ptr error);
  std::exception_ptr timedOut(int peer, const Posted& receive) const;

  // Under mutex_:
  bool waitsOnLocked(int peer, const std::shared_ptr<Posted>& receive) const;
  std::shared_ptr<Posted> claimLocked(int peer, int64_t tag);
  std::optional<Arrived> takeArrivedLocked(int peer, int64_t tag);
  void removeLocked(const std::shared_ptr<Posted>& receive);

  PeerChannels& channels_;
  int rank_;
  int size_;
  std::mutex mutex_;
  std::vector<Inbox> inboxes_;  // by peer; under mutex_
};

}  // namespace braid_torch
