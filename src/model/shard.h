/*
 * shard.h — how a DeepSeek-V3 target is split over N GPUs (tensor parallel
 * attention, expert parallel MoE), as pure host code so that CI, which has no
 * GPU, tests it.  The CUDA target (target_cuda.h) uploads only what its rank
 * owns and sums the ranks' partial outputs with an all-reduce.
 *
 * Rank r of N owns:
 *  - attention heads [r*H/N, (r+1)*H/N) when N divides num_attention_heads:
 *    the q_b_proj (or q_proj) rows and kv_b_proj rows of those heads and the
 *    o_proj columns of those heads; its o_proj output is a partial sum that the
 *    all-reduce completes.  When N does not divide H the attention is replicated:
 *    every rank computes every head and nothing is reduced (uneven head counts
 *    would leave the ranks' latencies unbalanced for little memory saved: the
 *    attention is a few percent of a K2-sized model).  q_a_proj, kv_a_proj, the
 *    norms and the latent KV cache (shared by all heads in MLA) are whole on
 *    every rank.
 *  - routed experts [r*E/N, (r+1)*E/N) (floor division: every expert has one
 *    owner).  The router runs whole on every rank, so every rank picks the same
 *    experts; a rank adds its own experts' weighted outputs for every token.
 *  - the dense MLPs and the shared experts on rank 0 only (the others add zero).
 *    They are small beside the routed experts (about 2% of Kimi K2.6), and a split
 *    of their intermediate dimension would have to cut down_proj's columns at
 *    FP8 block (128) / INT4 group (32) boundaries, which small models' sizes
 *    (192 / 4 = 48) do not meet.
 * Embedding, final norm and LM head are whole on every rank.
 */
#ifndef DDT_MODEL_SHARD_H
#define DDT_MODEL_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "ddtree.h"
#include "io/config.h"
#include "io/safetensors.h"

#define DDT_SHARD_MAX_WORLD 64

typedef struct ddt_shard {
    int32_t rank, world;    /* 0 <= rank < world <= DDT_SHARD_MAX_WORLD */
    bool split_heads;       /* world divides num_attention_heads (else attention is replicated) */
    int32_t head0, n_heads; /* heads this rank computes: [head0, head0 + n_heads) */
    int32_t expert0, n_experts; /* routed experts this rank holds (0 for a model without MoE) */
    bool dense;             /* this rank computes the dense MLPs and shared experts (rank 0) */
} ddt_shard;

/* The plan of rank `rank` of `world` for the config.  Errors (DDT_ERR_RANGE):
 * world outside 1..DDT_SHARD_MAX_WORLD, rank outside 0..world-1, or an MoE model
 * with fewer routed experts than ranks (a rank would hold none). */
ddt_status ddt_shard_plan(const ddt_model_config *cfg, int32_t rank, int32_t world, ddt_shard *out, ddt_error *err);

/* Rows [r0, r0 + n) of a host weight view, as a view into the same storage (no
 * copy).  FP8 needs r0 on a block boundary and r0 + n on one or at the end. */
ddt_status ddt_shard_rows(const ddt_qweight *w, int64_t r0, int64_t n, ddt_qweight *out, ddt_error *err);

/* Columns [c0, c0 + n) of a host weight view, copied into one new allocation
 * *buf (data and scales; free() it once the slice has been uploaded).  FP8 needs
 * c0 on a block boundary and c0 + n on one or at the end; INT4 the same with its
 * group.  Every format's elements are copied bit for bit. */
ddt_status ddt_shard_cols(const ddt_qweight *w, int64_t c0, int64_t n, ddt_qweight *out, void **buf, ddt_error *err);

#endif
