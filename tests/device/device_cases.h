// The device form's cases, shared by the CPU harness (test_device_form.cc: the engines on CPU
// threads) and the GPU run of the kernels (tests/gpu/test_gpu_kernels.cc): the shapes, the cases
// of a shape, one rank's buffers laid out as nccl.h puts them (in place or not) with inputs from
// the multirank grid's generators and the output poisoned, and the check of every element
// against the grid's independent reference (multirank/grid_common.h).
#pragma once

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "coll/call.h"
#include "coll/schedule.h"
#include "kernels/element_reduce.h"
#include "multirank/grid_common.h"

namespace braid_test {

using braid::Collective;
using braid::reduces;

enum class Algorithm { Simple, LowLatency, Segmented, Direct };

struct Shape {
  int ranks, channels, threads, slots;
  Algorithm algorithm;
  // Every ring hop through the network proxy (transport/net/proxy.h) over loopback TCP, as a hop
  // between ranks on different hosts runs: the sender's FIFO drained into a socket by its proxy,
  // the receiver's filled by its own.
  bool network = false;
};

inline std::string shapeName(const Shape& s) {
  const char* algorithm = s.algorithm == Algorithm::Simple       ? "simple_"
                          : s.algorithm == Algorithm::LowLatency ? "ll_"
                          : s.algorithm == Algorithm::Segmented  ? "seg_"
                                                                 : "direct_";
  return (s.network ? std::string("net_") : std::string()) + algorithm + std::to_string(s.ranks) +
         "ranks_" + std::to_string(s.channels) + "ch_" + std::to_string(s.threads) + "threads_" +
         std::to_string(s.slots) + "slots";
}

constexpr size_t kSlotBytes = 256;  // small, so that 1031 elements take many chunks
// The segmented protocol's segments: 3 packs, so that a slot holds 4 (and 64 bytes are left) and
// a warp's lanes get different numbers of packs.
constexpr size_t kSegmentBytes = 48;

struct Case {
  Collective collective;
  braidDataType_t type;
  braidRedOp_t op;
  size_t count;
  int root;
  uint64_t salt;
  bool inPlace = false;
};

inline const char* collectiveName(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "allreduce";
    case Collective::ReduceScatter: return "reducescatter";
    case Collective::AllGather: return "allgather";
    case Collective::Broadcast: return "broadcast";
    case Collective::Reduce: return "reduce";
    case Collective::Send: return "send/recv";
    default: return "?";
  }
}

inline std::string describe(const Case& c, const Shape& s) {
  return std::string(collectiveName(c.collective)) + " " + dtypeName(c.type) + " " +
         (reduces(c.collective) ? opName(c.op) : "") + " count=" + std::to_string(c.count) +
         " root=" + std::to_string(c.root) + (c.inPlace ? " in place " : " ") + shapeName(s);
}

// Calls f(R{}, prescaled) with the element reduction of (type, op): PreMulSum's is Sum, with
// prescaled a std::true_type.
template <typename F>
void withReduction(braidDataType_t type, braidRedOp_t op, F&& f) {
  auto withType = [&](auto typeConstant) {
    constexpr braidDataType_t kType = decltype(typeConstant)::value;
    visitOp(op, [&](auto opConstant) {
      constexpr braidRedOp_t kOp = decltype(opConstant)::value;
      if constexpr (kOp == kPreMulSum)
        f(braid::kernels::ElementReduce<kType, braidSum>{}, std::true_type{});
      else
        f(braid::kernels::ElementReduce<kType, kOp>{}, std::false_type{});
    });
  };
  switch (type) {
#define BRAID_TYPE_CASE(t) \
  case t: return withType(std::integral_constant<braidDataType_t, t>{});
    BRAID_TYPE_CASE(braidInt8)
    BRAID_TYPE_CASE(braidUint8)
    BRAID_TYPE_CASE(braidInt32)
    BRAID_TYPE_CASE(braidUint32)
    BRAID_TYPE_CASE(braidInt64)
    BRAID_TYPE_CASE(braidUint64)
    BRAID_TYPE_CASE(braidFloat16)
    BRAID_TYPE_CASE(braidFloat32)
    BRAID_TYPE_CASE(braidFloat64)
    BRAID_TYPE_CASE(braidBfloat16)
    BRAID_TYPE_CASE(braidFloat8e4m3)
    BRAID_TYPE_CASE(braidFloat8e5m2)
#undef BRAID_TYPE_CASE
    default: break;
  }
}

