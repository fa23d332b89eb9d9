// The C API's entry points: communicator creation, the collectives, AlltoAll/Gather/Scatter as
// groups of sends and receives, streams. Argument checks are in arguments.*, group calls in
// groups.*, the turn of any failure into a result code in entry.*.
#include <strings.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "base/params.h"
#include "braid/braid.h"
#include "coll/call_tag.h"
#include "core/arguments.h"
#include "core/bootstrap.h"
#include "core/comm.h"
#include "core/cuda_probe.h"
#include "core/entry.h"
#include "core/groups.h"
#include "core/host_stream.h"
#include "core/launch_env.h"
#include "kernels/host_reduce.h"

using braid::apiName;
using braid::CollArgs;
using braid::Collective;
using braid::Error;
using braid::fail;
using namespace braid::api;

namespace {

struct PendingSplit {
  braidComm* parent;
  int color;
  int key;
  std::optional<braidConfig_t> config;
};

struct PendingShrink {
  braidComm* parent;
  std::vector<int> excluded;
  std::optional<braidConfig_t> config;
  int flags;
};

// ---- communicator creation ---------------------------------------------------------------------

// A config kept for later, read no further than its size (one made before `algorithms` existed
// ends before it); the fields it lacks stay unset.
std::optional<braidConfig_t> copyOfConfig(const braidConfig_t* config) {
  if (config == nullptr) return std::nullopt;
  braidConfig_t copy = BRAID_CONFIG_INITIALIZER;
  std::memcpy(&copy, config, std::min(config->size, sizeof copy));
  copy.size = sizeof copy;
  return copy;
}

CommOptions optionsFrom(const braidConfig_t* config, int rank) {
  CommOptions options;
  options.timeoutMs = static_cast<int>(braid::param::TimeoutMs());
  options.minChannels = static_cast<int>(braid::param::MinNChannels());
  options.maxChannels = static_cast<int>(braid::param::MaxNChannels());
  std::string device = braid::param::Device();
  std::string channelsFrom = "BRAID_MIN_NCHANNELS and BRAID_MAX_NCHANNELS";
  if (config != nullptr) {
    // Configs made before `algorithms` existed end before it.
    if (config->magic != BRAID_CONFIG_MAGIC || config->size < offsetof(braidConfig_t, algorithms))
      fail(braidInvalidArgument,
           "braidCommInitRankConfig on rank {}: config was not initialized with "
           "BRAID_CONFIG_INITIALIZER",
           rank);
    for (auto [flag, name] :
         {std::pair{config->blocking, "blocking"}, std::pair{config->splitShare, "splitShare"},
          std::pair{config->shrinkShare, "shrinkShare"}})
      if (flag != BRAID_CONFIG_UNDEF_INT && flag != 0 && flag != 1)
        fail(braidInvalidArgument, "rank {}: config {} is {} (expected 0 or 1)", rank, name, flag);
    if (config->blocking != BRAID_CONFIG_UNDEF_INT) options.blocking = config->blocking != 0;
    if (config->commName != nullptr) options.name = config->commName;
    if (config->timeoutMs != BRAID_CONFIG_UNDEF_INT) options.timeoutMs = config->timeoutMs;
    if (config->device != nullptr) device = config->device;
    if (config->minChannels != BRAID_CONFIG_UNDEF_INT) options.minChannels = config->minChannels;
    if (config->maxChannels != BRAID_CONFIG_UNDEF_INT) options.maxChannels = config->maxChannels;
    if (config->splitShare != BRAID_CONFIG_UNDEF_INT) options.splitShare = config->splitShare != 0;
    if (config->size >= sizeof(braidConfig_t) && config->algorithms != nullptr) {
      options.algorithms = config->algorithms;
      braid::plan::allowedAlgorithms(options.algorithms,
                                     fmt::format("rank {}: config algorithms", rank).c_str());
    }
    if (config->shrinkShare != BRAID_CONFIG_UNDEF_INT)
      options.shrinkShare = config->shrinkShare != 0;
    if (config->minChannels != BRAID_CONFIG_UNDEF_INT ||
        config->maxChannels != BRAID_CONFIG_UNDEF_INT)
      channelsFrom = "config minChannels and maxChannels";
    // braid's one network between hosts is TCP, which NCCL names "Socket".
    if (config->netName != nullptr && strcasecmp(config->netName, "Socket") != 0)
      fail(braidInvalidArgument,
           "rank {}: config netName '{}' is not a network braid has (expected \"Socket\": TCP)",
           rank, config->netName);
  }
  if (options.timeoutMs <= 0)
    fail(braidInvalidArgument, "rank {}: timeout {} ms is not positive", rank, options.timeoutMs);
  if (options.minChannels < 1 || options.maxChannels < options.minChannels)
    fail(braidInvalidArgument, "rank {}: {} are {} and {}: expected 1 <= min <= max", rank,
         channelsFrom, options.minChannels, options.maxChannels);
  if (device != "cpu" && device != "auto" && device != "cuda")
    fail(braidInvalidArgument, "rank {}: device '{}' is not one of auto, cpu, cuda", rank, device);
  // As NCCL: a communicator on the current CUDA device where one can be used ("auto").
  const std::string unavailable = device == "cpu" ? "" : braid::cudaUnavailableReason();
  if (device == "cuda" && !unavailable.empty())
    fail(braidUnhandledCudaError,
         "rank {}: device 'cuda' was requested but no CUDA device can be used here: {}; use "
         "device 'cpu'",
         rank, unavailable);
  options.cuda = device != "cpu" && unavailable.empty();
  if (options.cuda) options.cudaDevice = braid::currentCudaDevice();  // the caller's, as NCCL
  return options;
}

braidResult_t initRank(braidComm_t* out, int nranks, const braidUniqueId& commId, int rank,
                       const braidConfig_t* config) {
  bool started = false;
  bool* inProgress = &started;
  braidResult_t result = collected(nullptr, [&] {
    if (out == nullptr) fail(braidInvalidArgument, "braidCommInitRank: comm is NULL");
    *out = nullptr;
    if (nranks < 1)
      fail(braidInvalidArgument, "braidCommInitRank: nranks {} (expected at least 1)", nranks);
    if (rank < 0 || rank >= nranks)
      fail(braidInvalidArgument, "braidCommInitRank: rank {} is out of range (expected 0..{})",
           rank, nranks - 1);
    CommOptions options = optionsFrom(config, rank);
    const bool blocking = options.blocking;
    braid::BootstrapId id = braid::BootstrapId::decode(commId);
    auto comm = std::make_unique<braidComm>(rank, nranks, std::move(options));
    if (threadGroup().depth > 0) {
      threadGroup().inits.push_back({comm.get(), id});
      *out = comm.release();
      return;
    }
    if (!blocking) {
      braidComm* raw = comm.release();
      std::thread([raw, id] { raw->initialize(id); }).detach();
      *out = raw;
      *inProgress = true;
      return;
    }
    comm->initialize(id);
    comm->waitReady();
    *out = comm.release();
  });
  // Non-blocking init: braidCommGetAsyncError reports when it is done.
  return result == braidSuccess && started ? braidInProgress : result;
}

// A communicator of `members` (ranks of `parent` in their new order, the caller's among them),
// configured by `config` or else like the parent.
// How a child may share its parent's links: braidCommSplit's splitShare, braidCommShrink's
// shrinkShare (never with BRAID_SHRINK_ABORT: the parent's links are marked failed).
enum class ChildOf { Split, Shrink, AbortingShrink };

braidComm* initChild(const braidComm& parent, const std::vector<int>& members,
                     const std::optional<braidConfig_t>& config, const braid::BootstrapId& id,
                     ChildOf how) {
  const int newRank =
      static_cast<int>(std::find(members.begin(), members.end(), parent.rank()) - members.begin());
  CommOptions options = parent.options();
  if (config) options = optionsFrom(&*config, newRank);
  // Children are made on group workers: the parent's device, not the worker thread's.
  if (options.cuda) options.cudaDevice = parent.options().cudaDevice;
  // The split's config decides where it says; else the parent's.
  auto chosen = [&](int braidConfig_t::*field, bool CommOptions::*inherited) {
    if (config && (*config).*field != BRAID_CONFIG_UNDEF_INT) return (*config).*field != 0;
    return parent.options().*inherited;
  };
  const bool share =
      how == ChildOf::Split    ? chosen(&braidConfig_t::splitShare, &CommOptions::splitShare)
      : how == ChildOf::Shrink ? chosen(&braidConfig_t::shrinkShare, &CommOptions::shrinkShare)
                               : false;
  auto child = std::make_unique<braidComm>(newRank, static_cast<int>(members.size()), options);
  child->initialize(id, share ? &parent : nullptr, members);
  child->waitReady();
  return child.release();
}

// braidCommSplit on one rank: gathers every rank's color and key over the parent's bootstrap; the
// first rank of each color (by key, then parent rank) makes the new communicator's id and a
// second exchange hands it to the others; then the new communicator initializes.
// Each rank's color and key, as braidCommSplit's first exchange shares them; a rank whose call
// was refused (its arguments) sends kRefusedSplit as its color.
struct SplitChoice {
  int32_t color;
  int32_t key;
};
constexpr int32_t kRefusedSplit = std::numeric_limits<int32_t>::min();

// A rank whose braidCommSplit was refused takes part in the first exchange, saying so; its
// peers then fail (splitComm), so nothing else is exchanged. Best effort: its own error is what
// its caller hears.
braidComm* refuseSplit(braidComm* parent) {
  std::vector<SplitChoice> choices(parent->nranks());
  choices[parent->rank()] = {kRefusedSplit, 0};
  try {
    parent->allGatherOutOfBand(choices.data(), sizeof(SplitChoice));
  } catch (const Error& e) {
    BRAID_INFO(braid::log::kInit, "rank {}: could not tell the peers its split was refused: {}",
               parent->rank(), e.what());
  }
  return nullptr;
}

braidComm* splitComm(const PendingSplit& split) {
  braidComm* parent = split.parent;
  const int n = parent->nranks();
  std::vector<SplitChoice> choices(n);
  choices[parent->rank()] = {split.color, split.key};
  parent->allGatherOutOfBand(choices.data(), sizeof(SplitChoice));
  for (int r = 0; r < n; ++r)
    if (choices[r].color == kRefusedSplit)
      fail(braidInvalidUsage,
           "braidCommSplit on rank {}: rank {} refused its own braidCommSplit (its arguments: its "
           "error says which), so no communicator was made",
           parent->rank(), r);
  std::vector<int> members;  // parent ranks of this rank's color, in new-rank order
  for (int r = 0; r < n; ++r)
    if (choices[r].color == split.color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return choices[a].key < choices[b].key; });
  std::vector<braidUniqueId> ids(n);
  const bool leader = split.color != BRAID_SPLIT_NOCOLOR && members.front() == parent->rank();
  if (leader) ids[parent->rank()] = braid::makeUniqueId().encode();
  parent->allGatherOutOfBand(ids.data(), sizeof(braidUniqueId));
  if (split.color == BRAID_SPLIT_NOCOLOR) return nullptr;

