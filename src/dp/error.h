// How src/dp fails: braid::dp::Error with a formatted sentence.
#pragma once

#include <fmt/format.h>

#include <utility>

#include "braid/dp.hpp"

namespace braid::dp {

template <typename... Args>
[[noreturn]] void fail(braidResult_t code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace braid::dp
