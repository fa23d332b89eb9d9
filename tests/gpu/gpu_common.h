// What the GPU tests share: CUDA failures as test failures, the skip where no device is, device
// memory released at the end of a test, and a rank's buffers of a device-form case
// (device/device_cases.h) mirrored into device memory byte for byte.
#pragma once

#include <cuda_runtime.h>  // the C++ API too (typed cudaMalloc)
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "device/device_cases.h"

namespace braid_test {

inline std::string cudaFailure(cudaError_t e, const char* what) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}
#define CUDA_CHECK(call)                                                          \
  do {                                                                            \
    const cudaError_t cudaCheckError = (call);                                    \
    ASSERT_EQ(cudaCheckError, cudaSuccess) << cudaFailure(cudaCheckError, #call); \
  } while (0)

// Why no CUDA device can be used here, or "" when one can.
inline std::string noCudaDevice() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) return "no CUDA device here (" + cudaFailure(e, "cudaGetDeviceCount") + ")";
  return devices == 0 ? "no CUDA device here (0 devices)" : "";
}

// Ends the process, naming the step a test was on, when one step outlasts its limit: a GPU test
// stuck on the host or the device (a wait the deadline does not bound) then says where, instead of
// being killed silently from outside. step() may be called from any thread.
class StepWatchdog {
 public:
  explicit StepWatchdog(std::chrono::seconds limit) : limit_(limit), thread_([this] { watch(); }) {}
  StepWatchdog(const StepWatchdog&) = delete;
  StepWatchdog& operator=(const StepWatchdog&) = delete;
  ~StepWatchdog() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stopped_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void step(std::string name) {
    const std::lock_guard<std::mutex> lock(mutex_);
    name_ = std::move(name);
    started_ = std::chrono::steady_clock::now();
  }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopped_; }))
      if (std::chrono::steady_clock::now() - started_ > limit_) {
        std::fprintf(stderr, "watchdog: step \"%s\" did not finish within %lld s\n", name_.c_str(),
                     static_cast<long long>(limit_.count()));
        std::fflush(nullptr);
        std::_Exit(3);
      }
  }

  const std::chrono::seconds limit_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::string name_ = "set-up";
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  bool stopped_ = false;
  std::thread thread_;  // last: starts once the rest is set
};
// A step the GPU tests allow: their communicators give up waiting after 30 s (kTimeoutMs).
inline constexpr std::chrono::seconds kStepLimit{90};

// Device memory released at the end of the test, from the stream-ordered allocator on this
// thread's stream: cudaMalloc and cudaFree may wait for every kernel on the device, and with ranks
// as threads a peer's kernel may be waiting for this rank's next launch. The pool keeps what is
// freed (no release threshold), so no later synchronization hands memory back either.
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (void* p : blocks_) cudaFreeAsync(p, cudaStreamPerThread);
    cudaStreamSynchronize(cudaStreamPerThread);
  }
  void* take(size_t bytes) {
    int device = 0;
    cudaMemPool_t pool = nullptr;
    uint64_t keepAll = UINT64_MAX;
    void* p = nullptr;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess ||
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keepAll) != cudaSuccess ||
        cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, cudaStreamPerThread) != cudaSuccess ||
        cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess)
      return nullptr;
    blocks_.push_back(p);
    return p;
  }

 private:
  std::vector<void*> blocks_;
};

// One rank's buffers of a case in device memory, laid out as the host's (RankBuffers).
struct DeviceRank {
  unsigned char* inputStorage = nullptr;
  unsigned char* outputStorage = nullptr;
  unsigned char* input = nullptr;
  unsigned char* output = nullptr;
};

// Where the host layout's pointer p (inside `storage`) lies in the device copy.
inline unsigned char* mirror(const std::vector<unsigned char>& storage, const unsigned char* p,
                             unsigned char* device) {
  return p == nullptr || storage.empty() || p < storage.data() ||
                 p >= storage.data() + storage.size()
             ? nullptr
             : device + (p - storage.data());
}

// Waits until the legacy stream's copies and memsets have landed: cudaMemcpy from pageable memory
// and cudaMemset may return before the device has the bytes, and kernels on non-blocking streams
// do not wait for the legacy stream. Never waits for kernels on those streams (ranks' kernels that
// wait for each other).
inline bool uploadsLanded() {
  return cudaStreamSynchronize(cudaStreamLegacy) == cudaSuccess;
}

