// Quantized collectives in the style of ZeRO++ (qwZ and qgZ): block-wise int8 quantization with a
// scale and a zero point per block, an all-gather that moves int8 weights, and a reduce-scatter
// that moves int8 gradients in one all-to-all and reduces them in fp32 at each owner, so that the
// error does not compound hop by hop as it would in a ring. Built on braid.h only; docs/dp.md
// ("Quantized collectives") gives the error bound and the measured figures.
//
// Per block of B elements with minimum m and maximum M (the seed's formula, int8 ends -128, 127):
//   s = (M - m) / 255,  z = -128 - m / s,  q = clip(round(x / s + z), -128, 127),  x' = s (q - z)
// A constant block (M == m) stores s = |m| (1 when m == 0) and z = 0, and comes back exactly.
// s and z are stored as fp32 and the arithmetic runs in double, so for every element of a finite
// block
//   |x - x'| <= s / 2 + 2^-22 (max |x| + 128 s) + 2^-140
// (half a step, plus the fp32 roundings of s, z and x'; the last term counts where s or x' are
// fp32 subnormals). A block holding inf or NaN gets a NaN scale: it dequantizes to NaN, so a loss
// scaler downstream still sees the overflow.
#pragma once

#include <cstddef>
#include <cstdint>

#include "braid/braid.h"
#include "braid/dp.hpp"

namespace braid::dp {

// 256 elements: 8 bytes of scale and zero point per 256 bytes of payload (3 % more wire bytes).
// ZeRO++ uses larger blocks (2048) for less metadata at a larger step on uneven data.
inline constexpr size_t kQuantizationBlock = 256;

struct QuantizationBlock {
  float scale;
  float zeroPoint;
};

// Blocks for count elements: the last one may be short.
constexpr size_t quantizationBlocks(size_t count, size_t blockSize) {
  return (count + blockSize - 1) / blockSize;
}

// Bytes one rank's count elements take on the wire: each block's scale and zero point, then the
// int8 payload rounded up to 8 bytes, so that the next rank's scales stay aligned in a gathered
// buffer (no padding when count is a multiple of 8).
constexpr size_t quantizedBytes(size_t count, size_t blockSize) {
  return quantizationBlocks(count, blockSize) * sizeof(QuantizationBlock) + (count + 7) / 8 * 8;
}

// src: count elements of `type` (braidFloat32, braidFloat16 or braidBfloat16); dst: count int8
// values; blocks: quantizationBlocks(count, blockSize) entries. Throws braid::dp::Error
// (braidInvalidArgument) for a bad argument.
void quantizeInt8(const void* src, braidDataType_t type, size_t count, size_t blockSize,
                  int8_t* dst, QuantizationBlock* blocks);
void dequantizeInt8(const int8_t* src, const QuantizationBlock* blocks, size_t count,
                    size_t blockSize, float* dst);

// Collectives on a CPU communicator, host memory, complete when they return (the quantization is
// host work: there is no stream to queue it on). Every rank passes the same counts and blockSize;
// the per-rank count must be a multiple of blockSize, so that no block straddles two ranks' slices
// (pad as DataParallel pads its buckets). Failures throw braid::dp::Error naming the rank.

// Each rank's sendcount elements of `type` are quantized, all-gathered with their blocks' scales
// and zero points, and dequantized: recvbuff (nranks * sendcount fp32) is the same on every rank,
// slice r equal to dequantizeInt8(quantizeInt8(rank r's sendbuff)). In place when sendbuff is
// recvbuff + rank * sendcount (fp32).
void quantizedAllGather(const void* sendbuff, float* recvbuff, size_t sendcount,
                        braidDataType_t type, braidComm_t comm,
                        size_t blockSize = kQuantizationBlock);

// sendbuff holds nranks * recvcount elements of `type`; slice j is quantized and sent to rank j
// (one braidAlltoAll), which dequantizes the nranks slices it receives and adds them in fp32, in
// rank order (so op braidAvg divides the sum by nranks at the end). op: braidSum or braidAvg.
// errorFeedback (nranks * recvcount fp32, zero before the first call, or nullptr for none): it is
// added to this call's input before quantization and receives what quantization dropped,
// input - dequantize(quantize(input)), so over many calls the outputs' sum follows the inputs'
// sum within one quantization step instead of drifting by one step per call.
void quantizedReduceScatter(const void* sendbuff, float* recvbuff, size_t recvcount,
                            braidDataType_t type, braidRedOp_t op, braidComm_t comm,
                            float* errorFeedback = nullptr, size_t blockSize = kQuantizationBlock);

}  // namespace braid::dp
