// Data-parallel training of mlp::Model with braid::dp, ranks as threads of this process or as
// processes. Each rank trains on its slice of the same global batch; used by examples/train_mlp
// and the dp tests. With stages > 1 the layers are also cut into a pipeline (braid/dp_pipeline.hpp)
// on a stages x replicas grid of ranks.
#pragma once

#include <braid/braid.h>

#include <algorithm>
#include <braid/dp.hpp>
#include <braid/dp_pipeline.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "local_ranks.h"
#include "mlp.h"

namespace mlp {

struct TrainConfig {
  int ranks = 1;
  int steps = 200;
  int globalBatch = 24;  // split evenly over ranks, then over micro-batches
  int microBatches = 1;  // > 1: gradient accumulation (no-sync micro-batches, then one that syncs)
  // > 1: pipeline parallelism. ranks = stages x data-parallel replicas; rank r is stage r % stages
  // of replica r / stages, and each replica's slice of the batch flows through its stages in
  // microBatches micro-batches.
  int stages = 1;
  braid::dp::Schedule schedule = braid::dp::Schedule::k1F1B;
  std::vector<int> widths{16, 32, 32, 4};  // inputs, hidden..., classes
  uint64_t dataSeed = 1;
  uint64_t initSeed = 7;
  braid::dp::Options options;
  int timeoutMs = 60000;  // per collective
  local_ranks::Launch launch = local_ranks::Launch::kThreads;
  // When set, the learning rate of each step (e.g. a warm-up schedule).
  std::function<double(int step)> learningRate;
  // When set, sees each layer's fp32 weight gradient before it is added (tests plant inf here).
  std::function<void(int rank, int step, int layer, std::span<float> dWeights)> editGradient;

  Task task() const { return Task{widths.front(), widths.back(), dataSeed}; }
};

struct RankResult {
  std::vector<double> loss;  // this rank's mean loss per step (a pipeline's last stage only)
  std::vector<braid::dp::StepResult> steps;
  std::vector<std::vector<float>> parameters;  // final: w0, b0, w1, b1, ... (its stage's) as fp32
  braid::dp::MemoryReport memory{};
  int buckets = 0;
  double seconds = 0;             // the training loop
  double exposedCommSeconds = 0;  // of which waiting for communication
  int stage = 0;                  // in the pipeline
  int replica = 0;                // in data parallelism
  int peakActivations = 0;  // pipeline: micro-batches held between forward and backward at once
  std::string error;
};

struct TrainResult {
  std::vector<RankResult> ranks;

  // The global batch's mean loss per step: every rank's slice is the same size. In a pipeline
  // only the last stages compute it.
  std::vector<double> loss() const {
    const auto withLoss = std::count_if(ranks.begin(), ranks.end(),
                                        [](const RankResult& r) { return !r.loss.empty(); });
    std::vector<double> mean;
    for (const RankResult& r : ranks) {
      mean.resize(std::max(mean.size(), r.loss.size()), 0.0);
      for (size_t s = 0; s < r.loss.size(); ++s) mean[s] += r.loss[s] / withLoss;
    }
    return mean;
  }
  // The final parameters of the whole model, w0, b0, w1, b1, ...: the first replica's stages'.
  std::vector<std::vector<float>> parameters() const {
    std::vector<std::vector<float>> all;
    for (const RankResult& r : ranks)
      if (r.replica == 0) all.insert(all.end(), r.parameters.begin(), r.parameters.end());
    return all;
  }
  std::string errors() const {
    std::string all;
    for (size_t r = 0; r < ranks.size(); ++r)
      if (!ranks[r].error.empty())
        all += "rank " + std::to_string(r) + ": " + ranks[r].error + "\n";
    return all;
  }
};

// How far two runs ended apart: ||a - b|| / ||b|| over every parameter tensor together (the
// relative L2 distance of the whole parameter vector, so a few elements a rounding apart do not
// dominate as they would elementwise).
inline double relativeDistance(const std::vector<std::vector<float>>& a,
                               const std::vector<std::vector<float>>& b) {
  double diff = 0, norm = 0;
  for (size_t t = 0; t < b.size(); ++t)
    for (size_t i = 0; i < b[t].size(); ++i) {
      const double d = static_cast<double>(a[t][i]) - b[t][i];
      diff += d * d;
      norm += static_cast<double>(b[t][i]) * b[t][i];
    }
  return std::sqrt(diff / norm);
}

// A rank's layers (the model's, or its pipeline stage's) as DataParallel parameters, with the fp32
// copies the forward pass reads. Under ZeRO-3 each model layer is a DataParallel layer, gathered
// (the next one prefetched) to refresh its copies and released after; this CPU example then keeps
// the fp32 copies for its backward pass, where a trainer on a device would gather again.
class LayerParameters {
 public:
  // precision: the working copy's type (Options::precision).
  LayerParameters(braid::dp::DataParallel& dp, braidDataType_t precision, const Model& model,
                  uint64_t initSeed, bool layerByLayer)
      : dp_(dp), precision_(precision), first_(model.firstLayer()), layerByLayer_(layerByLayer) {
    for (int l = first_; l < model.lastLayer(); ++l) {
      if (layerByLayer && l > first_) dp.beginLayer();
      weightIds_.push_back(dp.addParameter(model.weightCount(l), "w" + std::to_string(l)));
      biasIds_.push_back(dp.addParameter(model.outputs(l), "b" + std::to_string(l)));
    }
    dp.finalize();
    for (int l = first_; l < model.lastLayer(); ++l) {
      std::vector<float>& w = weights_.emplace_back(model.weightCount(l));
      std::vector<float>& b = biases_.emplace_back(model.outputs(l));
      model.initialize(initSeed, l, w, b);
      dp.setParameter(weightIds_[l - first_], w);
      dp.setParameter(biasIds_[l - first_], b);
      weightViews_.push_back(w.data());  // a vector's elements stay put when weights_ grows
      biasViews_.push_back(b.data());
    }
  }

