// The data-parallel step's CUDA kernels (src/dp/device_kernels.cuh) on CPU threads: one
// std::thread per device thread, a std::barrier per block where the kernel has __syncthreads, a
// vector for the block's shared memory. Every output is poisoned first and compared with the CPU
// kernels' generic build (src/dp/kernels.h), bit for bit; inspection's sum of squares, added in
// another order, within the bound device_kernels.cuh derives. Shapes: 1, 4, 32 threads per
// block (and 3: a tree of odd width), 1 to 5 blocks; counts 1, 7 and 1000003 (fewer under
// ThreadSanitizer).
#include <gtest/gtest.h>

#include <barrier>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dp/device_kernels.cuh"
#include "mlp.h"

namespace {

using braid::dp::OptimizerKind;
using braid::dp::device::Verdict;
using braid::dp::kernels::KernelTable;
namespace device = braid::dp::device;

// A thread of a block, as device_kernels.cuh's B.
class CpuBlock {
 public:
  CpuBlock(unsigned thread, unsigned threads, unsigned block, unsigned blocks,
           std::barrier<>* barrier)
      : thread_(thread), threads_(threads), block_(block), blocks_(blocks), barrier_(barrier) {}
  unsigned thread() const { return thread_; }
  unsigned threads() const { return threads_; }
  unsigned block() const { return block_; }
  unsigned blocks() const { return blocks_; }
  void sync() const { barrier_->arrive_and_wait(); }

 private:
  unsigned thread_, threads_, block_, blocks_;
  std::barrier<>* barrier_;
};

struct Shape {
  unsigned threads;  // per block
  unsigned blocks;
};

// Runs body(block, blockShared) on blocks x threads CPU threads, as a launch would.
template <typename Body>
void runGrid(Shape shape, Body&& body) {
  std::vector<std::unique_ptr<std::barrier<>>> barriers;
  std::vector<std::vector<double>> shared(shape.blocks, std::vector<double>(shape.threads));
  for (unsigned b = 0; b < shape.blocks; ++b)
    barriers.push_back(std::make_unique<std::barrier<>>(shape.threads));
  std::vector<std::thread> threads;
  for (unsigned b = 0; b < shape.blocks; ++b)
    for (unsigned t = 0; t < shape.threads; ++t)
      threads.emplace_back([&, b, t] {
        CpuBlock block(t, shape.threads, b, shape.blocks, barriers[b].get());
        body(block, shared[b].data());
      });
  for (std::thread& thread : threads) thread.join();
}

#if defined(BRAID_DP_TSAN)
constexpr size_t kLargeCount = 10007;  // ThreadSanitizer runs 5-20x slower
#else
constexpr size_t kLargeCount = 1000003;
#endif

// Values from 2^-30 to 2^30 of both signs (in every format some round, some are subnormal or
// overflow), and the special values at the front where `specials`.
std::vector<float> values(size_t count, uint64_t seed, bool specials) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i)
    v[i] = std::ldexp(mlp::uniform(seed, i), static_cast<int>(mlp::splitmix64(seed + i) % 60) - 30);
  if (specials) {
    const float list[] = {0.0f,         -0.0f, 65504.0f, 65520.0f,
                          -1e9f,        6e-8f, 1e-40f,   std::numeric_limits<float>::infinity(),
                          std::nanf("")};
    for (size_t i = 0; i < std::size(list) && i < count; ++i) v[count - 1 - i] = list[i];
  }
  return v;
}

// Finite in every format, so the optimizer has numbers to compare.
std::vector<float> finiteValues(size_t count, uint64_t seed) {
  std::vector<float> v = values(count, seed, false);
  for (float& x : v) x = std::fmod(x, 60000.0f);
  return v;
}

size_t sizeOf(braidDataType_t type) {
  return type == braidFloat32 ? 4 : 2;
}

using Bytes = std::vector<unsigned char>;
constexpr unsigned char kPoison = 0xa5;

Bytes encode(const KernelTable& cpu, const std::vector<float>& v, braidDataType_t type) {
  Bytes out(v.size() * sizeOf(type));
  cpu.fromFloat(v.data(), out.data(), type, v.size());
  return out;
}

// The first differing element, for a readable failure.
std::string firstDifference(const Bytes& expected, const Bytes& actual, size_t elementSize) {
  if (expected.size() != actual.size()) return "sizes differ";
  for (size_t i = 0; i < expected.size(); ++i)
    if (expected[i] != actual[i]) return "element " + std::to_string(i / elementSize) + " differs";
  return "";
}

struct Case {
  braidDataType_t type;
  Shape shape;
  size_t count;
};

