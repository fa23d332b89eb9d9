// braid data parallelism: gradient buckets that all-reduce while the backward pass runs, dynamic
// loss scaling for fp16, and ZeRO stage 1 and 2 (optimizer state, then gradients, sharded 1/N
// per rank). Built on the public C API (braid.h) only. Defaults follow PyTorch DDP, GradScaler and
// DeepSpeed; docs/dp.md describes the design.
//
// One training step, per rank:
//
//   braid::dp::DataParallel dp(comm, options);
//   int w = dp.addParameter(count, "w");     // every parameter, in forward order
//   dp.finalize();                           // lays out buckets and buffers
//   dp.setParameter(w, initialValues);       // the same values on every rank
//   for (...) {
//     forward with dp.parameter(w) ...;      // the working copy (options.precision)
//     backward, seeded with loss * dp.lossScale(); for each parameter, last layer first:
//       add the gradient into dp.gradient(w), then dp.markReady(w);
//     braid::dp::StepResult r = dp.step();   // reduce, unscale, check, clip, update, gather
//   }
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "braid/braid.h"

namespace braid::dp {

// What every function here throws: a braid result code and a sentence naming the rank, the
// parameter or bucket, and what was expected.
class Error : public std::runtime_error {
 public:
  Error(braidResult_t code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  braidResult_t code() const { return code_; }

 private:
  braidResult_t code_;
};

// ---- element conversion (fp32 <-> braidFloat32, braidFloat16, braidBfloat16) -----------------

void convertToFloat(const void* src, braidDataType_t type, float* dst, size_t count);
void convertFromFloat(const float* src, void* dst, braidDataType_t type, size_t count);
// dst[i] += src[i], rounded once to `type`: how a backward pass adds into dp.gradient().
void accumulateFromFloat(const float* src, void* dst, braidDataType_t type, size_t count);
size_t elementSize(braidDataType_t type);  // 4 or 2; throws for types gradients cannot have

// ---- dynamic loss scaling ----------------------------------------------------------------------

struct LossScalerOptions {
  double initialScale = 65536.0;  // 2^16, as GradScaler and DeepSpeed
  double growthFactor = 2.0;
  double backoffFactor = 0.5;
  int growthInterval = 2000;  // clean steps in a row before the scale grows
  double minScale = 1.0;
  // Overflows in a row tolerated before the scale is cut (DeepSpeed's delayed shift); every
  // overflowing step is skipped regardless. 1: cut at the first.
  int hysteresis = 1;
};

// The scale's state machine. DataParallel feeds it the overflow verdict all ranks agreed on, so
// every rank's scaler moves in lockstep.
class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options = {});
  double scale() const { return scale_; }
  // Records one step: an overflow (a skipped step) or a clean one.
  void update(bool overflow);
  int cleanSteps() const { return cleanSteps_; }

 private:
  LossScalerOptions options_;
  double scale_;
  int cleanSteps_ = 0;
  int overflowsLeft_;  // until the scale is cut
};

// ---- optimizer ---------------------------------------------------------------------------------

enum class OptimizerKind {
  kSgd,   // with momentum (PyTorch's SGD: L2 weight decay, no dampening)
  kAdam,  // L2 weight decay added to the gradient
  kAdamW  // decoupled weight decay
};

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double learningRate = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double momentum = 0.9;  // SGD; 0 keeps no momentum buffer
  double weightDecay = 0.0;
  double maxGradNorm = 0.0;  // clip by the global L2 norm when > 0
};

// ---- data parallelism --------------------------------------------------------------------------

enum class Stage {
  kDdp = 0,    // gradients all-reduced; every rank keeps the whole optimizer
  kZero1 = 1,  // optimizer state (fp32 master weights, moments) sharded 1/N
  kZero2 = 2,  // ... and gradients: each rank keeps only its shard's
  // ... and parameters: each rank keeps its shard of the working copy; a layer's parameters are
  // all-gathered whole just before it computes (gatherLayer, prefetchLayer) and freed after
  // (releaseLayer). 16P/N bytes per rank with mixed-precision Adam, plus the gathered layers.
  kZero3 = 3
};

