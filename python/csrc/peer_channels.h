// The backend's point-to-point traffic, one direction of one pair of ranks at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
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
// thread of its own, made on first use. So a channel carries the messages from a to b in the
// order sent, whatever else either rank posted before or between them, alone or batched (which
// receive takes which is the Mailbox's, on CPU channels), and a send and a receive larger than
// braid's FIFOs never wait for each other: on one communicator, one runs only after the other
// ends.
//
// A channel's first meeting goes through the store, whose server lives in rank 0's process when
// init_process_group made a TCPStore (tcp://, env://). So the job counts the meetings in flight
// in the store (one count for every group: a group without rank 0 meets through rank 0's store
// too), and a rank leaving a group waits while the count is above 0 (awaitMeetingsInFlight). A
// meeting is counted from before its first operation's isend/irecv returns; so a rank that is
// done, store's host or not, stays for every meeting counted before anything it waited for (the
// ring whose rank 0 left while ranks 1 and 2 still had to meet). A meeting neither of whose
// posts came before something the host waited for may find it gone, as under ProcessGroupNCCL,
// whose pairs meet through the store too. Channels made never touch the store.
class PeerChannels {
 public:
  // device: the channels' communicators' ("cpu", or "cuda" on the device current where they are
  // made: their operations choose it). keyPrefix: what begins the channels' keys in the store
  // (the group instance's: see commThroughStore).
  PeerChannels(c10::intrusive_ptr<c10d::Store> store, int rank, std::chrono::milliseconds timeout,
               std::string device, std::string keyPrefix)
      : store_(std::move(store)),
        jobStore_(withoutPrefixes(store_)),
        rank_(rank),
        timeout_(timeout),
        device_(std::move(device)),
        keyPrefix_(std::move(keyPrefix)) {}
  ~PeerChannels();

  // Drains every channel (each operation ends or fails within the timeout) and refuses
  // operations from then on; the communicators live until the channels are destroyed.
  void close();

  // Whether an operation posted counts its channel's first meeting in flight, until the channel's
  // communicator is made or has failed: a send or a receive does; a receive from any source's
  // wait on one channel does not (that receive counts as a whole, MeetingInFlight: most of its
  // channels' senders never come).
  enum class Meeting { Counted, NotCounted };
  // Queues op on the channel of sends to (send) or receives from (!send) peer, or runs it at once
  // when called on that channel's thread (an operation a completing one's callback issues: queued
  // behind that callback it would wait for ever). False (op dropped) once closed. An operation
  // whose meeting is counted calls comm() before anything that may throw, so that the count comes
  // down.
  [[nodiscard]] bool post(int peer, bool send, std::function<void()> op,
                          Meeting meeting = Meeting::Counted);
  // Waits while any rank of the job has a meeting in flight, for waitLimit() at most (then warns
  // how many are left); returns at once if the store has gone (its host left: nobody meets
  // through it now). For a rank leaving the group, its own channels drained.
  void awaitMeetingsInFlight();
  // Sets the job's count of meetings in flight to 0 (the default group's rank 0, when no rank can
  // have a meeting in flight: see BraidBackend::startMeetingsAfresh).
  static void resetMeetings(const c10::intrusive_ptr<c10d::Store>& store);
  // Whether every other rank's channel of receives to this one (of `size` ranks) has met: a
  // receive from any source then needs no store.
  bool receivesMet(int size);
  // Counts one meeting in flight while it lives (a receive from any source, whose waits use the
  // store until it ends).
  class MeetingInFlight {
   public:
    explicit MeetingInFlight(PeerChannels& channels)
        : channels_(channels), counted_(channels.addMeetings(1)) {}
    ~MeetingInFlight() {
      if (counted_) channels_.addMeetings(-1);
    }
    MeetingInFlight(const MeetingInFlight&) = delete;
    MeetingInFlight& operator=(const MeetingInFlight&) = delete;

   private:
    PeerChannels& channels_;
    bool counted_;
  };
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
    std::string failure;           // why the communicator could not be made
    bool receiverSaid = false;     // a receive channel: its key that this rank waits is set
    std::atomic<bool> met{false};  // its communicator made or failed (set under meetingsMutex_)
    bool counted = false;          // its first meeting counted in flight (under meetingsMutex_)
    std::unique_ptr<OperationQueue> queue = std::make_unique<OperationQueue>();
  };
  static c10::intrusive_ptr<c10d::Store> withoutPrefixes(const c10::intrusive_ptr<c10d::Store>& s);
  Channel* channel(int peer, bool send);
  braidComm_t connect(int peer, bool send);
  std::string channelKey(int peer,
                         bool send) const;  // the store's keys of the channel begin with it
  void countMeeting(Channel& c);  // an operation posted: its channel's first meeting, if to come
  void meetingEnded(Channel& c);  // the communicator made or failed
  // Changes the job's count of meetings in flight by delta; false if the store has gone (its
  // host left), which is not an error here: nobody meets through it any more.
  bool addMeetings(int64_t delta);

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Store> jobStore_;  // store_ without the groups' prefixes
  int rank_;
  std::chrono::milliseconds timeout_;
  std::string device_;
  std::string keyPrefix_;
  std::mutex mutex_;  // guards closed_ and the map channels_ (not the channels)
  bool closed_ = false;
  std::map<std::pair<int, bool>, std::unique_ptr<Channel>> channels_;  // (peer, send)
  // Guards a channel's counted and the setting of met, held across the store's count so that a
  // channel's count goes up before it comes down. Taken once per channel by a post (met is read
  // first): its store round trip waits behind this rank's other users of a TCPStore client.
  std::mutex meetingsMutex_;
};

}  // namespace braid_torch