// Copies host buffers h (inputs and poisoned outputs) into new device memory; false when an
// allocation or copy failed.
inline bool toDevice(const RankBuffers& h, DeviceArena& arena, DeviceRank& d) {
  d.inputStorage = static_cast<unsigned char*>(arena.take(h.inputStorage.size()));
  d.outputStorage = static_cast<unsigned char*>(arena.take(h.outputStorage.size()));
  if (d.inputStorage == nullptr || d.outputStorage == nullptr) return false;
  if (!h.inputStorage.empty() &&
      cudaMemcpy(d.inputStorage, h.inputStorage.data(), h.inputStorage.size(),
                 cudaMemcpyHostToDevice) != cudaSuccess)
    return false;
  if (!h.outputStorage.empty() &&
      cudaMemcpy(d.outputStorage, h.outputStorage.data(), h.outputStorage.size(),
                 cudaMemcpyHostToDevice) != cudaSuccess)
    return false;
  auto at = [&](const unsigned char* p) {
    unsigned char* in = mirror(h.inputStorage, p, d.inputStorage);
    return in != nullptr ? in : mirror(h.outputStorage, p, d.outputStorage);
  };
  d.input = at(h.input);
  d.output = at(h.output);
  return uploadsLanded();
}

// Copies the device buffers back over h, for checkRank.
inline bool toHost(const DeviceRank& d, RankBuffers& h) {
  if (!h.inputStorage.empty() &&
      cudaMemcpy(h.inputStorage.data(), d.inputStorage, h.inputStorage.size(),
                 cudaMemcpyDeviceToHost) != cudaSuccess)
    return false;
  return h.outputStorage.empty() ||
         cudaMemcpy(h.outputStorage.data(), d.outputStorage, h.outputStorage.size(),
                    cudaMemcpyDeviceToHost) == cudaSuccess;
}

// The offset of a layout's 64-byte boundary in its storage (device_cases.h's alignedIn): a
// rank's buffers start there plus the case's shift, whatever address the storage got.
inline size_t alignedStart(const std::vector<unsigned char>& storage) {
  const auto at = reinterpret_cast<uintptr_t>(storage.data());
  return storage.empty() ? 0 : (at + 63) / 64 * 64 - at;
}

// A rank's buffers in its part of a registered window, as every rank places them: the input's
// storage at the window's start and the output's at `half` (a layout in place has one of them),
// each from its 64-byte boundary, so every rank's buffers lie at the same offsets of its part.
inline bool toWindow(const RankBuffers& h, unsigned char* window, size_t half, DeviceRank& d) {
  d.inputStorage = window;
  d.outputStorage = window + half;
  auto at = [&](const unsigned char* p) {
    unsigned char* in = mirror(h.inputStorage, p, d.inputStorage);
    if (in != nullptr) return in - alignedStart(h.inputStorage);
    return mirror(h.outputStorage, p, d.outputStorage) - alignedStart(h.outputStorage);
  };
  d.input = at(h.input);
  d.output = at(h.output);
  for (auto [storage, device] :
       {std::pair{&h.inputStorage, d.inputStorage}, std::pair{&h.outputStorage, d.outputStorage}}) {
    const size_t start = alignedStart(*storage);
    if (!storage->empty() && cudaMemcpy(device, storage->data() + start, storage->size() - start,
                                        cudaMemcpyHostToDevice) != cudaSuccess)
      return false;
  }
  return uploadsLanded();
}

// Copies toWindow's buffers back over h, for checkRank.
inline bool fromWindow(const DeviceRank& d, RankBuffers& h) {
  for (auto [storage, device] :
       {std::pair{&h.inputStorage, d.inputStorage}, std::pair{&h.outputStorage, d.outputStorage}}) {
    const size_t start = alignedStart(*storage);
    if (!storage->empty() && cudaMemcpy(storage->data() + start, device, storage->size() - start,
                                        cudaMemcpyDeviceToHost) != cudaSuccess)
      return false;
  }
  return true;
}

}  // namespace braid_test
