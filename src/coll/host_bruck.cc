#include "coll/host_bruck.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "coll/host_exchange.h"
#include "coll/ring_engine.h"
#include "kernels/host_reduce.h"

namespace braid {
namespace {

// A step's run of `blocks` consecutive blocks (in ring order) as one stream of bytes: visit(block,
// offset in it, offset in the stream's piece, bytes) for each block's part of the piece that starts
// `at` bytes into the stream.
template <class Visit>
void forEachPart(size_t blockBytes, size_t at, size_t bytes, Visit&& visit) {
  for (size_t done = 0; done < bytes;) {
    const size_t block = (at + done) / blockBytes, offset = (at + done) % blockBytes;
    const size_t part = std::min(blockBytes - offset, bytes - done);
    visit(static_cast<int>(block), offset, done, part);
    done += part;
  }
}

// This rank's place in the ring and the ranks at distances from it.
struct Ring {
  const CollContext& ctx;
  int position;
  explicit Ring(const CollContext& c)
      : ctx(c), position(ringPosition(c.ringOrder.data(), c.nranks, c.rank)) {}
  int rankAt(int distance) const {
    return ctx.ringOrder[modRanks(position + distance, ctx.nranks)];
  }
  // Distance 2^k for each step k, the first step's distance 1.
  int steps() const { return std::bit_width(static_cast<unsigned>(ctx.nranks - 1)); }
  // Blocks moved at distance d: min(d, n - d).
  int blocksAt(int distance) const { return std::min(distance, ctx.nranks - distance); }
};

}  // namespace

void runBruckAllGather(CollContext& ctx, const CollArgs& a, const CallTag& tag) {
  const size_t elemBytes = kernels::typeSize(a.type);
  const size_t blockBytes = a.count * elemBytes;
  auto* out = static_cast<uint8_t*>(a.recvbuff);
  const Ring ring(ctx);
  // The output block of the rank `distance` after this one.
  auto blockAt = [&](int distance) { return out + ring.rankAt(distance) * blockBytes; };
  if (a.sendbuff != blockAt(0)) std::memcpy(blockAt(0), a.sendbuff, blockBytes);
  for (int k = 0; k < ring.steps(); ++k) {
    const int d = 1 << k;
    const size_t bytes = ring.blocksAt(d) * blockBytes;
    exchangePieces(
        ctx, tag, ring.rankAt(-d), ring.rankAt(d), bytes, bytes, elemBytes,
        [&](uint8_t* slot, size_t at, size_t piece) {
          forEachPart(blockBytes, at, piece, [&](int block, size_t offset, size_t in, size_t n) {
            std::memcpy(slot + in, blockAt(block) + offset, n);
          });
        },
        [&](const uint8_t* slot, size_t at, size_t piece) {
          forEachPart(blockBytes, at, piece, [&](int block, size_t offset, size_t in, size_t n) {
            std::memcpy(blockAt(d + block) + offset, slot + in, n);
          });
        });
  }
}

void runBruckReduceScatter(CollContext& ctx, const CollArgs& a, const CallTag& tag) {
  const size_t elemBytes = kernels::typeSize(a.type);
  const size_t blockBytes = a.count * elemBytes;
  const kernels::ReduceFn reduce = kernels::reduceFn(a.type, a.op);
  const auto* in = static_cast<const uint8_t*>(a.sendbuff);
  auto* out = static_cast<uint8_t*>(a.recvbuff);
  auto* scratch = static_cast<uint8_t*>(ctx.scratch);
  const Ring ring(ctx);
  auto inputAt = [&](int distance) { return in + ring.rankAt(distance) * blockBytes; };
  // The partial sum of the block `distance` after this rank, once a step has added to it: its own
  // in the output, the others in the scratch. `summed` counts the blocks from this rank's on that
  // have partial sums (every step adds to the first ones).
  auto sumAt = [&](int distance) {
    return distance == 0 ? out : scratch + (distance - 1) * blockBytes;
  };
  int summed = 0;
  auto partialAt = [&](int distance) {
    return distance < summed ? sumAt(distance) : inputAt(distance);
  };
  for (int k = ring.steps() - 1; k >= 0; --k) {
    const int d = 1 << k;
    const int blocks = ring.blocksAt(d);
    const size_t bytes = blocks * blockBytes;
    const int divisor = k == 0 && a.op == braidAvg ? ctx.nranks : 1;
    exchangePieces(
        ctx, tag, ring.rankAt(d), ring.rankAt(-d), bytes, bytes, elemBytes,
        [&](uint8_t* slot, size_t at, size_t piece) {
          forEachPart(blockBytes, at, piece, [&](int block, size_t offset, size_t into, size_t n) {
            std::memcpy(slot + into, partialAt(d + block) + offset, n);
          });
        },
        [&](const uint8_t* slot, size_t at, size_t piece) {
          forEachPart(blockBytes, at, piece, [&](int block, size_t offset, size_t from, size_t n) {
            reduce(sumAt(block) + offset, nullptr, partialAt(block) + offset, slot + from,
                   n / elemBytes, divisor);
          });
        });
    summed = std::max(summed, blocks);
  }
}

}  // namespace braid
