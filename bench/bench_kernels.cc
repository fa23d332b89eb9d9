// Host reduction kernels in GB/s (bytes read + written: 3 x array size per call) for every dtype x
// op on 128 KiB arrays (cache-resident, the size of a pipelined chunk) and 64 MiB arrays (memory
// bound), next to memcpy on the same buffers (2 x array size per call). The kernels are those the
// dispatcher picks; BRAID_SIMD=avx2|scalar benchmarks a lower instruction set.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>

#include "kernels/host_reduce.h"

namespace braid::kernels {
namespace {

constexpr size_t kSizes[] = {128 << 10, 64 << 20};
constexpr braidRedOp_t kOps[] = {braidSum, braidProd, braidMax, braidMin, braidAvg};
constexpr const char* kOpNames[] = {"sum", "prod", "max", "min", "avg"};
constexpr braidDataType_t kTypes[] = {braidInt8,    braidUint8,   braidInt32,   braidUint32,
                                      braidInt64,   braidUint64,  braidFloat16, braidFloat32,
                                      braidFloat64, braidBfloat16};
constexpr const char* kTypeNames[] = {"int8",   "uint8",   "int32",   "uint32",  "int64",
                                      "uint64", "float16", "float32", "float64", "bfloat16"};
constexpr int kAvgDivisor = 8;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<char, FreeDeleter>;

// Three page-aligned arrays of one size, allocated and touched once, shared by all benchmarks.
struct Arrays {
  Buffer a, b, dst;
};

Arrays& arraysFor(size_t bytes) {
  static Arrays arrays[std::size(kSizes)];
  const size_t index = bytes == kSizes[0] ? 0 : 1;
  Arrays& set = arrays[index];
  if (!set.a) {
    for (Buffer* buffer : {&set.a, &set.b, &set.dst}) {
      buffer->reset(static_cast<char*>(std::aligned_alloc(4096, bytes)));
      std::memset(buffer->get(), 0, bytes);
    }
  }
  return set;
}

// Ones in the element type: ordinary numbers (no denormals or NaN) that stay finite.
void fillWithOnes(char* p, braidDataType_t type, size_t bytes) {
  const size_t size = typeSize(type);
  uint64_t one = 1;
  if (type == braidFloat16) one = 0x3c00;
  if (type == braidBfloat16) one = 0x3f80;
  if (type == braidFloat32) one = 0x3f800000;
  if (type == braidFloat64) one = 0x3ff0000000000000;
  for (size_t i = 0; i + size <= bytes; i += size) std::memcpy(p + i, &one, size);
}

void reduceBenchmark(benchmark::State& state, braidDataType_t type, braidRedOp_t op, size_t bytes) {
  Arrays& arrays = arraysFor(bytes);
  fillWithOnes(arrays.a.get(), type, bytes);
  fillWithOnes(arrays.b.get(), type, bytes);
  const ReduceFn fn = reduceFn(type, op);
  const size_t count = bytes / typeSize(type);
  const int divisor = op == braidAvg ? kAvgDivisor : 1;
  for (auto _ : state) {
    fn(arrays.dst.get(), nullptr, arrays.a.get(), arrays.b.get(), count, divisor);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 3 * bytes);
  state.SetLabel(isaName());
}

void memcpyBenchmark(benchmark::State& state, size_t bytes) {
  Arrays& arrays = arraysFor(bytes);
  for (auto _ : state) {
    std::memcpy(arrays.dst.get(), arrays.a.get(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * bytes);
}

std::string sizeName(size_t bytes) {
  return bytes >= (1 << 20) ? std::to_string(bytes >> 20) + "MiB"
                            : std::to_string(bytes >> 10) + "KiB";
}

void registerAll() {
  for (size_t bytes : kSizes) {
    benchmark::RegisterBenchmark(("memcpy/" + sizeName(bytes)).c_str(), memcpyBenchmark, bytes);
    for (size_t t = 0; t < std::size(kTypes); ++t) {
      for (size_t o = 0; o < std::size(kOps); ++o) {
        const std::string name =
            std::string("reduce/") + kTypeNames[t] + "/" + kOpNames[o] + "/" + sizeName(bytes);
        benchmark::RegisterBenchmark(name.c_str(), reduceBenchmark, kTypes[t], kOps[o], bytes);
      }
    }
  }
}

}  // namespace
}  // namespace braid::kernels

int main(int argc, char** argv) {
  braid::kernels::registerAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
