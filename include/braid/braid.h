/*
 * braid: collective communication for GPUs and CPUs.
 *
 * The API follows nccl.h (2.2x) function for function, with the `braid` prefix and the same enum
 * values and result codes, so a libnccl shim is a thin alias layer. Where braid goes beyond NCCL
 * (CPU communicators, host streams, timeouts, environment-driven init) the extension is marked.
 */
#ifndef BRAID_BRAID_H_
#define BRAID_BRAID_H_

#include <limits.h>
#include <stddef.h>

#define BRAID_MAJOR 0
#define BRAID_MINOR 1
#define BRAID_PATCH 0
#define BRAID_VERSION(X, Y, Z) ((X)*10000 + (Y)*100 + (Z))
#define BRAID_VERSION_CODE BRAID_VERSION(BRAID_MAJOR, BRAID_MINOR, BRAID_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque handle to a communicator. */
typedef struct braidComm* braidComm_t;
#define BRAID_COMM_NULL NULL

/* On a CUDA communicator a cudaStream_t; on a CPU communicator NULL (the call completes before it
 * returns) or a host stream from braidStreamCreate (calls run in order on a worker thread). */
typedef void* braidStream_t;

#define BRAID_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[BRAID_UNIQUE_ID_BYTES];
} braidUniqueId;

/* Result codes: values 0..7 are nccl.h's; braidTimeout is braid's extension, on the value nccl.h
 * gives its count ncclNumResults (8), which no NCCL call returns. Through libnccl.so.2 a timeout
 * is ncclRemoteError (a peer did not arrive), with braid's sentence from ncclGetLastError. */
typedef enum {
  braidSuccess = 0,
  braidUnhandledCudaError = 1,
  braidSystemError = 2,
  braidInternalError = 3,
  braidInvalidArgument = 4,
  braidInvalidUsage = 5,
  braidRemoteError = 6,
  braidInProgress = 7,
  braidTimeout = 8,
  braidNumResults = 9
} braidResult_t;

typedef enum {
  braidSum = 0,
  braidProd = 1,
  braidMax = 2,
  braidMin = 3,
  braidAvg = 4,
  braidNumOps = 5
} braidRedOp_t;

typedef enum {
  braidInt8 = 0,
  braidChar = 0,
  braidUint8 = 1,
  braidInt32 = 2,
  braidInt = 2,
  braidUint32 = 3,
  braidInt64 = 4,
  braidUint64 = 5,
  braidFloat16 = 6,
  braidHalf = 6,
  braidFloat32 = 7,
  braidFloat = 7,
  braidFloat64 = 8,
  braidDouble = 8,
  braidBfloat16 = 9,
  braidFloat8e4m3 = 10, /* OCP FP8 E4M3 (no infinity); reduced in fp32, saturating like NCCL */
  braidFloat8e5m2 = 11, /* OCP FP8 E5M2 */
  braidNumTypes = 12
} braidDataType_t;

#define BRAID_CONFIG_UNDEF_INT INT_MIN
#define BRAID_CONFIG_UNDEF_PTR NULL

/* Communicator configuration: the fields of ncclConfig_t that braid honours, then braid's own.
 * Always start from BRAID_CONFIG_INITIALIZER. */
typedef struct braidConfig_v1 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;         /* 1 (default): init blocks; 0: init returns braidInProgress */
  const char* commName; /* shown in logs and errors */
  int timeoutMs;        /* braid: per-operation timeout; default BRAID_TIMEOUT (ms) */
  const char* device;   /* braid: "cpu" or "cuda"; default BRAID_DEVICE */
  int minChannels;      /* fewest channels (rings) the planner makes; default BRAID_MIN_NCHANNELS */
  int maxChannels;      /* most channels the planner makes; default BRAID_MAX_NCHANNELS */
  const char* netName;  /* the network between hosts: "Socket" (TCP, the default) */
  int splitShare;       /* 1: children of braidCommSplit share this communicator's links (FIFOs,
                           connections); parent and child then take turns, one operation at a time,
                           and may not run in one group. Read from the split's config, else the
                           parent's; default 0 */
  int shrinkShare;      /* the same for braidCommShrink without BRAID_SHRINK_ABORT; default 0 */
  const char* algorithms; /* braid: the algorithms the planner may choose, as BRAID_ALGO ("ring",
                             "direct", "doubling", "halving", "tree", "hier-doubling",
                             "hier-halving", "hier" for both, comma-separated); default
                             BRAID_ALGO. Read only where size covers it. */
} braidConfig_t;

