#include "core/entry.h"

#include "base/error.h"
#include "base/log.h"

namespace braid::api {

std::string& threadLastError() {
  thread_local std::string lastError;
  return lastError;
}

braidResult_t recordCurrentError(braidComm* comm) noexcept {
  try {
    const Error e = currentError();
    threadLastError() = e.what();
    if (comm != nullptr) comm->recordError(e);
    BRAID_WARN(log::kAll, "{}", e.what());
    return e.code();
  } catch (...) {
    return braidSystemError;
  }
}

}  // namespace braid::api