  return initChild(*parent, members, split.config, braid::BootstrapId::decode(ids[members.front()]),
                   ChildOf::Split);
}

// braidCommShrink on one rank: the survivors derive the new communicator's id each on its own
// (Bootstrap::shrunkId), so the excluded ranks take no part.
braidComm* shrinkComm(const PendingShrink& shrink) {
  braidComm* parent = shrink.parent;
  if ((shrink.flags & BRAID_SHRINK_ABORT) != 0) parent->abort("braidCommShrink");
  std::vector<int> survivors;
  for (int r = 0; r < parent->nranks(); ++r)
    if (std::find(shrink.excluded.begin(), shrink.excluded.end(), r) == shrink.excluded.end())
      survivors.push_back(r);
  const bool aborting = (shrink.flags & BRAID_SHRINK_ABORT) != 0;
  return initChild(*parent, survivors, shrink.config, parent->shrunkId(survivors),
                   aborting ? ChildOf::AbortingShrink : ChildOf::Shrink);
}

// ---- AlltoAll, Gather, Scatter: groups of sends and receives, as NCCL builds them --------------

enum class Personalized { AlltoAll, Gather, Scatter };

braidResult_t personalized(Personalized kind, const char* fn, const void* sendbuff, void* recvbuff,
                           size_t count, braidDataType_t type, int root, braidComm* comm,
                           braidStream_t stream) {
  return collected(comm, [&] {
    checkComm(comm, fn);
    const int n = comm->nranks(), rank = comm->rank();
    const size_t elem = checkTypeAndCount(comm, fn, type, count, static_cast<size_t>(n));
    if (kind != Personalized::AlltoAll) checkRank(comm, fn, "root", root);
    checkStream(comm, fn, stream);
    const size_t bytes = count * elem;
    const bool sends = kind != Personalized::Scatter || rank == root;
    const bool receives = kind != Personalized::Gather || rank == root;
    const size_t sendBytes = kind == Personalized::Gather ? bytes : bytes * n;
    const size_t recvBytes = kind == Personalized::Scatter ? bytes : bytes * n;
    if (count != 0 && sends) checkBuffer(comm, fn, "sendbuff", sendbuff, count, sendBytes);
    if (count != 0 && receives) checkBuffer(comm, fn, "recvbuff", recvbuff, count, recvBytes);
    if (kind == Personalized::AlltoAll && overlaps(sendbuff, sendBytes, recvbuff, recvBytes))
      fail(braidInvalidArgument,
           "{} on rank {}: sendbuff and recvbuff overlap (expected disjoint buffers: AlltoAll has "
           "no in-place form)",
           fn, rank);
    const auto* in = static_cast<const uint8_t*>(sendbuff);
    auto* out = static_cast<uint8_t*>(recvbuff);
    auto op = [&](Collective c, const void* send, void* recv, int peer) {
      return CollArgs{c, send, recv, count, type, braidSum, peer};
    };
    std::vector<CollArgs> ops;
    if (kind == Personalized::Gather) ops.push_back(op(Collective::Gather, nullptr, nullptr, root));
    if (kind == Personalized::Scatter)
      ops.push_back(op(Collective::Scatter, nullptr, nullptr, root));
    for (int p = 0; p < n; ++p) {
      const size_t at = static_cast<size_t>(p) * bytes;
      if (kind == Personalized::AlltoAll) {
        ops.push_back(op(Collective::Send, in + at, nullptr, p));
        ops.push_back(op(Collective::Recv, nullptr, out + at, p));
      } else if (kind == Personalized::Gather && rank == root) {
        ops.push_back(op(Collective::Recv, nullptr, out + at, p));
      } else if (kind == Personalized::Scatter && rank == root) {
        ops.push_back(op(Collective::Send, in + at, nullptr, p));
      }
    }
    if (kind == Personalized::Gather) ops.push_back(op(Collective::Send, in, nullptr, root));
    if (kind == Personalized::Scatter) ops.push_back(op(Collective::Recv, nullptr, out, root));
    dispatch(comm, ops, stream);
  });
}

