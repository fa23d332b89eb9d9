#include "cuda_side.h"

#include <string>
#include <thread>

namespace braid_torch {
namespace {

// torch's "no timeout" for Work::wait (kNoTimeout, whose namespace differs between versions).
constexpr std::chrono::milliseconds kUntilDone{0};

void checkCuda(cudaError_t error, const char* what) {
  TORCH_CHECK(error == cudaSuccess, "braid backend: ", what, " failed: ", cudaGetErrorName(error),
              " (", cudaGetErrorString(error), ")");
}

}  // namespace

StreamEvent::StreamEvent() {
  checkCuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
}

StreamEvent::~StreamEvent() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

void StreamEvent::record(cudaStream_t stream) {
  checkCuda(cudaEventRecord(event_, stream), "cudaEventRecord");
}

void StreamEvent::makeWait(cudaStream_t stream) const {
  checkCuda(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
}

bool StreamEvent::reached() const {
  const cudaError_t state = cudaEventQuery(event_);
  if (state == cudaErrorNotReady) return false;
  checkCuda(state, "cudaEventQuery");
  return true;
}

c10::cuda::CUDAStream newStream(c10::DeviceIndex device) {
  if (device < 0) device = c10::cuda::current_device();
  c10::cuda::CUDAGuard onDevice(device);
  cudaStream_t stream = nullptr;
  checkCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return c10::cuda::getStreamFromExternal(stream, device);
}

CudaWork::CudaWork(std::vector<at::Tensor> outputs, c10::Device device,
                   std::chrono::milliseconds timeout)
    : outputs_(std::move(outputs)),
      device_(device),
      timeout_(timeout),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{device})) {}

void CudaWork::recordEnd(const c10::cuda::CUDAStream& stream, braidComm_t comm) {
  c10::cuda::CUDAGuard onDevice(device_);
  auto end = std::make_unique<End>(End{std::make_unique<StreamEvent>(), stream.stream(), comm});
  end->event->record(stream.stream());
  std::lock_guard<std::mutex> lock(endsMutex_);
  ends_.push_back(std::move(end));
}

std::vector<CudaWork::End*> CudaWork::ends() const {  // each lives as long as the Work
  std::lock_guard<std::mutex> lock(endsMutex_);
  std::vector<End*> all;
  for (const auto& end : ends_) all.push_back(end.get());
  return all;
}

void CudaWork::complete(std::exception_ptr error) {
  finish(error);
  if (error) return future_->setError(error);
  try {
    completeFutureOnStreams();
  } catch (...) {  // a CUDA error: raised by the future, not on whichever thread completes it
    future_->setError(std::current_exception());
  }
}

// The future completes on a stream that has waited for every end (its events recorded there): a
// stream made for it where operations ended on several, let go once it is given its waits (a
// channel's stream made to wait for another channel would hold back that channel's later
// operations; a stream shared by Works would make each wait for the others).
void CudaWork::completeFutureOnStreams() {
  c10::cuda::CUDAGuard onDevice(device_);
  const std::vector<End*> all = ends();
  if (all.size() == 1) {
    c10::cuda::CUDAStreamGuard onStream(
        c10::cuda::getStreamFromExternal(all[0]->stream, device_.index()));
    future_->markCompleted(c10::IValue(outputs_));
    return;
  }
  const c10::cuda::CUDAStream join = newStream(device_.index());
  for (End* end : all) end->event->makeWait(join.stream());
  {
    c10::cuda::CUDAStreamGuard onStream(join);
    future_->markCompleted(c10::IValue(outputs_));
  }
  cudaStreamDestroy(join.stream());  // CUDA frees it once what it was given has run
}

bool CudaWork::isCompleted() {
  if (!c10d::Work::isCompleted()) return false;
  if (exception()) return true;
  c10::cuda::CUDAGuard onDevice(device_);
  for (End* end : ends())
    if (!end->event->reached()) return false;
  takeKernelFailures();
  return true;
}

