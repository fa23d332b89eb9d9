#include "coll/group_plan.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>

#include "kernels/host_reduce.h"

namespace braid {
namespace {

bool fusable(const CollArgs& call, int nranks, const GroupFuseLimits& limits) {
  const size_t bytes = callSizeBytes(call, nranks);
  // A PreMulSum operator carries each rank's own scalar per call: it runs alone.
  return !isPointToPoint(call.coll) && (!reduces(call.coll) || call.op < braidNumOps) &&
         bytes > 0 && bytes <= limits.callMaxBytes;
}

// Whether `next` may join a fused pass that `first` began.
bool agrees(const CollArgs& first, const CollArgs& next) {
  return first.coll == next.coll && first.type == next.type &&
         (!reduces(first.coll) || first.op == next.op) &&
         (!hasRoot(first.coll) || first.root == next.root);
}

// The bytes a fused pass copies for a member, in and out (the rooted ones' as on their root): its
// size, and its count's worth once more (the all-gather's input, the reduce-scatter's output).
size_t copiedBytes(const CollArgs& call, int nranks) {
  return callSizeBytes(call, nranks) + call.count * kernels::typeSize(call.type);
}

// Whether the collectives among calls [first, end) cost less fused than one by one, as `limits`
// prices them; false for fewer than two, which are not priced (a lone call may be one the model
// has no price for: a gather's or scatter's marker).
bool worthFusing(std::span<const CollArgs> calls, size_t first, size_t end, int nranks,
                 const GroupFuseLimits& limits) {
  const auto members = std::count_if(calls.begin() + static_cast<ptrdiff_t>(first),
                                     calls.begin() + static_cast<ptrdiff_t>(end),
                                     [](const CollArgs& c) { return !isSendOrRecv(c.coll); });
  if (members < 2) return false;
  if (!limits.callUs || !limits.copyUs) return true;
  CollArgs fused = calls[first];
  fused.count = 0;
  double alone = 0;
  size_t copied = 0;
  for (size_t i = first; i < end; ++i) {
    const CollArgs& call = calls[i];
    if (isSendOrRecv(call.coll)) continue;
    alone += limits.callUs(call);
    fused.count += call.count;
    copied += copiedBytes(call, nranks);
  }
  return limits.callUs(fused) + limits.copyUs(copied) < alone;
}

// One past the last call of the run of collectives that calls[first] begins: the fusable ones
// that agree with it, consecutive among the group's collectives (its sends and receives, which
// differ from rank to rank, do not end a run), within the pass's limit.
size_t runEnd(std::span<const CollArgs> calls, size_t first, int nranks,
              const GroupFuseLimits& limits) {
  if (!fusable(calls[first], nranks, limits)) return first + 1;
  size_t bytes = callSizeBytes(calls[first], nranks), end = first + 1;
  for (; end < calls.size(); ++end) {
    const CollArgs& next = calls[end];
    if (isSendOrRecv(next.coll)) continue;
    if (!fusable(next, nranks, limits) || !agrees(calls[first], next) ||
        bytes + callSizeBytes(next, nranks) > limits.passMaxBytes)
      break;
    bytes += callSizeBytes(next, nranks);
  }
  return end;
}

// The fused call's tag digest of its members' number and counts (FNV-1a), never 0.
uint64_t digestOf(std::span<const CollArgs> members) {
  uint64_t h = 14695981039346656037ull;
  auto mix = [&h](uint64_t v) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  };
  mix(members.size());
  for (const CollArgs& m : members) mix(m.count);
  return h | 1;
}

// The bytes a member reads (or writes) in its own buffer: [first, last) as addresses, empty
// where this rank reads (writes) none. Each member's reads are contiguous, and so are its writes.
struct Extent {
  uintptr_t first = 0, last = 0;
  size_t member = 0;
  bool empty() const { return first >= last; }
};
std::vector<Extent> extentsOf(std::span<const CollArgs> members,
                              const std::vector<StagedCopy>& copies, bool inputs) {
  std::vector<Extent> extents(members.size());
  for (size_t i = 0; i < members.size(); ++i) extents[i].member = i;
  for (const StagedCopy& c : copies) {
    const void* base = inputs ? members[c.member].sendbuff : members[c.member].recvbuff;
    const uintptr_t from = reinterpret_cast<uintptr_t>(base) + c.own;
    Extent& e = extents[c.member];
    if (e.empty()) e.first = e.last = from;
    e.first = std::min(e.first, from);
    e.last = std::max(e.last, from + c.bytes);
  }
  std::erase_if(extents, [](const Extent& e) { return e.empty(); });
  return extents;
}

}  // namespace

size_t callSizeBytes(const CollArgs& call, int nranks) {
  const size_t bytes = call.count * kernels::typeSize(call.type);
  return countsPerRank(call.coll) ? bytes * static_cast<size_t>(nranks) : bytes;
}