// A registration names a buffer, its size and where the result goes.
void checkRegistration(braidComm* comm, const char* fn, const void* buff, size_t size,
                       const void* result, const char* resultName) {
  checkComm(comm, fn);
  if (result == nullptr || buff == nullptr || size == 0)
    fail(braidInvalidArgument,
         "{} on rank {}: buff {}, size {}, {} {} (expected a buffer, a size and somewhere to put "
         "the {})",
         fn, comm->rank(), buff, size, resultName, result, resultName);
}

}  // namespace

// ---- the C API ---------------------------------------------------------------------------------

extern "C" {

braidResult_t braidRedOpCreatePreMulSum(braidRedOp_t* op, void* scalar, braidDataType_t datatype,
                                        braidScalarResidence_t residence, braidComm_t comm) {
  return guarded(comm, [&] {
    checkComm(comm, "braidRedOpCreatePreMulSum");
    if (op == nullptr || scalar == nullptr)
      fail(braidInvalidArgument, "braidRedOpCreatePreMulSum on rank {}: {} is NULL", comm->rank(),
           op == nullptr ? "op" : "scalar");
    if (braid::kernels::typeSize(datatype) == 0)
      fail(braidInvalidArgument,
           "braidRedOpCreatePreMulSum on rank {}: datatype {} is not a braidDataType_t (expected "
           "0..{})",
           comm->rank(), static_cast<int>(datatype), braidNumTypes - 1);
    if (residence != braidScalarDevice && residence != braidScalarHostImmediate)
      fail(braidInvalidArgument,
           "braidRedOpCreatePreMulSum on rank {}: residence {} (expected braidScalarDevice or "
           "braidScalarHostImmediate)",
           comm->rank(), static_cast<int>(residence));
    *op = comm->reductionOps().create(scalar, datatype, residence == braidScalarHostImmediate);
  });
}

braidResult_t braidRedOpDestroy(braidRedOp_t op, braidComm_t comm) {
  return guarded(comm, [&] {
    checkComm(comm, "braidRedOpDestroy");
    comm->reductionOps().destroy(op);
  });
}

braidResult_t braidGetVersion(int* version) {
  return guarded(nullptr, [&] {
    if (version == nullptr) fail(braidInvalidArgument, "braidGetVersion: version is NULL");
    *version = BRAID_VERSION_CODE;
  });
}

braidResult_t braidGetUniqueId(braidUniqueId* uniqueId) {
  return guarded(nullptr, [&] {
    if (uniqueId == nullptr) fail(braidInvalidArgument, "braidGetUniqueId: uniqueId is NULL");
    *uniqueId = braid::makeUniqueId().encode();
  });
}

braidResult_t braidCommInitRank(braidComm_t* comm, int nranks, braidUniqueId commId, int rank) {
  return initRank(comm, nranks, commId, rank, nullptr);
}

braidResult_t braidCommInitRankConfig(braidComm_t* comm, int nranks, braidUniqueId commId, int rank,
                                      braidConfig_t* config) {
  return initRank(comm, nranks, commId, rank, config);
}

braidResult_t braidCommInitAll(braidComm_t* comms, int ndev, const int* devlist) {
  return guarded(nullptr, [&] {
    if (comms == nullptr) fail(braidInvalidArgument, "braidCommInitAll: comms is NULL");
    if (ndev < 1)
      fail(braidInvalidArgument, "braidCommInitAll: ndev {} (expected at least 1)", ndev);
    braid::BootstrapId id = braid::makeUniqueId();
    std::vector<PendingInit> inits;
    std::vector<std::unique_ptr<braidComm>> owned;
    for (int r = 0; r < ndev; ++r) {
      CommOptions options = optionsFrom(nullptr, r);
      // As NCCL: rank r on CUDA device devlist[r], else device r.
      if (options.cuda) options.cudaDevice = devlist != nullptr ? devlist[r] : r;
      owned.push_back(std::make_unique<braidComm>(r, ndev, std::move(options)));
      inits.push_back({owned.back().get(), id});
    }
    initializeAll(inits);
    for (int r = 0; r < ndev; ++r) comms[r] = owned[r].release();
  });
}

braidResult_t braidCommInitFromEnv(braidComm_t* comm, braidConfig_t* config) {
  braidUniqueId id;
  int rank = 0, size = 0;
  braidResult_t res = collected(nullptr, [&] {
    std::optional<braid::LaunchEnv> env = braid::readLaunchEnv();
    if (!env)
      fail(braidInvalidUsage,
           "braidCommInitFromEnv: no rank/size in the environment (expected RANK/WORLD_SIZE, "
           "OMPI_COMM_WORLD_RANK/SIZE or SLURM_PROCID/SLURM_NTASKS)");
    // The k-th call of every rank forms the k-th world communicator, as MPI's collective calls
    // match by order.
    static std::atomic<uint64_t> worldCommunicators{0};
    std::optional<braid::BootstrapId> bid = braid::worldIdFromEnv(++worldCommunicators);
    if (!bid)
      fail(braidInvalidUsage,
           "braidCommInitFromEnv: no rendezvous address in the environment (expected "
           "BRAID_COMM_ID=host:port or MASTER_ADDR/MASTER_PORT)");
    id = bid->encode();
    rank = env->rank;
    size = env->size;
  });
  if (res != braidSuccess) return res;
  return initRank(comm, size, id, rank, config);
}

void checkSplitArguments(braidComm* comm, int color, braidComm_t* newcomm,
                         const braidConfig_t* config) {
  if (newcomm == nullptr)
    fail(braidInvalidArgument, "braidCommSplit on rank {}: newcomm is NULL", comm->rank());
  if (color < 0 && color != BRAID_SPLIT_NOCOLOR)
    fail(braidInvalidArgument,
         "braidCommSplit on rank {}: color {} is negative (expected >= 0, or "
         "BRAID_SPLIT_NOCOLOR)",
         comm->rank(), color);
  if (config != nullptr) optionsFrom(config, comm->rank());  // refuse a bad one now
}

braidResult_t braidCommSplit(braidComm_t comm, int color, int key, braidComm_t* newcomm,
                             braidConfig_t* config) {
  return collected(comm, [&] {
    checkComm(comm, "braidCommSplit");
    if (newcomm != nullptr) *newcomm = nullptr;
    try {
      checkSplitArguments(comm, color, newcomm, config);
    } catch (...) {
      // The peers' splits wait for this rank's choice: it says "refused", so they fail at once
      // naming it (not at their timeout); then this rank's own error.
      const Error refusal = braid::currentError();
      addChild({comm, nullptr, [comm] { return refuseSplit(comm); }});
      throw refusal;
    }
    PendingSplit split{comm, color, key, copyOfConfig(config)};
    addChild({comm, newcomm, [split] { return splitComm(split); }});
  });
}

braidResult_t braidCommShrink(braidComm_t comm, int* excludeRanksList, int excludeRanksCount,
                              braidComm_t* newcomm, braidConfig_t* config, int shrinkFlags) {
  return collected(comm, [&] {
    checkComm(comm, "braidCommShrink");
    const int rank = comm->rank(), n = comm->nranks();
    if (newcomm == nullptr)
      fail(braidInvalidArgument, "braidCommShrink on rank {}: newcomm is NULL", rank);
    *newcomm = nullptr;
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList == nullptr))
      fail(braidInvalidArgument,
           "braidCommShrink on rank {}: excludeRanksCount {} with excludeRanksList {} (expected a "
           "count >= 0, and a list when it is not 0)",
           rank, excludeRanksCount, static_cast<void*>(excludeRanksList));
    if (shrinkFlags != BRAID_SHRINK_DEFAULT && shrinkFlags != BRAID_SHRINK_ABORT)
      fail(braidInvalidArgument,
           "braidCommShrink on rank {}: shrinkFlags {} (expected BRAID_SHRINK_DEFAULT or "
           "BRAID_SHRINK_ABORT)",
           rank, shrinkFlags);
    if (config != nullptr) optionsFrom(config, rank);  // refuse a bad one before copying
    PendingShrink shrink{comm, {}, copyOfConfig(config), shrinkFlags};
    for (int i = 0; i < excludeRanksCount; ++i) {
      const int excluded = excludeRanksList[i];
      if (excluded < 0 || excluded >= n)
        fail(braidInvalidArgument,
             "braidCommShrink on rank {}: excludeRanksList[{}] is {} (expected a rank in 0..{})",
             rank, i, excluded, n - 1);
      if (excluded == rank)
        fail(braidInvalidArgument,
             "braidCommShrink on rank {}: excludeRanksList[{}] is this rank (excluded ranks do "
             "not call braidCommShrink)",
             rank, i);
      if (std::find(shrink.excluded.begin(), shrink.excluded.end(), excluded) !=
          shrink.excluded.end())
        fail(braidInvalidArgument,
             "braidCommShrink on rank {}: excludeRanksList[{}] repeats rank {}", rank, i, excluded);
      shrink.excluded.push_back(excluded);
    }
    addChild({comm, newcomm, [shrink] { return shrinkComm(shrink); }});
  });
}

