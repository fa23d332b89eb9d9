// How much of DDP's gradient all-reduce the backward pass hides. Ranks are threads of this
// process; each trains examples/mlp.h's MLP (real fp32 matrix arithmetic per layer) through
// braid::dp with PyTorch DDP's bucket defaults. Every iteration measures, per rank:
//
//   compute    forward + backward of a no-sync micro-batch (markReady launches nothing)
//   overlapped forward + backward of a sync micro-batch, buckets all-reducing as they fill,
//              plus the wait for the reductions in step()
//   comm       the same bucket all-reduces with nothing to hide behind (every gradient marked
//              ready at once, then step() waits)
//
// exposed = overlapped - compute: what communication adds to a step. Overlap works when exposed
// is well below comm. Reported: the median over iterations of the slowest rank.
//
// --compute cpu (default) runs the backward pass on the CPU, on the same cores as the
// all-reduce. --compute idle --layer-ms T models an accelerator instead: each layer's backward
// takes T ms of wall time during which the host's cores are free.
//
//   bench_dp_overlap [--ranks 2] [--layers 12] [--width 2048] [--batch 2]
//                    [--precision fp16|fp32] [--bucket-mb 25] [--first-bucket-mb 1]
//                    [--iterations 5] [--compute cpu|idle] [--layer-ms 20]
#include <braid/braid.h>

#include <algorithm>
#include <braid/dp.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "local_ranks.h"
#include "mlp.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Settings {
  int ranks = 2;
  int layers = 12;
  int width = 2048;
  int batch = 2;      // per rank
  bool idle = false;  // --compute idle
  double layerMs = 20;
  braidDataType_t precision = braidFloat16;
  double bucketMb = 25;
  double firstBucketMb = 1;
  int iterations = 5;
};

struct Sample {
  double compute = 0, overlapped = 0, comm = 0;
};

double seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

[[noreturn]] void usage(const std::string& message) {
  std::fprintf(stderr,
               "bench_dp_overlap: %s\nusage: bench_dp_overlap [--ranks N] [--layers L] "
               "[--width W] [--batch B] [--precision fp16|fp32] [--bucket-mb MB] "
               "[--first-bucket-mb MB] [--iterations N] [--compute cpu|idle] [--layer-ms T]\n",
               message.c_str());
  std::exit(2);
}

