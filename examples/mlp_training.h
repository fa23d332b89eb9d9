// Data-parallel training of mlp::Model with braid::dp, ranks as threads of this process. Each
// rank trains on its slice of the same global batch; used by examples/train_mlp and the dp tests.
#pragma once

#include <braid/braid.h>

#include <braid/dp.hpp>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

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

// Runs config.ranks ranks as threads. Failures are reported per rank in RankResult::error.
inline TrainResult train(const TrainConfig& config) {
  if (config.ranks < 1 || config.microBatches < 1 ||
      config.globalBatch % (config.ranks * config.microBatches) != 0)
    throw std::invalid_argument("train: globalBatch " + std::to_string(config.globalBatch) +
                                " must split evenly over " + std::to_string(config.ranks) +
                                " ranks x " + std::to_string(config.microBatches) +
                                " micro-batches");
  TrainResult result;
  result.ranks.resize(config.ranks);
  braidUniqueId id;
  if (braidGetUniqueId(&id) != braidSuccess)
    throw std::runtime_error(std::string("braidGetUniqueId: ") + braidGetLastError(nullptr));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < config.ranks; ++rank)
    threads.emplace_back([&, rank] {
      RankResult& out = result.ranks[rank];
      braidConfig_t commConfig = BRAID_CONFIG_INITIALIZER;
      commConfig.timeoutMs = config.timeoutMs;
      commConfig.device = "cpu";
      braidComm_t comm = nullptr;
      if (braidCommInitRankConfig(&comm, config.ranks, id, rank, &commConfig) != braidSuccess) {
        out.error = std::string("braidCommInitRankConfig: ") + braidGetLastError(nullptr);
        return;
      }
      try {
        trainRank(config, comm, rank, out);
      } catch (const std::exception& e) {
        out.error = e.what();
        braidCommAbort(comm);  // peers waiting on this rank fail now rather than at the timeout
        return;
      }
      braidCommDestroy(comm);
    });
  for (std::thread& t : threads) t.join();
  return result;
}

}  // namespace mlp
