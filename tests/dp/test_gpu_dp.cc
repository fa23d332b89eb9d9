// DataParallel on CUDA communicators (buffers in device memory, the step's kernels on the
// object's CUDA stream) against DataParallel on CPU communicators: 2 ranks as threads on device
// 0, the same synthetic gradients, every stage x precision x optimizer; after 4 steps every
// parameter must be the same bits. Exact, not close: the device kernels give the CPU kernels' bits
// (tests/dp/test_dp_device_form.cc), and a sum of two ranks' values does not depend on the order.
// The gradient norm is a sum of squares added in another order, so it is compared within 1e-12.
// Where no CUDA device is present every test is skipped, saying so.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <bit>
#include <braid/dp.hpp>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_common.h"
#include "mlp.h"

namespace {

using braid::dp::DataParallel;
using braid::dp::OptimizerKind;
using braid::dp::Options;
using braid::dp::Stage;

constexpr int kRanks = 2;
constexpr int kSteps = 4;
const std::vector<size_t> kParameterCounts = {1000, 7, 100003};

struct Training {
  std::vector<std::vector<float>> parameters;  // rank 0's, after the last step
  std::vector<double> gradNorms;
  std::string failure;
};

// One rank's training on `device` ("cpu" or "cuda"): gradients rank * step dependent, written
// into dp.gradient() (device memory on a CUDA communicator) in the gradient type.
void trainRank(const Options& options, const char* device, const braidUniqueId& id, int rank,
               Training& run, std::mutex& mutex) {
  auto failed = [&](const std::string& what) {
    const std::lock_guard lock(mutex);
    run.failure += "rank " + std::to_string(rank) + ": " + what + "\n";
  };
  const bool cuda = std::string(device) == "cuda";
  if (cuda && cudaSetDevice(0) != cudaSuccess) return failed("cudaSetDevice(0) failed");
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.device = device;
  config.timeoutMs = 60000;
  braidComm_t comm = nullptr;
  if (braidCommInitRankConfig(&comm, kRanks, id, rank, &config) != braidSuccess)
    return failed(std::string("init: ") + braidGetLastError(nullptr));
  try {
    DataParallel dp(comm, options);
    std::vector<int> ids;
    for (size_t count : kParameterCounts) ids.push_back(dp.addParameter(count));
    dp.finalize();
    for (size_t p = 0; p < ids.size(); ++p) {
      std::vector<float> initial(kParameterCounts[p]);
      for (size_t i = 0; i < initial.size(); ++i) initial[i] = 0.1f * mlp::uniform(100 + p, i);
      dp.setParameter(ids[p], initial);
    }
    const braidDataType_t type = dp.gradientType();
    const size_t elementSize = braid::dp::elementSize(type);
    for (int step = 0; step < kSteps; ++step) {
      for (int p = static_cast<int>(ids.size()) - 1; p >= 0; --p) {
        std::vector<float> grad(kParameterCounts[p]);
        for (size_t i = 0; i < grad.size(); ++i)
          grad[i] = mlp::uniform(1000 * step + 10 * p + rank, i) * dp.lossScale() / 64;
        std::vector<unsigned char> encoded(grad.size() * elementSize);
        braid::dp::convertFromFloat(grad.data(), encoded.data(), type, grad.size());
        void* target = dp.gradient(ids[p]);
        if (cuda) {
          // markReady asks for the bytes on the device: a pageable cudaMemcpy may return before
          // they land (run 3 on an H200 read one element as 0 before it had).
          if (cudaMemcpy(target, encoded.data(), encoded.size(), cudaMemcpyHostToDevice) !=
                  cudaSuccess ||
              !braid_test::uploadsLanded())
            throw std::runtime_error("cudaMemcpy of a gradient failed");
        } else {
          std::memcpy(target, encoded.data(), encoded.size());
        }
        dp.markReady(ids[p]);
      }
      const braid::dp::StepResult result = dp.step();
      if (!result.applied) throw std::runtime_error("step " + std::to_string(step) + " skipped");
      if (rank == 0) run.gradNorms.push_back(result.gradNorm);
    }
    if (rank == 0)
      for (size_t p = 0; p < ids.size(); ++p) {
        run.parameters.emplace_back(kParameterCounts[p]);
        dp.getParameter(ids[p], run.parameters.back());
      }
  } catch (const std::exception& e) {
    failed(e.what());
  }
  braidCommFinalize(comm);
  braidCommDestroy(comm);
}

Training train(const Options& options, const char* device) {
  Training run;
  braidUniqueId id;
  if (braidGetUniqueId(&id) != braidSuccess) return Training{{}, {}, "braidGetUniqueId failed"};
  std::mutex mutex;
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] { trainRank(options, device, id, r, run, mutex); });
  for (std::thread& t : threads) t.join();
  return run;
}

