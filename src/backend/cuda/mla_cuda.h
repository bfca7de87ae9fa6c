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
 * logical positions 0..p in order — the committed rows, then its own ancestors
 * by depth — with a fixed reduction order, so a tree node's output is bitwise
 * the output the same token gets in a prefill of its root-to-node path (the
 * greedy tree == ar invariant on the GPU).  It reads the cache once per head;
 * the tensor-core kernel for long contexts is mla_verify_cuda.h.
 */
#ifndef DDT_CUDA_MLA_H
#define DDT_CUDA_MLA_H

#include <stdbool.h>
#include <stdint.h>

#include "ddtree.h"
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
    float *cache;                       /* device layer base [capacity][rank + rope] */
    int32_t capacity;
} ddt_cuda_mla_rope_args;

/* Rotate the queries' rope parts and write cache rows *len + i = [kvn[i], rope(k_rope[i])]. */
ddt_status ddt_cuda_mla_rope_write(const ddt_cuda_mla_rope_args *a, ddt_cuda_stream stream, ddt_error *err);

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
    float *scores;           /* device scratch [n][heads][capacity] */
    float *out;              /* device [n][heads][rank] */
} ddt_cuda_mla_attn_args;

ddt_status ddt_cuda_mla_attention(const ddt_cuda_mla_attn_args *a, ddt_cuda_stream stream, ddt_error *err);

#ifdef __cplusplus
}
#endif
#endif
