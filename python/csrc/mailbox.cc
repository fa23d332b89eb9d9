#include "mailbox.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "common.h"

namespace braid_torch {
namespace {

// How a receive from any source looks on a channel: braidProbe, again after pauses growing to
// 1 ms (another channel may take it meanwhile).
constexpr std::chrono::microseconds kFirstPause(10), kLongestPause(1000);

std::exception_ptr backendError(const std::string& message) {
  try {
    failBackend(message);
  } catch (...) {
    return std::current_exception();
  }
}

std::exception_ptr shutDownError(int rank) {
  return backendError("braid backend: a receive on rank " + std::to_string(rank) +
                      " ended: the process group was shut down");
}

std::string dtypeName(int32_t dtype) {
  return std::string(c10::getDtypeNames(static_cast<c10::ScalarType>(dtype)).first);
}

// Whether the header is one sendTagged wrote: its sizes agree with its element type. Anything
// else is no envelope of this backend's (nothing to receive by it, nor room to receive it in).
bool consistent(const MessageHeader& head) {
  if (head.dtype < 0 || head.dtype >= static_cast<int32_t>(c10::ScalarType::NumOptions) ||
      head.numel < 0 || head.numel > (int64_t{1} << 56) || (head.inlined != 0 && head.inlined != 1))
    return false;
  const auto dtype = static_cast<c10::ScalarType>(head.dtype);
  const auto [type, count] = messageOf(dtype, static_cast<size_t>(head.numel));
  const auto bytes = static_cast<int64_t>(head.numel * c10::elementSize(dtype));
  return head.type == type && head.count == static_cast<int64_t>(count) && head.bytes == bytes &&
         (head.inlined == 0 || bytes <= int64_t{Envelope::kPayloadBytes});
}

void checkEnvelope(const MessageHeader& head, int rank, int peer) {
  if (!consistent(head))
    failBackend("braid backend: rank " + std::to_string(rank) + " received from rank " +
                std::to_string(peer) + " what is no message envelope of braid's (tag " +
                std::to_string(head.tag) + ", " + std::to_string(head.bytes) + " bytes)");
}

// Throws where the message does not fill the receive's tensor exactly (as NCCL's; Gloo also
// takes a larger tensor), naming both.
void failIfMismatch(const MessageHeader& head, const Flat& into, int rank, int peer) {
  const auto [type, count] = messageOf(into);
  if (head.type == type && head.count == static_cast<int64_t>(count) &&
      head.bytes == static_cast<int64_t>(into.flat.nbytes()))
    return;
  failBackend("braid backend: rank " + std::to_string(rank) + " received from rank " +
              std::to_string(peer) + " a message of " + std::to_string(head.numel) +
              " elements of " + dtypeName(head.dtype) + " (tag " + std::to_string(head.tag) +
              "), but its receive holds " + std::to_string(into.flat.numel()) + " elements of " +
              dtypeName(static_cast<int32_t>(into.flat.scalar_type())) +
              " (expected alike: a message fills its receive exactly)");
}

void copyBytes(void* to, const void* from, int64_t bytes) {
  if (bytes > 0) std::memcpy(to, from, static_cast<size_t>(bytes));  // an empty tensor's is null
}

// The envelope's (checked) message, received into a tensor of its own.
at::Tensor receiveMessage(braidComm_t comm, const Envelope& envelope) {
  const MessageHeader& head = envelope.head;
  at::Tensor data =
      at::empty({head.numel}, at::TensorOptions().dtype(static_cast<c10::ScalarType>(head.dtype)));
  if (head.inlined != 0)
    copyBytes(data.data_ptr(), envelope.payload, head.bytes);
  else if (head.count > 0)
    check(comm,
          braidRecv(data.data_ptr(), head.count, static_cast<braidDataType_t>(head.type), 0, comm,
                    nullptr),
          "braidRecv");
  return data;
}

}  // namespace

void sendTagged(braidComm_t comm, const at::Tensor& tensor, int64_t tag) {
  Flat f(tensor);
  const auto [type, count] = messageOf(f);
  const auto bytes = static_cast<int64_t>(f.flat.nbytes());
  const bool inlined = bytes <= int64_t{Envelope::kPayloadBytes};
  Envelope envelope{};
  envelope.head = {tag,
                   f.flat.numel(),
                   static_cast<int64_t>(count),
                   bytes,
                   type,
                   static_cast<int32_t>(f.flat.scalar_type()),
                   inlined ? 1 : 0,
                   0};
  if (inlined) copyBytes(envelope.payload, f.data(), bytes);
  check(comm, braidSend(&envelope, sizeof envelope, braidUint8, 1, comm, nullptr), "braidSend");
  if (!inlined) check(comm, braidSend(f.data(), count, type, 1, comm, nullptr), "braidSend");
}

void Mailbox::receive(int peer, int64_t tag, const at::Tensor& tensor, ReceiveDone done) {
  auto receive = std::make_shared<Posted>(tag, tensor, std::move(done),
                                          Clock::now() + channels_.waitLimit(), false);
  std::optional<Arrived> early;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    early = takeArrivedLocked(peer, tag);
    if (!early) inboxes_[peer].posted.push_back(receive);
  }
  if (early) return deliver(peer, *early, *receive);
  schedulePump(peer, receive, PeerChannels::Meeting::Counted);
}

