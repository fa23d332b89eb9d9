// braid vs OpenMPI all-reduce (float32 sum) in one run, with one method for both: barrier, time
// one op, take the slowest rank's time, median over iterations. The libraries alternate in
// rounds at every size so machine drift hits both, and they share the same persistent,
// pre-touched buffers. With --ring, braid's ring (a second communicator allowed the ring alone)
// takes its turn too, for braid's choice against it. Launch: mpirun -np 2 allreduce_vs_mpi [-b 8]
// [-e 256M] [-f 2] [-n 1] [-r 4] [--ring] [--json FILE].
#include <mpi.h>
#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "braid/braid.h"

namespace {

struct Options {
  size_t minBytes = 8;
  size_t maxBytes = 256u << 20;
  size_t factor = 2;
  double iterScale = 1.0;
  int rounds = 4;
  bool ring = false;
  std::string jsonPath;
};

struct Row {
  size_t bytes;
  double braidUs;
  double ringUs;  // --ring only
  double mpiUs;
  double braidBusbw;
  double mpiBusbw;
  bool braidCorrect;
  bool ringCorrect;
  bool mpiCorrect;
};

// The bar the issue sets: braid's time over MPI's at most 0.67 from 16 MiB, at most 2 below.
double ratioBar(size_t bytes) {
  return bytes >= (16u << 20) ? 0.67 : 2.0;
}

int worldRank = 0;
int worldSize = 1;

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "rank %d: %s\n", worldRank, message.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

void checkBraid(braidResult_t result, const char* what) {
  if (result != braidSuccess)
    die(std::string(what) + " failed: " + braidGetErrorString(result) + ": " +
        braidGetLastError(nullptr));
}

// "64", "4K", "16M", "1G" (powers of 1024), as nccl-tests reads -b/-e.
size_t parseSize(const char* text) {
  char* end = nullptr;
  double value = std::strtod(text, &end);
  size_t unit = 1;
  if (*end == 'K' || *end == 'k') unit = 1u << 10;
  if (*end == 'M' || *end == 'm') unit = 1u << 20;
  if (*end == 'G' || *end == 'g') unit = 1u << 30;
  if (end == text || value <= 0 || (unit != 1 && end[1] != '\0') || (unit == 1 && *end != '\0'))
    die(std::string("cannot read size '") + text + "' (expected e.g. 8, 64K, 256M)");
  return static_cast<size_t>(value * unit);
}

Options parseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) die("option " + arg + " needs a value");
      return argv[++i];
    };
    if (arg == "-b") {
      o.minBytes = parseSize(value());
    } else if (arg == "-e") {
      o.maxBytes = parseSize(value());
    } else if (arg == "-f") {
      o.factor = std::strtoul(value(), nullptr, 10);
    } else if (arg == "-n") {
      o.iterScale = std::strtod(value(), nullptr);
    } else if (arg == "-r") {
      o.rounds = std::atoi(value());
    } else if (arg == "--ring") {
      o.ring = true;
    } else if (arg == "--json") {
      o.jsonPath = value();
    } else {
      die("unknown option " + arg +
          "; usage: allreduce_vs_mpi [-b min] [-e max] [-f factor] [-n iteration scale] "
          "[-r rounds] [--ring] [--json file]");
    }
  }
  if (o.factor < 2) die("-f must be at least 2");
  if (o.iterScale <= 0) die("-n must be positive");
  if (o.rounds < 1) die("-r must be at least 1");
  if (o.minBytes < sizeof(float) || o.minBytes > o.maxBytes)
    die("sizes must satisfy 4 <= -b <= -e");
  if (o.maxBytes / sizeof(float) > size_t(INT_MAX)) die("-e is past MPI's int element count");
  return o;
}

// Iterations per library at one size: about 1 GiB of payload, between 20 and 1000, times -n.
int iterationsFor(size_t bytes, const Options& o) {
  double iters = std::clamp<double>(double(1u << 30) / double(bytes), 20, 1000);
  return std::max(o.rounds, static_cast<int>(std::lround(iters * o.iterScale)));
}