#define BRAID_CONFIG_MAGIC 0xb4a1dc0fu
#define BRAID_CONFIG_INITIALIZER                                                           \
  {                                                                                        \
    sizeof(braidConfig_t), BRAID_CONFIG_MAGIC, BRAID_VERSION_CODE, BRAID_CONFIG_UNDEF_INT, \
        BRAID_CONFIG_UNDEF_PTR, BRAID_CONFIG_UNDEF_INT, BRAID_CONFIG_UNDEF_PTR,            \
        BRAID_CONFIG_UNDEF_INT, BRAID_CONFIG_UNDEF_INT, BRAID_CONFIG_UNDEF_PTR,            \
        BRAID_CONFIG_UNDEF_INT, BRAID_CONFIG_UNDEF_INT, BRAID_CONFIG_UNDEF_PTR             \
  }

/* nccl.h's PreMulSum: an operator of one communicator and datatype that multiplies each rank's
 * input by that rank's scalar, then sums. braidScalarHostImmediate reads the scalar now;
 * braidScalarDevice reads it at every call (on a CPU communicator, from host memory). Every rank
 * creates its operators in the same order; the operator is valid on its communicator for its
 * datatype until braidRedOpDestroy. */
typedef enum { braidScalarDevice = 0, braidScalarHostImmediate = 1 } braidScalarResidence_t;
braidResult_t braidRedOpCreatePreMulSum(braidRedOp_t* op, void* scalar, braidDataType_t datatype,
                                        braidScalarResidence_t residence, braidComm_t comm);
braidResult_t braidRedOpDestroy(braidRedOp_t op, braidComm_t comm);

braidResult_t braidGetVersion(int* version);

/* Generates the id that every rank passes to braidCommInitRank. The calling process hosts the
 * rendezvous until all ranks have arrived. With BRAID_COMM_ID=host:port (or torchrun's
 * MASTER_ADDR/MASTER_PORT) set, every rank gets the same id and rank 0 hosts the rendezvous. */
braidResult_t braidGetUniqueId(braidUniqueId* uniqueId);

braidResult_t braidCommInitRank(braidComm_t* comm, int nranks, braidUniqueId commId, int rank);
braidResult_t braidCommInitRankConfig(braidComm_t* comm, int nranks, braidUniqueId commId, int rank,
                                      braidConfig_t* config);
/* ndev ranks as threads of this process; devlist may be NULL (CPU or devices 0..ndev-1). */
braidResult_t braidCommInitAll(braidComm_t* comms, int ndev, const int* devlist);

/* braid: rank, size and rendezvous from the launcher's environment: BRAID_COMM_ID or
 * MASTER_ADDR/MASTER_PORT, and RANK/WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK/SIZE (Open MPI)
 * or SLURM_PROCID/SLURM_NTASKS (Slurm). config may be NULL. */
braidResult_t braidCommInitFromEnv(braidComm_t* comm, braidConfig_t* config);

/* Makes communicators of the ranks of `comm` that pass the same color, ranked by key (ties by
 * rank in `comm`); a rank that passes BRAID_SPLIT_NOCOLOR gets NULL. Every rank of `comm` calls
 * it. config NULL: the new communicator inherits comm's configuration. One thread that drives
 * several communicators (braidCommInitAll) splits them inside braidGroupStart/End. */
#define BRAID_SPLIT_NOCOLOR -1
braidResult_t braidCommSplit(braidComm_t comm, int color, int key, braidComm_t* newcomm,
                             braidConfig_t* config);

/* Makes a communicator of the ranks of `comm` not in excludeRanksList (ranks keep their order):
 * every rank that is not excluded calls it, the excluded ones do not (they may be dead). With
 * BRAID_SHRINK_ABORT the operations in flight on `comm` end first and `comm` is marked failed, for
 * recovery after a peer failed; with BRAID_SHRINK_DEFAULT none may be in flight. config NULL: the
 * new communicator inherits comm's configuration. One thread that drives several communicators
 * shrinks them inside braidGroupStart/End. */
#define BRAID_SHRINK_DEFAULT 0x00
#define BRAID_SHRINK_ABORT 0x01
braidResult_t braidCommShrink(braidComm_t comm, int* excludeRanksList, int excludeRanksCount,
                              braidComm_t* newcomm, braidConfig_t* config, int shrinkFlags);

/* Like braidCommInitRankConfig with nId unique ids, as nccl.h's scalable init: every rank passes
 * the same ids in the same order. braid's root serves any number of ranks, so the first id's root
 * serves them all; the others' roots see no rank and exit at their timeout. */
braidResult_t braidCommInitRankScalable(braidComm_t* newcomm, int nranks, int myrank, int nId,
                                        braidUniqueId* commIds, braidConfig_t* config);

/* Stops the operations in flight on comm (they return braidRemoteError) and refuses new ones;
 * its peers see it as failed. revokeFlags must be 0. The communicator is still destroyed with
 * braidCommDestroy. */
