// The braid-perf method for other libraries (bench/peers): the same flags, sizes, warm-up, timed
// loop (time per op = the loop's time / -n, the slowest rank's), check and nccl-tests table, so a
// peer's rows line up with braid-perf's. A driver implements PeerComm over its library.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "perf/options.h"
#include "perf/report.h"

namespace braid_perf {

class PeerComm {
 public:
  virtual ~PeerComm() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  // Returns once every rank has entered it.
  virtual void barrier() = 0;
  // values[i] = the largest values[i] over the ranks, on every rank.
  virtual void maxOverRanks(double* values, int count) = 0;
  // Every rank's pid and host, in rank order.
  virtual std::vector<RankInfo> rankInfo() = 0;
  // One blocking call of options.collective with a braid_perf::Layout's paramCount.
  virtual void run(const void* send, void* recv, size_t count, braidDataType_t type,
                   braidRedOp_t op) = 0;
};

struct PeerInfo {
  std::string tool;     // "mpi-perf"
  std::string library;  // "Open MPI"
  std::string version;
  std::string launch;  // "mpirun"
};

// Runs every datatype x op sweep of the options (rank 0 prints the table); returns the number of
// wrong elements, the same on every rank. Throws RunError when a call fails.
int64_t runPeerBenchmark(const Options& options, PeerComm& comm, const PeerInfo& info);

// Parses argv like braid-perf, then refuses what the peer cannot run (UsageError): collectives
// outside `collectives`, datatypes or ops the library lacks, --np and -t (use mpirun). Returns
// nullopt after --help.
std::optional<Options> parsePeerOptions(int argc, char** argv,
                                        const std::vector<std::string>& collectives,
                                        const std::vector<braidDataType_t>& datatypes,
                                        const std::vector<braidRedOp_t>& ops);

}  // namespace braid_perf