  // The fp32 copies from the working copy (which the last step updated).
  void refresh() {
    for (size_t i = 0; i < weights_.size(); ++i) {
      gather(i);
      braid::dp::convertToFloat(dp_.parameter(weightIds_[i]), precision_, weights_[i].data(),
                                weights_[i].size());
      braid::dp::convertToFloat(dp_.parameter(biasIds_[i]), precision_, biases_[i].data(),
                                biases_[i].size());
      release(i);
    }
  }
  std::span<const float* const> weights() const { return weightViews_; }
  std::span<const float* const> biases() const { return biasViews_; }

  // Adds layer `layer`'s gradients into DataParallel's and marks them ready.
  void accumulate(int layer, std::span<const float> dWeights, std::span<const float> dBiases) {
    const size_t i = layer - first_;
    braid::dp::accumulateFromFloat(dWeights.data(), dp_.gradient(weightIds_[i]), dp_.gradientType(),
                                   dWeights.size());
    dp_.markReady(weightIds_[i]);
    braid::dp::accumulateFromFloat(dBiases.data(), dp_.gradient(biasIds_[i]), dp_.gradientType(),
                                   dBiases.size());
    dp_.markReady(biasIds_[i]);
  }

  // The final values, w, b per layer, as fp32.
  void collect(std::vector<std::vector<float>>& out) {
    for (size_t i = 0; i < weights_.size(); ++i) {
      gather(i);
      dp_.getParameter(weightIds_[i], weights_[i]);
      dp_.getParameter(biasIds_[i], biases_[i]);
      release(i);
      out.push_back(weights_[i]);
      out.push_back(biases_[i]);
    }
  }

 private:
  // Layer i whole (DataParallel's layer i: one per model layer), the next one's gather started.
  void gather(size_t i) {
    if (!layerByLayer_) return;
    dp_.gatherLayer(static_cast<int>(i));
    if (i + 1 < weights_.size()) dp_.prefetchLayer(static_cast<int>(i + 1));
  }
  void release(size_t i) {
    if (layerByLayer_) dp_.releaseLayer(static_cast<int>(i));
  }

  braid::dp::DataParallel& dp_;
  braidDataType_t precision_;
  int first_;
  bool layerByLayer_;
  std::vector<int> weightIds_, biasIds_;
  std::vector<std::vector<float>> weights_, biases_;
  std::vector<const float*> weightViews_, biasViews_;
};

// What a rank reports once its training ends: time, exposed communication, memory, parameters.
inline void finishRank(braid::dp::DataParallel& dp, LayerParameters& params,
                       std::chrono::steady_clock::time_point start, RankResult& out) {
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.exposedCommSeconds = dp.exposedCommSeconds();
  out.memory = dp.memoryReport();
  out.buckets = dp.bucketCount();
  params.collect(out.parameters);
}

inline void trainRank(const TrainConfig& config, braidComm_t comm, int rank, RankResult& out) {
  braid::dp::DataParallel dp(comm, config.options);
  Model model(config.widths);
  LayerParameters params(dp, config.options.precision, model, config.initSeed,
                         config.options.stage == braid::dp::Stage::kZero3);

  const Task task = config.task();
  const int local = config.globalBatch / config.ranks;
  const int micro = local / config.microBatches;
  std::vector<float> x(static_cast<size_t>(micro) * config.widths[0]);
  std::vector<int> labels(micro);
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < config.steps; ++step) {
    if (config.learningRate) dp.setLearningRate(config.learningRate(step));
    params.refresh();
    double loss = 0;
    for (int m = 0; m < config.microBatches; ++m) {
      dp.setGradientSync(m + 1 == config.microBatches);
      const uint64_t first = static_cast<uint64_t>(step) * config.globalBatch +
                             static_cast<uint64_t>(rank) * local + static_cast<uint64_t>(m) * micro;
      task.batch(first, micro, x.data(), labels.data());
      loss += model.forward(params.weights(), params.biases(), x.data(), labels.data(), micro) /
              config.microBatches;
      const float seed = static_cast<float>(dp.lossScale() / config.microBatches);
      model.backward(seed, [&](int l, std::span<float> dWeights, std::span<float> dBiases) {
        if (config.editGradient) config.editGradient(rank, step, l, dWeights);
        params.accumulate(l, dWeights, dBiases);
      });
    }
    out.loss.push_back(loss);
    out.steps.push_back(dp.step());
  }
  finishRank(dp, params, start, out);
}

