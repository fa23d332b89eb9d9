// How every entry point of the C API ends: a failure of any kind becomes a result code and a
// sentence (the thread's last error, and the communicator's); no exception crosses the C boundary.
#pragma once

#include <string>

#include "braid/braid.h"
#include "core/comm.h"

namespace braid::api {

// The sentence of the last failure on this thread (braidGetLastError without a communicator).
std::string& threadLastError();

// The failure being handled, recorded as the last error (of the thread and of `comm`); returns its
// code. Never throws: with no memory left to record the sentence, the code still gets out.
braidResult_t recordCurrentError(braidComm* comm) noexcept;

template <typename Body>
braidResult_t guarded(braidComm* comm, Body&& body) noexcept {
  try {
    body();
    return braidSuccess;
  } catch (...) {
    return recordCurrentError(comm);
  }
}

}  // namespace braid::api
