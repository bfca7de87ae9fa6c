/*
 * mla_cuda.h — the target's MLA pieces on the GPU in fp32: writing a forward's
 * latent rows into the cache with RoPE applied, and the absorbed attention of
 * the forward's tokens (prefill or a draft tree) over the cache.
 *
 * Positions live on the device: token i of a forward sits at position
 * *len + depth[i] (prefill passes depth = 0, 1, 2, ...) and its cache row is
 * *len + i, where *len is the committed length (ddt_cuda_kv.len).  Nothing
 * here needs the host to know len, so a round can be captured in a CUDA graph.
 *
 * The attention is the exact path: for a token at position p it visits the
 * logical positions 0..p — the committed rows, then its own ancestors by depth
 * — in fixed slices of 64 logical positions, each slice with a fixed reduction
 * order, merged in slice order, so a tree node's output is bitwise the output
 * the same token gets in a prefill of its root-to-node path (the greedy tree ==
 * ar invariant on the GPU).  It reads the cache once per head; the tensor-core
 * kernel for long contexts is mla_verify_cuda.h.
 */
#ifndef DDT_CUDA_MLA_H
#define DDT_CUDA_MLA_H

#include <stdbool.h>
#include <stdint.h>

#include "ddtree.h"
#include "backend/cuda/nn_cuda.h"
#include "backend/cuda/qmatmul_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddt_cuda_mla_rope_args {
    int32_t n, heads, nope, rope, rank; /* tokens, heads, q nope/rope dims, kv_lora_rank */
    int32_t qdim;                       /* nope + rope: q row of one head */
    bool interleave;                    /* rope_interleave (DeepSeek layout) */
    const int32_t *len;                 /* device [1] committed rows */
    const int32_t *depth;               /* device [n] position offsets */
    const float *cos_t, *sin_t;         /* device [max_pos][rope/2] tables */
    int32_t max_pos;                    /* positions >= max_pos are an error: the row gets NaN */
    float *q;                           /* device [n][heads][qdim]: rope parts rotated in place */
    const float *kvn;                   /* device [n][rank] normalised latent */
    const float *kva;                   /* device [n][kva_ld]: k_rope (pre-rotation) at column rank */
    int32_t kva_ld;
    void *cache;                        /* device layer base [capacity][rank + rope], fp32 or bf16 */
    int32_t capacity;
    bool bf16_cache;                    /* rows are bf16 (the tensor-core path of mla_verify_cuda.h) */
    uint16_t *q16;                      /* or NULL: the rotated query parts also as bf16 into the tensor-core
                                           path's query, q16[i][h][rank + d] ([n][heads][rank + rope]),
                                           as ddt_cuda_mla_pack_q would copy them (ddt_cuda_mla_rope_write) */
} ddt_cuda_mla_rope_args;

/* Rotate the queries' rope parts and write cache rows *len + i = [kvn[i], rope(k_rope[i])]. */
ddt_status ddt_cuda_mla_rope_write(const ddt_cuda_mla_rope_args *a, ddt_cuda_stream stream, ddt_error *err);

/*
 * ddt_cuda_rmsnorm_pair(jobs) (MLA's q_a and kv_a latent norms) and the cache half
 * of ddt_cuda_mla_rope_write in one launch: cache rows *len + i = [kvn[i],
 * rope(k_rope[i])], the same bits (the same device functions).  jobs[1] must be
 * the kv norm writing a->kvn with row stride a->rank; a->q is not touched (the
 * queries' rope then runs in q_b's epilogue: ddt_cuda_matmul_rope, or on the
 * wgmma path ddt_cuda_next_planes.rope).  sp0: job 0's output split planes too
 * (ddt_cuda_rmsnorm_pair_split's; NULL or hi NULL: none).
 */
ddt_status ddt_cuda_mla_norm_write(const ddt_cuda_norm_job jobs[2], float eps, const ddt_cuda_mla_rope_args *a,
                                   const ddt_cuda_split_planes *sp0, ddt_cuda_stream stream, ddt_error *err);