braidResult_t braidCommRevoke(braidComm_t comm, int revokeFlags);

/* Memory for communication buffers (ncclMemAlloc), of the kind a communicator made now takes by
 * default: device memory of the calling thread's current CUDA device where one can be used and
 * BRAID_DEVICE is not "cpu" (as NCCL's); else page-aligned host memory whose pages are mapped at
 * once, so no collective pays their first-touch faults. Free with braidMemFree (NULL: nothing to
 * do, as free()); any other pointer is refused. With ranks as threads of one GPU, allocate and free
 * device memory while no call is in flight: cudaMalloc and cudaFree may wait for kernels that wait
 * for a peer (docs/cuda.md). */
braidResult_t braidMemAlloc(void** ptr, size_t size);
braidResult_t braidMemFree(void* ptr);

/* Buffer registration (ncclCommRegister, ncclCommWindowRegister): the buffer is checked and
 * recorded with the communicator, and the handle is valid until deregistered or the communicator
 * is destroyed. A window of a CUDA communicator is registered by every rank together (collective,
 * as in NCCL), each rank its own part; where the ranks share one GPU in one process, all-reduce,
 * reduce-scatter and all-gather whose buffers lie in windows, at the same offsets on every rank
 * (NCCL's symmetric windows), may run the direct engine with each rank launched on its own thread:
 * every rank reads and writes the others' windows in place. Windows are one size on every rank.
 * Where every rank chose the direct engine but their calls differ (another offset, count or
 * datatype), every rank's call fails with braidInvalidUsage before anything is read or written;
 * where a rank's differing call runs the ring instead (its buffers outside its windows, or a size
 * the model gives the ring), the others' calls end at the timeout (braidTimeout). Deregistration
 * is local. CPU communicators and braidCommRegister record the buffer only: their transports copy
 * through FIFOs either way. */
typedef struct braidWindow* braidWindow_t;
braidResult_t braidCommRegister(const braidComm_t comm, void* buff, size_t size, void** handle);
braidResult_t braidCommDeregister(const braidComm_t comm, void* handle);
braidResult_t braidCommWindowRegister(braidComm_t comm, void* buff, size_t size, braidWindow_t* win,
                                      int winFlags);
braidResult_t braidCommWindowDeregister(braidComm_t comm, braidWindow_t win);
/* The buffer a window of this communicator was registered with (ncclWinGetUserPtr). */
braidResult_t braidWinGetUserPtr(braidComm_t comm, braidWindow_t win, void** outUserPtr);

braidResult_t braidCommFinalize(braidComm_t comm);
braidResult_t braidCommDestroy(braidComm_t comm);
braidResult_t braidCommAbort(braidComm_t comm);
braidResult_t braidCommGetAsyncError(braidComm_t comm, braidResult_t* asyncError);
braidResult_t braidCommCount(const braidComm_t comm, int* count);
braidResult_t braidCommCuDevice(const braidComm_t comm, int* device);
braidResult_t braidCommUserRank(const braidComm_t comm, int* rank);

/* braid extension: what the planner expects of one call on this communicator (NCCL keeps this
 * internal). `bytes` is nccl-tests' size: the all-reduce buffer, the all-gather output, the
 * reduce-scatter input. The algorithm and protocol named are the ones the call would run. */
typedef enum {
  braidCollAllReduce = 0,
  braidCollReduceScatter = 1,
  braidCollAllGather = 2,
  braidCollBroadcast = 3,
  braidCollReduce = 4,
  braidCollSendRecv = 5
} braidCollective_t;
typedef struct {
  double microseconds;
  double busBandwidthGBs; /* nccl-tests' busbw, GB = 1e9 bytes */
  const char* algorithm;  /* "ring", "direct", "doubling", "halving", "tree", "hier-doubling" or
                             "hier-halving" */
  const char* protocol;   /* "simple" or "ll" */
} braidPrediction_t;
braidResult_t braidCommPredict(braidComm_t comm, braidCollective_t collective, size_t bytes,
                               braidPrediction_t* prediction);
/* The communicator's plan as text: one line per channel (ring order, hop kinds, GB/s), then the
 * model's constants. Valid until the communicator is destroyed. */
braidResult_t braidCommDescribePlan(braidComm_t comm, const char** text);

/* braid extension: every tunable the library reads from the environment (`braid-perf --env`
 * prints them). *params points at *count entries that stay valid for the life of the process.
 * A set variable whose value does not parse fails the call (braidInvalidArgument, naming it). */
typedef struct {
  const char* name;         /* the environment variable, e.g. "BRAID_TIMEOUT" */
  const char* value;        /* what the library uses: the variable's value, else the default */
  const char* defaultValue; /* what it uses when the variable is unset or empty */
  const char* help;
} braidParam_t;
braidResult_t braidGetParams(const braidParam_t** params, int* count);

