// Exchanges between host ranks a FIFO slot at a time: the recursive all-reduces' between partners
// (coll/host_recursive.cc) and Bruck's steps, which send to one rank while receiving from another
// (coll/host_bruck.cc).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "coll/call_tag.h"
#include "coll/host_executor.h"

namespace braid {

// Where a send's pieces go from: copied into the FIFO's slots, or, where the link's reader takes a
// payload where it lies (a network proxy: SendConnector::postFrom), from the buffer itself, which
// must then stay unchanged until the link has taken it (awaitTaken).
enum class SendFrom { Slot, Place };

// Sends `sendBytes` to rank `to` while receiving `recvBytes` from rank `from` (the same rank or
// another), a FIFO slot at a time: fill(slot, offset, bytes) writes each piece into its slot, or,
// where `place` names the bytes contiguously and the link takes a payload where it lies, the piece
// goes from there; take(slot, offset, bytes) gets each received piece before its slot is freed.
// Every rank posts piece k before it waits for the piece k it receives, so messages larger than a
// FIFO never stall, between partners or round a cycle of ranks.
template <class Fill, class Take>
void exchangePieces(CollContext& ctx, const CallTag& tag, int to, int from, size_t sendBytes,
                    size_t recvBytes, size_t elemBytes, Fill&& fill, Take&& take,
                    const uint8_t* place = nullptr) {
  SendConnector& sink = *ctx.sendTo[to];
  RecvConnector& source = *ctx.recvFrom[from];
  const bool inPlace = place != nullptr && sink.postsFromPlace();
  const size_t sendPiece = sink.slotBytes() / elemBytes * elemBytes;
  const size_t recvPiece = source.slotBytes() / elemBytes * elemBytes;
  for (size_t sent = 0, got = 0; sent < sendBytes || got < recvBytes;) {
    if (sent < sendBytes) {
      const size_t piece = std::min(sendPiece, sendBytes - sent);
      if (inPlace) {
        sink.postFrom(place + sent, piece, tag, *ctx.dog);
      } else {
        fill(static_cast<uint8_t*>(sink.acquire(*ctx.dog)), sent, piece);
        sink.post(piece, tag);
      }
      sent += piece;
    }
    if (got < recvBytes) {
      const size_t piece = std::min(recvPiece, recvBytes - got);
      take(static_cast<const uint8_t*>(receive(source, tag, piece, *ctx.dog)), got, piece);
      source.release();
      got += piece;
    }
  }
}

// Sends `sendBytes` from `send` to `peer` while receiving `recvBytes` from it. From a slot, a piece
// is copied in before `take` may overwrite where it came from (the pieces of both directions are
// alike: every link of a communicator has one FIFO geometry); from its place, `take` must not
// write where the send lies.
template <class Take>
void exchange(CollContext& ctx, const CallTag& tag, int peer, const uint8_t* send, size_t sendBytes,
              size_t recvBytes, size_t elemBytes, Take&& take, SendFrom from = SendFrom::Slot) {
  exchangePieces(
      ctx, tag, peer, peer, sendBytes, recvBytes, elemBytes,
      [send](uint8_t* slot, size_t at, size_t bytes) { std::memcpy(slot, send + at, bytes); }, take,
      from == SendFrom::Place ? send : nullptr);
}

// For sends alone.
inline constexpr auto kTakeNothing = [](const uint8_t*, size_t, size_t) {};

}  // namespace braid