// Where the optimizer's state (the owned shard's fp32 master weights and moments) lives.
enum class OffloadTier {
  kNone,  // with the parameters (host memory, or the device of a CUDA communicator)
  // In host memory, with the optimizer step run there by the CPU kernels (ZeRO-Offload): for a
  // CUDA communicator each bucket's gradient shard comes to the host and its updated parameters go
  // back; fp32 master weights are kept on the host at every precision. A CPU communicator's state
  // is in host memory already: as kNone.
  kHost,
  // In a file per rank (ZeRO-Infinity's NVMe tier), for a CPU communicator: the step pages each
  // bucket's state in and back out on a thread of its own, overlapped with the updates, so two
  // buckets' worth stays resident.
  kFile
};
struct OffloadOptions {
  OffloadTier tier = OffloadTier::kNone;
  std::string directory = "/tmp";  // kFile: where each rank's state file goes (an NVMe mount)
};

struct Options {
  Stage stage = Stage::kDdp;
  // Parameters and gradients: braidFloat32, braidFloat16 or braidBfloat16. With 16-bit types the
  // optimizer keeps fp32 master weights.
  braidDataType_t precision = braidFloat32;
  // 16-bit precision: keep gradients in fp32 from the backward pass through the reduction to the
  // optimizer (Megatron's accumulate_allreduce_grads_in_fp32, FSDP's reduce_dtype=float32), 2
  // more bytes per gradient element. Each rank's partial gradient is then never rounded to 16
  // bits, so N ranks compute the single-rank gradient up to fp32 summation order; with 16-bit
  // gradients they differ from it by up to N half-ulps, which Adam's per-element normalization
  // can turn into visibly different training (docs/dp.md, "Equivalence").
  bool fp32Gradients = false;
  size_t bucketBytes = 25u << 20;      // PyTorch DDP's bucket_cap_mb
  size_t firstBucketBytes = 1u << 20;  // the first bucket (last layers) launches early
  // ZeRO-2 only: bucket-sized buffers the backward pass writes into before their reduce-scatter.
  int stagingBuffers = 2;
  bool lossScaling = false;  // dynamic loss scaling (use with fp16); off: the scale stays 1
  LossScalerOptions lossScaler;
  OptimizerOptions optimizer;
  OffloadOptions offload;
  // With pipeline parallelism (braid/dp_pipeline.hpp), where `comm` holds one stage's replicas:
  // the communicator of this replica's stages. The step's overflow verdict and gradient norm are
  // then agreed over it too, so every stage of the model skips, unscales and clips alike. NULL:
  // `comm`'s ranks hold the whole model.
  braidComm_t pipelineComm = nullptr;
};

struct StepResult {
  bool applied;      // false: some rank found inf/NaN, every rank skipped this step
  double lossScale;  // the scale the step's gradients carried
  double gradNorm;   // global L2 norm of the averaged, unscaled gradients (before clipping)
};

// Bytes one rank holds; a stage's figures follow the ZeRO paper with Adam in mixed precision
// (stage 1: 4P + 12P/N, stage 2: 2P + 14P/N, stage 3: 16P/N plus two adjacent layers gathered;
// fp32Gradients: 6P + 12P/N, 2P + 16P/N and 18P/N), P counted with padding.
struct MemoryReport {
  size_t parameterCount;        // P as registered
  size_t paddedParameterCount;  // P plus padding: every bucket a multiple of the rank count
  size_t parameterBytes;        // the working copy: whole (ZeRO-3: the owned shard)
  size_t gatheredBytes;  // ZeRO-3: the largest two adjacent layers, whole (one gathered while
                         // it computes, the next prefetched)
  size_t gradientBytes;  // gradients kept across the step (stage 2: the shard's)
  size_t gradientStagingBytes;  // stage 2: buffers the backward pass writes before reduction
  size_t optimizerStateBytes;   // fp32 master weights (16-bit precision) and moments, resident
  size_t offloadedStateBytes;   // ... and off the device: in host memory (OffloadTier::kHost on a
                                // CUDA communicator) or in the offload file (kFile)
  size_t total() const {
    return parameterBytes + gatheredBytes + gradientBytes + gradientStagingBytes +
           optimizerStateBytes;
  }
};

