#include "peer_bench.h"

#include <fmt/format.h>

#include <algorithm>

#include "perf/collectives.h"
#include "perf/types.h"

namespace braid_perf {
namespace {

template <typename T>
bool contains(const std::vector<T>& values, const T& value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

}  // namespace

int64_t runPeerBenchmark(const Options& options, PeerComm& comm, const PeerInfo& info) {
  RunInfo run;
  run.launch = info.launch;
  run.nranks = comm.nranks();
  run.processes = info.processes > 0 ? info.processes : comm.nranks();
  run.threadsPerProcess = 1;
  run.braidVersion = info.version;
  run.tool = info.tool;
  run.library = info.library;
  return runSweeps(options, comm, std::move(run));
}

std::optional<Options> parsePeerOptions(int argc, char** argv,
                                        const std::vector<std::string>& collectives,
                                        const std::vector<braidDataType_t>& datatypes,
                                        const std::vector<braidRedOp_t>& ops, PeerCalls calls) {
  std::optional<Options> o = parseOptions(argc, argv);
  if (!o) return o;
  if (!contains(collectives, std::string(o->collective->name)))
    throw UsageError(fmt::format("{}: not measured by this driver; expected one of: {}",
                                 o->collective->name, fmt::join(collectives, ", ")));
  for (braidDataType_t type : o->datatypes)
    if (!contains(datatypes, type))
      throw UsageError(
          fmt::format("-d {}: this library has no such datatype", datatypeInfo(type).name));
  if (o->collective->reduces)
    for (braidRedOp_t op : o->ops)
      if (!contains(ops, op))
        throw UsageError(fmt::format("-o {}: this library has no such reduction", kOpNames[op]));
  if (o->processes > 0 || o->threadsPerProcess > 1)
    throw UsageError("--np and -t: one rank per process; start the ranks with mpirun -np N");
  if (o->registration != 0)
    throw UsageError(fmt::format("-R {}: this driver registers no buffers", o->registration));
  if (calls == PeerCalls::Blocking) o->blocking = true;  // each call returns with its result
  return o;
}

}  // namespace braid_perf
