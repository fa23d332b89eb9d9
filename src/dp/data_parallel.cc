// DataParallel: the flat layout, bucket launches on the backend's stream, and the step.
// step.
//
// Layout. Parameters are laid out in reverse registration order (the order a backward pass
// produces gradients) and cut into buckets; each bucket is padded to a multiple of the rank count
// so that it splits into equal slices. Rank r owns slice r of every bucket: a bucket's
// reduce-scatter lands exactly in its owner's shard and its all-gather starts from it, so ZeRO's
// communication overlaps the backward pass bucket by bucket just like DDP's all-reduce.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dp/backend.h"
#include "dp/error.h"
#include "dp/offload.h"

namespace braid::dp {

struct DataParallel::Impl {
  struct Param {
    std::string name;
    size_t count;
    int layer = 0;
    size_t offset = 0;  // in the flat layout
    int bucket = -1;
    bool ready = false;  // in this micro-batch
  };
  // ZeRO-3: a layer's buckets lie side by side in the flat layout; gathered, its parameters are
  // whole in `gathered` (its elements from `offset` on).
  struct Layer {
    size_t offset = 0;
    size_t count = 0;
    int firstBucket = -1, lastBucket = -1;
    Buffer gathered;
    bool inFlight = false;  // its all-gathers are queued, not yet waited for
  };
  struct Bucket {
    size_t offset = 0;  // in the flat layout
    size_t count = 0;   // padded to a multiple of the rank count
    std::vector<int> params;
    size_t unready = 0;       // parameters not yet ready in this micro-batch
    int stagingSlot = -1;     // ZeRO-2: the staging buffer being filled for this micro-batch
    bool accumulate = false;  // ZeRO-2: reduced into accumulation, to be added at drain()
    // DDP, ZeRO-1: reduced where its gradients are, and not settled since (settle()).
    bool reducedInPlace = false;
  };
  // The part of a bucket whose optimizer update this rank owns (the whole bucket under DDP).
  struct Segment {
    size_t flatOffset;   // in the flat layout
    size_t stateOffset;  // in the shard: master weights, moments, ZeRO-2 gradients
    size_t count;
  };
  struct StagingSlot {
    int occupant = -1;  // the bucket that used it last
    bool inFlight = false;
  };

  Impl(braidComm_t comm, const Options& options);
  ~Impl();

  bool sharded() const { return options.stage != Stage::kDdp; }
  // ZeRO-2 and 3: each rank keeps only its shard of the gradients, staged per bucket.
  bool shardsGradients() const { return options.stage >= Stage::kZero2; }
  bool shardsParameters() const { return options.stage == Stage::kZero3; }
  // Whether markReady() reduces in this micro-batch (ZeRO-2 and 3 reduce every one).
  bool reducesNow() const { return sync || shardsGradients(); }
  std::byte* workingAt(size_t element) { return working.data() + element * parameterBytes; }
  // The working copy of a segment this rank updates: in the whole copy, or (ZeRO-3) its shard.
  std::byte* ownedWorking(const Segment& s) {
    return workingAt(shardsParameters() ? s.stateOffset : s.flatOffset);
  }
  // Where a parameter's values are whole: the working copy, or (ZeRO-3) its gathered layer.
  std::byte* wholeParameter(const Param& p, const char* what);
  Layer& layer(int index, const char* what);
  void startGather(Layer& l);
  // In a gradient buffer: gradients, staging or accumulation.
  std::byte* gradientAt(const Buffer& storage, size_t element) {
    return storage.data() + element * gradientBytes;
  }

  void check(braidResult_t result, const char* what) const;
  void requireFinalized(const char* what) const;
  Param& param(int id, const char* what);
  void layOut();
  void allocate();      // finalize()'s buffers and state, once laid out
  void forgetLayout();  // undoes layOut() and allocate() after a failure
  void* gradientOf(Param& p);
  void acquireStaging(int bucketIndex);
  void launch(int bucketIndex);
  void launchInOrder();
  void settle(int bucketIndex);
  void endMicroBatch();
  void drain(const char* what);
  std::byte* ownedGradient(const Segment& segment);
  void update(const kernels::UpdateArgs& args);
  void updateOnHost(const kernels::UpdateArgs& args, const Segment& s, const SegmentState& st);
  void checkStepMayRun();
  Verdict agreeOnVerdict();
  void applyStep(double scale, double gradNorm);
  StepResult step();

  braidComm_t comm;
  Options options;
  int rank = 0;
  int nranks = 1;
  int device = -1;  // a CUDA communicator's device, else -1
  braidDataType_t gradientType;
  size_t parameterBytes;  // per element of the working copy
  size_t gradientBytes;   // per element of a gradient buffer
  LossScaler scaler;
  // Host memory and the CPU kernels, or a CUDA device's (braidCommCuDevice); declared before the
  // buffers, which it allocates and outlives.
  std::unique_ptr<Backend> backend;