std::string caseName(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  const char* type = c.type == braidFloat32 ? "fp32" : c.type == braidFloat16 ? "fp16" : "bf16";
  return std::string(type) + "_" + std::to_string(c.shape.threads) + "threads_" +
         std::to_string(c.shape.blocks) + "blocks_" + std::to_string(c.count);
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (braidDataType_t type : {braidFloat32, braidFloat16, braidBfloat16})
    for (Shape shape : {Shape{1, 1}, Shape{3, 2}, Shape{4, 3}, Shape{32, 1}, Shape{32, 5}})
      for (size_t count : {size_t{1}, size_t{7}, kLargeCount}) all.push_back({type, shape, count});
  return all;
}

class DeviceForm : public testing::TestWithParam<Case> {
 protected:
  const KernelTable& cpu = braid::dp::kernels::generic::table();
  const Case c = GetParam();
  const size_t elem = sizeOf(c.type);

  template <typename Fn>
  void withElement(Fn&& fn) {
    device::withElement(c.type, fn);
  }
};

TEST_P(DeviceForm, ConversionsMatchTheCpu) {
  const std::vector<float> x = values(c.count, 1, true);
  const Bytes encoded = encode(cpu, x, c.type);
  withElement([&]<class E>(E) {
    using S = typename E::Storage;
    Bytes narrowed(encoded.size(), kPoison);
    runGrid(c.shape, [&](const CpuBlock& b, double*) {
      device::fromFloatThread<E>(b, x.data(), reinterpret_cast<S*>(narrowed.data()), c.count);
    });
    EXPECT_EQ(encoded, narrowed) << firstDifference(encoded, narrowed, elem);

    Bytes expected(c.count * 4), widened(c.count * 4, kPoison);
    cpu.toFloat(encoded.data(), c.type, reinterpret_cast<float*>(expected.data()), c.count);
    runGrid(c.shape, [&](const CpuBlock& b, double*) {
      device::toFloatThread<E>(b, reinterpret_cast<const S*>(encoded.data()),
                               reinterpret_cast<float*>(widened.data()), c.count);
    });
    EXPECT_EQ(expected, widened) << firstDifference(expected, widened, 4);

    const std::vector<float> more = values(c.count, 2, false);
    Bytes sum = encoded, deviceSum = encoded;
    cpu.accumulate(more.data(), sum.data(), c.type, c.count);
    runGrid(c.shape, [&](const CpuBlock& b, double*) {
      device::accumulateThread<E>(b, more.data(), reinterpret_cast<S*>(deviceSum.data()), c.count);
    });
    EXPECT_EQ(sum, deviceSum) << firstDifference(sum, deviceSum, elem);
  });
}

TEST_P(DeviceForm, ScaleAndAddMatchTheCpu) {
  const Bytes a = encode(cpu, values(c.count, 3, true), c.type);
  const Bytes b = encode(cpu, values(c.count, 4, false), c.type);
  withElement([&]<class E>(E) {
    using S = typename E::Storage;
    for (float factor : {1.0f / 3.0f, 1.0f / 65536.0f, 3e4f}) {
      Bytes expected = a, actual = a;
      cpu.scale(expected.data(), c.type, c.count, factor);
      runGrid(c.shape, [&](const CpuBlock& block, double*) {
        device::scaleThread<E>(block, reinterpret_cast<S*>(actual.data()), c.count, factor);
      });
      EXPECT_EQ(expected, actual) << "factor " << factor << ": "
                                  << firstDifference(expected, actual, elem);
    }
    Bytes expected = a, actual = a;
    cpu.add(expected.data(), b.data(), c.type, c.count);
    runGrid(c.shape, [&](const CpuBlock& block, double*) {
      device::addThread<E>(block, reinterpret_cast<S*>(actual.data()),
                           reinterpret_cast<const S*>(b.data()), c.count);
    });
    EXPECT_EQ(expected, actual) << firstDifference(expected, actual, elem);
  });
}

// device_kernels.cuh: any two orders of n non-negative additions agree within
// 2 (n - 1) 2^-53 of the sum, relatively.
double sumTolerance(size_t count) {
  return 2.0 * static_cast<double>(count > 0 ? count - 1 : 0) * std::ldexp(1.0, -53);
}

Verdict inspectOnGrid(const Case& c, const Bytes& data) {
  Verdict verdict{0.0f, 0.0};
  device::withElement(c.type, [&]<class E>(E) {
    runGrid(c.shape, [&](CpuBlock& b, double* blockSums) {
      device::inspectThread<E>(b, reinterpret_cast<const typename E::Storage*>(data.data()),
                               c.count, blockSums, &verdict);
    });
  });
  return verdict;
}

