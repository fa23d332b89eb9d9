// The pipeline bubble of braid::dp::Pipeline (include/braid/dp_pipeline.hpp), measured against
// the ideal (p - 1) / (m + p - 1), for GPipe and 1F1B. Stages are threads of this process, one per
// rank of a CPU communicator. Compute is modelled as an accelerator's: each forward "runs" for
// --forward-ms and each backward for --backward-ms of sleep, so the host's cores stay free and the
// figures measure the schedule and the send/recv between stages, not contention for the CPU.
//
// Per configuration (schedule, p, m): one warm-up step, then --steps steps, each started by a
// barrier (an all-reduce of one element); a step's time is the slowest stage's from the barrier to
// the end of its run. Reported: the median step time T, the compute per stage C (its forward and
// backward functions, measured: m (tf + tb) plus the sleeps' overshoot), the measured bubble
// 1 - C / T, the formula, and the micro-batches whose activations each stage held at once.
//
//   bench_bubble [--forward-ms 2] [--backward-ms 4] [--steps 5] [--elements 4096]
#include <braid/braid.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <braid/dp_pipeline.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "local_ranks.h"

namespace {

struct Settings {
  double forwardMs = 2;
  double backwardMs = 4;
  int steps = 5;
  size_t elements = 4096;  // activation elements per micro-batch (16 KiB)
};

struct Row {
  double stepSeconds = 0;     // median, slowest stage
  double computeSeconds = 0;  // median, mean over stages
  std::vector<int> peak;      // per stage
};

void check(braidResult_t result, braidComm_t comm, const char* what) {
  if (result != braidSuccess)
    throw std::runtime_error(std::string(what) + ": " + braidGetLastError(comm));
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

Row measure(const Settings& s, braid::dp::Schedule schedule, int p, int m) {
  Row row;
  row.peak.resize(p);
  std::vector<std::vector<double>> stepSeconds(p), computeSeconds(p);
  const auto forwardTime = std::chrono::duration<double, std::milli>(s.forwardMs);
  const auto backwardTime = std::chrono::duration<double, std::milli>(s.backwardMs);
  const std::string errors = local_ranks::onThreads(p, [&](braidComm_t comm, int rank) {
    braid::dp::PipelineOptions options;
    options.schedule = schedule;
    options.microBatches = m;
    options.inputElements = rank == 0 ? 0 : s.elements;
    options.outputElements = rank == p - 1 ? 0 : s.elements;
    braid::dp::Pipeline pipeline(comm, options);
    braid::dp::StageFunctions functions;
    functions.forward = [&](int, std::span<const float>, std::span<float>) {
      std::this_thread::sleep_for(forwardTime);
    };
    functions.backward = [&](int, std::span<const float>, std::span<float>) {
      std::this_thread::sleep_for(backwardTime);
    };
    for (int step = -1; step < s.steps; ++step) {  // step -1 warms up
      float token = 0;
      check(braidAllReduce(&token, &token, 1, braidFloat32, braidSum, comm, nullptr), comm,
            "braidAllReduce (the barrier)");
      const auto start = std::chrono::steady_clock::now();
      const braid::dp::PipelineStats stats = pipeline.run(functions);
      double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      check(braidAllReduce(&seconds, &seconds, 1, braidFloat64, braidMax, comm, nullptr), comm,
            "braidAllReduce (the slowest stage)");
      if (step < 0) continue;
      stepSeconds[rank].push_back(seconds);
      computeSeconds[rank].push_back(stats.computeSeconds);
      row.peak[rank] = stats.peakActivations;
    }
  });
  if (!errors.empty()) throw std::runtime_error(errors);
  row.stepSeconds = median(stepSeconds[0]);  // the same on every stage (the max)
  for (int r = 0; r < p; ++r) row.computeSeconds += median(computeSeconds[r]) / p;
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  CLI::App app("bench_bubble: the pipeline bubble of GPipe and 1F1B against (p-1)/(m+p-1)");
  app.add_option("--forward-ms", s.forwardMs, "a stage's forward pass (sleep)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--backward-ms", s.backwardMs, "a stage's backward pass (sleep)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--steps", s.steps, "steps measured per row (the median)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--elements", s.elements, "fp32 elements per activation")
      ->check(CLI::Range(size_t{1}, size_t{1} << 30));
  CLI11_PARSE(app, argc, argv);

  std::printf(
      "# bench_bubble: forward %g ms, backward %g ms (sleep), %zu fp32 elements per "
      "activation, median of %d steps\n\n",
      s.forwardMs, s.backwardMs, s.elements, s.steps);
  std::printf(
      "| schedule | p | m | step (ms) | ideal (m+p-1)(tf+tb) (ms) | compute/stage (ms) | "
      "bubble measured | bubble (p-1)/(m+p-1) | activations held per stage |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  try {
    for (braid::dp::Schedule schedule : {braid::dp::Schedule::kGPipe, braid::dp::Schedule::k1F1B})
      for (int p : {2, 4})
        for (int m : {1, 4, 8}) {
          const Row row = measure(s, schedule, p, m);
          const double ideal = (m + p - 1) * (s.forwardMs + s.backwardMs);
          std::string peak;
          for (int held : row.peak) peak += (peak.empty() ? "" : " ") + std::to_string(held);
          std::printf("| %s | %d | %d | %.1f | %.1f | %.1f | %.3f | %.3f | %s |\n",
                      braid::dp::scheduleName(schedule), p, m, row.stepSeconds * 1e3, ideal,
                      row.computeSeconds * 1e3, 1 - row.computeSeconds / row.stepSeconds,
                      static_cast<double>(p - 1) / (m + p - 1), peak.c_str());
          std::fflush(stdout);
        }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_bubble failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
