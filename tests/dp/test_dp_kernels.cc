// The dp kernels built for AVX2 + F16C must give bit-for-bit what the generic build gives (the
// generic fp16 conversion is the compiler's software one, an independent reference for F16C's),
// so results never depend on the CPU a rank runs on.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dp/kernels.h"
#include "mlp.h"

namespace {

using braid::dp::kernels::KernelTable;

bool avx2Supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

// Values that exercise rounding, subnormals, overflow and the special values; an awkward count
// so that the vector loops' tails run too.
std::vector<float> inputs(uint64_t seed) {
  std::vector<float> v;
  for (int i = 0; i < 4099; ++i) {
    const float u = mlp::uniform(seed, i);
    v.push_back(std::ldexp(u, static_cast<int>(mlp::splitmix64(seed + i) % 60) - 30));
  }
  for (float special : {0.0f, -0.0f, 65504.0f, 65520.0f, -1e9f, 6e-8f, 1e-40f,
                        std::numeric_limits<float>::infinity(), std::nanf("")})
    v.push_back(special);
  return v;
}

std::vector<uint8_t> bytesOf(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

class Kernels : public testing::TestWithParam<braidDataType_t> {
 protected:
  void SetUp() override {
    if (!avx2Supported())
      GTEST_SKIP() << "this CPU has no AVX2 + F16C; only the generic build runs";
  }
  const KernelTable& generic = braid::dp::kernels::generic::table();
  const KernelTable& avx2 = braid::dp::kernels::avx2::table();
  braidDataType_t type = GetParam();
  size_t elem = type == braidFloat32 ? 4 : 2;
};

TEST_P(Kernels, ConversionsAgree) {
  const std::vector<float> x = inputs(1);
  std::vector<uint8_t> a(x.size() * elem), b(x.size() * elem);
  generic.fromFloat(x.data(), a.data(), type, x.size());
  avx2.fromFloat(x.data(), b.data(), type, x.size());
  ASSERT_EQ(a, b);
  std::vector<float> backA(x.size()), backB(x.size());
  generic.toFloat(a.data(), type, backA.data(), x.size());
  avx2.toFloat(a.data(), type, backB.data(), x.size());
  EXPECT_EQ(bytesOf(backA.data(), x.size() * 4), bytesOf(backB.data(), x.size() * 4));
  generic.accumulate(x.data(), a.data(), type, x.size());
  avx2.accumulate(x.data(), b.data(), type, x.size());
  EXPECT_EQ(a, b);
}

TEST_P(Kernels, StepArithmeticAgrees) {
  // Values finite in every type, so the optimizer has numbers (not NaNs) to compare.
  std::vector<float> values;
  for (float v : inputs(2))
    if (std::abs(v) < 60000) values.push_back(v);
  const size_t n = values.size();
  std::vector<uint8_t> grad(n * elem), other(n * elem);
  generic.fromFloat(values.data(), grad.data(), type, n);
  std::vector<float> more = inputs(3);
  for (float& v : more) v = std::isfinite(v) ? std::fmod(v, 60000.0f) : 1.0f;
  generic.fromFloat(more.data(), other.data(), type, n);

  std::vector<uint8_t> a = grad, b = grad;
  generic.scale(a.data(), type, n, 1.0f / 3);
  avx2.scale(b.data(), type, n, 1.0f / 3);
  EXPECT_EQ(a, b);
  generic.add(a.data(), other.data(), type, n);
  avx2.add(b.data(), other.data(), type, n);
  EXPECT_EQ(a, b);
  const braid::dp::kernels::Inspection ia = generic.inspect(grad.data(), type, n);
  const braid::dp::kernels::Inspection ib = avx2.inspect(grad.data(), type, n);
  EXPECT_EQ(std::bit_cast<uint64_t>(ia.sumSquares), std::bit_cast<uint64_t>(ib.sumSquares));
  EXPECT_FALSE(ia.nonFinite);

  for (braid::dp::OptimizerKind kind :
       {braid::dp::OptimizerKind::kSgd, braid::dp::OptimizerKind::kAdam,
        braid::dp::OptimizerKind::kAdamW}) {
    braid::dp::OptimizerOptions o;
    o.kind = kind;
    o.weightDecay = 0.01;
    // Gradients of the parameters' type, and fp32 ones (Options::fp32Gradients).
    for (braidDataType_t gradientType : {type, braidFloat32}) {
      const braid::dp::kernels::UpdateArgs args{o, 3, 0.5f, gradientType, type};
      const void* g = gradientType == type ? static_cast<const void*>(grad.data()) : values.data();
      std::vector<float> master(n, 0.25f), m1(n, 0.01f), m2(n, 0.001f);
      std::vector<float> master2 = master, m1b = m1, m2b = m2;
      std::vector<uint8_t> workA(n * elem), workB(n * elem);
      generic.update(args, g, master.data(), m1.data(), m2.data(), workA.data(), n);
      avx2.update(args, g, master2.data(), m1b.data(), m2b.data(), workB.data(), n);
      EXPECT_EQ(bytesOf(master.data(), 4 * n), bytesOf(master2.data(), 4 * n));
      EXPECT_EQ(bytesOf(m1.data(), 4 * n), bytesOf(m1b.data(), 4 * n));
      EXPECT_EQ(bytesOf(m2.data(), 4 * n), bytesOf(m2b.data(), 4 * n));
      EXPECT_EQ(workA, workB);
    }
  }
}

TEST_P(Kernels, InspectFindsEveryNonFiniteValue) {
  for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")})
    for (size_t where : {size_t{0}, size_t{511}, size_t{512}, size_t{1000}}) {
      std::vector<float> x(1001, 1.0f);
      x[where] = bad;
      std::vector<uint8_t> data(x.size() * elem);
      generic.fromFloat(x.data(), data.data(), type, x.size());
      EXPECT_TRUE(generic.inspect(data.data(), type, x.size()).nonFinite) << where;
      EXPECT_TRUE(avx2.inspect(data.data(), type, x.size()).nonFinite) << where;
    }
}

INSTANTIATE_TEST_SUITE_P(Dp, Kernels, testing::Values(braidFloat32, braidFloat16, braidBfloat16),
                         [](const testing::TestParamInfo<braidDataType_t>& info) {
                           return info.param == braidFloat32   ? std::string("fp32")
                                  : info.param == braidFloat16 ? std::string("fp16")
                                                               : std::string("bf16");
                         });

}  // namespace
