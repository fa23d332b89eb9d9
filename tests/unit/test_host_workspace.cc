// What a communicator's host executor keeps between calls (core/host_workspace.h): the numbers
// collectives are tagged with, the scratch every call is lent, and a PreMulSum's scaled input and a
// fused pass's staging buffer, kept while small and let go once large.
#include <gtest/gtest.h>

#include <vector>

#include "base/error.h"
#include "core/host_workspace.h"

namespace {

using braid::CollContext;
using braid::HostWorkspace;

TEST(HostWorkspace, CollectivesAreNumberedAndSendRecvIsNot) {
  HostWorkspace workspace("auto");
  workspace.setLimits(4096, 0);
  EXPECT_EQ(workspace.scratchBytes(), 4096u);
  CollContext first, sendRecv, second;
  workspace.lendTo(first, true);
  workspace.lendTo(sendRecv, false);
  workspace.lendTo(second, true);
  EXPECT_EQ(first.sequence, 1u);
  EXPECT_EQ(sendRecv.sequence, 0u);
  EXPECT_EQ(second.sequence, 2u);
  EXPECT_EQ(workspace.collectives(), 2u);
  for (const CollContext* ctx : {&first, &sendRecv, &second}) {
    EXPECT_EQ(ctx->directMaxBytes, 4096u);
    EXPECT_NE(ctx->scratch, nullptr);
    EXPECT_EQ(ctx->scratch, first.scratch);  // one scratch, lent to every call
    EXPECT_NE(ctx->slotStores, nullptr);
  }
}

TEST(HostWorkspace, ABadSlotStoresPolicyIsRefused) {
  EXPECT_THROW(HostWorkspace("sometimes"), braid::Error);
}

TEST(HostWorkspace, AScaledInputIsKeptWhileSmallAndReleasedOnceLarge) {
  HostWorkspace workspace("cached");
  workspace.setLimits(64, 256);
  EXPECT_EQ(workspace.scratchBytes(), 256u);  // a Bruck reduce-scatter's, larger
  braid::ReductionOps ops(0);
  const float scalar = -2;
  const braidRedOp_t op = ops.create(&scalar, braidFloat32, true);
  const std::vector<float> small = {1, 2.5f, -3};
  const auto* out = static_cast<const float*>(workspace.scaled(ops, op, small.data(), 3));
  EXPECT_EQ(out[0], -2.0f);
  EXPECT_EQ(out[1], -5.0f);
  EXPECT_EQ(out[2], 6.0f);
  workspace.releaseLargeBuffers();
  EXPECT_GE(workspace.scaledInputCapacity(), 3 * sizeof(float));  // small: kept for the next
  const std::vector<float> large(100, 0.5f);
  out = static_cast<const float*>(workspace.scaled(ops, op, large.data(), large.size()));
  EXPECT_EQ(out[99], -1.0f);
  workspace.releaseLargeBuffers();
  EXPECT_EQ(workspace.scaledInputCapacity(), 0u);
}

TEST(HostWorkspace, AStagingBufferIsKeptWhileSmallAndReleasedOnceLarge) {
  HostWorkspace workspace("cached");
  workspace.setLimits(64, 256);
  uint8_t* small = workspace.staging(48);
  EXPECT_EQ(workspace.staging(16), small);  // large enough already: the same buffer
  workspace.releaseLargeBuffers();
  EXPECT_GE(workspace.stagingCapacity(), 48u);
  workspace.staging(HostWorkspace::kKeptStagingBytes);
  workspace.releaseLargeBuffers();
  EXPECT_EQ(workspace.stagingCapacity(), HostWorkspace::kKeptStagingBytes);  // still kept
  workspace.staging(HostWorkspace::kKeptStagingBytes + 1);
  workspace.releaseLargeBuffers();
  EXPECT_EQ(workspace.stagingCapacity(), 0u);
}

}  // namespace
