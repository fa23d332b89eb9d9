// The arithmetic of a step on host memory: conversion, pre-division, the overflow/norm
// inspection, shard accumulation and the optimizer update, for fp32, fp16 and bf16 elements.
// Built per instruction set (kernels_impl.h) and chosen once at run time.
#pragma once

#include <cstddef>

#include "braid/dp.hpp"

namespace braid::dp::kernels {

// data[i] *= factor.
void scale(void* data, braidDataType_t type, size_t count, float factor);

// dst[i] += src[i].
void add(void* dst, const void* src, braidDataType_t type, size_t count);

struct Inspection {
  bool nonFinite = false;
  double sumSquares = 0;  // of the values as stored (still loss-scaled)
};
Inspection inspect(const void* data, braidDataType_t type, size_t count);

// One optimizer step on `count` elements: the gradient is grad[i] * gradFactor (unscale and clip
// folded into one factor); master weights and moments are fp32. `working` receives the updated
// parameters in `parameterType` unless it is `master` itself (fp32 precision keeps no separate
// master).
struct UpdateArgs {
  const OptimizerOptions& optimizer;
  int step;  // 1 for the first applied step
  float gradFactor;
  braidDataType_t gradientType;
  braidDataType_t parameterType;
};
void update(const UpdateArgs& args, const void* grad, float* master, float* moment1, float* moment2,
            void* working, size_t count);

// Throws braidInvalidArgument: `type` is not one a gradient can have.
[[noreturn]] void failUnsupportedType(braidDataType_t type);

// One implementation of every kernel, for one instruction set.
struct KernelTable {
  void (*toFloat)(const void* src, braidDataType_t type, float* dst, size_t count);
  void (*fromFloat)(const float* src, void* dst, braidDataType_t type, size_t count);
  void (*accumulate)(const float* src, void* dst, braidDataType_t type, size_t count);
  void (*scale)(void* data, braidDataType_t type, size_t count, float factor);
  void (*add)(void* dst, const void* src, braidDataType_t type, size_t count);
  Inspection (*inspect)(const void* data, braidDataType_t type, size_t count);
  void (*update)(const UpdateArgs& args, const void* grad, float* master, float* moment1,
                 float* moment2, void* working, size_t count);
};
namespace generic {
const KernelTable& table();
}
namespace avx2 {
const KernelTable& table();  // AVX2 + F16C
}

}  // namespace braid::dp::kernels