  bool finalized = false;
  std::vector<Param> params;
  std::vector<Layer> layers{1};
  std::vector<Bucket> buckets;
  std::vector<Segment> segments;  // one per bucket
  size_t registeredCount = 0;
  size_t paddedCount = 0;
  size_t ownedCount = 0;

  Buffer working;    // the whole working copy
  Buffer gradients;  // DDP, ZeRO-1: whole; ZeRO-2: the owned shard
  Buffer staging;    // ZeRO-2: slots x slotCount
  // ZeRO-2, once a window has a second micro-batch; ZeRO-1: the shards earlier micro-batches of
  // the window reduced (shardsAccumulated), once a second one reduces.
  Buffer accumulation;
  bool shardsAccumulated = false;
  std::vector<StagingSlot> slots;
  size_t slotCount = 0;  // elements per staging slot: the largest bucket
  // ZeRO-Offload (OffloadTier::kHost on a CUDA communicator): host memory for the state and for
  // one segment's gradient and updated parameters on their way through the host's step; declared
  // before what it allocates.
  std::unique_ptr<Backend> host;
  Buffer hostGradient, hostWorking;
  // The owned shard's fp32 master weights (16-bit precision, or stepping on the host), Adam's m or
  // SGD's momentum, and Adam's v: resident, in host memory (kHost), or in a file (kFile).
  std::unique_ptr<StateStore> state;
  bool hasMaster = false;
  Buffer verdict;  // one Verdict: the step's overflow flag and sum of squares

  size_t readyCount = 0;  // parameters ready in this micro-batch
  size_t nextBucket = 0;  // the next to start reducing in this micro-batch
  bool sync = true;       // this micro-batch reduces
  int microBatchInWindow = 0;
  bool lastMicroBatchSynced = false;
  int optimizerSteps = 0;  // applied steps, for Adam's bias correction
  double exposedCommSeconds = 0;
  uint64_t collectiveBytes = 0;
};

namespace {

LossScalerOptions scalerOptions(const Options& options) {
  if (options.lossScaling) return options.lossScaler;
  LossScalerOptions fixed;  // a scale of 1 that never moves
  fixed.initialScale = 1;
  fixed.growthFactor = 1;
  fixed.minScale = 1;
  return fixed;
}

void validate(const OptimizerOptions& o) {
  if (!(o.learningRate >= 0) || !(o.weightDecay >= 0) || !(o.momentum >= 0) ||
      !(o.maxGradNorm >= 0))
    fail(braidInvalidArgument,
         "DataParallel: learningRate {}, weightDecay {}, momentum {}, maxGradNorm {} (expected "
         "all >= 0)",
         o.learningRate, o.weightDecay, o.momentum, o.maxGradNorm);
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1) || !(o.epsilon > 0))
    fail(braidInvalidArgument,
         "DataParallel: beta1 {}, beta2 {}, epsilon {} (expected betas in [0, 1), epsilon > 0)",
         o.beta1, o.beta2, o.epsilon);
}

}  // namespace

DataParallel::Impl::Impl(braidComm_t communicator, const Options& requested)
    : comm(communicator),
      options(requested),
      gradientType(requested.fp32Gradients ? braidFloat32 : requested.precision),
      parameterBytes(elementSize(requested.precision)),
      gradientBytes(elementSize(gradientType)),
      scaler(scalerOptions(requested)) {
  if (comm == nullptr) fail(braidInvalidArgument, "DataParallel: comm is NULL");
  check(braidCommCount(comm, &nranks), "braidCommCount");
  check(braidCommUserRank(comm, &rank), "braidCommUserRank");
  check(braidCommCuDevice(comm, &device), "braidCommCuDevice");
  if (options.bucketBytes == 0 || options.firstBucketBytes == 0)
    fail(braidInvalidArgument,
         "DataParallel on rank {}: bucketBytes {} and firstBucketBytes {} (expected both > 0)",
         rank, options.bucketBytes, options.firstBucketBytes);
  if (options.stage >= Stage::kZero2 && options.stagingBuffers < 1)
    fail(braidInvalidArgument, "DataParallel on rank {}: stagingBuffers {} (expected >= 1)", rank,
         options.stagingBuffers);
  if (options.stage < Stage::kDdp || options.stage > Stage::kZero3)
    fail(braidInvalidArgument, "DataParallel on rank {}: stage {} (expected 0, 1, 2 or 3)", rank,
         static_cast<int>(options.stage));
  validate(options.optimizer);
  if (device >= 0 && options.offload.tier == OffloadTier::kFile)
    fail(braidInvalidUsage,
         "DataParallel on rank {}: OffloadTier::kFile pages the optimizer state of a CPU "
         "communicator; this one is on CUDA device {} (expected a CPU communicator, or "
         "OffloadTier::kNone)",
         rank, device);
  backend = device >= 0 ? makeCudaBackend(comm, rank, device) : makeHostBackend(comm, rank);
}

