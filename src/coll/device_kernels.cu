// Every kernel of the device path: the ring (Simple, low-latency and segmented protocols), the tree
// all-reduce (Simple and low-latency) and the direct all-pairs algorithm, for every datatype x
// operator (PreMulSum as Sum over prescaled inputs), found by what they compute
// (coll/device_launch.h). The device_ptx ctest (tests/device/check_ptx.sh) builds this file for
// sm_90 plus PTX with warnings as errors and reads what nvcc made of it.
#include "coll/device_kernels.cuh"
#include "coll/device_launch.h"

namespace braid {
namespace {

template <braidDataType_t kType, braidRedOp_t kOp, bool kPrescaled>
const void* kernelOf(DeviceAlgorithm algorithm) {
  using R = kernels::ElementReduce<kType, kOp>;
  switch (algorithm) {
    case DeviceAlgorithm::Simple:
      return reinterpret_cast<const void*>(&ringKernel<R, kPrescaled, FifoViewPorts>);
    case DeviceAlgorithm::LowLatency:
      return reinterpret_cast<const void*>(&ringKernel<R, kPrescaled, LlPorts>);
    case DeviceAlgorithm::Segmented:
      return reinterpret_cast<const void*>(&ringKernel<R, kPrescaled, SegmentPorts>);
    case DeviceAlgorithm::Tree:
      return reinterpret_cast<const void*>(&treeKernel<R, kPrescaled, FifoViewPorts>);
    case DeviceAlgorithm::TreeLowLatency:
      return reinterpret_cast<const void*>(&treeKernel<R, kPrescaled, LlPorts>);
    default: return reinterpret_cast<const void*>(&directKernel<R, kPrescaled>);
  }
}

template <braidDataType_t kType>
const void* kernelOfType(DeviceAlgorithm algorithm, braidRedOp_t op, bool prescaled) {
  if (prescaled) return op == braidSum ? kernelOf<kType, braidSum, true>(algorithm) : nullptr;
  switch (op) {
    case braidSum: return kernelOf<kType, braidSum, false>(algorithm);
    case braidProd: return kernelOf<kType, braidProd, false>(algorithm);
    case braidMax: return kernelOf<kType, braidMax, false>(algorithm);
    case braidMin: return kernelOf<kType, braidMin, false>(algorithm);
    case braidAvg: return kernelOf<kType, braidAvg, false>(algorithm);
    default: return nullptr;
  }
}

}  // namespace

const void* deviceKernel(DeviceAlgorithm algorithm, braidDataType_t type, braidRedOp_t op,
                         bool prescaled) {
  switch (type) {
    case braidInt8: return kernelOfType<braidInt8>(algorithm, op, prescaled);
    case braidUint8: return kernelOfType<braidUint8>(algorithm, op, prescaled);
    case braidInt32: return kernelOfType<braidInt32>(algorithm, op, prescaled);
    case braidUint32: return kernelOfType<braidUint32>(algorithm, op, prescaled);
    case braidInt64: return kernelOfType<braidInt64>(algorithm, op, prescaled);
    case braidUint64: return kernelOfType<braidUint64>(algorithm, op, prescaled);
    case braidFloat16: return kernelOfType<braidFloat16>(algorithm, op, prescaled);
    case braidFloat32: return kernelOfType<braidFloat32>(algorithm, op, prescaled);
    case braidFloat64: return kernelOfType<braidFloat64>(algorithm, op, prescaled);
    case braidBfloat16: return kernelOfType<braidBfloat16>(algorithm, op, prescaled);
    case braidFloat8e4m3: return kernelOfType<braidFloat8e4m3>(algorithm, op, prescaled);
    case braidFloat8e5m2: return kernelOfType<braidFloat8e5m2>(algorithm, op, prescaled);
    default: return nullptr;
  }
}

}  // namespace braid
