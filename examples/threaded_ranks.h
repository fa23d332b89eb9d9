// Runs a function on N ranks as threads of this process, each with its own CPU communicator
// (with a timeout, so a broken collective fails instead of hanging). Returns each rank's failure.
#pragma once

#include <braid/braid.h>

#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace threaded_ranks {

inline constexpr int kTimeoutMs = 60000;

inline std::string onRanks(int nranks, const std::function<void(braidComm_t comm, int rank)>& fn) {
  braidUniqueId id;
  if (braidGetUniqueId(&id) != braidSuccess) return braidGetLastError(nullptr);
  std::vector<std::string> errors(nranks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank)
    threads.emplace_back([&, rank] {
      braidConfig_t config = BRAID_CONFIG_INITIALIZER;
      config.timeoutMs = kTimeoutMs;
      config.device = "cpu";
      braidComm_t comm = nullptr;
      if (braidCommInitRankConfig(&comm, nranks, id, rank, &config) != braidSuccess) {
        errors[rank] = braidGetLastError(nullptr);
        return;
      }
      try {
        fn(comm, rank);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
        braidCommAbort(comm);
        return;
      }
      braidCommDestroy(comm);
    });
  for (std::thread& t : threads) t.join();
  std::string all;
  for (int rank = 0; rank < nranks; ++rank)
    if (!errors[rank].empty()) all += "rank " + std::to_string(rank) + ": " + errors[rank] + "\n";
  return all;
}

}  // namespace threaded_ranks
