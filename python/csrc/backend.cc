// braid as a torch.distributed backend: a c10d::Backend over one braid communicator of CPU
// ranks, and one of CUDA ranks for CUDA tensors. The communicators' unique ids travel through the
// group's c10d store. An operation on CPU tensors is queued on the backend's thread, where it runs
// braid's blocking call, and returns a Work that completes there (or holds braid's error, which
// wait() and its future raise with braid's sentence); one on CUDA tensors is queued on the CUDA
// communicator's stream (cuda_side.h).
#include <pybind11/chrono.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Utils.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "braid/braid.h"
#include "common.h"
#include "mailbox.h"
#include "operation_queue.h"
#include "peer_channels.h"
#include "sparse.h"
#ifdef BRAID_TORCH_CUDA
#include "cuda_side.h"
#endif

namespace braid_torch {
namespace {

// The tensors as one flat tensor: a view of the one tensor where it can be, else a copy, so
// that a tensor listed twice is reduced once.
at::Tensor flattened(const std::vector<at::Tensor>& tensors) {
  if (tensors.size() == 1) return tensors[0].reshape({-1});
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

// The flat tensor's consecutive pieces copied into the tensors, each in its own shape.
void copyPieces(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  int64_t at = 0;
  for (const at::Tensor& t : tensors) {
    t.copy_(flat.narrow(0, at, t.numel()).view(t.sizes()));
    at += t.numel();
  }
}

// Refused on the caller's thread, on every rank alike: a list of dense tensors of one type.
void checkOneType(const std::vector<at::Tensor>& tensors, const at::Tensor& like,
                  const char* what) {
  for (size_t i = 0; i < tensors.size(); ++i)
    TORCH_CHECK(
        tensors[i].scalar_type() == like.scalar_type() && tensors[i].layout() == at::kStrided,
        "braid backend: ", what, " tensor ", i, " is a ", tensors[i].layout(), " ",
        tensors[i].scalar_type(), " tensor (expected a dense ", like.scalar_type(),
        " tensor like the others)");
}

// Completes a Work when the last of n operations has ended, with the first error among them.
template <typename WorkType>
class CompletesAfter {
 public:
  CompletesAfter(c10::intrusive_ptr<WorkType> work, size_t n) : work_(std::move(work)), left_(n) {}
  void ended(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error && !first_) first_ = error;
      if (--left_ != 0) return;
    }
    work_->complete(first_);
  }

 private:
  c10::intrusive_ptr<WorkType> work_;
  std::mutex mutex_;
  size_t left_;               // under mutex_
  std::exception_ptr first_;  // under mutex_
};

// The process's live backends, so that a process that ends without destroy_process_group still
// has their queues' threads end while the interpreter is whole (shutdownAll, from Python's
// atexit). Left to the interpreter's end, a thread releasing a tensor Python also holds takes the
// GIL, which then ends the thread by unwinding it through a noexcept frame: the process aborted.
class LiveBackends {
  struct Entry {
    std::mutex mutex;
    c10d::Backend* backend = nullptr;  // under mutex; null once the backend has left
  };

 public:
  // A backend's place in the list, from the end of its construction to the start of its
  // destruction (which waits while exit shuts the backend down).
  class Membership {
   public:
    explicit Membership(c10d::Backend* backend) : entry_(std::make_shared<Entry>()) {
      entry_->backend = backend;
      std::lock_guard<std::mutex> lock(listMutex_);
      std::erase_if(entries_, [](const std::weak_ptr<Entry>& e) { return e.expired(); });
      entries_.push_back(entry_);
    }
    ~Membership() {
      std::lock_guard<std::mutex> lock(entry_->mutex);
      entry_->backend = nullptr;
    }
    Membership(const Membership&) = delete;
    Membership& operator=(const Membership&) = delete;

   private:
    std::shared_ptr<Entry> entry_;
  };

  // Every live backend shut down (destroy_process_group's part: its operations run, each bounded
  // by the group's timeout, and its threads end).
  static void shutdownAll() {
    std::vector<std::shared_ptr<Entry>> live;
    {
      std::lock_guard<std::mutex> lock(listMutex_);
      for (const std::weak_ptr<Entry>& e : entries_)
        if (std::shared_ptr<Entry> entry = e.lock()) live.push_back(std::move(entry));
    }
    for (const std::shared_ptr<Entry>& entry : live) {
      std::lock_guard<std::mutex> lock(entry->mutex);
      if (entry->backend != nullptr) entry->backend->shutdown();
    }
  }

 private:
  static inline std::mutex listMutex_;
  static inline std::vector<std::weak_ptr<Entry>> entries_;  // under listMutex_
};

class BraidBackend : public c10d::Backend {
 public:
  // defaultGroup: the group init_process_group makes (see startMeetingsAfresh).
  BraidBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
               std::chrono::milliseconds timeout, bool defaultGroup)
      : c10d::Backend(rank, size), store_(store), timeout_(timeout) {
    std::string instance;
    comm_ = commThroughStore(*store, "braid_torch/unique_id", rank, size,
                             commConfig("cpu", "torch", timeout), timeout,
                             "rank " + std::to_string(rank) +
                                 " waited for rank 0 to make the group's communicator (or for its "
                                 "error)",
                             "braidCommInitRankConfig", &instance);
    keyPrefix_ = "braid_torch/" + instance + "/";
    channels_ = std::make_unique<PeerChannels>(store, rank, timeout, "cpu", keyPrefix_);
    mailbox_ = std::make_unique<Mailbox>(*channels_, rank, size);
    cudaChannels_ = std::make_unique<PeerChannels>(store, rank, timeout, "cuda", keyPrefix_);
    if (defaultGroup) startMeetingsAfresh();
    membership_.emplace(this);  // whole now
  }
  ~BraidBackend() override {
    withoutGil([this] {
      membership_.reset();  // waits while exit shuts this backend down: without the GIL
      leaveGroup();
      releaseCuda();
      if (comm_ != nullptr) braidCommDestroy(comm_);
    });
  }

  // destroy_process_group: every queued operation runs, then the queues' threads end, while the
  // interpreter is whole (they take the GIL to release tensors Python also holds; at exit the
  // interpreter would end them there instead).
  void shutdown() override {
    withoutGil([this] { leaveGroup(); });
  }