braidResult_t braidCommInitRankScalable(braidComm_t* newcomm, int nranks, int myrank, int nId,
                                        braidUniqueId* commIds, braidConfig_t* config) {
  braidResult_t result = collected(nullptr, [&] {
    if (nId < 1 || commIds == nullptr)
      fail(braidInvalidArgument,
           "braidCommInitRankScalable on rank {}: nId {} and commIds {} (expected at least one "
           "unique id)",
           myrank, nId, static_cast<void*>(commIds));
  });
  if (result != braidSuccess) return result;
  return initRank(newcomm, nranks, commIds[0], myrank, config);
}

braidResult_t braidCommRevoke(braidComm_t comm, int revokeFlags) {
  return guarded(comm, [&] {
    checkComm(comm, "braidCommRevoke");
    if (revokeFlags != 0)
      fail(braidInvalidArgument, "braidCommRevoke on rank {}: revokeFlags {} (expected 0)",
           comm->rank(), revokeFlags);
    comm->abort("braidCommRevoke");
  });
}

namespace {
std::mutex gAllocationsMutex;
std::map<void*, size_t> gAllocations;  // what braidMemAlloc mapped, by address
}  // namespace

// Memory of the kind a communicator made now takes by default (as initRank chooses its device).
braidResult_t braidMemAlloc(void** ptr, size_t size) {
  return guarded(nullptr, [&] {
    if (ptr == nullptr) fail(braidInvalidArgument, "braidMemAlloc: ptr is NULL");
    *ptr = nullptr;
    if (size == 0) fail(braidInvalidArgument, "braidMemAlloc: size is 0 (expected > 0)");
    if (braid::param::Device() != "cpu" && braid::cudaUnavailableReason().empty()) {
      *ptr = braid::allocateDeviceMemory(size);
      return;
    }
    void* memory = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (memory == MAP_FAILED)
      braid::failErrno(braidSystemError, fmt::format("braidMemAlloc: mapping {} bytes", size),
                       errno);
    std::lock_guard<std::mutex> lock(gAllocationsMutex);
    gAllocations[memory] = size;
    *ptr = memory;
  });
}

