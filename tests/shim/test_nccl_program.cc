// A program written for NCCL: it includes only the CUDA toolkit's nccl.h and links libnccl.so.2,
// which is braid's shim. Every collective, every datatype NCCL 2.28 has, PreMulSum,
// CommSplit and the management calls, on host buffers (braid's CPU communicators), with ranks as
// threads of one process (ncclCommInitAll) and as forked processes. References are computed here
// from the inputs' formula; outputs are poisoned first.
#include <gtest/gtest.h>
#include <nccl.h>
#include <nccl_device.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kRanks = 4;
constexpr size_t kCount = 1031;

bool isFp8(ncclDataType_t t) {
  return t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}

// Small integers, exact in every type: rank r's element i. fp8 (3 significant bits in E5M2) gets
// 0 or 1, so the sum of 4 ranks stays exact.
int value(ncclDataType_t t, int rank, size_t i) {
  if (isFp8(t)) return static_cast<int>((rank + i) % 2);
  return (rank + 1) * static_cast<int>(i % 5 + 1);
}

// The bit pattern of a small non-negative integer that the binary float format with this exponent
// bias and stored mantissa width represents exactly (IEEE half, OCP fp8), written here.
uint16_t smallFloatBits(int v, int bias, int mantissaBits) {
  if (v == 0) return 0;
  int e = 31 - __builtin_clz(static_cast<unsigned>(v));
  return static_cast<uint16_t>(((e + bias) << mantissaBits) |
                               ((v - (1 << e)) << (mantissaBits - e)));
}
uint16_t bfloat16Of(int v) {
  float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

size_t sizeOf(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
  }
}

// Writes small integer v as element i of a buffer of type t.
void put(std::vector<uint8_t>& buffer, ncclDataType_t t, size_t i, int v) {
  uint8_t* at = buffer.data() + i * sizeOf(t);
  auto store = [&](auto x) { std::memcpy(at, &x, sizeof x); };
  switch (t) {
    case ncclInt8: store(static_cast<int8_t>(v)); break;
    case ncclUint8: store(static_cast<uint8_t>(v)); break;
    case ncclInt32: store(static_cast<int32_t>(v)); break;
    case ncclUint32: store(static_cast<uint32_t>(v)); break;
    case ncclInt64: store(static_cast<int64_t>(v)); break;
    case ncclUint64: store(static_cast<uint64_t>(v)); break;
    case ncclFloat16: store(smallFloatBits(v, 15, 10)); break;
    case ncclFloat32: store(static_cast<float>(v)); break;
    case ncclFloat64: store(static_cast<double>(v)); break;
    case ncclBfloat16: store(bfloat16Of(v)); break;
    case ncclFloat8e4m3: store(static_cast<uint8_t>(smallFloatBits(v, 7, 3))); break;
    case ncclFloat8e5m2: store(static_cast<uint8_t>(smallFloatBits(v, 15, 2))); break;
    default: break;
  }
}

std::vector<uint8_t> filled(ncclDataType_t t, size_t count, int rank) {
  std::vector<uint8_t> b(count * sizeOf(t));
  for (size_t i = 0; i < count; ++i) put(b, t, i, value(t, rank, i));
  return b;
}

const ncclDataType_t kTypes[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                 ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                 ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};

std::string lastError(ncclComm_t comm) {
  const char* text = ncclGetLastError(comm);
  return text ? text : "";
}

class Threads : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(ncclCommInitAll(comms_, kRanks, nullptr), ncclSuccess) << lastError(nullptr);
  }
  void TearDown() override {
    for (ncclComm_t c : comms_) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
  ncclComm_t comms_[kRanks] = {};
};

