// Group calls (braidGroupStart/End): the operations, initializations and child communicators a
// thread's group collects, and how they run at its end: each communicator's operations in order,
// several communicators of one thread together (on persistent group workers), or on host streams.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "braid/braid.h"
#include "coll/call.h"
#include "core/bootstrap.h"
#include "core/comm.h"
#include "core/entry.h"

namespace braid::api {

struct PendingInit {
  braidComm* comm;
  BootstrapId id;
};

// A communicator made from a parent (braidCommSplit, braidCommShrink), made at once or at the end
// of the group; newcomm NULL: a refused split's part in the exchange, which makes none.
struct PendingChild {
  braidComm* parent;
  braidComm_t* newcomm;
  std::function<braidComm*()> make;

  void makeInto() const {
    braidComm* made = make();
    if (newcomm != nullptr) *newcomm = made;
  }
};

// The first call of a group that failed: its code and sentence.
struct GroupFailure {
  braidResult_t code;
  std::string sentence;
};

// An operation a group holds; `beginsCollective`: the first of a collective call's operations (the
// call is numbered among its communicator's collectives at the group's end).
struct GroupOp {
  braidComm* comm;
  CollArgs args;
  braidStream_t stream;
  bool beginsCollective;
};

struct GroupState {
  int depth = 0;
  std::vector<GroupOp> ops;
  std::vector<PendingInit> inits;
  std::vector<PendingChild> children;
  std::optional<GroupFailure> failure;
};
// This thread's group.
GroupState& threadGroup();

// A call the group collects (an operation, an initialization, a split or shrink), run as guarded()
// runs it. As NCCL, one that fails inside a group fails the group too: braidGroupEnd then runs
// none of its operations and returns the first failure (a program that goes on as if the group
// were whole would wait for a call that never comes).
template <typename Body>
braidResult_t collected(braidComm* comm, Body&& body) noexcept {
  const braidResult_t result = guarded(comm, std::forward<Body>(body));
  GroupState& group = threadGroup();
  if (result != braidSuccess && group.depth > 0 && !group.failure) try {
      group.failure = GroupFailure{result, threadLastError()};
    } catch (...) {
      group.failure = GroupFailure{result, {}};  // no memory for the sentence: the code still
    }
  return result;
}

// Initializes communicators together (one thread's ranks meet over the bootstrap); throws the
// first failure.
void initializeAll(std::vector<PendingInit>& inits);

// Runs one communicator's operations in order; consecutive sends/receives progress together.
void runBatch(braidComm* comm, std::span<const CollArgs> ops);

struct Batch {
  braidComm* comm;
  braidStream_t stream;
  std::vector<CollArgs> ops;
  uint64_t collectives = 0;  // how many collective calls `ops` make (CollectiveNumbers)
};
// Queues batches of one host stream as one task of it, which runs them together, and numbers their
// collectives; fails, queuing nothing, where a task queued there runs another rank's part of one
// of their collectives (it waits for this one).
void submitToStream(std::vector<Batch> batches);

// Outside a group the child is made now; inside, at the group's end.
void addChild(PendingChild child);

// Throws the failure of a call of `group`, naming `fn` (the call that ends the group).
void failIfAnyCallFailed(const GroupState& group, const char* fn);

// The outermost braidGroupEnd: initializes, makes the children, runs or queues the operations
// (none where a call of the group failed: that failure is thrown).
void endGroup();

// One call of the C API (not AlltoAll, Gather or Scatter): checked, then dispatched.
braidResult_t enqueue(const CollArgs& args, braidComm* comm, braidStream_t stream);
// Checked calls of one communicator (AlltoAll, Gather and Scatter are several): kept for the end
// of this thread's open group, or launched on the device, queued on the host stream, or run now
// (consecutive sends and receives together).
void dispatch(braidComm* comm, std::span<const CollArgs> ops, braidStream_t stream);

}  // namespace braid::api
