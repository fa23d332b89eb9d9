// One error model: code below the C API throws braid::Error; the API entry catches it, records
// the sentence as the last error and returns the code. Nothing throws across the C boundary.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "braid/braid.h"

namespace braid {

class Error : public std::runtime_error {
 public:
  Error(braidResult_t code, std::string message)
      : std::runtime_error(std::move(message)), code_(code) {}
  braidResult_t code() const { return code_; }

 private:
  braidResult_t code_;
};

template <typename... Args>
[[noreturn]] void fail(braidResult_t code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

// Formats errno into a failure: "<what>: <strerror>".
[[noreturn]] void failErrno(braidResult_t code, const std::string& what, int err);

// The exception being handled, as braid's error, so that every failure reaches the caller and the
// peers the same way: an Error as it is; std::bad_alloc as braidSystemError; anything else as
// braidInternalError. Those two are prefixed with `where` ("rank 1: allreduce #3: out of memory").
// Call only inside a catch block.
Error currentError(const std::string& where = "");

}  // namespace braid
