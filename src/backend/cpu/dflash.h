/*
 * dflash.h — the DFlash drafter's block attention on the CPU: the CPU reference
 * of ddt_dflash_attention in backend/cuda/dflash_cuda.cu (its GPU twin, which
 * splits the rows and combines the splits in a fixed order, so the two agree to
 * rounding, not bitwise); and the per-head norm + RoPE of the queries and keys,
 * the CPU reference of ddt_dflash_qkv_prep.  The rest of dflash_cuda.h has its
 * CPU side in backend/cpu/rope.h (rotate_half RoPE) and model/drafter.c (the K/V
 * store and the append bookkeeping).
 *
 * Non-causal GQA: every query row of the block sees every cache row
 * [0, n_rows) (the committed context, then the block's own rows):
 *   o[t][h*hd + j] = sum_r softmax_r(scale * q[t][h] . k_r[g]) v_r[g][j],
 *   g = h / (heads / kv_heads),
 * an online softmax in fp32 over the rows in increasing order, by
 * backend/cpu/attn.h's row kernel (its fixed order: a query row's output
 * depends on its own q and the rows only).
 */
#ifndef DDT_BACKEND_CPU_DFLASH_H
#define DDT_BACKEND_CPU_DFLASH_H

#include <stdint.h>

#include "backend/cpu/nn.h"
#include "backend/cpu/pool.h"

/* Largest head_dim the ops here are specified for (model/drafter.c asserts its
 * own bound against it); the attention accumulates in o, not on the stack. */
#define DDT_CPU_DFLASH_MAX_HEAD_DIM 512

typedef struct ddt_cpu_dflash_attn {
    int32_t n_block;    /* query rows (the block, L) */
    int32_t heads;      /* query heads */
    int32_t kv_heads;   /* divides heads */
    int32_t hd;         /* head_dim, 1..DDT_CPU_DFLASH_MAX_HEAD_DIM */
    float scale;        /* softmax scale, head_dim^-0.5 */
    const float *q;     /* [n_block][heads * hd] */
    const float *k, *v; /* [n_rows][kv_heads * hd] */
    int64_t n_rows;     /* >= 1 */
    float *o;           /* [n_block][heads * hd], not overlapping q, k or v */
} ddt_cpu_dflash_attn;

/* One work item per (query row, head) on the pool. */
void ddt_cpu_dflash_attention(ddt_cpu_pool *pool, const ddt_cpu_dflash_attn *a);
/* The same with attn.h's portable kernel, for the tests (the same bits). */
void ddt_cpu_dflash_attention_portable(ddt_cpu_pool *pool, const ddt_cpu_dflash_attn *a);

/* Qwen3's q_norm / k_norm then rotate_half RoPE, per head: for t < n, h < nh,
 * y[t][h*hd ..] = rope(rmsnorm(x[t][h*hd ..], w, eps)) with the angles of row t
 * in cos_v / sin_v [n][hd/2] (ddt_cpu_rmsnorm then ddt_cpu_rope_rotate, the
 * drafter's arithmetic).  Row strides ldx, ldy (>= nh * hd); y may equal x with
 * ldy == ldx.  hd even, <= DDT_CPU_DFLASH_MAX_HEAD_DIM. */
void ddt_cpu_dflash_norm_rope(ddt_cpu_pool *pool, const float *x, int64_t ldx, int32_t n, int32_t nh, int32_t hd,
                              const ddt_cpu_vec *w, float eps, const float *cos_v, const float *sin_v, float *y,
                              int64_t ldy);

#endif
