#include "perf/options.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "perf/types.h"

namespace braid_perf {
namespace {

struct NamedDatatype {
  const char* name;
  braidDataType_t type;
};
// Printed names first, then the aliases the flag also takes.
constexpr NamedDatatype kDatatypeSpellings[] = {
    {"int8", braidInt8},         {"uint8", braidUint8},           {"int32", braidInt32},
    {"uint32", braidUint32},     {"int64", braidInt64},           {"uint64", braidUint64},
    {"half", braidFloat16},      {"float16", braidFloat16},       {"float", braidFloat32},
    {"float32", braidFloat32},   {"double", braidFloat64},        {"float64", braidFloat64},
    {"bfloat16", braidBfloat16}, {"f8e4m3", braidFloat8e4m3},     {"float8e4m3", braidFloat8e4m3},
    {"f8e5m2", braidFloat8e5m2}, {"float8e5m2", braidFloat8e5m2},
};

std::vector<braidDataType_t> parseDatatypes(const std::string& text) {
  if (text == "all") {
    std::vector<braidDataType_t> all;
    for (const DatatypeInfo& info : kDatatypes) all.push_back(info.type);
    return all;
  }
  for (const NamedDatatype& spelling : kDatatypeSpellings)
    if (text == spelling.name) return {spelling.type};
  throw UsageError(fmt::format(
      "-d {}: unknown datatype; expected int8, uint8, int32, uint32, int64, uint64, half "
      "(float16), float (float32), double (float64), bfloat16, f8e4m3, f8e5m2 or all",
      text));
}

std::vector<braidRedOp_t> parseOps(const std::string& text) {
  std::vector<braidRedOp_t> ops;
  for (int op = 0; op < braidNumOps; ++op)
    if (text == "all" || text == kOpNames[op]) ops.push_back(static_cast<braidRedOp_t>(op));
  if (ops.empty())
    throw UsageError(
        fmt::format("-o {}: unknown reduction; expected sum, prod, max, min, avg or all", text));
  return ops;
}

std::string collectiveNames() {
  std::string names;
  for (const Collective& c : kCollectives)
    names += (names.empty() ? "" : ", ") + std::string(c.name);
  return names;
}

void validate(const Options& o) {
  if (o.minBytes > o.maxBytes)
    throw UsageError(fmt::format("-b {} is larger than -e {}: the sweep would be empty", o.minBytes,
                                 o.maxBytes));
  for (braidDataType_t type : o.datatypes) {
    const DatatypeInfo& info = datatypeInfo(type);
    if (o.minBytes < info.size)
      throw UsageError(fmt::format("-b {} is smaller than one {} element ({} bytes)", o.minBytes,
                                   info.name, info.size));
  }
  if (o.stepFactor < 1)
    throw UsageError(fmt::format("-f {}: the step factor must be >= 1", o.stepFactor));
  if (o.stepFactor == 1 && o.stepBytes == 0)
    throw UsageError("-i 0: the step must be at least one byte (or use -f 2 or more)");
  if (o.iters < 1) throw UsageError(fmt::format("-n {}: need at least one iteration", o.iters));
  if (o.aggIters < 1)
    throw UsageError(fmt::format("-m {}: need at least one call per group", o.aggIters));
  if (o.warmupIters < 0)
    throw UsageError(fmt::format("-w {}: warm-up iterations cannot be negative", o.warmupIters));
  if (o.threadsPerProcess < 1)
    throw UsageError(
        fmt::format("-t {}: need at least one rank (thread) per process", o.threadsPerProcess));
  if (o.ranksPerThread < 1)
    throw UsageError(fmt::format("-g {}: need at least one rank per thread", o.ranksPerThread));
  if (o.root < 0) throw UsageError(fmt::format("-r {}: the root must be a rank (>= 0)", o.root));
  if (o.device != "cpu" && o.device != "cuda")
    throw UsageError(fmt::format("--device {}: unknown device; expected cpu or cuda", o.device));
  if (o.registration != 0 && o.device != "cuda")
    throw UsageError(
        fmt::format("-R {}: registers device buffers (expected --device cuda)", o.registration));
  // A window is registered by every rank together; a thread driving several ranks would wait in
  // its first rank's registration for the next one's.
  if (o.registration == 2 && o.ranksPerThread > 1)
    throw UsageError(
        fmt::format("-R 2 with -g {}: windows are registered by every rank at once, "
                    "a thread for each (expected -g 1)",
                    o.ranksPerThread));
  if (o.timeoutSeconds < 1)
    throw UsageError(
        fmt::format("-T {}: the timeout must be at least one second", o.timeoutSeconds));
}

// The table DESIGN.md promises: every BRAID_* variable with the value this process would use.
void printParams() {
  const braidParam_t* params = nullptr;
  int count = 0;
  if (braidGetParams(&params, &count) != braidSuccess) throw UsageError(braidGetLastError(nullptr));
  size_t nameWidth = 0, valueWidth = 5;
  for (int i = 0; i < count; ++i) {
    nameWidth = std::max(nameWidth, std::strlen(params[i].name));
    valueWidth = std::max(valueWidth, std::strlen(params[i].value) + 2);
  }
  fmt::print(
      "# braid's tunables: variable, value in use (quoted), default if it differs, meaning\n");
  for (int i = 0; i < count; ++i) {
    const braidParam_t& p = params[i];
    const bool changed = std::strcmp(p.value, p.defaultValue) != 0;
    fmt::print("{:<{}}  {:<{}}  {}{}\n", p.name, nameWidth, fmt::format("'{}'", p.value),
               valueWidth, p.help, changed ? fmt::format(" (default '{}')", p.defaultValue) : "");
  }
}

}  // namespace

size_t parseSize(const std::string& text, const char* flag) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  double unit = 1;
  if (end != begin && *end != '\0' && end[1] == '\0') {
    switch (*end) {
      case 'K':
      case 'k':
        unit = 1024.0;
        ++end;
        break;
      case 'M':
      case 'm':
        unit = 1024.0 * 1024;
        ++end;
        break;
      case 'G':
      case 'g':
        unit = 1024.0 * 1024 * 1024;
        ++end;
        break;
      default: break;
    }
  }
  if (end == begin || *end != '\0' || !std::isfinite(value) || value < 0)
    throw UsageError(
        fmt::format("{} {}: not a size; expected bytes with an optional K, M or G "
                    "suffix, such as 8, 64K or 1M",
                    flag, text));
  if (value * unit >= 0x1p63)
    throw UsageError(
        fmt::format("{} {}: larger than any buffer this machine can hold", flag, text));
  return static_cast<size_t>(value * unit);
}