braidResult_t braidMemFree(void* ptr) {
  return guarded(nullptr, [&] {
    if (ptr == nullptr) return;  // as free(), and NCCL's ncclMemFree
    if (braid::releaseDeviceMemory(ptr)) return;
    std::lock_guard<std::mutex> lock(gAllocationsMutex);
    auto it = gAllocations.find(ptr);
    if (it == gAllocations.end())
      fail(braidInvalidArgument,
           "braidMemFree: {} did not come from braidMemAlloc (or was freed already)", ptr);
    munmap(it->first, it->second);
    gAllocations.erase(it);
  });
}

braidResult_t braidCommRegister(const braidComm_t comm, void* buff, size_t size, void** handle) {
  return guarded(comm, [&] {
    checkRegistration(comm, "braidCommRegister", buff, size, handle, "handle");
    *handle = comm->registerBuffer(buff, size, false);
  });
}

braidResult_t braidCommDeregister(const braidComm_t comm, void* handle) {
  return guarded(comm, [&] {
    checkComm(comm, "braidCommDeregister");
    comm->deregisterBuffer(handle, false, "braidCommDeregister");
  });
}

braidResult_t braidCommWindowRegister(braidComm_t comm, void* buff, size_t size, braidWindow_t* win,
                                      int winFlags) {
  return guarded(comm, [&] {
    checkRegistration(comm, "braidCommWindowRegister", buff, size, win, "win");
    if (winFlags < 0 || winFlags > 1)
      fail(braidInvalidArgument,
           "braidCommWindowRegister on rank {}: winFlags {} (expected 0 or 1, "
           "NCCL_WIN_COLL_SYMMETRIC)",
           comm->rank(), winFlags);
    *win = static_cast<braidWindow_t>(comm->registerBuffer(buff, size, true));
  });
}

