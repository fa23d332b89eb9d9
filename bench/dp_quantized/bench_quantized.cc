// braid::dp's quantized all-gather and reduce-scatter (dp_quantized.hpp) against braidAllGather and
// braidReduceScatter on fp32: bytes each rank sends, time (median over iterations of the slowest
// rank's), and the quantization error against the bound the header derives. Prints a markdown
// table (the one in bench/results/dp_quantized.md).
//
//   bench_quantized [--ranks N] [--iters N] [--block N] [--min-mib N] [--max-mib N]
//
// Without a launcher's environment it forks --ranks local processes (shared memory between
// them). Under one (BRAID_COMM_ID or MASTER_ADDR/MASTER_PORT with RANK/WORLD_SIZE, as
// tests/multihost/bench_net.sh starts braid-perf on namespace hosts) each process is one rank and
// rank 0 prints.
#include <braid/braid.h>

#include <algorithm>
#include <braid/dp_quantized.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "local_ranks.h"
#include "mlp.h"

namespace {

struct Settings {
  int ranks = 2;
  int iters = 10;
  size_t block = braid::dp::kQuantizationBlock;
  size_t minMiB = 1, maxMiB = 64;
};

void check(braidResult_t result, braidComm_t comm, const char* what) {
  if (result != braidSuccess)
    throw std::runtime_error(std::string(what) + ": " + braidGetLastError(comm));
}

// The median over iterations of the slowest rank's time for one call, in milliseconds.
double medianMs(braidComm_t comm, int iters, const std::function<void()>& call) {
  float token = 0;
  call();  // warm-up: buffers and the library's staging touched once
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    check(braidAllReduce(&token, &token, 1, braidFloat32, braidSum, comm, nullptr), comm,
          "barrier");
    const auto start = std::chrono::steady_clock::now();
    call();
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    check(braidAllReduce(&ms, &ms, 1, braidFloat64, braidMax, comm, nullptr), comm, "max");
    times.push_back(ms);
  }
  std::nth_element(times.begin(), times.begin() + iters / 2, times.end());
  return times[iters / 2];
}

// Gradient-like values of rank r: uniform in [-1, 1), a few blocks with outliers ten times larger.
std::vector<float> rankData(int rank, size_t count) {
  std::vector<float> x(count);
  for (size_t i = 0; i < count; ++i)
    x[i] = mlp::uniform(rank + 1, i) * ((i % 4099) == 0 ? 10.0f : 1.0f);
  return x;
}

// The header's bound for each element of x, blocks of `block`.
std::vector<double> bounds(const std::vector<float>& x, size_t block) {
  std::vector<double> b(x.size());
  for (size_t first = 0; first < x.size(); first += block) {
    const auto [lo, hi] = std::minmax_element(x.begin() + first, x.begin() + first + block);
    const double step = (static_cast<double>(*hi) - *lo) / 255;
    const double largest = std::max(std::fabs(*lo), std::fabs(*hi));
    std::fill(b.begin() + first, b.begin() + first + block,
              step / 2 + 0x1p-22 * (largest + 128 * step) + 0x1p-140);
  }
  return b;
}

struct ErrorStats {
  double maxOverBound = 0, meanAbs = 0;
  void add(double error, double bound, size_t count) {
    maxOverBound = std::max(maxOverBound, error / bound);
    meanAbs += error / count;
  }
};

