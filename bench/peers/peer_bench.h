// The braid-perf method for other libraries (bench/peers): the same flags and the same sweeps
// (perf/sweep.h: sizes, warm-up, timed loop, check, nccl-tests table), so a peer's rows line up
// with braid-perf's. A driver implements PeerComm over its library.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "perf/launch.h"
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
  int processes = 0;   // 0: a process per rank
};

// How a peer's calls complete: each before it returns (a CPU library's), or in order on the
// rank's stream, complete() waiting for them (a GPU library's; -z 1 then waits for each).
enum class PeerCalls { Blocking, StreamOrdered };

// Runs every datatype x op sweep of the options (rank 0 prints the table); returns the number of
// wrong elements, the same on every rank. Throws RunError when a call fails.
int64_t runPeerBenchmark(const Options& options, PeerComm& comm, const PeerInfo& info);

// Parses argv like braid-perf, then refuses what the peer cannot run (UsageError): collectives
// outside `collectives`, datatypes or ops the library lacks, --np and -t (use mpirun), -R (no
// peer registers). Returns nullopt after --help.
std::optional<Options> parsePeerOptions(int argc, char** argv,
                                        const std::vector<std::string>& collectives,
                                        const std::vector<braidDataType_t>& datatypes,
                                        const std::vector<braidRedOp_t>& ops,
                                        PeerCalls calls = PeerCalls::Blocking);

// A driver's main, stdout line-buffered: `body` returns the exit status; a UsageError is
// kExitUsage and any other failure kExitFailed, each said on stderr under the tool's name.
template <typename Body>
int peerMain(const char* tool, Body&& body) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    return body();
  } catch (const UsageError& e) {
    fmt::print(stderr, "{}: {}\n", tool, e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: {}\n", tool, e.what());
    return kExitFailed;
  }
}

}  // namespace braid_perf
