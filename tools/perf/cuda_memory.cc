#include "perf/cuda_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "perf/options.h"

#if BRAID_PERF_CUDA
#include <cuda_runtime_api.h>
#endif

namespace braid_perf::cuda {

#if BRAID_PERF_CUDA
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw RunError(
        fmt::format("{} failed: {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e)));
}

}  // namespace

// Where no device can be used, nothing is selected: the communicator's init then says why.
void selectDevice(int localRank) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return;
  check(cudaSetDevice(localRank % devices), "cudaSetDevice");
}

// cudaMemset, and cudaMemcpy from pageable memory, may return before the device has the bytes,
// and the collectives run on non-blocking streams, which do not wait for the legacy stream: wait
// for it (never for the ranks' kernels, which may be waiting for each other).
void landed(const char* what) {
  check(cudaStreamSynchronize(cudaStreamLegacy), what);
}

// Buffers come from the stream-ordered allocator on this thread's stream: cudaMalloc and cudaFree
// may wait for every kernel on the device, and with ranks as threads one rank's kernel is then
// waiting for a peer whose thread is stuck in that allocation. The pool keeps what is freed (no
// release threshold), so no later synchronization hands memory back to the driver either.
void* allocate(size_t bytes) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  uint64_t keepAll = UINT64_MAX;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keepAll),
        "cudaMemPoolSetAttribute");
  void* p = nullptr;
  check(cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, cudaStreamPerThread), "cudaMallocAsync");
  check(cudaMemsetAsync(p, 0, bytes == 0 ? 1 : bytes, cudaStreamPerThread), "cudaMemsetAsync");
  check(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize after cudaMemsetAsync");
  return p;
}

void release(void* p) {
  cudaFreeAsync(p, cudaStreamPerThread);
  cudaStreamSynchronize(cudaStreamPerThread);
}

void upload(void* device, const void* host, size_t bytes) {
  check(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
  landed("cudaStreamSynchronize after cudaMemcpy to the device");
}

void download(void* host, const void* device, size_t bytes) {
  check(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy from the device");
}

void* createStream() {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return stream;
}

void destroyStream(void* stream) {
  cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

void synchronize(void* stream) {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

int deviceCount() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return devices;
}

double copyBandwidthGBs() {
  constexpr size_t kBytes = size_t{256} << 20;
  void* from = allocate(kBytes);
  void* to = allocate(kBytes);
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> gbs;
  for (int i = 0; i < 6; ++i) {
    check(cudaEventRecord(start), "cudaEventRecord");
    check(cudaMemcpyAsync(to, from, kBytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (i > 0) gbs.push_back(2.0 * kBytes / (ms * 1e-3) / 1e9);  // the first warms up
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  release(from);
  release(to);
  std::sort(gbs.begin(), gbs.end());
  return gbs[gbs.size() / 2];
}

#else

namespace {
[[noreturn]] void unavailable() {
  throw RunError("--device cuda: this braid-perf was built without CUDA (no nvcc at build time)");
}
}  // namespace

void selectDevice(int) {}
void* allocate(size_t) {
  unavailable();
}
void release(void*) {}
void upload(void*, const void*, size_t) {
  unavailable();
}
void download(void*, const void*, size_t) {
  unavailable();
}
void* createStream() {
  unavailable();
}
void destroyStream(void*) {}
void synchronize(void*) {
  unavailable();
}
int deviceCount() {
  return 0;
}
double copyBandwidthGBs() {
  unavailable();
}

#endif

}  // namespace braid_perf::cuda
