// The CUDA backend: buffers in one device's memory, the step's kernels (device_kernels.cu) and
// the collectives on one CUDA stream of the object's, so everything runs in the order it was
// queued without the host waiting; the host waits where it needs a result (the verdict) or hands
// memory back to the caller (zero, copies).
#include <cuda_runtime_api.h>

#include "dp/backend.h"
#include "dp/error.h"

namespace braid::dp {
namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(braidComm_t comm, int rank, int device) : comm_(comm), rank_(rank), device_(device) {
    const DeviceScope scope(*this);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(device::loadKernels(), "loading the step's kernels (cudaFuncGetAttributes)");
  }
  ~CudaBackend() override {
    // Queued collectives and kernels point into our buffers: let them finish first. A
    // destructor cannot report an error.
    const DeviceScope scope(*this);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  std::byte* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const DeviceScope scope(*this);
    // Stream-ordered: cudaMalloc and cudaFree may wait for every kernel on the device, and where
    // ranks share the GPU a peer's collective may be waiting for this rank's next launch.
    void* memory = nullptr;
    check(cudaMallocAsync(&memory, bytes, stream_), "cudaMallocAsync", bytes);
    check(cudaMemsetAsync(memory, 0, bytes, stream_), "cudaMemsetAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after cudaMemsetAsync");
    return static_cast<std::byte*>(memory);
  }
  void release(std::byte* memory) override {
    const DeviceScope scope(*this);
    cudaFreeAsync(memory, stream_);  // cannot fail for memory of ours; called from destructors
  }
  void zero(void* memory, size_t bytes) override {
    const DeviceScope scope(*this);
    check(cudaMemsetAsync(memory, 0, bytes, stream_), "cudaMemsetAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after cudaMemsetAsync");
  }
  void copyToHost(void* hostDst, const void* src, size_t bytes) override {
    const DeviceScope scope(*this);
    check(cudaMemcpyAsync(hostDst, src, bytes, cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync to the host");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after cudaMemcpyAsync");
  }
  void copyFromHost(void* dst, const void* hostSrc, size_t bytes) override {
    const DeviceScope scope(*this);
    check(cudaMemcpyAsync(dst, hostSrc, bytes, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync from the host");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after cudaMemcpyAsync");
  }
  // Through an fp32 copy on the device, converted there by the step's own cast kernels.
  void fromHostFloat(const float* hostSrc, void* dst, braidDataType_t type, size_t count) override {
    Buffer floats(*this, count * sizeof(float));
    copyFromHost(floats.data(), hostSrc, count * sizeof(float));
    const DeviceScope scope(*this);
    check(device::launchFromFloat(floats.floats(), dst, type, count, stream_), "launchFromFloat");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after launchFromFloat");
  }
  void toHostFloat(const void* src, braidDataType_t type, float* hostDst, size_t count) override {
    Buffer floats(*this, count * sizeof(float));
    {
      const DeviceScope scope(*this);
      check(device::launchToFloat(src, type, floats.floats(), count, stream_), "launchToFloat");
    }
    copyToHost(hostDst, floats.data(), count * sizeof(float));
  }

  void scale(void* data, braidDataType_t type, size_t count, float factor) override {
    const DeviceScope scope(*this);
    check(device::launchScale(data, type, count, factor, stream_), "launchScale");
  }
  void add(void* dst, const void* src, braidDataType_t type, size_t count) override {
    const DeviceScope scope(*this);
    check(device::launchAdd(dst, src, type, count, stream_), "launchAdd");
  }
  void inspect(const void* data, braidDataType_t type, size_t count, Verdict* verdict) override {
    const DeviceScope scope(*this);
    check(device::launchInspect(data, type, count, verdict, stream_), "launchInspect");
  }
  void update(const kernels::UpdateArgs& args, const void* grad, float* master, float* moment1,
              float* moment2, void* working, size_t count) override {
    const DeviceScope scope(*this);
    check(device::launchUpdate(args, grad, master, moment1, moment2, working, count, stream_),
          "launchUpdate");
  }

  braidStream_t stream() const override { return stream_; }
  // A wait of the collectives that gave up shows as the communicator's asynchronous error.
  braidResult_t synchronize() override {
    const DeviceScope scope(*this);
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    braidResult_t asyncError = braidSuccess;
    const braidResult_t queried = braidCommGetAsyncError(comm_, &asyncError);
    return queried != braidSuccess ? queried : asyncError;
  }
  void quiesce() noexcept override {
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device_) != cudaSuccess) {
      cudaGetLastError();
      return;  // no usable context: nothing of ours can be running
    }
    cudaStreamSynchronize(stream_);
    cudaSetDevice(previous);
  }

 private:
  // Makes the backend's device current for the calls of a scope, and restores the caller's.
  class DeviceScope {
   public:
    explicit DeviceScope(const CudaBackend& backend) {
      if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != backend.device_)
        backend.check(cudaSetDevice(backend.device_), "cudaSetDevice", backend.device_);
      else
        previous_ = -1;
    }
    ~DeviceScope() {
      if (previous_ >= 0) cudaSetDevice(previous_);
    }
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

   private:
    int previous_ = -1;
  };

  void check(int error, const char* what, size_t detail = 0) const {
    if (error == cudaSuccess) return;
    const auto e = static_cast<cudaError_t>(error);
    fail(braidUnhandledCudaError, "DataParallel on rank {}, CUDA device {}: {}{} failed: {} ({})",
         rank_, device_, what, detail != 0 ? fmt::format("({})", detail) : std::string(),
         cudaGetErrorName(e), cudaGetErrorString(e));
  }

  braidComm_t comm_;
  int rank_;
  int device_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> makeCudaBackend(braidComm_t comm, int rank, int device) {
  return std::make_unique<CudaBackend>(comm, rank, device);
}

}  // namespace braid::dp
