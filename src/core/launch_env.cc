#include "core/launch_env.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string_view>

#include "base/error.h"

namespace braid {
namespace {

struct Convention {
  const char* source;
  const char* rank;
  const char* size;
  const char* localRank;
  const char* localSize;  // nullptr: derived another way
};

constexpr Convention kConventions[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

bool isSet(const char* value) {
  return value != nullptr && *value != '\0';
}

int parseCount(std::string_view text, const char* name, const char* whole) {
  std::string digits(text);
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(digits.c_str(), &end, 10);
  if (digits.empty() || digits[0] == '-' || digits[0] == '+' || errno != 0 || *end != '\0' ||
      value > INT_MAX)
    fail(braidInvalidArgument, "{}='{}' is not a non-negative integer", name, whole);
  return static_cast<int>(value);
}

int readCount(const std::function<const char*(const char*)>& lookup, const char* name) {
  const char* value = lookup(name);
  return isSet(value) ? parseCount(value, name, value) : -1;
}

// SLURM_TASKS_PER_NODE lists tasks per node compressed, e.g. "2(x3),1": three nodes with two
// tasks, then one node with one.
int slurmTasksOnNode(const char* tasksPerNode, int node) {
  constexpr const char* kName = "SLURM_TASKS_PER_NODE";
  std::string_view list = tasksPerNode;
  int firstNode = 0;
  while (!list.empty()) {
    std::string_view item = list.substr(0, list.find(','));
    list.remove_prefix(std::min(item.size() + 1, list.size()));
    int repeat = 1;
    size_t paren = item.find('(');
    if (paren != std::string_view::npos) {
      if (!item.ends_with(")") || item.substr(paren + 1, 1) != "x")
        fail(braidInvalidArgument, "{}='{}' is not like '2(x3),1'", kName, tasksPerNode);
      repeat = parseCount(item.substr(paren + 2, item.size() - paren - 3), kName, tasksPerNode);
      item = item.substr(0, paren);
    }
    int tasks = parseCount(item, kName, tasksPerNode);
    if (node < firstNode + repeat) return tasks;
    firstNode += repeat;
  }
  fail(braidInvalidArgument, "{}='{}' lists {} nodes, but SLURM_NODEID is {}", kName, tasksPerNode,
       firstNode, node);
}

LaunchEnv read(const Convention& c, const std::function<const char*(const char*)>& lookup) {
  if (!isSet(lookup(c.rank)) || !isSet(lookup(c.size)))
    fail(braidInvalidArgument, "{} is set but {} is not ({} sets both)",
         isSet(lookup(c.rank)) ? c.rank : c.size, isSet(lookup(c.rank)) ? c.size : c.rank,
         c.source);
  LaunchEnv env;
  env.source = c.source;
  env.rank = readCount(lookup, c.rank);
  env.size = readCount(lookup, c.size);
  env.localRank = readCount(lookup, c.localRank);
  if (c.localSize != nullptr) {
    env.localSize = readCount(lookup, c.localSize);
  } else if (isSet(lookup("SLURM_TASKS_PER_NODE")) && isSet(lookup("SLURM_NODEID"))) {
    env.localSize =
        slurmTasksOnNode(lookup("SLURM_TASKS_PER_NODE"), readCount(lookup, "SLURM_NODEID"));
  }
  if (env.size < 1) fail(braidInvalidArgument, "{}={} must be at least 1", c.size, env.size);
  if (env.rank >= env.size)
    fail(braidInvalidArgument, "{}={} is not below {}={}", c.rank, env.rank, c.size, env.size);
  if (env.localSize > env.size)
    fail(braidInvalidArgument, "local size {} exceeds {}={}", env.localSize, c.size, env.size);
  if (env.localRank >= 0 && env.localSize >= 0 && env.localRank >= env.localSize)
    fail(braidInvalidArgument, "{}={} is not below the local size {}", c.localRank, env.localRank,
         env.localSize);
  return env;
}

}  // namespace

std::optional<LaunchEnv> readLaunchEnv(const std::function<const char*(const char*)>& lookup) {
  for (const Convention& c : kConventions)
    if (isSet(lookup(c.rank)) || isSet(lookup(c.size))) return read(c, lookup);
  return std::nullopt;
}

std::optional<LaunchEnv> readLaunchEnv() {
  return readLaunchEnv([](const char* name) { return std::getenv(name); });
}

}  // namespace braid