  const std::string getBackendName() const override { return "braid"; }

  // The collectives issued so far (sends and receives apart, as NCCL's count), alike on every
  // rank of a group whose ranks issue the same collectives.
  uint64_t getSequenceNumberForGroup() override { return collectivesIssued_; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    TORCH_CHECK(tensors.size() == 1, "braid backend: all_reduce takes one tensor (got ",
                tensors.size(), ")");
    const at::Tensor t = tensors[0];
    if (t.is_sparse()) {  // as Gloo: the sum of every rank's entries (DDP's sparse gradients)
      TORCH_CHECK(t.device().is_cpu(), "braid backend: all_reduce of a sparse tensor on ",
                  t.device(), " (expected a CPU tensor: sparse CUDA tensors are not supported)");
      TORCH_CHECK(opts.reduceOp.op_ == c10d::ReduceOp::SUM,
                  "braid backend: all_reduce of a sparse tensor with reduce op ",
                  static_cast<int>(opts.reduceOp.op_), " (expected SUM)");
      return run("all_reduce", tensors, {}, opts.asyncOp,
                 [=, this](const Where&) { t.copy_(sparseSum(comm_, size_, t)); });
    }
    return run("all_reduce", tensors, {}, opts.asyncOp,
               [=, this](const Where& on) { reduceInPlace(t, opts.reduceOp, on); });
  }

