// Block-wise int8 quantization and the quantized all-gather and reduce-scatter
// (include/braid/dp_quantized.hpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "braid/dp_quantized.hpp"
#include "dp/error.h"

namespace braid::dp {
namespace {

constexpr double kLowest = -128;
constexpr double kHighest = 127;

// The seed's s and z for one block, or a NaN scale when the block is not finite.
QuantizationBlock blockParameters(const float* x, size_t n) {
  float low = x[0], high = x[0];
  bool nan = false;
  for (size_t i = 0; i < n; ++i) {
    low = std::min(low, x[i]);
    high = std::max(high, x[i]);
    nan |= x[i] != x[i];
  }
  if (nan || !std::isfinite(low) || !std::isfinite(high))
    return {std::numeric_limits<float>::quiet_NaN(), 0.0f};
  // A constant block: s = |x| and z = 0 put x on level +-1 exactly, subnormal or huge.
  if (high == low) return {low == 0 ? 1.0f : std::fabs(low), 0.0f};
  // The range in double: high - low can overflow fp32. A range of subnormals could round s to 0.
  const float s = std::max(static_cast<float>((static_cast<double>(high) - low) / 255),
                           std::numeric_limits<float>::denorm_min());
  return {s, static_cast<float>(kLowest - low / static_cast<double>(s))};
}

// Quantizes with the stored (fp32) s and z, in double, so that the only errors beyond half a step
// are the roundings of z and of the dequantized value (the header's bound).
void quantizeBlock(const float* x, size_t n, QuantizationBlock p, int8_t* q) {
  if (std::isnan(p.scale)) {
    std::fill(q, q + n, int8_t{0});
    return;
  }
  // Adding and subtracting 1.5 * 2^52 rounds a double below 2^51 to the nearest integer, ties to
  // even, as nearbyint does without its call (a third of the time of this loop).
  constexpr double kRound = 0x1.8p52;
  const double inverse = 1.0 / p.scale, zero = p.zeroPoint;
  for (size_t i = 0; i < n; ++i)
    q[i] =
        static_cast<int8_t>(std::clamp(x[i] * inverse + zero, kLowest, kHighest) + kRound - kRound);
}

// x' = s (q - z) for each element, handed to apply(i, x'); every rank computes it alike, so the
// all-gather's slices and the error feedback's residual are the bits the peers see.
template <typename Apply>
void dequantizeBlock(const int8_t* q, size_t n, QuantizationBlock p, Apply apply) {
  const double s = p.scale, offset = -s * p.zeroPoint;
  for (size_t i = 0; i < n; ++i) apply(i, static_cast<float>(s * q[i] + offset));
}

// Quantizes count elements of src; with feedback, adds it to the input first and leaves there
// what quantization dropped.
void quantize(const void* src, braidDataType_t type, size_t count, size_t blockSize,
              float* feedback, int8_t* dst, QuantizationBlock* blocks) {
  const size_t width = elementSize(type);
  std::vector<float> x(std::min(count, blockSize));
  for (size_t first = 0, b = 0; first < count; first += blockSize, ++b) {
    const size_t n = std::min(blockSize, count - first);
    convertToFloat(static_cast<const std::byte*>(src) + first * width, type, x.data(), n);
    if (feedback != nullptr)
      for (size_t i = 0; i < n; ++i) x[i] += feedback[first + i];
    blocks[b] = blockParameters(x.data(), n);
    quantizeBlock(x.data(), n, blocks[b], dst + first);
    // A block that is not finite comes back NaN (an overflow the loss scaler sees); its residual
    // would be NaN too and poison every later call, so it starts again from nothing (the skipped
    // step drops that gradient anyway).
    if (feedback != nullptr && std::isnan(blocks[b].scale))
      std::fill(feedback + first, feedback + first + n, 0.0f);
    else if (feedback != nullptr)
      dequantizeBlock(dst + first, n, blocks[b],
                      [&](size_t i, float value) { feedback[first + i] = x[i] - value; });
  }
}

// Dequantizes into dst, or adds into it (the reduce-scatter's sum over ranks).
template <bool kAdd>
void dequantize(const int8_t* src, const QuantizationBlock* blocks, size_t count, size_t blockSize,
                float* dst) {
  for (size_t first = 0, b = 0; first < count; first += blockSize, ++b)
    dequantizeBlock(src + first, std::min(blockSize, count - first), blocks[b],
                    [&](size_t i, float value) {
                      if constexpr (kAdd)
                        dst[first + i] += value;
                      else
                        dst[first + i] = value;
                    });
}

// One rank's message on the wire (quantizedBytes): its blocks' parameters, then the payload.
struct Message {
  size_t count, blockSize;