void checkRoot(const Options& o, int nranks) {
  if (o.collective->rooted && o.root >= nranks)
    throw UsageError(fmt::format("-r {}: {} needs a root rank below the {} ranks", o.root,
                                 o.collective->name, nranks));
}

std::vector<size_t> sweepSizes(const Options& o) {
  std::vector<size_t> sizes;
  for (size_t size = o.minBytes; size <= o.maxBytes;
       size = o.stepFactor > 1 ? size * o.stepFactor : size + o.stepBytes)
    sizes.push_back(size);
  return sizes;
}

namespace {

// The flags CLI11 fills as text or numbers, before they become Options.
struct Flags {
  std::string collective, minBytes, maxBytes, stepBytes, datatype = "float", op = "sum";
  std::string bind = "core";
  int check = 1, blocking = 0;
  bool showEnv = false;
  CLI::Option* processes = nullptr;
};

void addSweepFlags(CLI::App& app, Options& o, Flags& f) {
  app.add_option("collective", f.collective, "which collective to run");
  app.add_flag("--env", f.showEnv,
               "print braid's tunables (environment variables, values in use, defaults) and exit");
  app.add_option("-b,--minbytes", f.minBytes, "smallest message size (default 32M)");
  app.add_option("-e,--maxbytes", f.maxBytes, "largest message size (default 32M)");
  app.add_option("-i,--stepbytes", f.stepBytes, "size increment when -f is 1 (default 1M)");
  app.add_option("-f,--stepfactor", o.stepFactor, "size multiplier between rows (default 1)");
  app.add_option("-n,--iters", o.iters, "timed iterations per row (default 20)");
  app.add_option("-w,--warmup_iters", o.warmupIters, "warm-up iterations (default 5)");
  app.add_option("-m,--agg_iters", o.aggIters,
                 "calls aggregated in one group per timed iteration, each on its own part of the "
                 "buffers where they hold several (default 1)");
  app.add_option("-c,--check", f.check,
                 "1: check every element of one more run per row (default 1)")
      ->check(CLI::IsMember({0, 1}));
  app.add_option("-d,--datatype", f.datatype,
                 "int8 ... bfloat16, f8e4m3, f8e5m2, or all (default float)");
  app.add_option("-o,--op", f.op, "sum, prod, max, min, avg, or all (default sum)");
  app.add_option("-r,--root", o.root, "root rank of broadcast and reduce (default 0)");
  app.add_option("-z,--blocking", f.blocking,
                 "1: NULL stream, each call completes before it returns; 0: a host stream, "
                 "synchronized after the timed loop (default 0)")
      ->check(CLI::IsMember({0, 1}));
}

void addRunFlags(CLI::App& app, Options& o, Flags& f) {
  app.add_option("-R,--local_register", o.registration,
                 "register the device buffers: 1 as buffers, 2 as windows (symmetric; every "
                 "rank's buffers at the same offsets), 0 not (default 0)")
      ->check(CLI::IsMember({0, 1, 2}));
  app.add_option("-t,--nthreads", o.threadsPerProcess, "ranks as threads per process (default 1)");
  app.add_option("-g,--ngpus", o.ranksPerThread,
                 "ranks each thread drives, their calls in one group (nccl-tests' GPUs per thread; "
                 "with --device cuda rank r is on GPU r % GPUs; default 1)");
  f.processes = app.add_option("--np", o.processes, "fork this many local processes");
  app.add_option("--bind", f.bind,
                 "with --np: core binds each process to cores of its own when the ranks fit the "
                 "cores, as mpirun does; none leaves placement to the kernel (default core)")
      ->check(CLI::IsMember({"core", "none"}));
  app.add_option("--device", o.device, "cpu or cuda (default cpu)");
  app.add_option("-T,--timeout", o.timeoutSeconds,
                 "seconds the whole run may take before it is stopped (default 3600)");
  app.add_option("--json", o.jsonPath, "also write every row and the configuration to this file");
  app.add_option("--csv", o.csvPath,
                 "also write every row, each with the configuration, to this CSV file");
}

// The text flags into `o`, checked.
void applyFlags(const Flags& f, Options& o) {
  if (f.collective.empty())
    throw UsageError(
        fmt::format("which collective? expected one of: {} (or --env, --help)", collectiveNames()));
  o.collective = findCollective(f.collective);
  if (o.collective == nullptr)
    throw UsageError(fmt::format("unknown collective '{}'; expected one of: {}", f.collective,
                                 collectiveNames()));
  if (!f.minBytes.empty()) o.minBytes = parseSize(f.minBytes, "-b");
  if (!f.maxBytes.empty()) o.maxBytes = parseSize(f.maxBytes, "-e");
  if (!f.stepBytes.empty()) o.stepBytes = parseSize(f.stepBytes, "-i");
  o.datatypes = parseDatatypes(f.datatype);
  o.ops = parseOps(f.op);
  o.check = f.check == 1;
  o.bindCores = f.bind == "core";
  o.blocking = f.blocking == 1;
  if (f.processes->count() > 0 && o.processes < 1)
    throw UsageError(fmt::format("--np {}: need at least one process", o.processes));
  validate(o);
}

}  // namespace

std::optional<Options> parseOptions(int argc, char** argv) {
  CLI::App app{"braid-perf: bandwidth and correctness of braid's collectives, nccl-tests style.",
               "braid-perf"};
  app.footer(fmt::format(
      "Collectives: {}.\nRanks = processes x threads. --np N forks N local processes. Under "
      "mpirun, srun or torchrun (OMPI_COMM_WORLD_*, SLURM_*, RANK/WORLD_SIZE or BRAID_COMM_ID "
      "set) each process is one rank and BRAID_COMM_ID=host:port (or MASTER_ADDR/MASTER_PORT) "
      "names the rendezvous. Otherwise this process runs -t ranks as threads.\nExit status: 0 "
      "passed, 1 wrong values, 2 bad command line, 3 the run failed.\nExample: braid-perf "
      "allreduce -b 8 -e 256M -f 2 --np 2 -c 1",
      collectiveNames()));
  Options o;
  Flags f;
  addSweepFlags(app, o, f);
  addRunFlags(app, o, f);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  if (f.showEnv) {
    printParams();
    return std::nullopt;
  }
  applyFlags(f, o);
  return o;
}

}  // namespace braid_perf
