// nccl-perf: braid-perf's method and table for NVIDIA's NCCL, the library braid's CUDA path is
// measured against: one thread drives -g ranks, every one on the current GPU (NCCL 2.30 admits
// several ranks per GPU behind NCCL_MULTI_RANK_GPU_ENABLE, which this tool sets where the ranks
// outnumber the GPUs), their calls in one group on a stream each, buffers in device memory.
//   NCCL_PERF_LIBRARY=.../nvidia/nccl/lib/libnccl.so.2 nccl-perf allreduce -g 2 -b 8 -e 1G -f 2
// The library is loaded at run time (NCCL_PERF_LIBRARY, else the loader's libnccl.so.2) so the
// table names exactly which NCCL it measured; braid's own libnccl.so.2 is refused, since it would
// measure braid against itself. Subcommands: allreduce, reducescatter, allgather.
// Exit status as braid-perf: 0 passed, 1 wrong values, 2 bad flags, 3 failed.
#include <dlfcn.h>
#include <fmt/format.h>
#include <link.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "peer_bench.h"
#include "perf/cuda_memory.h"
#include "perf/launch.h"

namespace braid_perf {
namespace {

// braid.h keeps nccl.h's values, so types and operators pass through as they are.
static_assert(static_cast<int>(braidFloat32) == static_cast<int>(ncclFloat32));
static_assert(static_cast<int>(braidBfloat16) == static_cast<int>(ncclBfloat16));
static_assert(static_cast<int>(braidMin) == static_cast<int>(ncclMin));

// The NCCL functions the tool calls, from the library it loaded.
struct Nccl {
  std::string path;
  decltype(&ncclGetVersion) getVersion;
  decltype(&ncclGetErrorString) errorString;
  decltype(&ncclGetLastError) lastError;
  decltype(&ncclCommInitAll) commInitAll;
  decltype(&ncclCommDestroy) commDestroy;
  decltype(&ncclCommGetAsyncError) asyncError;
  decltype(&ncclGroupStart) groupStart;
  decltype(&ncclGroupEnd) groupEnd;
  decltype(&ncclAllReduce) allReduce;
  decltype(&ncclReduceScatter) reduceScatter;
  decltype(&ncclAllGather) allGather;
};

template <typename F>
void bind(void* library, const char* name, F& function) {
  function = reinterpret_cast<F>(dlsym(library, name));
  if (function == nullptr) throw RunError(fmt::format("the NCCL library has no {}", name));
}

Nccl loadNccl() {
  const char* asked = std::getenv("NCCL_PERF_LIBRARY");
  const std::string name = asked != nullptr && *asked != '\0' ? asked : "libnccl.so.2";
  void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr)
    throw RunError(fmt::format("cannot load {} (NCCL_PERF_LIBRARY names it): {}", name, dlerror()));
  if (dlsym(library, "braidCommInitRank") != nullptr)
    throw RunError(
        fmt::format("{} is braid's libnccl.so.2, not NCCL (NCCL_PERF_LIBRARY names "
                    "NVIDIA's, e.g. the nvidia-nccl wheel's nvidia/nccl/lib)",
                    name));
  Nccl n;
  link_map* map = nullptr;
  n.path = dlinfo(library, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr ? map->l_name : name;
  bind(library, "ncclGetVersion", n.getVersion);
  bind(library, "ncclGetErrorString", n.errorString);
  bind(library, "ncclGetLastError", n.lastError);
  bind(library, "ncclCommInitAll", n.commInitAll);
  bind(library, "ncclCommDestroy", n.commDestroy);
  bind(library, "ncclCommGetAsyncError", n.asyncError);
  bind(library, "ncclGroupStart", n.groupStart);
  bind(library, "ncclGroupEnd", n.groupEnd);
  bind(library, "ncclAllReduce", n.allReduce);
  bind(library, "ncclReduceScatter", n.reduceScatter);
  bind(library, "ncclAllGather", n.allGather);
  return n;
}

// The -g ranks of this thread as NCCL communicators of one process (ncclCommInitAll), rank r on
// GPU r % GPUs, each with a stream; the tool's own exchanges need no call (one thread holds
// every rank).
class NcclComm : public PeerComm {
 public:
  NcclComm(const Nccl& nccl, const Options& options, int nranks)
      : nccl_(nccl), collective_(options.collective->name), comms_(nranks) {
    const int devices = cuda::deviceCount();
    if (devices == 0) throw RunError("no CUDA device can be used here");
    if (nranks > devices) setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 0);
    std::vector<int> devicesOfRanks;
    for (int r = 0; r < nranks; ++r) devicesOfRanks.push_back(r % devices);
    check("ncclCommInitAll", nccl_.commInitAll(comms_.data(), nranks, devicesOfRanks.data()));
    for (int r = 0; r < nranks; ++r) {
      cuda::selectDevice(r);
      streams_.push_back(cuda::createStream());
    }
  }
  ~NcclComm() override {
    for (size_t r = 0; r < comms_.size(); ++r) {
      cuda::selectDevice(static_cast<int>(r));
      if (r < streams_.size()) cuda::destroyStream(streams_[r]);
      if (comms_[r] != nullptr) nccl_.commDestroy(comms_[r]);
    }
  }

