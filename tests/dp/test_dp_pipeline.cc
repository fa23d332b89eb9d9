// Pipeline parallelism (include/braid/dp_pipeline.hpp): the schedules as pure lists, the driver's
// argument checks, and training equivalence: GPipe and 1F1B, alone and on a 2 x 2 grid with data
// parallelism, follow the single-rank run of the same MLP (examples/mlp_training.h).
#include <gtest/gtest.h>

#include <braid/dp_pipeline.hpp>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "local_ranks.h"
#include "mlp_training.h"

namespace {

using braid::dp::PipelineOp;
using braid::dp::PipelineStep;
using braid::dp::Schedule;

constexpr PipelineStep F(int i) {
  return {PipelineOp::kForward, i};
}
constexpr PipelineStep B(int i) {
  return {PipelineOp::kBackward, i};
}

TEST(PipelineSchedule, KnownOrders) {
  using S = std::vector<PipelineStep>;
  EXPECT_EQ(braid::dp::pipelineSchedule(Schedule::kGPipe, 2, 0, 3),
            (S{F(0), F(1), F(2), B(0), B(1), B(2)}));
  // 1F1B on 4 stages, 6 micro-batches: stage 0 warms up with 3 forwards, the last with none.
  EXPECT_EQ(braid::dp::pipelineSchedule(Schedule::k1F1B, 4, 0, 6),
            (S{F(0), F(1), F(2), F(3), B(0), F(4), B(1), F(5), B(2), B(3), B(4), B(5)}));
  EXPECT_EQ(braid::dp::pipelineSchedule(Schedule::k1F1B, 4, 3, 3),
            (S{F(0), B(0), F(1), B(1), F(2), B(2)}));
  // Fewer micro-batches than the warm-up: all forwards, then all backwards.
  EXPECT_EQ(braid::dp::pipelineSchedule(Schedule::k1F1B, 4, 0, 2), (S{F(0), F(1), B(0), B(1)}));
}

// Runs every stage's list against the others as blocking transfers would: F(i) on stage s needs
// F(i) of stage s - 1, B(i) needs B(i) of stage s + 1. Returns false on a deadlock.
bool completes(const std::vector<std::vector<PipelineStep>>& lists) {
  const int p = static_cast<int>(lists.size());
  std::vector<size_t> next(p, 0);
  std::map<std::pair<int, int>, bool> forwardDone, backwardDone;  // (stage, micro-batch)
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      if (next[s] == lists[s].size()) continue;
      const PipelineStep step = lists[s][next[s]];
      const bool ready = step.op == PipelineOp::kForward
                             ? s == 0 || forwardDone[{s - 1, step.microBatch}]
                             : s == p - 1 || backwardDone[{s + 1, step.microBatch}];
      if (!ready) continue;
      (step.op == PipelineOp::kForward ? forwardDone : backwardDone)[{s, step.microBatch}] = true;
      ++next[s];
      progress = true;
    }
  }
  for (int s = 0; s < p; ++s)
    if (next[s] != lists[s].size()) return false;
  return true;
}

TEST(PipelineSchedule, EveryStageRunsEachMicroBatchOnceInDependencyOrder) {
  for (Schedule schedule : {Schedule::kGPipe, Schedule::k1F1B})
    for (int p = 1; p <= 5; ++p)
      for (int m : {1, 2, 3, 4, 8, 13}) {
        SCOPED_TRACE(std::string(braid::dp::scheduleName(schedule)) + " p=" + std::to_string(p) +
                     " m=" + std::to_string(m));
        std::vector<std::vector<PipelineStep>> lists;
        for (int s = 0; s < p; ++s) {
          const std::vector<PipelineStep> steps = braid::dp::pipelineSchedule(schedule, p, s, m);
          ASSERT_EQ(steps.size(), 2u * m);
          std::vector<int> forwardAt(m, -1), backwardAt(m, -1);
          int forwards = 0, backwards = 0;
          for (int k = 0; k < 2 * m; ++k) {
            const PipelineStep& step = steps[k];
            if (step.op == PipelineOp::kForward) {
              EXPECT_EQ(step.microBatch, forwards++) << "forwards in micro-batch order";
              forwardAt[step.microBatch] = k;
            } else {
              EXPECT_EQ(step.microBatch, backwards++) << "backwards in micro-batch order";
              backwardAt[step.microBatch] = k;
            }
          }
          for (int i = 0; i < m; ++i)
            EXPECT_LT(forwardAt[i], backwardAt[i]) << "micro-batch " << i << " on stage " << s;
          const int expected = schedule == Schedule::kGPipe ? m : std::min(m, p - s);
          EXPECT_EQ(braid::dp::peakActivations(steps), expected) << "stage " << s;
          lists.push_back(steps);
        }
        EXPECT_TRUE(completes(lists)) << "the stages wait for each other";
      }
}