DataParallel::Impl::~Impl() {
  // Queued collectives and kernels point into the buffers, which go before the backend: let
  // them finish first. A destructor cannot report an error; the communicator keeps it
  // (braidCommGetAsyncError), if the caller has not destroyed it already.
  backend->quiesce();
}

void DataParallel::Impl::check(braidResult_t result, const char* what) const {
  if (result != braidSuccess)
    fail(result, "DataParallel on rank {}: {} failed: {}", rank, what, braidGetLastError(comm));
}

void DataParallel::Impl::requireFinalized(const char* what) const {
  if (!finalized)
    fail(braidInvalidUsage,
         "DataParallel on rank {}: {} before finalize() (expected "
         "addParameter() for every parameter, then finalize())",
         rank, what);
}

DataParallel::Impl::Param& DataParallel::Impl::param(int id, const char* what) {
  if (id < 0 || static_cast<size_t>(id) >= params.size())
    fail(braidInvalidArgument,
         "DataParallel on rank {}: {}: parameter id {} is out of range (expected 0..{})", rank,
         what, id, static_cast<int>(params.size()) - 1);
  return params[id];
}

// DDP's bucket assignment: parameters in reverse order; a bucket closes once its gradients reach
// its cap (the first bucket's cap is smaller, so the last layers' all-reduce starts early).
void DataParallel::Impl::layOut() {
  const size_t n = static_cast<size_t>(nranks);
  size_t cap = options.firstBucketBytes;
  Bucket open;
  size_t openCount = 0;
  auto close = [&] {
    open.offset = paddedCount;
    size_t inside = 0;
    for (int id : open.params) {
      params[id].offset = paddedCount + inside;
      params[id].bucket = static_cast<int>(buckets.size());
      inside += params[id].count;
    }
    open.count = (inside + n - 1) / n * n;
    open.unready = open.params.size();
    paddedCount += open.count;
    buckets.push_back(std::move(open));
    open = Bucket{};
    openCount = 0;
    cap = options.bucketBytes;
  };
  for (int id = static_cast<int>(params.size()) - 1; id >= 0; --id) {
    // No bucket holds two layers' parameters: ZeRO-3 gathers a layer's buckets, and every stage
    // lays out alike (the same buckets reduce the same elements in the same order).
    if (!open.params.empty() && params[open.params.back()].layer != params[id].layer) close();
    open.params.push_back(id);
    openCount += params[id].count;
    if (openCount * gradientBytes >= cap) close();
  }
  if (!open.params.empty()) close();
  for (size_t i = 0; i < buckets.size() && shardsParameters(); ++i) {
    Layer& l = layers[params[buckets[i].params.front()].layer];
    if (l.firstBucket < 0) {
      l.firstBucket = static_cast<int>(i);
      l.offset = buckets[i].offset;
    }
    l.lastBucket = static_cast<int>(i);
    l.count = buckets[i].offset + buckets[i].count - l.offset;
  }

  for (const Bucket& b : buckets) {
    const size_t slice = sharded() ? b.count / n : b.count;
    const size_t first = sharded() ? b.offset + static_cast<size_t>(rank) * slice : b.offset;
    segments.push_back(Segment{first, ownedCount, slice});
    ownedCount += slice;
    slotCount = std::max(slotCount, b.count);
  }
}

DataParallel::DataParallel(braidComm_t comm, const Options& options)
    : impl_(std::make_unique<Impl>(comm, options)) {}

DataParallel::~DataParallel() = default;

int DataParallel::addParameter(size_t count, std::string name) {
  Impl& d = *impl_;
  const int id = static_cast<int>(d.params.size());
  if (name.empty()) name = "param" + std::to_string(id);
  if (d.finalized)
    fail(braidInvalidUsage,
         "DataParallel on rank {}: addParameter('{}') after finalize() (expected every "
         "parameter registered first)",
         d.rank, name);
  if (count == 0)
    fail(braidInvalidArgument,
         "DataParallel on rank {}: addParameter('{}'): count is 0 (expected >= 1)", d.rank, name);
  d.params.push_back(Impl::Param{std::move(name), count, static_cast<int>(d.layers.size()) - 1});
  d.registeredCount += count;
  return id;
}

int DataParallel::beginLayer() {
  Impl& d = *impl_;
  if (d.finalized)
    fail(braidInvalidUsage,
         "DataParallel on rank {}: beginLayer() after finalize() (expected every layer and its "
         "parameters before finalize())",
         d.rank);
  d.layers.emplace_back();
  return static_cast<int>(d.layers.size()) - 1;
}

int DataParallel::layerCount() const {
  return static_cast<int>(impl_->layers.size());
}

