// A synthetic training problem for comparing DataParallel configurations bit for bit: three
// layers of two parameters (a weight and a bias), registered as DataParallel layers, whose
// gradients pull each parameter toward a target, scaled by the rank and disturbed per step (so
// that moments and master weights all matter and the ranks' gradients differ). The training loop
// gathers and releases layers as a ZeRO-3 trainer must (nothing to do at other stages).
#pragma once

#include <gtest/gtest.h>

#include <braid/dp.hpp>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "local_ranks.h"

namespace synthetic {

using braid::dp::DataParallel;
using braid::dp::Options;

// Three layers of two parameters each (a weight and a bias), registered in forward order.
inline const std::vector<std::vector<size_t>> kLayers = {{300, 17}, {1000, 40}, {77, 5}};

struct Model {
  std::vector<std::vector<int>> ids;  // by layer
};

inline Model registerModel(DataParallel& dp) {
  Model m;
  for (size_t l = 0; l < kLayers.size(); ++l) {
    if (l > 0) dp.beginLayer();
    m.ids.emplace_back();
    for (size_t count : kLayers[l]) m.ids.back().push_back(dp.addParameter(count));
  }
  return m;
}

inline float gradientOf(float w, size_t i, int step, int rank) {
  const float target = std::sin(0.01f * static_cast<float>(i));
  return (w - target) * static_cast<float>(1 + rank) + 0.01f * std::cos(0.1f * step + i);
}

// One step as a ZeRO-3 trainer runs it: forward gathers each layer (prefetching the next) and
// reads its parameters, backward gathers them again in reverse and writes the gradients. Under
// other stages the gathers do nothing and the same code runs.
inline void trainStep(DataParallel& dp, const Model& m, int step, int rank) {
  const int layers = static_cast<int>(kLayers.size());
  std::vector<float> w, g;
  for (int l = 0; l < layers; ++l) {
    dp.gatherLayer(l);
    if (l + 1 < layers) dp.prefetchLayer(l + 1);
    for (int id : m.ids[l]) EXPECT_NE(dp.parameter(id), nullptr);
    dp.releaseLayer(l);
  }
  for (int l = layers - 1; l >= 0; --l) {
    dp.gatherLayer(l);
    if (l > 0) dp.prefetchLayer(l - 1);
    for (size_t k = m.ids[l].size(); k-- > 0;) {
      const int id = m.ids[l][k];
      w.resize(kLayers[l][k]);
      g.resize(w.size());
      dp.getParameter(id, w);
      for (size_t i = 0; i < w.size(); ++i)
        g[i] = gradientOf(w[i], i, step, rank) * static_cast<float>(dp.lossScale());
      braid::dp::accumulateFromFloat(g.data(), dp.gradient(id), dp.gradientType(), g.size());
      dp.markReady(id);
    }
    dp.releaseLayer(l);
  }
  dp.step();
}

// Every rank's parameters after `steps` steps (by rank, then parameter in registration order).
inline std::vector<std::vector<std::vector<float>>> train(int nranks, const Options& options,
                                                          int steps) {
  std::vector<std::vector<std::vector<float>>> result(nranks);
  std::mutex mutex;
  const std::string errors = local_ranks::onThreads(nranks, [&](braidComm_t comm, int rank) {
    DataParallel dp(comm, options);
    const Model m = registerModel(dp);
    dp.finalize();
    for (size_t l = 0; l < kLayers.size(); ++l)
      for (size_t k = 0; k < kLayers[l].size(); ++k) {
        std::vector<float> init(kLayers[l][k]);
        for (size_t i = 0; i < init.size(); ++i) init[i] = 0.5f * std::cos(0.3f * i + l + k);
        dp.setParameter(m.ids[l][k], init);
      }
    for (int step = 0; step < steps; ++step) trainStep(dp, m, step, rank);
    std::vector<std::vector<float>> mine;
    for (size_t l = 0; l < kLayers.size(); ++l) {
      dp.gatherLayer(static_cast<int>(l));
      for (size_t k = 0; k < kLayers[l].size(); ++k) {
        mine.emplace_back(kLayers[l][k]);
        dp.getParameter(m.ids[l][k], mine.back());
      }
      dp.releaseLayer(static_cast<int>(l));
    }
    std::lock_guard<std::mutex> lock(mutex);
    result[rank] = std::move(mine);
  });
  EXPECT_EQ(errors, "");
  return result;
}

}  // namespace synthetic
