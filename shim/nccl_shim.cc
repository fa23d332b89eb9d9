// libnccl.so.2: the functions of the newest nccl.h at hand (the CUDA toolkit's, or the one PyPI's
// NCCL wheel ships: shim/CMakeLists.txt chooses), compiled against that header and forwarded to
// braid's C API (a client of braid.h like any user program), and the host entry points of NCCL's
// device API (nccl_device.h), which braid does not provide, refusing in NCCL's words. Enum values
// and the unique id's layout are nccl.h's already (checked below); results map one to one except
// braidTimeout, which NCCL has no code for: a peer that never came is ncclRemoteError, with
// braid's sentence in ncclGetLastError. The pnccl* profiling names are aliases of the nccl* ones.
#include <nccl.h>
#include <nccl_device.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>

#include "braid/braid.h"

#define SHIM_API extern "C" __attribute__((visibility("default")))

// nccl.h's values are braid's (include/braid/braid.h says so); a header that changes one fails
// here.
template <typename A, typename B>
constexpr bool same(A a, B b) {
  return static_cast<int>(a) == static_cast<int>(b);
}
static_assert(sizeof(ncclUniqueId) == sizeof(braidUniqueId));
static_assert(same(ncclSuccess, braidSuccess) &&
              same(ncclUnhandledCudaError, braidUnhandledCudaError) &&
              same(ncclSystemError, braidSystemError) &&
              same(ncclInternalError, braidInternalError) &&
              same(ncclInvalidArgument, braidInvalidArgument) &&
              same(ncclInvalidUsage, braidInvalidUsage) &&
              same(ncclRemoteError, braidRemoteError) && same(ncclInProgress, braidInProgress));
static_assert(same(ncclInt8, braidInt8) && same(ncclUint8, braidUint8) &&
              same(ncclInt32, braidInt32) && same(ncclUint32, braidUint32) &&
              same(ncclInt64, braidInt64) && same(ncclUint64, braidUint64) &&
              same(ncclFloat16, braidFloat16) && same(ncclFloat32, braidFloat32) &&
              same(ncclFloat64, braidFloat64) && same(ncclBfloat16, braidBfloat16) &&
              same(ncclFloat8e4m3, braidFloat8e4m3) && same(ncclFloat8e5m2, braidFloat8e5m2) &&
              same(ncclNumTypes, braidNumTypes));
static_assert(same(ncclSum, braidSum) && same(ncclProd, braidProd) && same(ncclMax, braidMax) &&
              same(ncclMin, braidMin) && same(ncclAvg, braidAvg));
static_assert(NCCL_SPLIT_NOCOLOR == BRAID_SPLIT_NOCOLOR);
static_assert(NCCL_SHRINK_DEFAULT == BRAID_SHRINK_DEFAULT &&
              NCCL_SHRINK_ABORT == BRAID_SHRINK_ABORT);
static_assert(same(ncclScalarDevice, braidScalarDevice) &&
              same(ncclScalarHostImmediate, braidScalarHostImmediate));

