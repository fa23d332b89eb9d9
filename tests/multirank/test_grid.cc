// The multirank correctness grid: every collective of nccl.h (braidBroadcast and braidBcast,
// AlltoAll, Gather and Scatter included) x dtype (fp8 included) x op (PreMulSum included) x
// in-place/out-of-place x count x nranks, with ranks as threads, as processes, as communicators of
// one thread driven through group calls, and as communicators made by braidCommSplit. Before each
// run every buffer is filled with inputs or poison; after it every element of every buffer (send
// buffers too) is compared with a reference computed from the input generators of grid_common.h,
// never by braid.
//
// One ctest entry per (launch mode, nranks, collective), e.g. .../threads_4ranks_allreduce. What
// each runs, in this order ("reducing" = allreduce, reducescatter, reduce; count = recvcount for
// reducescatter, sendcount for allgather, per-peer count for alltoall, gather and scatter):
//  counts 0, 1, 7, 1031: the full product: every dtype x every op (reducing) x in-place and
//    out-of-place (sendrecv and alltoall: out of place; bcast: in place) x roots (broadcast and
//    bcast: every root; reduce, gather, scatter: 0 and nranks-1) x exchanges (sendrecv: ring to
//    rank+1 and to itself, each inside one group).
//  count 1 Mi + 3 (beyond the 1 MiB FIFO in every dtype, beyond 4 MiB in 4- and 8-byte ones):
//    every dtype but fp8 (bcast, alltoall, gather, scatter: int8, float16, float32, uint64), in and
//    out of place, roots 0 and nranks-1, ring and self; reducing with sum, and with prod, max, min,
//    avg and premulsum for int8, float16 and float32 out of place.
//  count 4 MiB / element size + 7 (beyond 4 MiB) for int8, uint8, float16 and bfloat16, the
//    ring collectives and sendrecv: as 1 Mi + 3, reducing with sum only.
//  count 384 KiB / element size + 5 (three 128 KiB FIFO slots and a short piece, within one FIFO:
//    across hosts the one-shot all-reduce sends it in slot-sized pieces) for float16, float32 and
//    uint64, all-reduce only: in and out of place with sum, and every op for float32 out of place.
//  onethread entries (braidCommInitAll; every rank's call inside one group from one thread) and
//    split entries (each rank's communicator split from a world of nranks + 1, whose last rank
//    takes no color, keys reversing the order): counts 0, 7, 1031 as above with roots 0 and
//    nranks-1, and 1 Mi + 3 for float32 (reducing: sum) in and out of place.
// PreMulSum makes its operator on every rank before the call (scalar read at creation on even
// cases, at the call on odd ones) and destroys it after.
// Every buffer starts 0 to 7 elements past a 64-byte boundary and lies between 64-byte guards
// that must stay poisoned.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "multirank/grid_common.h"
#include "multirank/rank_launcher.h"

