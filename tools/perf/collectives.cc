#include "perf/collectives.h"

#include "perf/types.h"

namespace braid_perf {
namespace {

// The whole buffer on every rank (all-reduce, broadcast, reduce, send/recv).
Layout fullLayout(size_t count, int) {
  return {count, count, count, 0, 0};
}

double allReduceFactor(int n) {
  return 2.0 * (n - 1) / n;
}
double shareFactor(int n) {
  return static_cast<double>(n - 1) / n;
}
double unitFactor(int) {
  return 1.0;
}

double ownInput(const ValueModel& model, const Layout&, int rank, size_t i) {
  return model.input(rank, i);
}
Expected reducedAtIndex(const ValueModel& model, const Layout&, int, int, int, size_t i) {
  return model.reduced(i);
}
bool everyRank(int, int) {
  return true;
}

braidResult_t sendRecvRing(const CallArgs& a) {
  braidResult_t result = braidGroupStart();
  if (result != braidSuccess) return result;
  braidResult_t send =
      braidSend(a.send, a.count, a.type, (a.rank + 1) % a.nranks, a.comm, a.stream);
  braidResult_t recv =
      braidRecv(a.recv, a.count, a.type, (a.rank - 1 + a.nranks) % a.nranks, a.comm, a.stream);
  result = braidGroupEnd();
  return send != braidSuccess ? send : recv != braidSuccess ? recv : result;
}

// All-to-all as nccl-tests does it: one send and one receive of `count` elements per peer,
// itself included, in a group.
braidResult_t allToAllGrouped(const CallArgs& a) {
  braidResult_t result = braidGroupStart();
  if (result != braidSuccess) return result;
  const size_t chunkBytes = a.count * datatypeInfo(a.type).size;
  braidResult_t first = braidSuccess;
  for (int peer = 0; peer < a.nranks && first == braidSuccess; ++peer) {
    first = braidSend(static_cast<const char*>(a.send) + peer * chunkBytes, a.count, a.type, peer,
                      a.comm, a.stream);
    if (first == braidSuccess)
      first = braidRecv(static_cast<char*>(a.recv) + peer * chunkBytes, a.count, a.type, peer,
                        a.comm, a.stream);
  }
  result = braidGroupEnd();
  return first != braidSuccess ? first : result;
}

}  // namespace

const Collective kCollectives[7] = {
    {"allreduce", true, false, true, fullLayout, allReduceFactor,
     [](const CallArgs& a) {
       return braidAllReduce(a.send, a.recv, a.count, a.type, a.op, a.comm, a.stream);
     },
     ownInput, reducedAtIndex, everyRank, braidCollAllReduce},
    {"reducescatter", true, false, true,
     [](size_t count, int n) {
       const size_t share = count / n;
       return Layout{share * n, share, share, 0, share};
     },
     shareFactor,
     [](const CallArgs& a) {
       return braidReduceScatter(a.send, a.recv, a.count, a.type, a.op, a.comm, a.stream);
     },
     ownInput,
     [](const ValueModel& model, const Layout& l, int rank, int, int, size_t i) {
       return model.reduced(rank * l.recvCount + i);
     },
     everyRank, braidCollReduceScatter},
    {"allgather", false, false, true,
     [](size_t count, int n) {
       const size_t share = count / n;
       return Layout{share, share * n, share, share, 0};
     },
     shareFactor,
     [](const CallArgs& a) {
       return braidAllGather(a.send, a.recv, a.count, a.type, a.comm, a.stream);
     },
     [](const ValueModel& model, const Layout& l, int rank, size_t i) {
       return model.input(rank, rank * l.sendCount + i);
     },
     [](const ValueModel& model, const Layout& l, int, int, int, size_t i) -> Expected {
       return {model.input(static_cast<int>(i / l.sendCount), i)};
     },
     everyRank, braidCollAllGather},
    {"broadcast", false, true, true, fullLayout, unitFactor,
     [](const CallArgs& a) {
       return braidBroadcast(a.send, a.recv, a.count, a.type, a.root, a.comm, a.stream);
     },
     ownInput,
     [](const ValueModel& model, const Layout&, int, int, int root, size_t i) -> Expected {
       return {model.input(root, i)};
     },
     everyRank, braidCollBroadcast},
    {"reduce", true, true, true, fullLayout, unitFactor,
     [](const CallArgs& a) {
       return braidReduce(a.send, a.recv, a.count, a.type, a.op, a.root, a.comm, a.stream);
     },
     ownInput, reducedAtIndex, [](int rank, int root) { return rank == root; }, braidCollReduce},
    {"sendrecv", false, false, false, fullLayout, unitFactor, sendRecvRing, ownInput,
     [](const ValueModel& model, const Layout&, int rank, int n, int, size_t i) -> Expected {
       return {model.input((rank - 1 + n) % n, i)};
     },
     everyRank, braidCollSendRecv},
    {"alltoall", false, false, false,
     [](size_t count, int n) {
       const size_t share = count / n;
       return Layout{share * n, share * n, share, 0, 0};
     },
     shareFactor, allToAllGrouped, ownInput,
     [](const ValueModel& model, const Layout& l, int rank, int, int, size_t i) -> Expected {
       const size_t share = l.paramCount;
       return {model.input(static_cast<int>(i / share), rank * share + i % share)};
     },
     everyRank},
};

const Collective* findCollective(std::string_view name) {
  for (const Collective& c : kCollectives)
    if (name == c.name) return &c;
  return nullptr;
}

}  // namespace braid_perf
