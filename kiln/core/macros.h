#pragma once
// Portability macros shared by host-only and CUDA translation units.

// KILN_HD marks math that must compile for both the CPU and the CUDA backend
// (docs/kernels.md, "Pointwise: one functor, two launchers"). Under a host compiler it is empty.
#if defined(__CUDACC__)
#define KILN_HD __host__ __device__
#define KILN_INLINE __host__ __device__ __forceinline__
#else
#define KILN_HD
#define KILN_INLINE inline
#endif