/*
 * y = x W^T (FP32 path) with the queries' rope applied as ddt_cuda_mla_rope_write
 * applies it: W's rows are a->heads heads of a->qdim (a->nope plain rows, then
 * a->rope rows in interleaved rotation pairs), y's rope part of each head gets the
 * rotated pairs de-interleaved (pair p at nope + p and nope + rope/2 + p), token i
 * at position *len + depth[i].  Bitwise ddt_cuda_matmul then the query half of
 * ddt_cuda_mla_rope_write.  Needs a->interleave, even nope and rope, W's rows =
 * heads * qdim; warp_rows / warp_tokens as ddt_cuda_matmul_swiglu_shape's (2 or 4
 * rows: a pair in one warp), both 0 to choose.
 */
ddt_status ddt_cuda_matmul_rope(const ddt_qweight *w, const float *x, int64_t ldx, float *y, int64_t ldy,
                                const ddt_cuda_mla_rope_args *a, int32_t warp_rows, int32_t warp_tokens,
                                ddt_cuda_stream stream, ddt_error *err);

typedef struct ddt_cuda_mla_attn_args {
    int32_t n, heads, rank, rope;
    const float *q_lat;      /* device [n][heads][rank] */
    const float *q_rope;     /* device: head h of token i at q_rope + i*q_rope_ld_t + h*q_rope_ld_h */
    int64_t q_rope_ld_t, q_rope_ld_h;
    const float *cache;      /* device layer base [capacity][rank + rope] */
    int32_t capacity;
    const int32_t *len;      /* device [1] committed rows */
    const int32_t *depth;    /* device [n] */
    const uint64_t *vis;     /* device [n][vis_words] or NULL = causal (token i sees j <= i) */
    int32_t vis_words;
    float scale;
    void *workspace;         /* device, ddt_cuda_mla_attn_workspace(max_tokens, heads, rank, rope, capacity)
                                bytes, prepared once (ddt_cuda_mla_attn_prepare) */
    int32_t max_tokens;      /* the workspace's bound on n */
    float *out;              /* device [n][heads][rank] */
} ddt_cuda_mla_attn_args;

/* Bytes of the attention's workspace for forwards of at most max_tokens tokens
 * over a cache of capacity rows: per (token, head) an arrival counter and, per
 * slice of 64 positions, a max, a sum and rank partial outputs (about
 * (rank + 2) / 64 floats per cache row, token and head); 0 for a shape the
 * attention cannot run or a size that overflows. */
size_t ddt_cuda_mla_attn_workspace(int32_t max_tokens, int32_t heads, int32_t rank, int32_t rope, int32_t capacity);

/* Zero the workspace's arrival counters (stream-ordered), once after
 * allocating it: every launch leaves them at zero for the next one, graph
 * replays included.  The other bytes need no value. */
ddt_status ddt_cuda_mla_attn_prepare(void *workspace, int32_t max_tokens, int32_t heads, int32_t rank, int32_t rope,
                                     int32_t capacity, ddt_cuda_stream stream, ddt_error *err);

/* out[i][h] = softmax over token i's visible positions of (q . c) * scale, times
 * the rows' rank columns.  A len / depth that puts the positions outside
 * [1, capacity] gives a NaN row; launches sharing a workspace must be
 * stream-ordered (one at a time). */
ddt_status ddt_cuda_mla_attention(const ddt_cuda_mla_attn_args *a, ddt_cuda_stream stream, ddt_error *err);

/* The tensor-core path's query: q16[i][h] = bf16(q_lat[i][h][0..rank) | q_rope[i][h][0..rope))
 * (q16 [n][heads][rank + rope] contiguous, q_lat [n][heads][rank]). */
ddt_status ddt_cuda_mla_pack_q(const float *q_lat, const float *q_rope, int64_t q_rope_ld_t, int64_t q_rope_ld_h,
                               int32_t n, int32_t heads, int32_t rank, int32_t rope, uint16_t *q16,
                               ddt_cuda_stream stream, ddt_error *err);

/* Benchmarks: fill rows [0, rows) of every layer of a cache ([layers][capacity][width],
 * fp32 or bf16) with hash-random values in [-1, 1), standing for a long context. */
ddt_status ddt_cuda_mla_cache_fill(void *cache, int32_t layers, int32_t capacity, int32_t width, int32_t rows,
                                   bool bf16, uint64_t seed, ddt_cuda_stream stream, ddt_error *err);

#ifdef __cplusplus
}
#endif
#endif
