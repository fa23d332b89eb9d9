// How the braid backend's operations run: each returns a Work at once and runs on a thread of its
// queue (or on the caller's thread), completing the Work there.
#pragma once

#include <ATen/ThreadLocalState.h>
#include <torch/extension.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>
#include <vector>

namespace braid_torch {

// An operation queued on a thread of the backend's: pending until that thread has run it, then
// complete with its outputs, or with braid's error, which wait() (as every blocking
// torch.distributed call makes) and the future raise.
class AsyncWork : public c10d::Work {
 public:
  explicit AsyncWork(std::vector<at::Tensor> outputs)
      : outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}
  // The Work first, so that the future's callbacks see it completed.
  void complete(std::exception_ptr error) {
    finish(error);
    if (error)
      future_->setError(error);
    else
      future_->markCompleted(c10::IValue(outputs_));
  }
  // A batch's tensors, known once the batch ends (before it completes).
  void setOutputs(std::vector<at::Tensor> outputs) { outputs_ = std::move(outputs); }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The body to run on another thread under the inference mode of the thread that makes it (the
// caller's, whichever thread runs it: an inference tensor may be written only in inference mode)
// and without grad (moving data is nothing autograd records: a leaf that requires grad is written
// like any tensor).
template <typename Body>
std::function<void()> withCallerState(Body body) {
  return [body = std::move(body), state = at::ThreadLocalState()]() mutable {
    at::ThreadLocalStateGuard guard(state);
    at::NoGradGuard noGrad;
    body();
  };
}

// The body as an operation (withCallerState) that completes `work` with the body's error, if any.
template <typename Body>
std::function<void()> completing(c10::intrusive_ptr<AsyncWork> work, Body body) {
  return withCallerState([work = std::move(work), body = std::move(body)]() mutable {
    std::exception_ptr error;
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
    work->complete(error);
  });
}

// Operations in issue order and one at a time: on a thread of their own, so that the caller goes
// on (DDP's backward pass while its buckets are reduced) until it waits; or, for a call that will
// be waited for at once, on the caller's thread when nothing is queued (a hand-over to another
// thread costs more than a small all-reduce). Drains when it closes; refuses operations after.
class OperationQueue {
 public:
  OperationQueue() : thread_([this] { loop(); }) {}
  ~OperationQueue() { close(); }

  // Runs what is queued (what those operations push meanwhile is refused), then ends the thread.
  void close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (onQueueThread()) return;
    // One joiner: exit's shutdown and torch's destroy_process_group may close at once.
    std::lock_guard<std::mutex> joining(joinMutex_);
    if (thread_.joinable()) thread_.join();
  }

  // Queues op; false (op dropped) once the queue has closed.
  [[nodiscard]] bool push(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return false;
      ops_.push_back(std::move(op));
    }
    wake_.notify_all();
    return true;
  }

  // Whether the caller is the queue's thread (a future's callback, run as an operation completes).
  bool onQueueThread() const { return std::this_thread::get_id() == thread_.get_id(); }

  // Runs op here if nothing is queued or running and the queue is open; false (op not run)
  // otherwise.
  bool runHereIfIdle(const std::function<void()>& op) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_ || running_ || !ops_.empty()) return false;
      running_ = true;
    }
    op();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
    }
    wake_.notify_all();
    return true;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> op;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return (stop_ || !ops_.empty()) && !running_; });
        if (ops_.empty()) return;
        op = std::move(ops_.front());
        ops_.pop_front();
        running_ = true;
      }
      op();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        running_ = false;
      }
      wake_.notify_all();
    }
  }

  std::mutex mutex_;
  std::mutex joinMutex_;  // close()'s join
  std::condition_variable wake_;
  std::deque<std::function<void()>> ops_;
  bool running_ = false;  // an operation runs, on either thread
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest exists
};

}  // namespace braid_torch
