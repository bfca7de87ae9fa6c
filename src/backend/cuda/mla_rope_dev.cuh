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

/* Token i's cache row, in two steps so that a caller can issue the loads of the
 * first with other work (norm_write: with the latent norm's, whose output the
 * second reads): mla_k_row_load finds the row and loads the thread's rotation pair p
 * (p < rope / 2; none past it) with its table entries; mla_k_row_store writes the
 * row = [kvn[i], rope(k_rope[i])], the latents by threads tid, tid + nt, ... and
 * pair tid rotated by thread tid (the launchers check rope / 2 <= nt). */
struct MlaKRow {
    bool live, bad;
    int row;
    float x0, x1, c, s; /* pair p and its table entries */
};

static __device__ __forceinline__ MlaKRow mla_k_row_load(const ddt_cuda_mla_rope_args &a, int i, int p) {
    MlaKRow k;
    int pos;
    const int half = a.rope / 2;
    k.live = mla_rope_where(a.len, a.depth, i, a.max_pos, a.capacity, &pos, &k.row, &k.bad);
    k.x0 = k.x1 = k.c = k.s = 0.0f;
    if (k.live && p < half) {
        const float *kr = a.kva + (int64_t)i * a.kva_ld + a.rank;
        const int64_t te = (int64_t)(k.bad ? 0 : pos) * half + p;
        if (a.interleave) { k.x0 = kr[2 * p]; k.x1 = kr[2 * p + 1]; }
        else { k.x0 = kr[p]; k.x1 = kr[p + half]; }
        k.c = a.cos_t[te];
        k.s = a.sin_t[te];
    }
    return k;
}

static __device__ __forceinline__ void mla_k_row_store(const ddt_cuda_mla_rope_args &a, int i, const MlaKRow &k,
                                                       int tid, int nt) {
    if (!k.live) return;
    const int half = a.rope / 2;
    const int64_t base = (int64_t)k.row * (a.rank + a.rope);
    float *dst = a.bf16_cache ? NULL : (float *)a.cache + base;
    __nv_bfloat16 *dst16 = a.bf16_cache ? (__nv_bfloat16 *)a.cache + base : NULL;
    for (int d = tid; d < a.rank; d += nt) {
        float v = k.bad ? NAN : a.kvn[(int64_t)i * a.rank + d];
        if (dst16) dst16[d] = __float2bfloat16(v);
        else dst[d] = v;
    }
    if (tid < half) { /* k_rope: one thread per rotation pair */
        float r0, r1;
        mla_rope_rotate(k.x0, k.x1, k.c, k.s, r0, r1);
        if (k.bad) r0 = r1 = NAN;
        if (dst16) {
            dst16[a.rank + tid] = __float2bfloat16(r0);
            dst16[a.rank + tid + half] = __float2bfloat16(r1);
        } else {
            dst[a.rank + tid] = r0;
            dst[a.rank + tid + half] = r1;
        }
    }
}

/* Both steps at once (ddt_cuda_mla_rope_write's k half). */
static __device__ __forceinline__ void mla_rope_k_row(const ddt_cuda_mla_rope_args &a, int i, int tid, int nt) {
    mla_k_row_store(a, i, mla_k_row_load(a, i, tid), tid, nt);
}

#endif