namespace braid_test {
namespace {

enum class Collective {
  AllReduce,
  ReduceScatter,
  AllGather,
  Broadcast,
  Reduce,
  SendRecv,
  Bcast,
  AlltoAll,
  Gather,
  Scatter
};
constexpr Collective kAllCollectives[] = {
    Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather, Collective::Broadcast,
    Collective::Reduce,    Collective::SendRecv,      Collective::Bcast,     Collective::AlltoAll,
    Collective::Gather,    Collective::Scatter};

const char* collectiveName(Collective collective) {
  switch (collective) {
    case Collective::AllReduce: return "allreduce";
    case Collective::ReduceScatter: return "reducescatter";
    case Collective::AllGather: return "allgather";
    case Collective::Broadcast: return "broadcast";
    case Collective::Reduce: return "reduce";
    case Collective::SendRecv: return "sendrecv";
    case Collective::Bcast: return "bcast";
    case Collective::AlltoAll: return "alltoall";
    case Collective::Gather: return "gather";
    case Collective::Scatter: return "scatter";
  }
  return "?";
}

bool reduces(Collective collective) {
  return collective == Collective::AllReduce || collective == Collective::ReduceScatter ||
         collective == Collective::Reduce;
}

bool hasRoot(Collective collective) {
  return collective == Collective::Broadcast || collective == Collective::Reduce ||
         collective == Collective::Bcast || collective == Collective::Gather ||
         collective == Collective::Scatter;
}

// nccl.h's collectives built from sends and receives, beside the ring ones.
bool personalized(Collective collective) {
  return collective == Collective::Bcast || collective == Collective::AlltoAll ||
         collective == Collective::Gather || collective == Collective::Scatter;
}

struct GridCase {
  Collective collective;
  braidDataType_t type;
  braidRedOp_t op;  // reducing collectives only
  bool inPlace;
  size_t count;   // recvcount for reduce-scatter, sendcount for all-gather
  int root;       // broadcast and reduce
  int peerShift;  // send/recv: every rank sends to rank + peerShift (1: ring, 0: itself)
  uint64_t salt;  // gives every case inputs of its own, so stale data cannot pass for a result
};

std::string describe(const GridCase& c, int nranks) {
  std::string text = std::string(collectiveName(c.collective)) + " " + dtypeName(c.type);
  if (reduces(c.collective)) text += std::string(" ") + opName(c.op);
  text += c.inPlace ? " in-place" : " out-of-place";
  text += " count=" + std::to_string(c.count);
  if (hasRoot(c.collective)) text += " root=" + std::to_string(c.root);
  if (c.collective == Collective::SendRecv) text += c.peerShift ? " ring" : " self";
  return text + " nranks=" + std::to_string(nranks);
}

enum class Coverage { Full, Light };  // Light: the onethread and split entries

constexpr size_t kSmallCounts[] = {0, 1, 7, 1031};
constexpr size_t kOneThreadSmallCounts[] = {0, 7, 1031};
constexpr size_t kLargeCount = (size_t{1} << 20) + 3;
// "Beyond the FIFO": four times the default BRAID_BUFFSIZE of 1 MiB per connector.
constexpr size_t kBeyondFifoBytes = size_t{4} << 20;
constexpr size_t kPiecesBytes = size_t{384} << 10;

enum class CountClass { Small, Large, BeyondFifo, Pieces };

// Which ops and placements run at each count (see the top of the file).
bool covered(Coverage coverage, Collective collective, CountClass countClass, braidDataType_t type,
             braidRedOp_t op, bool inPlace) {
  if (countClass == CountClass::Small) return true;
  if (coverage == Coverage::Light) return type == braidFloat32 && op == braidSum;
  // fp8 moves like uint8 and reduces with kernels test_reduce_kernels checks exhaustively.
  if (type == braidFloat8e4m3 || type == braidFloat8e5m2) return false;
  if (countClass == CountClass::Pieces)
    return collective == Collective::AllReduce &&
           (op == braidSum || (type == braidFloat32 && !inPlace));
  if (personalized(collective)) {
    return countClass == CountClass::Large && (type == braidInt8 || type == braidFloat16 ||
                                               type == braidFloat32 || type == braidUint64);
  }
  if (op == braidSum) return true;
  return countClass == CountClass::Large && !inPlace &&
         (type == braidInt8 || type == braidFloat16 || type == braidFloat32);
}

std::vector<GridCase> gridCases(Collective collective, int nranks, Coverage coverage) {
  std::vector<GridCase> cases;
  std::vector<braidRedOp_t> ops = {braidSum};
  if (reduces(collective)) ops.assign(std::begin(kAllOps), std::end(kAllOps));
  std::vector<bool> placements = {false};
  if (collective == Collective::Bcast) placements = {true};
  if (collective != Collective::SendRecv && collective != Collective::AlltoAll &&
      collective != Collective::Bcast)
    placements.push_back(true);
  std::vector<int> peerShifts = {0};
  if (collective == Collective::SendRecv && nranks > 1) peerShifts = {1, 0};

  auto addVariants = [&](CountClass countClass, size_t count, braidDataType_t type) {
    std::vector<int> roots = {0};
    if (hasRoot(collective) && nranks > 1) roots.push_back(nranks - 1);
    if ((collective == Collective::Broadcast || collective == Collective::Bcast) &&
        countClass == CountClass::Small && coverage == Coverage::Full) {
      for (int root = 1; root < nranks - 1; ++root) roots.push_back(root);
    }
    for (braidRedOp_t op : ops) {
      for (bool inPlace : placements) {
        if (!covered(coverage, collective, countClass, type, op, inPlace)) continue;
        for (int root : roots) {
          for (int shift : peerShifts) {
            const uint64_t salt = mixBits(0x62726169640aULL, 0, cases.size());
            cases.push_back({collective, type, op, inPlace, count, root, shift, salt});
          }
        }
      }
    }
  };

  const bool light = coverage == Coverage::Light;
  const std::span<const size_t> smallCounts = light ? std::span<const size_t>(kOneThreadSmallCounts)
                                                    : std::span<const size_t>(kSmallCounts);
  for (size_t count : smallCounts) {
    for (braidDataType_t type : kAllDtypes) addVariants(CountClass::Small, count, type);
  }
  for (braidDataType_t type : kAllDtypes) addVariants(CountClass::Large, kLargeCount, type);
  if (light || personalized(collective)) return cases;
  for (braidDataType_t type : {braidInt8, braidUint8, braidFloat16, braidBfloat16})
    addVariants(CountClass::BeyondFifo, kBeyondFifoBytes / dtypeSize(type) + 7, type);
  for (braidDataType_t type : {braidFloat16, braidFloat32, braidUint64})
    addVariants(CountClass::Pieces, kPiecesBytes / dtypeSize(type) + 5, type);
  return cases;
}

// What one stretch of a buffer holds before or after the call.
struct Segment {
  enum Kind { kPoison, kInput, kReduced } kind;
  size_t offset;  // elements into the buffer
  size_t length;
  int rank;      // kInput: whose input
  size_t index;  // input or reduction index of the first element
};

Segment poison(size_t offset, size_t length) {
  return {Segment::kPoison, offset, length, -1, 0};
}
Segment input(int rank, size_t offset, size_t length, size_t index) {
  return {Segment::kInput, offset, length, rank, index};
}
Segment reduced(size_t offset, size_t length, size_t index) {
  return {Segment::kReduced, offset, length, -1, index};
}

struct BufferPlan {
  const char* name = "";
  size_t elements = 0;
  std::vector<Segment> before, after;
};

// One rank's buffers for one case. In place there is one buffer (recv), and sendbuff and recvbuff
// point into it at the offsets nccl.h defines.
struct RankPlan {
  BufferPlan send;
  BufferPlan recv;
  size_t sendOffset = 0;
  size_t recvOffset = 0;
};

RankPlan planFor(const GridCase& c, int rank, int nranks) {
  const size_t count = c.count;
  const size_t all = count * nranks;
  const size_t mine = count * rank;
  const bool sendsAll = c.collective == Collective::ReduceScatter ||
                        c.collective == Collective::AlltoAll || c.collective == Collective::Scatter;
  const size_t sendElements = sendsAll ? all : count;
  const Segment ownInput = input(rank, 0, sendElements, 0);
  RankPlan plan;
  if (!c.inPlace) {
    plan.send = {"sendbuff (must stay unchanged)", sendElements, {ownInput}, {ownInput}};
  }
  switch (c.collective) {
    case Collective::AllReduce:
    case Collective::Reduce: {
      const bool getsResult = c.collective == Collective::AllReduce || rank == c.root;
      if (c.inPlace) {
        plan.recv = {"buffer", count, {ownInput}, {getsResult ? reduced(0, count, 0) : ownInput}};
      } else {
        plan.recv = {"recvbuff",
                     count,
                     {poison(0, count)},
                     {getsResult ? reduced(0, count, 0) : poison(0, count)}};
      }
      break;
    }
    case Collective::Broadcast:
      plan.recv = {c.inPlace ? "buffer" : "recvbuff",
                   count,
                   {c.inPlace && rank == c.root ? ownInput : poison(0, count)},
                   {input(c.root, 0, count, 0)}};
      break;
    case Collective::ReduceScatter:
      if (c.inPlace) {
        plan.recv = {"buffer",
                     all,
                     {ownInput},
                     {input(rank, 0, mine, 0), reduced(mine, count, mine),
                      input(rank, mine + count, all - mine - count, mine + count)}};
        plan.recvOffset = mine;
      } else {
        plan.recv = {"recvbuff", count, {poison(0, count)}, {reduced(0, count, mine)}};
      }
      break;
    case Collective::AllGather: {
      std::vector<Segment> gathered;
      for (int from = 0; from < nranks; ++from) {
        gathered.push_back(input(from, count * from, count, 0));
      }
      if (c.inPlace) {
        plan.recv = {"buffer",
                     all,
                     {poison(0, mine), input(rank, mine, count, 0),
                      poison(mine + count, all - mine - count)},
                     gathered};
        plan.sendOffset = mine;
      } else {
        plan.recv = {"recvbuff", all, {poison(0, all)}, gathered};
      }
      break;
    }
    case Collective::SendRecv:
      plan.recv = {"recvbuff",
                   count,
                   {poison(0, count)},
                   {input((rank - c.peerShift + nranks) % nranks, 0, count, 0)}};
      break;
    case Collective::Bcast:  // one buffer
      plan.recv = {"buffer",
                   count,
                   {rank == c.root ? ownInput : poison(0, count)},
                   {input(c.root, 0, count, 0)}};
      break;
    case Collective::AlltoAll: {  // block p of the result is block `rank` of rank p's input
      std::vector<Segment> blocks;
      for (int from = 0; from < nranks; ++from)
        blocks.push_back(input(from, count * from, count, mine));
      plan.recv = {"recvbuff", all, {poison(0, all)}, blocks};
      break;
    }
    case Collective::Gather: {
      std::vector<Segment> gathered;
      for (int from = 0; from < nranks; ++from)
        gathered.push_back(input(from, count * from, count, 0));
      // In place, every rank's input sits at its block of the (root's) receive buffer.
      std::vector<Segment> before = {poison(0, all)};
      if (c.inPlace) {
        before = {poison(0, mine), input(rank, mine, count, 0),
                  poison(mine + count, all - mine - count)};
        plan.sendOffset = mine;
      }
      plan.recv = {c.inPlace ? "buffer" : "recvbuff", all, before,
                   rank == c.root ? gathered : before};
      break;
    }
    case Collective::Scatter:
      if (c.inPlace && rank == c.root) {  // the root's block stays where it is
        plan.recv = {"buffer", all, {ownInput}, {ownInput}};
        plan.recvOffset = mine;
      } else {
        plan.recv = {"recvbuff", count, {poison(0, count)}, {input(c.root, 0, count, mine)}};
      }
      break;
  }
  return plan;
}

constexpr unsigned char kPoisonByte = 0xa5;
constexpr size_t kShownMismatches = 4;

// Where segment values come from for one case.
struct Source {
  InputKind kind;
  braidRedOp_t op;
  uint64_t salt;
  int nranks;
};

template <typename T>
void fill(unsigned char* buffer, const std::vector<Segment>& segments, const Source& source) {
  for (const Segment& s : segments) {
    T* out = reinterpret_cast<T*>(buffer) + s.offset;
    if (s.kind == Segment::kPoison) {
      std::memset(out, kPoisonByte, s.length * sizeof(T));
      continue;
    }
    visitKind(source.kind, [&](auto kind) {  // plans put only inputs and poison before a call
      for (size_t k = 0; k < s.length; ++k) {
        out[k] = inputValue<T, kind()>(source.salt, s.rank, s.index + k);
      }
    });
  }
}

struct Mismatches {
  size_t count = 0;
  std::string shown;
};

// Compares data[k] with expected(k) for every k of the segment, bit for bit unless `accepts(k,
// got)` says otherwise; `what` qualifies the expected value in the report. Only the first few
// mismatches are formatted: a wrong result must not make the check slow.
template <typename T, typename Expected, typename Accepts>
void compareEach(const T* data, const Segment& s, Expected expected, Accepts accepts,
                 const std::string& what, Mismatches& m) {
  const T poisoned = bitsAs<T>(0xa5a5a5a5a5a5a5a5ULL);
  for (size_t k = 0; k < s.length; ++k) {
    if (accepts(k, data[k]) || ++m.count > kShownMismatches) continue;
    const T want = expected(k);
    m.shown +=
        "; [" + std::to_string(s.offset + k) + "] expected " +
        (s.kind == Segment::kPoison ? std::string("untouched poison") : formatElement(want)) +
        what + " got " + formatElement(data[k]) +
        (sameBits(data[k], poisoned) ? " (poison: never written)" : "");
  }
}

template <typename T, typename Expected>
void compareEach(const T* data, const Segment& s, Expected expected, const std::string& what,
                 Mismatches& m) {
  compareEach(
      data, s, expected, [&](size_t k, const T& got) { return sameBits(got, expected(k)); }, what,
      m);
}

template <typename T>
void compare(const unsigned char* buffer, const Segment& s, const Source& source, Mismatches& m) {
  const T* data = reinterpret_cast<const T*>(buffer) + s.offset;
  switch (s.kind) {
    case Segment::kPoison: {
      const T poisoned = bitsAs<T>(0xa5a5a5a5a5a5a5a5ULL);
      compareEach(
          data, s, [&](size_t) { return poisoned; }, "", m);
      break;
    }
    case Segment::kInput:
      visitKind(source.kind, [&](auto kind) {
        compareEach(
            data, s,
            [&](size_t k) { return inputValue<T, kind()>(source.salt, s.rank, s.index + k); },
            " (input of rank " + std::to_string(s.rank) + ")", m);
      });
      break;
    case Segment::kReduced:
      visitOp(source.op, [&](auto op) {
        auto expected = [&](size_t k) {
          return referenceReduce<T, op()>(source.salt, source.nranks, s.index + k);
        };
        if constexpr (op() == braidAvg && kIsFloat<T>)
          compareEach(
              data, s, expected,
              [&](size_t k, const T& got) {
                return acceptsApiAverage(got, source.salt, source.nranks, s.index + k);
              },
              " (or as near as 1/n times each input, summed)", m);
        else
          compareEach(data, s, expected, "", m);
      });
      break;
  }
}

// Memory one rank reuses from case to case: fresh multi-MiB allocations per case would cost more in
// page faults than the checks do. Every buffer starts `shift` bytes past a 64-byte boundary, so the
// library meets unaligned buffers too, between poisoned guards that must stay intact.
class Arena {
 public:
  static constexpr size_t kGuardBytes = 64;

