// The host backend: host memory, the CPU kernels run on the calling thread, collectives on a
// braid host stream. Its arithmetic runs at once, so callers drain the stream before touching
// what a queued collective writes (data_parallel.cc does).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "dp/backend.h"
#include "dp/error.h"

namespace braid::dp {
namespace {

class HostBackend final : public Backend {
 public:
  HostBackend(braidComm_t comm, int rank) : comm_(comm) {
    const braidResult_t result = braidStreamCreate(&stream_);
    if (result != braidSuccess)
      fail(result, "DataParallel on rank {}: braidStreamCreate failed: {}", rank,
           braidGetLastError(comm_));
  }
  ~HostBackend() override {
    // Queued collectives point into our buffers: let them finish first. A destructor cannot
    // report an error; the communicator keeps it (braidCommGetAsyncError).
    braidStreamSynchronize(stream_);
    braidStreamDestroy(stream_);
  }

  std::byte* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    auto* memory = static_cast<std::byte*>(std::calloc(bytes, 1));
    if (memory == nullptr) throw std::bad_alloc();
    return memory;
  }
  void release(std::byte* memory) override { std::free(memory); }
  void zero(void* memory, size_t bytes) override { std::memset(memory, 0, bytes); }
  void copyToHost(void* hostDst, const void* src, size_t bytes) override {
    std::memcpy(hostDst, src, bytes);
  }
  void copyFromHost(void* dst, const void* hostSrc, size_t bytes) override {
    std::memcpy(dst, hostSrc, bytes);
  }
  void fromHostFloat(const float* hostSrc, void* dst, braidDataType_t type, size_t count) override {
    convertFromFloat(hostSrc, dst, type, count);
  }
  void toHostFloat(const void* src, braidDataType_t type, float* hostDst, size_t count) override {
    convertToFloat(src, type, hostDst, count);
  }

  void scale(void* data, braidDataType_t type, size_t count, float factor) override {
    kernels::scale(data, type, count, factor);
  }
  void add(void* dst, const void* src, braidDataType_t type, size_t count) override {
    kernels::add(dst, src, type, count);
  }
  void inspect(const void* data, braidDataType_t type, size_t count, Verdict* verdict) override {
    const kernels::Inspection part = kernels::inspect(data, type, count);
    if (part.nonFinite) verdict->overflowFlag = 1.0f;
    verdict->sumSquares += part.sumSquares;
  }
  void update(const kernels::UpdateArgs& args, const void* grad, float* master, float* moment1,
              float* moment2, void* working, size_t count) override {
    kernels::update(args, grad, master, moment1, moment2, working, count);
  }

  braidStream_t stream() const override { return stream_; }
  braidResult_t synchronize() override { return braidStreamSynchronize(stream_); }
  void quiesce() noexcept override { braidStreamSynchronize(stream_); }

 private:
  braidComm_t comm_;
  braidStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> makeHostBackend(braidComm_t comm, int rank) {
  return std::make_unique<HostBackend>(comm, rank);
}

#if !defined(BRAID_DP_HAVE_CUDA)
std::unique_ptr<Backend> makeCudaBackend(braidComm_t, int rank, int device) {
  fail(braidInvalidUsage,
       "DataParallel on rank {}: the communicator is on CUDA device {}, but braid_dp was built "
       "without CUDA (expected a CPU communicator, or a build where nvcc was found)",
       rank, device);
}
#endif

}  // namespace braid::dp
