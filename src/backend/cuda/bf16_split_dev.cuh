/*
 * bf16_split_dev.cuh — one fp32 value as two bf16 halves, x_hi = bf16(x) and
 * x_lo = bf16(x - x_hi), both rounded to nearest: the split activations of the
 * tensor-core products (16 mantissa bits of x from two bf16 mmas against exact bf16
 * weights).  One expression for every kernel that writes a split value one at a
 * time (the wgmma product's split pass, the norms that write their output's
 * planes, the wgmma experts' row store), so the planes they write are the same
 * bits; wstream.cuh's ws_split computes the same pairs two at a time.
 */
#ifndef DDT_CUDA_BF16_SPLIT_DEV_CUH
#define DDT_CUDA_BF16_SPLIT_DEV_CUH

#include <cuda_bf16.h>

static __device__ __forceinline__ void bf16_split(float v, __nv_bfloat16 &h, __nv_bfloat16 &l) {
    h = __float2bfloat16_rn(v);
    l = __float2bfloat16_rn(v - __bfloat162float(h)); /* the difference is exact */
}

#endif