struct Case {
  Stage stage;
  braidDataType_t precision;
  OptimizerKind optimizer;
  bool hostOffload = false;  // ZeRO-Offload on the GPU (the CPU's state is in host memory anyway)
};

class GpuDataParallel : public testing::TestWithParam<Case> {};

TEST_P(GpuDataParallel, MatchesTheCpuCommunicator) {
  const std::string noDevice = braid_test::noCudaDevice();
  if (!noDevice.empty()) GTEST_SKIP() << noDevice;
  const Case c = GetParam();
  Options options;
  options.stage = c.stage;
  options.precision = c.precision;
  options.firstBucketBytes = 4096;
  options.bucketBytes = 64 << 10;
  options.lossScaling = c.precision == braidFloat16;
  options.lossScaler.initialScale = 1024;
  options.optimizer.kind = c.optimizer;
  options.optimizer.weightDecay = 0.01;
  if (c.hostOffload) options.offload.tier = braid::dp::OffloadTier::kHost;
  const Training host = train(options, "cpu");
  ASSERT_EQ(host.failure, "");
  const Training device = train(options, "cuda");
  ASSERT_EQ(device.failure, "");
  ASSERT_EQ(device.parameters.size(), host.parameters.size());
  for (size_t p = 0; p < host.parameters.size(); ++p)
    for (size_t i = 0; i < host.parameters[p].size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(device.parameters[p][i]),
                std::bit_cast<uint32_t>(host.parameters[p][i]))
          << "parameter " << p << ", element " << i << ": " << device.parameters[p][i]
          << " on the GPU, " << host.parameters[p][i] << " on the CPU";
  for (size_t s = 0; s < host.gradNorms.size(); ++s)
    EXPECT_NEAR(device.gradNorms[s], host.gradNorms[s], host.gradNorms[s] * 1e-12) << "step " << s;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (Stage stage : {Stage::kDdp, Stage::kZero1, Stage::kZero2})
    for (braidDataType_t precision : {braidFloat32, braidFloat16, braidBfloat16})
      for (OptimizerKind optimizer :
           {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdamW})
        all.push_back({stage, precision, optimizer});
  // ZeRO-Offload: the state and the step on the host, the same bits (the CPU kernels are the
  // device kernels' reference).
  for (Stage stage : {Stage::kDdp, Stage::kZero1, Stage::kZero2})
    for (braidDataType_t precision : {braidFloat32, braidFloat16})
      all.push_back({stage, precision, OptimizerKind::kAdamW, true});
  return all;
}

std::string caseName(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  const char* stages[] = {"ddp", "zero1", "zero2"};
  const char* precision = c.precision == braidFloat32   ? "fp32"
                          : c.precision == braidFloat16 ? "fp16"
                                                        : "bf16";
  const char* optimizer = c.optimizer == OptimizerKind::kSgd    ? "sgd"
                          : c.optimizer == OptimizerKind::kAdam ? "adam"
                                                                : "adamw";
  return std::string(stages[static_cast<int>(c.stage)]) + "_" + precision + "_" + optimizer +
         (c.hostOffload ? "_hostoffload" : "");
}

INSTANTIATE_TEST_SUITE_P(Grid, GpuDataParallel, testing::ValuesIn(cases()), caseName);

}  // namespace
