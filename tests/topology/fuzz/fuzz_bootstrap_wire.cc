// libFuzzer target for what a stranger can send the bootstrap: a unique id handed in by a caller,
// a connection's hello at a root or listener, and a root's reply to a rank. The first byte picks
// which; any input either parses or fails with braid::Error.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "base/error.h"
#include "core/bootstrap.h"

namespace {
// The seeds' hellos prove this secret (seeds/bootstrap_wire).
constexpr uint8_t kSecretByte = 0x5a;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  uint8_t secret[32];
  std::memset(secret, kSecretByte, sizeof secret);
  try {
    switch (data[0] % 3) {
      case 0: {
        braidUniqueId id{};
        std::memcpy(id.internal, bytes.data(), std::min(bytes.size(), sizeof id.internal));
        braid::BootstrapId::decode(id);
        break;
      }
      case 1: braid::bootstrap_wire::decodeRootConnection(bytes, secret); break;
      case 2: braid::bootstrap_wire::decodeRootReply(bytes, 1 + data[0] / 3 % 4, 24); break;
    }
  } catch (const braid::Error&) {
  }
  return 0;
}