TEST_F(Threads, AllReduceEveryTypeSumAndMax) {
  for (ncclDataType_t t : kTypes)
    for (ncclRedOp_t op : {ncclSum, ncclMax}) {
      std::vector<std::vector<uint8_t>> send, recv;
      for (int r = 0; r < kRanks; ++r) {
        send.push_back(filled(t, kCount, r));
        recv.emplace_back(kCount * sizeOf(t), 0xEE);
      }
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      for (int r = 0; r < kRanks; ++r)
        ncclAllReduce(send[r].data(), recv[r].data(), kCount, t, op, comms_[r], nullptr);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << lastError(comms_[0]);
      std::vector<uint8_t> want(kCount * sizeOf(t));
      for (size_t i = 0; i < kCount; ++i) {
        int total = 0;
        int largest = 0;
        for (int r = 0; r < kRanks; ++r) {
          total += value(t, r, i);
          largest = std::max(largest, value(t, r, i));
        }
        put(want, t, i, op == ncclSum ? total : largest);
      }
      for (int r = 0; r < kRanks; ++r)
        EXPECT_EQ(recv[r], want) << "type " << t << " op " << op << " rank " << r;
    }
}

TEST_F(Threads, EveryCollectiveMatchesItsReference) {
  using V = std::vector<int32_t>;
  V send[kRanks], recv[kRanks];
  auto run = [&](auto&& call) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < kRanks; ++r) call(r);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << lastError(comms_[0]);
  };
  auto reset = [&](size_t sendCount, size_t recvCount) {
    for (int r = 0; r < kRanks; ++r) {
      send[r].assign(sendCount, 0);
      for (size_t i = 0; i < sendCount; ++i)
        send[r][i] = value(ncclInt32, r, i) + 100 * static_cast<int>(i);
      recv[r].assign(recvCount, -7);
    }
  };
  const int root = 2;
  // AllGather: rank r's block at r*kCount.
  reset(kCount, kCount * kRanks);
  run([&](int r) {
    ncclAllGather(send[r].data(), recv[r].data(), kCount, ncclInt32, comms_[r], nullptr);
  });
  for (int r = 0; r < kRanks; ++r)
    for (int b = 0; b < kRanks; ++b)
      for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(recv[r][b * kCount + i], send[b][i]);
  // ReduceScatter: block r of the sum.
  reset(kCount * kRanks, kCount);
  run([&](int r) {
    ncclReduceScatter(send[r].data(), recv[r].data(), kCount, ncclInt32, ncclSum, comms_[r],
                      nullptr);
  });
  for (int r = 0; r < kRanks; ++r)
    for (size_t i = 0; i < kCount; ++i) {
      int32_t sum = 0;
      for (int k = 0; k < kRanks; ++k) sum += send[k][r * kCount + i];
      ASSERT_EQ(recv[r][i], sum);
    }
  // Broadcast, Bcast, Reduce from/to the root.
  reset(kCount, kCount);
  run([&](int r) {
    ncclBroadcast(send[r].data(), recv[r].data(), kCount, ncclInt32, root, comms_[r], nullptr);
  });
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(recv[r], send[root]);
  reset(kCount, kCount);
  run([&](int r) { ncclBcast(send[r].data(), kCount, ncclInt32, root, comms_[r], nullptr); });
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(send[r], send[root]);
  reset(kCount, kCount);
  run([&](int r) {
    ncclReduce(send[r].data(), recv[r].data(), kCount, ncclInt32, ncclSum, root, comms_[r],
               nullptr);
  });
  for (size_t i = 0; i < kCount; ++i) {
    int32_t sum = 0;
    for (int k = 0; k < kRanks; ++k) sum += send[k][i];
    ASSERT_EQ(recv[root][i], sum);
  }
  // AlltoAll: block j of rank i goes to block i of rank j.
  reset(kCount * kRanks, kCount * kRanks);
  run([&](int r) {
    ncclAlltoAll(send[r].data(), recv[r].data(), kCount, ncclInt32, comms_[r], nullptr);
  });
  for (int r = 0; r < kRanks; ++r)
    for (int b = 0; b < kRanks; ++b)
      for (size_t i = 0; i < kCount; ++i)
        ASSERT_EQ(recv[r][b * kCount + i], send[b][r * kCount + i]);
  // Gather to the root, Scatter from it.
  reset(kCount, kCount * kRanks);
  run([&](int r) {
    ncclGather(send[r].data(), recv[r].data(), kCount, ncclInt32, root, comms_[r], nullptr);
  });
  for (int b = 0; b < kRanks; ++b)
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(recv[root][b * kCount + i], send[b][i]);
  reset(kCount * kRanks, kCount);
  run([&](int r) {
    ncclScatter(send[r].data(), recv[r].data(), kCount, ncclInt32, root, comms_[r], nullptr);
  });
  for (int r = 0; r < kRanks; ++r)
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(recv[r][i], send[root][r * kCount + i]);
  // Send/Recv round a ring.
  reset(kCount, kCount);
  run([&](int r) {
    ncclSend(send[r].data(), kCount, ncclInt32, (r + 1) % kRanks, comms_[r], nullptr);
    ncclRecv(recv[r].data(), kCount, ncclInt32, (r + kRanks - 1) % kRanks, comms_[r], nullptr);
  });
  for (int r = 0; r < kRanks; ++r) ASSERT_EQ(recv[r], send[(r + kRanks - 1) % kRanks]);
}

