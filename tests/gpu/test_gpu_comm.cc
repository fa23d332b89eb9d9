// CUDA communicators through the public API on a GPU: R ranks as threads of this process sharing
// the current device, each with its own stream (NCCL refuses this; braid supports it, and it is
// how everything is tested on a one-GPU machine). The device form's cases (device/device_cases.h)
// plus large messages on device buffers, checked against the multirank grid's independent reference
// with outputs poisoned; stream ordering; graph capture and replay; host memory refused; a missing
// peer turned into braidTimeout; one thread driving every rank in one launch. Two processes
// through CUDA IPC: test_gpu_ipc.cc. Where no CUDA device is present every test is skipped,
// saying so.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpu/comm_cases.h"

namespace braid_test {
namespace {

// Runs body(rank, comm, stream, ready, failures) on n threads, each with a CUDA communicator on
// device 0 and a stream of its own; failures are collected, each prefixed with its rank. A body
// that allocates (cudaMalloc, cudaMallocHost) calls ready() after, before its first call: an
// allocation may keep kernels issued before and after it apart (CUDA's implicit
// synchronization), so a peer's first kernel would wait for this rank's forever.
using RankBody =
    std::function<void(int rank, braidComm_t comm, cudaStream_t stream,
                       const std::function<void()>& ready, std::vector<std::string>& failures)>;
std::vector<std::string> runRanks(int n, const RankBody& body, int timeoutMs = kTimeoutMs,
                                  const char* algorithms = nullptr) {
  braidUniqueId id;
  if (braidGetUniqueId(&id) != braidSuccess) return {"braidGetUniqueId failed"};
  std::mutex mutex;
  std::vector<std::string> all;
  std::vector<std::thread> threads;
  std::barrier<> allocated(n);
  for (int rank = 0; rank < n; ++rank)
    threads.emplace_back([&, rank] {
      std::vector<std::string> failures;
      bool arrived = false;
      const std::function<void()> ready = [&] {
        if (!std::exchange(arrived, true)) allocated.arrive_and_wait();
      };
      CudaRank me;
      if (const std::string failed = openCudaRank(n, id, rank, me, timeoutMs, algorithms);
          !failed.empty())
        failures.push_back(failed);
      else
        body(rank, me.comm, me.stream, ready, failures);
      if (!arrived) allocated.arrive_and_drop();  // a rank that failed early holds nobody up
      closeCudaRank(me);
      std::lock_guard<std::mutex> lock(mutex);
      for (const std::string& f : failures)
        all.push_back("rank " + std::to_string(rank) + ": " + f);
    });
  for (auto& t : threads) t.join();
  return all;
}

// fn(rank) for every rank at once, a thread each: the host's inputs and reference checks of the
// 4M-element cases take seconds per rank at 8 ranks.
void onEveryRank(int n, const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) threads.emplace_back(fn, rank);
  for (std::thread& t : threads) t.join();
}

class CudaComm : public testing::Test {
 protected:
  void SetUp() override {
    const std::string none = noCudaDevice();
    if (!none.empty()) GTEST_SKIP() << none << ": CUDA communicators need a GPU";
  }
};

class CudaCommRanks : public CudaComm, public testing::WithParamInterface<int> {};

TEST_P(CudaCommRanks, EveryCollectiveMatchesTheReference) {
  const int n = GetParam();
  const std::vector<Case> cases = commCases(n);
  StepWatchdog watchdog(kStepLimit);
  std::barrier<> between(n);
  std::atomic<bool> stop{false};
  const auto failures =
      runRanks(n, [&](int rank, braidComm_t comm, cudaStream_t stream, const std::function<void()>&,
                      std::vector<std::string>& failures) {
        int device = -2;
        if (braidCommCuDevice(comm, &device) != braidSuccess || device != 0)
          failures.push_back("braidCommCuDevice gave " + std::to_string(device) + ", expected 0");
        for (const Case& c : cases) {
          if (rank == 0) watchdog.step(describe(c, Shape{n, 0, 0, 0, Algorithm::Simple}));
          runCase(c, rank, n, comm, stream, failures);
          if (failures.size() > 5) stop = true;
          between.arrive_and_wait();  // every rank checked before the next case's buffers
          if (stop) break;            // read after the barrier by every rank: all stop together
        }
      });
  for (const std::string& f : failures) ADD_FAILURE() << f;
}

INSTANTIATE_TEST_SUITE_P(Gpu, CudaCommRanks, testing::Values(1, 2, 4, 8),
                         [](const testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

// Every rank of a communicator on device 0, made by one thread (braidCommInitAll), each with a
// stream of its own; destroyed with this.
struct AllRanksOnOneThread {
  std::vector<braidComm_t> comms;
  std::vector<cudaStream_t> streams;
  explicit AllRanksOnOneThread(int n) : comms(n, nullptr), streams(n, nullptr) {}
  AllRanksOnOneThread(const AllRanksOnOneThread&) = delete;
  AllRanksOnOneThread& operator=(const AllRanksOnOneThread&) = delete;
  // "" or what failed.
  std::string open() {
    std::vector<int> devices(comms.size(), 0);
    if (braidCommInitAll(comms.data(), static_cast<int>(comms.size()), devices.data()) !=
        braidSuccess)
      return std::string("braidCommInitAll: ") + braidGetLastError(nullptr);
    for (cudaStream_t& s : streams)
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
        return "cudaStreamCreateWithFlags failed";
    return "";
  }
  ~AllRanksOnOneThread() {
    for (braidComm_t c : comms)
      if (c != nullptr) braidCommDestroy(c);
    for (cudaStream_t s : streams)
      if (s != nullptr) cudaStreamDestroy(s);
  }
};

// One thread drives every rank of the GPU (braidCommInitAll, then one group per call): the k-th
// collective of every rank goes in one launch, so the ranks' blocks run together. Each rank on a
// stream of its own, and all ranks on one stream (which one launch makes possible). Every rank in
// the launch lets the cost model choose the direct engine (large all-reduce, reduce-scatter,
// all-gather: every rank reads and writes the others' buffers); ctest runs this test again with
// BRAID_ALGO=ring (gpu:CudaComm.OneThreadDrivesEveryRankInOneLaunch.ring) for the ring.
TEST_F(CudaComm, OneThreadDrivesEveryRankInOneLaunch) {
  for (int n : {2, 4, 8})
    for (bool oneStream : {false, true}) {
      SCOPED_TRACE(std::to_string(n) + " ranks" + (oneStream ? ", one stream" : ""));
      AllRanksOnOneThread all(n);
      ASSERT_EQ(all.open(), "");
      const std::vector<braidComm_t>& comms = all.comms;
      const std::vector<cudaStream_t>& streams = all.streams;
      StepWatchdog watchdog(kStepLimit);
      for (const Case& c : commCases(n)) {
        if (c.collective == Collective::Send || c.op == kPreMulSum) continue;
        watchdog.step(describe(c, Shape{n, 0, 0, 0, Algorithm::Simple}) +
                      (oneStream ? ", one stream" : ", a stream per rank"));
        DeviceArena arena;
        std::vector<RankBuffers> host(n);
        std::vector<DeviceRank> dev(n);
        onEveryRank(n, [&](int r) { layoutRank(c, r, n, host[r]); });
        for (int r = 0; r < n; ++r) ASSERT_TRUE(toDevice(host[r], arena, dev[r]));
        braidGroupStart();
        for (int r = 0; r < n; ++r) {
          cudaStream_t s = oneStream ? streams[0] : streams[r];
          switch (c.collective) {
            case Collective::AllReduce:
              braidAllReduce(dev[r].input, dev[r].output, c.count, c.type, c.op, comms[r], s);
              break;
            case Collective::ReduceScatter:
              braidReduceScatter(dev[r].input, dev[r].output, c.count, c.type, c.op, comms[r], s);
              break;
            case Collective::AllGather:
              braidAllGather(dev[r].input, dev[r].output, c.count, c.type, comms[r], s);
              break;
            case Collective::Broadcast:
              braidBroadcast(dev[r].input, dev[r].output, c.count, c.type, c.root, comms[r], s);
              break;
            default:
              braidReduce(dev[r].input, dev[r].output, c.count, c.type, c.op, c.root, comms[r], s);
          }
        }
        const braidResult_t r = braidGroupEnd();
        ASSERT_EQ(r, braidSuccess) << describe(r, nullptr);
        for (cudaStream_t s : streams) CUDA_CHECK(cudaStreamSynchronize(s));
        std::vector<std::string> wrong(n);
        onEveryRank(n, [&](int r) {
          wrong[r] = toHost(dev[r], host[r]) ? checkRank(c, r, n, host[r], AverageAs::Api)
                                             : "cudaMemcpy failed";
        });
        for (int rank = 0; rank < n; ++rank)
          ASSERT_TRUE(wrong[rank].empty())
              << describe(c, Shape{n, 0, 0, 0, Algorithm::Simple}) << ": " << wrong[rank];
      }
    }
}

// The device form's cases the direct engine runs (all-reduce, reduce-scatter, all-gather; not
// PreMulSum, whose scalars do not reach the peers), and the bytes a rank's layout of the largest
// takes.
std::vector<Case> windowCases(int n, size_t& largestBytes) {
  std::vector<Case> cases;
  largestBytes = 0;
  for (const Case& c : commCases(n)) {
    if (!reduces(c.collective) && c.collective != Collective::AllGather) continue;
    if (c.collective == Collective::Reduce || c.op == kPreMulSum) continue;
    cases.push_back(c);
    largestBytes = std::max(largestBytes, (c.count * n + 64) * dtypeSize(c.type) + 128);
  }
  return cases;
}

// Ranks as threads launched apart, each rank's buffers in its part of a window registered by
// every rank (braidCommWindowRegister), at the same offsets: with the direct engine named
// (config algorithms "direct"), every call reaches the other ranks' windows itself, in place and
// not, and the results match the reference. Then a rank whose output lies elsewhere in its
// window: every rank's call fails with braidInvalidUsage, and no output was written.
TEST_F(CudaComm, RanksLaunchedApartReachEachOthersWindows) {
  for (int n : {2, 4, 8}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    size_t half = 0;
    const std::vector<Case> cases = windowCases(n, half);
    StepWatchdog watchdog(kStepLimit);
    std::barrier<> between(n);
    std::atomic<bool> stop{false};
    const auto failures = runRanks(
        n,
        [&](int rank, braidComm_t comm, cudaStream_t stream, const std::function<void()>& ready,
            std::vector<std::string>& failures) {
          unsigned char* window = nullptr;
          const bool allocated = cudaMalloc(&window, 2 * half) == cudaSuccess;
          ready();
          braidWindow_t handle = nullptr;
          const braidResult_t registered =
              allocated ? braidCommWindowRegister(comm, window, 2 * half, &handle, 1)
                        : braidInternalError;
          if (registered != braidSuccess) {
            between.arrive_and_drop();  // holds nobody up
            return failures.push_back("window: " + describe(registered, comm));
          }
          for (const Case& c : cases) {
            if (rank == 0) watchdog.step(describe(c, Shape{n, 0, 0, 0, Algorithm::Direct}));
            RankBuffers host;
            DeviceRank dev;
            layoutRank(c, rank, n, host);
            const std::string what = describe(c, Shape{n, 0, 0, 0, Algorithm::Direct});
            if (!toWindow(host, window, half, dev)) {
              failures.push_back(what + ": cudaMemcpy failed");
            } else if (std::string failed = callCase(c, rank, n, comm, stream, dev);
                       !failed.empty()) {
              failures.push_back(failed);
            } else if (!fromWindow(dev, host)) {
              failures.push_back(what + ": cudaMemcpy failed");
            } else if (std::string wrong = checkRank(c, rank, n, host, AverageAs::Api);
                       !wrong.empty()) {
              failures.push_back(what + ": " + wrong);
            }
            if (!failures.empty()) stop = true;
            between.arrive_and_wait();  // every rank checked before the next case's buffers
            if (stop) break;            // read after the barrier by every rank: all stop together
          }
          if (!stop && n == 2) {
            // Rank 1's output 256 bytes further into its window than rank 0's.
            const size_t count = 1 << 20;
            float* in = reinterpret_cast<float*>(window);
            float* out = reinterpret_cast<float*>(window + half + (rank == 1 ? 256 : 0));
            cudaMemset(out, 0xa5, count * sizeof(float));
            uploadsLanded();
            braidAllReduce(in, out, count, braidFloat32, braidSum, comm, stream);
            cudaStreamSynchronize(stream);
            braidResult_t async = braidSuccess;
            braidCommGetAsyncError(comm, &async);
            std::vector<uint32_t> back(count);
            cudaMemcpy(back.data(), out, count * sizeof(float), cudaMemcpyDeviceToHost);
            if (async != braidInvalidUsage)
              failures.push_back("outputs at different offsets: expected braidInvalidUsage, got " +
                                 describe(async, comm));
            if (std::count(back.begin(), back.end(), 0xa5a5a5a5u) != static_cast<long>(count))
              failures.push_back("outputs at different offsets: the output was written");
          }
          between.arrive_and_wait();  // no rank reads another's window any more
          braidCommWindowDeregister(comm, handle);
          cudaFree(window);
        },
        kTimeoutMs, "direct");
    for (const std::string& f : failures) ADD_FAILURE() << f;
  }
}

// The groups of the work-list tests, of one datatype and operator: mixed collectives (in place
// and not; sizes for LL, Simple and between, so the model cuts the run where the protocol
// changes), and 40 small all-reduces (more than one launch holds).
std::vector<std::vector<Case>> groupLists(int n, braidDataType_t type, braidRedOp_t op) {
  std::vector<Case> mixed;
  auto add = [&](Collective c, size_t count, int root, bool inPlace) {
    if (op == kPreMulSum && !reduces(c)) return;
    mixed.push_back(
        {c, type, reduces(c) ? op : braidSum, count, root, mixBits(13, 0, mixed.size()), inPlace});
  };
  add(Collective::AllReduce, 1000, 0, false);
  add(Collective::AllGather, 7, 0, false);
  add(Collective::ReduceScatter, 1031, 0, true);
  add(Collective::Reduce, 1, 0, false);
  add(Collective::AllReduce, 0, 0, false);
  add(Collective::Broadcast, 100'003, n - 1, false);
  add(Collective::AllReduce, 1'000'003, 0, true);
  add(Collective::AllGather, 4099, 0, true);
  add(Collective::Reduce, 30'011, n - 1, true);
  std::vector<Case> small;
  for (size_t k = 0; k < 40; ++k)
    small.push_back({Collective::AllReduce, type, op, 1 + k, 0, mixBits(17, 0, k), k % 3 == 0});
  return {mixed, small};
}

const std::pair<braidDataType_t, braidRedOp_t> kGroupKinds[] = {
    {braidFloat32, braidSum},
    {braidBfloat16, braidMax},
    {braidFloat32, kPreMulSum},
    {braidFloat64, braidAvg}};  // Avg: a launch per call that reduces

// A group's ring collectives of one kernel share a launch (a work list, docs/core.md; with
// BRAID_ALGO=tree, as gpu-check runs it too, the all-reduces' runs share a tree kernel): each rank,
// a thread, issues in one group mixed collectives of one datatype and operator (all-reduce,
// all-gather, reduce-scatter, broadcast, reduce; in place and not; sizes for LL, Simple and in
// between, so the model cuts the run where the protocol changes), then 40 small all-reduces in
// one group (two launches: kMaxLaunchWorks, then the rest). Every call has its own buffers and is
// checked against the reference.
TEST_F(CudaComm, AGroupsCollectivesShareALaunch) {
  for (int n : {2, 4})
    for (const auto& [type, op] : kGroupKinds) {
      SCOPED_TRACE(std::to_string(n) + " ranks, " + dtypeName(type) + " " + opName(op));
      const std::vector<std::vector<Case>> lists = groupLists(n, type, op);
      const std::vector<Case>&mixed = lists[0], &small = lists[1];
      StepWatchdog watchdog(kStepLimit);
      const auto failures = runRanks(n, [&](int rank, braidComm_t comm, cudaStream_t stream,
                                            const std::function<void()>& ready,
                                            std::vector<std::string>& failures) {
        // Every group's buffers before the first call (an allocation may wait for the peers'
        // kernels, which may wait for this rank's).
        const std::vector<Case>* groups[] = {&mixed, &small};
        std::vector<RankBuffers> hosts[2];
        std::vector<DeviceRank> devs[2];
        DeviceArena arena;
        for (int g = 0; g < 2; ++g)
          for (const Case& c : *groups[g]) {
            layoutRank(c, rank, n, hosts[g].emplace_back());
            if (!toDevice(hosts[g].back(), arena, devs[g].emplace_back()))
              return failures.push_back("cudaMalloc or cudaMemcpy failed");
          }
        ready();
        for (int g = 0; g < 2; ++g) {
          const std::vector<Case>* group = groups[g];
          std::vector<RankBuffers>& host = hosts[g];
          std::vector<DeviceRank>& dev = devs[g];
          if (rank == 0) watchdog.step(std::to_string(group->size()) + " calls in one group");
          const size_t calls = group->size();
          std::vector<braidRedOp_t> ops(calls, braidSum);
          braidGroupStart();
          for (size_t k = 0; k < calls; ++k)
            if (const braidResult_t r =
                    issueCase((*group)[k], rank, n, comm, stream, dev[k], ops[k]);
                r != braidSuccess)
              failures.push_back("call " + std::to_string(k) + ": " + describe(r, comm));
          if (const braidResult_t r = braidGroupEnd(); r != braidSuccess)
            return failures.push_back("braidGroupEnd: " + describe(r, comm));
          braidResult_t async = braidSuccess;
          if (cudaStreamSynchronize(stream) != cudaSuccess ||
              braidCommGetAsyncError(comm, &async) != braidSuccess || async != braidSuccess)
            return failures.push_back("the group failed: " + describe(async, comm));
          for (size_t k = 0; k < calls; ++k) {
            if ((*group)[k].op == kPreMulSum) braidRedOpDestroy(ops[k], comm);
            const std::string what = "call " + std::to_string(k) + " " +
                                     describe((*group)[k], Shape{n, 0, 0, 0, Algorithm::Simple});
            if (!toHost(dev[k], host[k])) return failures.push_back(what + ": cudaMemcpy failed");
            if (const std::string wrong = checkRank((*group)[k], rank, n, host[k], AverageAs::Api);
                !wrong.empty())
              failures.push_back(what + ": " + wrong);
          }
        }
      });
      for (const std::string& f : failures) ADD_FAILURE() << f;
    }
}

// One thread drives every rank of the GPU through the same groups (braidCommInitAll): the k-th
// calls of every rank go in one launch, and a run of them one ring (or, with BRAID_ALGO=tree, tree)
// kernel runs in one launch too
// (every rank's calls a work list; at most 32 calls over the ranks). A stream per rank.
TEST_F(CudaComm, OneThreadDrivesEveryRankThroughAGroupOfCollectives) {
  for (int n : {2, 4, 8})  // 8 ranks: at most 4 calls of each in a launch
    for (const auto& [type, op] : kGroupKinds) {
      SCOPED_TRACE(std::to_string(n) + " ranks, " + dtypeName(type) + " " + opName(op));
      AllRanksOnOneThread all(n);
      ASSERT_EQ(all.open(), "");
      const std::vector<braidComm_t>& comms = all.comms;
      const std::vector<cudaStream_t>& streams = all.streams;
      StepWatchdog watchdog(kStepLimit);
      for (const std::vector<Case>& group : groupLists(n, type, op)) {
        watchdog.step(std::to_string(group.size()) + " calls of every rank in one group");
        const size_t calls = group.size();
        std::vector<std::vector<RankBuffers>> host(n, std::vector<RankBuffers>(calls));
        std::vector<std::vector<DeviceRank>> dev(n, std::vector<DeviceRank>(calls));
        std::vector<std::vector<braidRedOp_t>> ops(n, std::vector<braidRedOp_t>(calls, braidSum));
        DeviceArena arena;
        onEveryRank(n, [&](int r) {
          for (size_t k = 0; k < calls; ++k) layoutRank(group[k], r, n, host[r][k]);
        });
        for (int r = 0; r < n; ++r)
          for (size_t k = 0; k < calls; ++k) ASSERT_TRUE(toDevice(host[r][k], arena, dev[r][k]));
        braidGroupStart();
        for (int r = 0; r < n; ++r)
          for (size_t k = 0; k < calls; ++k)
            if (const braidResult_t issued =
                    issueCase(group[k], r, n, comms[r], streams[r], dev[r][k], ops[r][k]);
                issued != braidSuccess)
              ADD_FAILURE() << "rank " << r << " call " << k << ": " << describe(issued, comms[r]);
        const braidResult_t result = braidGroupEnd();
        ASSERT_EQ(result, braidSuccess) << describe(result, nullptr);
        for (cudaStream_t s : streams) CUDA_CHECK(cudaStreamSynchronize(s));
        std::vector<std::string> wrong(n);
        onEveryRank(n, [&](int r) {
          for (size_t k = 0; k < calls && wrong[r].empty(); ++k)
            if (!toHost(dev[r][k], host[r][k]))
              wrong[r] = "cudaMemcpy failed";
            else if (const std::string w = checkRank(group[k], r, n, host[r][k], AverageAs::Api);
                     !w.empty())
              wrong[r] = "call " + std::to_string(k) + " " +
                         describe(group[k], Shape{n, 0, 0, 0, Algorithm::Simple}) + ": " + w;
        });
        for (int r = 0; r < n; ++r) {
          EXPECT_TRUE(wrong[r].empty()) << "rank " << r << ": " << wrong[r];
          for (size_t k = 0; k < calls; ++k)
            if (group[k].op == kPreMulSum) braidRedOpDestroy(ops[r][k], comms[r]);
        }
      }
    }
}

// Work queued before a call is seen by it, and work queued after it sees its result: rounds of
// copy in, all-reduce, copy out with no wait between them, alternating between two streams of
// the rank (a rank's calls share its FIFOs, so a call on the other stream must wait for the last
// one), each round with buffers of its own.
TEST_F(CudaComm, CallsKeepTheStreamsOrder) {
  constexpr int kRanks = 2, kRounds = 8;
  constexpr size_t kCount = 300'001;  // Simple protocol, several slots per channel
  const auto failures = runRanks(kRanks, [&](int rank, braidComm_t comm, cudaStream_t stream,
                                             const std::function<void()>& ready,
                                             std::vector<std::string>& failures) {
    const size_t bytes = kCount * sizeof(float);
    cudaStream_t other = nullptr;
    float *in = nullptr, *out = nullptr, *hostIn = nullptr, *hostOut = nullptr;
    if (cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) ||
        cudaMalloc(&in, bytes * kRounds) || cudaMalloc(&out, bytes * kRounds) ||
        cudaMallocHost(&hostIn, bytes * kRounds) || cudaMallocHost(&hostOut, bytes * kRounds))
      return failures.push_back("allocation failed");
    ready();
    for (int round = 0; round < kRounds; ++round)
      for (size_t i = 0; i < kCount; ++i)
        hostIn[round * kCount + i] = static_cast<float>((rank + 1) * (round + 1) + i % 7);
    std::memset(hostOut, 0xa5, bytes * kRounds);
    for (int round = 0; round < kRounds; ++round) {
      cudaStream_t s = round % 2 == 0 ? stream : other;
      const size_t at = round * kCount;
      cudaMemcpyAsync(in + at, hostIn + at, bytes, cudaMemcpyHostToDevice, s);
      const braidResult_t r =
          braidAllReduce(in + at, out + at, kCount, braidFloat32, braidSum, comm, s);
      if (r != braidSuccess) return failures.push_back("allreduce: " + describe(r, comm));
      cudaMemcpyAsync(hostOut + at, out + at, bytes, cudaMemcpyDeviceToHost, s);
    }
    if (cudaStreamSynchronize(stream) != cudaSuccess || cudaStreamSynchronize(other) != cudaSuccess)
      return failures.push_back("cudaStreamSynchronize failed");
    for (int round = 0; round < kRounds && failures.empty(); ++round)
      for (size_t i = 0; i < kCount; ++i) {
        // ranks 1 and 2 (as rank + 1) summed
        const float want = static_cast<float>(3 * (round + 1) + 2 * (i % 7));
        if (hostOut[round * kCount + i] != want) {
          failures.push_back("round " + std::to_string(round) + " element " + std::to_string(i) +
                             " is " + std::to_string(hostOut[round * kCount + i]) + ", expected " +
                             std::to_string(want));
          break;
        }
      }
    cudaStreamDestroy(other);
    cudaFree(in);
    cudaFree(out);
    cudaFreeHost(hostIn);
    cudaFreeHost(hostOut);
  });
  for (const std::string& f : failures) ADD_FAILURE() << f;
}

// A call captured in a CUDA graph replays: the kernels take up the FIFOs' counters where the
// previous replay left them. Small (low-latency) and large (Simple) all-reduces, 3 replays.
TEST_F(CudaComm, CapturedCallsReplay) {
  constexpr int kRanks = 2, kReplays = 3;
  for (size_t count : {size_t{1000}, size_t{1'000'003}}) {
    SCOPED_TRACE("count " + std::to_string(count));
    const auto failures = runRanks(kRanks, [&](int rank, braidComm_t comm, cudaStream_t stream,
                                               const std::function<void()>& ready,
                                               std::vector<std::string>& failures) {
      const size_t bytes = count * sizeof(float);
      float *in = nullptr, *out = nullptr, *hostIn = nullptr, *hostOut = nullptr;
      if (cudaMalloc(&in, bytes) || cudaMalloc(&out, bytes) || cudaMallocHost(&hostIn, bytes) ||
          cudaMallocHost(&hostOut, bytes))
        return failures.push_back("allocation failed");
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        return failures.push_back("cudaStreamBeginCapture failed");
      cudaMemcpyAsync(in, hostIn, bytes, cudaMemcpyHostToDevice, stream);
      const braidResult_t r = braidAllReduce(in, out, count, braidFloat32, braidSum, comm, stream);
      cudaMemcpyAsync(hostOut, out, bytes, cudaMemcpyDeviceToHost, stream);
      if (cudaStreamEndCapture(stream, &graph) != cudaSuccess || r != braidSuccess ||
          cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
        return failures.push_back("capture failed: " + describe(r, comm));
      ready();  // instantiating may allocate too
      for (int replay = 0; replay < kReplays && failures.empty(); ++replay) {
        for (size_t i = 0; i < count; ++i)
          hostIn[i] = static_cast<float>(rank * 100 + replay * 10 + i % 5);
        std::memset(hostOut, 0xa5, bytes);
        if (cudaGraphLaunch(exec, stream) != cudaSuccess ||
            cudaStreamSynchronize(stream) != cudaSuccess)
          return failures.push_back("cudaGraphLaunch failed");
        for (size_t i = 0; i < count; ++i) {
          const float want = static_cast<float>(100 + 2 * (replay * 10 + i % 5));
          if (hostOut[i] != want) {
            failures.push_back("replay " + std::to_string(replay) + " element " +
                               std::to_string(i) + " is " + std::to_string(hostOut[i]) +
                               ", expected " + std::to_string(want));
            break;
          }
        }
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaFree(in);
      cudaFree(out);
      cudaFreeHost(hostIn);
      cudaFreeHost(hostOut);
    });
    for (const std::string& f : failures) ADD_FAILURE() << f;
  }
}

// Host memory on a CUDA communicator, and device memory on a CPU one, are refused by name.
TEST_F(CudaComm, BuffersOfTheWrongKindAreRefused) {
  const auto failures = runRanks(1, [&](int, braidComm_t comm, cudaStream_t stream,
                                        const std::function<void()>&,
                                        std::vector<std::string>& failures) {
    std::vector<float> pageable(64);
    float* pinned = nullptr;
    float* device = nullptr;
    if (cudaMallocHost(&pinned, 256) || cudaMalloc(&device, 256))
      return failures.push_back("allocation failed");
    auto refused = [&](const void* send, void* recv, const char* kind) {
      const braidResult_t r = braidAllReduce(send, recv, 64, braidFloat32, braidSum, comm, stream);
      const std::string error = braidGetLastError(comm);
      if (r != braidInvalidArgument || error.find(kind) == std::string::npos)
        failures.push_back(std::string(kind) + " was not refused by name: " + describe(r, comm));
    };
    refused(pageable.data(), device, "sendbuff");
    refused(pageable.data(), device, "pageable host memory");
    refused(device, pinned, "recvbuff");
    refused(device, pinned, "pinned host memory");

    braidConfig_t config = BRAID_CONFIG_INITIALIZER;
    config.device = "cpu";
    braidUniqueId id;
    braidComm_t cpu = nullptr;
    braidGetUniqueId(&id);
    if (braidCommInitRankConfig(&cpu, 1, id, 0, &config) != braidSuccess)
      return failures.push_back("CPU communicator: " + describe(braidInternalError, nullptr));
    const braidResult_t r =
        braidAllReduce(device, pageable.data(), 64, braidFloat32, braidSum, cpu, nullptr);
    const std::string error = braidGetLastError(cpu);
    if (r != braidInvalidArgument || error.find("device memory") == std::string::npos)
      failures.push_back("device memory on a CPU communicator: " + describe(r, cpu));
    braidCommDestroy(cpu);
    cudaFreeHost(pinned);
    cudaFree(device);
  });
  for (const std::string& f : failures) ADD_FAILURE() << f;
}

// A rank that never makes its call: the other's kernel gives up at the timeout, and the
// communicator says so (braidTimeout) instead of hanging the stream.
TEST_F(CudaComm, AMissingPeerBecomesATimeout) {
  constexpr int kShortTimeoutMs = 2000;
  const auto failures = runRanks(
      2,
      [&](int rank, braidComm_t comm, cudaStream_t stream, const std::function<void()>&,
          std::vector<std::string>& failures) {
        if (rank == 1) return;  // never calls
        float* buffer = nullptr;
        if (cudaMalloc(&buffer, 4096 * sizeof(float))) return failures.push_back("cudaMalloc");
        braidAllReduce(buffer, buffer, 4096, braidFloat32, braidSum, comm, stream);
        cudaStreamSynchronize(stream);
        braidResult_t async = braidSuccess;
        braidCommGetAsyncError(comm, &async);
        if (async != braidTimeout)
          failures.push_back("expected braidTimeout, got " + describe(async, comm));
        cudaFree(buffer);
      },
      kShortTimeoutMs);
  for (const std::string& f : failures) ADD_FAILURE() << f;
}

}  // namespace
}  // namespace braid_test