  struct Buffer {
    unsigned char* data;
    size_t bytes;
    unsigned char* guardBefore;  // kGuardBytes + shift bytes
    unsigned char* guardAfter;   // kGuardBytes bytes
  };

  std::array<Buffer, 3> layOut(const std::array<size_t, 3>& bytes, size_t shift) {
    auto regionBytes = [&](size_t size) { return (2 * kGuardBytes + shift + size + 63) / 64 * 64; };
    size_t total = 64;  // room to align the first region
    for (size_t size : bytes) total += regionBytes(size);
    if (storage_.size() < total) storage_.resize(total);
    auto* region = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<uintptr_t>(storage_.data()) + 63) / 64 * 64);
    std::array<Buffer, 3> buffers;
    for (size_t i = 0; i < bytes.size(); ++i) {
      unsigned char* data = region + kGuardBytes + shift;
      buffers[i] = {data, bytes[i], region, data + bytes[i]};
      std::memset(region, kPoisonByte, kGuardBytes + shift);
      std::memset(data + bytes[i], kPoisonByte, kGuardBytes);
      region += regionBytes(bytes[i]);
    }
    return buffers;
  }

 private:
  std::vector<unsigned char> storage_;
};

// "" when both guards of `buffer` are intact, else what was overwritten.
std::string damagedGuards(const Arena::Buffer& buffer) {
  auto damaged = [](const unsigned char* from, const unsigned char* to) {
    size_t count = 0;
    for (const unsigned char* p = from; p < to; ++p) count += *p != kPoisonByte;
    return count;
  };
  const size_t before = damaged(buffer.guardBefore, buffer.data);
  const size_t after = damaged(buffer.guardAfter, buffer.guardAfter + Arena::kGuardBytes);
  if (before + after == 0) return "";
  return std::to_string(before) + " bytes written in the " +
         std::to_string(buffer.data - buffer.guardBefore) + " before it and " +
         std::to_string(after) + " in the " + std::to_string(Arena::kGuardBytes) + " after it";
}