// ncclCommShrink: ranks 0, 1 and 3 go on without rank 2, in their order.
TEST_F(Threads, CommShrinkLeavesTheExcludedRankOut) {
  ncclComm_t children[kRanks] = {};
  int excluded[] = {2};
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.commName = "shrunk";
  config.minCTAs = 2;  // channel bounds of braid's planner
  config.maxCTAs = 2;
  // A network braid does not have is refused at once, by name.
  config.netName = "IB";
  ncclComm_t refused = nullptr;
  EXPECT_EQ(ncclCommShrink(comms_[0], excluded, 1, &refused, &config, NCCL_SHRINK_DEFAULT),
            ncclInvalidArgument);
  EXPECT_NE(lastError(comms_[0]).find("netName 'IB'"), std::string::npos) << lastError(comms_[0]);
  config.netName = "Socket";
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r : {0, 1, 3})
    ncclCommShrink(comms_[r], excluded, 1, &children[r], &config, NCCL_SHRINK_DEFAULT);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << lastError(nullptr);
  std::vector<float> data[kRanks];
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r : {0, 1, 3}) {
    int count = 0, rank = -1;
    ASSERT_EQ(ncclCommCount(children[r], &count), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(children[r], &rank), ncclSuccess);
    EXPECT_EQ(count, 3);
    EXPECT_EQ(rank, r == 3 ? 2 : r);
    data[r].assign(kCount, static_cast<float>(r + 1));
    ncclAllReduce(data[r].data(), data[r].data(), kCount, ncclFloat32, ncclSum, children[r],
                  nullptr);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << lastError(nullptr);
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(data[r], std::vector<float>(kCount, 1 + 2 + 4)) << "rank " << r;
    EXPECT_EQ(ncclCommDestroy(children[r]), ncclSuccess);
  }
}