void DataParallel::finalize() {
  Impl& d = *impl_;
  if (d.finalized) fail(braidInvalidUsage, "DataParallel on rank {}: finalize() twice", d.rank);
  if (d.params.empty())
    fail(braidInvalidUsage,
         "DataParallel on rank {}: finalize() with no parameters (expected addParameter() "
         "first)",
         d.rank);
  d.layOut();
  try {
    d.allocate();
  } catch (...) {
    d.forgetLayout();  // finalize() may be called again
    throw;
  }
  d.finalized = true;
}

void DataParallel::Impl::allocate() {
  working = Buffer(*backend, (shardsParameters() ? ownedCount : paddedCount) * parameterBytes);
  const bool shards = shardsGradients();
  gradients = Buffer(*backend, (shards ? ownedCount : paddedCount) * gradientBytes);
  if (shards) {
    slots.resize(std::min<size_t>(options.stagingBuffers, buckets.size()));
    staging = Buffer(*backend, slots.size() * slotCount * gradientBytes);
  }
  const OptimizerOptions& o = options.optimizer;
  StateLayout layout;
  // Stepping on the host keeps fp32 master weights there whatever the precision: the device's
  // working copy is only what the forward pass reads.
  const bool stepOnHost = options.offload.tier == OffloadTier::kHost && device >= 0;
  layout.master = hasMaster = options.precision != braidFloat32 || stepOnHost;
  layout.moment1 = o.kind != OptimizerKind::kSgd || o.momentum != 0;
  layout.moment2 = o.kind != OptimizerKind::kSgd;
  layout.ownedCount = ownedCount;
  for (const Segment& s : segments) layout.segments.push_back({s.stateOffset, s.count});
  if (stepOnHost) {
    host = makeHostBackend(comm, rank);
    size_t largest = 0;
    for (const Segment& s : segments) largest = std::max(largest, s.count);
    hostGradient = Buffer(*host, largest * gradientBytes);
    hostWorking = Buffer(*host, largest * parameterBytes);
  }
  state = options.offload.tier == OffloadTier::kFile
              ? makeFileStore(layout, options.offload.directory, rank)
              : makeResidentStore(stepOnHost ? *host : *backend, layout);
  verdict = Buffer(*backend, sizeof(Verdict));
}

void DataParallel::Impl::forgetLayout() {
  state.reset();
  for (Buffer* b : {&hostWorking, &hostGradient, &working, &gradients, &staging}) *b = Buffer();
  host.reset();
  buckets.clear();
  segments.clear();
  slots.clear();
  for (Layer& l : layers) l = Layer{};
  paddedCount = ownedCount = slotCount = 0;
}

void DataParallel::setParameter(int id, std::span<const float> values) {
  Impl& d = *impl_;
  d.requireFinalized("setParameter");
  Impl::Param& p = d.param(id, "setParameter");
  if (values.size() != p.count)
    fail(braidInvalidArgument,
         "DataParallel on rank {}: setParameter('{}'): {} values (expected {})", d.rank, p.name,
         values.size(), p.count);
  // ZeRO-3, its layer gathered: the whole copy the forward pass reads, too (found first: that
  // waits for the layer's gather, which reads the shard written below).
  if (d.shardsParameters() && !d.layers[p.layer].gathered.empty())
    d.backend->fromHostFloat(values.data(), d.wholeParameter(p, "setParameter"),
                             d.options.precision, p.count);
  // The part of the parameter this rank owns: its master weights, and (ZeRO-3) its working copy.
  const Impl::Segment& s = d.segments[p.bucket];
  const size_t lo = std::max(p.offset, s.flatOffset);
  const size_t hi = std::min(p.offset + p.count, s.flatOffset + s.count);
  if (!d.shardsParameters())
    d.backend->fromHostFloat(values.data(), d.workingAt(p.offset), d.options.precision, p.count);
  else if (lo < hi)
    d.backend->fromHostFloat(values.data() + (lo - p.offset),
                             d.workingAt(s.stateOffset + lo - s.flatOffset), d.options.precision,
                             hi - lo);
  if (d.hasMaster && lo < hi)  // fp32 has none: the working copy is the master
    d.state->setMaster(s.stateOffset + lo - s.flatOffset, values.data() + (lo - p.offset), hi - lo);
}

void DataParallel::getParameter(int id, std::span<float> out) const {
  Impl& d = *impl_;
  d.requireFinalized("getParameter");
  const Impl::Param& p = d.param(id, "getParameter");
  if (out.size() != p.count)
    fail(braidInvalidArgument,
         "DataParallel on rank {}: getParameter('{}'): room for {} values (expected {})", d.rank,
         p.name, out.size(), p.count);
  d.backend->toHostFloat(d.wholeParameter(p, "getParameter"), d.options.precision, out.data(),
                         p.count);
}

const void* DataParallel::parameter(int id) const {
  Impl& d = *impl_;
  d.requireFinalized("parameter");
  return d.wholeParameter(d.param(id, "parameter"), "parameter");
}

