// Logging: BRAID_DEBUG=WARN|INFO|TRACE, BRAID_DEBUG_SUBSYS=INIT,COLL,... (prefix ^ excludes),
// BRAID_DEBUG_FILE=path (%h host, %p pid). Off by default, one branch on the hot path.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <string>

namespace braid::log {

enum class Level { None = 0, Warn = 1, Info = 2, Trace = 3 };

enum Subsys : unsigned {
  kInit = 1u << 0,
  kColl = 1u << 1,
  kP2p = 1u << 2,
  kShm = 1u << 3,
  kNet = 1u << 4,
  kBootstrap = 1u << 5,
  kEnv = 1u << 6,
  kAll = ~0u,
};

struct Settings {
  std::atomic<Level> level;
  std::atomic<unsigned> subsys;
};
// Read from the environment at first use; rereadSettings() reads it again.
Settings& settings();
// Reads BRAID_DEBUG, BRAID_DEBUG_SUBSYS and BRAID_DEBUG_FILE again (braidResetDebugInit).
void rereadSettings();

// A file name pattern with %h replaced by the host name and %p by the pid (BRAID_DEBUG_FILE,
// BRAID_PLAN_DUMP_FILE).
std::string expandPath(const std::string& pattern);

inline bool enabled(Level level, unsigned subsys) {
  Settings& s = settings();
  return level <= s.level.load(std::memory_order_relaxed) &&
         (level == Level::Warn || (subsys & s.subsys.load(std::memory_order_relaxed)) != 0);
}

void write(Level level, unsigned subsys, const std::string& message);

// Rank shown in this thread's log lines; -1 while unknown.
void setThreadRank(int rank);

}  // namespace braid::log

#define BRAID_LOG(level, subsys, ...)                                 \
  do {                                                                \
    if (::braid::log::enabled(level, subsys))                         \
      ::braid::log::write(level, subsys, ::fmt::format(__VA_ARGS__)); \
  } while (0)
#define BRAID_WARN(subsys, ...) BRAID_LOG(::braid::log::Level::Warn, subsys, __VA_ARGS__)
#define BRAID_INFO(subsys, ...) BRAID_LOG(::braid::log::Level::Info, subsys, __VA_ARGS__)
#define BRAID_TRACE(subsys, ...) BRAID_LOG(::braid::log::Level::Trace, subsys, __VA_ARGS__)
