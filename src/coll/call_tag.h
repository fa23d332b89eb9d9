// Every slot a rank sends carries a tag that says which call it belongs to (collective, datatype,
// op, root, count and the communicator's collective number). A receiver compares the tag with its
// own call, so ranks that called different collectives, or one collective with different
// arguments, or skipped a call, get an error that names both ranks and the argument, never a
// silently wrong result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "coll/call.h"
#include "transport/connector.h"

namespace braid {

// The C API's name of a collective ("braidAllReduce", "braidSend", ...), for sentences.
const char* apiName(Collective c);

// The tag of one call: `sequence` numbers the communicator's collectives (1, 2, ...); send/recv
// take 0, since point-to-point traffic is not collective; `comm` is the communicator's identity.
CallTag callTag(const CollArgs& args, uint64_t sequence, uint64_t comm);

// The sentence for a tag that differs from this rank's call: which argument, both values, both
// ranks.
std::string describeMismatch(const CallTag& mine, const CallTag& theirs, int self, int peer);

// The payload of the next slot from `from`, once it has arrived, checked against this rank's
// call; fails with braidInvalidUsage if it belongs to another.
const void* receive(RecvConnector& from, const CallTag& mine, size_t bytes, Watchdog& dog);
// The same without waiting: nullptr while nothing has arrived.
const void* tryReceive(RecvConnector& from, const CallTag& mine, size_t bytes);

}  // namespace braid
