// braid-perf's command line: nccl-tests' flags with their meanings, plus how ranks are launched.
#pragma once

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "perf/collectives.h"

namespace braid_perf {

struct Options {
  const Collective* collective = nullptr;
  size_t minBytes = 32u << 20;  // nccl-tests' defaults
  size_t maxBytes = 32u << 20;
  size_t stepBytes = 1u << 20;
  int stepFactor = 1;  // > 1: sizes grow by this factor; otherwise by stepBytes
  int iters = 20;
  int warmupIters = 5;
  int aggIters = 1;  // -m: calls of each rank in one group per timed iteration
  bool check = true;
  std::vector<braidDataType_t> datatypes{braidFloat32};
  std::vector<braidRedOp_t> ops{braidSum};
  int root = 0;
  bool blocking = false;  // -z 1: NULL stream, each call completes before it returns
  // -R, as nccl-tests: 1 registers every rank's device buffers (braidCommRegister), 2 registers
  // them as windows (braidCommWindowRegister: ranks of a GPU launched apart may then run the
  // direct engine); 0 neither.
  int registration = 0;
  int threadsPerProcess = 1;
  int ranksPerThread = 1;  // -g: a thread drives this many ranks, its calls in one group
  int processes = 0;       // --np; 0 when not given
  bool bindCores = true;   // --bind core: each forked process on cores of its own (see launch.cc)
  std::string device = "cpu";
  int timeoutSeconds = 3600;
  std::string jsonPath;
  std::string csvPath;

  int ranksPerProcess() const { return threadsPerProcess * ranksPerThread; }
};

// A command line braid-perf cannot run; what() is one sentence naming the flag.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A run that could not complete: a braid call failed, a rank died, a file could not be written.
class RunError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses and validates argv. Returns nullopt after printing --help. Throws UsageError.
std::optional<Options> parseOptions(int argc, char** argv);

// "8", "1K", "1.5M", "2G" (powers of 1024, as nccl-tests) to bytes; throws UsageError naming flag.
size_t parseSize(const std::string& text, const char* flag);

// Throws UsageError if a rooted collective's -r is not one of the nranks ranks.
void checkRoot(const Options& options, int nranks);

// The message sizes of one sweep: from minBytes to maxBytes by stepFactor or stepBytes.
std::vector<size_t> sweepSizes(const Options& options);

// Every datatype x op the options ask for, in order; a collective that does not reduce gets one
// pass per datatype (its op, braidSum, is not used).
template <typename Visit>
void forEachTypeAndOp(const Options& o, bool reduces, Visit visit) {
  for (braidDataType_t type : o.datatypes) {
    if (!reduces) {
      visit(type, braidSum);
      continue;
    }
    for (braidRedOp_t op : o.ops) visit(type, op);
  }
}

}  // namespace braid_perf
