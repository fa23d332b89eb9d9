// A /dev/shm too small for the shared-memory transport must fail init with an error that says
// so, on every rank, and leave nothing behind. The small /dev/shm is a tmpfs mounted in a private
// mount namespace, so the test needs root (CI runs as root); elsewhere it is skipped.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "braid/braid.h"

namespace {

constexpr int kSkip = 77;

// Runs in a child: a private /dev/shm of 64 KiB, then two ranks as processes.
int runWithTinyShm() {
  if (unshare(CLONE_NEWNS) != 0) return kSkip;
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return kSkip;
  if (mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=64k,mode=1777") != 0) return kSkip;
  braidUniqueId id;
  if (braidGetUniqueId(&id) != braidSuccess) return 10;
  int pipes[2][2];
  for (auto& p : pipes)
    if (pipe(p) != 0) return 11;
  for (int rank = 0; rank < 2; ++rank) {
    if (fork() != 0) continue;
    braidConfig_t config = BRAID_CONFIG_INITIALIZER;
    config.timeoutMs = 20000;
    braidComm_t comm = nullptr;
    braidResult_t result = braidCommInitRankConfig(&comm, 2, id, rank, &config);
    std::string message = braidGetLastError(nullptr);
    std::string report = std::to_string(static_cast<int>(result)) + "|" + message;
    if (write(pipes[rank][1], report.data(), report.size()) < 0) _exit(12);
    _exit(0);
  }
  bool anyInitialized = false, namedShm = false;
  for (int rank = 0; rank < 2; ++rank) {
    close(pipes[rank][1]);
    char buffer[2048] = {};
    ssize_t got = read(pipes[rank][0], buffer, sizeof buffer - 1);
    std::string report(buffer, got > 0 ? static_cast<size_t>(got) : 0);
    std::fprintf(stderr, "rank %d: %s\n", rank, report.c_str());
    anyInitialized |= report.rfind(std::to_string(braidSuccess) + "|", 0) == 0;
    namedShm |= report.find("/dev/shm is too small") != std::string::npos;
  }
  int status = 0;
  while (wait(&status) > 0) {
  }
  if (anyInitialized) return 21;
  return namedShm ? 0 : 22;
}

TEST(SmallShm, InitFailsWithAClearMessage) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(runWithTinyShm());
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == kSkip) GTEST_SKIP() << "cannot mount a private /dev/shm (not root?)";
  EXPECT_NE(WEXITSTATUS(status), 21) << "a rank initialized despite a 64 KiB /dev/shm";
  EXPECT_NE(WEXITSTATUS(status), 22) << "no rank's error said that /dev/shm is too small";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