// One rank's part of one case: its buffers, filled on construction; the call; the check.
class RankRun {
 public:
  RankRun(const GridCase& c, int rank, int nranks, Arena& arena)
      : case_(&c),
        rank_(rank),
        nranks_(nranks),
        plan_(planFor(c, rank, nranks)),
        elementSize_(dtypeSize(c.type)),
        source_{reduces(c.collective) ? inputKindFor(c.op) : InputKind::Data, c.op, c.salt,
                nranks} {
    const size_t sendBytes = plan_.send.elements * elementSize_;
    const auto buffers = arena.layOut({sendBytes, plan_.recv.elements * elementSize_, sendBytes},
                                      c.salt % 8 * elementSize_);
    send_ = buffers[0];
    recv_ = buffers[1];
    sendSnapshot_ = buffers[2].data;
    visitDtype(c.type, [&](auto element) {
      using T = decltype(element);
      fill<T>(send_.data, plan_.send.before, source_);
      fill<T>(recv_.data, plan_.recv.before, source_);
    });
    std::memcpy(sendSnapshot_, send_.data, sendBytes);
  }

  // Makes the case's PreMulSum operator on `comm` (a no-op for other ops), then calls.
  braidResult_t issue(braidComm_t comm) {
    const GridCase& c = *case_;
    braidRedOp_t op = c.op;
    if (c.op == kPreMulSum) {
      const braidScalarResidence_t residence =
          c.salt % 2 == 0 ? braidScalarHostImmediate : braidScalarDevice;
      // A Device scalar is read at the call: it holds a wrong value at creation.
      auto setScalar = [&](bool right) {
        visitDtype(c.type, [&](auto element) {
          using T = decltype(element);
          const T scalar = right ? premulScalar<T>(rank_, c.salt) : fromDouble<T>(2);
          std::memcpy(scalar_, &scalar, sizeof scalar);
        });
      };
      setScalar(residence == braidScalarHostImmediate);
      if (braidResult_t r = braidRedOpCreatePreMulSum(&op, scalar_, c.type, residence, comm);
          r != braidSuccess)
        return r;
      setScalar(true);
      premulOp_ = op;
    }
    switch (c.collective) {
      case Collective::AllReduce:
        return braidAllReduce(sendbuff(), recvbuff(), c.count, c.type, op, comm, nullptr);
      case Collective::ReduceScatter:
        return braidReduceScatter(sendbuff(), recvbuff(), c.count, c.type, op, comm, nullptr);
      case Collective::AllGather:
        return braidAllGather(sendbuff(), recvbuff(), c.count, c.type, comm, nullptr);
      case Collective::Broadcast:
        return braidBroadcast(sendbuff(), recvbuff(), c.count, c.type, c.root, comm, nullptr);
      case Collective::Reduce:
        return braidReduce(sendbuff(), recvbuff(), c.count, c.type, op, c.root, comm, nullptr);
      case Collective::Bcast: return braidBcast(recvbuff(), c.count, c.type, c.root, comm, nullptr);
      case Collective::AlltoAll:
        return braidAlltoAll(sendbuff(), recvbuff(), c.count, c.type, comm, nullptr);
      case Collective::Gather:
        return braidGather(sendbuff(), recvbuff(), c.count, c.type, c.root, comm, nullptr);
      case Collective::Scatter:
        return braidScatter(sendbuff(), recvbuff(), c.count, c.type, c.root, comm, nullptr);
      case Collective::SendRecv: {
        const braidResult_t started = braidGroupStart();
        if (started != braidSuccess) return started;
        const braidResult_t sent =
            braidSend(sendbuff(), c.count, c.type, (rank_ + c.peerShift) % nranks_, comm, nullptr);
        const braidResult_t received = braidRecv(
            recvbuff(), c.count, c.type, (rank_ - c.peerShift + nranks_) % nranks_, comm, nullptr);
        const braidResult_t ended = braidGroupEnd();
        return sent != braidSuccess ? sent : received != braidSuccess ? received : ended;
      }
    }
    return braidInternalError;
  }

