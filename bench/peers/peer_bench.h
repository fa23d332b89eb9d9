// The braid-perf method for other libraries (bench/peers): the same flags and the same sweeps
// (perf/sweep.h: sizes, warm-up, timed loop, check, nccl-tests table), so a peer's rows line up
// with braid-perf's. A driver implements PeerComm over its library.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "perf/options.h"
#include "perf/report.h"
#include "perf/sweep.h"

namespace braid_perf {

// A peer library's communicator: its calls block, so complete() has nothing to do.
using PeerComm = BenchComm;

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
