// Which rank this process is, as the launcher (torchrun, Open MPI, Slurm) says in the
// environment. braidCommInitFromEnv reads it; the rendezvous address is the bootstrap's business.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace braid {

struct LaunchEnv {
  int rank = 0;
  int size = 0;
  int localRank = -1;  // -1: the launcher did not say
  int localSize = -1;  // -1: the launcher did not say
  std::string source;  // "torchrun", "Open MPI" or "Slurm"
};

// The first launcher convention present, in the order torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE), Open MPI (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE), Slurm
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and SLURM_TASKS_PER_NODE at SLURM_NODEID); nothing
// if none is. Malformed or inconsistent values are braidInvalidArgument naming the variable.
std::optional<LaunchEnv> readLaunchEnv();

// The same, reading variables through `lookup` (which returns nullptr for unset ones).
std::optional<LaunchEnv> readLaunchEnv(const std::function<const char*(const char*)>& lookup);

}  // namespace braid
