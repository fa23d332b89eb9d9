/* One rank of a braid job started by a launcher's environment (RANK, WORLD_SIZE, BRAID_COMM_ID):
 * counts the sockets this process holds after communicator init and after one all-reduce, and
 * prints "rank R: S sockets at init, T after an all-reduce". bench/net/count_sockets.sh runs it
 * with 16 ranks on 4 namespace hosts: how a rank's connections grow with the job (issue 18:
 * neighbours versus all pairs). */
#include <braid/braid.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int countSockets(void) {
  DIR* fds = opendir("/proc/self/fd");
  if (fds == NULL) return -1;
  int sockets = 0;
  for (struct dirent* entry; (entry = readdir(fds)) != NULL;) {
    char path[300], target[64];
    snprintf(path, sizeof path, "/proc/self/fd/%s", entry->d_name);
    const ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    if (strncmp(target, "socket:", 7) == 0) ++sockets;
  }
  closedir(fds);
  return sockets;
}

static void check(braidResult_t result, braidComm_t comm, const char* what) {
  if (result == braidSuccess) return;
  fprintf(stderr, "count_sockets: %s: %s: %s\n", what, braidGetErrorString(result),
          braidGetLastError(comm));
  exit(1);
}

int main(void) {
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.device = "cpu";
  braidComm_t comm = NULL;
  check(braidCommInitFromEnv(&comm, &config), NULL, "braidCommInitFromEnv");
  int rank = 0;
  check(braidCommUserRank(comm, &rank), comm, "braidCommUserRank");
  const int atInit = countSockets();
  /* 4 MiB: past the one-shot exchange of small all-reduces (every pair), so the ring runs. */
  const size_t count = (size_t)1 << 20;
  float* data = malloc(count * sizeof(float));
  if (data == NULL) return 1;
  for (size_t i = 0; i < count; ++i) data[i] = (float)rank;
  check(braidAllReduce(data, data, count, braidFloat32, braidSum, comm, NULL), comm,
        "braidAllReduce");
  const int afterAllReduce = countSockets();
  /* No rank destroys its communicator (closing its connections) before every rank has counted; a
     second ring all-reduce waits for that without joining other pairs, as a small one would. */
  check(braidAllReduce(data, data, count, braidFloat32, braidSum, comm, NULL), comm,
        "braidAllReduce");
  printf("rank %d: %d sockets at init, %d after an all-reduce\n", rank, atInit, afterAllReduce);
  check(braidCommDestroy(comm), NULL, "braidCommDestroy");
  free(data);
  return 0;
}