namespace {

// A failure the shim itself reports (what nccl.h offers and braid does not do); the next call
// clears it, so ncclGetLastError tells the latest failure.
thread_local std::string tShimError;

ncclResult_t result(braidResult_t r) {
  tShimError.clear();
  return r == braidTimeout ? ncclRemoteError : static_cast<ncclResult_t>(r);
}

ncclResult_t refuse(ncclResult_t code, std::string why) {
  tShimError = std::move(why);
  return code;
}

braidComm_t comm(ncclComm_t c) {
  return reinterpret_cast<braidComm_t>(c);
}
braidComm_t* comms(ncclComm_t* c) {
  return reinterpret_cast<braidComm_t*>(c);
}
braidDataType_t type(ncclDataType_t t) {
  return static_cast<braidDataType_t>(t);
}
braidRedOp_t op(ncclRedOp_t o) {
  return static_cast<braidRedOp_t>(o);
}
braidUniqueId id(const ncclUniqueId& u) {
  braidUniqueId b;
  std::memcpy(&b, &u, sizeof b);
  return b;
}

// Whether the caller's struct (ncclConfig_t, ncclCommProperties_t: of its own nccl.h's size) has
// `field`.
#define HAS_FIELD(config, field) \
  ((config)->size >=             \
   offsetof(std::remove_cvref_t<decltype(*(config))>, field) + sizeof((config)->field))

// ncclConfig_t to braid's. Layouts of older nccl.h versions are shorter: only the fields inside the
// caller's `size` are read. Honoured: blocking, commName, minCTAs and maxCTAs (a CTA runs a
// channel: the planner's channel bounds), netName, splitShare and shrinkShare. The others tune
// NCCL's GPU kernels and network plug-ins (CGA clusters, NVLS, CollNet, traffic class) and mean
// nothing for braid's CPU communicators yet (docs/shim.md).
ncclResult_t translate(const ncclConfig_t* in, braidConfig_t* out, bool* given) {
  *out = BRAID_CONFIG_INITIALIZER;
  *given = in != nullptr;
  if (in == nullptr) return ncclSuccess;
  if (in->magic != 0xcafebeef || in->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
    return refuse(ncclInvalidArgument,
                  "config was not initialized with NCCL_CONFIG_INITIALIZER (bad magic or size)");
  if (HAS_FIELD(in, blocking)) out->blocking = in->blocking;
  if (HAS_FIELD(in, commName)) out->commName = in->commName;
  if (HAS_FIELD(in, minCTAs)) out->minChannels = in->minCTAs;
  if (HAS_FIELD(in, maxCTAs)) out->maxChannels = in->maxCTAs;
  if (HAS_FIELD(in, netName)) out->netName = in->netName;
  if (HAS_FIELD(in, splitShare)) out->splitShare = in->splitShare;
  if (HAS_FIELD(in, shrinkShare)) out->shrinkShare = in->shrinkShare;
  return ncclSuccess;
}

// Calls `init` with braid's form of the caller's config (NULL stays NULL).
template <typename Init>
ncclResult_t withConfig(const ncclConfig_t* config, Init init) {
  braidConfig_t b;
  bool given = false;
  if (ncclResult_t r = translate(config, &b, &given); r != ncclSuccess) return r;
  return result(init(given ? &b : nullptr));
}

}  // namespace

SHIM_API ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return refuse(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;  // the nccl.h whose functions this library provides
  return result(braidSuccess);
}

SHIM_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  return result(braidGetUniqueId(reinterpret_cast<braidUniqueId*>(uniqueId)));
}

SHIM_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* c, int nranks, ncclUniqueId commId,
                                             int rank, ncclConfig_t* config) {
  return withConfig(config, [&](braidConfig_t* b) {
    return braidCommInitRankConfig(comms(c), nranks, id(commId), rank, b);
  });
}

SHIM_API ncclResult_t ncclCommInitRank(ncclComm_t* c, int nranks, ncclUniqueId commId, int rank) {
  return result(braidCommInitRank(comms(c), nranks, id(commId), rank));
}

SHIM_API ncclResult_t ncclCommInitAll(ncclComm_t* c, int ndev, const int* devlist) {
  return result(braidCommInitAll(comms(c), ndev, devlist));
}

SHIM_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* c, int nranks, int myrank, int nId,
                                               ncclUniqueId* commIds, ncclConfig_t* config) {
  return withConfig(config, [&](braidConfig_t* b) {
    return braidCommInitRankScalable(comms(c), nranks, myrank, nId,
                                     reinterpret_cast<braidUniqueId*>(commIds), b);
  });
}

SHIM_API ncclResult_t ncclCommFinalize(ncclComm_t c) {
  return result(braidCommFinalize(comm(c)));
}
SHIM_API ncclResult_t ncclCommDestroy(ncclComm_t c) {
  return result(braidCommDestroy(comm(c)));
}
SHIM_API ncclResult_t ncclCommAbort(ncclComm_t c) {
  return result(braidCommAbort(comm(c)));
}
SHIM_API ncclResult_t ncclCommRevoke(ncclComm_t c, int revokeFlags) {
  return result(braidCommRevoke(comm(c), revokeFlags));
}

SHIM_API ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t* newcomm,
                                    ncclConfig_t* config) {
  return withConfig(config, [&](braidConfig_t* b) {
    return braidCommSplit(comm(c), color, key, comms(newcomm), b);
  });
}