  // Destroys the PreMulSum operator issue() made, once the call has run.
  braidResult_t release(braidComm_t comm) {
    if (!premulOp_) return braidSuccess;
    const braidRedOp_t op = *premulOp_;
    premulOp_.reset();
    return braidRedOpDestroy(op, comm);
  }

  // Appends one line for every buffer that differs anywhere from its plan or whose guards changed.
  void check(Failures& failures) const {
    // The send buffer is compared with its snapshot first; inputs are regenerated only to report
    // what changed.
    if (std::memcmp(send_.data, sendSnapshot_, send_.bytes) != 0) {
      checkBuffer(plan_.send, send_.data, failures);
    }
    checkBuffer(plan_.recv, recv_.data, failures);
    for (const auto* buffer : {&send_, &recv_}) {
      const std::string damage = damagedGuards(*buffer);
      if (damage.empty()) continue;
      failures.push_back(where() + (buffer == &send_ ? plan_.send.name : plan_.recv.name) + ": " +
                         damage);
    }
  }

 private:
  const void* sendbuff() const {
    return case_->inPlace ? recv_.data + plan_.sendOffset * elementSize_ : send_.data;
  }
  void* recvbuff() const { return recv_.data + plan_.recvOffset * elementSize_; }

  std::string where() const {
    return describe(*case_, nranks_) + " rank=" + std::to_string(rank_) + ": ";
  }

