// The device kernels (coll/device_kernels.cu) on a GPU: R ranks sharing the current device, one
// launch with a block per rank and channel (as one host thread drives the ranks of a GPU), FIFOs
// and barrier words in device memory, the device form's cases (device/device_cases.h: every
// collective of the algorithm x dtype x op at counts 0 .. beyond the FIFO, in place and not) and
// its check against the multirank grid's independent reference, buffers poisoned before each run.
// Where no CUDA device is present every test is skipped, saying so.
#include <cstring>
#include <string>
#include <vector>

#include "coll/device_kernels.cuh"
#include "coll/device_launch.h"
#include "gpu/gpu_common.h"

namespace braid_test {
namespace {

constexpr uint64_t kTimeoutNs = 20'000'000'000;  // a device wait gives up after 20 s

class GpuKernels : public testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    const std::string none = noCudaDevice();
    if (!none.empty()) GTEST_SKIP() << none << ": the device kernels run only on a GPU";
  }
};

// Runs case c on the GPU; failures are added to the test.
void runCase(const Shape& shape, const Case& c, DeviceArena& arena, cudaStream_t stream) {
  const int n = shape.ranks, channels = shape.channels;
  const int blocks = n * channels;
  ASSERT_LE(blocks, braid::kMaxLaunchBlocks);
  std::vector<RankBuffers> host(n);
  std::vector<DeviceRank> dev(n);
  for (int r = 0; r < n; ++r) {
    layoutRank(c, r, n, host[r]);
    ASSERT_TRUE(toDevice(host[r], arena, dev[r])) << "cudaMalloc or cudaMemcpy failed";
  }
  int* failed = static_cast<int*>(arena.take(sizeof(int) * braid::kMaxLaunchBlocks));
  CUDA_CHECK(cudaMemset(failed, 0, sizeof(int) * braid::kMaxLaunchBlocks));
  const bool prescaled = c.op == kPreMulSum;
  const void* kernel = braid::deviceKernel(
      shape.algorithm == Algorithm::Simple       ? braid::DeviceAlgorithm::Simple
      : shape.algorithm == Algorithm::LowLatency ? braid::DeviceAlgorithm::LowLatency
      : shape.algorithm == Algorithm::Segmented  ? braid::DeviceAlgorithm::Segmented
                                                 : braid::DeviceAlgorithm::Direct,
      c.type, prescaled ? braidSum : c.op, prescaled);
  ASSERT_NE(kernel, nullptr);
  const int divisor = c.op == braidAvg ? n : 1;
  visitDtype(c.type, [&](auto element) {
    using T = decltype(element);
    if (shape.algorithm == Algorithm::Direct) {
      auto* arrivals =
          static_cast<braid::DirectArrival*>(arena.take(sizeof(braid::DirectArrival) * blocks));
      auto* abort = static_cast<uint32_t*>(arena.take(sizeof(uint32_t)));
      ASSERT_TRUE(arrivals && abort);
      CUDA_CHECK(cudaMemset(arrivals, 0, sizeof(braid::DirectArrival) * blocks));
      CUDA_CHECK(cudaMemset(abort, 0, sizeof(uint32_t)));
      braid::DirectLaunch<T> launch{};
      launch.timeoutNs = kTimeoutNs;
      launch.abort = abort;
      for (int r = 0; r < n; ++r) {
        launch.inputs[r] = reinterpret_cast<const T*>(dev[r].input);
        launch.outputs[r] = reinterpret_cast<T*>(dev[r].output);
        launch.scales[r] = premulScalar<T>(r, c.salt);
        for (int ch = 0; ch < channels; ++ch)
          launch.blocks[r * channels + ch] = {c.collective,
                                              n,
                                              r,
                                              ch,
                                              channels,
                                              c.count,
                                              divisor,
                                              arrivals + ch * n,
                                              /*signature=*/0,
                                              failed + r * channels + ch};
      }
      void* args[] = {&launch};
      ASSERT_TRUE(uploadsLanded());
      CUDA_CHECK(cudaLaunchKernel(kernel, dim3(blocks), dim3(shape.threads), args, 0, stream));
      return;
    }
    // The ring: rank r receives on FIFO (r, ch), written by the previous rank; sends and
    // receives pair channels as the CPU harness does (even send, odd receive).
    const size_t slotBytes = kSlotBytes;
    std::vector<braid::FifoWords*> words(blocks);
    std::vector<uint8_t*> slots(blocks);
    for (int b = 0; b < blocks; ++b) {
      words[b] = static_cast<braid::FifoWords*>(arena.take(sizeof(braid::FifoWords)));
      slots[b] = static_cast<uint8_t*>(arena.take(slotBytes * shape.slots));
      ASSERT_TRUE(words[b] && slots[b]);
      CUDA_CHECK(cudaMemset(words[b], 0, sizeof(braid::FifoWords)));
      CUDA_CHECK(cudaMemset(slots[b], 0, slotBytes * shape.slots));
    }
    auto launchRing = [&](auto ports) {
      using Ports = decltype(ports);
      braid::RingLaunch<T, Ports> launch{};
      launch.timeoutNs = kTimeoutNs;
      const bool p2p = c.collective == Collective::Send;
      for (int r = 0; r < n; ++r)
        for (int ch = 0; ch < channels; ++ch) {
          const bool receiving = p2p && ch % 2 == 1;
          const int mine = r * channels + (receiving ? ch - 1 : ch);
          const int theirs = (r + 1) % n * channels + ch;
          // A work per block: a send's and a receive's blocks run different calls.
          const int b = r * channels + ch;
          auto& work = launch.works[b];
          work.call = {p2p ? (receiving ? Collective::Recv : Collective::Send) : c.collective,
                       n,
                       r,
                       c.root,
                       reinterpret_cast<const T*>(dev[r].input),
                       reinterpret_cast<T*>(dev[r].output),
                       c.count,
                       c.count,
                       divisor};
          work.scaleValue = premulScalar<T>(r, c.salt);
          auto& block = launch.blocks[b];
          block.firstWork = b;
          block.nWorks = 1;
          block.channel = p2p ? ch / 2 : ch;
          block.nChannels = p2p ? channels / 2 : channels;
          block.ports = ports;  // the segmented protocol's segment size
          block.ports.in = {words[mine], slots[mine], slotBytes,
                            static_cast<uint32_t>(shape.slots)};
          block.ports.out = {words[theirs], slots[theirs], slotBytes,
                             static_cast<uint32_t>(shape.slots)};
          block.failed = failed + r * channels + ch;
        }
      void* args[] = {&launch};
      ASSERT_TRUE(uploadsLanded());
      CUDA_CHECK(cudaLaunchKernel(kernel, dim3(blocks), dim3(shape.threads), args, 0, stream));
    };
    if (shape.algorithm == Algorithm::LowLatency)
      launchRing(braid::LlPorts{});
    else if (shape.algorithm == Algorithm::Segmented)
      launchRing(braid::SegmentPorts{{}, kSegmentBytes});
    else
      launchRing(braid::FifoViewPorts{});
  });
  if (testing::Test::HasFatalFailure()) return;
  CUDA_CHECK(cudaStreamSynchronize(stream));
  int failures[braid::kMaxLaunchBlocks];
  CUDA_CHECK(cudaMemcpy(failures, failed, sizeof failures, cudaMemcpyDeviceToHost));
  for (int b = 0; b < blocks; ++b)
    EXPECT_EQ(failures[b], 0) << describe(c, shape) << ": block " << b << " (rank " << b / channels
                              << ") gave up waiting";
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(toHost(dev[r], host[r])) << "cudaMemcpy failed";
    const std::string wrong = checkRank(c, r, n, host[r]);
    EXPECT_TRUE(wrong.empty()) << describe(c, shape) << ": " << wrong;
  }
}