TEST(PipelineSchedule, RejectsBadArguments) {
  EXPECT_THROW(braid::dp::pipelineSchedule(Schedule::k1F1B, 2, 2, 4), braid::dp::Error);
  EXPECT_THROW(braid::dp::pipelineSchedule(Schedule::k1F1B, 0, 0, 4), braid::dp::Error);
  EXPECT_THROW(braid::dp::pipelineSchedule(Schedule::kGPipe, 2, 0, 0), braid::dp::Error);
  EXPECT_EQ(braid::dp::parseSchedule("gpipe"), Schedule::kGPipe);
  EXPECT_EQ(braid::dp::parseSchedule("1f1b"), Schedule::k1F1B);
  try {
    braid::dp::parseSchedule("zb");
    ADD_FAILURE() << "\"zb\" accepted";
  } catch (const braid::dp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"1f1b\""), std::string::npos) << e.what();
  }
}

// The driver on 3 threads: micro-batch i carries the value i + 1 through the stages, each adding
// its stage number; the gradient comes back the same way. Checks what arrives and the peak held.
TEST(Pipeline, CarriesActivationsAndGradients) {
  constexpr int kStages = 3, kMicro = 5, kWidth = 3;
  for (Schedule schedule : {Schedule::kGPipe, Schedule::k1F1B}) {
    const std::string errors = local_ranks::onThreads(kStages, [&](braidComm_t comm, int rank) {
      braid::dp::PipelineOptions options;
      options.schedule = schedule;
      options.microBatches = kMicro;
      options.inputElements = rank == 0 ? 0 : kWidth;
      options.outputElements = rank == kStages - 1 ? 0 : kWidth;
      braid::dp::Pipeline pipeline(comm, options);
      std::vector<float> seen(kMicro, 0.0f);
      braid::dp::StageFunctions functions;
      functions.forward = [&](int i, std::span<const float> in, std::span<float> out) {
        const float value = rank == 0 ? static_cast<float>(i + 1) : in[0];
        if (rank > 0) {
          EXPECT_EQ(value, i + 1.0f + (rank - 1) * rank / 2.0f) << "forward " << i;
        }
        seen[i] = value + rank;
        for (float& v : out) v = value + rank;
      };
      functions.backward = [&](int i, std::span<const float> outGrad, std::span<float> inGrad) {
        const float gradient = rank == kStages - 1 ? -seen[i] : outGrad[kWidth - 1];
        if (rank < kStages - 1) {
          EXPECT_EQ(gradient, -100.0f * (i + 1)) << "backward " << i;
        }
        for (float& v : inGrad) v = -100.0f * (i + 1);
      };
      const braid::dp::PipelineStats stats = pipeline.run(functions);
      EXPECT_EQ(stats.peakActivations,
                schedule == Schedule::kGPipe ? kMicro : std::min(kMicro, kStages - rank));
      EXPECT_GE(stats.seconds, stats.computeSeconds);
    });
    EXPECT_EQ(errors, "") << braid::dp::scheduleName(schedule);
  }
}

TEST(Pipeline, RejectsSizesThatDoNotFitTheStage) {
  const std::string errors = local_ranks::onThreads(2, [&](braidComm_t comm, int rank) {
    braid::dp::PipelineOptions options;
    options.inputElements = 4;  // wrong on stage 0
    options.outputElements = rank == 0 ? 4 : 0;
    if (rank == 1) {
      EXPECT_NO_THROW((braid::dp::Pipeline{comm, options}));
      return;
    }
    try {
      braid::dp::Pipeline pipeline(comm, options);
      ADD_FAILURE() << "inputElements 4 accepted on the first stage";
    } catch (const braid::dp::Error& e) {
      EXPECT_EQ(e.code(), braidInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("rank 0 (stage 0 of 2) has inputElements 4"),
                std::string::npos)
          << e.what();
    }
  });
  EXPECT_EQ(errors, "");
}

