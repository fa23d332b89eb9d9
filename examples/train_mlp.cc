// Trains a small MLP on a deterministic synthetic classification task with braid::dp, N ranks as
// processes forked by this one (as torchrun starts them) or as its threads. Prints the loss per
// step, the memory report and where the time went.
//
//   train_mlp [--mode single|ddp|zero1|zero2|zero3] [--ranks N] [--launch processes|threads]
//             [--pp P --dp D [--schedule gpipe|1f1b] [--microbatches M]]
//             [--precision fp32|fp16|bf16]
//             [--gradients fp32] [--steps S] [--batch GLOBAL] [--micro-batches M] [--widths
//             16,64,64,4]
//             [--optimizer adamw|adam|sgd] [--lr LR] [--base-batch B] [--warmup STEPS]
//             [--bucket-kb KB] [--clip NORM]
//
// --lr is the learning rate for --base-batch samples; it is scaled linearly to the global batch
// and reached by gradual warm-up over --warmup steps (Goyal et al.). --gradients fp32 keeps 16-bit
// training's gradients in fp32 (Options::fp32Gradients); by default they have --precision's type.
// --pp P --dp D: P x D ranks, the layers cut into P pipeline stages (braid/dp_pipeline.hpp) and
// each stage data-parallel over D replicas (--mode's stage); --microbatches (--micro-batches) is
// the pipeline's m. Pipelines take no loss scaling (fp16) or clipping.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

#include "mlp_training.h"

namespace {

[[noreturn]] void usage(const char* message) {
  std::fprintf(stderr,
               "train_mlp: %s\nusage: train_mlp [--mode single|ddp|zero1|zero2|zero3] [--ranks N] "
               "[--launch processes|threads] [--pp P --dp D [--schedule gpipe|1f1b] "
               "[--microbatches M]] [--precision fp32|fp16|bf16] [--gradients fp32] "
               "[--steps S] [--batch GLOBAL] "
               "[--micro-batches M] "
               "[--widths 16,64,64,4] [--optimizer adamw|adam|sgd] [--lr LR] [--base-batch B] "
               "[--warmup STEPS] [--bucket-kb KB] [--clip NORM]\n",
               message);
  std::exit(2);
}

std::vector<int> parseWidths(const std::string& text) {
  std::vector<int> widths;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) widths.push_back(std::atoi(item.c_str()));
  if (widths.size() < 2) usage("--widths needs at least inputs,classes");
  for (int w : widths)
    if (w < 1) usage("--widths must be positive");
  return widths;
}

