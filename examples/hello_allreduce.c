/* The smallest braid program: four ranks as threads of this process, one all-reduce. */
#include <braid/braid.h>
#include <stdio.h>
#include <stdlib.h>

#define NRANKS 4
#define COUNT 8

#define CHECK(call)                                                                       \
  do {                                                                                    \
    braidResult_t r_ = (call);                                                            \
    if (r_ != braidSuccess) {                                                             \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, braidGetErrorString(r_),             \
              braidGetLastError(NULL));                                                   \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

int main(void) {
  braidComm_t comms[NRANKS];
  float data[NRANKS][COUNT];
  CHECK(braidCommInitAll(comms, NRANKS, NULL));
  for (int r = 0; r < NRANKS; ++r)
    for (int i = 0; i < COUNT; ++i) data[r][i] = (float)(r + i);
  /* One thread drives every rank, so the calls are grouped. */
  CHECK(braidGroupStart());
  for (int r = 0; r < NRANKS; ++r)
    CHECK(braidAllReduce(data[r], data[r], COUNT, braidFloat32, braidSum, comms[r], NULL));
  CHECK(braidGroupEnd());
  int wrong = 0;
  for (int r = 0; r < NRANKS; ++r)
    for (int i = 0; i < COUNT; ++i) wrong += data[r][i] != (float)(6 + NRANKS * i);
  printf("all-reduce over %d ranks: [%g %g ... %g] %s\n", NRANKS, data[0][0], data[0][1],
         data[0][COUNT - 1], wrong ? "WRONG" : "correct");
  for (int r = 0; r < NRANKS; ++r) CHECK(braidCommDestroy(comms[r]));
  return wrong ? 1 : 0;
}