// One size's row, as rank 0 sees it (errors are rank 0's slices, representative of every rank's).
std::string measure(braidComm_t comm, int rank, int nranks, size_t bytes, const Settings& s) {
  const size_t total = bytes / 4, slice = total / nranks;
  const std::vector<float> mine = rankData(rank, total);
  std::vector<float> out(total);

  // All-gather: rank r contributes slice r of its data.
  const float* shard = mine.data() + rank * slice;
  const double gatherFp32 = medianMs(comm, s.iters, [&] {
    check(braidAllGather(shard, out.data(), slice, braidFloat32, comm, nullptr), comm,
          "braidAllGather");
  });
  const double gatherInt8 = medianMs(comm, s.iters, [&] {
    braid::dp::quantizedAllGather(shard, out.data(), slice, braidFloat32, comm, s.block);
  });
  ErrorStats gatherError;
  for (int r = 0; r < nranks; ++r) {
    const std::vector<float> theirs = rankData(r, total);
    const std::vector<float> x(theirs.begin() + r * slice, theirs.begin() + (r + 1) * slice);
    const std::vector<double> b = bounds(x, s.block);
    for (size_t i = 0; i < slice; ++i)
      gatherError.add(std::fabs(static_cast<double>(out[r * slice + i]) - x[i]), b[i], total);
  }

  // Reduce-scatter (sum): the bound of an output element adds the ranks' bounds (and fp32
  // rounding of the n - 1 additions, negligible here but counted).
  const double scatterFp32 = medianMs(comm, s.iters, [&] {
    check(braidReduceScatter(mine.data(), out.data(), slice, braidFloat32, braidSum, comm, nullptr),
          comm, "braidReduceScatter");
  });
  const double scatterInt8 = medianMs(comm, s.iters, [&] {
    braid::dp::quantizedReduceScatter(mine.data(), out.data(), slice, braidFloat32, braidSum, comm,
                                      nullptr, s.block);
  });
  std::vector<double> sum(slice, 0), bound(slice, 0), magnitude(slice, 0);
  for (int r = 0; r < nranks; ++r) {
    const std::vector<float> theirs = rankData(r, total);
    const std::vector<float> x(theirs.begin() + rank * slice, theirs.begin() + (rank + 1) * slice);
    const std::vector<double> b = bounds(x, s.block);
    for (size_t i = 0; i < slice; ++i) {
      sum[i] += x[i];
      bound[i] += b[i];
      magnitude[i] += std::fabs(x[i]) + b[i];
    }
  }
  ErrorStats scatterError;
  for (size_t i = 0; i < slice; ++i)
    scatterError.add(std::fabs(out[i] - sum[i]), bound[i] + (nranks - 1) * 0x1p-24 * magnitude[i],
                     slice);

  // Bytes each rank sends: the ring all-gather and reduce-scatter forward n - 1 slices; the
  // quantized ones send n - 1 messages (all-gather: its own, relayed; reduce-scatter: one per
  // peer).
  const double fp32Bytes = (nranks - 1) * slice * 4.0;
  const double int8Bytes = (nranks - 1) * double(braid::dp::quantizedBytes(slice, s.block));
  char row[512];
  std::snprintf(row, sizeof row,
                "| %zu MiB | %.2f MB | %.2f MB (%.2fx less) | %.1f | %.1f | %.2f | %.1f | %.1f | "
                "%.2f | %.4f / %.2e | %.4f / %.2e |\n",
                bytes >> 20, fp32Bytes / 1e6, int8Bytes / 1e6, fp32Bytes / int8Bytes, gatherFp32,
                gatherInt8, gatherInt8 / gatherFp32, scatterFp32, scatterInt8,
                scatterInt8 / scatterFp32, gatherError.maxOverBound, gatherError.meanAbs,
                scatterError.maxOverBound, scatterError.meanAbs);
  return row;
}

std::string runRank(braidComm_t comm, int rank, const Settings& s) {
  int nranks = 0;
  check(braidCommCount(comm, &nranks), comm, "braidCommCount");
  std::string table =
      "| size (fp32) | sent per rank, fp32 | sent per rank, int8 | all-gather fp32 ms | "
      "quantized ms | ratio | reduce-scatter fp32 ms | quantized ms | ratio | "
      "all-gather max err / bound, mean abs err | reduce-scatter max err / bound, mean abs err "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (size_t mib = s.minMiB; mib <= s.maxMiB; mib *= 4)
    table += measure(comm, rank, nranks, mib << 20, s);
  return table;
}

Settings parse(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 == argc) throw std::runtime_error(flag + " needs a value");
    const long value = std::atol(argv[i + 1]);
    if (flag == "--ranks")
      s.ranks = value;
    else if (flag == "--iters")
      s.iters = value;
    else if (flag == "--block")
      s.block = value;
    else if (flag == "--min-mib")
      s.minMiB = value;
    else if (flag == "--max-mib")
      s.maxMiB = value;
    else
      throw std::runtime_error("unknown flag " + flag);
  }
  if (s.ranks < 1 || s.iters < 1 || s.block == 0 || s.minMiB == 0)
    throw std::runtime_error("--ranks, --iters, --block and --min-mib must be positive");
  return s;
}

}  // namespace

int main(int argc, char** argv) try {
  const Settings s = parse(argc, argv);
  const bool launched = std::getenv("BRAID_COMM_ID") != nullptr ||
                        (std::getenv("RANK") != nullptr && std::getenv("MASTER_ADDR") != nullptr);
  if (launched) {
    braidConfig_t config = BRAID_CONFIG_INITIALIZER;
    config.device = "cpu";
    braidComm_t comm = nullptr;
    check(braidCommInitFromEnv(&comm, &config), nullptr, "braidCommInitFromEnv");
    int rank = 0;
    check(braidCommUserRank(comm, &rank), comm, "braidCommUserRank");
    const std::string table = runRank(comm, rank, s);
    if (rank == 0) std::fputs(table.c_str(), stdout);
    check(braidCommDestroy(comm), comm, "braidCommDestroy");
    return 0;
  }
  const local_ranks::Outcome outcome =
      local_ranks::run(s.ranks, local_ranks::Launch::kProcesses, local_ranks::kTimeoutMs,
                       [&](braidComm_t comm, int rank) { return runRank(comm, rank, s); });
  if (!outcome.joinedErrors().empty()) {
    std::fputs(outcome.joinedErrors().c_str(), stderr);
    return 1;
  }
  std::fputs(outcome.results[0].c_str(), stdout);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_quantized: %s\n", e.what());
  return 1;
}