SHIM_API ncclResult_t ncclCommShrink(ncclComm_t c, int* excludeRanksList, int excludeRanksCount,
                                     ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  return withConfig(config, [&](braidConfig_t* b) {
    return braidCommShrink(comm(c), excludeRanksList, excludeRanksCount, comms(newcomm), b,
                           shrinkFlags);
  });
}

SHIM_API const char* ncclGetErrorString(ncclResult_t r) {
  return braidGetErrorString(static_cast<braidResult_t>(r));
}

SHIM_API const char* ncclGetLastError(ncclComm_t c) {
  return tShimError.empty() ? braidGetLastError(comm(c)) : tShimError.c_str();
}

// Deprecated in nccl.h and "not supported as part of the NCCL API": braid reads its logging
// environment (BRAID_DEBUG, BRAID_DEBUG_SUBSYS, BRAID_DEBUG_FILE) once, at first use. nccl.h 2.30
// declares it only where NCCL_OS_LINUX is defined (nothing defines it) and else makes it a macro;
// its library exports it still, and so does this one, for programs built with older headers.
#ifdef ncclResetDebugInit
#undef ncclResetDebugInit
#undef pncclResetDebugInit
extern "C" void ncclResetDebugInit();
#endif
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
SHIM_API void ncclResetDebugInit() {
  braidResetDebugInit();
}
#pragma GCC diagnostic pop

SHIM_API ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* asyncError) {
  braidResult_t async = braidSuccess;
  const braidResult_t r = braidCommGetAsyncError(comm(c), &async);
  if (r == braidSuccess && asyncError != nullptr)
    *asyncError = async == braidTimeout ? ncclRemoteError : static_cast<ncclResult_t>(async);
  return result(r);
}

SHIM_API ncclResult_t ncclCommCount(const ncclComm_t c, int* count) {
  return result(braidCommCount(comm(c), count));
}
SHIM_API ncclResult_t ncclCommCuDevice(const ncclComm_t c, int* device) {
  return result(braidCommCuDevice(comm(c), device));
}
SHIM_API ncclResult_t ncclCommUserRank(const ncclComm_t c, int* rank) {
  return result(braidCommUserRank(comm(c), rank));
}

SHIM_API ncclResult_t ncclCommRegister(const ncclComm_t c, void* buff, size_t size, void** handle) {
  return result(braidCommRegister(comm(c), buff, size, handle));
}
SHIM_API ncclResult_t ncclCommDeregister(const ncclComm_t c, void* handle) {
  return result(braidCommDeregister(comm(c), handle));
}
SHIM_API ncclResult_t ncclCommWindowRegister(ncclComm_t c, void* buff, size_t size,
                                             ncclWindow_t* win, int winFlags) {
  return result(braidCommWindowRegister(comm(c), buff, size, reinterpret_cast<braidWindow_t*>(win),
                                        winFlags));
}
SHIM_API ncclResult_t ncclCommWindowDeregister(ncclComm_t c, ncclWindow_t win) {
  return result(braidCommWindowDeregister(comm(c), reinterpret_cast<braidWindow_t>(win)));
}

SHIM_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* o, void* scalar,
                                               ncclDataType_t datatype,
                                               ncclScalarResidence_t residence, ncclComm_t c) {
  return result(braidRedOpCreatePreMulSum(reinterpret_cast<braidRedOp_t*>(o), scalar,
                                          type(datatype),
                                          static_cast<braidScalarResidence_t>(residence), comm(c)));
}
SHIM_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t o, ncclComm_t c) {
  return result(braidRedOpDestroy(op(o), comm(c)));
}