GroupPlan planGroup(std::span<const CollArgs> calls, int nranks, const GroupFuseLimits& limits) {
  GroupPlan plan;
  plan.order.reserve(calls.size());
  auto open = [&plan](GroupPass::Kind kind) {
    plan.passes.push_back({kind, plan.order.size(), 0});
  };
  auto add = [&plan](size_t call) {
    plan.passes.back().count++;
    plan.order.push_back(call);
  };
  // Sends and receives wait for the next collective pass, and go ahead of it together.
  std::vector<size_t> sendRecv;
  auto flush = [&] {
    if (sendRecv.empty()) return;
    open(GroupPass::Kind::SendRecv);
    for (size_t call : sendRecv) add(call);
    sendRecv.clear();
  };
  size_t fusedUntil = 0, aloneUntil = 0;  // collectives before these run fused, or alone
  for (size_t i = 0; i < calls.size(); ++i) {
    if (isSendOrRecv(calls[i].coll)) {
      sendRecv.push_back(i);
    } else if (i >= fusedUntil) {
      const size_t end = i >= aloneUntil ? runEnd(calls, i, nranks, limits) : i + 1;
      flush();
      if (i >= aloneUntil && worthFusing(calls, i, end, nranks, limits)) {
        open(GroupPass::Kind::Fused);
        for (size_t k = i; k < end; ++k)
          if (!isSendOrRecv(calls[k].coll)) add(k);
        fusedUntil = end;
      } else {
        open(GroupPass::Kind::Alone);
        add(i);
        aloneUntil = std::max(aloneUntil, end);
      }
    }
  }
  flush();
  return plan;
}

FusedPass fusedPass(std::span<const CollArgs> members, int nranks, int rank) {
  const CollArgs& first = members.front();
  const size_t elem = kernels::typeSize(first.type);
  size_t total = 0;  // elements of the fused call's count
  for (const CollArgs& m : members) total += m.count;
  FusedPass pass;
  pass.call = first;
  pass.call.count = total;
  pass.call.sendbuff = pass.call.recvbuff = nullptr;
  pass.call.fusedCalls = digestOf(members);
  const size_t n = static_cast<size_t>(nranks), self = static_cast<size_t>(rank);
  const size_t block = total * elem;  // the fused call's block of one rank
  size_t at = 0;                      // a member's place in every block
  for (size_t i = 0; i < members.size(); ++i) {
    const size_t bytes = members[i].count * elem;
    switch (first.coll) {
      case Collective::AllGather:  // input into this rank's block, then every block out
        pass.inputs.push_back({i, 0, self * block + at, bytes});
        for (size_t r = 0; r < n; ++r)
          pass.outputs.push_back({i, r * bytes, r * block + at, bytes});
        break;
      case Collective::ReduceScatter:  // every rank's block in, then this rank's block out
        for (size_t r = 0; r < n; ++r) pass.inputs.push_back({i, r * bytes, r * block + at, bytes});
        pass.outputs.push_back({i, 0, self * block + at, bytes});
        break;
      default:  // all-reduce, broadcast, reduce: one buffer
        if (first.coll != Collective::Broadcast || rank == first.root)
          pass.inputs.push_back({i, 0, at, bytes});
        if (first.coll != Collective::Reduce || rank == first.root)
          pass.outputs.push_back({i, 0, at, bytes});
    }
    at += bytes;
  }
  pass.stagingBytes = countsPerRank(first.coll) ? n * block : block;
  // In place as NCCL's in-place forms have it: an all-gather's input is its rank's block of the
  // output, a reduce-scatter's output its rank's block of the input.
  pass.sendOffset = first.coll == Collective::AllGather ? self * block : 0;
  pass.recvOffset = first.coll == Collective::ReduceScatter ? self * block : 0;
  return pass;
}

std::optional<std::pair<size_t, size_t>> laterReadsEarlierOutput(std::span<const CollArgs> members,
                                                                 const FusedPass& pass) {
  const std::vector<Extent> reads = extentsOf(members, pass.inputs, true);
  const std::vector<Extent> writes = extentsOf(members, pass.outputs, false);
  // A few members: every pair (a pass of every group of a training step runs this).
  constexpr size_t kEveryPairUpTo = 16;
  if (members.size() <= kEveryPairUpTo) {
    for (const Extent& r : reads)
      for (const Extent& w : writes)
        if (w.member < r.member && r.first < w.last && w.first < r.last)
          return std::pair{w.member, r.member};
    return std::nullopt;
  }
  // Many: one sweep over the extents by address. A read overlaps the writes still open where it
  // begins, and a write the reads still open where it begins; either way the pair counts where
  // the writer comes first. k log k for k members.
  struct Event {
    Extent extent;
    bool write;
  };
  std::vector<Event> events;
  for (const Extent& e : reads) events.push_back({e, false});
  for (const Extent& e : writes) events.push_back({e, true});
  std::sort(events.begin(), events.end(),
            [](const Event& a, const Event& b) { return a.extent.first < b.extent.first; });
  std::multiset<std::pair<uintptr_t, size_t>> open[2];  // (last, member) of reads, of writes
  std::multiset<size_t> openMembers[2];
  for (const Event& ev : events) {
    for (int kind = 0; kind < 2; ++kind)
      while (!open[kind].empty() && open[kind].begin()->first <= ev.extent.first) {
        openMembers[kind].erase(openMembers[kind].find(open[kind].begin()->second));
        open[kind].erase(open[kind].begin());
      }
    const size_t member = ev.extent.member;
    if (!ev.write && !openMembers[1].empty() && *openMembers[1].begin() < member)
      return std::pair{*openMembers[1].begin(), member};
    if (ev.write && !openMembers[0].empty() && *openMembers[0].rbegin() > member)
      return std::pair{member, *openMembers[0].rbegin()};
    open[ev.write].insert({ev.extent.last, member});
    openMembers[ev.write].insert(member);
  }
  return std::nullopt;
}

}  // namespace braid