braidResult_t braidCommWindowDeregister(braidComm_t comm, braidWindow_t win) {
  return guarded(comm, [&] {
    checkComm(comm, "braidCommWindowDeregister");
    comm->deregisterBuffer(win, true, "braidCommWindowDeregister");
  });
}

braidResult_t braidWinGetUserPtr(braidComm_t comm, braidWindow_t win, void** outUserPtr) {
  return guarded(comm, [&] {
    checkComm(comm, "braidWinGetUserPtr");
    if (outUserPtr == nullptr)
      fail(braidInvalidArgument, "braidWinGetUserPtr on rank {}: outUserPtr is NULL", comm->rank());
    *outUserPtr = comm->registeredBuffer(win, true, "braidWinGetUserPtr");
  });
}

braidResult_t braidCommFinalize(braidComm_t comm) {
  bool started = false;
  const braidResult_t result = guarded(comm, [&] {
    checkComm(comm, "braidCommFinalize");
    if (comm->options().blocking) return comm->finalize();
    comm->finalizeInBackground();
    started = true;
  });
  // Non-blocking: braidCommGetAsyncError reports when it is done.
  return result == braidSuccess && started ? braidInProgress : result;
}

braidResult_t braidCommDestroy(braidComm_t comm) {
  return guarded(nullptr, [&] {
    if (comm == nullptr) return;  // as nccl: destroying NULL is a no-op
    // Another thread's call on it, returning; then what such a call may have queued meanwhile.
    comm->callsInside().waitDrained();
    comm->pending().waitDrained();
    try {
      comm->waitReady();
    } catch (const Error&) {
      // a failed init leaves nothing to flush
    }
    delete comm;
  });
}

braidResult_t braidCommAbort(braidComm_t comm) {
  return guarded(nullptr, [&] {
    if (comm == nullptr) return;
    comm->deliverFinishedSends();
    comm->abort("braidCommAbort");
    // A call on another thread, failed by the abort, records its error in comm on its way out;
    // and it may have queued work on a host stream meanwhile (which fails as it runs).
    comm->callsInside().waitDrained();
    comm->pending().waitDrained();
    delete comm;
  });
}

braidResult_t braidCommGetAsyncError(braidComm_t comm, braidResult_t* asyncError) {
  return guarded(comm, [&] {
    checkComm(comm, "braidCommGetAsyncError");
    if (asyncError == nullptr)
      fail(braidInvalidArgument, "braidCommGetAsyncError on rank {}: asyncError is NULL",
           comm->rank());
    *asyncError = comm->asyncError();
  });
}

braidResult_t braidCommCount(const braidComm_t comm, int* count) {
  return guarded(comm, [&] {
    checkComm(comm, "braidCommCount");
    if (count == nullptr) fail(braidInvalidArgument, "braidCommCount: count is NULL");
    *count = comm->nranks();
  });
}

