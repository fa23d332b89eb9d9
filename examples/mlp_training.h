// Data-parallel training of mlp::Model with braid::dp, ranks as threads of this process or as
// processes. Each rank trains on its slice of the same global batch; used by examples/train_mlp
// and the dp tests.
#pragma once

#include <braid/braid.h>

#include <braid/dp.hpp>
#include <chrono>
#include <cstring>
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
  std::vector<double> loss;  // this rank's mean loss per step
  std::vector<braid::dp::StepResult> steps;
  std::vector<std::vector<float>> parameters;  // final: w0, b0, w1, b1, ... as fp32
  braid::dp::MemoryReport memory{};
  int buckets = 0;
  double seconds = 0;             // the training loop
  double exposedCommSeconds = 0;  // of which waiting for communication
  std::string error;
};

struct TrainResult {
  std::vector<RankResult> ranks;

  // The global batch's mean loss per step: every rank's slice is the same size.
  std::vector<double> loss() const {
    std::vector<double> mean(ranks[0].loss.size(), 0.0);
    for (const RankResult& r : ranks)
      for (size_t s = 0; s < mean.size() && s < r.loss.size(); ++s)
        mean[s] += r.loss[s] / ranks.size();
    return mean;
  }
  std::string errors() const {
    std::string all;
    for (size_t r = 0; r < ranks.size(); ++r)
      if (!ranks[r].error.empty())
        all += "rank " + std::to_string(r) + ": " + ranks[r].error + "\n";
    return all;
  }
};

inline void trainRank(const TrainConfig& config, braidComm_t comm, int rank, RankResult& out) {
  using braid::dp::DataParallel;
  const braidDataType_t precision = config.options.precision;
  DataParallel dp(comm, config.options);
  Model model(config.widths);
  std::vector<int> weightIds, biasIds;
  for (int l = 0; l < model.layers(); ++l) {
    weightIds.push_back(dp.addParameter(model.weightCount(l), "w" + std::to_string(l)));
    biasIds.push_back(dp.addParameter(model.outputs(l), "b" + std::to_string(l)));
  }
  dp.finalize();
  std::vector<std::vector<float>> weights(model.layers()), biases(model.layers());
  for (int l = 0; l < model.layers(); ++l) {
    weights[l].resize(model.weightCount(l));
    biases[l].resize(model.outputs(l));
    model.initialize(config.initSeed, l, weights[l], biases[l]);
    dp.setParameter(weightIds[l], weights[l]);
    dp.setParameter(biasIds[l], biases[l]);
  }
  std::vector<const float*> weightViews, biasViews;
  for (int l = 0; l < model.layers(); ++l) {
    weightViews.push_back(weights[l].data());
    biasViews.push_back(biases[l].data());
  }

  const Task task = config.task();
  const int local = config.globalBatch / config.ranks;
  const int micro = local / config.microBatches;
  std::vector<float> x(static_cast<size_t>(micro) * config.widths[0]);
  std::vector<int> labels(micro);
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < config.steps; ++step) {
    if (config.learningRate) dp.setLearningRate(config.learningRate(step));
    for (int l = 0; l < model.layers(); ++l) {
      braid::dp::convertToFloat(dp.parameter(weightIds[l]), precision, weights[l].data(),
                                weights[l].size());
      braid::dp::convertToFloat(dp.parameter(biasIds[l]), precision, biases[l].data(),
                                biases[l].size());
    }
    double loss = 0;
    for (int m = 0; m < config.microBatches; ++m) {
      dp.setGradientSync(m + 1 == config.microBatches);
      const uint64_t first = static_cast<uint64_t>(step) * config.globalBatch +
                             static_cast<uint64_t>(rank) * local + static_cast<uint64_t>(m) * micro;
      task.batch(first, micro, x.data(), labels.data());
      loss += model.forward(weightViews, biasViews, x.data(), labels.data(), micro) /
              config.microBatches;
      const float seed = static_cast<float>(dp.lossScale() / config.microBatches);
      model.backward(seed, [&](int l, std::span<float> dWeights, std::span<float> dBiases) {
        if (config.editGradient) config.editGradient(rank, step, l, dWeights);
        braid::dp::accumulateFromFloat(dWeights.data(), dp.gradient(weightIds[l]),
                                       dp.gradientType(), dWeights.size());
        dp.markReady(weightIds[l]);
        braid::dp::accumulateFromFloat(dBiases.data(), dp.gradient(biasIds[l]), dp.gradientType(),
                                       dBiases.size());
        dp.markReady(biasIds[l]);
      });
    }
    out.loss.push_back(loss);
    out.steps.push_back(dp.step());
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.exposedCommSeconds = dp.exposedCommSeconds();
  out.memory = dp.memoryReport();
  out.buckets = dp.bucketCount();
  for (int l = 0; l < model.layers(); ++l) {
    dp.getParameter(weightIds[l], weights[l]);
    dp.getParameter(biasIds[l], biases[l]);
    out.parameters.push_back(weights[l]);
    out.parameters.push_back(biases[l]);
  }
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
  if (config.ranks < 1 || config.microBatches < 1 ||
      config.globalBatch % (config.ranks * config.microBatches) != 0)
    throw std::invalid_argument("train: globalBatch " + std::to_string(config.globalBatch) +
                                " must split evenly over " + std::to_string(config.ranks) +
                                " ranks x " + std::to_string(config.microBatches) +
                                " micro-batches");
  const local_ranks::Outcome outcome = local_ranks::run(
      config.ranks, config.launch, config.timeoutMs, [&](braidComm_t comm, int rank) {
        RankResult out;
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
