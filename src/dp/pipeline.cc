// Pipeline parallelism: the schedules (pure) and the driver that runs one over send/recv.
#include <algorithm>
#include <chrono>

#include "braid/dp_pipeline.hpp"
#include "dp/error.h"

namespace braid::dp {

Schedule parseSchedule(const std::string& name) {
  if (name == "gpipe") return Schedule::kGPipe;
  if (name == "1f1b") return Schedule::k1F1B;
  fail(braidInvalidArgument, "pipeline schedule \"{}\" (expected \"gpipe\" or \"1f1b\")", name);
}

const char* scheduleName(Schedule schedule) {
  return schedule == Schedule::kGPipe ? "gpipe" : "1f1b";
}

std::vector<PipelineStep> pipelineSchedule(Schedule schedule, int stages, int stage,
                                           int microBatches) {
  if (stages < 1 || stage < 0 || stage >= stages || microBatches < 1)
    fail(braidInvalidArgument,
         "pipelineSchedule: stage {} of {} stages with {} micro-batches (expected 0 <= stage < "
         "stages and at least one micro-batch)",
         stage, stages, microBatches);
  std::vector<PipelineStep> steps;
  auto forward = [&](int i) { steps.push_back({PipelineOp::kForward, i}); };
  auto backward = [&](int i) { steps.push_back({PipelineOp::kBackward, i}); };
  // GPipe is 1F1B with every forward in the warm-up.
  const int warmUp =
      schedule == Schedule::kGPipe ? microBatches : std::min(stages - 1 - stage, microBatches);
  for (int i = 0; i < warmUp; ++i) forward(i);
  // Steady state: the forward that keeps the pipeline full, then the oldest backward.
  for (int i = warmUp; i < microBatches; ++i) {
    forward(i);
    backward(i - warmUp);
  }
  for (int i = microBatches - warmUp; i < microBatches; ++i) backward(i);
  return steps;
}

int peakActivations(std::span<const PipelineStep> steps) {
  int held = 0, peak = 0;
  for (const PipelineStep& step : steps) {
    held += step.op == PipelineOp::kForward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

namespace {

void check(braidResult_t result, braidComm_t comm, int rank, const char* what) {
  if (result != braidSuccess)
    fail(result, "Pipeline: rank {}: {} failed: {}", rank, what, braidGetLastError(comm));
}

// What the last step produced for a neighbour, sent together with the next step's receive.
struct Transfer {
  float* data = nullptr;
  size_t count = 0;
  int peer = -1;
};

// A send and a receive of one stage in one group; either may be absent.
void exchange(braidComm_t comm, int stage, const Transfer& send, const Transfer& recv) {
  if (send.data == nullptr && recv.data == nullptr) return;
  check(braidGroupStart(), comm, stage, "braidGroupStart");
  const braidResult_t sent = send.data == nullptr ? braidSuccess
                                                  : braidSend(send.data, send.count, braidFloat32,
                                                              send.peer, comm, nullptr);
  const braidResult_t received =
      recv.data == nullptr
          ? braidSuccess
          : braidRecv(recv.data, recv.count, braidFloat32, recv.peer, comm, nullptr);
  const braidResult_t ended = braidGroupEnd();  // always, or the group would stay open
  check(sent, comm, stage, "braidSend");
  check(received, comm, stage, "braidRecv");
  check(ended, comm, stage, "the send/recv group");
}

}  // namespace

Pipeline::Pipeline(braidComm_t comm, const PipelineOptions& options)
    : comm_(comm), options_(options) {
  if (comm == nullptr)
    fail(braidInvalidArgument, "Pipeline: comm is NULL (expected the pipeline's communicator)");
  if (braidCommUserRank(comm, &stage_) != braidSuccess)
    fail(braidInvalidArgument, "Pipeline: braidCommUserRank failed: {}", braidGetLastError(comm));
  check(braidCommCount(comm, &stages_), comm, stage_, "braidCommCount");
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  if (first != (options.inputElements == 0))
    fail(braidInvalidArgument,
         "Pipeline: rank {} (stage {} of {}) has inputElements {} (expected {})", stage_, stage_,
         stages_, options.inputElements,
         first ? "0: the first stage reads its own data" : "> 0: what the previous stage sends");
  if (last != (options.outputElements == 0))
    fail(braidInvalidArgument,
         "Pipeline: rank {} (stage {} of {}) has outputElements {} (expected {})", stage_, stage_,
         stages_, options.outputElements,
         last ? "0: the last stage ends in the loss" : "> 0: what the next stage receives");
  steps_ = pipelineSchedule(options.schedule, stages_, stage_, options.microBatches);
}

PipelineStats Pipeline::run(const StageFunctions& functions) {
  if (!functions.forward || !functions.backward)
    fail(braidInvalidArgument,
         "Pipeline::run: rank {} (stage {}) has no {} function (expected both forward and "
         "backward)",
         stage_, stage_, functions.forward ? "backward" : "forward");
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const int previous = stage_ - 1, next = stage_ + 1;
  std::vector<float> input(options_.inputElements), output(options_.outputElements);
  std::vector<float> inputGradient(options_.inputElements), outputGradient(options_.outputElements);

  PipelineStats stats;
  int held = 0;
  Transfer pending;
  for (const PipelineStep& step : steps_) {
    const bool forward = step.op == PipelineOp::kForward;
    Transfer recv;
    if (forward && stage_ > 0) recv = {input.data(), input.size(), previous};
    if (!forward && stage_ + 1 < stages_)
      recv = {outputGradient.data(), outputGradient.size(), next};
    exchange(comm_, stage_, pending, recv);

    const Clock::time_point computeStart = Clock::now();
    if (forward) {
      functions.forward(step.microBatch, input, output);
      stats.peakActivations = std::max(stats.peakActivations, ++held);
    } else {
      functions.backward(step.microBatch, outputGradient, inputGradient);
      --held;
    }
    stats.computeSeconds += std::chrono::duration<double>(Clock::now() - computeStart).count();

    pending = {};
    if (forward && stage_ + 1 < stages_) pending = {output.data(), output.size(), next};
    if (!forward && stage_ > 0) pending = {inputGradient.data(), inputGradient.size(), previous};
  }
  exchange(comm_, stage_, pending, {});
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return stats;
}

}  // namespace braid::dp