std::byte* DataParallel::Impl::wholeParameter(const Param& p, const char* what) {
  if (!shardsParameters()) return workingAt(p.offset);
  Layer& l = layers[p.layer];
  if (l.gathered.empty())
    fail(braidInvalidUsage,
         "DataParallel on rank {}: {}('{}') while its layer {} is not gathered (ZeRO-3 keeps only "
         "this rank's shard: expected gatherLayer({}) first)",
         rank, what, p.name, p.layer, p.layer);
  if (l.inFlight) drain("gathering a layer's parameters");
  return l.gathered.data() + (p.offset - l.offset) * parameterBytes;
}

DataParallel::Impl::Layer& DataParallel::Impl::layer(int index, const char* what) {
  requireFinalized(what);
  if (index < 0 || static_cast<size_t>(index) >= layers.size())
    fail(braidInvalidArgument,
         "DataParallel on rank {}: {}({}): layer out of range (expected 0..{})", rank, what, index,
         static_cast<int>(layers.size()) - 1);
  return layers[index];
}

// Every bucket of the layer all-gathered from the ranks' shards into one buffer, queued on the
// stream.
void DataParallel::Impl::startGather(Layer& l) {
  if (l.firstBucket < 0 || !l.gathered.empty()) return;  // no parameters, or already gathered
  l.gathered = Buffer(*backend, l.count * parameterBytes);
  for (int b = l.firstBucket; b <= l.lastBucket; ++b) {
    const Segment& s = segments[b];
    check(braidAllGather(workingAt(s.stateOffset),
                         l.gathered.data() + (buckets[b].offset - l.offset) * parameterBytes,
                         s.count, options.precision, comm, backend->stream()),
          "braidAllGather of a layer's parameters");
    collectiveBytes += buckets[b].count * parameterBytes;
  }
  l.inFlight = true;
}

void DataParallel::prefetchLayer(int layer) {
  Impl& d = *impl_;
  Impl::Layer& l = d.layer(layer, "prefetchLayer");
  if (d.shardsParameters()) d.startGather(l);
}

void DataParallel::gatherLayer(int layer) {
  Impl& d = *impl_;
  Impl::Layer& l = d.layer(layer, "gatherLayer");
  if (!d.shardsParameters()) return;
  d.startGather(l);
  if (l.inFlight) d.drain("gathering a layer's parameters");
}

void DataParallel::releaseLayer(int layer) {
  Impl& d = *impl_;
  Impl::Layer& l = d.layer(layer, "releaseLayer");
  if (!d.shardsParameters()) return;
  if (l.inFlight) d.drain("gathering a layer's parameters");  // the stream still writes there
  l.gathered = Buffer();
}

braidDataType_t DataParallel::gradientType() const {
  return impl_->gradientType;
}

void* DataParallel::Impl::gradientOf(Param& p) {
  settle(p.bucket);
  if (!shardsGradients()) return gradientAt(gradients, p.offset);
  Bucket& b = buckets[p.bucket];
  if (b.stagingSlot < 0) acquireStaging(p.bucket);
  return gradientAt(staging,
                    static_cast<size_t>(b.stagingSlot) * slotCount + (p.offset - b.offset));
}

void* DataParallel::gradient(int id) {
  Impl& d = *impl_;
  d.requireFinalized("gradient");
  Impl::Param& p = d.param(id, "gradient");
  if (p.ready)
    fail(braidInvalidUsage,
         "DataParallel on rank {}: gradient('{}') after markReady('{}') in the same micro-batch "
         "(expected the gradient complete before it is marked ready)",
         d.rank, p.name, p.name);
  return d.gradientOf(p);
}

// ZeRO-2: bucket i fills a staging slot whose last bucket has started reducing (i mod slots first);
// one still being reduced is waited for. None: every slot holds a bucket still being filled, or
// filled and waiting for an earlier bucket to start (buckets start in index order), so the
// backward pass holds more buckets open at once than there are slots.
void DataParallel::Impl::acquireStaging(int bucketIndex) {
  const int n = static_cast<int>(slots.size());
  int s = bucketIndex % n;
  for (int tried = 0; tried < n; ++tried, s = (s + 1) % n)
    if (slots[s].occupant < 0 || buckets[slots[s].occupant].stagingSlot != s) break;
  StagingSlot& slot = slots[s];
  if (slot.occupant >= 0 && buckets[slot.occupant].stagingSlot == s)
    fail(braidInvalidUsage,
         "DataParallel on rank {}: ZeRO-2 needs a staging buffer for bucket {} while all {} hold "
         "buckets being filled or waiting for an earlier bucket to start reducing (bucket {} "
         "first; buckets start in index order): this backward pass keeps more buckets open than "
         "there are staging buffers (raise Options::stagingBuffers)",
         rank, bucketIndex, n, nextBucket);
  if (slot.inFlight) drain("waiting for a staging buffer's reduce-scatter");
  backend->zero(gradientAt(staging, static_cast<size_t>(s) * slotCount), slotCount * gradientBytes);
  slot.occupant = bucketIndex;
  buckets[bucketIndex].stagingSlot = s;
}

