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
// The checks every call of `fn` shares: the datatype (its size returned) and the count, at most
// what `blocks` blocks of it fit in the address space.
size_t checkTypeAndCount(const braidComm* comm, const char* fn, braidDataType_t type, size_t count,
                         size_t blocks);
// A root or peer (`what`) among the communicator's ranks.
void checkRank(const braidComm* comm, const char* fn, const char* what, int value);
// A buffer `name` the call moves `bytes` through (count elements of the call's): not NULL, and one
// the communicator can reach.
void checkBuffer(const braidComm* comm, const char* fn, const char* name, const void* buffer,
                 size_t count, size_t bytes);
// Everything a collective or send/recv call's arguments must satisfy on this rank.
void validate(const braidComm* comm, const CollArgs& args, braidStream_t stream);

}  // namespace braid::api
