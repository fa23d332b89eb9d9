// BRAID_HD marks code that nvcc compiles for both host and device (the device form of the
// engine, the ring schedule); for other compilers it is nothing.
#pragma once

#if defined(__CUDACC__)
#define BRAID_HD __host__ __device__
#else
#define BRAID_HD
#endif