  void checkBuffer(const BufferPlan& plan, const unsigned char* buffer, Failures& failures) const {
    Mismatches m;
    visitDtype(case_->type, [&](auto element) {
      for (const Segment& s : plan.after) compare<decltype(element)>(buffer, s, source_, m);
    });
    if (m.count == 0) return;
    failures.push_back(where() + plan.name + " has " + std::to_string(m.count) + " of " +
                       std::to_string(plan.elements) + " elements wrong" + m.shown);
  }

  const GridCase* case_;
  int rank_;
  int nranks_;
  RankPlan plan_;
  size_t elementSize_;
  Source source_;
  Arena::Buffer send_;  // empty in place
  Arena::Buffer recv_;  // in place: the one buffer
  unsigned char* sendSnapshot_;
  alignas(8) unsigned char scalar_[8] = {};  // PreMulSum's, read at the call for braidScalarDevice
  std::optional<braidRedOp_t> premulOp_;
};

constexpr size_t kMaxFailureLines = 40;

Failures capped(Failures failures) {
  if (failures.size() > kMaxFailureLines) {
    const size_t more = failures.size() - kMaxFailureLines;
    failures.resize(kMaxFailureLines);
    failures.push_back("... and " + std::to_string(more) + " more");
  }
  return failures;
}