struct Grid {
  int stages;
  int replicas;
  Schedule schedule;
  // fp16 with fp32 gradients, dynamic loss scaling and clipping by the global norm: the stages
  // must agree on overflow and the norm (Options::pipelineComm).
  bool mixed = false;
};

class PipelineEquivalence : public ::testing::TestWithParam<Grid> {
 protected:
  static mlp::TrainConfig config(bool mixed) {
    mlp::TrainConfig c;
    c.steps = 200;
    c.globalBatch = 16;
    c.widths = {8, 16, 16, 16, 4};           // 4 layers: up to 4 stages
    c.options.optimizer.weightDecay = 0.01;  // AdamW, lr 1e-3
    if (mixed) {
      c.options.precision = braidFloat16;
      c.options.fp32Gradients = true;
      c.options.lossScaling = true;
      c.options.optimizer.maxGradNorm = 0.5;
    }
    return c;
  }
  // The single-rank run: the whole model, the whole batch, no pipeline.
  static const mlp::TrainResult& reference(bool mixed) {
    static const mlp::TrainResult fp32 = mlp::train(config(false));
    static const mlp::TrainResult fp16 = mlp::train(config(true));
    return mixed ? fp16 : fp32;
  }
};

TEST_P(PipelineEquivalence, FollowsTheSingleRankRun) {
  const Grid g = GetParam();
  const double kTolerance = g.mixed ? 1e-3 : 1e-5;  // relative: fp16 with loss scaling, fp32
  mlp::TrainConfig c = config(g.mixed);
  c.stages = g.stages;
  c.ranks = g.stages * g.replicas;
  c.microBatches = 4;
  c.schedule = g.schedule;
  const mlp::TrainResult& ref = reference(g.mixed);
  ASSERT_EQ(ref.errors(), "");
  const mlp::TrainResult run = mlp::train(c);
  ASSERT_EQ(run.errors(), "");

  const std::vector<double> loss = run.loss(), refLoss = ref.loss();
  ASSERT_EQ(loss.size(), refLoss.size());
  double worstLoss = 0;
  for (size_t s = 0; s < loss.size(); ++s) {
    const double rel = std::abs(loss[s] - refLoss[s]) / std::abs(refLoss[s]);
    worstLoss = std::max(worstLoss, rel);
    EXPECT_LE(rel, kTolerance) << "step " << s << ": loss " << loss[s] << ", single rank "
                               << refLoss[s];
  }
  EXPECT_LT(loss.back(), 0.8 * loss.front()) << "training made no progress";
  const double parameters = mlp::relativeDistance(run.parameters(), ref.ranks[0].parameters);
  EXPECT_LE(parameters, kTolerance) << "final parameters";
  // Every replica ends with the same parameters as the first.
  for (const mlp::RankResult& r : run.ranks) {
    EXPECT_EQ(r.parameters, run.ranks[r.stage].parameters) << "replica " << r.replica;
    EXPECT_EQ(r.peakActivations, g.schedule == Schedule::kGPipe
                                     ? c.microBatches
                                     : std::min(c.microBatches, g.stages - r.stage))
        << "stage " << r.stage;
  }
  std::printf("[ achieved ] loss curve within %.2e, final parameters within %.2e (relative)\n",
              worstLoss, parameters);
}

INSTANTIATE_TEST_SUITE_P(
    Grids, PipelineEquivalence,
    ::testing::Values(Grid{2, 1, Schedule::kGPipe}, Grid{2, 1, Schedule::k1F1B},
                      Grid{4, 1, Schedule::kGPipe}, Grid{4, 1, Schedule::k1F1B},
                      Grid{2, 2, Schedule::kGPipe}, Grid{2, 2, Schedule::k1F1B},
                      Grid{2, 1, Schedule::k1F1B, true}, Grid{4, 1, Schedule::kGPipe, true},
                      Grid{2, 2, Schedule::k1F1B, true}),
    [](const ::testing::TestParamInfo<Grid>& info) {
      return std::string(braid::dp::scheduleName(info.param.schedule)) + "_pp" +
             std::to_string(info.param.stages) + "_dp" + std::to_string(info.param.replicas) +
             (info.param.mixed ? "_fp16_scaled_clipped" : "");
    });

}  // namespace
