// Random bytes from the kernel, and FNV-1a hashing (names and derived ids, never secrets that
// must resist a guess).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace braid {

// `bytes` random bytes from getrandom(2); fails with braidSystemError if the kernel cannot give
// them.
void fillRandom(void* out, size_t bytes);

// FNV-1a 64 of `text`, continuing from `hash`.
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t fnv1a(std::string_view text, uint64_t hash = kFnvOffset) {
  for (char c : text) hash = (hash ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return hash;
}

}  // namespace braid
