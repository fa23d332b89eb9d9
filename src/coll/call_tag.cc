#include "coll/call_tag.h"

#include <fmt/format.h>

#include "base/error.h"

namespace braid {
namespace {

// Send and Recv are one point-to-point call seen from its two ends: both tag it as a send.
Collective tagged(Collective c) {
  return c == Collective::Recv ? Collective::Send : c;
}

// Send and Recv share a tag, so a tag names both.
const char* taggedName(uint8_t collective) {
  const auto c = static_cast<Collective>(collective);
  return c == Collective::Send ? "braidSend/braidRecv" : apiName(c);
}

const char* datatypeName(uint8_t type) {
  static const char* const kNames[] = {"braidInt8",     "braidUint8",      "braidInt32",
                                       "braidUint32",   "braidInt64",      "braidUint64",
                                       "braidFloat16",  "braidFloat32",    "braidFloat64",
                                       "braidBfloat16", "braidFloat8e4m3", "braidFloat8e5m2"};
  return type < sizeof kNames / sizeof kNames[0] ? kNames[type] : "an unknown datatype";
}

// Operators from braidNumOps up are a communicator's PreMulSum operators (made in the same order
// on every rank; ids beyond the byte wrap, see opTag).
std::string opName(uint8_t op) {
  static const char* const kNames[] = {"braidSum", "braidProd", "braidMax", "braidMin", "braidAvg"};
  if (op < sizeof kNames / sizeof kNames[0]) return kNames[op];
  return fmt::format("PreMulSum operator {}", op);
}

// How a tag's call ran: "as one pass of several calls of its group", or its count.
std::string fusedAs(const CallTag& tag) {
  if ((tag.flags & kTagFusedCalls) != 0) return "as one pass of several calls of its group";
  return fmt::format("as one call of count {}", tag.count);
}

constexpr const char* kRule =
    "every rank must make the same collective calls, with the same arguments, in the same order";

}  // namespace

// PreMulSum ids grow without bound; in the tag's byte they wrap within the ids above the
// built-in ops, so they can never read as one of those.
static uint8_t opTag(int op) {
  if (op < braidNumOps) return static_cast<uint8_t>(op);
  return static_cast<uint8_t>(braidNumOps + (op - braidNumOps) % (256 - braidNumOps));
}

const char* apiName(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "braidAllReduce";
    case Collective::ReduceScatter: return "braidReduceScatter";
    case Collective::AllGather: return "braidAllGather";
    case Collective::Broadcast: return "braidBroadcast";
    case Collective::Reduce: return "braidReduce";
    case Collective::Send: return "braidSend";
    case Collective::Recv: return "braidRecv";
    case Collective::Gather: return "braidGather";
    case Collective::Scatter: return "braidScatter";
  }
  return "an unknown call";
}

CallTag callTag(const CollArgs& a, uint64_t sequence, uint64_t comm) {
  const bool p2p = isSendOrRecv(a.coll);
  CallTag tag;
  tag.sequence = p2p ? 0 : sequence;
  tag.count = a.fusedCalls != 0 ? a.fusedCalls : a.count;
  tag.flags = a.fusedCalls != 0 ? kTagFusedCalls : 0;
  tag.root = p2p ? 0 : a.root;
  tag.collective = static_cast<uint8_t>(tagged(a.coll));
  tag.datatype = static_cast<uint8_t>(a.type);
  tag.op = reduces(a.coll) ? opTag(a.namedOp >= 0 ? a.namedOp : a.op) : 0;
  tag.comm = comm;
  return tag;
}

std::string describeMismatch(const CallTag& mine, const CallTag& theirs, int self, int peer) {
  const std::string call =
      mine.sequence != 0
          ? fmt::format("{} (collective #{})", taggedName(mine.collective), mine.sequence)
          : std::string(taggedName(mine.collective));
  std::string what;
  if (theirs.comm != mine.comm)
    what = fmt::format(
        "rank {} at {} received from rank {} a message of another communicator that shares its "
        "links",
        self, call, peer);
  else if (theirs.collective != mine.collective || (theirs.sequence == 0) != (mine.sequence == 0))
    what = fmt::format(
        "rank {} called {} but rank {} called {}{}", self, call, peer,
        taggedName(theirs.collective),
        theirs.sequence != 0 ? fmt::format(" (collective #{})", theirs.sequence) : std::string());
  else if (theirs.sequence != mine.sequence)
    what = fmt::format(
        "rank {} is at {} but rank {} at collective #{}: a rank skipped or repeated "
        "a call",
        self, call, peer, theirs.sequence);
  else if (theirs.datatype != mine.datatype)
    what = fmt::format("rank {} called {} with datatype {} but rank {} with {}", self, call,
                       datatypeName(mine.datatype), peer, datatypeName(theirs.datatype));
  else if (theirs.op != mine.op)
    what = fmt::format("rank {} called {} with op {} but rank {} with {}", self, call,
                       opName(mine.op), peer, opName(theirs.op));
  else if (theirs.root != mine.root && hasRoot(static_cast<Collective>(mine.collective)))
    what = fmt::format("rank {} called {} with root {} but rank {} with root {}", self, call,
                       mine.root, peer, theirs.root);
  else if (((mine.flags | theirs.flags) & kTagFusedCalls) != 0 && !(theirs == mine))
    what = fmt::format(
        "rank {} ran {} {} but rank {} {}: the ranks' groups hold different calls there (a "
        "group's consecutive small calls that agree run as one pass, BRAID_GROUP_FUSE_BYTES)",
        self, call, fusedAs(mine), peer, fusedAs(theirs));
  else if (theirs.count != mine.count)
    what = fmt::format("rank {} called {} with count {} but rank {} with count {}", self, call,
                       mine.count, peer, theirs.count);
  else
    what = fmt::format("rank {} called {} but rank {} sent a message it does not recognise", self,
                       call, peer);
  return fmt::format("{} ({})", what, kRule);
}

namespace {

const void* checked(const RecvConnector& from, const SlotHeader& header, const CallTag& mine,
                    size_t bytes) {
  if (!(header.tag == mine))
    throw Error(braidInvalidUsage, describeMismatch(mine, header.tag, from.self(), from.peer()));
  if (header.payloadBytes != bytes)
    fail(braidInternalError,
         "rank {} received {} bytes from rank {} where its schedule expects {} for the same call",
         from.self(), header.payloadBytes, from.peer(), bytes);
  return &header + 1;
}

}  // namespace

const void* receive(RecvConnector& from, const CallTag& mine, size_t bytes, Watchdog& dog) {
  return checked(from, from.wait(dog), mine, bytes);
}

const void* tryReceive(RecvConnector& from, const CallTag& mine, size_t bytes) {
  const SlotHeader* header = from.tryWait();
  return header == nullptr ? nullptr : checked(from, *header, mine, bytes);
}

}  // namespace braid
