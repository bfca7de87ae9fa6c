/*
 * mla_rope_dev.cuh — MLA's RoPE on the device, one definition for every kernel
 * that applies it, so that they give the same bits: ddt_cuda_mla_rope_write (the
 * queries and the cache row in one launch), ddt_cuda_mla_norm_write (the cache
 * row after the latent norms) and the rope epilogues of ddt_cuda_matmul_rope and
 * of the wgmma product (ddt_cuda_next_planes.rope; the queries as q_b writes
 * them).  A rotation pair (x0, x1) at table entry (c, s) becomes (x0 c - x1 s,
 * x1 c + x0 s), built with --fmad=false: no contraction.
 */
#ifndef DDT_MLA_ROPE_DEV_CUH
#define DDT_MLA_ROPE_DEV_CUH

#include <cuda_bf16.h>
#include <math.h>

#include "backend/cuda/mla_cuda.h"

static __device__ __forceinline__ void mla_rope_rotate(float x0, float x1, float c, float s, float &r0, float &r1) {
    r0 = x0 * c - x1 * s;
    r1 = x1 * c + x0 * s;
}

/* Token i's position *len + depth[i] and cache row *len + i; false when the row
 * is outside the cache (nothing is written for it).  *bad: the position is
 * outside the table (its rotations are NaN). */
static __device__ __forceinline__ bool mla_rope_where(const int32_t *len, const int32_t *depth, int i, int max_pos,
                                                      int capacity, int *pos, int *row, bool *bad) {
    *pos = *len + depth[i];
    *row = *len + i;
    *bad = *pos < 0 || *pos >= max_pos || *row < 0 || *row >= capacity;
    return *row >= 0 && *row < capacity;
}

/* Cache row *len + i = [kvn[i], rope(k_rope[i])], by threads tid, tid + nt, ...
 * of the caller (its k half of ddt_cuda_mla_rope_write). */
static __device__ __forceinline__ void mla_rope_k_row(const ddt_cuda_mla_rope_args &a, int i, int tid, int nt) {
    const int half = a.rope / 2;
    int pos, row;
    bool bad;
    if (!mla_rope_where(a.len, a.depth, i, a.max_pos, a.capacity, &pos, &row, &bad)) return;
    const float *cs = a.cos_t + (int64_t)(bad ? 0 : pos) * half;
    const float *sn = a.sin_t + (int64_t)(bad ? 0 : pos) * half;
    const int64_t base = (int64_t)row * (a.rank + a.rope);
    float *dst = a.bf16_cache ? NULL : (float *)a.cache + base;
    __nv_bfloat16 *dst16 = a.bf16_cache ? (__nv_bfloat16 *)a.cache + base : NULL;
    for (int d = tid; d < a.rank; d += nt) {
        float v = bad ? NAN : a.kvn[(int64_t)i * a.rank + d];
        if (dst16) dst16[d] = __float2bfloat16(v);
        else dst[d] = v;
    }
    /* k_rope: one thread per rotation pair */
    const float *kr = a.kva + (int64_t)i * a.kva_ld + a.rank;
    for (int p = tid; p < half; p += nt) {
        float x0, x1;
        if (a.interleave) { x0 = kr[2 * p]; x1 = kr[2 * p + 1]; }
        else { x0 = kr[p]; x1 = kr[p + half]; }
        float r0, r1;
        mla_rope_rotate(x0, x1, cs[p], sn[p], r0, r1);
        if (bad) r0 = r1 = NAN;
        if (dst16) {
            dst16[a.rank + p] = __float2bfloat16(r0);
            dst16[a.rank + p + half] = __float2bfloat16(r1);
        } else {
            dst[a.rank + p] = r0;
            dst[a.rank + p + half] = r1;
        }
    }
}

#endif