TEST_F(Threads, CommSplitQueriesAndManagement) {
  ncclComm_t children[kRanks] = {};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kRanks; ++r) ncclCommSplit(comms_[r], r % 2, r, &children[r], nullptr);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << lastError(nullptr);
  for (int r = 0; r < kRanks; ++r) {
    int count = 0, rank = -1, device = 0;
    ASSERT_EQ(ncclCommCount(children[r], &count), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(children[r], &rank), ncclSuccess);
    ASSERT_EQ(ncclCommCuDevice(children[r], &device), ncclSuccess);
    EXPECT_EQ(count, kRanks / 2);
    EXPECT_EQ(rank, r / 2);
    EXPECT_EQ(device, -1);  // a CPU communicator
    ncclResult_t async = ncclInternalError;
    ASSERT_EQ(ncclCommGetAsyncError(children[r], &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
  }
  // Registration, memory and the model's estimate.
  void* buffer = nullptr;
  ASSERT_EQ(ncclMemAlloc(&buffer, 1 << 20), ncclSuccess);
  void* handle = nullptr;
  ASSERT_EQ(ncclCommRegister(comms_[0], buffer, 1 << 20, &handle), ncclSuccess);
  EXPECT_EQ(ncclCommDeregister(comms_[0], handle), ncclSuccess);
  EXPECT_EQ(ncclCommDeregister(comms_[0], handle), ncclInvalidArgument);
  EXPECT_EQ(ncclMemFree(buffer), ncclSuccess);
  EXPECT_EQ(ncclMemFree(buffer), ncclInvalidArgument);
  EXPECT_EQ(ncclMemFree(nullptr), ncclSuccess);  // as NCCL's (cudaFree of NULL), and free()
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  std::vector<float> data(1 << 20);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kRanks; ++r)
    ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat32, ncclSum, comms_[r], nullptr);
  ASSERT_EQ(ncclGroupSimulateEnd(&sim), ncclSuccess) << lastError(nullptr);
  EXPECT_GT(sim.estimatedTime, 0.0f);
  // PreMulSum: each rank's input times its own scalar, then summed.
  ncclRedOp_t premul[kRanks];
  float scalars[kRanks], in[kRanks][8], out[kRanks][8];
  for (int r = 0; r < kRanks; ++r) {
    scalars[r] = static_cast<float>(r + 2);
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&premul[r], &scalars[r], ncclFloat32,
                                       ncclScalarHostImmediate, comms_[r]),
              ncclSuccess)
        << lastError(comms_[r]);
    for (int i = 0; i < 8; ++i) in[r][i] = static_cast<float>(value(ncclFloat32, r, i));
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kRanks; ++r)
    ncclAllReduce(in[r], out[r], 8, ncclFloat32, premul[r], comms_[r], nullptr);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << lastError(nullptr);
  for (int i = 0; i < 8; ++i) {
    float want = 0;
    for (int k = 0; k < kRanks; ++k) want += static_cast<float>((k + 2) * value(ncclFloat32, k, i));
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(out[r][i], want) << "rank " << r << " element " << i;
  }
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(ncclRedOpDestroy(premul[r], comms_[r]), ncclSuccess);
  // A datatype beyond nccl.h's is refused by number.
  EXPECT_EQ(ncclAllReduce(data.data(), data.data(), 8, ncclNumTypes, ncclSum, comms_[0], nullptr),
            ncclInvalidArgument);
  EXPECT_NE(lastError(comms_[0]).find("datatype 12"), std::string::npos) << lastError(comms_[0]);
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  for (ncclComm_t child : children) EXPECT_EQ(ncclCommDestroy(child), ncclSuccess);
}