void CudaWork::takeKernelFailures() {
  for (End* end : ends()) {
    braidResult_t state = braidSuccess;
    const braidResult_t asked = braidCommGetAsyncError(end->comm, &state);
    const braidResult_t failed = asked != braidSuccess ? asked : state;
    if (failed == braidSuccess || failed == braidInProgress) continue;
    std::lock_guard<std::mutex> lock(mutex_);
    if (exception_) return;
    try {
      check(end->comm, failed, "a queued operation");
    } catch (...) {
      exception_ = std::current_exception();
    }
    return;
  }
}

void CudaWork::blockCurrentStreamOnEnds() const {
  c10::cuda::CUDAGuard onDevice(device_);
  const cudaStream_t current = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
  for (End* end : ends()) end->event->makeWait(current);
}

// c10d::Work::wait would call synchronize(), which waits on the host.
void CudaWork::awaitQueued(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kUntilDone)
    cv_.wait(lock, [&] { return completed_; });
  else
    TORCH_CHECK(cv_.wait_for(lock, timeout, [&] { return completed_; }),
                "braid backend: a CUDA operation was not queued within ", timeout.count(), " ms");
  if (exception_) std::rethrow_exception(exception_);
}

bool CudaWork::wait(std::chrono::milliseconds timeout) {
  awaitQueued(timeout);
  blockCurrentStreamOnEnds();
  if (waitsOnHost_) awaitEndsOnHost(timeout == kUntilDone ? timeout_ : timeout);
  return true;
}

// torch's default blocks the stream until the future completes, which is when the operations are
// queued, not when they end.
void CudaWork::blockCurrentStream() {
  awaitQueued(kUntilDone);
  blockCurrentStreamOnEnds();
}

void CudaWork::synchronize() {
  awaitQueued(kUntilDone);
  blockCurrentStreamOnEnds();
  awaitEndsOnHost(timeout_);
}

// Polls rather than blocks in cudaEventSynchronize: a kernel that gives up its wait ends, and its
// communicator's asynchronous error then says why, which is raised here, also where the kernel
// had ended before the first look (isCompleted takes the failure then).
void CudaWork::awaitEndsOnHost(std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::chrono::microseconds pause(10);
  while (!isCompleted()) {
    takeKernelFailures();  // one end's failure ends the wait, while the others may still run
    if (exception()) break;
    if (limit.count() > 0 && std::chrono::steady_clock::now() >= deadline)
      failBackend("braid backend: Timed out: a CUDA operation did not end within " +
                  std::to_string(limit.count()) + " ms");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
  if (const std::exception_ptr failure = exception()) std::rethrow_exception(failure);
}

CudaCollectives::CudaCollectives(c10d::Store& store, const std::string& keyPrefix, int rank,
                                 int size, std::chrono::milliseconds timeout, c10::Device device)
    : device_(device), timeout_(timeout), stream_(newStream(device.index())) {
  c10::cuda::CUDAGuard onDevice(device_);  // the communicator's device is the current one
  comm_ = commThroughStore(
      store, keyPrefix + "cuda_unique_id", rank, size, commConfig("cuda", "torch-cuda", timeout),
      timeout,
      "rank " + std::to_string(rank) + " waited for rank 0's first collective of CUDA tensors",
      "braidCommInitRankConfig (CUDA communicator)");
}

// What was queued runs to its end (each of braid's waits is bounded) before the communicator goes.
// The stream stays: the caching allocator records events on it when tensors recorded there are
// freed, which may be later.
CudaCollectives::~CudaCollectives() {
  c10::cuda::CUDAGuard onDevice(device_);
  cudaStreamSynchronize(stream_.stream());
  braidCommDestroy(comm_);
}

void CudaCollectives::follow(const c10::cuda::CUDAStream& caller) {
  StreamEvent queued;
  queued.record(caller.stream());
  queued.makeWait(stream_.stream());
}

c10::cuda::CUDAStream ChannelStreams::of(int peer, bool send) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = streams_.find({peer, send});
  if (found == streams_.end()) found = streams_.emplace(std::pair{peer, send}, newStream()).first;
  return found->second;
}

void ChannelStreams::synchronize() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, stream] : streams_) {
    c10::cuda::CUDAGuard onDevice(stream.device_index());
    cudaStreamSynchronize(stream.stream());
  }
}

}  // namespace braid_torch
