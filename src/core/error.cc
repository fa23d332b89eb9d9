#include "core/error.h"

#include <cstring>

namespace braid {

void failErrno(braidResult_t code, const std::string& what, int err) {
  throw Error(code, fmt::format("{}: {}", what, std::strerror(err)));
}

}  // namespace braid