SHIM_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t o, int root, ncclComm_t c,
                                 cudaStream_t stream) {
  return result(
      braidReduce(sendbuff, recvbuff, count, type(datatype), op(o), root, comm(c), stream));
}
SHIM_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                ncclComm_t c, cudaStream_t stream) {
  return result(braidBcast(buff, count, type(datatype), root, comm(c), stream));
}
SHIM_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, int root, ncclComm_t c,
                                    cudaStream_t stream) {
  return result(braidBroadcast(sendbuff, recvbuff, count, type(datatype), root, comm(c), stream));
}
SHIM_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t o, ncclComm_t c,
                                    cudaStream_t stream) {
  return result(braidAllReduce(sendbuff, recvbuff, count, type(datatype), op(o), comm(c), stream));
}
SHIM_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                        ncclDataType_t datatype, ncclRedOp_t o, ncclComm_t c,
                                        cudaStream_t stream) {
  return result(
      braidReduceScatter(sendbuff, recvbuff, recvcount, type(datatype), op(o), comm(c), stream));
}
SHIM_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                    ncclDataType_t datatype, ncclComm_t c, cudaStream_t stream) {
  return result(braidAllGather(sendbuff, recvbuff, sendcount, type(datatype), comm(c), stream));
}
SHIM_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                   ncclDataType_t datatype, ncclComm_t c, cudaStream_t stream) {
  return result(braidAlltoAll(sendbuff, recvbuff, count, type(datatype), comm(c), stream));
}
SHIM_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t c,
                                 cudaStream_t stream) {
  return result(braidGather(sendbuff, recvbuff, count, type(datatype), root, comm(c), stream));
}
SHIM_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t c,
                                  cudaStream_t stream) {
  return result(braidScatter(sendbuff, recvbuff, count, type(datatype), root, comm(c), stream));
}
SHIM_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                               int peer, ncclComm_t c, cudaStream_t stream) {
  return result(braidSend(sendbuff, count, type(datatype), peer, comm(c), stream));
}
SHIM_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                               ncclComm_t c, cudaStream_t stream) {
  return result(braidRecv(recvbuff, count, type(datatype), peer, comm(c), stream));
}

SHIM_API ncclResult_t ncclGroupStart() {
  return result(braidGroupStart());
}
SHIM_API ncclResult_t ncclGroupEnd() {
  return result(braidGroupEnd());
}
SHIM_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  if (simInfo == nullptr || simInfo->magic != 0x74685283u || simInfo->size < sizeof(ncclSimInfo_t))
    return refuse(
        ncclInvalidArgument,
        "ncclGroupSimulateEnd: simInfo was not initialized with NCCL_SIM_INFO_INITIALIZER");
  braidSimInfo_t b = BRAID_SIM_INFO_INITIALIZER;
  const ncclResult_t r = result(braidGroupSimulateEnd(&b));
  if (r == ncclSuccess) simInfo->estimatedTime = b.estimatedTime;
  return r;
}

SHIM_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  return result(braidMemAlloc(ptr, size));
}
SHIM_API ncclResult_t ncclMemFree(void* ptr) {
  return result(braidMemFree(ptr));
}

// What NCCL offers and braid does not: NCCL's own result for a feature it lacks, and a sentence.
namespace {
ncclResult_t unsupported(const char* function, const char* what) {
  return refuse(ncclInvalidUsage, std::string(function) + ": braid does not provide " + what);
}
}  // namespace

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
SHIM_API ncclResult_t ncclCommGetUniqueId(ncclComm_t, ncclUniqueId*) {
  return unsupported("ncclCommGetUniqueId", "growing a communicator (ncclCommGrow)");
}
SHIM_API ncclResult_t ncclCommGrow(ncclComm_t, int, const ncclUniqueId*, int, ncclComm_t*,
                                   ncclConfig_t*) {
  return unsupported("ncclCommGrow",
                     "growing a communicator; make a new one with ncclCommInitRankConfig");
}

// braid keeps a communicator's FIFOs until ncclCommDestroy: nothing of it can be suspended.
SHIM_API ncclResult_t ncclCommSuspend(ncclComm_t, int) {
  return unsupported("ncclCommSuspend",
                     "suspending a communicator (its buffers stay until ncclCommDestroy)");
}
SHIM_API ncclResult_t ncclCommResume(ncclComm_t) {
  return unsupported("ncclCommResume", "suspending a communicator, so none is ever suspended");
}
SHIM_API ncclResult_t ncclCommMemStats(ncclComm_t c, ncclCommMemStat_t stat, uint64_t* value) {
  int count = 0;
  if (ncclResult_t r = result(braidCommCount(comm(c), &count)); r != ncclSuccess) return r;
  if (value == nullptr) return refuse(ncclInvalidArgument, "ncclCommMemStats: value is NULL");
  if (stat == ncclStatGpuMemSuspended) {
    *value = 0;  // never suspended (ncclCommSuspend)
    return ncclSuccess;
  }
  return unsupported("ncclCommMemStats", "counts of a communicator's device memory yet");
}

