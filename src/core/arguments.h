// The C API's argument checks: each failure names the call, the rank, the argument and what was
// expected.
#pragma once

#include <cstddef>

#include "braid/braid.h"
#include "coll/call.h"
#include "core/comm.h"

namespace braid::api {

bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes);
void checkComm(const braidComm* comm, const char* fn);
void checkStream(const braidComm* comm, const char* fn, braidStream_t stream);
// Everything a collective or send/recv call's arguments must satisfy on this rank.
void validate(const braidComm* comm, const CollArgs& args, braidStream_t stream);

}  // namespace braid::api
