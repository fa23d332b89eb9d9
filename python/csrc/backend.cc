// braid as a torch.distributed backend: a c10d::Backend over one braid communicator of CPU
// ranks. The communicator's unique id travels through the group's c10d store; every operation
// is queued on the backend's thread, where it runs braid's blocking call, and returns a Work that
// completes there (or holds braid's error, which wait() and its future raise with braid's
// sentence).
#include <ATen/ThreadLocalState.h>
#include <pybind11/chrono.h>
#include <torch/extension.h>

#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Utils.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "braid/braid.h"

namespace braid_torch {
namespace {

braidDataType_t braidType(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return braidFloat32;
    case at::kDouble: return braidFloat64;
    case at::kHalf: return braidFloat16;
    case at::kBFloat16: return braidBfloat16;
    case at::kChar: return braidInt8;
    case at::kByte:
    case at::kBool: return braidUint8;
    case at::kInt: return braidInt32;
    case at::kLong: return braidInt64;
    case at::kFloat8_e4m3fn: return braidFloat8e4m3;
    case at::kFloat8_e5m2: return braidFloat8e5m2;
    default:
      throw std::invalid_argument("braid backend: tensors of type " +
                                  std::string(c10::toString(t.scalar_type())) +
                                  " are not supported (expected a float, integer or bool type)");
  }
}

// A tensor as a braid call reads and writes it: itself when contiguous on the CPU, else a
// contiguous copy whose contents are copied back where it is an output (as torch's own backends).
struct Flat {
  at::Tensor user, flat;
  explicit Flat(const at::Tensor& t) : user(t) {
    TORCH_CHECK(t.device().is_cpu(), "braid backend: tensor on ", t.device(),
                " (expected a CPU tensor; CUDA tensors "
                "go through CUDA communicators, not yet wired to this backend)");
    flat = t.is_contiguous() ? t : t.contiguous();
  }
  void* data() const { return flat.data_ptr(); }
  size_t count() const { return static_cast<size_t>(flat.numel()); }
  void writeBack() {
    if (!flat.is_same(user)) user.copy_(flat);
  }
};

// An operation queued on the backend's thread: pending until that thread has run it, then
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
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The backend's operations, in issue order and one at a time: on a thread of their own, so that
// the caller goes on (DDP's backward pass while its buckets are reduced) until it waits; or, for
// a call that will be waited for at once, on the caller's thread when nothing is queued (a
// hand-over to another thread costs more than a small all-reduce). Drains before it ends.
class OperationQueue {
 public:
  OperationQueue() : thread_([this] { loop(); }) {}
  ~OperationQueue() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void push(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ops_.push_back(std::move(op));
    }
    wake_.notify_all();
  }
  // Whether the caller is the queue's thread (a future's callback, run as an operation completes).
  bool onQueueThread() const { return std::this_thread::get_id() == thread_.get_id(); }

  // Runs op here if nothing is queued or running; false (op not run) otherwise.
  bool runHereIfIdle(const std::function<void()>& op) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (running_ || !ops_.empty()) return false;
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
  std::condition_variable wake_;
  std::deque<std::function<void()>> ops_;
  bool running_ = false;  // an operation runs, on either thread
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest exists
};