// A communicator split from another, destroyed with its scope (aborted if an exception is on its
// way, so that peers waiting on this rank fail now rather than at the timeout).
class SplitComm {
 public:
  SplitComm(braidComm_t parent, int color, int key) {
    if (braidCommSplit(parent, color, key, &comm_, nullptr) != braidSuccess)
      throw std::runtime_error(std::string("braidCommSplit: ") + braidGetLastError(parent));
  }
  ~SplitComm() {
    if (std::uncaught_exceptions() > exceptions_)
      braidCommAbort(comm_);
    else
      braidCommDestroy(comm_);
  }
  SplitComm(const SplitComm&) = delete;
  SplitComm& operator=(const SplitComm&) = delete;
  braidComm_t get() const { return comm_; }

 private:
  braidComm_t comm_ = nullptr;
  int exceptions_ = std::uncaught_exceptions();
};

// One rank of a stages x replicas grid: its stage's layers, fed micro-batch by micro-batch by the
// pipeline, and its stage's gradients averaged over the replicas by DataParallel.
inline void trainPipelineRank(const TrainConfig& config, braidComm_t world, int rank,
                              RankResult& out) {
  const int stages = config.stages, replicas = config.ranks / stages, m = config.microBatches;
  out.stage = rank % stages;
  out.replica = rank / stages;
  const SplitComm pipelineComm(world, out.replica, out.stage);
  const SplitComm replicaComm(world, out.stage, out.replica);

  const int layers = static_cast<int>(config.widths.size()) - 1;
  const int firstLayer = out.stage * layers / stages, lastLayer = (out.stage + 1) * layers / stages;
  const bool firstStage = out.stage == 0, lastStage = out.stage + 1 == stages;
  // The stages agree on overflow and the gradient norm (loss scaling, clipping) over the pipeline.
  braid::dp::Options dpOptions = config.options;
  dpOptions.pipelineComm = pipelineComm.get();
  braid::dp::DataParallel dp(replicaComm.get(), dpOptions);
  // One model per micro-batch: each keeps its activations from its forward to its backward.
  std::vector<Model> models(m, Model(config.widths, firstLayer, lastLayer));
  LayerParameters params(dp, config.options.precision, models[0], config.initSeed,
                         config.options.stage == braid::dp::Stage::kZero3);

  const Task task = config.task();
  const int local = config.globalBatch / replicas;
  const int micro = local / m;
  braid::dp::PipelineOptions options;
  options.schedule = config.schedule;
  options.microBatches = m;
  options.inputElements = firstStage ? 0 : static_cast<size_t>(micro) * config.widths[firstLayer];
  options.outputElements = lastStage ? 0 : static_cast<size_t>(micro) * config.widths[lastLayer];
  braid::dp::Pipeline pipeline(pipelineComm.get(), options);

  std::vector<float> x(static_cast<size_t>(micro) * config.widths[0]);
  std::vector<std::vector<int>> labels(m, std::vector<int>(micro));  // read again by backward
  int step = 0;
  double loss = 0;
  braid::dp::StageFunctions functions;
  functions.forward = [&](int i, std::span<const float> input, std::span<float> output) {
    if (firstStage || lastStage)
      task.batch(static_cast<uint64_t>(step) * config.globalBatch +
                     static_cast<uint64_t>(out.replica) * local + static_cast<uint64_t>(i) * micro,
                 micro, x.data(), labels[i].data());
    loss += models[i].forward(params.weights(), params.biases(),
                              firstStage ? x.data() : input.data(), labels[i].data(), micro) /
            m;
    std::ranges::copy(models[i].output().first(output.size()), output.begin());
  };
  functions.backward = [&](int i, std::span<const float> outputGradient,
                           std::span<float> inputGradient) {
    dp.setGradientSync(i + 1 == m);  // both schedules end with micro-batch m - 1's backward
    auto add = [&](int l, std::span<float> dWeights, std::span<float> dBiases) {
      if (config.editGradient) config.editGradient(rank, step, l, dWeights);
      params.accumulate(l, dWeights, dBiases);
    };
    float* below = firstStage ? nullptr : inputGradient.data();
    if (lastStage)
      models[i].backward(static_cast<float>(dp.lossScale() / m), add, below);
    else
      models[i].backward(outputGradient, below, add);
  };

  const auto start = std::chrono::steady_clock::now();
  for (; step < config.steps; ++step) {
    if (config.learningRate) dp.setLearningRate(config.learningRate(step));
    params.refresh();
    loss = 0;
    const braid::dp::PipelineStats stats = pipeline.run(functions);
    out.peakActivations = std::max(out.peakActivations, stats.peakActivations);
    if (lastStage) out.loss.push_back(loss);
    out.steps.push_back(dp.step());
  }
  finishRank(dp, params, start, out);
}