void DataParallel::markReady(int id) {
  Impl& d = *impl_;
  d.requireFinalized("markReady");
  Impl::Param& p = d.param(id, "markReady");
  if (p.ready)
    fail(braidInvalidUsage,
         "DataParallel on rank {}: markReady('{}') twice in one micro-batch (expected each "
         "parameter once)",
         d.rank, p.name);
  d.settle(p.bucket);  // a gradient left untouched in this micro-batch, too
  p.ready = true;
  ++d.readyCount;
  --d.buckets[p.bucket].unready;
  if (d.reducesNow()) {
    // Divide before the sum, as DDP does (and braidAvg on floats): a sum can overflow where
    // the average would not. Here, while the gradient is still in cache. (gradientOf also gives
    // a ZeRO-2/3 bucket its staging buffer, if it had none yet.)
    void* grad = d.gradientOf(p);
    if (d.nranks > 1)
      d.backend->scale(grad, d.gradientType, p.count, 1.0f / static_cast<float>(d.nranks));
    d.launchInOrder();
  }
  if (d.readyCount == d.params.size()) d.endMicroBatch();
}

void DataParallel::Impl::launch(int bucketIndex) {
  Bucket& b = buckets[bucketIndex];
  const braidRedOp_t op = braidSum;  // of gradients divided already (markReady)
  const braidDataType_t type = gradientType;
  const Segment& s = segments[bucketIndex];
  const braidStream_t stream = backend->stream();
  collectiveBytes += b.count * gradientBytes;
  switch (options.stage) {
    case Stage::kDdp:
      check(braidAllReduce(gradientAt(gradients, b.offset), gradientAt(gradients, b.offset),
                           b.count, type, op, comm, stream),
            "braidAllReduce of a gradient bucket");
      break;
    case Stage::kZero1:
      check(braidReduceScatter(gradientAt(gradients, b.offset), gradientAt(gradients, s.flatOffset),
                               s.count, type, op, comm, stream),
            "braidReduceScatter of a gradient bucket");
      break;
    case Stage::kZero2:
    case Stage::kZero3: {
      // The window's first micro-batch reduces straight into the shard; later ones into a
      // second shard-sized buffer, added once the reduction is known complete (drain()).
      b.accumulate = microBatchInWindow > 0;
      if (b.accumulate && accumulation.empty())
        accumulation = Buffer(*backend, ownedCount * gradientBytes);
      std::byte* target = gradientAt(b.accumulate ? accumulation : gradients, s.stateOffset);
      check(braidReduceScatter(gradientAt(staging, static_cast<size_t>(b.stagingSlot) * slotCount),
                               target, s.count, type, op, comm, stream),
            "braidReduceScatter of a gradient bucket");
      slots[b.stagingSlot].inFlight = true;
      b.stagingSlot = -1;
      break;
    }
  }
  b.reducedInPlace = !shardsGradients();  // DDP's all-reduce, ZeRO-1's reduce-scatter
}

// As DDP's reducer, buckets start reducing in index order whatever order their parameters become
// ready in: a rank whose backward pass readied them in another order than its peers' would pair
// its buckets with other buckets of theirs (of equal sizes: averaged together, silently).
void DataParallel::Impl::launchInOrder() {
  while (nextBucket < buckets.size() && buckets[nextBucket].unready == 0) launch(nextBucket++);
}

// Before a later micro-batch touches a bucket that DDP or ZeRO-1 reduced in place: waits for the
// reduction (the stream still reads and writes the bucket; DDP's backward pass ends waiting for
// its buckets). ZeRO-1 then moves its reduced shard aside and zeroes the bucket: the bucket's
// other slices still hold this rank's own unreduced gradients, which the next reduce-scatter
// would add again; step() adds the shards back.
void DataParallel::Impl::settle(int bucketIndex) {
  if (!buckets[bucketIndex].reducedInPlace) return;
  drain("waiting for the last micro-batch's gradient reductions");
  const bool zero1 = options.stage == Stage::kZero1;
  if (zero1 && accumulation.empty()) accumulation = Buffer(*backend, ownedCount * gradientBytes);
  for (size_t i = 0; i < buckets.size(); ++i) {
    Bucket& b = buckets[i];
    if (!b.reducedInPlace) continue;
    b.reducedInPlace = false;
    if (!zero1) continue;
    if (!shardsAccumulated) backend->zero(accumulation.data(), accumulation.size());
    shardsAccumulated = true;
    const Segment& s = segments[i];
    backend->add(gradientAt(accumulation, s.stateOffset), gradientAt(gradients, s.flatOffset),
                 gradientType, s.count);
    backend->zero(gradientAt(gradients, b.offset), b.count * gradientBytes);
  }
}