braidResult_t braidCommCuDevice(const braidComm_t comm, int* device) {
  return guarded(comm, [&] {
    checkComm(comm, "braidCommCuDevice");
    if (device == nullptr) fail(braidInvalidArgument, "braidCommCuDevice: device is NULL");
    *device = comm->cudaDevice();  // -1: a CPU communicator
  });
}

braidResult_t braidCommUserRank(const braidComm_t comm, int* rank) {
  return guarded(comm, [&] {
    checkComm(comm, "braidCommUserRank");
    if (rank == nullptr) fail(braidInvalidArgument, "braidCommUserRank: rank is NULL");
    *rank = comm->rank();
  });
}

braidResult_t braidCommPredict(braidComm_t comm, braidCollective_t collective, size_t bytes,
                               braidPrediction_t* prediction) {
  return guarded(comm, [&] {
    checkComm(comm, "braidCommPredict");
    if (prediction == nullptr) fail(braidInvalidArgument, "braidCommPredict: prediction is NULL");
    if (collective < braidCollAllReduce || collective > braidCollSendRecv)
      fail(braidInvalidArgument,
           "braidCommPredict: rank {}: collective {} is not a braidCollective_t (expected 0..5)",
           comm->rank(), static_cast<int>(collective));
    const braid::plan::Prediction p =
        comm->predict(static_cast<braid::plan::Operation>(collective), bytes);
    *prediction = {p.us, p.busBwGBs, braid::plan::algorithmName(p.algorithm),
                   braid::plan::protocolName(p.protocol)};
  });
}

braidResult_t braidCommDescribePlan(braidComm_t comm, const char** text) {
  return guarded(comm, [&] {
    checkComm(comm, "braidCommDescribePlan");
    if (text == nullptr) fail(braidInvalidArgument, "braidCommDescribePlan: text is NULL");
    *text = comm->describePlan().c_str();
  });
}

braidResult_t braidGetParams(const braidParam_t** params, int* count) {
  return guarded(nullptr, [&] {
    if (params == nullptr || count == nullptr)
      fail(braidInvalidArgument, "braidGetParams: params and count must not be NULL");
    // Built once: the environment is read once too (a variable that does not parse throws, and
    // the next call tries again).
    static const std::vector<braid::param::Description> descriptions = braid::param::describeAll();
    static const std::vector<braidParam_t> table = [] {
      std::vector<braidParam_t> entries;
      for (const braid::param::Description& d : descriptions)
        entries.push_back({d.env, d.currentValue.c_str(), d.defaultValue.c_str(), d.help});
      return entries;
    }();
    *params = table.data();
    *count = static_cast<int>(table.size());
  });
}

const char* braidGetErrorString(braidResult_t result) {
  switch (result) {
    case braidSuccess: return "no error";
    case braidUnhandledCudaError: return "unhandled cuda error";
    case braidSystemError: return "unhandled system error";
    case braidInternalError: return "internal error";
    case braidInvalidArgument: return "invalid argument";
    case braidInvalidUsage: return "invalid usage";
    case braidRemoteError: return "remote process exited or there was a network error";
    case braidInProgress: return "operation in progress";
    case braidTimeout: return "operation timed out waiting for a peer";
    default: return "unknown result code";
  }
}

void braidResetDebugInit(void) {
  try {
    braid::log::rereadSettings();
  } catch (...) {  // void in nccl.h: nothing to report to, and nothing may leave a C call
  }
}

const char* braidGetLastError(braidComm_t comm) {
  static thread_local std::string copy;
  copy = comm != nullptr ? comm->lastError() : threadLastError();
  return copy.c_str();
}

braidResult_t braidAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                             braidDataType_t datatype, braidRedOp_t op, braidComm_t comm,
                             braidStream_t stream) {
  return enqueue({Collective::AllReduce, sendbuff, recvbuff, count, datatype, op, 0}, comm, stream);
}

braidResult_t braidReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                 braidDataType_t datatype, braidRedOp_t op, braidComm_t comm,
                                 braidStream_t stream) {
  return enqueue({Collective::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0}, comm,
                 stream);
}

braidResult_t braidAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                             braidDataType_t datatype, braidComm_t comm, braidStream_t stream) {
  return enqueue({Collective::AllGather, sendbuff, recvbuff, sendcount, datatype, braidSum, 0},
                 comm, stream);
}

braidResult_t braidBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                             braidDataType_t datatype, int root, braidComm_t comm,
                             braidStream_t stream) {
  return enqueue({Collective::Broadcast, sendbuff, recvbuff, count, datatype, braidSum, root}, comm,
                 stream);
}

braidResult_t braidReduce(const void* sendbuff, void* recvbuff, size_t count,
                          braidDataType_t datatype, braidRedOp_t op, int root, braidComm_t comm,
                          braidStream_t stream) {
  return enqueue({Collective::Reduce, sendbuff, recvbuff, count, datatype, op, root}, comm, stream);
}

braidResult_t braidBcast(void* buff, size_t count, braidDataType_t datatype, int root,
                         braidComm_t comm, braidStream_t stream) {
  return braidBroadcast(buff, buff, count, datatype, root, comm, stream);
}

braidResult_t braidAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                            braidDataType_t datatype, braidComm_t comm, braidStream_t stream) {
  return personalized(Personalized::AlltoAll, "braidAlltoAll", sendbuff, recvbuff, count, datatype,
                      0, comm, stream);
}

