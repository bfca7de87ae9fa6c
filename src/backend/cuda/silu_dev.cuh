/*
 * silu_dev.cuh — the SiLU-gated product of a gated MLP, silu(g) * u, as one
 * device function: nn_cuda.cu's ddt_cuda_silu_mul stores it, and the gated
 * activation load of the x W^T kernel (qmatmul_dev.cuh, ddt_cuda_matmul_silu)
 * computes it on the fly.  One expression in one place, so the fused product
 * sees exactly the floats the two launches it replaces would have stored and
 * read back (issue 13).  The build passes --fmad=false, so nothing is
 * contracted; the division is IEEE (no fast-math); expf is the same library
 * code in both callers.  The CPU twin (backend/cpu/nn.c) writes the same
 * expression; its expf may differ in the last bit.
 */
#ifndef DDT_CUDA_SILU_DEV_CUH
#define DDT_CUDA_SILU_DEV_CUH

#include <cuda_runtime.h>
#include <math.h>

static __device__ __forceinline__ float silu_mul1(float g, float u) { return g / (1.0f + expf(-g)) * u; }

#endif
