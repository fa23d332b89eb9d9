#include "base/random.h"

#include <sys/random.h>

#include <cerrno>

#include "base/error.h"

namespace braid {

void fillRandom(void* out, size_t bytes) {
  auto* p = static_cast<uint8_t*>(out);
  size_t have = 0;
  while (have < bytes) {
    const ssize_t n = getrandom(p + have, bytes - have, 0);
    if (n < 0 && errno != EINTR) failErrno(braidSystemError, "getrandom", errno);
    if (n > 0) have += static_cast<size_t>(n);
  }
}

}  // namespace braid