  size_t blocks() const { return quantizationBlocks(count, blockSize); }
  size_t bytes() const { return quantizedBytes(count, blockSize); }
  QuantizationBlock* parameters(std::byte* base, size_t index) const {
    return reinterpret_cast<QuantizationBlock*>(base + index * bytes());
  }
  int8_t* payload(std::byte* base, size_t index) const {
    return reinterpret_cast<int8_t*>(parameters(base, index) + blocks());
  }
};

// The collectives' staging: kept per thread and reused, since faulting in fresh pages for every
// call would cost about as much as quantizing them. Ranks as threads each get their own.
std::byte* workspace(size_t bytes) {
  thread_local std::vector<std::byte> buffer;
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

bool isQuantizable(braidDataType_t type) {
  return type == braidFloat32 || type == braidFloat16 || type == braidBfloat16;
}

void checkBlockArguments(const char* where, braidDataType_t type, size_t blockSize) {
  if (blockSize == 0)
    fail(braidInvalidArgument, "{}: blockSize is 0 (expected at least 1 element per block)", where);
  if (!isQuantizable(type))
    fail(braidInvalidArgument,
         "{}: type is braid data type {} (expected braidFloat32, braidFloat16 or braidBfloat16)",
         where, static_cast<int>(type));
}

// A collective's rank and rank count, and the sentences of its failures.
struct Caller {
  const char* name;
  braidComm_t comm;
  int rank = -1, nranks = 0;

  Caller(const char* name, braidComm_t comm) : name(name), comm(comm) {
    if (comm == nullptr)
      fail(braidInvalidArgument, "{}: comm is NULL (expected a communicator)", name);
    check(braidCommUserRank(comm, &rank), "braidCommUserRank");
    check(braidCommCount(comm, &nranks), "braidCommCount");
  }
  void check(braidResult_t result, const char* what) const {
    if (result != braidSuccess)
      fail(result, "{} on rank {}: {} failed: {}", name, rank, what, braidGetLastError(comm));
  }
  void require(bool ok, const char* argument, const char* expected) const {
    if (!ok)
      fail(braidInvalidArgument, "{} on rank {}: {} (expected {})", name, rank, argument, expected);
  }
  void checkArguments(const void* sendbuff, const void* recvbuff, size_t count,
                      braidDataType_t type, size_t blockSize, const char* countName) const {
    const std::string where = fmt::format("{} on rank {}", name, rank);
    checkBlockArguments(where.c_str(), type, blockSize);
    if (count % blockSize != 0)
      fail(braidInvalidArgument,
           "{}: {} is {} (expected a multiple of blockSize {}, so that no block straddles two "
           "ranks' slices)",
           where, countName, count, blockSize);
    require(count == 0 || sendbuff != nullptr, "sendbuff is NULL", "a buffer when count > 0");
    require(count == 0 || recvbuff != nullptr, "recvbuff is NULL", "a buffer when count > 0");
  }
};

}  // namespace

void quantizeInt8(const void* src, braidDataType_t type, size_t count, size_t blockSize,
                  int8_t* dst, QuantizationBlock* blocks) {
  checkBlockArguments("quantizeInt8", type, blockSize);
  if (count > 0 && (src == nullptr || dst == nullptr || blocks == nullptr))
    fail(braidInvalidArgument,
         "quantizeInt8: src, dst or blocks is NULL (expected three buffers when count > 0)");
  quantize(src, type, count, blockSize, nullptr, dst, blocks);
}

void dequantizeInt8(const int8_t* src, const QuantizationBlock* blocks, size_t count,
                    size_t blockSize, float* dst) {
  checkBlockArguments("dequantizeInt8", braidFloat32, blockSize);
  if (count > 0 && (src == nullptr || blocks == nullptr || dst == nullptr))
    fail(braidInvalidArgument,
         "dequantizeInt8: src, blocks or dst is NULL (expected three buffers when count > 0)");
  dequantize<false>(src, blocks, count, blockSize, dst);
}

void quantizedAllGather(const void* sendbuff, float* recvbuff, size_t sendcount,
                        braidDataType_t type, braidComm_t comm, size_t blockSize) {
  const Caller caller("quantizedAllGather", comm);
  caller.checkArguments(sendbuff, recvbuff, sendcount, type, blockSize, "sendcount");
  if (sendcount == 0) return;
  const Message message{sendcount, blockSize};
  // Staged apart from the gathered messages; sendbuff is read before recvbuff is written, so an
  // in-place call works.
  std::byte* gathered = workspace((caller.nranks + 1) * message.bytes());
  std::byte* own = gathered + caller.nranks * message.bytes();
  quantize(sendbuff, type, sendcount, blockSize, nullptr, message.payload(own, 0),
           message.parameters(own, 0));
  caller.check(braidAllGather(own, gathered, message.bytes(), braidUint8, comm, nullptr),
               "braidAllGather");
  for (int r = 0; r < caller.nranks; ++r)
    dequantize<false>(message.payload(gathered, r), message.parameters(gathered, r), sendcount,
                      blockSize, recvbuff + r * sendcount);
}

void quantizedReduceScatter(const void* sendbuff, float* recvbuff, size_t recvcount,
                            braidDataType_t type, braidRedOp_t op, braidComm_t comm,
                            float* errorFeedback, size_t blockSize) {
  const Caller caller("quantizedReduceScatter", comm);
  caller.checkArguments(sendbuff, recvbuff, recvcount, type, blockSize, "recvcount");
  caller.require(op == braidSum || op == braidAvg, "op is not braidSum or braidAvg",
                 "a sum or an average: the owner adds dequantized fp32 values");
  if (recvcount == 0) return;
  const Message message{recvcount, blockSize};
  std::byte* outgoing = workspace(2 * caller.nranks * message.bytes());
  std::byte* incoming = outgoing + caller.nranks * message.bytes();
  const size_t width = elementSize(type);
  for (int r = 0; r < caller.nranks; ++r)
    quantize(static_cast<const std::byte*>(sendbuff) + r * recvcount * width, type, recvcount,
             blockSize, errorFeedback != nullptr ? errorFeedback + r * recvcount : nullptr,
             message.payload(outgoing, r), message.parameters(outgoing, r));
  caller.check(braidAlltoAll(outgoing, incoming, message.bytes(), braidUint8, comm, nullptr),
               "braidAlltoAll");
  for (int r = 0; r < caller.nranks; ++r) {
    const int8_t* payload = message.payload(incoming, r);
    const QuantizationBlock* parameters = message.parameters(incoming, r);
    if (r == 0)
      dequantize<false>(payload, parameters, recvcount, blockSize, recvbuff);
    else
      dequantize<true>(payload, parameters, recvcount, blockSize, recvbuff);
  }
  if (op == braidAvg)
    for (size_t i = 0; i < recvcount; ++i) recvbuff[i] /= static_cast<float>(caller.nranks);
}

}  // namespace braid::dp
