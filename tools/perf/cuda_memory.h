// braid-perf on CUDA communicators (--device cuda): the rank's GPU, its buffers in device memory,
// copies to and from host mirrors (inputs are filled and outputs checked on the host), and the
// rank's CUDA stream. Where braid-perf was built without CUDA every call throws RunError.
#pragma once

#include <cstddef>

namespace braid_perf::cuda {

// Makes device localRank % (devices here) current on the calling thread: ranks as threads share
// the GPUs there are, one GPU when there is one. Does nothing where no device can be used.
void selectDevice(int localRank);
void* allocate(size_t bytes);
void release(void* p);
void upload(void* device, const void* host, size_t bytes);
void download(void* host, const void* device, size_t bytes);
void* createStream();  // a cudaStream_t
void destroyStream(void* stream);
void synchronize(void* stream);
int deviceCount();  // 0 where none can be used
// What a device-to-device cudaMemcpy of 256 MiB reaches on the current device, reads and writes
// counted (2 bytes per byte copied), in GB/s: the median of 5 after a warm-up.
double copyBandwidthGBs();

}  // namespace braid_perf::cuda
