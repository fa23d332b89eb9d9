#include "peer_channels.h"

#include <c10/util/ScopeExit.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <vector>

#include "common.h"

namespace braid_torch {
namespace {

// The job's count of channels' first meetings in flight, in the store without groups' prefixes.
constexpr char kMeetingsKey[] = "braid_torch/p2p/meetings_in_flight";

}  // namespace

c10::intrusive_ptr<c10d::Store> PeerChannels::withoutPrefixes(
    const c10::intrusive_ptr<c10d::Store>& s) {
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(s.get()))
    return prefixed->getUnderlyingNonPrefixStore();
  return s;
}

PeerChannels::~PeerChannels() {
  close();
  for (auto& [key, channel] : channels_)
    if (channel->comm != nullptr) braidCommDestroy(channel->comm);
}

void PeerChannels::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;  // the map is not grown from here on
  }
  for (auto& [key, channel] : channels_) channel->queue->close();
}

PeerChannels::Channel* PeerChannels::channel(int peer, bool send) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = channels_.find({peer, send});
  if (found != channels_.end()) return found->second.get();
  if (closed_) return nullptr;
  return channels_.emplace(std::pair{peer, send}, std::make_unique<Channel>()).first->second.get();
}

bool PeerChannels::post(int peer, bool send, std::function<void()> op, Meeting meeting) {
  Channel* c = channel(peer, send);
  if (c == nullptr) return false;
  if (c->queue->onQueueThread()) {
    op();
    return true;
  }
  if (!c->queue->push(std::move(op))) return false;
  if (meeting == Meeting::Counted) countMeeting(*c);  // before the caller goes on: see the class
  return true;
}

bool PeerChannels::onThreadOf(int peer, bool send) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = channels_.find({peer, send});
  return found != channels_.end() && found->second->queue->onQueueThread();
}

bool PeerChannels::closing() {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

braidComm_t PeerChannels::comm(int peer, bool send) {
  Channel& c = *channel(peer, send);  // exists: this runs on its thread
  if (c.comm == nullptr && c.failure.empty()) {
    try {
      c.comm = connect(peer, send);
    } catch (const std::exception& e) {
      c.failure = e.what();
    }
    meetingEnded(c);
  }
  if (c.comm == nullptr)
    failBackend("braid backend: the channel " + std::string(send ? "to" : "from") + " rank " +
                std::to_string(peer) + " could not be made: " + c.failure);
  return c.comm;
}

braidComm_t PeerChannels::receiveCommIfSenderCame(int peer) {
  Channel& c = *channel(peer, false);  // exists: this runs on its thread
  if (c.comm != nullptr || !c.failure.empty()) return comm(peer, false);
  if (!c.receiverSaid) {
    store_->set(channelKey(peer, false) + "/receiver", std::vector<uint8_t>{1});
    c.receiverSaid = true;
  }
  return store_->check({channelKey(peer, false) + "/id"}) ? comm(peer, false) : nullptr;
}

std::string PeerChannels::channelKey(int peer, bool send) const {
  const int from = send ? rank_ : peer, to = send ? peer : rank_;
  return keyPrefix_ + "p2p/" + device_ + "/" + std::to_string(from) + "-" + std::to_string(to);
}

std::chrono::milliseconds PeerChannels::waitLimit() const {
  return waitLimitOf(*store_, timeout_);
}

bool PeerChannels::receivesMet(int size) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank_) continue;
    const auto found = channels_.find({peer, false});
    if (found == channels_.end() || !found->second->met.load()) return false;
  }
  return true;
}

void PeerChannels::countMeeting(Channel& c) {
  if (c.met.load()) return;  // the steady state: no lock, no store
  std::lock_guard<std::mutex> lock(meetingsMutex_);
  if (!c.met.load() && !c.counted) c.counted = addMeetings(1);
}

void PeerChannels::meetingEnded(Channel& c) {
  std::lock_guard<std::mutex> lock(meetingsMutex_);
  c.met.store(true);
  if (c.counted) addMeetings(-1);
  c.counted = false;
}

void PeerChannels::resetMeetings(const c10::intrusive_ptr<c10d::Store>& store) {
  withoutPrefixes(store)->set(kMeetingsKey, std::vector<uint8_t>{'0'});
}

bool PeerChannels::addMeetings(int64_t delta) {
  try {
    jobStore_->add(kMeetingsKey, delta);
    return true;
  } catch (const std::exception&) {  // c10::Error, DistNetworkError: the store's host has gone
    return false;
  }
}

void PeerChannels::awaitMeetingsInFlight() {
  const std::chrono::milliseconds limit = waitLimit();
  int64_t left = 0;
  try {
    if (pollUntil(limit, [&] { return (left = jobStore_->add(kMeetingsKey, 0)) <= 0; })) return;
  } catch (const std::exception&) {  // the store's host has gone: nobody meets through it now
    return;
  }
  TORCH_WARN("braid backend: rank ", rank_, " leaves its group with ", left,
             " point-to-point channels of the job still meeting through the store after ",
             limit.count(), " ms (if this process holds the store's server, they will fail)");
}

// The receiver says it has come; then the sender makes the unique id (whose rendezvous lives
// for BRAID_TIMEOUT, so it is made only once both ranks are there) and hands it over. The sender,
// its communicator made or failed, deletes both keys (store hygiene: the keys are the group
// instance's, see commThroughStore).
braidComm_t PeerChannels::connect(int peer, bool send) {
  const std::string key = channelKey(peer, send);
  braidConfig_t config = commConfig(device_.c_str(), "torch-p2p", timeout_);
  if (device_ == "cpu") config.minChannels = config.maxChannels = 1;  // sends use one set of links
  const char* what = "braidCommInitRankConfig (point-to-point channel)";
  if (!send) {
    store_->set(key + "/receiver", std::vector<uint8_t>{1});
    return commThroughStore(*store_, key + "/id", 1, 2, config, timeout_,
                            "rank " + std::to_string(rank_) + " waited for rank " +
                                std::to_string(peer) + " to post its first send to it",
                            what);
  }
  awaitKeyOrFail(*store_, key + "/receiver", timeout_,
                 "rank " + std::to_string(rank_) + " waited for rank " + std::to_string(peer) +
                     " to post its first receive from it");
  const auto forgetReceiver = c10::make_scope_exit([&] { forgetKey(*store_, key + "/receiver"); });
  return commThroughStore(*store_, key + "/id", 0, 2, config, timeout_, "", what);
}

}  // namespace braid_torch
