// mpi-perf: braid-perf's method and table for Open MPI's collectives, to set braid's rows beside.
//   mpirun -np 2 mpi-perf allreduce -b 8 -e 256M -f 4 -c 1
// Subcommands: allreduce (MPI_Allreduce), reducescatter (MPI_Reduce_scatter_block), allgather
// (MPI_Allgather). Exit status as braid-perf: 0 passed, 1 wrong values, 2 bad flags, 3 failed.
#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstring>

#include "peer_bench.h"
#include "perf/launch.h"

namespace braid_perf {
namespace {

MPI_Datatype mpiDatatype(braidDataType_t type) {
  switch (type) {
    case braidInt8: return MPI_INT8_T;
    case braidUint8: return MPI_UINT8_T;
    case braidInt32: return MPI_INT32_T;
    case braidUint32: return MPI_UINT32_T;
    case braidInt64: return MPI_INT64_T;
    case braidUint64: return MPI_UINT64_T;
    case braidFloat64: return MPI_DOUBLE;
    default: return MPI_FLOAT;  // parsePeerOptions admits no other type
  }
}

MPI_Op mpiOp(braidRedOp_t op) {
  switch (op) {
    case braidProd: return MPI_PROD;
    case braidMax: return MPI_MAX;
    case braidMin: return MPI_MIN;
    default: return MPI_SUM;
  }
}

void check(const char* what, int result) {
  if (result == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(result, text, &length);
  throw RunError(fmt::format("{} failed: {}", what, std::string(text, length)));
}

class MpiComm : public PeerComm {
 public:
  explicit MpiComm(const Collective& collective) : collective_(collective.name) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks_);
  }
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  void barrier() override { check("MPI_Barrier", MPI_Barrier(MPI_COMM_WORLD)); }
  void maxOverRanks(double* values, int count) override {
    check("MPI_Allreduce (result max)",
          MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  }
  std::vector<RankInfo> rankInfo() override {
    struct Record {
      int32_t pid;
      char host[124];
    } mine{};
    mine.pid = static_cast<int32_t>(getpid());
    gethostname(mine.host, sizeof mine.host - 1);
    std::vector<Record> records(nranks_);
    check("MPI_Allgather (rank info)", MPI_Allgather(&mine, sizeof mine, MPI_BYTE, records.data(),
                                                     sizeof mine, MPI_BYTE, MPI_COMM_WORLD));
    std::vector<RankInfo> ranks;
    for (int r = 0; r < nranks_; ++r) ranks.push_back({r, records[r].pid, records[r].host});
    return ranks;
  }
  void launch(int, const void* send, void* recv, size_t count, braidDataType_t type,
              braidRedOp_t op) override {
    if (count > INT_MAX)
      throw RunError(fmt::format("{} elements: more than MPI's int count can hold", count));
    const int n = static_cast<int>(count);
    const size_t slotBytes = count * datatypeInfo(type).size;  // this rank's part of the buffer
    if (collective_ == "allreduce") {
      check("MPI_Allreduce", MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, n,
                                           mpiDatatype(type), mpiOp(op), MPI_COMM_WORLD));
    } else if (collective_ == "reducescatter") {
      // braid in place: the input is the whole buffer, the result goes to this rank's slot of it;
      // MPI_IN_PLACE leaves it at the start, so it is copied to the slot (in the time).
      char* whole = static_cast<char*>(recv) - slotBytes * rank_;
      const bool inPlace = send == whole;
      check("MPI_Reduce_scatter_block",
            MPI_Reduce_scatter_block(inPlace ? MPI_IN_PLACE : send, inPlace ? whole : recv, n,
                                     mpiDatatype(type), mpiOp(op), MPI_COMM_WORLD));
      if (inPlace && rank_ != 0) std::memcpy(recv, whole, slotBytes);
    } else {
      // braid in place: this rank's input already sits in its slot of the output.
      const bool inPlace = send == static_cast<char*>(recv) + slotBytes * rank_;
      check("MPI_Allgather", MPI_Allgather(inPlace ? MPI_IN_PLACE : send, n, mpiDatatype(type),
                                           recv, n, mpiDatatype(type), MPI_COMM_WORLD));
    }
  }

 private:
  std::string collective_;
  int rank_ = 0;
  int nranks_ = 0;
};

std::string mpiVersion() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, length);
  version = version.substr(0, version.find_first_of(",\n"));  // "Open MPI v4.1.4"
  const std::string prefix = "Open MPI ";
  return version.starts_with(prefix) ? version.substr(prefix.size()) : version;
}

}  // namespace
}  // namespace braid_perf

int main(int argc, char** argv) {
  using namespace braid_perf;
  setvbuf(stdout, nullptr, _IOLBF, 0);
  MPI_Init(&argc, &argv);
  int status = kExitPassed;
  try {
    const std::optional<Options> options =
        parsePeerOptions(argc, argv, {"allreduce", "reducescatter", "allgather"},
                         {braidInt8, braidUint8, braidInt32, braidUint32, braidInt64, braidUint64,
                          braidFloat32, braidFloat64},
                         {braidSum, braidProd, braidMax, braidMin});
    if (options) {
      armTimeout("mpi-perf", options->timeoutSeconds);
      MpiComm comm(*options->collective);
      const int64_t wrong =
          runPeerBenchmark(*options, comm, {"mpi-perf", "Open MPI", mpiVersion(), "mpirun"});
      status = wrong == 0 ? kExitPassed : kExitWrongValues;
    }
  } catch (const UsageError& e) {
    fmt::print(stderr, "mpi-perf: {}\n", e.what());
    status = kExitUsage;
  } catch (const std::exception& e) {
    fmt::print(stderr, "mpi-perf: {}\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, kExitFailed);
  }
  MPI_Finalize();
  return status;
}
