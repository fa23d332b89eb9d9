#include "core/arguments.h"

#include <fmt/format.h>

#include <cstdint>

#include "base/error.h"
#include "coll/call_tag.h"
#include "core/host_stream.h"
#include "kernels/host_reduce.h"

namespace braid::api {

bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return aBytes != 0 && bBytes != 0 && x < y + bBytes && y < x + aBytes;
}

void checkComm(const braidComm* comm, const char* fn) {
  if (comm == nullptr) fail(braidInvalidArgument, "{}: comm is NULL (expected a communicator)", fn);
}

void checkStream(const braidComm* comm, const char* fn, braidStream_t stream) {
  if (comm->onDevice()) return;  // a cudaStream_t, NULL the default stream
  if (stream != nullptr && !braid::HostStream::isLive(stream))
    fail(braidInvalidArgument,
         "{} on rank {}: stream {} is not a braid host stream (a CPU communicator takes NULL or a "
         "stream from braidStreamCreate)",
         fn, comm->rank(), stream);
}

size_t checkTypeAndCount(const braidComm* comm, const char* fn, braidDataType_t type, size_t count,
                         size_t blocks) {
  const size_t elem = braid::kernels::typeSize(type);
  if (elem == 0)
    fail(braidInvalidArgument,
         "{} on rank {}: datatype {} is not a braidDataType_t (expected 0..{})", fn, comm->rank(),
         static_cast<int>(type), braidNumTypes - 1);
  const size_t maxCount = SIZE_MAX / elem / blocks;
  if (count > maxCount)
    fail(braidInvalidArgument, "{} on rank {}: count {} overflows the address space (at most {})",
         fn, comm->rank(), count, maxCount);
  return elem;
}

void checkRank(const braidComm* comm, const char* fn, const char* what, int value) {
  if (value < 0 || value >= comm->nranks())
    fail(braidInvalidArgument, "{} on rank {}: {} {} is out of range (expected 0..{})", fn,
         comm->rank(), what, value, comm->nranks() - 1);
}

void checkBuffer(const braidComm* comm, const char* fn, const char* name, const void* buffer,
                 size_t count, size_t bytes) {
  if (buffer == nullptr)
    fail(braidInvalidArgument, "{} on rank {}: {} is NULL but count is {} (expected {} bytes)", fn,
         comm->rank(), name, count, bytes);
  comm->checkBuffer(fn, name, buffer);
}

void validate(const braidComm* comm, const CollArgs& a, braidStream_t stream) {
  const char* fn = apiName(a.coll);
  checkComm(comm, fn);
  const int rank = comm->rank(), n = comm->nranks();
  const bool perRank = a.coll == Collective::ReduceScatter || a.coll == Collective::AllGather;
  const size_t elem =
      checkTypeAndCount(comm, fn, a.type, a.count, perRank ? static_cast<size_t>(n) : 1);
  const bool reduces = a.coll == Collective::AllReduce || a.coll == Collective::ReduceScatter ||
                       a.coll == Collective::Reduce;
  if (reduces && (static_cast<int>(a.op) < 0 ||
                  (a.op >= braidNumOps && !comm->reductionOps().has(a.op, a.type))))
    fail(braidInvalidArgument,
         "{} on rank {}: op {} is not a braidRedOp_t (expected 0..{}, or an operator "
         "braidRedOpCreatePreMulSum made on this communicator for datatype {})",
         fn, rank, static_cast<int>(a.op), braidNumOps - 1, static_cast<int>(a.type));
  const bool rooted = a.coll == Collective::Broadcast || a.coll == Collective::Reduce;
  const bool p2p = a.coll == Collective::Send || a.coll == Collective::Recv;
  if (rooted || p2p) checkRank(comm, fn, p2p ? "peer" : "root", a.root);
  checkStream(comm, fn, stream);
  if (a.count == 0) return;

  const size_t bytes = a.count * elem;
  const size_t sendBytes = a.coll == Collective::ReduceScatter ? bytes * n : bytes;
  const size_t recvBytes = a.coll == Collective::AllGather ? bytes * n : bytes;
  const bool needSend =
      a.coll != Collective::Recv && (a.coll != Collective::Broadcast || rank == a.root);
  const bool needRecv =
      a.coll != Collective::Send && (a.coll != Collective::Reduce || rank == a.root);
  if (needSend) checkBuffer(comm, fn, "sendbuff", a.sendbuff, a.count, sendBytes);
  if (needRecv) checkBuffer(comm, fn, "recvbuff", a.recvbuff, a.count, recvBytes);
  if (!needSend || !needRecv || a.sendbuff == a.recvbuff) {
    // Equal pointers are the in-place form of reduce-scatter and all-gather on rank 0 only.
    if (perRank && needSend && needRecv && rank != 0)
      fail(braidInvalidArgument,
           "{} on rank {}: sendbuff == recvbuff is not the in-place form (expected {} at offset "
           "rank*count*size = {} bytes)",
           fn, rank, a.coll == Collective::ReduceScatter ? "recvbuff" : "sendbuff",
           static_cast<size_t>(rank) * bytes);
    return;
  }
  const auto* send = static_cast<const uint8_t*>(a.sendbuff);
  const auto* recv = static_cast<const uint8_t*>(a.recvbuff);
  const size_t inPlaceOffset = static_cast<size_t>(rank) * bytes;
  if (a.coll == Collective::ReduceScatter && recv == send + inPlaceOffset) return;
  if (a.coll == Collective::AllGather && send == recv + inPlaceOffset) return;
  if (overlaps(send, sendBytes, recv, recvBytes))
    fail(braidInvalidArgument,
         "{} on rank {}: sendbuff and recvbuff overlap without being the in-place form (expected "
         "disjoint buffers{})",
         fn, rank,
         perRank ? fmt::format(", or the block at offset {} bytes", inPlaceOffset) : std::string());
}

}  // namespace braid::api
