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

// The call counted inside `comm` (if any) until it has returned, its error recorded.
class CallInside {
 public:
  explicit CallInside(braidComm* comm) : comm_(comm) {
    if (comm_ != nullptr) comm_->callsInside().begin();
  }
  ~CallInside() {
    if (comm_ != nullptr) comm_->callsInside().end();  // the call's last touch of comm
  }
  CallInside(const CallInside&) = delete;
  CallInside& operator=(const CallInside&) = delete;

 private:
  braidComm* comm_;
};

template <typename Body>
braidResult_t guarded(braidComm* comm, Body&& body) noexcept {
  const CallInside inside(comm);
  try {
    body();
    return braidSuccess;
  } catch (...) {
    return recordCurrentError(comm);
  }
}

}  // namespace braid::api
