// gloo-perf: braid-perf's method and table for Gloo's ring all-reduce (gloo::AllreduceRing) over
// TCP on 127.0.0.1, the path PyTorch's gloo backend takes on a CPU host.
//   GLOO_PERF_STORE=$(mktemp -d) mpirun -x GLOO_PERF_STORE -np 2 gloo-perf allreduce -b 8 -e 256M
// mpirun only starts the processes (rank and size from OMPI_COMM_WORLD_*, or RANK/WORLD_SIZE);
// the ranks meet through a gloo::rendezvous::FileStore in the empty directory GLOO_PERF_STORE.
// Gloo reduces in place: an out-of-place row copies the input into the output first, in the time.
// Exit status as braid-perf: 0 passed, 1 wrong values, 2 bad flags, 3 failed.
// Gloo's collectives return before their last send is written (AllreduceRing's final notification,
// the root's replies in BarrierAllToOne), and a rank that exits then closes its sockets under a
// peer still waiting: the peer's wait throws "Connection closed by peer" even where its data
// arrived. So the ranks leave together through the store, which no socket's closing can disturb.
#include <fmt/format.h>
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "peer_bench.h"
#include "perf/launch.h"

namespace braid_perf {
namespace {

// How long one Gloo operation may wait for a peer before it throws.
constexpr std::chrono::seconds kOperationTimeout{300};

int environmentInt(const char* first, const char* second) {
  const char* text = std::getenv(first);
  if (text == nullptr) text = std::getenv(second);
  if (text == nullptr)
    throw UsageError(
        fmt::format("neither {} nor {} is set: start the ranks with mpirun -np N", first, second));
  return std::atoi(text);
}

const gloo::ReductionFunction<float>* glooReduction(braidRedOp_t op) {
  switch (op) {
    case braidProd: return gloo::ReductionFunction<float>::product;
    case braidMax: return gloo::ReductionFunction<float>::max;
    case braidMin: return gloo::ReductionFunction<float>::min;
    default: return gloo::ReductionFunction<float>::sum;
  }
}

class GlooComm : public PeerComm {
 public:
  GlooComm(int rank, int nranks, const std::string& storeDirectory)
      : rank_(rank), store_(storeDirectory) {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
    context->setTimeout(kOperationTimeout);
    context->connectFullMesh(store_, device);
    context_ = context;
  }
  // Returns once every rank has finished its last Gloo wait, so closing this rank's sockets can
  // no longer fail a peer's.
  void leaveTogether() {
    const auto doneKey = [](int rank) { return fmt::format("gloo_perf_done_{}", rank); };
    store_.set(doneKey(rank_), {'1'});
    std::vector<std::string> keys;
    for (int r = 0; r < nranks(); ++r) keys.push_back(doneKey(r));
    store_.wait(keys, kOperationTimeout);
  }
  int rank() const override { return rank_; }
  int nranks() const override { return context_->size; }
  void barrier() override { gloo::BarrierAllToOne(context_).run(); }
  void maxOverRanks(double* values, int count) override {
    gloo::AllreduceRing<double>(context_, {values}, count, gloo::ReductionFunction<double>::max)
        .run();
  }
  // Every rank writes its pid into its own slot; a max all-reduce fills in the others.
  std::vector<RankInfo> rankInfo() override {
    std::vector<double> pids(nranks(), 0.0);
    pids[rank_] = getpid();
    maxOverRanks(pids.data(), nranks());
    char host[128] = {};
    gethostname(host, sizeof host - 1);  // every rank is on this host: TCP loopback
    std::vector<RankInfo> ranks;
    for (int r = 0; r < nranks(); ++r) ranks.push_back({r, static_cast<int>(pids[r]), host});
    return ranks;
  }
  void launch(int, const void* send, void* recv, size_t count, braidDataType_t,
              braidRedOp_t op) override {
    if (count > INT_MAX)
      throw RunError(fmt::format("{} elements: more than Gloo's int count can hold", count));
    if (send != recv) std::memcpy(recv, send, count * sizeof(float));
    // An AllreduceRing sets up its buffers with the peers once; it is kept while a row reuses
    // the same buffer and count, as Gloo's users keep theirs.
    float* data = static_cast<float*>(recv);
    if (!ring_ || ringData_ != data || ringCount_ != count || ringOp_ != op) {
      ring_.reset();  // frees the previous ring's staging buffers first
      ring_ = std::make_unique<gloo::AllreduceRing<float>>(
          context_, std::vector<float*>{data}, static_cast<int>(count), glooReduction(op));
      ringData_ = data;
      ringCount_ = count;
      ringOp_ = op;
    }
    ring_->run();
  }

 private:
  int rank_;
  gloo::rendezvous::FileStore store_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<gloo::AllreduceRing<float>> ring_;
  float* ringData_ = nullptr;
  size_t ringCount_ = 0;
  braidRedOp_t ringOp_ = braidSum;
};

}  // namespace
}  // namespace braid_perf

int main(int argc, char** argv) {
  using namespace braid_perf;
  return peerMain("gloo-perf", [&] {
    const std::optional<Options> options = parsePeerOptions(
        argc, argv, {"allreduce"}, {braidFloat32}, {braidSum, braidProd, braidMax, braidMin});
    if (!options) return kExitPassed;
    const char* store = std::getenv("GLOO_PERF_STORE");
    if (store == nullptr)
      throw UsageError("GLOO_PERF_STORE is not set: name an empty directory every rank can reach");
    armTimeout("gloo-perf", options->timeoutSeconds);
    GlooComm comm(environmentInt("OMPI_COMM_WORLD_RANK", "RANK"),
                  environmentInt("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"), store);
    const int64_t wrong =
        runPeerBenchmark(*options, comm, {"gloo-perf", "Gloo", GLOO_PERF_VERSION, "mpirun"});
    comm.leaveTogether();
    return wrong == 0 ? kExitPassed : kExitWrongValues;
  });
}