// One rank of a threads or processes grid: its own communicator, every case in order. With `split`
// that communicator is split from a world of every launched rank, the last of which takes no color
// and leaves, keys reversing the order. A failed call ends the run and aborts the communicator, so
// the peers fail fast instead of timing out one case after another.
Failures runRankGrid(const RankEnv& env, const std::vector<GridCase>& cases, bool split) {
  braidComm_t world = nullptr;
  if (braidResult_t result = initRank(&world, env); result != braidSuccess) {
    return {"braidCommInitRankConfig returned " + describeResult(result, nullptr)};
  }
  braidComm_t comm = world;
  int rank = env.rank, nranks = env.nranks;
  if (split) {
    const bool leaves = env.rank == env.nranks - 1;
    if (braidResult_t result =
            braidCommSplit(world, leaves ? BRAID_SPLIT_NOCOLOR : 0, -env.rank, &comm, nullptr);
        result != braidSuccess || leaves) {
      Failures failures;
      if (result != braidSuccess)
        failures.push_back("braidCommSplit returned " + describeResult(result, world));
      else if (comm != nullptr)
        failures.push_back("a rank without a color got a communicator");
      braidCommDestroy(world);
      return failures;
    }
    nranks = env.nranks - 1;
    rank = nranks - 1 - env.rank;
  }
  Failures failures;
  Arena arena;
  for (size_t i = 0; i < cases.size(); ++i) {
    env.at(static_cast<int64_t>(i));
    RankRun run(cases[i], rank, nranks, arena);
    braidResult_t result = run.issue(comm);
    if (result == braidSuccess) result = run.release(comm);
    if (result != braidSuccess) {
      failures.push_back(describe(cases[i], nranks) + ": returned " + describeResult(result, comm));
      braidCommAbort(comm);
      if (split) braidCommDestroy(world);
      return capped(failures);
    }
    run.check(failures);
  }
  // Finalize waits for every rank, so no process exits while a peer still runs the last case.
  if (braidResult_t result = braidCommFinalize(comm); result != braidSuccess) {
    failures.push_back("braidCommFinalize returned " + describeResult(result, comm));
  }
  if (braidResult_t result = braidCommDestroy(comm); result != braidSuccess) {
    failures.push_back("braidCommDestroy returned " + describeResult(result, nullptr));
  }
  if (split) braidCommDestroy(world);
  return capped(failures);
}