TEST_P(DeviceForm, InspectionMatchesTheCpu) {
  const Bytes finite = encode(cpu, finiteValues(c.count, 5), c.type);
  const braid::dp::kernels::Inspection expected = cpu.inspect(finite.data(), c.type, c.count);
  ASSERT_FALSE(expected.nonFinite);
  const Verdict clean = inspectOnGrid(c, finite);
  EXPECT_EQ(clean.overflowFlag, 0.0f);
  EXPECT_NEAR(clean.sumSquares, expected.sumSquares, expected.sumSquares * sumTolerance(c.count));

  // One inf or NaN anywhere (first, middle, last element) is found, by every block layout.
  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {inf, -inf, std::nanf("")})
    for (size_t at : {size_t{0}, c.count / 2, c.count - 1}) {
      Bytes poisoned = finite;
      cpu.fromFloat(&bad, poisoned.data() + at * elem, c.type, 1);
      ASSERT_TRUE(cpu.inspect(poisoned.data(), c.type, c.count).nonFinite);
      EXPECT_EQ(inspectOnGrid(c, poisoned).overflowFlag, 1.0f) << bad << " at " << at;
    }
}

struct Optimizer {
  const char* name;
  OptimizerKind kind;
  double momentum;
};

TEST_P(DeviceForm, UpdateMatchesTheCpu) {
  const std::vector<float> grads = finiteValues(c.count, 6);
  std::vector<float> start = finiteValues(c.count, 7);
  for (float& x : start) x = std::ldexp(x, -10);
  for (const Optimizer& o : {Optimizer{"sgd", OptimizerKind::kSgd, 0.0},
                             Optimizer{"sgd+momentum", OptimizerKind::kSgd, 0.9},
                             Optimizer{"adam", OptimizerKind::kAdam, 0.0},
                             Optimizer{"adamw", OptimizerKind::kAdamW, 0.0}})
    for (braidDataType_t gradientType : {c.type, braidFloat32}) {
      SCOPED_TRACE(std::string(o.name) + (gradientType == braidFloat32 ? ", fp32 gradients" : ""));
      braid::dp::OptimizerOptions options;
      options.kind = o.kind;
      options.momentum = o.momentum;
      options.learningRate = 3e-3;
      options.weightDecay = 0.01;
      const Bytes grad = encode(cpu, grads, gradientType);
      const bool hasMoment1 = o.kind != OptimizerKind::kSgd || o.momentum != 0;
      const bool hasMoment2 = o.kind != OptimizerKind::kSgd;
      const bool separateWorking = c.type != braidFloat32;  // fp32: the master is the working copy
      struct State {
        std::vector<float> master, moment1, moment2;
        Bytes working;
      };
      State cpuState{start, std::vector<float>(c.count, 0.0f), std::vector<float>(c.count, 0.0f),
                     Bytes(separateWorking ? c.count * elem : 0, kPoison)};
      State gridState = cpuState;
      auto pointers = [&](State& s) {
        return std::tuple{s.master.data(), hasMoment1 ? s.moment1.data() : nullptr,
                          hasMoment2 ? s.moment2.data() : nullptr,
                          separateWorking ? static_cast<void*>(s.working.data())
                                          : static_cast<void*>(s.master.data())};
      };
      // Three steps, so the moments and bias corrections take part.
      for (int step = 1; step <= 3; ++step) {
        const braid::dp::kernels::UpdateArgs args{options, step, 0.7f / 1024.0f, gradientType,
                                                  c.type};
        auto [master, m1, m2, working] = pointers(cpuState);
        cpu.update(args, grad.data(), master, m1, m2, working, c.count);
        auto [gMaster, gM1, gM2, gWorking] = pointers(gridState);
        device::prepareUpdate(
            args, grad.data(), gMaster, gM1, gM2, gWorking, c.count, [&](const auto& launch) {
              runGrid(c.shape,
                      [&](const CpuBlock& b, double*) { device::updateThread(b, launch); });
              return 0;
            });
      }
      auto bytes = [](const std::vector<float>& v) {
        Bytes out(v.size() * 4);
        std::memcpy(out.data(), v.data(), out.size());
        return out;
      };
      EXPECT_EQ(bytes(cpuState.master), bytes(gridState.master))
          << "master: " << firstDifference(bytes(cpuState.master), bytes(gridState.master), 4);
      EXPECT_EQ(bytes(cpuState.moment1), bytes(gridState.moment1)) << "moment1";
      EXPECT_EQ(bytes(cpuState.moment2), bytes(gridState.moment2)) << "moment2";
      EXPECT_EQ(cpuState.working, gridState.working)
          << "working: " << firstDifference(cpuState.working, gridState.working, elem);
    }
}

INSTANTIATE_TEST_SUITE_P(Grid, DeviceForm, testing::ValuesIn(cases()), caseName);

}  // namespace