braidResult_t braidGather(const void* sendbuff, void* recvbuff, size_t count,
                          braidDataType_t datatype, int root, braidComm_t comm,
                          braidStream_t stream) {
  return personalized(Personalized::Gather, "braidGather", sendbuff, recvbuff, count, datatype,
                      root, comm, stream);
}

braidResult_t braidScatter(const void* sendbuff, void* recvbuff, size_t count,
                           braidDataType_t datatype, int root, braidComm_t comm,
                           braidStream_t stream) {
  return personalized(Personalized::Scatter, "braidScatter", sendbuff, recvbuff, count, datatype,
                      root, comm, stream);
}

braidResult_t braidSend(const void* sendbuff, size_t count, braidDataType_t datatype, int peer,
                        braidComm_t comm, braidStream_t stream) {
  return enqueue({Collective::Send, sendbuff, nullptr, count, datatype, braidSum, peer}, comm,
                 stream);
}

braidResult_t braidRecv(void* recvbuff, size_t count, braidDataType_t datatype, int peer,
                        braidComm_t comm, braidStream_t stream) {
  return enqueue({Collective::Recv, nullptr, recvbuff, count, datatype, braidSum, peer}, comm,
                 stream);
}

braidResult_t braidProbe(int peer, braidComm_t comm, int* waiting, size_t* count,
                         braidDataType_t* datatype) {
  return guarded(comm, [&] {
    checkComm(comm, "braidProbe");
    if (waiting == nullptr)
      fail(braidInvalidArgument, "braidProbe on rank {}: waiting is NULL", comm->rank());
    checkRank(comm, "braidProbe", "peer", peer);
    if (comm->onDevice())
      fail(braidInvalidUsage,
           "braidProbe on rank {}: a CUDA communicator's sends are not probed (expected a CPU "
           "communicator)",
           comm->rank());
    const std::optional<braid::CallTag> send = comm->sendWaitingFrom(peer);
    *waiting = send ? 1 : 0;
    if (count != nullptr) *count = send ? send->count : 0;
    if (datatype != nullptr && send) *datatype = static_cast<braidDataType_t>(send->datatype);
  });
}

braidResult_t braidGroupStart(void) {
  ++threadGroup().depth;
  return braidSuccess;
}

braidResult_t braidGroupEnd(void) {
  return guarded(nullptr, [&] {
    if (threadGroup().depth == 0)
      fail(braidInvalidUsage, "braidGroupEnd without a matching braidGroupStart");
    if (--threadGroup().depth > 0) return;
    endGroup();
  });
}

braidResult_t braidGroupSimulateEnd(braidSimInfo_t* simInfo) {
  return guarded(nullptr, [&] {
    if (simInfo == nullptr || simInfo->magic != BRAID_SIM_INFO_MAGIC ||
        simInfo->size < sizeof(braidSimInfo_t))
      fail(braidInvalidArgument,
           "braidGroupSimulateEnd: simInfo was not initialized with BRAID_SIM_INFO_INITIALIZER");
    if (threadGroup().depth == 0)
      fail(braidInvalidUsage, "braidGroupSimulateEnd without a matching braidGroupStart");
    if (--threadGroup().depth > 0) return;
    GroupState group = std::move(threadGroup());
    threadGroup() = GroupState{};
    failIfAnyCallFailed(group, "braidGroupSimulateEnd");
    if (!group.inits.empty() || !group.children.empty())
      fail(braidInvalidUsage,
           "braidGroupSimulateEnd: the group creates communicators (expected a group of "
           "operations only)");
    std::map<braidComm*, double> microseconds;
    for (const GroupOp& op : group.ops) {
      const braid::ModelCall call = braid::modelCallOf(op.args, op.comm->nranks());
      microseconds[op.comm] += op.comm->predict(call.operation, call.bytes).us;
    }
    double slowest = 0;
    for (const auto& [comm, us] : microseconds) slowest = std::max(slowest, us);
    simInfo->estimatedTime = static_cast<float>(slowest);
  });
}

braidResult_t braidStreamCreate(braidStream_t* stream) {
  return guarded(nullptr, [&] {
    if (stream == nullptr) fail(braidInvalidArgument, "braidStreamCreate: stream is NULL");
    *stream = braid::HostStream::create();
  });
}

braidResult_t braidStreamSynchronize(braidStream_t stream) {
  std::string message;
  braidResult_t result = guarded(nullptr, [&] {
    if (!braid::HostStream::isLive(stream))
      fail(braidInvalidArgument, "braidStreamSynchronize: {} is not a live braid host stream",
           stream);
  });
  if (result != braidSuccess) return result;
  result = static_cast<braid::HostStream*>(stream)->synchronize(&message);
  if (result != braidSuccess) threadLastError() = message;
  return result;
}

braidResult_t braidStreamDestroy(braidStream_t stream) {
  return guarded(nullptr, [&] {
    if (!braid::HostStream::isLive(stream))
      fail(braidInvalidArgument, "braidStreamDestroy: {} is not a live braid host stream", stream);
    braid::HostStream::destroy(static_cast<braid::HostStream*>(stream));
  });
}

}  // extern "C"