void DataParallel::Impl::endMicroBatch() {
  lastMicroBatchSynced = sync;
  ++microBatchInWindow;
  readyCount = 0;
  nextBucket = 0;
  for (Param& p : params) p.ready = false;
  for (Bucket& b : buckets) b.unready = b.params.size();
}

void DataParallel::setGradientSync(bool sync) {
  Impl& d = *impl_;
  if (d.readyCount != 0)
    fail(braidInvalidUsage,
         "DataParallel on rank {}: setGradientSync() in the middle of a micro-batch ({} of {} "
         "parameters ready; expected it between micro-batches)",
         d.rank, d.readyCount, d.params.size());
  d.sync = sync;
}

void DataParallel::Impl::drain(const char* what) {
  const auto start = std::chrono::steady_clock::now();
  const braidResult_t result = backend->synchronize();
  exposedCommSeconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check(result, what);
  for (StagingSlot& slot : slots) slot.inFlight = false;
  for (Layer& l : layers) l.inFlight = false;
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (!buckets[i].accumulate) continue;
    const Segment& s = segments[i];
    backend->add(gradientAt(gradients, s.stateOffset), gradientAt(accumulation, s.stateOffset),
                 gradientType, s.count);
    buckets[i].accumulate = false;
  }
}

std::byte* DataParallel::Impl::ownedGradient(const Segment& s) {
  return gradientAt(gradients, shardsGradients() ? s.stateOffset : s.flatOffset);
}

// Every owned segment's update, its optimizer state paged in ahead and out behind where it lives
// in a file (the next segment's read and the last one's write-back overlap this one's update).
void DataParallel::Impl::update(const kernels::UpdateArgs& args) {
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    if (i + 1 < segments.size()) state->prefetch(i + 1);
    const SegmentState st = state->acquire(i);
    if (host != nullptr) {
      updateOnHost(args, s, st);
      state->release(i);
      continue;
    }
    float* master = hasMaster ? st.master : reinterpret_cast<float*>(ownedWorking(s));
    backend->update(args, ownedGradient(s), master, st.moment1, st.moment2, ownedWorking(s),
                    s.count);
    state->release(i);
  }
  state->flush();
}

// ZeRO-Offload: the segment's gradient shard down to the host, the CPU kernels' step on the
// host's state, the updated parameters back up (each copy done when it returns).
void DataParallel::Impl::updateOnHost(const kernels::UpdateArgs& args, const Segment& s,
                                      const SegmentState& st) {
  backend->copyToHost(hostGradient.data(), ownedGradient(s), s.count * gradientBytes);
  host->update(args, hostGradient.data(), st.master, st.moment1, st.moment2, hostWorking.data(),
               s.count);
  backend->copyFromHost(ownedWorking(s), hostWorking.data(), s.count * parameterBytes);
}

// What step() expects of the window it ends.
void DataParallel::Impl::checkStepMayRun() {
  for (size_t i = 0; i < layers.size(); ++i)
    if (!layers[i].gathered.empty())
      fail(braidInvalidUsage,
           "DataParallel on rank {}: step() while layer {} is gathered (ZeRO-3: expected "
           "releaseLayer() of every layer first; the step updates the shards it was gathered "
           "from)",
           rank, i);
  if (readyCount != 0) {
    const auto missing =
        std::find_if(params.begin(), params.end(), [](auto& p) { return !p.ready; });
    fail(braidInvalidUsage,
         "DataParallel on rank {}: step() in the middle of a micro-batch: {} of {} parameters "
         "are ready ('{}' is not)",
         rank, readyCount, params.size(), missing->name);
  }
  if (!lastMicroBatchSynced)
    fail(braidInvalidUsage,
         "DataParallel on rank {}: step() {} (expected a micro-batch with gradient sync on "
         "to end the window)",
         rank, microBatchInWindow == 0 ? "before any micro-batch" : "after a no-sync micro-batch");
}

