// gpu-launch-costs: where a small collective's host time goes on a GPU. The host took 11 us to
// issue an 8-byte all-reduce on an H200 (bench/results/gpu-check, run 3), above issue 34's 8 us
// for the whole call; this prints what each CUDA runtime call such a call makes costs the host
// (a kernel launch at the parameter sizes braid's launches carry, event record and wait, the
// capture and pointer queries, device get), and what braid's own issue costs: an 8-byte all-reduce
// of 2 ranks of this GPU driven from one thread (one launch), timed from the group's start to its
// end without waiting for the device, and the same waited for. Each row: the median of many calls,
// in ns, the device drained every so often outside the timing so no queue fills.
//   gpu-launch-costs [calls]   (default 4000 per row)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "braid/braid.h"

namespace {

using Clock = std::chrono::steady_clock;

// Drained every this many calls, outside the timing.
constexpr int kDrainEvery = 128;

template <int kBytes>
struct Params {
  unsigned char bytes[kBytes];
};

// Reads its parameters so they are passed, and does nothing else.
template <int kBytes>
__global__ void sink(Params<kBytes> p, int* out) {
  if (p.bytes[kBytes - 1] == 7 && out != nullptr) *out = 1;
}

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "gpu-launch-costs: %s failed: %s (%s)\n", what, cudaGetErrorName(e),
               cudaGetErrorString(e));
  std::exit(3);
}

void checkBraid(braidResult_t r, const char* what) {
  if (r == braidSuccess) return;
  std::fprintf(stderr, "gpu-launch-costs: %s failed: %s: %s\n", what, braidGetErrorString(r),
               braidGetLastError(nullptr));
  std::exit(3);
}

// The median ns of `calls` runs of `body`; `drain` between batches, untimed.
double medianNs(int calls, const std::function<void()>& body, const std::function<void()>& drain) {
  std::vector<double> ns;
  ns.reserve(calls);
  for (int i = 0; i < calls + kDrainEvery; ++i) {  // the first batch warms up
    if (i % kDrainEvery == 0) drain();
    const Clock::time_point start = Clock::now();
    body();
    const double took = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    if (i >= kDrainEvery) ns.push_back(took);
  }
  std::nth_element(ns.begin(), ns.begin() + ns.size() / 2, ns.end());
  return ns[ns.size() / 2];
}

void row(const char* what, double ns) {
  std::printf("%-58s %10.0f ns\n", what, ns);
}

template <int kBytes>
void launchRow(int calls, cudaStream_t stream) {
  Params<kBytes> p{};
  const auto drain = [&] { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); };
  char what[96];
  std::snprintf(what, sizeof what, "kernel launch, %d bytes of parameters", kBytes);
  row(what, medianNs(
                calls, [&] { sink<kBytes><<<1, 32, 0, stream>>>(p, nullptr); }, drain));
  check(cudaGetLastError(), "a launch");
}

void runtimeRows(int calls) {
  cudaStream_t stream = nullptr, other = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t event = nullptr;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  void* buffer = nullptr;
  check(cudaMalloc(&buffer, 1 << 20), "cudaMalloc");
  const auto drain = [&] { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); };
  launchRow<16>(calls, stream);
  launchRow<1024>(calls, stream);
  launchRow<4096>(calls, stream);
  launchRow<6912>(calls, stream);  // braid's ring launch (RingLaunch, 6.4-6.7 KiB)
  row("cudaEventRecord", medianNs(
                             calls, [&] { cudaEventRecord(event, stream); }, drain));
  row("cudaStreamWaitEvent (another stream's event)",
      medianNs(
          calls, [&] { cudaStreamWaitEvent(other, event, 0); }, drain));
  cudaStreamCaptureStatus capture{};
  row("cudaStreamIsCapturing", medianNs(
                                   calls, [&] { cudaStreamIsCapturing(stream, &capture); }, drain));
  cudaPointerAttributes attributes{};
  row("cudaPointerGetAttributes (device memory)",
      medianNs(
          calls, [&] { cudaPointerGetAttributes(&attributes, buffer); }, drain));
  int device = 0;
  row("cudaGetDevice", medianNs(
                           calls, [&] { cudaGetDevice(&device); }, drain));
  check(cudaGetLastError(), "the runtime rows");
  cudaFree(buffer);
  cudaEventDestroy(event);
  cudaStreamDestroy(other);
  cudaStreamDestroy(stream);
}

// 2 ranks of this GPU, one thread driving both (braidCommInitAll), an 8-byte float all-reduce
// each (2 floats, out of place), in one group: one launch.
void braidRows(int calls) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const int devices[2] = {device, device};
  braidComm_t comms[2] = {};
  checkBraid(braidCommInitAll(comms, 2, devices), "braidCommInitAll");
  cudaStream_t streams[2] = {};
  float* input[2] = {};  // 8 bytes each, as braid-perf's 8 B row: apart, aligned
  float* output[2] = {};
  for (int r = 0; r < 2; ++r) {
    check(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking), "cudaStreamCreate");
    for (float** buffer : {&input[r], &output[r]}) {
      check(cudaMalloc(buffer, 2 * sizeof(float)), "cudaMalloc");
      check(cudaMemset(*buffer, 0, 2 * sizeof(float)), "cudaMemset");
    }
  }
  const auto issue = [&] {
    checkBraid(braidGroupStart(), "braidGroupStart");
    for (int r = 0; r < 2; ++r)
      checkBraid(
          braidAllReduce(input[r], output[r], 2, braidFloat32, braidSum, comms[r], streams[r]),
          "braidAllReduce");
    checkBraid(braidGroupEnd(), "braidGroupEnd");
  };
  // Waits for both ranks' calls, and fails on any a kernel reported.
  const auto drain = [&] {
    for (int r = 0; r < 2; ++r) {
      check(cudaStreamSynchronize(streams[r]), "cudaStreamSynchronize");
      braidResult_t async = braidSuccess;
      checkBraid(braidCommGetAsyncError(comms[r], &async), "braidCommGetAsyncError");
      checkBraid(async, "an all-reduce");
    }
  };
  const auto roundTrip = [&] {
    issue();
    drain();
  };
  row("braid: 8 B all-reduce, 2 ranks from one thread, issue", medianNs(calls, issue, drain));
  row("braid: the same, waited for (round trip)", medianNs(calls / 4, roundTrip, drain));
  drain();
  for (int r = 0; r < 2; ++r) {
    cudaFree(input[r]);
    cudaFree(output[r]);
    cudaStreamDestroy(streams[r]);
    braidCommDestroy(comms[r]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // a run killed at its limit keeps the rows it printed
  const int calls = argc > 1 ? std::max(kDrainEvery, std::atoi(argv[1])) : 4000;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("gpu-launch-costs: no CUDA device here\n");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("# %s; host ns per call, median of %d\n", prop.name, calls);
  runtimeRows(calls);
  braidRows(calls);
  return 0;
}