// One rank's buffers for a case: 64-byte aligned plus a shift of 0 or 1 element (salt), so the
// engine meets both its 16-byte path and its element path. In place, input and output share
// storage as nccl.h lays them out.
struct RankBuffers {
  std::vector<unsigned char> inputStorage, outputStorage;
  unsigned char* input = nullptr;
  unsigned char* output = nullptr;
  size_t inputElems = 0, outputElems = 0;
};

inline unsigned char* alignedIn(std::vector<unsigned char>& storage, size_t bytes, size_t shift) {
  storage.assign(bytes + 128, 0xa5);
  auto base = (reinterpret_cast<uintptr_t>(storage.data()) + 63) / 64 * 64;
  return reinterpret_cast<unsigned char*>(base) + shift;
}

// Every collective of the algorithm x dtype x op (reducing) at every count, roots 0 and R-1 for
// broadcast and reduce, in place at one count; sends and receives where channels pair up.
inline std::vector<Case> casesFor(const Shape& shape) {
  std::vector<Case> cases;
  const size_t beyondFifo = 3 * kSlotBytes * shape.slots + 5;  // elements: bytes of int8 and more
  std::vector<Collective> collectives = {Collective::AllReduce, Collective::ReduceScatter,
                                         Collective::AllGather};
  if (shape.algorithm != Algorithm::Direct) {
    collectives.push_back(Collective::Broadcast);
    collectives.push_back(Collective::Reduce);
    if (shape.channels % 2 == 0 && shape.ranks > 1) collectives.push_back(Collective::Send);
  }
  for (Collective collective : collectives)
    for (braidDataType_t type : kAllDtypes)
      for (braidRedOp_t op : kAllOps) {
        if (!reduces(collective) && op != braidSum) continue;
        for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1031}, beyondFifo}) {
          std::vector<int> roots = {0};
          if ((collective == Collective::Broadcast || collective == Collective::Reduce) &&
              shape.ranks > 1)
            roots.push_back(shape.ranks - 1);
          for (int root : roots) {
            cases.push_back({collective, type, op, count, root, mixBits(7, 0, cases.size())});
            if (count == 1031 && collective != Collective::Send)
              cases.push_back(
                  {collective, type, op, count, root, mixBits(7, 0, cases.size()), true});
          }
        }
      }
  return cases;
}

// Rank `rank`'s PreMulSum scalar of case c (premulScalar), in the bits of storage type T (an
// engine's R::Storage, which holds the element type's bits).
template <class T>
T premulScalarBits(const Case& c, int rank) {
  T scale{};
  visitDtype(c.type, [&](auto element) {
    const auto value = premulScalar<decltype(element)>(rank, c.salt);
    // Every pairing of types compiles; only the grid's own (same size) runs.
    if constexpr (sizeof value == sizeof scale) std::memcpy(&scale, &value, sizeof scale);
  });
  return scale;
}

inline InputKind kindOf(const Case& c) {
  return reduces(c.collective) ? inputKindFor(c.op) : InputKind::Data;
}

