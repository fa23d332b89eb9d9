// A communicator's PreMulSum operators (core/reduction_ops.h): their ids, their errors, and the
// scaled input a call sums, against products computed here.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "base/error.h"
#include "core/reduction_ops.h"

namespace {

using braid::ReductionOps;

TEST(ReductionOps, IdsStartAtNumOpsAndAreNeverReused) {
  ReductionOps ops(0);
  const float s = 2;
  const braidRedOp_t a = ops.create(&s, braidFloat32, true);
  const braidRedOp_t b = ops.create(&s, braidFloat32, true);
  EXPECT_EQ(static_cast<int>(a), braidNumOps);
  EXPECT_EQ(static_cast<int>(b), braidNumOps + 1);
  ops.destroy(a);
  EXPECT_EQ(static_cast<int>(ops.create(&s, braidFloat32, true)), braidNumOps + 2);
}

TEST(ReductionOps, HasChecksTheDatatypeAndForgetsDestroyedOnes) {
  ReductionOps ops(0);
  const double s = 3;
  const braidRedOp_t op = ops.create(&s, braidFloat64, true);
  EXPECT_TRUE(ops.has(op, braidFloat64));
  EXPECT_FALSE(ops.has(op, braidFloat32));
  EXPECT_FALSE(ops.has(braidSum, braidFloat64));
  ops.destroy(op);
  EXPECT_FALSE(ops.has(op, braidFloat64));
}

TEST(ReductionOps, DestroyingWhatIsNoOperatorIsNamed) {
  ReductionOps ops(3);
  for (braidRedOp_t op : {braidSum, static_cast<braidRedOp_t>(999)}) {
    try {
      ops.destroy(op);
      ADD_FAILURE() << "destroyed op " << static_cast<int>(op);
    } catch (const braid::Error& e) {
      EXPECT_EQ(e.code(), braidInvalidArgument);
      const std::string message = e.what();
      EXPECT_NE(message.find("braidRedOpDestroy on rank 3"), std::string::npos) << message;
      EXPECT_NE(message.find("op " + std::to_string(static_cast<int>(op))), std::string::npos)
          << message;
    }
  }
  EXPECT_THROW(ops.get(static_cast<braidRedOp_t>(999)), braid::Error);
}

// braidScalarHostImmediate reads the scalar once, at creation; braidScalarDevice at every call.
TEST(ReductionOps, ImmediateScalarsAreReadAtCreationOthersAtEveryCall) {
  ReductionOps ops(0);
  float immediate = 2, pointed = 2;
  const braidRedOp_t once = ops.create(&immediate, braidFloat32, true);
  const braidRedOp_t always = ops.create(&pointed, braidFloat32, false);
  immediate = pointed = 5;
  const float input[3] = {1, -2, 0.5f};
  std::vector<uint8_t> scaled;
  const auto* a = static_cast<const float*>(ops.scaled(once, input, 3, scaled));
  EXPECT_EQ(a[0], 2.0f);
  EXPECT_EQ(a[1], -4.0f);
  EXPECT_EQ(a[2], 1.0f);
  const auto* b = static_cast<const float*>(ops.scaled(always, input, 3, scaled));
  EXPECT_EQ(b[0], 5.0f);
  EXPECT_EQ(b[1], -10.0f);
  EXPECT_EQ(b[2], 2.5f);
}

// Past the scaler's blocks of 1024 scalars, into a buffer holding garbage of another size.
TEST(ReductionOps, ScalesEveryElementOfALongInput) {
  ReductionOps ops(0);
  const int32_t s = -3;
  const braidRedOp_t op = ops.create(&s, braidInt32, true);
  std::vector<int32_t> input(2500);
  for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<int32_t>(i * 7) - 4000;
  std::vector<uint8_t> scaled(77, 0xA5);
  const auto* out = static_cast<const int32_t*>(ops.scaled(op, input.data(), input.size(), scaled));
  ASSERT_EQ(scaled.size(), input.size() * sizeof(int32_t));
  for (size_t i = 0; i < input.size(); ++i) ASSERT_EQ(out[i], input[i] * -3) << "element " << i;
}

// braidAvg of floats as NCCL's: a PreMulSum by 1/n rounded to the type (bits written here), one
// id per type that users can neither name nor destroy; integers keep braidAvg (they divide).
TEST(ReductionOps, AverageOfFloatsIsAPreMulSumByTheInverseRoundedToTheType) {
  ReductionOps ops(1);
  EXPECT_EQ(ops.average(braidInt32, 3), braidAvg);
  EXPECT_EQ(ops.average(braidUint8, 3), braidAvg);
  const struct {
    braidDataType_t type;
    uint64_t bits;
  } inverses[] = {{braidFloat16, 0x3555},      // 0.33325195
                  {braidBfloat16, 0x3eab},     // 0.33398438
                  {braidFloat32, 0x3eaaaaab},  // 0.33333334
                  {braidFloat64, 0x3fd5555555555555},
                  {braidFloat8e4m3, 0x2b},   // 0.34375
                  {braidFloat8e5m2, 0x35}};  // 0.3125
  for (const auto& [type, bits] : inverses) {
    const braidRedOp_t op = ops.average(type, 3);
    EXPECT_GE(static_cast<int>(op), braidNumOps) << type;
    EXPECT_EQ(ops.average(type, 3), op) << type;
    const ReductionOps::PreMulSum pre = ops.get(op);
    EXPECT_TRUE(pre.isImmediate);
    EXPECT_EQ(pre.type, type);
    uint64_t got = 0;
    std::memcpy(&got, pre.immediate, sizeof pre.immediate);
    EXPECT_EQ(got, bits) << type;
    EXPECT_FALSE(ops.has(op, type)) << "a user's call may not name it";
    EXPECT_THROW(ops.destroy(op), braid::Error);
  }
  const float s = 2;
  EXPECT_EQ(static_cast<int>(ops.create(&s, braidFloat32, true)), braidNumOps)
      << "users' ids are unchanged";
}

}  // namespace