void Mailbox::receiveFromAnySource(int64_t tag, const at::Tensor& tensor, ReceiveDone done) {
  auto receive = std::make_shared<Posted>(tag, tensor, std::move(done),
                                          Clock::now() + channels_.waitLimit(), true);
  // Its channels' first meetings count as one while it waits: most of their senders never come.
  if (!channels_.receivesMet(size_)) receive->inFlight.emplace(channels_);
  std::optional<std::pair<int, Arrived>> early;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int peer = 0; peer < size_ && !early; ++peer)
      if (std::optional<Arrived> message = takeArrivedLocked(peer, tag))
        early.emplace(peer, std::move(*message));
    if (!early)
      for (int peer = 0; peer < size_; ++peer)
        if (peer != rank_) inboxes_[peer].posted.push_back(receive);
  }
  if (early) return deliver(early->first, early->second, *receive);
  // Posted on one of these channels' threads (a completing receive's callback), that channel's
  // pump runs at once: the others are posted first, so that they look meanwhile.
  for (bool onItsThread : {false, true})
    for (int peer = 0; peer < size_; ++peer)
      if (peer != rank_ && channels_.onThreadOf(peer, false) == onItsThread)
        schedulePump(peer, receive, PeerChannels::Meeting::NotCounted);
}

void Mailbox::schedulePump(int peer, const std::shared_ptr<Posted>& receive,
                           PeerChannels::Meeting meeting) {
  if (!channels_.post(
          peer, false, [this, peer, receive] { pump(peer, receive); }, meeting))
    abandon(receive, shutDownError(rank_));
}

void Mailbox::close() {
  std::vector<std::shared_ptr<Posted>> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Inbox& inbox : inboxes_) {
      for (std::shared_ptr<Posted>& receive : inbox.posted)
        if (std::find(waiting.begin(), waiting.end(), receive) == waiting.end())
          waiting.push_back(std::move(receive));
      inbox = Inbox{};
    }
  }
  for (const std::shared_ptr<Posted>& receive : waiting) finish(*receive, -1, shutDownError(rank_));
}

// For a receive from `peer`, the next envelope is waited for there (braidRecv, within the
// channel's timeout); for one from any source, braidProbe looks, so that the receive may end
// elsewhere meanwhile (and the pump with it). Receives posted meanwhile are seen on the next turn.
void Mailbox::pump(int peer, const std::shared_ptr<Posted>& receive) {
  const bool directed = !receive->anySource;
  std::chrono::microseconds pause = kFirstPause;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!waitsOnLocked(peer, receive)) return;
    }
    try {
      braidComm_t comm =
          directed ? channels_.comm(peer, false) : channels_.receiveCommIfSenderCame(peer);
      int messages = 0;
      if (!directed && comm != nullptr)
        check(comm, braidProbe(0, comm, &messages, nullptr, nullptr), "braidProbe");
      if (!directed && messages == 0) {
        expire(peer);
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, kLongestPause);
        continue;
      }
      pause = kFirstPause;
      Envelope envelope;
      check(comm, braidRecv(&envelope, sizeof envelope, braidUint8, 0, comm, nullptr), "braidRecv");
      take(peer, comm, envelope);
      expire(peer);
    } catch (...) {
      failOn(peer, receive, std::current_exception());
    }
  }
}

void Mailbox::take(int peer, braidComm_t comm, const Envelope& envelope) {
  const MessageHeader& head = envelope.head;
  checkEnvelope(head, rank_, peer);
  std::shared_ptr<Posted> receive;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    receive = claimLocked(peer, head.tag);
  }
  if (receive) return deliverFromWire(peer, comm, envelope, *receive);
  Arrived message{head, receiveMessage(comm, envelope)};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    receive = claimLocked(peer, head.tag);  // posted while the message came?
    if (!receive) return inboxes_[peer].arrived.push_back(std::move(message));
  }
  deliver(peer, message, *receive);
}