  // One all-reduce of the tensors flattened into one, as Gloo: a tensor listed twice is reduced
  // once.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "braid backend: all_reduce_coalesced of no tensors");
    checkOneType(tensors, tensors[0], "all_reduce_coalesced");
    return run("all_reduce_coalesced", tensors, {}, opts.asyncOp, [=, this](const Where& on) {
      const at::Tensor flat = flattened(tensors);
      reduceInPlace(flat, opts.reduceOp, on);
      copyPieces(flat, tensors);
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return run("broadcast", tensors, {}, opts.asyncOp, [=, this](const Where& on) mutable {
      for (const at::Tensor& t : tensors) {
        Flat f(t);
        checkOn(on,
                braidBroadcast(f.data(), f.data(), f.count(), braidType(t),
                               static_cast<int>(opts.rootRank), on.comm, on.stream),
                "braidBroadcast");
        f.writeBack();
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    return run("reduce", tensors, {}, opts.asyncOp, [=, this](const Where& on) mutable {
      for (const at::Tensor& t : tensors) {
        Flat f(t);
        if (isBitwise(opts.reduceOp)) {
          at::Tensor reduced = bitwiseOverRanks(f.flat, opts.reduceOp, on);
          if (rank_ == opts.rootRank) f.flat.copy_(reduced.view_as(f.flat));
        } else {
          reduceCall(t, opts.reduceOp, on, [&](braidRedOp_t op) {
            return braidReduce(f.data(), f.data(), f.count(), braidType(t), op,
                               static_cast<int>(opts.rootRank), on.comm, on.stream);
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
    std::vector<std::vector<at::Tensor>> byRank;
    for (const at::Tensor& t : outputs[0]) byRank.push_back({t});
    return allGatherLists(byRank, inputs, opts.asyncOp);
  }

  // torch's layout: outputs[rank][input].
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    return allGatherLists(outputs, inputs, opts.asyncOp);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    return run("all_gather_into_tensor", {output}, {input}, opts.asyncOp,
               [=, this](const Where& on) mutable { allGatherInto(output, input, on); });
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    checkCoalesced(outputs, inputs, true, "all_gather_into_tensor_coalesced");
    return run("all_gather_into_tensor_coalesced", outputs, inputs, opts.asyncOp,
               [=, this](const Where& on) {
                 std::vector<FlatPair> pairs;
                 for (size_t i = 0; i < outputs.size(); ++i)
                   pairs.push_back(allGatherPair(outputs[i], inputs[i]));
                 inOneGroup(pairs.size(), "braidAllGather", on,
                            [&](size_t i) { return allGatherCall(pairs[i], on); });
                 for (FlatPair& p : pairs) p.out.writeBack();
               });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    // Checked on the caller's thread, before anything moves (a rank that refuses its call leaves
    // its peers waiting in theirs until the timeout).
    TORCH_CHECK(
        outputs.size() == 1 && inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(size_),
        "braid backend: reduce_scatter takes one output and a list of ", size_, " inputs");
    checkOneType(inputs[0], outputs[0], "reduce_scatter input");
    TORCH_CHECK(inputs[0][rank_].numel() == outputs[0].numel(),
                "braid backend: reduce_scatter "
                "output of ",
                outputs[0].numel(), " elements on rank ", rank_, " (expected ",
                inputs[0][rank_].numel(), ", as its input for rank ", rank_, ")");
    const std::vector<at::Tensor> pieces = inputs[0];
    const at::Tensor output = outputs[0];
    return run("reduce_scatter", outputs, pieces, opts.asyncOp, [=, this](const Where& on) {
      const bool even = std::all_of(pieces.begin(), pieces.end(), [&](const at::Tensor& t) {
        return t.numel() == output.numel();
      });
      if (even)
        reduceScatterInto(output, flattened(pieces), opts.reduceOp, on);
      else
        reduceScatterUneven(output, pieces, opts.reduceOp, on);
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    return run("reduce_scatter_tensor", {output}, {input}, opts.asyncOp,
               [=, this](const Where& on) mutable {
                 reduceScatterInto(output, input, opts.reduceOp, on);
               });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    checkCoalesced(outputs, inputs, false, "reduce_scatter_tensor_coalesced");
    const c10d::ReduceOp op = opts.reduceOp;
    // A bitwise operator or PREMUL_SUM is more than one braid call: one by one.
    if (isBitwise(op) || op.op_ == c10d::ReduceOp::PREMUL_SUM)
      return run("reduce_scatter_tensor_coalesced", outputs, inputs, opts.asyncOp,
                 [=, this](const Where& on) {
                   for (size_t i = 0; i < outputs.size(); ++i)
                     reduceScatterInto(outputs[i], inputs[i], op, on);
                 });
    std::vector<braidRedOp_t> ops;
    for (const at::Tensor& output : outputs) ops.push_back(builtinOp(output.scalar_type(), op));
    return run("reduce_scatter_tensor_coalesced", outputs, inputs, opts.asyncOp,
               [=, this](const Where& on) {
                 std::vector<FlatPair> pairs;
                 for (size_t i = 0; i < outputs.size(); ++i)
                   pairs.push_back(reduceScatterPair(outputs[i], inputs[i]));
                 inOneGroup(pairs.size(), "braidReduceScatter", on, [&](size_t i) {
                   const FlatPair& p = pairs[i];
                   return braidReduceScatter(p.in.data(), p.out.data(), p.out.count(), p.type,
                                             ops[i], on.comm, on.stream);
                 });
                 for (FlatPair& p : pairs) p.out.writeBack();
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
    return run(
        "all_to_all_single", {output}, {input}, opts.asyncOp, [=, this](const Where& on) mutable {
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
          exchange(transfers, "all_to_all", on);
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
    return run("all_to_all", outputs, inputs, opts.asyncOp, [=, this](const Where& on) mutable {
      std::vector<Flat> in, out;
      for (const at::Tensor& t : inputs) in.emplace_back(t);
      for (const at::Tensor& t : outputs) out.emplace_back(t);
      std::vector<Transfer> transfers;
      for (int p = 0; p < size_; ++p) {
        transfers.push_back({true, in[p].data(), in[p].count(), braidType(inputs[p]), p});
        transfers.push_back({false, out[p].data(), out[p].count(), braidType(outputs[p]), p});
      }
      exchange(transfers, "all_to_all", on);
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
    return run("gather", results, inputs, opts.asyncOp, [=, this](const Where& on) mutable {
      Flat in(inputs[0]);
      std::vector<Flat> out;
      std::vector<Transfer> transfers;
      if (rank_ == root) {
        for (const at::Tensor& t : outputs[0]) out.emplace_back(t);
        for (int p = 0; p < size_; ++p)
          transfers.push_back({false, out[p].data(), out[p].count(), type, p});
      }
      transfers.push_back({true, in.data(), in.count(), type, root});
      exchange(transfers, "gather", on);
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
    std::vector<at::Tensor> sources;
    for (auto& list : inputs) sources.insert(sources.end(), list.begin(), list.end());
    return run("scatter", outputs, sources, opts.asyncOp, [=, this](const Where& on) mutable {
      Flat out(outputs[0]);
      std::vector<Flat> in;
      std::vector<Transfer> transfers;
      if (rank_ == root) {
        for (const at::Tensor& t : inputs[0]) in.emplace_back(t);
        for (int p = 0; p < size_; ++p)
          transfers.push_back({true, in[p].data(), in[p].count(), type, p});
      }
      transfers.push_back({false, out.data(), out.count(), type, root});
      exchange(transfers, "scatter", on);
      out.writeBack();
    });
  }

  // Sends and receives run on the channel of their peer and direction (PeerChannels): a lone
  // isend and irecv of any size complete in whichever order either rank posts them. Receives of
  // CPU tensors take the messages of their tags (Mailbox), as Gloo's; of CUDA tensors, the
  // messages in the order sent, as NCCL's (ProcessGroupNCCL ignores tags).
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override {
    return pointToPoint(true, tensors.at(0), dstRank, tag);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override {
    return pointToPoint(false, tensors.at(0), srcRank, tag);
  }

  // recv with no source: whichever other rank's message of the tag comes first (Mailbox).
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    const at::Tensor& tensor = tensors.at(0);
    if (tensor.is_cuda())
      throw std::invalid_argument(c10::str(
          "braid backend: a receive from any source of a tensor on ", tensor.device(), " on rank ",
          rank_, " (expected a CPU tensor: a CUDA communicator cannot tell whose send waits)"));
    {
      std::lock_guard<std::mutex> lock(coalescingMutex_);
      TORCH_CHECK(!coalescing_,
                  "braid backend: a receive from any source in a coalesced batch on "
                  "rank ",
                  rank_, " (expected a receive from a given rank)");
    }
    TORCH_CHECK(size_ > 1, "braid backend: a receive from any source on rank ", rank_,
                " of a group of one (expected another rank to send)");
    auto work = c10::make_intrusive<AnySourceWork>(std::vector<at::Tensor>{tensor});
    mailbox_->receiveFromAnySource(tag, tensor, [work](int source, std::exception_ptr error) {
      work->completeFrom(source, error);
    });
    return work;
  }

  // batch_isend_irecv: between startCoalescing and endCoalescing sends and receives are collected,
  // then posted to their channels together; the group's Work completes when all have ended.
  bool supportsCoalescing() const override { return true; }

  void startCoalescing() override {
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    coalescing_ = true;
  }

  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    Batch batch;
    {
      std::lock_guard<std::mutex> lock(coalescingMutex_);
      coalescing_ = false;
      std::swap(batch, batch_);
    }
    return postAll(batch);
  }

  // torch's monitored_barrier, as Gloo's: every other rank checks in with rank 0 (through the
  // store, so that a rank that never comes is named rather than waited for in braid's collective),
  // rank 0 names those that did not within the timeout (the first, or every one with
  // waitAllRanks), then lets the others go; they wait as long for it, counted as a meeting in
  // flight (PeerChannels) so that rank 0, leaving at once, keeps its store until they saw it.
  // Each key is deleted by the rank that read it: torch numbers a group made again after
  // destroy_process_group's barriers from 0 again, and they must not find this one's keys (a
  // release found so would let a rank through without rank 0).
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override {
    const std::chrono::milliseconds limit = opts.timeout.count() >= 0 ? opts.timeout : timeout_;
    const std::string prefix =
        keyPrefix_ + "monitored_barrier/" + std::to_string(monitoredBarriers_++) + "/";
    if (rank_ != 0) {
      const PeerChannels::MeetingInFlight waitingForRank0(*channels_);
      store_->set(prefix + std::to_string(rank_), std::vector<uint8_t>{1});
      TORCH_CHECK(keySetWithin(*store_, prefix + "released/" + std::to_string(rank_), limit),
                  "Rank ", rank_,
                  " successfully reached monitoredBarrier, but received errors while waiting for "
                  "send/recv from rank 0: it did not let this rank go within ",
                  limit.count(), " ms");
      forgetKey(*store_, prefix + "released/" + std::to_string(rank_));
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    std::string failed;
    for (int r = 1; r < size_; ++r) {
      std::chrono::milliseconds wait = limit;
      if (!waitAllRanks) {  // the rest of the one timeout; with waitAllRanks, all of it for each
        wait -= std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - start);
        TORCH_CHECK(wait.count() > 0, "Rank 0 timed out in monitoredBarrier after ", limit.count(),
                    " ms (ranks ", r, " to ", size_ - 1, " not heard from yet)");
      }
      if (keySetWithin(*store_, prefix + std::to_string(r), wait)) {
        forgetKey(*store_, prefix + std::to_string(r));
        continue;
      }
      TORCH_CHECK(waitAllRanks, "Rank ", r, " failed to pass monitoredBarrier in ", limit.count(),
                  " ms");
      failed += (failed.empty() ? "" : ", ") + std::to_string(r);
    }
    TORCH_CHECK(failed.empty(), "Ranks ", failed, " failed to pass monitoredBarrier in ",
                limit.count(), " ms");
    for (int r = 1; r < size_; ++r)
      store_->set(prefix + "released/" + std::to_string(r), std::vector<uint8_t>{1});
  }

  // Behind the group's collectives: the CPU queue's (as Gloo's barrier) and, where the group has
  // made its CUDA communicator, those of CUDA tensors too (as ProcessGroupNCCL's, ending on the
  // host): one backend serves both devices, so a barrier waits for both. Every rank takes the
  // same path (the CUDA communicator is made collectively).
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    {
      std::lock_guard<std::mutex> lock(coalescingMutex_);
      TORCH_CHECK(!coalescing_, "braid backend: a barrier inside a coalescing block on rank ",
                  rank_, " (expected collectives, sends and receives only)");
    }
    const std::optional<c10::Device> cudaDevice = cudaCollectivesMade();
    const bool behindCuda = cudaDevice.has_value();
    c10::intrusive_ptr<c10d::Work> onCpu =
        run("barrier", {}, {}, opts.asyncOp && !behindCuda, [](const Where& on) {
          uint8_t byte = 0;
          barrierOn(on, &byte);
        });
#ifdef BRAID_TORCH_CUDA
    if (behindCuda) {
      onCpu->wait();
      return cudaBarrier(*cudaDevice);
    }
#endif
    return onCpu;
  }

 private:
  void check(braidResult_t result, const char* what) const {
    braid_torch::check(comm_, result, what);
  }
  static void checkOn(const Where& on, braidResult_t result, const char* what) {
    braid_torch::check(on.comm, result, what);
  }
  // A barrier: a one-byte all-reduce of `byte` (host or device memory, as `on`'s communicator).
  static void barrierOn(const Where& on, void* byte) {
    checkOn(on, braidAllReduce(byte, byte, 1, braidUint8, braidSum, on.comm, on.stream),
            "barrier (braidAllReduce)");
  }

  static std::exception_ptr shutDown() {
    return std::make_exception_ptr(
        std::runtime_error("braid backend: the process group was shut down"));
  }

  // The device of the group's CUDA communicator, if made (never, without CUDA).
  std::optional<c10::Device> cudaCollectivesMade() {
#ifdef BRAID_TORCH_CUDA
    std::lock_guard<std::mutex> lock(cudaMutex_);
    if (cuda_) return cudaDevice_;
#endif
    return std::nullopt;
  }

  // Drains and closes the operation queue and the point-to-point channels (operations issued
  // after, a draining one's callbacks' included, fail as shut down); then, once, waits while
  // other ranks' channels meet through the store, which may live in this process.
  void leaveGroup() {
    queue_->close();
    channels_->close();
    mailbox_->close();
    cudaChannels_->close();
    if (!left_.exchange(true)) channels_->awaitMeetingsInFlight();  // CPU and CUDA: one count
  }

  // The job's count of meetings in flight (PeerChannels) may hold what a rank that crashed while
  // its channel met left in a store that outlives the job's processes (torchrun's). The default
  // group's communicator is made: every rank of the job has entered init_process_group, so none
  // has a meeting in flight (another group's were drained when it was destroyed). Rank 0 sets
  // the count to 0, and a barrier keeps every rank from counting before that.
  void startMeetingsAfresh() {
    if (rank_ == 0) PeerChannels::resetMeetings(store_);
    uint8_t byte = 0;
    barrierOn(Where{comm_, nullptr}, &byte);
  }

  // The channels' last operations end before their communicators go, then the collectives'.
  void releaseCuda() {
#ifdef BRAID_TORCH_CUDA
    channelStreams_.synchronize();
    cudaChannels_.reset();
    cuda_.reset();
#endif
  }

  // The GIL, if this thread holds it, let go while `body` waits (the queues' threads take it to
  // release tensors Python also holds).
  template <typename Body>
  static void withoutGil(Body body) {
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release released;
      body();
    } else {
      body();
    }
  }

  // Runs the body (which holds copies of what it uses) where the tensors are. CPU tensors: on the
  // operation queue, or here when the call is not asynchronous and nothing is queued; the Work
  // completes with `outputs`, or with the error the body threw. CUDA tensors: here, queued on the
  // CUDA communicator's stream (cuda_side.h). `inputs`: tensors the call reads besides `outputs`.
  template <typename Body>
  c10::intrusive_ptr<c10d::Work> run(const char* what, std::vector<at::Tensor> outputs,
                                     const std::vector<at::Tensor>& inputs, bool asyncOp,
                                     Body body) {
    std::vector<at::Tensor> used = outputs;
    used.insert(used.end(), inputs.begin(), inputs.end());
    const c10::Device device = used.empty() ? c10::Device(c10::kCPU) : deviceOf(used, what);
    ++collectivesIssued_;
    if (device.is_cuda()) {
      noteCoalescedCollective(device);
      return runOnCuda(device, std::move(outputs), used, std::move(body));
    }
    auto work = c10::make_intrusive<AsyncWork>(std::move(outputs));
    noteCoalescedCollective(device, work);
    std::function<void()> op = completing(work, [this, body = std::move(body)]() mutable {
      body(Where{comm_, nullptr});
    });
    // An operation a completing one's callback issues (PowerSGD's hook) runs at once: queued
    // behind that callback, on the queue's only thread, it would wait for ever.
    if (queue_->onQueueThread())
      op();
    else if ((asyncOp || !queue_->runHereIfIdle(op)) && !queue_->push(op))
      work->complete(shutDown());
    return work;
  }

  template <typename Body>
  c10::intrusive_ptr<c10d::Work> runOnCuda(c10::Device device, std::vector<at::Tensor> outputs,
                                           const std::vector<at::Tensor>& used, Body body) {
#ifdef BRAID_TORCH_CUDA
    return cudaCollectives(device).run(std::move(outputs), used, std::move(body));
#else
    refuseCuda(device);
#endif
  }

#ifndef BRAID_TORCH_CUDA
  [[noreturn]] static void refuseCuda(c10::Device device) {
    throw std::invalid_argument(
        c10::str("braid backend: tensors on ", device,
                 " (this braid_torch was built without CUDA: torch had none where it was built)"));
  }
#endif

  struct PointToPoint {
    bool send;
    at::Tensor tensor;
    int peer;
    int tag;
  };

  c10::intrusive_ptr<c10d::Work> pointToPoint(bool send, const at::Tensor& tensor, int peer,
                                              int tag) {
    TORCH_CHECK(peer >= 0 && peer < size_, "braid backend: ", send ? "send to" : "receive from",
                " rank ", peer, " on rank ", rank_, " (expected a rank of 0 to ", size_ - 1, ")");
    const PointToPoint op{send, tensor, peer, tag};
    {
      std::lock_guard<std::mutex> lock(coalescingMutex_);
      if (coalescing_) {  // every operation of the batch returns the batch's Work
        if (!batch_.ops.empty())
          TORCH_CHECK(batch_.ops[0].tensor.device() == tensor.device(),
                      "braid backend: a coalesced send or receive of a tensor on ", tensor.device(),
                      " after one on ", batch_.ops[0].tensor.device(), " (expected one device)");
        if (!batch_.work) batch_.work = newBatchWork(tensor.device());
        batch_.ops.push_back(op);
        return batch_.work;
      }
    }
    Batch alone;
    alone.ops.push_back(op);
    return postAll(alone);
  }

  // Sends and receives issued between startCoalescing and endCoalescing, the collectives issued
  // meanwhile (torch's _coalescing_manager(device=) waits for endCoalescing's Work alone: it must
  // end after them, and fail with them), and the batch's Work, made by its first operation for its
  // device.
  struct Batch {
    std::vector<PointToPoint> ops;
    std::vector<c10::intrusive_ptr<AsyncWork>> cpuCollectives;
    bool cudaCollectives = false;
    c10::intrusive_ptr<c10d::Work> work;
  };

  c10::intrusive_ptr<c10d::Work> newBatchWork(c10::Device device) {
    if (!device.is_cuda()) return c10::make_intrusive<AsyncWork>(std::vector<at::Tensor>{});
#ifdef BRAID_TORCH_CUDA
    return c10::make_intrusive<CudaWork>(std::vector<at::Tensor>{}, device, timeout_);
#else
    refuseCuda(device);
#endif
  }

  // `work`: a CPU collective's; none for a CUDA one, whose errors its caller sees at once.
  void noteCoalescedCollective(c10::Device device, c10::intrusive_ptr<AsyncWork> work = {}) {
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    if (!coalescing_) return;
    if (device.is_cuda())
      batch_.cudaCollectives = true;
    else
      batch_.cpuCollectives.push_back(std::move(work));
  }

  // Posts every operation to its channel; the batch's Work completes with the operations' tensors
  // when all have ended, and after the collectives issued while coalescing, if any.
  c10::intrusive_ptr<c10d::Work> postAll(const Batch& batch) {
    const std::vector<PointToPoint>& ops = batch.ops;
    std::vector<at::Tensor> tensors;
    for (const PointToPoint& op : ops) tensors.push_back(op.tensor);
    const bool cudaOps = !tensors.empty() && deviceOf(tensors, "batch_isend_irecv").is_cuda();
    const bool cpuOps = !tensors.empty() && !cudaOps;
    const bool cpuCollectives = !batch.cpuCollectives.empty();
    TORCH_CHECK(!((cpuOps || cpuCollectives) && (cudaOps || batch.cudaCollectives)),
                "braid backend: one coalesced group of operations on CPU and on CUDA tensors "
                "(expected one device)");
    if (cudaOps || batch.cudaCollectives) {
#ifdef BRAID_TORCH_CUDA
      return postAllOnCuda(batch, tensors);
#else
      refuseCuda(c10::Device(c10::kCUDA));
#endif
    }
    auto work = batch.work ? c10::static_intrusive_pointer_cast<AsyncWork>(batch.work)
                           : c10::make_intrusive<AsyncWork>(std::vector<at::Tensor>{});
    work->setOutputs(tensors);
    auto group = std::make_shared<CompletesAfter<AsyncWork>>(work, ops.size() + 1);
    // After the collectives queued while coalescing (the queue runs in order), with the first
    // one's error.
    std::function<void()> issued = [group, collectives = batch.cpuCollectives] {
      for (const c10::intrusive_ptr<AsyncWork>& collective : collectives)
        if (std::exception_ptr error = collective->exception()) return group->ended(error);
      group->ended(nullptr);
    };
    if (!cpuCollectives || queue_->onQueueThread() || !queue_->push(issued)) issued();
    for (const PointToPoint& op : ops) {
      if (op.send) {
        postOne(*channels_, op, group, [this](const PointToPoint& p) {
          sendTagged(channels_->comm(p.peer, true), p.tensor, p.tag);
        });
      } else {
        mailbox_->receive(op.peer, op.tag, op.tensor,
                          [group](int, std::exception_ptr error) { group->ended(error); });
      }
    }
    return work;
  }

  // op's transfer on its channel's thread, then `group` told how it ended (also when the channel
  // was shut down).
  template <typename Group, typename Transfer>
  void postOne(PeerChannels& channels, const PointToPoint& op, const std::shared_ptr<Group>& group,
               Transfer transferOne) {
    std::function<void()> body = withCallerState([=] {
      try {
        transferOne(op);
      } catch (...) {
        group->ended(std::current_exception());
        return;
      }
      group->ended(nullptr);
    });
    if (!channels.post(op.peer, op.send, std::move(body))) group->ended(shutDown());
  }

#ifdef BRAID_TORCH_CUDA
  // Each operation on its channel's stream after the caller's current stream, the channel's
  // communicator made on its thread (made at the caller's, a lone send and receive between two
  // ranks would wait for each other there).
  c10::intrusive_ptr<c10d::Work> postAllOnCuda(const Batch& batch,
                                               const std::vector<at::Tensor>& tensors) {
    const std::vector<PointToPoint>& ops = batch.ops;
    const c10::Device device = tensors.empty() ? cudaCollectivesDevice() : tensors[0].device();
    bindCudaDevice(device);
    c10::cuda::CUDAGuard onDevice(device);
    auto work = batch.work
                    ? c10::static_intrusive_pointer_cast<CudaWork>(batch.work)
                    : c10::make_intrusive<CudaWork>(std::vector<at::Tensor>{}, device, timeout_);
    work->setOutputs(tensors);
    if (batch.cudaCollectives) cudaCollectives(device).recordEnd(*work);
    auto callerQueued = std::make_shared<StreamEvent>();
    callerQueued->record(c10::cuda::getCurrentCUDAStream(device.index()).stream());
    auto group = std::make_shared<CompletesAfter<CudaWork>>(work, ops.size() + 1);
    for (const PointToPoint& op : ops) {
      const c10::cuda::CUDAStream stream = channelStreams_.of(op.peer, op.send);
      op.tensor.record_stream(stream.unwrap());
      postOne(*cudaChannels_, op, group, [=, this](const PointToPoint& p) {
        c10::cuda::CUDAGuard onItsDevice(device);
        braidComm_t channel = cudaChannels_->comm(p.peer, p.send);  // first: see post()
        c10::cuda::CUDAStreamGuard onStream(stream);
        callerQueued->makeWait(stream.stream());
        transfer(p, Where{channel, stream.stream()});
        work->recordEnd(stream, channel);
      });
    }
    group->ended(nullptr);
    return work;
  }

  // On its channel's thread, on its stream: in a channel, the sender is rank 0 and the receiver
  // rank 1.
  static void transfer(const PointToPoint& op, const Where& on) {
    Flat f(op.tensor);
    const auto [type, count] = messageOf(f);
    if (op.send) {
      checkOn(on, braidSend(f.data(), count, type, 1, on.comm, on.stream), "braidSend");
    } else {
      checkOn(on, braidRecv(f.data(), count, type, 0, on.comm, on.stream), "braidRecv");
      f.writeBack();
    }
  }

  // The group's CUDA communicator, made by its first collective of CUDA tensors (on every rank).
  CudaCollectives& cudaCollectives(c10::Device device) {
    bindCudaDevice(device);
    std::lock_guard<std::mutex> lock(cudaMutex_);
    if (!cuda_)
      cuda_ =
          std::make_unique<CudaCollectives>(*store_, keyPrefix_, rank_, size_, timeout_, device);
    return *cuda_;
  }

  // A one-byte all-reduce on the CUDA communicator's stream, behind the collectives queued there;
  // its Work's wait() returns once it has run (torch's barrier() waits for it).
  c10::intrusive_ptr<c10d::Work> cudaBarrier(c10::Device device) {
    const at::Tensor flag = at::zeros({1}, at::TensorOptions().dtype(at::kByte).device(device));
    c10::intrusive_ptr<CudaWork> work = cudaCollectives(device).run(
        {}, {flag}, [&flag](const Where& on) { barrierOn(on, flag.data_ptr()); });
    work->waitOnHost();
    return work;
  }

  c10::Device cudaCollectivesDevice() {
    std::lock_guard<std::mutex> lock(cudaMutex_);
    TORCH_CHECK(cudaDevice_.has_value(), "braid backend: no CUDA tensor on rank ", rank_);
    return *cudaDevice_;
  }

  // A rank's CUDA tensors are on one device: its first CUDA tensor's.
  void bindCudaDevice(c10::Device device) {
    std::lock_guard<std::mutex> lock(cudaMutex_);
    if (!cudaDevice_) cudaDevice_ = device;
    TORCH_CHECK(*cudaDevice_ == device, "braid backend: a tensor on ", device, " on rank ", rank_,
                " (expected ", *cudaDevice_, ", the device of this rank's first CUDA tensor)");
  }
#endif

  // `calls` braid calls (`issue(i)`, the i-th) as one group: the communicator may run small
  // collectives of it as one pass (BRAID_GROUP_FUSE_BYTES), as ProcessGroupNCCL's coalescing.
  // Everything about the calls is worked out before the group opens, so `issue` throws nothing and
  // no group is left open on this thread; the first failed call's error (braidGroupEnd then runs
  // none of the group's calls, as NCCL's), else the group end's, is thrown.
  template <typename Issue>
  static void inOneGroup(size_t calls, const char* what, const Where& on, Issue issue) {
    checkOn(on, braidGroupStart(), "braidGroupStart");
    braidResult_t first = braidSuccess;
    std::string firstError;
    for (size_t i = 0; i < calls; ++i) {
      const braidResult_t r = issue(i);
      if (r != braidSuccess && first == braidSuccess) {
        first = r;
        firstError = braidGetLastError(on.comm);
      }
    }
    const braidResult_t ended = braidGroupEnd();
    if (first != braidSuccess)
      failBackend(std::string("braid backend: ") + what + " failed: " + braidGetErrorString(first) +
                  ": " + firstError);
    checkOn(on, ended, what);
  }

  // Sends and receives of one group.
  struct Transfer {
    bool send;
    void* data;
    size_t count;
    braidDataType_t type;
    int peer;
  };
  static void exchange(const std::vector<Transfer>& transfers, const char* what, const Where& on) {
    inOneGroup(transfers.size(), what, on, [&](size_t i) {
      const Transfer& t = transfers[i];
      return t.send ? braidSend(t.data, t.count, t.type, t.peer, on.comm, on.stream)
                    : braidRecv(t.data, t.count, t.type, t.peer, on.comm, on.stream);
    });
  }

  static bool isBitwise(const c10d::ReduceOp& op) {
    return op.op_ == c10d::ReduceOp::BAND || op.op_ == c10d::ReduceOp::BOR ||
           op.op_ == c10d::ReduceOp::BXOR;
  }

  // BAND, BOR and BXOR, which braid has no operator for: every rank's input (contiguous)
  // gathered, then combined here in rank order, flat. Integer and bool tensors, as Gloo.
  at::Tensor bitwiseOverRanks(const at::Tensor& input, const c10d::ReduceOp& op, const Where& on) {
    TORCH_CHECK(!input.is_floating_point(), "braid backend: bitwise reduce op on a ",
                input.scalar_type(), " tensor (expected an integer or bool tensor)");
    at::Tensor all = at::empty({static_cast<int64_t>(size_), input.numel()}, input.options());
    checkOn(on,
            braidAllGather(input.data_ptr(), all.data_ptr(), static_cast<size_t>(input.numel()),
                           braidType(input), on.comm, on.stream),
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

  // torch's operator as one of braid's built-in ones; bool tensors as bytes 0 and 1, where sum is
  // any (max) and product all (min).
  static braidRedOp_t builtinOp(at::ScalarType type, const c10d::ReduceOp& op) {
    if (type == at::kBool) {
      switch (op.op_) {
        case c10d::ReduceOp::SUM:
        case c10d::ReduceOp::MAX: return braidMax;
        case c10d::ReduceOp::PRODUCT:
        case c10d::ReduceOp::MIN: return braidMin;
        default:
          TORCH_CHECK(false, "braid backend: reduce op ", static_cast<int>(op.op_),
                      " on a bool tensor (expected SUM, PRODUCT, MIN, MAX or a bitwise op)");
      }
    }
    switch (op.op_) {
      case c10d::ReduceOp::SUM: return braidSum;
      case c10d::ReduceOp::AVG: return braidAvg;
      case c10d::ReduceOp::PRODUCT: return braidProd;
      case c10d::ReduceOp::MIN: return braidMin;
      case c10d::ReduceOp::MAX: return braidMax;
      default:
        TORCH_CHECK(false, "braid backend: reduce op ", static_cast<int>(op.op_),
                    " is not supported (expected SUM, AVG, PRODUCT, MIN, MAX, PREMUL_SUM, BAND, "
                    "BOR or BXOR)");
    }
  }

  // A reducing call with torch's operator: PREMUL_SUM as braid's PreMulSum operator with the
  // factor in the tensor's type, read on the host when the operator is made.
  template <typename Call>
  void reduceCall(const at::Tensor& t, const c10d::ReduceOp& op, const Where& on, Call&& call) {
    if (op.op_ != c10d::ReduceOp::PREMUL_SUM || t.scalar_type() == at::kBool)
      return checkOn(on, call(builtinOp(t.scalar_type(), op)), "reduction");
    // NCCLPreMulSumSupplement: torch 2.11's name, which newer torch keeps as an alias.
    auto* supplement = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
    TORCH_CHECK(supplement != nullptr, "braid backend: PREMUL_SUM without its factor");
    at::Tensor factor =
        supplement->tensor_factor.defined()
            ? supplement->tensor_factor.to(at::kCPU, t.scalar_type())
            : at::scalar_tensor(supplement->double_factor, t.options().device(at::kCPU));
    braidRedOp_t premul;
    checkOn(on,
            braidRedOpCreatePreMulSum(&premul, factor.data_ptr(), braidType(t),
                                      braidScalarHostImmediate, on.comm),
            "braidRedOpCreatePreMulSum");
    const braidResult_t result = call(premul);
    braidRedOpDestroy(premul, on.comm);
    return checkOn(on, result, "reduction");
  }

  // A dense tensor all-reduced in place.
  void reduceInPlace(const at::Tensor& t, const c10d::ReduceOp& op, const Where& on) {
    Flat f(t);
    if (isBitwise(op))
      f.flat.copy_(bitwiseOverRanks(f.flat, op, on).view_as(f.flat));
    else
      reduceCall(t, op, on, [&](braidRedOp_t o) {
        return braidAllReduce(f.data(), f.data(), f.count(), braidType(t), o, on.comm, on.stream);
      });
    f.writeBack();
  }

  // Rank r's inputs into byRank[r] (torch's [rank][input] layout), by one all-gather of the
  // inputs flattened into one.
  c10::intrusive_ptr<c10d::Work> allGatherLists(const std::vector<std::vector<at::Tensor>>& byRank,
                                                const std::vector<at::Tensor>& inputs,
                                                bool asyncOp) {
    TORCH_CHECK(!inputs.empty(), "braid backend: all_gather of no inputs");
    TORCH_CHECK(byRank.size() == static_cast<size_t>(size_), "braid backend: all_gather into ",
                byRank.size(), " output lists (expected one per rank, ", size_, ")");
    checkOneType(inputs, inputs[0], "all_gather input");
    std::vector<at::Tensor> results;
    for (const std::vector<at::Tensor>& list : byRank) {
      TORCH_CHECK(list.size() == inputs.size(), "braid backend: all_gather output list of ",
                  list.size(), " tensors (expected one per input, ", inputs.size(), ")");
      checkOneType(list, inputs[0], "all_gather output");
      for (size_t i = 0; i < list.size(); ++i)
        TORCH_CHECK(list[i].numel() == inputs[i].numel(), "braid backend: all_gather output of ",
                    list[i].numel(), " elements for input ", i, " (expected ", inputs[i].numel(),
                    ")");
      results.insert(results.end(), list.begin(), list.end());
    }
    return run("all_gather", results, inputs, asyncOp, [=, this](const Where& on) {
      const at::Tensor mine = flattened(inputs).contiguous();
      at::Tensor all = at::empty({size_, mine.numel()}, mine.options());
      allGatherInto(all, mine, on);
      for (int r = 0; r < size_; ++r) copyPieces(all[r], byRank[r]);
    });
  }

  // A call's flat input and output, and their braid datatype.
  struct FlatPair {
    Flat in, out;
    braidDataType_t type;
  };

  // The pair of a coalesced list's call, on the caller's thread, before anything moves: in torch's
  // _coalescing_manager(device=...) the Work that would carry the body's failure is replaced by the
  // block's, so a failure there would go unseen. `gather`: the output holds every rank's input.
  void checkCoalesced(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                      bool gather, const char* what) const {
    TORCH_CHECK(outputs.size() == inputs.size(), "braid backend: ", what, " of ", inputs.size(),
                " inputs into ", outputs.size(), " outputs (expected one each)");
    for (size_t i = 0; i < inputs.size(); ++i) {
      braidType(inputs[i]);
      checkPairShape(outputs[i], inputs[i], gather, what);
    }
  }

  void checkPairShape(const at::Tensor& output, const at::Tensor& input, bool gather,
                      const char* what) const {
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "braid backend: ", what, " output ",
                output.scalar_type(), " and input ", input.scalar_type(), " differ");
    const int64_t whole = gather ? output.numel() : input.numel();
    const int64_t piece = gather ? input.numel() : output.numel();
    TORCH_CHECK(whole == piece * size_, "braid backend: ", what, " ", gather ? "output" : "input",
                " has ", whole, " elements (expected ", piece * size_, ")");
  }

  FlatPair allGatherPair(const at::Tensor& output, const at::Tensor& input) const {
    checkPairShape(output, input, true, "all_gather_into_tensor");
    return {Flat(input), Flat(output), braidType(input)};
  }

  static braidResult_t allGatherCall(const FlatPair& p, const Where& on) {
    return braidAllGather(p.in.data(), p.out.data(), p.in.count(), p.type, on.comm, on.stream);
  }

  void allGatherInto(const at::Tensor& output, const at::Tensor& input, const Where& on) {
    FlatPair p = allGatherPair(output, input);
    checkOn(on, allGatherCall(p, on), "braidAllGather");
    p.out.writeBack();
  }

  FlatPair reduceScatterPair(const at::Tensor& output, const at::Tensor& input) const {
    checkPairShape(output, input, false, "reduce_scatter");
    return {Flat(input), Flat(output), braidType(output)};
  }

  void reduceScatterInto(const at::Tensor& output, const at::Tensor& input,
                         const c10d::ReduceOp& op, const Where& on) {
    FlatPair p = reduceScatterPair(output, input);
    if (isBitwise(op)) {
      const int64_t n = p.out.flat.numel();
      p.out.flat.copy_(
          bitwiseOverRanks(p.in.flat, op, on).narrow(0, rank_ * n, n).view_as(p.out.flat));
    } else {
      reduceCall(output, op, on, [&](braidRedOp_t o) {
        return braidReduceScatter(p.in.data(), p.out.data(), p.out.count(), p.type, o, on.comm,
                                  on.stream);
      });
    }
    p.out.writeBack();
  }

  // Pieces of different sizes: padded to the largest, in one reduce-scatter, unless that moves
  // more than an all-reduce of the pieces (2x their sum) would; then that all-reduce, of which
  // this rank keeps its piece.
  void reduceScatterUneven(const at::Tensor& output, const std::vector<at::Tensor>& pieces,
                           const c10d::ReduceOp& op, const Where& on) {
    int64_t most = 0, total = 0, mineAt = 0;
    for (int r = 0; r < size_; ++r) {
      most = std::max(most, pieces[r].numel());
      total += pieces[r].numel();
      if (r < rank_) mineAt += pieces[r].numel();
    }
    at::Tensor mine;
    if (most * size_ <= 2 * total) {
      at::Tensor padded = at::zeros({size_, most}, output.options());
      for (int r = 0; r < size_; ++r)
        padded[r].narrow(0, 0, pieces[r].numel()).copy_(pieces[r].reshape({-1}));
      at::Tensor block = at::empty({most}, output.options());
      reduceScatterInto(block, padded, op, on);
      mine = block.narrow(0, 0, output.numel());
    } else {
      const at::Tensor all = flattened(pieces);
      reduceInPlace(all, op, on);
      mine = all.narrow(0, mineAt, output.numel());
    }
    output.copy_(mine.view(output.sizes()));
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  braidComm_t comm_ = nullptr;
  std::atomic<uint64_t> collectivesIssued_{0};
  // What begins this group instance's keys in the store (commThroughStore's instance tag).
  std::string keyPrefix_;
  uint64_t monitoredBarriers_ = 0;          // numbers each monitored barrier's keys in the store
  std::unique_ptr<PeerChannels> channels_;  // never null once made
  std::unique_ptr<Mailbox> mailbox_;        // channels_'s receives; never null once made
  std::unique_ptr<PeerChannels> cudaChannels_;  // never null once made, until destroyed
  std::atomic<bool> left_{false};               // leaveGroup() has waited for the meetings
  std::mutex coalescingMutex_;
  bool coalescing_ = false;  // under coalescingMutex_
  Batch batch_;              // under coalescingMutex_
#ifdef BRAID_TORCH_CUDA
  std::mutex cudaMutex_;
  std::optional<c10::Device> cudaDevice_;  // under cudaMutex_
  std::unique_ptr<CudaCollectives> cuda_;  // under cudaMutex_
  ChannelStreams channelStreams_;
#endif
  std::unique_ptr<OperationQueue> queue_ = std::make_unique<OperationQueue>();  // never null
  std::optional<LiveBackends::Membership> membership_;  // from the constructor's end
};

c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int size,
                                                const std::chrono::duration<float>& timeout,
                                                bool defaultGroup) {
  return c10::make_intrusive<BraidBackend>(
      store, rank, size, std::chrono::duration_cast<std::chrono::milliseconds>(timeout),
      defaultGroup);
}

}  // namespace
}  // namespace braid_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("create_backend", &braid_torch::createBackend, py::call_guard<py::gil_scoped_release>(),
        "A braid communicator of this group's ranks as a c10d backend");
  m.def("leave_groups_at_exit", &braid_torch::LiveBackends::shutdownAll,
        py::call_guard<py::gil_scoped_release>(),
        "Runs every live braid backend's queued operations and ends its threads (atexit)");
#ifdef BRAID_TORCH_CUDA
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
}
