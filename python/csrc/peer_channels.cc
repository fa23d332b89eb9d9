#include "peer_channels.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "common.h"

namespace braid_torch {

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

bool PeerChannels::post(int peer, bool send, std::function<void()> op) {
  Channel* c = channel(peer, send);
  if (c == nullptr) return false;
  if (c->queue->onQueueThread()) {
    op();
    return true;
  }
  return c->queue->push(std::move(op));
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
  return "braid_torch/p2p/" + device_ + "/" + std::to_string(from) + "-" + std::to_string(to);
}

// Waits until `key` is set (keySetWithin: without holding the store, which would keep this
// rank's other channels from publishing their keys).
std::chrono::milliseconds PeerChannels::waitLimit() const {
  return timeout_.count() > 0
             ? timeout_
             : std::chrono::duration_cast<std::chrono::milliseconds>(store_->getTimeout());
}

void PeerChannels::awaitKey(const std::string& key, const char* what, int peer) {
  const std::chrono::milliseconds limit = waitLimit();
  if (!keySetWithin(*store_, key, limit))
    failBackend("braid backend: Timed out: rank " + std::to_string(rank_) + " waited " +
                std::to_string(limit.count()) + " ms for rank " + std::to_string(peer) +
                " to post its first " + what + " rank " + std::to_string(rank_));
}

// The receiver says it has come; then the sender makes the unique id (whose rendezvous lives
// for BRAID_TIMEOUT, so it is made only once both ranks are there) and hands it over.
braidComm_t PeerChannels::connect(int peer, bool send) {
  const std::string key = channelKey(peer, send);
  braidUniqueId id;
  if (send) {
    awaitKey(key + "/receiver", "receive from", peer);
    check(nullptr, braidGetUniqueId(&id), "braidGetUniqueId");
    store_->set(key + "/id", std::vector<uint8_t>(id.internal, id.internal + sizeof id.internal));
  } else {
    store_->set(key + "/receiver", std::vector<uint8_t>{1});
    awaitKey(key + "/id", "send to", peer);
    const std::vector<uint8_t> bytes = store_->get(key + "/id");
    TORCH_CHECK(bytes.size() == sizeof id.internal, "braid backend: the store's unique id of ", key,
                " has ", bytes.size(), " bytes (expected ", sizeof id.internal, ")");
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  braidConfig_t config = commConfig(device_.c_str(), "torch-p2p", timeout_);
  if (device_ == "cpu") config.minChannels = config.maxChannels = 1;  // sends use one set of links
  braidComm_t made = nullptr;
  check(nullptr, braidCommInitRankConfig(&made, 2, id, send ? 0 : 1, &config),
        "braidCommInitRankConfig (point-to-point channel)");
  return made;
}

}  // namespace braid_torch