/* Reads the logging environment again (BRAID_DEBUG, BRAID_DEBUG_SUBSYS, BRAID_DEBUG_FILE), as
 * nccl.h's ncclResetDebugInit: a program may change it between phases. The other parameters keep
 * the values read at their first use. */
void braidResetDebugInit(void);

const char* braidGetErrorString(braidResult_t result);
/* The last error's sentence (rank, peer, operation, what was expected). comm may be NULL: then
 * the calling thread's last error. */
const char* braidGetLastError(braidComm_t comm);

braidResult_t braidAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                             braidDataType_t datatype, braidRedOp_t op, braidComm_t comm,
                             braidStream_t stream);
braidResult_t braidReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                 braidDataType_t datatype, braidRedOp_t op, braidComm_t comm,
                                 braidStream_t stream);
braidResult_t braidAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                             braidDataType_t datatype, braidComm_t comm, braidStream_t stream);
braidResult_t braidBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                             braidDataType_t datatype, int root, braidComm_t comm,
                             braidStream_t stream);
braidResult_t braidReduce(const void* sendbuff, void* recvbuff, size_t count,
                          braidDataType_t datatype, braidRedOp_t op, int root, braidComm_t comm,
                          braidStream_t stream);
/* nccl.h's in-place broadcast: braidBroadcast(buff, buff, ...). */
braidResult_t braidBcast(void* buff, size_t count, braidDataType_t datatype, int root,
                         braidComm_t comm, braidStream_t stream);
/* Rank i sends sendbuff + j*count to rank j, which places it at recvbuff + i*count. The buffers
 * must not overlap. */
braidResult_t braidAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                            braidDataType_t datatype, braidComm_t comm, braidStream_t stream);
/* Rank i's count elements go to recvbuff + i*count on root; in place when sendbuff == recvbuff +
 * root*count. recvbuff is not used on other ranks. */
braidResult_t braidGather(const void* sendbuff, void* recvbuff, size_t count,
                          braidDataType_t datatype, int root, braidComm_t comm,
                          braidStream_t stream);
/* Root sends sendbuff + i*count to rank i; in place when recvbuff == sendbuff + root*count.
 * sendbuff is not used on other ranks. */
braidResult_t braidScatter(const void* sendbuff, void* recvbuff, size_t count,
                           braidDataType_t datatype, int root, braidComm_t comm,
                           braidStream_t stream);
braidResult_t braidSend(const void* sendbuff, size_t count, braidDataType_t datatype, int peer,
                        braidComm_t comm, braidStream_t stream);
braidResult_t braidRecv(void* recvbuff, size_t count, braidDataType_t datatype, int peer,
                        braidComm_t comm, braidStream_t stream);
/* braid extension (MPI_Iprobe for one peer): *waiting is 1 where a send from `peer` on comm has
 * begun to arrive at this rank and no receive has taken it yet, with that send's count and datatype
 * in *count and *datatype (either may be NULL); else 0 (always for peer == this rank). A send of no
 * elements carries nothing and is never seen; a peer's all-to-all, gather or scatter, made of
 * sends, is seen as its sends. A CPU communicator's, between its operations (it waits for one
 * running, as a call does); a CUDA communicator answers braidInvalidUsage. */
braidResult_t braidProbe(int peer, braidComm_t comm, int* waiting, size_t* count,
                         braidDataType_t* datatype);

/* A thread's calls between braidGroupStart and the outermost braidGroupEnd run together at its end
 * (nccl.h's groups). As NCCL's: where a call inside the group fails, braidGroupEnd returns that
 * failure and runs none of the group's operations (communicators the group initializes, splits or
 * shrinks are still made). */
braidResult_t braidGroupStart(void);
braidResult_t braidGroupEnd(void);

/* Ends the group without running it, and says how long the planner's model expects it to take:
 * per communicator the sum of its operations' predicted times, the slowest communicator's in
 * microseconds (ncclGroupSimulateEnd). */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} braidSimInfo_t;
#define BRAID_SIM_INFO_MAGIC 0x74685283u
#define BRAID_SIM_INFO_INITIALIZER \
  { sizeof(braidSimInfo_t), BRAID_SIM_INFO_MAGIC, BRAID_VERSION_CODE, -1.0f }
braidResult_t braidGroupSimulateEnd(braidSimInfo_t* simInfo);

/* braid: host streams for CPU communicators. */
braidResult_t braidStreamCreate(braidStream_t* stream);
/* Waits for every operation queued so far; returns the first error one of them met. */
braidResult_t braidStreamSynchronize(braidStream_t stream);
braidResult_t braidStreamDestroy(braidStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* BRAID_BRAID_H_ */