// The step's overflow flag and squared gradient norm, alike on every rank (and every pipeline
// stage). The verdict stays in the backend's memory until the ranks agree on it, then comes to
// the host once per step (as GradScaler's found_inf does).
Verdict DataParallel::Impl::agreeOnVerdict() {
  auto* agreed = reinterpret_cast<Verdict*>(verdict.data());
  backend->zero(agreed, sizeof(Verdict));
  for (const Segment& s : segments)
    backend->inspect(ownedGradient(s), gradientType, s.count, agreed);
  // Every rank must skip the same steps: the verdict is the maximum of the ranks' flags.
  const braidStream_t stream = backend->stream();
  check(braidAllReduce(&agreed->overflowFlag, &agreed->overflowFlag, 1, braidFloat32, braidMax,
                       comm, stream),
        "braidAllReduce (max) of the overflow flag");
  // Sharded: each rank holds a share of the sum. Whole (DDP): every rank must still clip by the
  // same factor, and a device adds its blocks' sums in any order, so the ranks' sums may differ
  // in their last bits: the largest is everyone's.
  check(braidAllReduce(&agreed->sumSquares, &agreed->sumSquares, 1, braidFloat64,
                       sharded() ? braidSum : braidMax, comm, stream),
        "braidAllReduce of the squared gradient norm");
  // Pipeline stages: the model's verdict is every stage's (each holds its layers' sum of squares,
  // agreed over its replicas above).
  if (options.pipelineComm != nullptr) {
    check(braidAllReduce(&agreed->overflowFlag, &agreed->overflowFlag, 1, braidFloat32, braidMax,
                         options.pipelineComm, stream),
          "braidAllReduce (max) of the overflow flag over the pipeline's stages");
    check(braidAllReduce(&agreed->sumSquares, &agreed->sumSquares, 1, braidFloat64, braidSum,
                         options.pipelineComm, stream),
          "braidAllReduce (sum) of the squared gradient norm over the pipeline's stages");
  }
  drain("agreeing on overflow and the gradient norm");
  Verdict v;
  backend->copyToHost(&v, agreed, sizeof v);
  return v;
}

// The optimizer's step on the unscaled, clipped gradients; ZeRO-1 and 2 then gather the updated
// shards into every rank's whole copy, ZeRO-3 keeps shards (the next forward pass gathers them).
void DataParallel::Impl::applyStep(double scale, double gradNorm) {
  const double maxNorm = options.optimizer.maxGradNorm;
  const double clip = maxNorm > 0 ? std::min(1.0, maxNorm / (gradNorm + 1e-6)) : 1.0;
  ++optimizerSteps;
  const kernels::UpdateArgs args{options.optimizer, optimizerSteps,
                                 static_cast<float>(clip / scale), gradientType, options.precision};
  update(args);
  if (!sharded() || shardsParameters()) return;
  for (size_t i = 0; i < buckets.size(); ++i) {
    check(braidAllGather(workingAt(segments[i].flatOffset), workingAt(buckets[i].offset),
                         segments[i].count, options.precision, comm, backend->stream()),
          "braidAllGather of updated parameters");
    collectiveBytes += buckets[i].count * parameterBytes;
  }
  drain("all-gathering the updated parameters");
}

StepResult DataParallel::Impl::step() {
  requireFinalized("step");
  checkStepMayRun();
  drain("reducing the gradient buckets");
  for (Bucket& b : buckets) b.reducedInPlace = false;
  if (shardsAccumulated) {  // ZeRO-1: the window's earlier micro-batches' reduced shards
    for (const Segment& s : segments)
      backend->add(gradientAt(gradients, s.flatOffset), gradientAt(accumulation, s.stateOffset),
                   gradientType, s.count);
    shardsAccumulated = false;
  }
  const Verdict v = agreeOnVerdict();
  const double scale = scaler.scale();
  const bool overflow = v.overflowFlag != 0;
  scaler.update(overflow);
  StepResult result{
      !overflow, scale,
      overflow ? std::numeric_limits<double>::infinity() : std::sqrt(v.sumSquares) / scale};
  if (!overflow) applyStep(scale, result.gradNorm);
  // Waits for the stream (Backend::zero): every buffer is idle when step() returns.
  backend->zero(gradients.data(), gradients.size());
  microBatchInWindow = 0;
  lastMicroBatchSynced = false;
  return result;
}

StepResult DataParallel::step() {
  return impl_->step();
}

MemoryReport DataParallel::memoryReport() const {
  const Impl& d = *impl_;
  d.requireFinalized("memoryReport");
  // A layer gathered and the next one prefetched while it computes.
  size_t largestLayer = 0;
  for (size_t l = 0; l < d.layers.size(); ++l)
    largestLayer = std::max(
        largestLayer, d.layers[l].count + (l + 1 < d.layers.size() ? d.layers[l + 1].count : 0));
  return MemoryReport{d.registeredCount, d.paddedCount, d.working.size(),
                      largestLayer * d.parameterBytes, d.gradients.size() + d.accumulation.size(),
                      d.staging.size(),
                      // ZeRO-Offload's state is all in host memory, off the device.
                      d.host != nullptr ? 0 : d.state->residentBytes(),
                      d.host != nullptr ? d.state->residentBytes() : d.state->offloadedBytes()};
}

double DataParallel::lossScale() const {
  return impl_->scaler.scale();
}
void DataParallel::setLearningRate(double learningRate) {
  impl_->options.optimizer.learningRate = learningRate;
}
double DataParallel::exposedCommSeconds() const {
  return impl_->exposedCommSeconds;
}
uint64_t DataParallel::collectiveBytes() const {
  return impl_->collectiveBytes;
}
int DataParallel::rank() const {
  return impl_->rank;
}
int DataParallel::nranks() const {
  return impl_->nranks;
}
int DataParallel::bucketCount() const {
  return static_cast<int>(impl_->buckets.size());
}

}  // namespace braid::dp
