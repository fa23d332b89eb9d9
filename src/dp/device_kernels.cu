// The data-parallel step's kernels (device_kernels.cuh's loops with a thread block as B) and
// their launches (device_kernels.h). Built for sm_90 plus PTX with warnings as errors and
// -fmad=false (src/dp/CMakeLists.txt): a fused multiply-add rounds once where the CPU kernels
// round twice, so without it the GPU's parameters would drift from the CPU's.
#include <cuda_runtime.h>

#include <algorithm>

#include "dp/device_kernels.cuh"

namespace braid::dp::device {
namespace {

constexpr unsigned kThreads = 256;
// Enough blocks to fill any GPU several times over; beyond that, threads loop (grid-stride).
constexpr size_t kMaxBlocks = 4096;

struct CudaBlock {
  __device__ unsigned thread() const { return threadIdx.x; }
  __device__ unsigned threads() const { return blockDim.x; }
  __device__ unsigned block() const { return blockIdx.x; }
  __device__ unsigned blocks() const { return gridDim.x; }
  __device__ void sync() const { __syncthreads(); }
};

template <class E>
__global__ void toFloatKernel(const typename E::Storage* src, float* dst, size_t count) {
  toFloatThread<E>(CudaBlock{}, src, dst, count);
}
template <class E>
__global__ void fromFloatKernel(const float* src, typename E::Storage* dst, size_t count) {
  fromFloatThread<E>(CudaBlock{}, src, dst, count);
}
template <class E>
__global__ void accumulateKernel(const float* src, typename E::Storage* dst, size_t count) {
  accumulateThread<E>(CudaBlock{}, src, dst, count);
}
template <class E>
__global__ void scaleKernel(typename E::Storage* data, size_t count, float factor) {
  scaleThread<E>(CudaBlock{}, data, count, factor);
}
template <class E>
__global__ void addKernel(typename E::Storage* dst, const typename E::Storage* src, size_t count) {
  addThread<E>(CudaBlock{}, dst, src, count);
}
template <class E>
__global__ void __launch_bounds__(kThreads)
    inspectKernel(const typename E::Storage* data, size_t count, Verdict* verdict) {
  __shared__ double blockSums[kThreads];
  CudaBlock block;
  inspectThread<E>(block, data, count, blockSums, verdict);
}
template <class G, class W>
__global__ void updateKernel(UpdateLaunch<G, W> update) {
  updateThread(CudaBlock{}, update);
}

unsigned blocksFor(size_t count) {
  return static_cast<unsigned>(
      std::clamp<size_t>((count + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

// Queues kernel<<<blocks, kThreads>>>(args...) on the stream; returns the launch's error.
template <typename... Params, typename... Args>
int launch(void (*kernel)(Params...), size_t count, void* stream, Args... args) {
  if (count == 0) return cudaSuccess;
  kernel<<<blocksFor(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args...);
  return cudaGetLastError();
}

template <class E>
using Ptr = typename E::Storage*;
template <class E>
using ConstPtr = const typename E::Storage*;

}  // namespace

int launchToFloat(const void* src, braidDataType_t type, float* dst, size_t count, void* stream) {
  return withElement(type, [&]<class E>(E) {
    return launch(toFloatKernel<E>, count, stream, static_cast<ConstPtr<E>>(src), dst, count);
  });
}

int launchFromFloat(const float* src, void* dst, braidDataType_t type, size_t count, void* stream) {
  return withElement(type, [&]<class E>(E) {
    return launch(fromFloatKernel<E>, count, stream, src, static_cast<Ptr<E>>(dst), count);
  });
}

int launchAccumulate(const float* src, void* dst, braidDataType_t type, size_t count,
                     void* stream) {
  return withElement(type, [&]<class E>(E) {
    return launch(accumulateKernel<E>, count, stream, src, static_cast<Ptr<E>>(dst), count);
  });
}

int launchScale(void* data, braidDataType_t type, size_t count, float factor, void* stream) {
  return withElement(type, [&]<class E>(E) {
    return launch(scaleKernel<E>, count, stream, static_cast<Ptr<E>>(data), count, factor);
  });
}

int launchAdd(void* dst, const void* src, braidDataType_t type, size_t count, void* stream) {
  return withElement(type, [&]<class E>(E) {
    return launch(addKernel<E>, count, stream, static_cast<Ptr<E>>(dst),
                  static_cast<ConstPtr<E>>(src), count);
  });
}

int launchInspect(const void* data, braidDataType_t type, size_t count, Verdict* verdict,
                  void* stream) {
  return withElement(type, [&]<class E>(E) {
    return launch(inspectKernel<E>, count, stream, static_cast<ConstPtr<E>>(data), count, verdict);
  });
}

int launchUpdate(const kernels::UpdateArgs& args, const void* grad, float* master, float* moment1,
                 float* moment2, void* working, size_t count, void* stream) {
  return prepareUpdate(args, grad, master, moment1, moment2, working, count,
                       [&]<class G, class W>(const UpdateLaunch<G, W>& update) {
                         return launch(updateKernel<G, W>, count, stream, update);
                       });
}

int loadKernels() {
  const braidDataType_t types[] = {braidFloat32, braidFloat16, braidBfloat16};
  cudaFuncAttributes attributes{};
  auto load = [&](auto kernel) {
    return cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel));
  };
  for (braidDataType_t type : types) {
    const cudaError_t e = withElement(type, [&]<class E>(E) {
      for (cudaError_t each :
           {load(toFloatKernel<E>), load(fromFloatKernel<E>), load(accumulateKernel<E>),
            load(scaleKernel<E>), load(addKernel<E>), load(inspectKernel<E>)})
        if (each != cudaSuccess) return each;
      for (braidDataType_t working : types) {
        const cudaError_t update =
            withElement(working, [&]<class W>(W) { return load(updateKernel<E, W>); });
        if (update != cudaSuccess) return update;
      }
      return cudaSuccess;
    });
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace braid::dp::device
