// The braid backend's CUDA tensors: their collectives go to a braid communicator of CUDA ranks and
// their sends and receives to CUDA channels, each queued on a stream of the backend's after an
// event of the caller's current stream, as torch's NCCL backend queues them (docs/torch.md). Built
// where torch has CUDA (BRAID_TORCH_CUDA).
#pragma once

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/extension.h>

#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

#include "braid/braid.h"
#include "common.h"

namespace braid_torch {

// A CUDA event without timing on the current device: what one stream waits for on another.
class StreamEvent {
 public:
  StreamEvent();
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  void record(cudaStream_t stream);
  void makeWait(cudaStream_t stream) const;  // stream's later work waits for what was recorded
  bool reached() const;                      // what was recorded has run (or nothing was)

 private:
  cudaEvent_t event_ = nullptr;
};

// A stream of the backend's own on `device` (default: the current one): non-blocking (the legacy
// default stream would wait for a peer's kernel that waits for this rank). Kept for the process's
// life where tensors are recorded on it (the caching allocator records events on it when they are
// freed).
c10::cuda::CUDAStream newStream(c10::DeviceIndex device = -1);

// The Work of operations queued on streams: complete once every one of them is queued (their
// ends recorded); then wait() makes the caller's current stream wait for those ends, synchronize()
// makes it wait and waits on the host too (a wait that braid's kernels give up becomes an
// exception naming it, through the communicators' asynchronous errors), and the future, made for
// the device, completes on the streams (its callbacks' streams wait for them, as NCCL's).
class CudaWork : public c10d::Work {
 public:
  CudaWork(std::vector<at::Tensor> outputs, c10::Device device, std::chrono::milliseconds timeout);

  // A batch's tensors, known once the batch ends (before it completes).
  void setOutputs(std::vector<at::Tensor> outputs) { outputs_ = std::move(outputs); }
  // An operation is queued on `stream` of `comm`: its end recorded there. Any thread.
  void recordEnd(const c10::cuda::CUDAStream& stream, braidComm_t comm);
  // Every operation is queued (or one failed with `error`): the Work and its future complete.
  void complete(std::exception_ptr error);
  // A barrier's Work: wait() waits on the host too, as ProcessGroupNCCL's barrier, so that when
  // it returns every collective queued before the barrier has ended.
  void waitOnHost() { waitsOnHost_ = true; }

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;
  void blockCurrentStream() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  struct End {
    std::unique_ptr<StreamEvent> event;
    cudaStream_t stream;
    braidComm_t comm;
  };
  std::vector<End*> ends() const;
  // Where an end's communicator reports a failure (a kernel that gave up its wait ends too, its
  // outputs unwritten), the Work's exception, as ProcessGroupNCCL's watchdog sets one.
  void takeKernelFailures();
  void completeFutureOnStreams();
  void awaitQueued(std::chrono::milliseconds timeout);
  void blockCurrentStreamOnEnds() const;
  // Raises a failure the ends' communicators report, or "Timed out" after `limit` (0: none).
  void awaitEndsOnHost(std::chrono::milliseconds limit);

  std::vector<at::Tensor> outputs_;
  c10::Device device_;
  std::chrono::milliseconds timeout_;
  bool waitsOnHost_ = false;  // set before the Work is handed out
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  mutable std::mutex endsMutex_;
  std::vector<std::unique_ptr<End>> ends_;  // under endsMutex_
};

// The group's CUDA communicator on one device, made on the group's first collective of CUDA
// tensors (on every rank alike; its id under the group instance's keyPrefix), with the stream
// its collectives run on.
class CudaCollectives {
 public:
  CudaCollectives(c10d::Store& store, const std::string& keyPrefix, int rank, int size,
                  std::chrono::milliseconds timeout, c10::Device device);
  ~CudaCollectives();
  CudaCollectives(const CudaCollectives&) = delete;
  CudaCollectives& operator=(const CudaCollectives&) = delete;

  // The Work ends after what is queued on the stream now, too.
  void recordEnd(CudaWork& work) { work.recordEnd(stream_, comm_); }

  // Runs body(Where) on this thread with the communicator's stream current, after the caller's
  // current stream has run what it queued before; every tensor in `used` is recorded on the stream
  // (the caching allocator keeps its memory until the stream has used it). The Work ends when the
  // stream has run what body queued. What body throws reaches the caller.
  template <typename Body>
  c10::intrusive_ptr<CudaWork> run(std::vector<at::Tensor> outputs,
                                   const std::vector<at::Tensor>& used, Body body) {
    c10::cuda::CUDAGuard onDevice(device_);
    follow(c10::cuda::getCurrentCUDAStream(device_.index()));
    // Before body: a call that fails part way has queued work on some of them.
    for (const at::Tensor& t : used) t.record_stream(stream_.unwrap());
    {
      c10::cuda::CUDAStreamGuard onStream(stream_);
      at::NoGradGuard noGrad;
      body(Where{comm_, stream_.stream()});
    }
    auto work = c10::make_intrusive<CudaWork>(std::move(outputs), device_, timeout_);
    work->recordEnd(stream_, comm_);
    work->complete(nullptr);
    return work;
  }

 private:
  void follow(const c10::cuda::CUDAStream& caller);

  c10::Device device_;
  std::chrono::milliseconds timeout_;
  c10::cuda::CUDAStream stream_;
  braidComm_t comm_ = nullptr;
};

// The streams of the CUDA point-to-point channels, one per peer and direction, made on first use
// on the backend's CUDA device (a send and a receive on one stream would wait for each other as on
// one communicator).
class ChannelStreams {
 public:
  c10::cuda::CUDAStream of(int peer, bool send);
  void synchronize();  // waits for what every channel's stream was given

 private:
  std::mutex mutex_;
  std::map<std::pair<int, bool>, c10::cuda::CUDAStream> streams_;  // under mutex_
};

}  // namespace braid_torch