class DataParallel {
 public:
  // comm: a CPU communicator (the object creates one host stream for its collectives; buffers in
  // host memory) or a CUDA communicator (one CUDA stream of its own for the collectives and the
  // step's kernels; parameter() and gradient() are device memory, and the caller's writes into a
  // gradient must be complete on the device when markReady() is called: the object's stream does
  // not wait for other streams, and a cudaMemcpy from pageable memory may return before its bytes
  // land, so synchronize the stream that wrote them first). Nothing else may use
  // `comm` while the object lives. One thread drives the object (it is not thread-safe).
  DataParallel(braidComm_t comm, const Options& options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Registers a parameter of `count` elements; call in forward order (buckets fill in reverse)
  // and identically on every rank. Returns its id.
  int addParameter(size_t count, std::string name = {});
  // Starts a layer: the parameters added from here on belong to it (parameters added before the
  // first call are layer 0). ZeRO-3 gathers and frees parameters a layer at a time; at every
  // stage no bucket spans two layers (so stages lay out alike). Returns the layer's index.
  int beginLayer();
  int layerCount() const;

  // Lays out buckets and allocates; no parameter may be added afterwards.
  void finalize();

  // ZeRO-3 (other stages: nothing to do, every parameter is always whole). prefetchLayer starts
  // all-gathering the layer's parameters on the object's stream (the next layer's gather
  // overlapping this one's compute); gatherLayer waits for them (starting the gather if need be):
  // from then until releaseLayer, parameter() and getParameter() of the layer's parameters may be
  // used. Every rank gathers the same layers in the same order.
  void prefetchLayer(int layer);
  void gatherLayer(int layer);
  void releaseLayer(int layer);

  // Initial values; every rank must pass the same ones.
  void setParameter(int id, std::span<const float> values);
  // The working copy as fp32.
  void getParameter(int id, std::span<float> out) const;

  // The working copy (options.precision) the forward pass reads; whole on every rank (ZeRO-3:
  // while its layer is gathered).
  const void* parameter(int id) const;
  // The element type of gradient(): options.precision, or braidFloat32 with fp32Gradients.
  braidDataType_t gradientType() const;
  // Where the backward pass adds this parameter's gradient (gradientType()): zero at the
  // start of an accumulation window (ZeRO-2: of every micro-batch). Valid until markReady(id).
  void* gradient(int id);
  // The gradient is complete for this micro-batch. Once every parameter of a bucket is ready the
  // bucket's all-reduce (ZeRO: reduce-scatter) starts on the stream, overlapping what follows;
  // buckets start in index order (as DDP's), so ranks may ready parameters in different orders.
  // A micro-batch ends when every parameter is ready; the next one's gradient() and markReady()
  // of a bucket still reducing wait for it.
  void markReady(int id);
  // false: the micro-batches that follow only accumulate (PyTorch's no_sync); the last one of a
  // window must sync. ZeRO-2 reduces every micro-batch anyway and accumulates its shard.
  void setGradientSync(bool sync);

  // Multiply the loss (the backward pass's seed) by this.
  double lossScale() const;
  void setLearningRate(double learningRate);

  // Ends the accumulation window: waits for the reductions, agrees on overflow across ranks,
  // unscales, clips, updates the (owned) parameters, all-gathers them (ZeRO), zeroes gradients.
  StepResult step();

  MemoryReport memoryReport() const;
  // Wall time this rank spent waiting for communication (stream synchronizations), in total.
  double exposedCommSeconds() const;
  // Bytes of every collective this object called, as nccl-tests sizes them (an all-reduce's
  // buffer, an all-gather's output, a reduce-scatter's input), in total: ZeRO-3 moves 3P per step
  // (two gathers and a reduce-scatter of every parameter), the other stages 2P.
  uint64_t collectiveBytes() const;
  int rank() const;
  int nranks() const;
  int bucketCount() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- large-batch training (Goyal et al. 2017) --------------------------------------------------

// The learning rate grows linearly with the global batch: baseLr * globalBatch / baseBatch.
double scaleLearningRate(double baseLearningRate, int baseBatch, int globalBatch);

// Gradual warm-up: from startLr at step 0 linearly to targetLr at warmupSteps, then targetLr.
double warmupLearningRate(double startLearningRate, double targetLearningRate, int step,
                          int warmupSteps);

}  // namespace braid::dp