// A RankResult as bytes, to come back from a rank's process.
class ResultBytes {
 public:
  static std::string encode(const RankResult& r) {
    ResultBytes out;
    out.putVector(r.loss);
    out.putVector(r.steps);
    out.put(r.parameters.size());
    for (const std::vector<float>& p : r.parameters) out.putVector(p);
    out.put(r.memory);
    out.put(r.buckets);
    out.put(r.seconds);
    out.put(r.exposedCommSeconds);
    out.put(r.stage);
    out.put(r.replica);
    out.put(r.peakActivations);
    return out.bytes_;
  }
  static RankResult decode(std::string bytes) {
    ResultBytes in;
    in.bytes_ = std::move(bytes);
    RankResult r;
    in.getVector(r.loss);
    in.getVector(r.steps);
    r.parameters.resize(in.get<size_t>());
    for (std::vector<float>& p : r.parameters) in.getVector(p);
    r.memory = in.get<braid::dp::MemoryReport>();
    r.buckets = in.get<int>();
    r.seconds = in.get<double>();
    r.exposedCommSeconds = in.get<double>();
    r.stage = in.get<int>();
    r.replica = in.get<int>();
    r.peakActivations = in.get<int>();
    if (in.offset_ != in.bytes_.size())
      throw std::runtime_error("a rank's result has " + std::to_string(in.bytes_.size()) +
                               " bytes, " + std::to_string(in.offset_) + " were expected");
    return r;
  }

 private:
  template <typename T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof value);
  }
  template <typename T>
  void putVector(const std::vector<T>& values) {
    put(values.size());
    bytes_.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  }
  template <typename T>
  T get() {
    T value;
    take(&value, sizeof value);
    return value;
  }
  template <typename T>
  void getVector(std::vector<T>& values) {
    values.resize(get<size_t>());
    take(values.data(), values.size() * sizeof(T));
  }
  void take(void* to, size_t n) {
    if (n > bytes_.size() - offset_)
      throw std::runtime_error("a rank's result ends after " + std::to_string(bytes_.size()) +
                               " bytes");
    std::memcpy(to, bytes_.data() + offset_, n);
    offset_ += n;
  }

  std::string bytes_;
  size_t offset_ = 0;
};

// Runs config.ranks ranks as config.launch says. Failures are reported per rank in
// RankResult::error.
inline TrainResult train(const TrainConfig& config) {
  const int layers = static_cast<int>(config.widths.size()) - 1;
  if (config.stages < 1 || config.stages > layers || config.ranks % config.stages != 0)
    throw std::invalid_argument("train: " + std::to_string(config.stages) +
                                " pipeline stages for " + std::to_string(config.ranks) +
                                " ranks and " + std::to_string(layers) +
                                " layers (expected a divisor of the ranks, at most the layers)");
  const int replicas = config.ranks / config.stages;
  if (config.ranks < 1 || config.microBatches < 1 ||
      config.globalBatch % (replicas * config.microBatches) != 0)
    throw std::invalid_argument("train: globalBatch " + std::to_string(config.globalBatch) +
                                " must split evenly over " + std::to_string(replicas) +
                                " replicas x " + std::to_string(config.microBatches) +
                                " micro-batches");
  const local_ranks::Outcome outcome = local_ranks::run(
      config.ranks, config.launch, config.timeoutMs, [&](braidComm_t comm, int rank) {
        RankResult out;
        if (config.stages > 1)
          trainPipelineRank(config, comm, rank, out);
        else
          trainRank(config, comm, rank, out);
        return ResultBytes::encode(out);
      });
  TrainResult result;
  result.ranks.resize(config.ranks);
  for (int rank = 0; rank < config.ranks; ++rank) {
    RankResult& r = result.ranks[rank];
    r.error = outcome.errors[rank];
    if (!r.error.empty()) continue;
    try {
      r = ResultBytes::decode(outcome.results[rank]);
    } catch (const std::exception& e) {
      r.error = e.what();
    }
  }
  return result;
}

}  // namespace mlp