TEST_P(GpuKernels, EveryCollectiveMatchesTheReference) {
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  StepWatchdog watchdog(kStepLimit);
  for (const Case& c : casesFor(GetParam())) {
    watchdog.step(describe(c, GetParam()));
    DeviceArena arena;
    runCase(GetParam(), c, arena, stream);
    if (HasFailure()) break;  // the first case that fails says enough
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
}

// 1, 2, 4 and 8 ranks on one GPU; 2 channels at 2 ranks (sends and receives pair them) and at 4,
// 16 at 2; blocks of 32 (a warp) and 256 threads.
std::vector<Shape> shapes() {
  std::vector<Shape> all;
  for (Algorithm algorithm :
       {Algorithm::Simple, Algorithm::LowLatency, Algorithm::Segmented, Algorithm::Direct})
    for (int ranks : {1, 2, 4, 8})
      for (int threads : {32, 256}) {
        const int channels = ranks == 2 || ranks == 4 ? 2 : 1;
        all.push_back({ranks, channels, threads, 4, algorithm});
      }
  // A CUDA communicator's channels at 2 ranks sharing a GPU (core/comm.cc).
  for (Algorithm algorithm :
       {Algorithm::Simple, Algorithm::LowLatency, Algorithm::Segmented, Algorithm::Direct})
    all.push_back({2, 16, 256, 4, algorithm});
  return all;
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuKernels, testing::ValuesIn(shapes()),
                         [](const testing::TestParamInfo<Shape>& info) {
                           return shapeName(info.param);
                         });

}  // namespace
}  // namespace braid_test
