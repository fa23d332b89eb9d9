// Which of a rank's collectives one ring or tree launch carries (coll/device_launch.h): runs of
// calls one ring or tree kernel runs, cut where the kernel changes, at a call of another engine,
// or at the most calls a launch holds. The expected cuts are written out by hand.
#include <gtest/gtest.h>

#include <vector>

#include "coll/device_launch.h"

namespace braid {
namespace {

using Call = KernelCall;

Call reducing(braidRedOp_t op, braidDataType_t type = braidFloat32,
              DeviceAlgorithm algorithm = DeviceAlgorithm::Simple) {
  return KernelCall{algorithm, type, op, true, false};
}
Call moving(braidRedOp_t op = braidSum, braidDataType_t type = braidFloat32,
            DeviceAlgorithm algorithm = DeviceAlgorithm::Simple) {
  return KernelCall{algorithm, type, op, false, false};
}
Call premulSum() {
  return KernelCall{DeviceAlgorithm::Simple, braidFloat32, braidSum, true, true};
}
Call tree(braidRedOp_t op = braidSum, DeviceAlgorithm algorithm = DeviceAlgorithm::Tree) {
  return KernelCall{algorithm, braidFloat32, op, true, false};
}
Call direct() {
  return KernelCall{DeviceAlgorithm::Direct, braidFloat32, braidSum, true, false};
}

std::vector<size_t> cut(const std::vector<Call>& calls, size_t maxCalls = 32) {
  return launchSizes(calls, maxCalls);
}

TEST(LaunchLists, CallsOfOneKernelShareALaunchWhateverTheirCollective) {
  // All-reduce, all-gather, reduce-scatter, broadcast, reduce: one datatype, one operator.
  EXPECT_EQ(cut({reducing(braidSum), moving(), reducing(braidSum), moving(), reducing(braidSum)}),
            (std::vector<size_t>{5}));
  // A call that only moves runs under any operator, before or after the run's reducing calls.
  EXPECT_EQ(cut({moving(braidSum), reducing(braidMax), moving(braidSum), reducing(braidMax)}),
            (std::vector<size_t>{4}));
}

TEST(LaunchLists, AnotherKernelStartsANewLaunch) {
  EXPECT_EQ(cut({reducing(braidSum), reducing(braidMax)}), (std::vector<size_t>{1, 1}));
  // The operator is the run's, not the last call's: a moving call does not reset it.
  EXPECT_EQ(cut({reducing(braidSum), moving(braidMax), reducing(braidMax)}),
            (std::vector<size_t>{2, 1}));
  EXPECT_EQ(cut({reducing(braidSum), reducing(braidSum, braidFloat16)}),
            (std::vector<size_t>{1, 1}));
  EXPECT_EQ(cut({moving(), moving(braidSum, braidInt8)}), (std::vector<size_t>{1, 1}));
  EXPECT_EQ(cut({reducing(braidSum), reducing(braidSum, braidFloat32, DeviceAlgorithm::LowLatency),
                 reducing(braidSum, braidFloat32, DeviceAlgorithm::Segmented)}),
            (std::vector<size_t>{1, 1, 1}));
}

TEST(LaunchLists, PreMulSumRunsWithPreMulSumOnly) {
  EXPECT_EQ(cut({premulSum(), premulSum(), reducing(braidSum), premulSum()}),
            (std::vector<size_t>{2, 1, 1}));
  // Its kernel scales every input it reads: a call that only moves stays out.
  EXPECT_EQ(cut({premulSum(), moving()}), (std::vector<size_t>{1, 1}));
}

TEST(LaunchLists, AvgRunsAlone) {
  // Its kernels run one call (their registers leave no room for a list's loop).
  EXPECT_EQ(cut({reducing(braidAvg), reducing(braidAvg), moving(), reducing(braidAvg)}),
            (std::vector<size_t>{1, 1, 1, 1}));
  EXPECT_EQ(cut({moving(), reducing(braidAvg), reducing(braidSum)}),
            (std::vector<size_t>{1, 1, 1}));
}

TEST(LaunchLists, TreeAllReducesShareALaunchOfTheirOwn) {
  EXPECT_EQ(cut({tree(), tree(), tree()}), (std::vector<size_t>{3}));
  // The ring's kernel is another, as are the other tree protocol's and another operator's.
  EXPECT_EQ(cut({reducing(braidSum), tree(), tree(), reducing(braidSum), reducing(braidSum)}),
            (std::vector<size_t>{1, 2, 2}));
  EXPECT_EQ(cut({tree(), tree(braidSum, DeviceAlgorithm::TreeLowLatency), tree(braidMax)}),
            (std::vector<size_t>{1, 1, 1}));
  EXPECT_EQ(cut({tree(braidAvg), tree(braidAvg)}), (std::vector<size_t>{1, 1}));
  EXPECT_EQ(cut(std::vector<Call>(5, tree()), 2), (std::vector<size_t>{2, 2, 1}));
}

TEST(LaunchLists, TheDirectEngineRunsAloneAndCutsTheRun) {
  EXPECT_EQ(cut({reducing(braidSum), direct(), reducing(braidSum), reducing(braidSum)}),
            (std::vector<size_t>{1, 1, 2}));
  EXPECT_EQ(cut({direct(), direct()}), (std::vector<size_t>{1, 1}));
  EXPECT_EQ(cut({tree(), direct(), tree()}), (std::vector<size_t>{1, 1, 1}));
  EXPECT_TRUE(cut({}).empty());
}

// What the cut reads of a call (DeviceSide::launchesOf: the user's arguments) and the launch's
// check (a call whose PreMulSum operator was rewritten to Sum beside its scalar) agree.
TEST(LaunchLists, ACallIsSeenAlikeBeforeAndAfterItsScalarIsTakenOut) {
  const auto premul = static_cast<braidRedOp_t>(braidNumOps + 3);  // a PreMulSum operator
  CollArgs a{Collective::AllReduce, nullptr, nullptr, 10, braidFloat16, premul};
  const KernelCall before = kernelCallOf(a, false, DeviceAlgorithm::LowLatency);
  a.op = braidSum;
  const KernelCall after = kernelCallOf(a, true, DeviceAlgorithm::LowLatency);
  for (const KernelCall& c : {before, after}) {
    EXPECT_TRUE(c.prescaled && c.reduces);
    EXPECT_EQ(c.op, braidSum);
    EXPECT_EQ(c.type, braidFloat16);
    EXPECT_EQ(c.algorithm, DeviceAlgorithm::LowLatency);
  }
  // Two PreMulSum operators (their scalars differ) share a list: each work carries its own.
  a.op = static_cast<braidRedOp_t>(braidNumOps + 4);
  const KernelCall other = kernelCallOf(a, false, DeviceAlgorithm::LowLatency);
  EXPECT_TRUE(runsInKernelOf(std::vector<KernelCall>{before}, other));
  // A call that only moves reduces nothing, whatever its operator field says.
  const CollArgs gather{Collective::AllGather, nullptr, nullptr, 10, braidFloat16, braidMax};
  EXPECT_FALSE(kernelCallOf(gather, false, DeviceAlgorithm::Simple).reduces);
  const CollArgs reduce{Collective::Reduce, nullptr, nullptr, 10, braidInt32, braidMax};
  const KernelCall r = kernelCallOf(reduce, false, DeviceAlgorithm::Simple);
  EXPECT_TRUE(r.reduces && !r.prescaled);
  EXPECT_EQ(r.op, braidMax);
}

TEST(LaunchLists, ALaunchHoldsAtMostMaxCalls) {
  EXPECT_EQ(cut(std::vector<Call>(7, reducing(braidSum)), 3), (std::vector<size_t>{3, 3, 1}));
  EXPECT_EQ(cut(std::vector<Call>(kMaxLaunchWorks + 1, moving()), kMaxLaunchWorks),
            (std::vector<size_t>{static_cast<size_t>(kMaxLaunchWorks), 1}));
}

}  // namespace
}  // namespace braid