class BraidBackend : public c10d::Backend {
 public:
  BraidBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
               std::chrono::milliseconds timeout)
      : c10d::Backend(rank, size) {
    braidUniqueId id;
    const std::string key = "braid_torch/unique_id";
    if (rank == 0) {
      check(braidGetUniqueId(&id), "braidGetUniqueId");
      store->set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof id.internal));
    } else {
      const std::vector<uint8_t> bytes = store->get(key);
      TORCH_CHECK(bytes.size() == sizeof id.internal, "braid backend: the store's unique id has ",
                  bytes.size(), " bytes (expected ", sizeof id.internal, ")");
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    braidConfig_t config = BRAID_CONFIG_INITIALIZER;
    config.device = "cpu";
    config.commName = "torch";
    if (timeout.count() > 0)
      config.timeoutMs = static_cast<int>(std::min<int64_t>(timeout.count(), INT_MAX));
    check(braidCommInitRankConfig(&comm_, size, id, rank, &config), "braidCommInitRankConfig");
  }
  ~BraidBackend() override {
    stopQueue();
    if (comm_ != nullptr) braidCommDestroy(comm_);
  }

  // destroy_process_group: every queued operation runs, then the queue's thread ends, while the
  // interpreter is whole (that thread takes the GIL to release tensors Python also holds; at
  // exit the interpreter would end it there instead).
  void shutdown() override { stopQueue(); }

  const std::string getBackendName() const override { return "braid"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return run(tensors, opts.asyncOp, [=, this]() mutable {
      for (const at::Tensor& t : tensors) {
        Flat f(t);
        if (isBitwise(opts.reduceOp))
          f.flat.copy_(bitwiseOverRanks(f.flat, opts.reduceOp).view_as(f.flat));
        else
          reduceCall(t, opts.reduceOp, [&](braidRedOp_t op) {
            return braidAllReduce(f.data(), f.data(), f.count(), braidType(t), op, comm_, nullptr);
          });
        f.writeBack();
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    return allreduce(tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return run(tensors, opts.asyncOp, [=, this]() mutable {
      for (const at::Tensor& t : tensors) {
        Flat f(t);
        check(braidBroadcast(f.data(), f.data(), f.count(), braidType(t),
                             static_cast<int>(opts.rootRank), comm_, nullptr),
              "braidBroadcast");
        f.writeBack();
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    return run(tensors, opts.asyncOp, [=, this]() mutable {
      for (const at::Tensor& t : tensors) {
        Flat f(t);
        if (isBitwise(opts.reduceOp)) {
          at::Tensor reduced = bitwiseOverRanks(f.flat, opts.reduceOp);
          if (rank_ == opts.rootRank) f.flat.copy_(reduced.view_as(f.flat));
        } else {
          reduceCall(t, opts.reduceOp, [&](braidRedOp_t op) {
            return braidReduce(f.data(), f.data(), f.count(), braidType(t), op,
                               static_cast<int>(opts.rootRank), comm_, nullptr);
          });
        }
        f.writeBack();
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1,
                "braid backend: allgather takes one input and one list of outputs");
    return allgather_coalesced(outputs, inputs, opts);
  }

  // Input i gathered into the list outputs[i] (a tensor per rank).
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    std::vector<at::Tensor> results;
    for (auto& list : outputs) results.insert(results.end(), list.begin(), list.end());
    TORCH_CHECK(outputs.size() == inputs.size(), "braid backend: ", inputs.size(), " inputs but ",
                outputs.size(), " output lists");
    for (size_t i = 0; i < inputs.size(); ++i)
      TORCH_CHECK(outputs[i].size() == static_cast<size_t>(size_),
                  "braid backend: ", outputs[i].size(), " outputs for input ", i, " (expected ",
                  size_, ")");
    return run(results, opts.asyncOp, [=, this]() mutable {
      for (size_t i = 0; i < inputs.size(); ++i) {
        const at::Tensor in = inputs[i].contiguous().reshape({-1});
        at::Tensor gathered = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
        allGatherInto(gathered, in);
        for (int r = 0; r < size_; ++r)
          outputs[i][r].copy_(
              gathered.narrow(0, r * in.numel(), in.numel()).view(outputs[i][r].sizes()));
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    std::vector<at::Tensor> results{output};
    return run(results, opts.asyncOp, [=, this]() mutable { allGatherInto(output, input); });
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    return run(outputs, opts.asyncOp, [=, this]() mutable {
      for (size_t i = 0; i < outputs.size(); ++i) allGatherInto(outputs[i], inputs[i]);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    // Checked here, on every rank alike, not where the operation runs.
    TORCH_CHECK(
        outputs.size() == 1 && inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(size_),
        "braid backend: reduce_scatter takes one output and a list of ", size_, " inputs");
    for (const at::Tensor& t : inputs[0])
      TORCH_CHECK(t.numel() == outputs[0].numel(), "braid backend: reduce_scatter input of ",
                  t.numel(), " elements (expected the output's ", outputs[0].numel(), ")");
    return run(outputs, opts.asyncOp, [=, this]() mutable {
      std::vector<at::Tensor> flat;
      for (const at::Tensor& t : inputs[0]) flat.push_back(t.reshape({-1}));
      at::Tensor input = at::cat(flat);
      reduceScatterInto(outputs[0], input, opts.reduceOp);
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    std::vector<at::Tensor> results{output};
    return run(results, opts.asyncOp,
               [=, this]() mutable { reduceScatterInto(output, input, opts.reduceOp); });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    return run(outputs, opts.asyncOp, [=, this]() mutable {
      for (size_t i = 0; i < outputs.size(); ++i)
        reduceScatterInto(outputs[i], inputs[i], opts.reduceOp);
    });
  }

  // Even or uneven splits (in elements of the first dimension), as grouped sends and receives.
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override {
    c10d::checkSplitSizes(inputSplits, input, size_);
    c10d::checkSplitSizes(outputSplits, output, size_);
    const braidDataType_t type = braidType(input);
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "braid backend: all_to_all output ",
                output.scalar_type(), " and input ", input.scalar_type(), " differ");
    auto rowsOf = [&](const std::vector<int64_t>& given, const at::Tensor& t) {
      return given.empty() ? std::vector<int64_t>(size_, t.size(0) / size_) : given;
    };
    const std::vector<int64_t> inRows = rowsOf(inputSplits, input),
                               outRows = rowsOf(outputSplits, output);
    std::vector<at::Tensor> results{output};
    return run(results, opts.asyncOp, [=, this]() mutable {
      Flat in(input), out(output);
      const int64_t inRow = input.size(0) == 0 ? 0 : input.numel() / input.size(0);
      const int64_t outRow = output.size(0) == 0 ? 0 : output.numel() / output.size(0);
      const size_t elem = in.flat.element_size();
      std::vector<Transfer> transfers;
      int64_t inAt = 0, outAt = 0;
      for (int p = 0; p < size_; ++p) {
        transfers.push_back({true, static_cast<char*>(in.data()) + inAt * inRow * elem,
                             static_cast<size_t>(inRows[p] * inRow), type, p});
        transfers.push_back({false, static_cast<char*>(out.data()) + outAt * outRow * elem,
                             static_cast<size_t>(outRows[p] * outRow), type, p});
        inAt += inRows[p];
        outAt += outRows[p];
      }
      exchange(transfers, "all_to_all");
      out.writeBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    TORCH_CHECK(inputs.size() == static_cast<size_t>(size_) && outputs.size() == inputs.size(),
                "braid backend: all_to_all takes ", size_, " inputs and ", size_, " outputs (got ",
                inputs.size(), " and ", outputs.size(), ")");
    for (int p = 0; p < size_; ++p) {  // unsupported types refused here, on every rank alike
      braidType(inputs[p]);
      braidType(outputs[p]);
    }
    return run(outputs, opts.asyncOp, [=, this]() mutable {
      std::vector<Flat> in, out;
      for (const at::Tensor& t : inputs) in.emplace_back(t);
      for (const at::Tensor& t : outputs) out.emplace_back(t);
      std::vector<Transfer> transfers;
      for (int p = 0; p < size_; ++p) {
        transfers.push_back({true, in[p].data(), in[p].count(), braidType(inputs[p]), p});
        transfers.push_back({false, out[p].data(), out[p].count(), braidType(outputs[p]), p});
      }
      exchange(transfers, "all_to_all");
      for (Flat& f : out) f.writeBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const int root = static_cast<int>(opts.rootRank);
    TORCH_CHECK(inputs.size() == 1, "braid backend: gather takes one input");
    TORCH_CHECK(rank_ != root || (outputs.size() == 1 && outputs[0].size() == size_t(size_)),
                "braid backend: gather's root takes a list of ", size_, " outputs");
    const braidDataType_t type = braidType(inputs[0]);
    std::vector<at::Tensor> results;
    for (auto& list : outputs) results.insert(results.end(), list.begin(), list.end());
    return run(results, opts.asyncOp, [=, this]() mutable {
      Flat in(inputs[0]);
      std::vector<Flat> out;
      std::vector<Transfer> transfers;
      if (rank_ == root) {
        for (const at::Tensor& t : outputs[0]) out.emplace_back(t);
        for (int p = 0; p < size_; ++p)
          transfers.push_back({false, out[p].data(), out[p].count(), type, p});
      }
      transfers.push_back({true, in.data(), in.count(), type, root});
      exchange(transfers, "gather");
      for (Flat& f : out) f.writeBack();
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const int root = static_cast<int>(opts.rootRank);
    TORCH_CHECK(outputs.size() == 1, "braid backend: scatter takes one output");
    TORCH_CHECK(rank_ != root || (inputs.size() == 1 && inputs[0].size() == size_t(size_)),
                "braid backend: scatter's root takes a list of ", size_, " inputs");
    const braidDataType_t type = braidType(outputs[0]);
    return run(outputs, opts.asyncOp, [=, this]() mutable {
      Flat out(outputs[0]);
      std::vector<Flat> in;
      std::vector<Transfer> transfers;
      if (rank_ == root) {
        for (const at::Tensor& t : inputs[0]) in.emplace_back(t);
        for (int p = 0; p < size_; ++p)
          transfers.push_back({true, in[p].data(), in[p].count(), type, p});
      }
      transfers.push_back({false, out.data(), out.count(), type, root});
      exchange(transfers, "scatter");
      out.writeBack();
    });
  }

  // A send or receive alone waits for its peer on the backend's thread; between startCoalescing
  // and endCoalescing (batch_isend_irecv) they wait and run together, as one braid group, so
  // that no order among them can deadlock.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override {
    return pointToPoint(true, tensors.at(0), dstRank);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override {
    return pointToPoint(false, tensors.at(0), srcRank);
  }

  bool supportsCoalescing() const override { return true; }

  void startCoalescing() override {
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    coalescing_ = true;
  }

  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    std::vector<PointToPoint> ops;
    {
      std::lock_guard<std::mutex> lock(coalescingMutex_);
      coalescing_ = false;
      ops.swap(coalesced_);
    }
    std::vector<at::Tensor> tensors;
    for (const PointToPoint& op : ops) tensors.push_back(op.tensor);
    return run(tensors, true, [=, this]() mutable {
      std::exception_ptr error;
      try {
        runPointToPoint(ops);
      } catch (...) {
        error = std::current_exception();
      }
      for (PointToPoint& op : ops) op.work->complete(error);
      if (error) std::rethrow_exception(error);
    });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    std::vector<at::Tensor> none;
    return run(none, opts.asyncOp, [=, this]() mutable {
      uint8_t byte = 0;
      check(braidAllReduce(&byte, &byte, 1, braidUint8, braidSum, comm_, nullptr),
            "barrier (braidAllReduce)");
    });
  }

 private:
  void check(braidResult_t result, const char* what) const {
    if (result != braidSuccess)
      throw std::runtime_error(std::string("braid backend: ") + what + " failed: " +
                               braidGetErrorString(result) + ": " + braidGetLastError(comm_));
  }

  // Drains and ends the operation queue; the GIL, if this thread holds it, is let go meanwhile.
  void stopQueue() {
    if (queue_ == nullptr) return;
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release released;
      queue_.reset();
    } else {
      queue_.reset();
    }
  }

  // Runs the body (which holds copies of what it uses) on the operation queue, or here when the
  // call is not asynchronous and nothing is queued; the Work completes with `outputs`, or with
  // the error the body threw.
  template <typename Body>
  c10::intrusive_ptr<c10d::Work> run(std::vector<at::Tensor> outputs, bool asyncOp, Body body) {
    TORCH_CHECK(queue_ != nullptr, "braid backend: the process group was shut down");
    auto work = c10::make_intrusive<AsyncWork>(std::move(outputs));
    // The caller's grad and inference modes go with the operation to the queue's thread.
    std::function<void()> op = [work, body, state = at::ThreadLocalState()]() mutable {
      at::ThreadLocalStateGuard guard(state);
      std::exception_ptr error;
      try {
        body();
      } catch (...) {
        error = std::current_exception();
      }
      work->complete(error);
    };
    // An operation a completing one's callback issues (PowerSGD's hook) runs at once: queued
    // behind that callback, on the queue's only thread, it would wait for ever.
    if (queue_->onQueueThread())
      op();
    else if (asyncOp || !queue_->runHereIfIdle(op))
      queue_->push(std::move(op));
    return work;
  }

  struct PointToPoint {
    bool send;
    at::Tensor tensor;
    int peer;
    c10::intrusive_ptr<AsyncWork> work;  // the caller's, completed with the group
  };

  c10::intrusive_ptr<c10d::Work> pointToPoint(bool send, const at::Tensor& tensor, int peer) {
    {
      std::lock_guard<std::mutex> lock(coalescingMutex_);
      if (coalescing_) {
        auto work = c10::make_intrusive<AsyncWork>(std::vector<at::Tensor>{tensor});
        coalesced_.push_back({send, tensor, peer, work});
        return work;
      }
    }
    std::vector<PointToPoint> ops{{send, tensor, peer, nullptr}};
    return run({tensor}, true, [=, this]() mutable { runPointToPoint(ops); });
  }

  void runPointToPoint(std::vector<PointToPoint>& ops) {
    std::vector<Flat> flats;
    std::vector<Transfer> transfers;
    for (const PointToPoint& op : ops) flats.emplace_back(op.tensor);
    for (size_t i = 0; i < ops.size(); ++i)
      transfers.push_back(
          {ops[i].send, flats[i].data(), flats[i].count(), braidType(flats[i].flat), ops[i].peer});
    exchange(transfers, "send/recv");
    for (size_t i = 0; i < ops.size(); ++i)
      if (!ops[i].send) flats[i].writeBack();
  }

  // One braid group of sends and receives, everything about them worked out before it opens (a
  // failure then leaves no group open on this thread), every call's result checked.
  struct Transfer {
    bool send;
    void* data;
    size_t count;
    braidDataType_t type;
    int peer;
  };
  void exchange(const std::vector<Transfer>& transfers, const char* what) {
    check(braidGroupStart(), "braidGroupStart");
    braidResult_t first = braidSuccess;
    std::string firstError;
    for (const Transfer& t : transfers) {
      const braidResult_t r = t.send ? braidSend(t.data, t.count, t.type, t.peer, comm_, nullptr)
                                     : braidRecv(t.data, t.count, t.type, t.peer, comm_, nullptr);
      if (r != braidSuccess && first == braidSuccess) {
        first = r;
        firstError = braidGetLastError(comm_);
      }
    }
    const braidResult_t ended = braidGroupEnd();
    if (first != braidSuccess)
      throw std::runtime_error(std::string("braid backend: ") + what +
                               " failed: " + braidGetErrorString(first) + ": " + firstError);
    check(ended, what);
  }

  static bool isBitwise(const c10d::ReduceOp& op) {
    return op.op_ == c10d::ReduceOp::BAND || op.op_ == c10d::ReduceOp::BOR ||
           op.op_ == c10d::ReduceOp::BXOR;
  }

  // BAND, BOR and BXOR, which braid has no operator for: every rank's input (contiguous)
  // gathered, then combined here in rank order, flat. Integer and bool tensors, as Gloo.
  at::Tensor bitwiseOverRanks(const at::Tensor& input, const c10d::ReduceOp& op) {
    TORCH_CHECK(!input.is_floating_point(), "braid backend: bitwise reduce op on a ",
                input.scalar_type(), " tensor (expected an integer or bool tensor)");
    at::Tensor all = at::empty({static_cast<int64_t>(size_), input.numel()}, input.options());
    check(braidAllGather(input.data_ptr(), all.data_ptr(), static_cast<size_t>(input.numel()),
                         braidType(input), comm_, nullptr),
          "braidAllGather (bitwise reduction)");
    at::Tensor reduced = all[0].clone();
    for (int r = 1; r < size_; ++r) {
      if (op.op_ == c10d::ReduceOp::BAND)
        reduced.bitwise_and_(all[r]);
      else if (op.op_ == c10d::ReduceOp::BOR)
        reduced.bitwise_or_(all[r]);
      else
        reduced.bitwise_xor_(all[r]);
    }
    return reduced;
  }

  // A reducing call with torch's operator: PREMUL_SUM as braid's PreMulSum operator with the
  // factor in the tensor's type.
  template <typename Call>
  void reduceCall(const at::Tensor& t, const c10d::ReduceOp& op, Call&& call) {
    if (t.scalar_type() == at::kBool) {  // as bytes 0 and 1: sum is any (max), product all (min)
      switch (op.op_) {
        case c10d::ReduceOp::SUM:
        case c10d::ReduceOp::MAX: return check(call(braidMax), "reduction");
        case c10d::ReduceOp::PRODUCT:
        case c10d::ReduceOp::MIN: return check(call(braidMin), "reduction");
        default:
          TORCH_CHECK(false, "braid backend: reduce op ", static_cast<int>(op.op_),
                      " on a bool tensor (expected SUM, PRODUCT, MIN, MAX or a bitwise op)");
      }
    }
    switch (op.op_) {
      case c10d::ReduceOp::SUM: return check(call(braidSum), "reduction");
      case c10d::ReduceOp::AVG: return check(call(braidAvg), "reduction");
      case c10d::ReduceOp::PRODUCT: return check(call(braidProd), "reduction");
      case c10d::ReduceOp::MIN: return check(call(braidMin), "reduction");
      case c10d::ReduceOp::MAX: return check(call(braidMax), "reduction");
      case c10d::ReduceOp::PREMUL_SUM: {
        auto* supplement = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
        TORCH_CHECK(supplement != nullptr, "braid backend: PREMUL_SUM without its factor");
        at::Tensor factor = supplement->tensor_factor.defined()
                                ? supplement->tensor_factor.to(at::kCPU, t.scalar_type())
                                : at::scalar_tensor(supplement->double_factor, t.options());
        braidRedOp_t premul;
        check(braidRedOpCreatePreMulSum(&premul, factor.data_ptr(), braidType(t),
                                        braidScalarHostImmediate, comm_),
              "braidRedOpCreatePreMulSum");
        const braidResult_t result = call(premul);
        braidRedOpDestroy(premul, comm_);
        return check(result, "reduction");
      }
      default:
        TORCH_CHECK(false, "braid backend: reduce op ", static_cast<int>(op.op_),
                    " is not supported (expected SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM, BAND, "
                    "BOR or BXOR)");
    }
  }

  void allGatherInto(at::Tensor& output, const at::Tensor& input) {
    Flat in(input), out(output);
    TORCH_CHECK(out.count() == in.count() * size_,
                "braid backend: all_gather_into_tensor output has ", out.count(),
                " elements (expected ", in.count() * size_, ")");
    check(braidAllGather(in.data(), out.data(), in.count(), braidType(input), comm_, nullptr),
          "braidAllGather");
    out.writeBack();
  }

  void reduceScatterInto(at::Tensor& output, const at::Tensor& input, const c10d::ReduceOp& op) {
    Flat in(input), out(output);
    TORCH_CHECK(in.count() == out.count() * size_, "braid backend: reduce_scatter input has ",
                in.count(), " elements (expected ", out.count() * size_, ")");
    if (isBitwise(op)) {
      const int64_t n = out.flat.numel();
      out.flat.copy_(bitwiseOverRanks(in.flat, op).narrow(0, rank_ * n, n).view_as(out.flat));
    } else {
      reduceCall(output, op, [&](braidRedOp_t o) {
        return braidReduceScatter(in.data(), out.data(), out.count(), braidType(output), o, comm_,
                                  nullptr);
      });
    }
    out.writeBack();
  }

  braidComm_t comm_ = nullptr;
  std::mutex coalescingMutex_;
  bool coalescing_ = false;              // under coalescingMutex_
  std::vector<PointToPoint> coalesced_;  // under coalescingMutex_
  std::unique_ptr<OperationQueue> queue_ = std::make_unique<OperationQueue>();
};

c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int size,
                                                const std::chrono::duration<float>& timeout) {
  return c10::make_intrusive<BraidBackend>(
      store, rank, size, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

}  // namespace
}  // namespace braid_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("create_backend", &braid_torch::createBackend, py::call_guard<py::gil_scoped_release>(),
        "A braid communicator of this group's ranks as a c10d backend");
}