// What braid does not provide answers in NCCL's words (ncclInvalidUsage and a sentence naming the
// call), and what it can answer, it does: a window's buffer, never suspended, no NCCL parameters,
// the teams of NCCL's device API (a rank reaches no peer's memory through it, so its load/store
// team is itself).
TEST_F(Threads, NewerCallsAnswerOrRefuseInNcclsWords) {
  auto refused = [](ncclResult_t r, const char* function) {
    EXPECT_EQ(r, ncclInvalidUsage) << function;
    EXPECT_NE(lastError(nullptr).find(std::string(function) + ": braid does not provide"),
              std::string::npos)
        << lastError(nullptr);
  };
  refused(ncclDevCommCreate(comms_[1], nullptr, nullptr), "ncclDevCommCreate");
  const ncclTeam_t world = ncclTeamWorld(comms_[2]), lsa = ncclTeamLsa(comms_[2]);
  EXPECT_EQ(world.nRanks, kRanks);
  EXPECT_EQ(world.rank, 2);
  EXPECT_EQ(lsa.nRanks, 1);
  EXPECT_EQ(ncclTeamRankToWorld(comms_[2], world, 3), 3);
  EXPECT_EQ(ncclTeamRankToWorld(comms_[2], lsa, 0), 2);
  EXPECT_EQ(ncclTeamRail(comms_[2]).nRanks, kRanks);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
  std::vector<float> buffer(1024);
  ncclWindow_t window = nullptr;
  ASSERT_EQ(
      ncclCommWindowRegister(comms_[0], buffer.data(), buffer.size() * sizeof(float), &window, 0),
      ncclSuccess)
      << lastError(comms_[0]);
  void* user = nullptr;
  ASSERT_EQ(ncclWinGetUserPtr(comms_[0], window, &user), ncclSuccess) << lastError(comms_[0]);
  EXPECT_EQ(user, buffer.data());
  EXPECT_EQ(ncclWinGetUserPtr(comms_[1], window, &user), ncclInvalidArgument);  // not comm 1's
  EXPECT_NE(lastError(comms_[1]).find("not a registration of this communicator"), std::string::npos)
      << lastError(comms_[1]);
  ASSERT_EQ(ncclCommWindowDeregister(comms_[0], window), ncclSuccess);
  EXPECT_EQ(ncclWinGetUserPtr(comms_[0], window, &user), ncclInvalidArgument);
  refused(ncclCommSuspend(comms_[0], NCCL_SUSPEND_MEM), "ncclCommSuspend");
  refused(ncclCommResume(comms_[0]), "ncclCommResume");
  uint64_t suspended = 7;
  ASSERT_EQ(ncclCommMemStats(comms_[0], ncclStatGpuMemSuspended, &suspended), ncclSuccess);
  EXPECT_EQ(suspended, 0u);
  refused(ncclCommMemStats(comms_[0], ncclStatGpuMemTotal, &suspended), "ncclCommMemStats");
  ncclUniqueId id;
  refused(ncclCommGetUniqueId(comms_[0], &id), "ncclCommGetUniqueId");
  refused(ncclSignal(1, 0, 0, 0, comms_[0], nullptr), "ncclSignal");
  refused(ncclGetPeerDevicePointer(nullptr, 0, 1, &user), "ncclGetPeerDevicePointer");
  ncclCommProperties_t properties = NCCL_COMM_PROPERTIES_INITIALIZER;
  properties.deviceApiSupport = true;
  ASSERT_EQ(ncclCommQueryProperties(comms_[3], &properties), ncclSuccess) << lastError(nullptr);
  EXPECT_EQ(properties.rank, 3);
  EXPECT_EQ(properties.nRanks, kRanks);
  EXPECT_EQ(properties.cudaDev, -1);  // a CPU communicator
  EXPECT_FALSE(properties.deviceApiSupport);
  EXPECT_EQ(lastError(nullptr).find("ncclGetPeerDevicePointer"), std::string::npos)
      << "an answer clears the refusal before it: " << lastError(nullptr);
  const char** keys = nullptr;
  int nKeys = -1;
  ASSERT_EQ(ncclParamGetAllParameterKeys(&keys, &nKeys), ncclSuccess);
  EXPECT_EQ(nKeys, 0);
  const char* value = nullptr;
  int length = 0;
  EXPECT_EQ(ncclParamGetParameter("NCCL_DEBUG", &value, &length), ncclInvalidArgument);
  EXPECT_NE(lastError(nullptr).find("no NCCL parameter NCCL_DEBUG"), std::string::npos)
      << lastError(nullptr);
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_GE(version, NCCL_VERSION(2, 30, 0));
#endif
}

// What torch's ProcessGroupNCCL does with NCCL besides collectives, in its order: non-blocking
// init (config.blocking = 0) polled through ncclCommGetAsyncError until it leaves ncclInProgress,
// a non-blocking split in a group polled the same way, a buffer registered for the collectives,
// the child finalized (polled) and destroyed, the parent aborted (its watchdog's way out). One
// thread drives every rank, as non-blocking calls allow.
ncclResult_t pollUntilReady(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  for (int polls = 0; state == ncclInProgress && polls < 600000; ++polls) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state == ncclInProgress) usleep(100);
  }
  return state;
}

void allReduceOnEveryRank(ncclComm_t* comms, int n) {
  std::vector<std::vector<float>> data(n);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    data[r].assign(kCount, static_cast<float>(r + 1));
    ncclAllReduce(data[r].data(), data[r].data(), kCount, ncclFloat32, ncclSum, comms[r], nullptr);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << lastError(nullptr);
  for (int r = 0; r < n; ++r) EXPECT_EQ(data[r], std::vector<float>(kCount, n * (n + 1) / 2.0f));
}