SHIM_API ncclResult_t ncclWinGetUserPtr(ncclComm_t c, ncclWindow_t win, void** outUserPtr) {
  return result(braidWinGetUserPtr(comm(c), reinterpret_cast<braidWindow_t>(win), outUserPtr));
}

SHIM_API ncclResult_t ncclPutSignal(const void*, size_t, ncclDataType_t, int, ncclWindow_t, size_t,
                                    int, int, unsigned int, ncclComm_t, cudaStream_t) {
  return unsupported("ncclPutSignal", "one-sided puts into a peer's window");
}
SHIM_API ncclResult_t ncclSignal(int, int, int, unsigned int, ncclComm_t, cudaStream_t) {
  return unsupported("ncclSignal", "one-sided signals");
}
SHIM_API ncclResult_t ncclWaitSignal(int, ncclWaitSignalDesc_t*, ncclComm_t, cudaStream_t) {
  return unsupported("ncclWaitSignal", "one-sided signals");
}

// NCCL's parameters: braid reads none of NCCL_*; its own are BRAID_* (`braid-perf --env`). So the
// table of keys is empty and every key or handle is unknown.
namespace {
ncclResult_t unknownParameter(const char* function, const char* key) {
  return refuse(ncclInvalidArgument,
                std::string(function) + ": braid has no NCCL parameter " +
                    (key != nullptr ? key : "(NULL key)") +
                    " (braid reads BRAID_* variables, not NCCL_*; `braid-perf --env` lists them)");
}
ncclResult_t unboundHandle(const char* function) {
  return refuse(ncclInvalidArgument, std::string(function) +
                                         ": the handle did not come from ncclParamBind (braid "
                                         "has no NCCL parameters to bind)");
}
}  // namespace

SHIM_API ncclResult_t ncclParamBind(ncclParamHandle_t*, const char* key) {
  return unknownParameter("ncclParamBind", key);
}
SHIM_API ncclResult_t ncclParamGetParameter(const char* key, const char**, int*) {
  return unknownParameter("ncclParamGetParameter", key);
}
SHIM_API ncclResult_t ncclParamGetAllParameterKeys(const char*** table, int* tableLen) {
  if (table == nullptr || tableLen == nullptr)
    return refuse(ncclInvalidArgument, "ncclParamGetAllParameterKeys: table or tableLen is NULL");
  static const char* const kNoKeys[] = {nullptr};
  *table = const_cast<const char**>(kNoKeys);
  *tableLen = 0;
  return result(braidSuccess);
}
SHIM_API void ncclParamDumpAll() {
  tShimError.clear();  // no NCCL parameters to dump
}
SHIM_API ncclResult_t ncclParamGetStr(ncclParamHandle_t, const char**) {
  return unboundHandle("ncclParamGetStr");
}
SHIM_API ncclResult_t ncclParamGet(ncclParamHandle_t, void*, int, int*) {
  return unboundHandle("ncclParamGet");
}
#define PARAM_GETTER(suffix, type)                                       \
  SHIM_API ncclResult_t ncclParamGet##suffix(ncclParamHandle_t, type*) { \
    return unboundHandle("ncclParamGet" #suffix);                        \
  }
PARAM_GETTER(I8, int8_t)
PARAM_GETTER(I16, int16_t)
PARAM_GETTER(I32, int32_t)
PARAM_GETTER(I64, int64_t)
PARAM_GETTER(U8, uint8_t)
PARAM_GETTER(U16, uint16_t)
PARAM_GETTER(U32, uint32_t)
PARAM_GETTER(U64, uint64_t)
#undef PARAM_GETTER
#endif  // NCCL 2.30