// Every rank's communicator from braidCommInitAll, every rank's call of a case inside one group,
// all from the one thread this runs on.
Failures runOneThreadGrid(const RankEnv& env, int nranks, const std::vector<GridCase>& cases) {
  std::vector<braidComm_t> comms(nranks, nullptr);
  if (braidResult_t result = braidCommInitAll(comms.data(), nranks, nullptr);
      result != braidSuccess) {
    return {"braidCommInitAll returned " + describeResult(result, nullptr)};
  }
  Failures failures;
  std::vector<Arena> arenas(nranks);
  for (size_t i = 0; i < cases.size(); ++i) {
    env.at(static_cast<int64_t>(i));
    std::vector<RankRun> runs;
    for (int rank = 0; rank < nranks; ++rank) {
      runs.emplace_back(cases[i], rank, nranks, arenas[rank]);
    }
    std::string failure;
    if (braidResult_t result = braidGroupStart(); result != braidSuccess) {
      failure = "braidGroupStart returned " + describeResult(result, nullptr);
    } else {
      for (int rank = 0; rank < nranks; ++rank) {
        const braidResult_t result = runs[rank].issue(comms[rank]);
        if (result != braidSuccess && failure.empty()) {
          failure =
              "rank " + std::to_string(rank) + " returned " + describeResult(result, comms[rank]);
        }
      }
      const braidResult_t ended = braidGroupEnd();
      if (ended != braidSuccess && failure.empty()) {
        failure = "braidGroupEnd returned " + describeResult(ended, nullptr);
      }
      for (int rank = 0; rank < nranks; ++rank) {
        const braidResult_t released = runs[rank].release(comms[rank]);
        if (released != braidSuccess && failure.empty())
          failure = "braidRedOpDestroy returned " + describeResult(released, comms[rank]);
      }
    }
    if (!failure.empty()) {
      failures.push_back(describe(cases[i], nranks) + " (one thread): " + failure);
      for (braidComm_t comm : comms) braidCommAbort(comm);
      return capped(failures);
    }
    for (const RankRun& run : runs) run.check(failures);
  }
  for (int rank = 0; rank < nranks; ++rank) {
    if (braidResult_t result = braidCommDestroy(comms[rank]); result != braidSuccess) {
      failures.push_back("braidCommDestroy of rank " + std::to_string(rank) + " returned " +
                         describeResult(result, nullptr));
    }
  }
  return capped(failures);
}

enum class Mode { Threads, Processes, OneThread, SplitThreads, SplitProcesses };

struct GridParam {
  Mode mode;
  int nranks;
  Collective collective;
};

std::vector<GridParam> gridParams() {
  std::vector<GridParam> params;
  for (Mode mode : {Mode::Threads, Mode::Processes, Mode::OneThread, Mode::SplitThreads,
                    Mode::SplitProcesses}) {
    std::vector<int> rankCounts = {1, 2, 3, 4, 8};
    if (mode == Mode::Threads) rankCounts = {1, 2, 3, 4, 7, 8};
    if (mode == Mode::OneThread) rankCounts = {2, 3, 8};
    if (mode == Mode::SplitThreads || mode == Mode::SplitProcesses) rankCounts = {3};
    for (int nranks : rankCounts) {
      for (Collective collective : kAllCollectives) params.push_back({mode, nranks, collective});
    }
  }
  return params;
}

std::string paramName(const GridParam& param) {
  static const char* const kModeNames[] = {"threads", "processes", "onethread", "splitthreads",
                                           "splitprocesses"};
  return std::string(kModeNames[static_cast<int>(param.mode)]) + "_" +
         std::to_string(param.nranks) + "ranks_" + collectiveName(param.collective);
}

void PrintTo(const GridParam& param, std::ostream* out) {
  *out << paramName(param);
}

// A rank that advances through no case for this long is stuck (every call has kOpTimeoutMs).
constexpr std::chrono::seconds kStallLimit(2 * kOpTimeoutMs / 1000);

class Collectives : public testing::TestWithParam<GridParam> {};

TEST_P(Collectives, MatchReference) {
  const GridParam& param = GetParam();
  const bool oneThread = param.mode == Mode::OneThread;
  const bool split = param.mode == Mode::SplitThreads || param.mode == Mode::SplitProcesses;
  const std::vector<GridCase> cases = gridCases(
      param.collective, param.nranks, oneThread || split ? Coverage::Light : Coverage::Full);
  RecordProperty("cases", static_cast<int>(cases.size()));
  RankProgram program;
  program.describeStep = [&](int64_t step) { return describe(cases[step], param.nranks); };
  if (oneThread) {
    program.run = [&](const RankEnv& env) { return runOneThreadGrid(env, param.nranks, cases); };
  } else {
    program.run = [&](const RankEnv& env) { return runRankGrid(env, cases, split); };
  }
  const bool processes = param.mode == Mode::Processes || param.mode == Mode::SplitProcesses;
  const Launch launch = oneThread   ? Launch::OneWorker
                        : processes ? Launch::Processes
                                    : Launch::Threads;
  const Failures failures =
      launchRanks(launch, split ? param.nranks + 1 : param.nranks, program, kStallLimit);
  for (const std::string& failure : failures) ADD_FAILURE() << failure;
}

INSTANTIATE_TEST_SUITE_P(Grid, Collectives, testing::ValuesIn(gridParams()),
                         [](const auto& info) { return paramName(info.param); });

}  // namespace
}  // namespace braid_test
