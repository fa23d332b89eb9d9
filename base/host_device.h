// BRAID_HD marks code that nvcc compiles for both host and device (the device form of the
// engine, the ring schedule); for other compilers it is nothing. BRAID_UNROLL asks nvcc to unroll
// the loop it precedes (a loop over a small array it must keep in registers).
#pragma once

#if defined(__CUDACC__)
#define BRAID_HD __host__ __device__
#else
#define BRAID_HD
#endif
#if defined(__CUDA_ARCH__)  // nvcc's device pass only: host compilers warn of the pragma
#define BRAID_UNROLL _Pragma("unroll")
#else
#define BRAID_UNROLL
#endif
