// Where a DataParallel's buffers live and its arithmetic runs: host memory with the CPU kernels
// (kernels.h) and a host stream, or a CUDA device's memory with the kernels of
// device_kernels.cu on a CUDA stream. The step (data_parallel.cc) is written once against this.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

#include "dp/device_kernels.h"
#include "dp/kernels.h"

namespace braid::dp {

using device::Verdict;

class Backend {
 public:
  virtual ~Backend() = default;

  // `bytes` of zeroed memory (null for 0), given back with release().
  virtual std::byte* allocate(size_t bytes) = 0;
  virtual void release(std::byte* memory) = 0;
  // Zeroes `bytes` at `memory` after what is queued; done when it returns, since the caller's
  // backward pass writes there next.
  virtual void zero(void* memory, size_t bytes) = 0;
  // Between the host and the backend's memory, after what is queued; done when they return.
  virtual void copyToHost(void* hostDst, const void* src, size_t bytes) = 0;
  virtual void copyFromHost(void* dst, const void* hostSrc, size_t bytes) = 0;
  virtual void fromHostFloat(const float* hostSrc, void* dst, braidDataType_t type,
                             size_t count) = 0;
  virtual void toHostFloat(const void* src, braidDataType_t type, float* hostDst, size_t count) = 0;

  // The step's arithmetic (kernels.h), queued after what is queued.
  virtual void scale(void* data, braidDataType_t type, size_t count, float factor) = 0;
  virtual void add(void* dst, const void* src, braidDataType_t type, size_t count) = 0;
  // Adds the range's overflow flag and sum of squares into *verdict (the backend's memory).
  virtual void inspect(const void* data, braidDataType_t type, size_t count, Verdict* verdict) = 0;
  virtual void update(const kernels::UpdateArgs& args, const void* grad, float* master,
                      float* moment1, float* moment2, void* working, size_t count) = 0;

  // The stream the collectives go on: a braid host stream, or a cudaStream_t.
  virtual braidStream_t stream() const = 0;
  // Waits for everything queued; what failed, as the collectives report it.
  virtual braidResult_t synchronize() = 0;
  // Waits for everything queued, for a destructor: never throws, and never asks the communicator
  // (it may be gone).
  virtual void quiesce() noexcept = 0;
};

// comm's rank `rank`, for messages.
std::unique_ptr<Backend> makeHostBackend(braidComm_t comm, int rank);
// CUDA device `device`; fails (braidInvalidUsage) where braid_dp was built without CUDA.
std::unique_ptr<Backend> makeCudaBackend(braidComm_t comm, int rank, int device);

// Zeroed memory of a backend, released with the object.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& backend, size_t bytes)
      : backend_(&backend), data_(backend.allocate(bytes)), bytes_(bytes) {}
  Buffer(Buffer&& other) noexcept { swap(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    Buffer moved(std::move(other));
    swap(moved);
    return *this;
  }
  ~Buffer() {
    if (data_ != nullptr) backend_->release(data_);
  }
  std::byte* data() const { return data_; }
  float* floats() const { return reinterpret_cast<float*>(data_); }
  size_t size() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }

 private:
  void swap(Buffer& other) noexcept {
    std::swap(backend_, other.backend_);
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
  }
  Backend* backend_ = nullptr;
  std::byte* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace braid::dp
