#include "core/window_table.h"

#include <string_view>

#include "base/error.h"
#include "base/random.h"
#include "kernels/host_reduce.h"

namespace braid {
namespace {

// The fields a signature covers, hashed as bytes (every field written, padding zeroed).
struct SignedCall {
  uint64_t count;
  uint64_t sendWindow, sendOffset, recvWindow, recvOffset;
  uint32_t collective, type, op, inPlace;
};

uint64_t signatureOf(SignedCall call) {
  return fnv1a(std::string_view(reinterpret_cast<const char*>(&call), sizeof call));
}

SignedCall signedFields(const CollArgs& a) {
  SignedCall s{};
  s.count = a.count;
  s.collective = static_cast<uint32_t>(a.coll);
  s.type = static_cast<uint32_t>(a.type);
  s.op = static_cast<uint32_t>(a.op);
  return s;
}

// Window ids start at 1, so a signature with windows never equals one without.
constexpr uint64_t kNoWindow = 0;

}  // namespace

uint64_t directSignature(const CollArgs& a) {
  return signatureOf(signedFields(a));
}

void WindowTable::add(uint64_t id, size_t size, std::vector<uintptr_t> bases) {
  if (id == kNoWindow || static_cast<int>(bases.size()) != nranks_)
    fail(braidInternalError, "rank {}: window {} with {} bases ({} ranks)", rank_, id, bases.size(),
         nranks_);
  const std::lock_guard<std::mutex> lock(mutex_);
  windows_.push_back({id, size, std::move(bases)});
}

void WindowTable::remove(uint64_t id) {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(windows_, [&](const Window& w) { return w.id == id; });
}

std::optional<WindowTable::Place> WindowTable::find(const void* p, size_t bytes) const {
  const auto at = reinterpret_cast<uintptr_t>(p);
  for (const Window& w : windows_) {  // registration order: the oldest first
    const uintptr_t base = w.bases[rank_];
    if (at >= base && at - base <= w.size && bytes <= w.size - (at - base))
      return Place{&w, at - base};
  }
  return std::nullopt;
}

std::optional<WindowCall> WindowTable::locate(const CollArgs& a) const {
  const bool direct = a.coll == Collective::AllReduce || a.coll == Collective::ReduceScatter ||
                      a.coll == Collective::AllGather;
  if (!direct || nranks_ > kMaxWindowRanks || a.count == 0) return std::nullopt;
  const size_t bytes = a.count * kernels::typeSize(a.type);
  const size_t n = static_cast<size_t>(nranks_), mine = static_cast<size_t>(rank_) * bytes;
  const size_t sendBytes = a.coll == Collective::ReduceScatter ? n * bytes : bytes;
  const size_t recvBytes = a.coll == Collective::AllGather ? n * bytes : bytes;
  const auto* send = static_cast<const uint8_t*>(a.sendbuff);
  const auto* recv = static_cast<const uint8_t*>(a.recvbuff);
  // In place each rank's buffers sit at offsets of its own (rank * bytes apart), so the peers'
  // are derived from the one buffer that holds both, not from this rank's offsets.
  const bool inPlace = a.coll == Collective::AllReduce       ? send == recv
                       : a.coll == Collective::ReduceScatter ? recv == send + mine
                                                             : send == recv + mine;
  SignedCall s = signedFields(a);
  s.inPlace = inPlace;
  WindowCall call;
  const std::lock_guard<std::mutex> lock(mutex_);
  if (inPlace) {
    const bool whole = a.coll == Collective::ReduceScatter;  // the buffer both lie in
    const std::optional<Place> place = whole ? find(send, sendBytes) : find(recv, recvBytes);
    if (!place) return std::nullopt;
    s.recvWindow = place->window->id;
    s.recvOffset = place->offset;
    for (int r = 0; r < nranks_; ++r) {
      auto* buffer = reinterpret_cast<uint8_t*>(place->window->bases[r] + place->offset);
      uint8_t* block = a.coll == Collective::AllReduce ? buffer : buffer + r * bytes;
      call.inputs[r] = a.coll == Collective::AllGather ? block : buffer;
      call.outputs[r] = a.coll == Collective::ReduceScatter ? block : buffer;
    }
  } else {
    const std::optional<Place> in = find(send, sendBytes), out = find(recv, recvBytes);
    if (!in || !out) return std::nullopt;
    s.sendWindow = in->window->id;
    s.sendOffset = in->offset;
    s.recvWindow = out->window->id;
    s.recvOffset = out->offset;
    for (int r = 0; r < nranks_; ++r) {
      call.inputs[r] = reinterpret_cast<const void*>(in->window->bases[r] + in->offset);
      call.outputs[r] = reinterpret_cast<void*>(out->window->bases[r] + out->offset);
    }
  }
  call.signature = signatureOf(s);
  return call;
}

}  // namespace braid