double mib(size_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  mlp::TrainConfig config;
  config.steps = 100;
  config.globalBatch = 48;
  config.widths = {16, 64, 64, 4};
  std::string mode = "ddp", launch = "processes", precision = "fp32", gradients = "",
              optimizer = "adamw", schedule = "1f1b";
  int ranks = 2, baseBatch = 0, warmup = 0, replicas = 0;
  double baseLr = 1e-3;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(("missing value for " + flag).c_str());
    const std::string value = argv[++i];
    if (flag == "--mode")
      mode = value;
    else if (flag == "--ranks")
      ranks = std::atoi(value.c_str());
    else if (flag == "--launch")
      launch = value;
    else if (flag == "--precision")
      precision = value;
    else if (flag == "--gradients")
      gradients = value;
    else if (flag == "--steps")
      config.steps = std::atoi(value.c_str());
    else if (flag == "--batch")
      config.globalBatch = std::atoi(value.c_str());
    else if (flag == "--pp")
      config.stages = std::atoi(value.c_str());
    else if (flag == "--dp")
      replicas = std::atoi(value.c_str());
    else if (flag == "--schedule")
      schedule = value;
    else if (flag == "--micro-batches" || flag == "--microbatches")
      config.microBatches = std::atoi(value.c_str());
    else if (flag == "--widths")
      config.widths = parseWidths(value);
    else if (flag == "--optimizer")
      optimizer = value;
    else if (flag == "--lr")
      baseLr = std::atof(value.c_str());
    else if (flag == "--base-batch")
      baseBatch = std::atoi(value.c_str());
    else if (flag == "--warmup")
      warmup = std::atoi(value.c_str());
    else if (flag == "--bucket-kb")
      config.options.bucketBytes = config.options.firstBucketBytes =
          static_cast<size_t>(std::atof(value.c_str()) * 1024);
    else if (flag == "--clip")
      config.options.optimizer.maxGradNorm = std::atof(value.c_str());
    else
      usage(("unknown flag " + flag).c_str());
  }

  braid::dp::Options& o = config.options;
  if (mode == "single")
    ranks = 1, o.stage = braid::dp::Stage::kDdp;
  else if (mode == "ddp")
    o.stage = braid::dp::Stage::kDdp;
  else if (mode == "zero1")
    o.stage = braid::dp::Stage::kZero1;
  else if (mode == "zero2")
    o.stage = braid::dp::Stage::kZero2;
  else if (mode == "zero3")
    o.stage = braid::dp::Stage::kZero3;
  else
    usage("--mode must be single, ddp, zero1, zero2 or zero3");
  if (launch == "processes")
    config.launch = local_ranks::Launch::kProcesses;
  else if (launch == "threads")
    config.launch = local_ranks::Launch::kThreads;
  else
    usage("--launch must be processes or threads");
  if (precision == "fp32")
    o.precision = braidFloat32;
  else if (precision == "fp16")
    o.precision = braidFloat16, o.lossScaling = true;
  else if (precision == "bf16")
    o.precision = braidBfloat16;
  else
    usage("--precision must be fp32, fp16 or bf16");
  if (!gradients.empty() && gradients != "fp32") usage("--gradients must be fp32");
  o.fp32Gradients = gradients == "fp32";
  if (optimizer == "adamw")
    o.optimizer.kind = braid::dp::OptimizerKind::kAdamW;
  else if (optimizer == "adam")
    o.optimizer.kind = braid::dp::OptimizerKind::kAdam;
  else if (optimizer == "sgd")
    o.optimizer.kind = braid::dp::OptimizerKind::kSgd;
  else
    usage("--optimizer must be adamw, adam or sgd");
  if (config.stages != 1 || replicas > 0) {
    if (config.stages < 1 || replicas < 0) usage("--pp and --dp must be positive");
    ranks = config.stages * std::max(replicas, 1);
  }
  try {
    config.schedule = braid::dp::parseSchedule(schedule);
  } catch (const braid::dp::Error& e) {
    usage(e.what());
  }
  if (ranks < 1) usage("--ranks must be at least 1");
  if (config.steps < 1) usage("--steps must be at least 1");
  if (config.microBatches < 1) usage("--micro-batches must be at least 1");
  if (config.globalBatch < 1 ||
      config.globalBatch % (ranks / config.stages * config.microBatches) != 0)
    usage("--batch must split evenly over --ranks (--dp) x --micro-batches");
  config.ranks = ranks;

  const double targetLr = braid::dp::scaleLearningRate(
      baseLr, baseBatch > 0 ? baseBatch : config.globalBatch, config.globalBatch);
  config.learningRate = [=](int step) {
    return braid::dp::warmupLearningRate(baseLr, targetLr, step, warmup);
  };

  std::printf(
      "# train_mlp: mode %s, %d rank(s) as %s, %s%s, %s, global batch %d (%d micro-batch(es)), "
      "widths",
      mode.c_str(), ranks, launch.c_str(), precision.c_str(),
      o.fp32Gradients ? " (fp32 gradients)" : "", optimizer.c_str(), config.globalBatch,
      config.microBatches);
  for (int w : config.widths) std::printf(" %d", w);
  std::printf(", lr %g -> %g over %d warm-up steps\n", baseLr, targetLr, warmup);
  if (config.stages > 1)
    std::printf("# pipeline: %d stages x %d data-parallel replica(s), schedule %s\n", config.stages,
                ranks / config.stages, braid::dp::scheduleName(config.schedule));

  mlp::TrainResult result;
  try {
    result = mlp::train(config);
  } catch (const std::invalid_argument& e) {
    usage(e.what());
  }
  if (!result.errors().empty()) {
    std::fprintf(stderr, "train_mlp failed:\n%s", result.errors().c_str());
    return 1;
  }
  const std::vector<double> loss = result.loss();
  std::printf("%6s %12s %8s %12s %10s\n", "step", "loss", "applied", "loss-scale", "grad-norm");
  for (size_t s = 0; s < loss.size(); ++s) {
    const braid::dp::StepResult& r = result.ranks[0].steps[s];
    std::printf("%6zu %12.6f %8s %12g %10.4g\n", s, loss[s], r.applied ? "yes" : "SKIPPED",
                r.lossScale, r.gradNorm);
  }

  if (config.stages > 1) {
    std::printf("\n# pipeline: micro-batches' activations held at once, per stage (replica 0):");
    for (const mlp::RankResult& r : result.ranks)
      if (r.replica == 0) std::printf(" %d", r.peakActivations);
    std::printf("\n");
  }

  const braid::dp::MemoryReport& m = result.ranks[0].memory;
  std::printf("\n# memory per rank: P = %zu parameters (%zu with padding), %d bucket(s)\n",
              m.parameterCount, m.paddedParameterCount, result.ranks[0].buckets);
  std::printf("#   parameters       %10zu bytes (%.3f MiB)\n", m.parameterBytes,
              mib(m.parameterBytes));
  if (m.gatheredBytes > 0)
    std::printf("#   gathered layer   %10zu bytes (%.3f MiB)\n", m.gatheredBytes,
                mib(m.gatheredBytes));
  std::printf("#   gradients        %10zu bytes (%.3f MiB)\n", m.gradientBytes,
              mib(m.gradientBytes));
  std::printf("#   gradient staging %10zu bytes (%.3f MiB)\n", m.gradientStagingBytes,
              mib(m.gradientStagingBytes));
  std::printf("#   optimizer state  %10zu bytes (%.3f MiB)\n", m.optimizerStateBytes,
              mib(m.optimizerStateBytes));
  std::printf("#   total            %10zu bytes (%.2f bytes/parameter)\n", m.total(),
              static_cast<double>(m.total()) / m.parameterCount);

  std::printf("\n# time per rank: %s\n", "total = compute + exposed communication");
  for (size_t r = 0; r < result.ranks.size(); ++r) {
    const mlp::RankResult& rr = result.ranks[r];
    std::printf("#   rank %zu: %.3f s = %.3f s compute + %.3f s exposed communication (%.1f%%)\n",
                r, rr.seconds, rr.seconds - rr.exposedCommSeconds, rr.exposedCommSeconds,
                100.0 * rr.exposedCommSeconds / rr.seconds);
  }
  return 0;
}