// The message written into the receive's flat tensor by `fill`, as the receive's poster would
// write it; the error that stopped it, if any.
template <typename Fill>
std::exception_ptr Mailbox::writeInto(int peer, const MessageHeader& head, Posted& receive,
                                      Fill fill) {
  try {
    at::ThreadLocalStateGuard asPoster(receive.state);
    at::NoGradGuard noGrad;
    Flat into(receive.tensor);
    failIfMismatch(head, into, rank_, peer);
    fill(into.data());
    into.writeBack();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

void Mailbox::deliverFromWire(int peer, braidComm_t comm, const Envelope& envelope,
                              Posted& receive) {
  const MessageHeader& head = envelope.head;
  bool consumed = head.inlined != 0 || head.count == 0;
  std::exception_ptr error = writeInto(peer, head, receive, [&](void* to) {
    if (head.inlined != 0) return copyBytes(to, envelope.payload, head.bytes);
    if (consumed) return;
    consumed = true;
    check(comm,
          braidRecv(to, head.count, static_cast<braidDataType_t>(head.type), 0, comm, nullptr),
          "braidRecv");
  });
  if (!consumed) {  // the receive failed before taking it: the next envelope follows it
    try {
      receiveMessage(comm, envelope);
    } catch (...) {
    }
  }
  finish(receive, error ? -1 : peer, error);
}

void Mailbox::deliver(int peer, const Arrived& message, Posted& receive) {
  std::exception_ptr error = writeInto(peer, message.head, receive, [&](void* to) {
    copyBytes(to, message.data.data_ptr(), message.head.bytes);
  });
  finish(receive, error ? -1 : peer, error);
}

void Mailbox::finish(Posted& receive, int source, std::exception_ptr error) {
  receive.inFlight.reset();  // only its finisher gets here
  receive.done(source, std::move(error));
}

void Mailbox::expire(int peer) {
  const bool closing = channels_.closing();
  const Clock::time_point now = Clock::now();
  std::vector<std::shared_ptr<Posted>> expired;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const std::shared_ptr<Posted>& receive : inboxes_[peer].posted)
      if (now > receive->deadline || (closing && receive->anySource)) expired.push_back(receive);
    for (const std::shared_ptr<Posted>& receive : expired) removeLocked(receive);
  }
  for (const std::shared_ptr<Posted>& receive : expired)
    finish(*receive, -1, now > receive->deadline ? timedOut(peer, *receive) : shutDownError(rank_));
}

std::exception_ptr Mailbox::timedOut(int peer, const Posted& receive) const {
  const std::string after =
      "Timed out after " + std::to_string(channels_.waitLimit().count()) + " ms, ";
  const std::string tag = " (tag " + std::to_string(receive.tag) + "): ";
  if (receive.anySource)
    return backendError("braid backend: a receive from any source on rank " +
                        std::to_string(rank_) + tag + after +
                        "no rank sent it a message of its tag");
  return backendError("braid backend: a receive on rank " + std::to_string(rank_) + " from rank " +
                      std::to_string(peer) + tag + after + "rank " + std::to_string(peer) +
                      " sent it no message of its tag");
}

void Mailbox::failOn(int peer, const std::shared_ptr<Posted>& receive, std::exception_ptr error) {
  bool ends = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!waitsOnLocked(peer, receive)) return;  // ended meanwhile
    std::deque<std::shared_ptr<Posted>>& posted = inboxes_[peer].posted;
    posted.erase(std::find(posted.begin(), posted.end(), receive));
    ends = true;
    if (receive->anySource)
      for (int other = 0; other < size_ && ends; ++other) ends = !waitsOnLocked(other, receive);
  }
  if (ends) finish(*receive, -1, std::move(error));
}

void Mailbox::abandon(const std::shared_ptr<Posted>& receive, std::exception_ptr error) {
  bool waiting = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int peer = 0; peer < size_ && !waiting; ++peer) waiting = waitsOnLocked(peer, receive);
    if (waiting) removeLocked(receive);
  }
  if (waiting) finish(*receive, -1, std::move(error));
}

bool Mailbox::waitsOnLocked(int peer, const std::shared_ptr<Posted>& receive) const {
  const std::deque<std::shared_ptr<Posted>>& posted = inboxes_[peer].posted;
  return std::find(posted.begin(), posted.end(), receive) != posted.end();
}

std::shared_ptr<Mailbox::Posted> Mailbox::claimLocked(int peer, int64_t tag) {
  const std::deque<std::shared_ptr<Posted>>& posted = inboxes_[peer].posted;
  const auto found = std::find_if(posted.begin(), posted.end(),
                                  [tag](const auto& receive) { return receive->tag == tag; });
  if (found == posted.end()) return nullptr;
  std::shared_ptr<Posted> receive = *found;
  removeLocked(receive);
  return receive;
}

std::optional<Mailbox::Arrived> Mailbox::takeArrivedLocked(int peer, int64_t tag) {
  std::deque<Arrived>& arrived = inboxes_[peer].arrived;
  const auto found = std::find_if(arrived.begin(), arrived.end(), [tag](const Arrived& message) {
    return message.head.tag == tag;
  });
  if (found == arrived.end()) return std::nullopt;
  Arrived message = std::move(*found);
  arrived.erase(found);
  return message;
}

void Mailbox::removeLocked(const std::shared_ptr<Posted>& receive) {
  for (Inbox& inbox : inboxes_)
    inbox.posted.erase(std::remove(inbox.posted.begin(), inbox.posted.end(), receive),
                       inbox.posted.end());
}

}  // namespace braid_torch
