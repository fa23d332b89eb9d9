// braid pipeline parallelism: a model's layers cut into stages on consecutive ranks of a
// communicator, micro-batches flowing forward (activations) and back (gradients) with
// braidSend/braidRecv, GPipe or 1F1B order, gradients accumulated over the micro-batches. Built on
// the public C API (braid.h) only; docs/dp.md ("Pipeline parallelism") describes the design.
//
// One training step, per rank (stage = rank in the pipeline communicator):
//
//   braid::dp::Pipeline pipeline(pipelineComm, options);   // schedule, m, activation sizes
//   ... gradients zeroed (DataParallel::step() does it) ...
//   pipeline.run({forward, backward});    // every micro-batch forward and backward once
//   dp.step();                            // this stage's parameters, over its data-parallel comm
//
// Combined with data parallelism on a P x D grid, braidCommSplit makes the pipeline communicator
// (the ranks of one replica, keyed by stage) and the data-parallel one (the ranks of one stage).
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "braid/dp.hpp"

namespace braid::dp {

enum class Schedule {
  kGPipe,  // every forward, then every backward: a stage holds all m micro-batches' activations
  k1F1B    // PipeDream-Flush: p-1-s warm-up forwards, then one forward one backward, cool-down
};

// "gpipe" or "1f1b"; throws Error for anything else.
Schedule parseSchedule(const std::string& name);
const char* scheduleName(Schedule schedule);

enum class PipelineOp { kForward, kBackward };

struct PipelineStep {
  PipelineOp op;
  int microBatch;
  bool operator==(const PipelineStep&) const = default;
};

// What stage `stage` of `stages` runs for `microBatches` micro-batches, in order. Pure. Both
// schedules run the backward passes in micro-batch order 0..m-1, so a stage's last backward is
// micro-batch m-1 (where a DataParallel trainer turns gradient sync back on).
std::vector<PipelineStep> pipelineSchedule(Schedule schedule, int stages, int stage,
                                           int microBatches);

// The most micro-batches whose forward has run and backward has not, at any point of `steps`:
// the activations a stage holds at once (GPipe: m; 1F1B: min(m, p - s)).
int peakActivations(std::span<const PipelineStep> steps);

// A stage's part of the model. Activations and gradients are fp32, a fixed number of elements
// per micro-batch. The first stage's forward reads its own data (input is empty) and its backward
// has no input gradient to produce (inputGradient is empty); the last stage's forward computes
// the loss (output is empty) and its backward starts from it (outputGradient is empty).
struct StageFunctions {
  // Computes output from input for micro-batch `microBatch`, keeping what its backward needs.
  std::function<void(int microBatch, std::span<const float> input, std::span<float> output)>
      forward;
  // From the gradient of the loss with respect to the output, writes the one with respect to the
  // input and adds the parameters' gradients into their accumulators; may drop what the forward
  // kept for this micro-batch.
  std::function<void(int microBatch, std::span<const float> outputGradient,
                     std::span<float> inputGradient)>
      backward;
};

struct PipelineOptions {
  Schedule schedule = Schedule::k1F1B;
  int microBatches = 1;
  // Elements per micro-batch this stage receives from the previous stage (0 on the first) and
  // sends to the next (0 on the last); neighbours must agree (braid refuses a count mismatch).
  size_t inputElements = 0;
  size_t outputElements = 0;
};

struct PipelineStats {
  double seconds = 0;         // the whole run on this stage
  double computeSeconds = 0;  // inside the stage's forward and backward functions
  int peakActivations = 0;    // micro-batches held between their forward and backward at once
};

class Pipeline {
 public:
  // comm: a CPU communicator whose ranks are the stages in order. Sends and receives are blocking
  // calls on the NULL stream, bounded by the communicator's timeout. Nothing else may use `comm`
  // while run() is in progress.
  Pipeline(braidComm_t comm, const PipelineOptions& options);

  // One step: every micro-batch forward and backward once, in the schedule's order. Receives a
  // step's input just before it runs, sends its output right after, in one group with the next
  // step's receive (so that neighbours that both send and receive cannot wait for each other).
  PipelineStats run(const StageFunctions& functions);

  int stage() const { return stage_; }
  int stages() const { return stages_; }
  const std::vector<PipelineStep>& steps() const { return steps_; }

 private:
  braidComm_t comm_;
  PipelineOptions options_;
  int stage_ = 0;
  int stages_ = 1;
  std::vector<PipelineStep> steps_;
};

}  // namespace braid::dp
