#include "core/groups.h"

#include <algorithm>
#include <deque>
#include <iterator>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "coll/call_tag.h"
#include "coll/group_plan.h"
#include "core/arguments.h"
#include "core/entry.h"
#include "core/group_workers.h"
#include "core/host_stream.h"
#include "core/launch_rounds.h"

namespace braid::api {

void runBatch(braidComm* comm, std::span<const CollArgs> ops) {
  // A collective outside a group (the common case), or sends and receives only, have nothing to
  // plan: they run at once, with nothing allocated before their operation begins (its failures
  // reach the peers at once; one before it, only as a timeout).
  if (ops.size() == 1 && !isSendOrRecv(ops[0].coll)) return comm->run(ops[0]);
  // A gather's or scatter's marker (its roots' agreement) heads its sends and receives.
  const size_t marker =
      ops[0].coll == Collective::Gather || ops[0].coll == Collective::Scatter ? 1 : 0;
  if (std::all_of(ops.begin() + marker, ops.end(),
                  [](const CollArgs& a) { return isSendOrRecv(a.coll); })) {
    if (marker == 1) comm->run(ops[0]);
    if (ops.size() > marker) comm->runSendRecv(ops.subspan(marker));
    return;
  }
  const braid::GroupPlan plan = braid::planGroup(ops, comm->nranks(), comm->groupFusing());
  // The calls as the passes take them: the group's own order, unless sends or receives among a
  // fused run's calls go after it.
  std::vector<CollArgs> reordered;
  if (!std::is_sorted(plan.order.begin(), plan.order.end()))
    for (size_t k : plan.order) reordered.push_back(ops[k]);
  const std::span<const CollArgs> ordered = reordered.empty() ? ops : reordered;
  for (const braid::GroupPass& pass : plan.passes) {
    const std::span<const CollArgs> calls = ordered.subspan(pass.first, pass.count);
    switch (pass.kind) {
      case braid::GroupPass::Kind::Alone: comm->run(calls.front()); break;
      case braid::GroupPass::Kind::SendRecv: comm->runSendRecv(calls); break;
      case braid::GroupPass::Kind::Fused: comm->runFused(calls); break;
    }
  }
}

// Runs part(i) of every communicator i of a group at once (their ranks must progress together):
// the first on this thread, the others on this thread's group workers. Each communicator keeps the
// story of its own failure; the first failure is rethrown.
void runTogetherPerComm(size_t n, const std::function<braidComm*(size_t)>& commOf,
                        const std::function<void(size_t)>& part) {
  std::vector<std::optional<Error>> errors(n);
  braid::runTogether(n, [&](size_t i) {
    try {
      part(i);
    } catch (...) {
      errors[i] = braid::currentError();
    }
  });
  for (size_t i = 0; i < n; ++i)
    if (errors[i]) commOf(i)->recordError(*errors[i]);
  for (const std::optional<Error>& error : errors)
    if (error) throw *error;
}

// Runs batches to completion, together (on the caller's thread, or as a host stream's task); each
// communicator keeps its own failure (braidGetLastError of it says why its part failed).
void runNow(std::vector<Batch>& batches) {
  if (batches.empty()) return;
  runTogetherPerComm(
      batches.size(), [&](size_t i) { return batches[i].comm; },
      [&](size_t i) { runBatch(batches[i].comm, batches[i].ops); });
}

// Of `batches`, each communicator rank's collectives as they will be numbered, for the stream's
// check (a communicator whose init has not ended has no identity yet, and is not checked).
std::vector<braid::RankCollectives> collectivesOf(const std::vector<Batch>& batches) {
  std::vector<braid::RankCollectives> collectives;
  for (const Batch& b : batches) {
    const std::optional<uint64_t> comm = b.comm->identityOnceReady();
    const braid::CollectiveNumbers& numbers = b.comm->collectiveNumbers();
    if (comm && b.collectives != 0)
      collectives.push_back({*comm, b.comm->rank(), numbers.next(), numbers.next(b.collectives)});
  }
  return collectives;
}

[[noreturn]] void failQueuedBehind(const std::vector<braid::RankCollectives>& mine,
                                   const braid::RankCollectives& ahead, braidStream_t stream) {
  auto own = std::find_if(mine.begin(), mine.end(), [&](const braid::RankCollectives& m) {
    return m.comm == ahead.comm && m.first <= ahead.last && ahead.first <= m.last;
  });
  if (own == mine.end()) own = mine.begin();  // HostStream::enqueue found it among them
  fail(braidInvalidUsage,
       "rank {}: its collective #{} of this communicator would be queued on host stream {} behind "
       "rank {}'s part of the same collective, which waits for it there: neither could run, so it "
       "was not queued (expected a stream per rank, or both ranks' calls in one "
       "braidGroupStart/braidGroupEnd)",
       own->rank, std::max(own->first, ahead.first), stream, ahead.rank);
}

// Fails, naming both ranks, where a task queued on the batches' stream runs another rank's part of
// one of their collectives.
void failIfQueuedBehind(const std::vector<Batch>& batches) {
  const std::vector<braid::RankCollectives> collectives = collectivesOf(batches);
  auto* stream = static_cast<braid::HostStream*>(batches.front().stream);
  if (std::optional<braid::RankCollectives> ahead = stream->otherRanksPartAhead(collectives))
    failQueuedBehind(collectives, *ahead, batches.front().stream);
}

// Batches on one host stream as one task of it, run together as runNow runs them (a group's ranks
// on one stream, one after another, would have the first wait for the second behind it).
void submitToStream(std::vector<Batch> batches) {
  const std::vector<braid::RankCollectives> collectives = collectivesOf(batches);
  std::vector<std::pair<braidComm*, uint64_t>> numbered;  // each communicator's collective calls
  for (const Batch& b : batches) {
    numbered.emplace_back(b.comm, b.collectives);
    b.comm->pending().begin();
  }
  const braidStream_t handle = batches.front().stream;
  auto* stream = static_cast<braid::HostStream*>(handle);
  std::optional<braid::RankCollectives> ahead = stream->enqueue(
      [batches = std::move(batches)]() mutable {
        struct Done {
          std::vector<Batch>& batches;
          ~Done() {
            for (const Batch& b : batches) b.comm->pending().end();
          }
        } done{batches};
        try {
          runNow(batches);
        } catch (...) {
          const Error e = braid::currentError();
          BRAID_WARN(braid::log::kColl, "{}", e.what());
          throw e;
        }
      },
      collectives);
  if (!ahead) {
    for (const auto& [comm, calls] : numbered) comm->collectiveNumbers().take(calls);
    return;
  }
  for (const auto& [comm, calls] : numbered) comm->pending().end();
  failQueuedBehind(collectives, *ahead, handle);
}

// Each rank's operations on its own stream, issued round by round: ranks of a GPU queue their
// collectives in rounds (core/launch_rounds.h), so one thread issuing every operation of one rank
// before the next rank's would wait for itself.
void launchApartInRounds(const std::vector<Batch>& device) {
  std::vector<std::vector<braid::PlannedLaunch>> launches;
  for (const Batch& b : device) {
    b.comm->waitReady();  // its rounds are known once ready
    launches.push_back(b.comm->launchesOf(b.ops));
  }
  std::vector<braid::RankLaunches> ranks;
  for (size_t i = 0; i < device.size(); ++i) {
    const std::vector<braid::PlannedLaunch>& own = launches[i];
    const Batch& b = device[i];
    ranks.push_back({b.comm->launchRounds(), own.size(),
                     [&own, &b](size_t k) { b.comm->launchOne(own[k], b.stream); }});
  }
  braid::launchInRounds(ranks);
}

// A group's operations of CUDA communicators. Where the group drives several ranks of one
// communicator and every rank makes the same collectives, the k-th of every rank goes in one
// launch (their blocks wait for each other, and CUDA does not promise that kernels launched apart
// run together); otherwise each rank's operations are launched on its own stream.
void launchOnDevices(const std::vector<Batch>& device) {
  std::vector<braidComm*> comms;
  std::vector<braidStream_t> streams;
  for (const Batch& b : device) {
    comms.push_back(b.comm);
    streams.push_back(b.stream);
  }
  auto callsAt = [&](size_t k) {
    std::vector<CollArgs> calls;
    for (const Batch& b : device) calls.push_back(b.ops[k]);
    return calls;
  };
  bool together = device.size() > 1;
  for (const Batch& b : device) together = together && b.ops.size() == device[0].ops.size();
  for (size_t k = 0; together && k < device[0].ops.size(); ++k)
    together = braidComm::canLaunchTogether(comms, callsAt(k));
  if (!together) {
    // Kernels of ranks that wait for each other must not queue behind each other on one stream.
    for (size_t i = 0; i < device.size(); ++i)
      for (size_t j = i + 1; j < device.size(); ++j)
        if (device[i].stream == device[j].stream &&
            device[i].comm->options().cudaDevice == device[j].comm->options().cudaDevice)
          fail(braidInvalidUsage,
               "braidGroupEnd: ranks {} and {} of CUDA communicators have operations on the same "
               "stream {} in one group: each kernel would wait behind the other (expected a stream "
               "per rank)",
               device[i].comm->rank(), device[j].comm->rank(), device[i].stream);
    launchApartInRounds(device);
    return;
  }
  std::vector<std::vector<CollArgs>> calls;  // k-th: every rank's k-th
  for (size_t k = 0; k < device[0].ops.size(); ++k) calls.push_back(callsAt(k));
  size_t k = 0;
  for (size_t size : braidComm::launchesTogetherOf(comms, calls)) {
    braidComm::launchTogether(comms, std::span(calls).subspan(k, size), streams);
    k += size;
  }
}

// Communicators that share links take turns, so batches run together cannot be two of them.
void refuseSharedLinks(const std::vector<Batch>& together) {
  for (size_t i = 0; i < together.size(); ++i)
    for (size_t j = i + 1; j < together.size(); ++j)
      if (together[i].comm->sharesLinksWith(*together[j].comm))
        fail(braidInvalidUsage,
             "braidGroupEnd: the group holds operations of two communicators that share their "
             "links (splitShare/shrinkShare; rank {} of one, rank {} of the other): they take "
             "turns, so they cannot run in one group (expected separate groups)",
             together[i].comm->rank(), together[j].comm->rank());
}

// The batches by stream, in the order their streams first appear.
std::vector<std::vector<Batch>> byStream(std::vector<Batch> batches) {
  std::vector<std::vector<Batch>> streams;
  for (Batch& b : batches) {
    auto same = std::find_if(streams.begin(), streams.end(), [&](const std::vector<Batch>& s) {
      return s.front().stream == b.stream;
    });
    if (same == streams.end()) same = streams.insert(streams.end(), std::vector<Batch>{});
    same->push_back(std::move(b));
  }
  return streams;
}

GroupState& threadGroup() {
  thread_local GroupState group;
  return group;
}

void initializeAll(std::vector<PendingInit>& inits) {
  braid::runTogether(inits.size(), [&](size_t i) { inits[i].comm->initialize(inits[i].id); });
  for (auto& init : inits) init.comm->waitReady();  // throws the first failure
}

// The children of a group are made together: each parent's ranks meet over the bootstrap, so one
// thread's splits or shrinks of several ranks must progress at once.
void makeChildren(std::vector<PendingChild>& children) {
  runTogetherPerComm(
      children.size(), [&](size_t i) { return children[i].parent; },
      [&](size_t i) { children[i].makeInto(); });
}

void addChild(PendingChild child) {
  if (threadGroup().depth > 0) return threadGroup().children.push_back(std::move(child));
  child.makeInto();
}

void failIfAnyCallFailed(const GroupState& group, const char* fn) {
  if (group.failure)
    fail(group.failure->code, "{}: none of the group's {} operations ran: a call in it failed: {}",
         fn, group.ops.size(), group.failure->sentence);
}

struct GroupBatches {
  std::vector<Batch> now, queued, device;
};

// A group's operations as each communicator's batch: run now, queued on a host stream, or
// launched on its device.
GroupBatches batchesOf(const std::vector<GroupOp>& ops) {
  GroupBatches batches;
  std::map<braidComm*, braidStream_t> streamOf;
  for (const GroupOp& op : ops) {
    braidComm* comm = op.comm;
    if (streamOf.emplace(comm, op.stream).first->second != op.stream)
      fail(braidInvalidUsage,
           "braidGroupEnd: rank {} has operations on different streams in one group (expected "
           "one stream per communicator)",
           comm->rank());
    std::vector<Batch>& list = comm->onDevice()       ? batches.device
                               : op.stream == nullptr ? batches.now
                                                      : batches.queued;
    auto it =
        std::find_if(list.begin(), list.end(), [&](const Batch& b) { return b.comm == comm; });
    if (it == list.end()) it = list.insert(list.end(), Batch{comm, op.stream, {}});
    it->ops.push_back(op.args);
    it->collectives += op.beginsCollective ? 1 : 0;
  }
  return batches;
}

void endGroup() {
  GroupState group = std::move(threadGroup());
  threadGroup() = GroupState{};
  // Every communicator the group uses counted inside until it returns (as a call on it is: abort
  // and destroy wait for it).
  std::deque<CallInside> inside;
  for (const PendingInit& init : group.inits) inside.emplace_back(init.comm);
  for (const PendingChild& child : group.children) inside.emplace_back(child.parent);
  for (const GroupOp& op : group.ops) inside.emplace_back(op.comm);
  // Communicators are made even where the group failed: their peers' initializations wait for
  // them, and each was a whole call.
  initializeAll(group.inits);
  makeChildren(group.children);
  failIfAnyCallFailed(group, "braidGroupEnd");

  GroupBatches batches = batchesOf(group.ops);
  std::vector<Batch>& now = batches.now;
  std::vector<Batch>& device = batches.device;
  refuseSharedLinks(now);
  std::vector<std::vector<Batch>> streams = byStream(std::move(batches.queued));
  for (const std::vector<Batch>& onOneStream : streams) {
    refuseSharedLinks(onOneStream);
    failIfQueuedBehind(onOneStream);
  }
  // Nothing has run: the calls made here take their numbers (those on streams, as queued).
  for (const std::vector<Batch>* made : {&now, &device})
    for (const Batch& b : *made) b.comm->collectiveNumbers().take(b.collectives);
  launchOnDevices(device);
  for (std::vector<Batch>& onOneStream : streams) submitToStream(std::move(onOneStream));
  runNow(now);
}

namespace {

// The call as it runs: braidAvg of floating values as NCCL runs it, every input times 1/nranks
// then a sum (reduction_ops.h), under the name braidAvg (what its tag carries).
CollArgs asRun(braidComm* comm, CollArgs a) {
  if (!reduces(a.coll) || a.op != braidAvg || comm->nranks() == 1) return a;
  a.op = comm->reductionOps().average(a.type, comm->nranks());
  if (a.op != braidAvg) a.namedOp = braidAvg;
  return a;
}

}  // namespace

braidResult_t enqueue(const CollArgs& call, braidComm* comm, braidStream_t stream) {
  return collected(comm, [&] {
    validate(comm, call, stream);
    const CollArgs args = asRun(comm, call);
    // Outside a group a call runs alone: now, as a kernel, or as a host stream's task of its own;
    // so it ends before the matching call is made.
    const bool completesAlone = threadGroup().depth == 0;
    if (isSendOrRecv(args.coll) && args.root == comm->rank() && args.count != 0 && completesAlone)
      fail(braidInvalidUsage,
           "{} on rank {}: a send to or receive from self outside a group can never complete "
           "(put the matching send and receive in one braidGroupStart/braidGroupEnd)",
           apiName(args.coll), comm->rank());
    dispatch(comm, std::span(&args, 1), stream);
  });
}

void dispatch(braidComm* comm, std::span<const CollArgs> ops, braidStream_t stream) {
  // A call of several operations (AlltoAll, Gather, Scatter) is collective, as is one that is not
  // a send or receive.
  const bool collective = ops.size() > 1 || !isSendOrRecv(ops[0].coll);
  if (threadGroup().depth > 0) {
    for (size_t i = 0; i < ops.size(); ++i)
      threadGroup().ops.push_back({comm, ops[i], stream, collective && i == 0});
    return;
  }
  const uint64_t collectives = collective ? 1 : 0;
  if (stream != nullptr && !comm->onDevice())
    return submitToStream({Batch{comm, stream, {ops.begin(), ops.end()}, collectives}});
  comm->collectiveNumbers().take(collectives);
  if (comm->onDevice()) return comm->launch(ops, stream);
  runBatch(comm, ops);
}

}  // namespace braid::api