  int rank() const override { return 0; }
  int localRanks() const override { return static_cast<int>(comms_.size()); }
  int nranks() const override { return static_cast<int>(comms_.size()); }
  void barrier() override {}
  void maxOverRanks(double*, int) override {}
  std::vector<RankInfo> rankInfo() override {
    char host[128] = {};
    gethostname(host, sizeof host - 1);
    std::vector<RankInfo> ranks;
    for (int r = 0; r < nranks(); ++r) ranks.push_back({r, static_cast<int>(getpid()), host});
    return ranks;
  }

  void launch(int local, const void* send, void* recv, size_t count, braidDataType_t type,
              braidRedOp_t op) override {
    const auto t = static_cast<ncclDataType_t>(type);
    const auto o = static_cast<ncclRedOp_t>(op);
    auto stream = static_cast<cudaStream_t>(streams_[local]);
    const std::string name = collective_;
    if (name == "allreduce")
      check("ncclAllReduce", nccl_.allReduce(send, recv, count, t, o, comms_[local], stream));
    else if (name == "reducescatter")
      check("ncclReduceScatter",
            nccl_.reduceScatter(send, recv, count, t, o, comms_[local], stream));
    else
      check("ncclAllGather", nccl_.allGather(send, recv, count, t, comms_[local], stream));
  }
  void startGroup() override { check("ncclGroupStart", nccl_.groupStart()); }
  void endGroup() override { check("ncclGroupEnd", nccl_.groupEnd()); }
  void complete() override {
    for (size_t r = 0; r < comms_.size(); ++r) {
      cuda::selectDevice(static_cast<int>(r));
      cuda::synchronize(streams_[r]);
      ncclResult_t async = ncclSuccess;
      check("ncclCommGetAsyncError", nccl_.asyncError(comms_[r], &async));
      check(collective_.c_str(), async);
    }
  }

  bool buffersOnDevice() const override { return true; }
  void* allocateBuffer(int local, size_t bytes) override {
    cuda::selectDevice(local);
    return cuda::allocate(bytes);
  }
  void freeBuffer(int local, void* buffer) override {
    cuda::selectDevice(local);
    cuda::release(buffer);
  }
  void upload(int local, void* buffer, const void* host, size_t bytes) override {
    cuda::selectDevice(local);
    cuda::upload(buffer, host, bytes);
  }
  void download(int local, void* host, const void* buffer, size_t bytes) override {
    cuda::selectDevice(local);
    cuda::download(host, buffer, bytes);
  }
  double deviceCopyGBs() override {
    cuda::selectDevice(0);
    return cuda::copyBandwidthGBs();
  }
  int ranksOnFirstDevice() override {
    const int devices = cuda::deviceCount();
    return (nranks() + devices - 1) / devices;
  }

 private:
  void check(const char* what, ncclResult_t result) const {
    if (result != ncclSuccess)
      throw RunError(fmt::format("{} failed: {}: {}", what, nccl_.errorString(result),
                                 nccl_.lastError(comms_.empty() ? nullptr : comms_.front())));
  }

  const Nccl& nccl_;
  std::string collective_;
  std::vector<ncclComm_t> comms_;
  std::vector<void*> streams_;  // cudaStream_t, by rank
};

int versionOf(const Nccl& nccl) {
  int version = 0;
  nccl.getVersion(&version);
  return version;
}

std::string versionText(const Nccl& nccl) {
  const int version = versionOf(nccl);
  return fmt::format("{}.{}.{} ({})", version / 10000, version / 100 % 100, version % 100,
                     nccl.path);
}

// Status 77 (a skip, as the tests' harnesses read it) where this NCCL cannot run the ranks asked
// for: several on one GPU needs NCCL 2.30 (before, ncclCommInitAll refuses a repeated device).
constexpr int kExitSkipped = 77;
constexpr int kFirstMultiRankNccl = 23000;

}  // namespace
}  // namespace braid_perf

int main(int argc, char** argv) {
  using namespace braid_perf;
  return peerMain("nccl-perf", [&]() -> int {
    const std::optional<Options> options = parsePeerOptions(
        argc, argv, {"allreduce", "reducescatter", "allgather"},
        {braidInt8, braidUint8, braidInt32, braidUint32, braidInt64, braidUint64, braidFloat16,
         braidFloat32, braidFloat64, braidBfloat16},
        {braidSum, braidProd, braidMax, braidMin, braidAvg}, PeerCalls::StreamOrdered);
    if (!options) return kExitPassed;
    if (options->device != "cuda")
      throw UsageError("--device cuda: NCCL's ranks are GPUs (expected --device cuda)");
    armTimeout("nccl-perf", options->timeoutSeconds);
    const Nccl nccl = loadNccl();
    const std::string version = versionText(nccl);
    fmt::print(stderr, "nccl-perf: NCCL {}\n", version);
    const int devices = cuda::deviceCount();
    if (devices > 0 && options->ranksPerThread > devices && versionOf(nccl) < kFirstMultiRankNccl) {
      fmt::print("nccl-perf: skipped: {} ranks on {} GPUs need NCCL 2.30 or later (this is {})\n",
                 options->ranksPerThread, devices, version);
      return kExitSkipped;
    }
    NcclComm comm(nccl, *options, options->ranksPerThread);
    const int64_t wrong =
        runPeerBenchmark(*options, comm, {"nccl-perf", "NCCL", version, "one thread, -g ranks", 1});
    return wrong == 0 ? kExitPassed : kExitWrongValues;
  });
}