// NCCL's device API (nccl_device.h): its kernels reach peers' windows through a device
// communicator, which braid does not make. Its host entry points exist, so a program or library
// that links them (torch does) loads; those that would set it up refuse, and the teams say what a
// rank of a braid communicator can load and store directly through that API: itself alone.
SHIM_API ncclResult_t ncclDevCommCreate(ncclComm_t, ncclDevCommRequirements_t const*,
                                        ncclDevComm_t*) {
  return unsupported("ncclDevCommCreate", "NCCL's device API (device communicators)");
}
SHIM_API ncclResult_t ncclDevCommDestroy(ncclComm_t, ncclDevComm_t const*) {
  return unsupported("ncclDevCommDestroy", "NCCL's device API, so no device communicator was made");
}
SHIM_API ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t, int, ncclLsaBarrierHandle_t*,
                                                      ncclDevResourceRequirements_t*) {
  return unsupported("ncclLsaBarrierCreateRequirement", "NCCL's device API (barriers)");
}
SHIM_API ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t, ncclTeam_t, int,
                                                      ncclGinBarrierHandle_t*,
                                                      ncclDevResourceRequirements_t*) {
  return unsupported("ncclGinBarrierCreateRequirement", "NCCL's device API (GPU-initiated net)");
}
SHIM_API ncclResult_t ncclLLA2ACreateRequirement(int, int, ncclLLA2AHandle_t*,
                                                 ncclDevResourceRequirements_t*) {
  return unsupported("ncclLLA2ACreateRequirement", "NCCL's device API (LL all-to-all)");
}
SHIM_API int ncclLLA2ACalcSlots(int, int) {
  unsupported("ncclLLA2ACalcSlots", "NCCL's device API (LL all-to-all): -1 slots");
  return -1;
}

namespace {
// The world team of a communicator ({0, -1, 0} where it is no communicator).
ncclTeam_t worldTeam(ncclComm_t c) {
  tShimError.clear();  // an answer: the latest failure is no longer this thread's latest call's
  ncclTeam_t team{0, -1, 0};
  int count = 0, rank = 0;
  if (braidCommCount(comm(c), &count) == braidSuccess &&
      braidCommUserRank(comm(c), &rank) == braidSuccess)
    team = {count, rank, 1};
  return team;
}
}  // namespace

SHIM_API ncclTeam_t ncclTeamWorld(ncclComm_t c) {
  return worldTeam(c);
}
SHIM_API ncclTeam_t ncclTeamLsa(ncclComm_t c) {
  const ncclTeam_t world = worldTeam(c);
  return world.rank < 0 ? world : ncclTeam_t{1, 0, 1};
}
SHIM_API ncclTeam_t ncclTeamRail(ncclComm_t c) {
  return worldTeam(c);  // the outer factor of a team of one: the world
}
SHIM_API int ncclTeamRankToWorld(ncclComm_t c, ncclTeam_t team, int rank) {
  return worldTeam(c).rank + (rank - team.rank) * team.stride;
}
SHIM_API int ncclTeamRankToLsa(ncclComm_t, ncclTeam_t team, int rank) {
  tShimError.clear();
  return (rank - team.rank) * team.stride;  // this rank is LSA rank 0 of its team of one
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
// What a communicator offers NCCL's device API: nothing of it (the fields inside the caller's
// size).
SHIM_API ncclResult_t ncclCommQueryProperties(ncclComm_t c, ncclCommProperties_t* props) {
  if (props == nullptr || props->magic != NCCL_API_MAGIC ||
      props->size < offsetof(ncclCommProperties_t, rank))
    return refuse(ncclInvalidArgument,
                  "ncclCommQueryProperties: props was not initialized with "
                  "NCCL_COMM_PROPERTIES_INITIALIZER (NULL, or bad magic or size)");
  int rank = 0, count = 0, device = -1;
  for (braidResult_t r : {braidCommUserRank(comm(c), &rank), braidCommCount(comm(c), &count),
                          braidCommCuDevice(comm(c), &device)})
    if (r != braidSuccess) return result(r);
  if (HAS_FIELD(props, rank)) props->rank = rank;
  if (HAS_FIELD(props, nRanks)) props->nRanks = count;
  if (HAS_FIELD(props, cudaDev)) props->cudaDev = device;
  if (HAS_FIELD(props, nvmlDev)) props->nvmlDev = -1;  // braid does not map CUDA to NVML indices
  if (HAS_FIELD(props, deviceApiSupport)) props->deviceApiSupport = false;
  if (HAS_FIELD(props, multimemSupport)) props->multimemSupport = false;
  if (HAS_FIELD(props, ginType)) props->ginType = NCCL_GIN_TYPE_NONE;
  if (HAS_FIELD(props, nLsaTeams)) props->nLsaTeams = count;  // an LSA team of one per rank
  if (HAS_FIELD(props, hostRmaSupport)) props->hostRmaSupport = false;
  if (HAS_FIELD(props, railedGinType)) props->railedGinType = NCCL_GIN_TYPE_NONE;
  return result(braidSuccess);
}
SHIM_API ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t, size_t, void**) {
  return unsupported("ncclGetLsaMultimemDevicePointer", "NVLink SHARP multimem pointers");
}
SHIM_API ncclResult_t ncclGetMultimemDevicePointer(ncclWindow_t, size_t, ncclMultimemHandle_t,
                                                   void**) {
  return unsupported("ncclGetMultimemDevicePointer", "NVLink SHARP multimem pointers");
}
SHIM_API ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t, size_t, int, void**) {
  return unsupported("ncclGetLsaDevicePointer", "device pointers into peers' windows");
}
SHIM_API ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t, size_t, int, void**) {
  return unsupported("ncclGetPeerDevicePointer", "device pointers into peers' windows");
}
#endif  // NCCL 2.30