std::string machineDescription() {
  std::string model = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  utsname u{};
  uname(&u);
  return model + ", " + std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " cores online, " +
         u.sysname + " " + u.release + " " + u.machine;
}

std::string affinityDescription() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "?";
  std::string cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
  return cpus;
}

// Exact in float32: small integers times (rank + 1), summed over ranks.
float inputValue(size_t i, int rank) {
  return float((i & 15) + 1) * float(rank + 1);
}

void fillInput(float* send, size_t count) {
  for (size_t i = 0; i < count; ++i) send[i] = inputValue(i, worldRank);
}

// True on every rank when every rank's result is the expected sum.
bool resultCorrect(const float* recv, size_t count) {
  const float rankFactor = float(worldSize * (worldSize + 1) / 2);
  long wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += recv[i] != float((i & 15) + 1) * rankFactor;
  long wrongEverywhere = 0;
  MPI_Allreduce(&wrong, &wrongEverywhere, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  return wrongEverywhere == 0;
}

struct Buffers {
  float* send;
  float* recv;
  size_t maxCount;
};

// Allocated once at the largest size and written through so no page fault lands in a timed op.
Buffers allocateBuffers(size_t maxBytes) {
  size_t rounded = (maxBytes + 4095) / 4096 * 4096;
  Buffers b{static_cast<float*>(std::aligned_alloc(4096, rounded)),
            static_cast<float*>(std::aligned_alloc(4096, rounded)), maxBytes / sizeof(float)};
  if (b.send == nullptr || b.recv == nullptr) die("cannot allocate " + std::to_string(maxBytes));
  fillInput(b.send, b.maxCount);
  std::memset(b.recv, 0, rounded);
  return b;
}

enum class Library { kBraid, kBraidRing, kMpi };

class Runner {
 public:
  Runner(braidComm_t comm, braidComm_t ringComm, const Buffers& buffers)
      : comm_(comm), ringComm_(ringComm), buf_(buffers) {}

  void op(Library lib, size_t count) {
    if (lib != Library::kMpi) {
      checkBraid(braidAllReduce(buf_.send, buf_.recv, count, braidFloat32, braidSum,
                                lib == Library::kBraid ? comm_ : ringComm_, nullptr),
                 "braidAllReduce");
    } else if (MPI_Allreduce(buf_.send, buf_.recv, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                             MPI_COMM_WORLD) != MPI_SUCCESS) {
      die("MPI_Allreduce failed");
    }
  }

  // Runs `iters` timed ops and appends each one's slowest-rank time (seconds) to `times`.
  // The first and last ops write into a poisoned buffer and are checked.
  bool timedRound(Library lib, size_t count, int iters, std::vector<double>& times) {
    std::vector<double> local(iters);
    bool correct = true;
    for (int it = 0; it < iters; ++it) {
      bool check = it == 0 || it == iters - 1;
      if (check) std::fill(buf_.recv, buf_.recv + count, std::nanf(""));
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = std::chrono::steady_clock::now();
      op(lib, count);
      auto t1 = std::chrono::steady_clock::now();
      local[it] = std::chrono::duration<double>(t1 - t0).count();
      if (check) correct = resultCorrect(buf_.recv, count) && correct;
    }
    std::vector<double> slowest(iters);
    MPI_Allreduce(local.data(), slowest.data(), iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    times.insert(times.end(), slowest.begin(), slowest.end());
    return correct;
  }

 private:
  braidComm_t comm_;
  braidComm_t ringComm_;  // null without --ring
  Buffers buf_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double busbwGBs(size_t bytes, double seconds) {
  return 2.0 * (worldSize - 1) / worldSize * double(bytes) / seconds / 1e9;
}

Row measureSize(Runner& runner, size_t bytes, const Options& o) {
  size_t count = bytes / sizeof(float);
  int iters = iterationsFor(bytes, o);
  int warmup = std::max(2, iters / 10);
  std::vector<Library> libraries = {Library::kBraid, Library::kMpi};
  if (o.ring) libraries.insert(libraries.begin() + 1, Library::kBraidRing);
  for (int i = 0; i < warmup; ++i)
    for (Library lib : libraries) runner.op(lib, count);
  std::vector<double> times[3];
  bool correct[3] = {true, true, true};
  for (int r = 0; r < o.rounds; ++r) {
    int roundIters = iters / o.rounds + (r < iters % o.rounds ? 1 : 0);
    // Rotate who goes first so none always follows another's cache footprint.
    for (size_t k = 0; k < libraries.size(); ++k) {
      const int lib = static_cast<int>(libraries[(k + r) % libraries.size()]);
      correct[lib] = runner.timedRound(Library(lib), count, roundIters, times[lib]) && correct[lib];
    }
  }
  const double braidS = median(times[0]), mpiS = median(times[2]);
  return {bytes,
          braidS * 1e6,
          o.ring ? median(times[1]) * 1e6 : 0,
          mpiS * 1e6,
          busbwGBs(bytes, braidS),
          busbwGBs(bytes, mpiS),
          correct[0],
          correct[1],
          correct[2]};
}

std::string checkText(const Row& row) {
  if (!row.ringCorrect) return "WRONG(ring)";
  if (row.braidCorrect && row.mpiCorrect) return "ok";
  if (!row.braidCorrect && !row.mpiCorrect) return "WRONG(both)";
  return row.braidCorrect ? "WRONG(mpi)" : "WRONG(braid)";
}

void writeJson(const std::string& path, const std::string& machine, const std::string& mpiVersion,
               const std::vector<Row>& rows) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) die("cannot write " + path + ": " + std::strerror(errno));
  std::fprintf(f,
               "{\n  \"machine\": \"%s\",\n  \"mpi\": \"%s\",\n  \"ranks\": %d,\n  \"rows\": [\n",
               machine.c_str(), mpiVersion.c_str(), worldSize);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(f,
                 "    {\"bytes\": %zu, \"braid_us\": %.3f, \"ring_us\": %.3f, \"mpi_us\": %.3f, "
                 "\"ratio\": %.4f, \"braid_busbw_gbs\": %.4f, \"mpi_busbw_gbs\": %.4f, "
                 "\"bar\": %.2f, \"check\": \"%s\"}%s\n",
                 r.bytes, r.braidUs, r.ringUs, r.mpiUs, r.braidUs / r.mpiUs, r.braidBusbw,
                 r.mpiBusbw, ratioBar(r.bytes), checkText(r).c_str(),
                 i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
}

// One line: what the MPI library calls itself (its first line, quotes dropped for the JSON).
std::string mpiLibraryVersion() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, length);
  version = version.substr(0, version.find_first_of("\n,"));
  version.erase(std::remove(version.begin(), version.end(), '"'), version.end());
  return version;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &worldRank);
  MPI_Comm_size(MPI_COMM_WORLD, &worldSize);
  Options o = parseOptions(argc, argv);

  braidUniqueId id;
  if (worldRank == 0) checkBraid(braidGetUniqueId(&id), "braidGetUniqueId");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.device = "cpu";  // the buffers are host memory, whatever accelerator the machine has
  braidComm_t comm = nullptr;
  checkBraid(braidCommInitRankConfig(&comm, worldSize, id, worldRank, &config),
             "braidCommInitRankConfig");
  braidComm_t ringComm = nullptr;
  if (o.ring) {
    if (worldRank == 0) checkBraid(braidGetUniqueId(&id), "braidGetUniqueId");
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    config.algorithms = "ring";
    checkBraid(braidCommInitRankConfig(&ringComm, worldSize, id, worldRank, &config),
               "braidCommInitRankConfig (ring)");
  }

  Buffers buffers = allocateBuffers(o.maxBytes);
  Runner runner(comm, ringComm, buffers);

  const std::string machine = machineDescription();
  const std::string mpiVersion = mpiLibraryVersion();
  std::vector<std::string> affinities(worldSize);
  {
    char mine[256] = {};
    std::snprintf(mine, sizeof mine, "%s", affinityDescription().c_str());
    std::vector<char> all(256 * worldSize);
    MPI_Gather(mine, 256, MPI_CHAR, all.data(), 256, MPI_CHAR, 0, MPI_COMM_WORLD);
    for (int r = 0; r < worldSize; ++r) affinities[r] = all.data() + 256 * r;
  }
  int braidVersion = 0;
  braidGetVersion(&braidVersion);
  if (worldRank == 0) {
    std::printf("# allreduce_vs_mpi: float32 sum, %d ranks, out-of-place, persistent buffers\n",
                worldSize);
    std::printf("# machine: %s\n", machine.c_str());
    std::printf("# braid %d.%d.%d; %s\n", braidVersion / 10000, braidVersion / 100 % 100,
                braidVersion % 100, mpiVersion.c_str());
    std::printf("# rank cpus:");
    for (int r = 0; r < worldSize; ++r) std::printf(" %d->[%s]", r, affinities[r].c_str());
    std::printf("\n# per op: barrier, time one op, slowest rank; median; %d alternating rounds\n",
                o.rounds);
    std::printf("# bar: braid/MPI <= 0.67 from 16 MiB, <= 2 below; busbw = 2(n-1)/n*bytes/time\n");
    std::printf("%12s %7s %12s %12s %8s %6s %10s %10s %12s%s", "size(B)", "iters", "braid(us)",
                "mpi(us)", "ratio", "bar", "braid GB/s", "mpi GB/s", "check",
                o.ring ? "      ring(us) braid/ring" : "");
    std::printf("  algorithm(model us)\n");
    std::fflush(stdout);
  }

  std::vector<Row> rows;
  for (size_t bytes = o.minBytes; bytes <= o.maxBytes; bytes *= o.factor) {
    Row row = measureSize(runner, bytes, o);
    rows.push_back(row);
    if (worldRank == 0) {
      double ratio = row.braidUs / row.mpiUs;
      std::printf("%12zu %7d %12.2f %12.2f %8.3f %6s %10.3f %10.3f %12s", bytes,
                  iterationsFor(bytes, o), row.braidUs, row.mpiUs, ratio,
                  ratio <= ratioBar(bytes) ? "met" : "MISSED", row.braidBusbw, row.mpiBusbw,
                  checkText(row).c_str());
      if (o.ring) std::printf(" %13.2f %10.3f", row.ringUs, row.braidUs / row.ringUs);
      braidPrediction_t chosen{};
      checkBraid(braidCommPredict(comm, braidCollAllReduce, bytes, &chosen), "braidCommPredict");
      std::printf("  %s(%.0f)\n", chosen.algorithm, chosen.microseconds);
      std::fflush(stdout);
    }
    if (bytes > o.maxBytes / o.factor) break;  // next step would pass -e (or overflow)
  }

  int met = 0;
  bool allCorrect = true;  // the same on every rank: the checks are collective
  for (const Row& r : rows) {
    met += r.braidUs / r.mpiUs <= ratioBar(r.bytes);
    allCorrect = allCorrect && r.braidCorrect && r.ringCorrect && r.mpiCorrect;
  }
  if (worldRank == 0) {
    std::printf("# bar met at %d of %zu sizes; results %s\n", met, rows.size(),
                allCorrect ? "all correct" : "WRONG somewhere (see check column)");
    if (!o.jsonPath.empty()) writeJson(o.jsonPath, machine, mpiVersion, rows);
  }

  checkBraid(braidCommDestroy(comm), "braidCommDestroy");
  if (ringComm != nullptr) checkBraid(braidCommDestroy(ringComm), "braidCommDestroy (ring)");
  std::free(buffers.send);
  std::free(buffers.recv);
  MPI_Finalize();
  return allCorrect ? 0 : 1;
}
