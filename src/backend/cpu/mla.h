/*
 * mla.h — Multi-head Latent Attention in the absorbed form, over a latent cache.
 *
 * Each cached token holds `rank` latent values c (kv_a_layernorm output) and
 * `rope_dim` rotated shared key values k_rope: one row of rank + rope_dim floats,
 * shared by all heads (MQA with key width rank + rope_dim, value width rank).
 * For query token t and head h:
 *   s_j = scale * (q_lat[t][h] . c_j + q_rope[t][h] . k_rope_j)   over visible rows j
 *   out[t][h] = sum_j softmax(s)_j c_j                              (rank values)
 * where q_lat = q_nope W_UK (see qmatmul's transposed product) and the caller
 * then applies W_UV and o_proj.  The softmax is computed online (running max and
 * sum, one pass), in fp32, over the visible rows in increasing row order, by
 * backend/cpu/attn.h's row kernel (key = q_lat then q_rope segments, value = the
 * latent), whose fixed order makes a query's output bitwise a function of its
 * visible rows alone: the same whatever the batch, the mask layout, the thread
 * count, or whether a tree verify or a prefill of the node's path computes it.
 *
 * Visibility: the kv rows [0, n_prefix) (committed tokens) are visible to every
 * query; rows n_prefix + j (j < n, this forward's tokens, already written) are
 * visible to query t when j <= t (vis == NULL, causal prefill) or when bit j of
 * vis[t] is set (tree verify, vis [n][vis_words]).
 *
 * GPU twins: ddt_cuda_mla_attention (backend/cuda/mla_cuda.cu, exact fp32) and
 * ddt_cuda_mla_verify_run (backend/cuda/mla_verify_cuda.cu, bf16 tensor cores).
 */
#ifndef DDT_BACKEND_CPU_MLA_H
#define DDT_BACKEND_CPU_MLA_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/pool.h"

typedef struct ddt_mla_attn {
    int32_t n;              /* query tokens */
    int32_t n_heads;
    int32_t rank;           /* kv_lora_rank */
    int32_t rope_dim;       /* qk_rope_head_dim */
    const float *q_lat;     /* [n][n_heads][rank], strides below */
    int64_t q_lat_ld_t, q_lat_ld_h;
    const float *q_rope;    /* [n][n_heads][rope_dim], rotated */
    int64_t q_rope_ld_t, q_rope_ld_h;
    const float *kv;        /* [n_prefix + n][rank + rope_dim] rows, row stride kv_ld */
    int64_t kv_ld;
    int64_t n_prefix;       /* committed rows, all visible */
    const uint64_t *vis;    /* NULL (causal) or [n][vis_words] bitsets over the n new rows */
    int32_t vis_words;
    float scale;            /* softmax scale */
    float *out;             /* [n][n_heads][rank], strides below */
    int64_t out_ld_t, out_ld_h;
} ddt_mla_attn;

void ddt_cpu_mla_attention(ddt_cpu_pool *pool, const ddt_mla_attn *a);
/* The same with attn.h's portable kernel, for the tests (the same bits). */
void ddt_cpu_mla_attention_portable(ddt_cpu_pool *pool, const ddt_mla_attn *a);

/* The rope half of writing a forward's cache rows, the CPU side of
 * ddt_cuda_mla_rope_write (backend/cuda/mla_cuda.h).  For token i < n, with the
 * angles cos_v / sin_v [n][rope_dim / 2]:
 *   rows[i][rank .. rank + rope_dim) = rope(kva[i][rank .. rank + rope_dim))
 *   q[i][h][nope .. nope + rope_dim) rotated in place, h < n_heads
 * (ddt_cpu_rope_rotate, interleaved or rotate_half).  The latent half
 * rows[i][0 .. rank) is the caller's: the target's kv_a_layernorm writes it there. */
typedef struct ddt_mla_rope {
    int32_t n, n_heads, nope, rank, rope_dim;
    int32_t qdim;              /* nope + rope_dim: one head's query row */
    bool interleave;           /* rope_interleave (DeepSeek layout) */
    const float *cos_v, *sin_v;
    float *q;                  /* [n][n_heads][qdim] */
    const float *kva;          /* [n][rank + rope_dim]: k_rope (pre-rotation) at column rank */
    float *rows;               /* [n] cache rows of row stride rows_ld */
    int64_t rows_ld;
} ddt_mla_rope;

void ddt_cpu_mla_rope_write(const ddt_mla_rope *a);

#endif