// The profiling names (PMPI's convention, which nccl.h declares too): the same functions.
#define PNCCL(name) SHIM_API decltype(name) p##name __attribute__((alias(#name)));
PNCCL(ncclGetVersion)
PNCCL(ncclGetUniqueId)
PNCCL(ncclCommInitRankConfig)
PNCCL(ncclCommInitRank)
PNCCL(ncclCommInitAll)
PNCCL(ncclCommInitRankScalable)
PNCCL(ncclCommFinalize)
PNCCL(ncclCommDestroy)
PNCCL(ncclCommAbort)
PNCCL(ncclCommRevoke)
PNCCL(ncclCommSplit)
PNCCL(ncclCommShrink)
PNCCL(ncclGetErrorString)
PNCCL(ncclGetLastError)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
PNCCL(ncclResetDebugInit)
#pragma GCC diagnostic pop
PNCCL(ncclCommGetAsyncError)
PNCCL(ncclCommCount)
PNCCL(ncclCommCuDevice)
PNCCL(ncclCommUserRank)
PNCCL(ncclCommRegister)
PNCCL(ncclCommDeregister)
PNCCL(ncclCommWindowRegister)
PNCCL(ncclCommWindowDeregister)
PNCCL(ncclRedOpCreatePreMulSum)
PNCCL(ncclRedOpDestroy)
PNCCL(ncclReduce)
PNCCL(ncclBcast)
PNCCL(ncclBroadcast)
PNCCL(ncclAllReduce)
PNCCL(ncclReduceScatter)
PNCCL(ncclAllGather)
PNCCL(ncclAlltoAll)
PNCCL(ncclGather)
PNCCL(ncclScatter)
PNCCL(ncclSend)
PNCCL(ncclRecv)
PNCCL(ncclGroupStart)
PNCCL(ncclGroupEnd)
PNCCL(ncclGroupSimulateEnd)
PNCCL(ncclMemAlloc)
PNCCL(ncclMemFree)
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
PNCCL(ncclCommGetUniqueId)
PNCCL(ncclCommGrow)
PNCCL(ncclCommSuspend)
PNCCL(ncclCommResume)
PNCCL(ncclCommMemStats)
PNCCL(ncclWinGetUserPtr)
PNCCL(ncclPutSignal)
PNCCL(ncclSignal)
PNCCL(ncclWaitSignal)
PNCCL(ncclParamBind)
PNCCL(ncclParamGetParameter)
PNCCL(ncclParamGetAllParameterKeys)
PNCCL(ncclParamDumpAll)
PNCCL(ncclParamGetStr)
PNCCL(ncclParamGet)
PNCCL(ncclParamGetI8)
PNCCL(ncclParamGetI16)
PNCCL(ncclParamGetI32)
PNCCL(ncclParamGetI64)
PNCCL(ncclParamGetU8)
PNCCL(ncclParamGetU16)
PNCCL(ncclParamGetU32)
PNCCL(ncclParamGetU64)
#endif