// Rank `rank`'s buffers for case c among n ranks: the layout (in place as nccl.h has it: a
// reduce-scatter's output inside its input, an all-gather's input inside its output, else the
// same buffer), inputs from the grid's generators, the rest poisoned.
inline void layoutRank(const Case& c, int rank, int n, RankBuffers& b) {
  const size_t size = dtypeSize(c.type);
  const size_t shift = c.salt % 2 * size;
  b.inputElems = c.collective == Collective::ReduceScatter ? c.count * n : c.count;
  b.outputElems = c.collective == Collective::AllGather ? c.count * n : c.count;
  b.inputStorage.clear();
  b.outputStorage.clear();
  if (!c.inPlace) {
    b.input = alignedIn(b.inputStorage, b.inputElems * size, shift);
    b.output = alignedIn(b.outputStorage, b.outputElems * size, shift);
  } else if (c.collective == Collective::ReduceScatter) {
    b.input = alignedIn(b.inputStorage, b.inputElems * size, shift);
    b.output = b.input + rank * c.count * size;
  } else {
    b.output = alignedIn(b.outputStorage, b.outputElems * size, shift);
    b.input = c.collective == Collective::AllGather ? b.output + rank * c.count * size : b.output;
  }
  visitDtype(c.type, [&](auto element) {
    using T = decltype(element);
    visitKind(kindOf(c), [&](auto k) {
      for (size_t i = 0; i < b.inputElems; ++i) {
        const T v = inputValue<T, k()>(c.salt, rank, i);
        std::memcpy(b.input + i * size, &v, size);
      }
    });
  });
}

// How a case's braidAvg of floats is checked: as the engines run it, the sum divided once (bit for
// bit), or as the API runs it, NCCL's way (acceptsApiAverage).
enum class AverageAs { Engine, Api };

// Every output element of rank `rank` against the reference, and (out of place) its input
// unchanged: "" when all hold, else how many were wrong and the first.
inline std::string checkRank(const Case& c, int rank, int n, const RankBuffers& b,
                             AverageAs average = AverageAs::Engine) {
  size_t wrong = 0;
  std::string first;
  visitDtype(c.type, [&](auto element) {
    using T = decltype(element);
    const T poison = bitsAs<T>(0xa5a5a5a5a5a5a5a5ULL);
    const bool reducedHere =
        reduces(c.collective) && (c.collective != Collective::Reduce || rank == c.root);
    auto acceptsAverage = [&](size_t i, const T& got) {
      if constexpr (kIsFloat<T>) {
        const size_t index = c.collective == Collective::ReduceScatter ? rank * c.count + i : i;
        return average == AverageAs::Api && c.op == braidAvg && reducedHere &&
               acceptsApiAverage(got, c.salt, n, index);
      }
      return false;
    };
    auto expected = [&](size_t i) -> T {
      switch (c.collective) {
        case Collective::Send:  // what the previous rank sent
          return inputValue<T, InputKind::Data>(c.salt, (rank + n - 1) % n, i);
        case Collective::AllGather:
          return inputValue<T, InputKind::Data>(c.salt, static_cast<int>(i / c.count), i % c.count);
        case Collective::Broadcast: return inputValue<T, InputKind::Data>(c.salt, c.root, i);
        case Collective::Reduce:
          if (rank != c.root) {  // not written: in place, the input is still there
            T v = poison;
            if (c.inPlace)
              visitKind(kindOf(c), [&](auto k) { v = inputValue<T, k()>(c.salt, rank, i); });
            return v;
          }
          [[fallthrough]];
        default: {
          const size_t index = c.collective == Collective::ReduceScatter ? rank * c.count + i : i;
          T v{};
          visitOp(c.op, [&](auto op) { v = referenceReduce<T, op()>(c.salt, n, index); });
          return v;
        }
      }
    };
    for (size_t i = 0; i < b.outputElems; ++i) {
      T got;
      std::memcpy(&got, b.output + i * sizeof(T), sizeof(T));
      const T want = expected(i);
      if (sameBits(got, want) || acceptsAverage(i, got)) continue;
      if (wrong++ == 0)
        first = "element " + std::to_string(i) + " is " + formatElement(got) + ", expected " +
                formatElement(want);
    }
    if (c.inPlace) return;
    visitKind(kindOf(c), [&](auto k) {
      for (size_t i = 0; i < b.inputElems; ++i) {
        T got;
        std::memcpy(&got, b.input + i * sizeof(T), sizeof(T));
        if (!sameBits(got, inputValue<T, k()>(c.salt, rank, i)) && wrong++ == 0)
          first = "input element " + std::to_string(i) + " was changed";
      }
    });
  });
  if (wrong == 0) return "";
  return "rank " + std::to_string(rank) + ": " + std::to_string(wrong) + " of " +
         std::to_string(b.outputElems) + " elements wrong, first " + first;
}

}  // namespace braid_test
