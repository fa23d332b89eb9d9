// The shared-memory transport names nothing in /dev/shm (its segments are memory files handed to
// the peers as descriptors), so a rank killed at any point of init leaves nothing behind there, and
// a container's small /dev/shm does not limit it. Shown with no /dev/shm to write at all: a
// read-only tmpfs of 64 KiB mounted over it in a private mount namespace (so the test needs root,
// as CI runs; elsewhere it is skipped). Three ranks as processes initialize over shared memory
// (their maps show the segments), all-reduce 4 MiB each, every element checked, and destroy.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "braid/braid.h"

namespace {

constexpr int kSkip = 77;
constexpr int kRanks = 3;
constexpr size_t kCount = size_t{1} << 20;  // floats: 4 MiB, 64 times the tmpfs

enum RankExit { kInitFailed = 30, kNoSegmentMapped = 31, kCallFailed = 32, kWrongSum = 33 };

// Whether this process maps a shared-memory segment of braid's (its own or a peer's).
bool mapsASegment() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("memfd:braid-") != std::string::npos) return true;
  return false;
}

int runRank(const braidUniqueId& id, int rank) {
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.timeoutMs = 20000;
  braidComm_t comm = nullptr;
  if (braidCommInitRankConfig(&comm, kRanks, id, rank, &config) != braidSuccess) {
    std::fprintf(stderr, "rank %d: init: %s\n", rank, braidGetLastError(nullptr));
    return kInitFailed;
  }
  if (!mapsASegment()) return kNoSegmentMapped;
  std::vector<float> send(kCount), recv(kCount, -1.0f);
  for (size_t i = 0; i < kCount; ++i) send[i] = static_cast<float>((i % 97) * (rank + 1));
  if (braidAllReduce(send.data(), recv.data(), kCount, braidFloat32, braidSum, comm, nullptr) !=
      braidSuccess) {
    std::fprintf(stderr, "rank %d: all-reduce: %s\n", rank, braidGetLastError(comm));
    return kCallFailed;
  }
  for (size_t i = 0; i < kCount; ++i)
    if (recv[i] != static_cast<float>((i % 97) * (kRanks * (kRanks + 1) / 2))) return kWrongSum;
  braidCommDestroy(comm);
  return 0;
}

// Runs in a child: the read-only /dev/shm, then the ranks as its children. Returns the first
// rank's exit code that is not 0, or 0.
int runWithoutDevShm() {
  if (unshare(CLONE_NEWNS) != 0) return kSkip;
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return kSkip;
  if (mount("tmpfs", "/dev/shm", "tmpfs", MS_RDONLY, "size=64k") != 0) return kSkip;
  braidUniqueId id;
  if (braidGetUniqueId(&id) != braidSuccess) return 10;
  for (int rank = 0; rank < kRanks; ++rank)
    if (fork() == 0) _exit(runRank(id, rank));
  int worst = 0, status = 0;
  while (wait(&status) > 0) {
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (worst == 0) worst = code;
  }
  return worst;
}

TEST(SharedMemory, NeedsNoDevShmSoNothingIsLeftThere) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(runWithoutDevShm());
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == kSkip) GTEST_SKIP() << "cannot mount a private /dev/shm (not root?)";
  EXPECT_NE(WEXITSTATUS(status), kInitFailed) << "a rank's init failed without /dev/shm";
  EXPECT_NE(WEXITSTATUS(status), kNoSegmentMapped) << "a rank mapped no braid segment";
  EXPECT_NE(WEXITSTATUS(status), kCallFailed) << "a rank's all-reduce failed";
  EXPECT_NE(WEXITSTATUS(status), kWrongSum) << "a rank's all-reduce gave a wrong sum";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