TEST(TorchsCalls, NonBlockingInitSplitRegisterFinalizeAndAbort) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comms[kRanks] = {};
  for (int r = 0; r < kRanks; ++r) {
    const ncclResult_t started = ncclCommInitRankConfig(&comms[r], kRanks, id, r, &config);
    ASSERT_TRUE(started == ncclInProgress || started == ncclSuccess) << lastError(nullptr);
  }
  for (ncclComm_t c : comms) ASSERT_EQ(pollUntilReady(c), ncclSuccess) << lastError(c);
  allReduceOnEveryRank(comms, kRanks);

  ncclComm_t children[kRanks] = {};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < kRanks; ++r) {
    const ncclResult_t started = ncclCommSplit(comms[r], 0, kRanks - 1 - r, &children[r], &config);
    EXPECT_TRUE(started == ncclInProgress || started == ncclSuccess) << lastError(comms[r]);
  }
  const ncclResult_t grouped = ncclGroupEnd();
  ASSERT_TRUE(grouped == ncclInProgress || grouped == ncclSuccess) << lastError(nullptr);
  for (ncclComm_t c : children) ASSERT_EQ(pollUntilReady(c), ncclSuccess) << lastError(c);
  int rank = -1;
  ASSERT_EQ(ncclCommUserRank(children[0], &rank), ncclSuccess);
  EXPECT_EQ(rank, kRanks - 1);  // ordered by key
  std::vector<float> registered(kCount);
  void* handle = nullptr;
  ASSERT_EQ(ncclCommRegister(children[0], registered.data(), kCount * sizeof(float), &handle),
            ncclSuccess);
  allReduceOnEveryRank(children, kRanks);
  EXPECT_EQ(ncclCommDeregister(children[0], handle), ncclSuccess);

  for (ncclComm_t c : children) {
    const ncclResult_t started = ncclCommFinalize(c);
    EXPECT_TRUE(started == ncclInProgress || started == ncclSuccess) << lastError(c);
  }
  for (ncclComm_t c : children) {
    EXPECT_EQ(pollUntilReady(c), ncclSuccess) << lastError(c);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
}

// Three processes forked after ncclGetUniqueId, as an MPI-free NCCL program would be launched.
TEST(Processes, AllReduceAllGatherAndSplit) {
  constexpr int n = 3;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  pid_t pids[n];
  for (int rank = 0; rank < n; ++rank) {
    pids[rank] = fork();
    ASSERT_GE(pids[rank], 0);
    if (pids[rank] != 0) continue;
    ncclComm_t comm = nullptr;
    if (ncclCommInitRank(&comm, n, id, rank) != ncclSuccess) _exit(10);
    std::vector<float> send(kCount), recv(kCount, -1), gathered(kCount * n, -1);
    for (size_t i = 0; i < kCount; ++i) send[i] = static_cast<float>(value(ncclFloat32, rank, i));
    if (ncclAllReduce(send.data(), recv.data(), kCount, ncclFloat32, ncclSum, comm, nullptr) !=
        ncclSuccess)
      _exit(11);
    for (size_t i = 0; i < kCount; ++i)
      if (recv[i] != static_cast<float>(value(ncclFloat32, 0, i) + value(ncclFloat32, 1, i) +
                                        value(ncclFloat32, 2, i)))
        _exit(12);
    if (ncclAllGather(send.data(), gathered.data(), kCount, ncclFloat32, comm, nullptr) !=
        ncclSuccess)
      _exit(13);
    for (int b = 0; b < n; ++b)
      for (size_t i = 0; i < kCount; ++i)
        if (gathered[b * kCount + i] != static_cast<float>(value(ncclFloat32, b, i))) _exit(14);
    ncclComm_t child = nullptr;  // ranks 0 and 2 together, rank 1 alone
    if (ncclCommSplit(comm, rank == 1 ? NCCL_SPLIT_NOCOLOR : 0, -rank, &child, nullptr) !=
        ncclSuccess)
      _exit(15);
    if (rank == 1 && child != nullptr) _exit(16);
    if (rank != 1) {
      int one = 1, total = 0, newRank = -1;
      ncclCommUserRank(child, &newRank);
      if (newRank != (rank == 2 ? 0 : 1)) _exit(17);
      if (ncclAllReduce(&one, &total, 1, ncclInt32, ncclSum, child, nullptr) != ncclSuccess ||
          total != 2)
        _exit(18);
      ncclCommDestroy(child);
    }
    _exit(ncclCommDestroy(comm) == ncclSuccess ? 0 : 19);
  }
  for (int rank = 0; rank < n; ++rank) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[rank], &status, 0), pids[rank]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << rank << " exited with " << WEXITSTATUS(status);
  }
}

}  // namespace