// One rank: `iterations` + 1 rounds (the first warms up), each a compute-only micro-batch, an
// overlapped one, then a comm-only window.
std::vector<Sample> runRank(const Settings& s, braidComm_t comm, int rank, int* buckets) {
  braid::dp::Options options;
  options.precision = s.precision;
  options.bucketBytes = static_cast<size_t>(s.bucketMb * (1 << 20));
  options.firstBucketBytes = static_cast<size_t>(s.firstBucketMb * (1 << 20));
  options.optimizer.kind = braid::dp::OptimizerKind::kSgd;
  options.optimizer.learningRate = 1e-4;
  braid::dp::DataParallel dp(comm, options);
  mlp::Model model(std::vector<int>(s.layers + 1, s.width));
  std::vector<int> weightIds, biasIds;
  for (int l = 0; l < model.layers(); ++l) {
    weightIds.push_back(dp.addParameter(model.weightCount(l)));
    biasIds.push_back(dp.addParameter(model.outputs(l)));
  }
  dp.finalize();
  *buckets = dp.bucketCount();
  std::vector<std::vector<float>> weights(model.layers()), biases(model.layers());
  std::vector<const float*> weightViews, biasViews;
  for (int l = 0; l < model.layers(); ++l) {
    weights[l].resize(model.weightCount(l));
    biases[l].resize(model.outputs(l));
    model.initialize(7, l, weights[l], biases[l]);
    dp.setParameter(weightIds[l], weights[l]);
    dp.setParameter(biasIds[l], biases[l]);
    weightViews.push_back(weights[l].data());
    biasViews.push_back(biases[l].data());
  }
  const mlp::Task task{s.width, s.width, 1};
  std::vector<float> x(static_cast<size_t>(s.batch) * s.width);
  std::vector<int> labels(s.batch);

  auto addGradients = [&](int l, std::span<const float> dWeights, std::span<const float> dBiases) {
    braid::dp::accumulateFromFloat(dWeights.data(), dp.gradient(weightIds[l]), s.precision,
                                   dWeights.size());
    dp.markReady(weightIds[l]);
    braid::dp::accumulateFromFloat(dBiases.data(), dp.gradient(biasIds[l]), s.precision,
                                   dBiases.size());
    dp.markReady(biasIds[l]);
  };
  const std::vector<float> idleWeights(s.idle ? model.weightCount(0) : 0, 1e-3f);
  const std::vector<float> idleBiases(s.width, 1e-3f);
  auto microBatch = [&](uint64_t first) {
    if (s.idle) {
      for (int l = model.layers() - 1; l >= 0; --l) {
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(s.layerMs));
        addGradients(l, idleWeights, idleBiases);
      }
      return;
    }
    task.batch(first, s.batch, x.data(), labels.data());
    model.forward(weightViews, biasViews, x.data(), labels.data(), s.batch);
    model.backward(static_cast<float>(dp.lossScale()), addGradients);
  };

  std::vector<Sample> samples;
  for (int it = 0; it <= s.iterations; ++it) {
    Sample sample;
    const uint64_t first = (static_cast<uint64_t>(it) * s.ranks + rank) * 2 * s.batch;
    dp.setGradientSync(false);
    auto start = Clock::now();
    microBatch(first);
    sample.compute = seconds(start);

    dp.setGradientSync(true);
    start = Clock::now();
    microBatch(first + s.batch);
    const double backward = seconds(start);
    double waited = dp.exposedCommSeconds();
    dp.step();
    sample.overlapped = backward + dp.exposedCommSeconds() - waited;

    // The same all-reduces with nothing to overlap: every gradient ready at once.
    start = Clock::now();
    for (int l = model.layers() - 1; l >= 0; --l) {
      dp.markReady(weightIds[l]);
      dp.markReady(biasIds[l]);
    }
    const double launch = seconds(start);
    waited = dp.exposedCommSeconds();
    dp.step();
    sample.comm = launch + dp.exposedCommSeconds() - waited;
    samples.push_back(sample);
  }
  return samples;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage("missing value for " + flag);
    const std::string value = argv[++i];
    if (flag == "--ranks")
      s.ranks = std::atoi(value.c_str());
    else if (flag == "--layers")
      s.layers = std::atoi(value.c_str());
    else if (flag == "--width")
      s.width = std::atoi(value.c_str());
    else if (flag == "--batch")
      s.batch = std::atoi(value.c_str());
    else if (flag == "--precision")
      s.precision = value == "fp32" ? braidFloat32 : value == "fp16" ? braidFloat16 : braidInt8;
    else if (flag == "--bucket-mb")
      s.bucketMb = std::atof(value.c_str());
    else if (flag == "--first-bucket-mb")
      s.firstBucketMb = std::atof(value.c_str());
    else if (flag == "--iterations")
      s.iterations = std::atoi(value.c_str());
    else if (flag == "--compute" && (value == "cpu" || value == "idle"))
      s.idle = value == "idle";
    else if (flag == "--layer-ms")
      s.layerMs = std::atof(value.c_str());
    else
      usage("unknown flag " + flag);
  }
  if (s.precision == braidInt8) usage("--precision must be fp16 or fp32");
  if (s.ranks < 1 || s.layers < 1 || s.width < 1 || s.batch < 1 || s.iterations < 1)
    usage("--ranks, --layers, --width, --batch and --iterations must be positive");

  std::vector<std::vector<Sample>> perRank(s.ranks);
  int buckets = 0;
  const std::string errors = local_ranks::onThreads(s.ranks, [&](braidComm_t comm, int rank) {
    int rankBuckets = 0;
    perRank[rank] = runRank(s, comm, rank, &rankBuckets);
    if (rank == 0) buckets = rankBuckets;
  });
  if (!errors.empty()) {
    std::fprintf(stderr, "bench_dp_overlap: %s", errors.c_str());
    return 1;
  }

  const double parameters = static_cast<double>(s.layers) * s.width * (s.width + 1);
  char computeKind[64];
  if (s.idle)
    std::snprintf(computeKind, sizeof computeKind, "idle compute, %g ms per layer", s.layerMs);
  else
    std::snprintf(computeKind, sizeof computeKind, "cpu compute, batch %d per rank", s.batch);
  std::printf(
      "# bench_dp_overlap: %d ranks (threads), %d layers of %dx%d, %s, "
      "%s gradients: %.1f MB in %d buckets (%.0f MB, first %.0f MB)\n",
      s.ranks, s.layers, s.width, s.width, computeKind,
      s.precision == braidFloat16 ? "fp16" : "fp32",
      parameters * braid::dp::elementSize(s.precision) / 1e6, buckets, s.bucketMb, s.firstBucketMb);
  std::printf(
      "# per step, slowest rank (ms): compute = forward+backward alone; overlapped = the "
      "same with bucket all-reduces running, until they are done; comm = the all-reduces "
      "alone; exposed = overlapped - compute\n");
  std::printf("%10s %10s %12s %10s %10s %14s\n", "iteration", "compute", "overlapped", "comm",
              "exposed", "exposed/comm");
  std::vector<double> compute, overlapped, comm, exposed;
  for (int it = 1; it <= s.iterations; ++it) {  // iteration 0 warms up
    Sample slowest;
    for (const auto& samples : perRank) {
      slowest.compute = std::max(slowest.compute, samples[it].compute);
      slowest.overlapped = std::max(slowest.overlapped, samples[it].overlapped);
      slowest.comm = std::max(slowest.comm, samples[it].comm);
    }
    compute.push_back(slowest.compute);
    overlapped.push_back(slowest.overlapped);
    comm.push_back(slowest.comm);
    exposed.push_back(slowest.overlapped - slowest.compute);
    std::printf("%10d %10.1f %12.1f %10.1f %10.1f %14.2f\n", it, 1e3 * slowest.compute,
                1e3 * slowest.overlapped, 1e3 * slowest.comm, 1e3 * exposed.back(),
                exposed.back() / slowest.comm);
  }
  const double medianExposed = median(exposed), medianComm = median(comm);
  std::printf("%10s %10.1f %12.1f %10.1f %10.1f %14.2f\n", "median", 1e3 * median(compute),
              1e3 * median(overlapped), 1e3 * medianComm, 1e3 * medianExposed,
              medianExposed / medianComm);
  std::printf("# exposed communication is %.0f%% of the all-reduce time it hides (%s half)\n",
              100 * medianExposed / medianComm,
              medianExposed < medianComm / 2 ? "below" : "NOT below");
  return 0;
}
