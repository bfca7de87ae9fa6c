/*
 * target_cuda.h — the DeepSeek-V3 / Kimi K2.x target on the CUDA backend.
 *
 * Loading reads the target description (model/target_desc.h: config, checks,
 * weight views, the same as the CPU target's), whose views are then uploaded
 * as they are stored (bf16 / FP8-block /
 * INT4 stay quantised on the device and are dequantised inside the kernels).
 * The maths is the CPU target's, in fp32 activations, with the same per-layer
 * steps; the latent cache is fp32 on the device.
 *
 * Everything a forward needs to know that changes between rounds lives on the
 * device: the committed length (kv.len), the tokens, the tree (depth, vis) and
 * the accepted path.  So prefill / verify / commit launch work without a host
 * synchronisation and a whole round can be captured in a CUDA graph.  Only the
 * token count n of a forward comes from the host (a decoding round's tree
 * always has budget + 1 nodes).  All calls are asynchronous on the target's
 * stream; device-side faults (a bad path, a position past the cache) are
 * reported through status words the caller reads after synchronising.
 *
 * Per-element results do not depend on how many tokens are processed together,
 * and attention visits positions in logical order (mla_cuda.h), so a tree node
 * gets bitwise the logits its root-to-node path gets in a prefill.
 */
#ifndef DDT_MODEL_TARGET_CUDA_H
#define DDT_MODEL_TARGET_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "ddtree.h"
#include "backend/cuda/kv_cuda.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/shard.h"

typedef struct ddt_cuda_target ddt_cuda_target;

/* Sum buf[0..count) over the ranks, in place, on stream (cudaStream_t), so that
 * every rank holds the same bytes after it, in an order that does not depend on
 * count (engine_multi_cuda.c: an all-gather, then the partials added in rank
 * order), so that a token's sums are the same at any token count.  Called inside
 * forwards, so it must be graph-capturable and must not allocate.  buf NULL is a
 * reservation, not a sum: every later call has count <= this one's; the target
 * makes it once at load, outside any capture (stream NULL), so the function
 * allocates its buffers there. */
typedef ddt_status (*ddt_cuda_allreduce_fn)(void *ctx, float *buf, int64_t count, void *stream, ddt_error *err);

/* Every rank's send[0..count) into recv [world][count] in rank order, on every rank,
 * on stream (the same ctx as the all-reduce's; graph-capturable, no allocation;
 * count at most the target's max_tokens x vocab / world).  The sharded target's
 * logits: each rank computes its vocabulary rows of the LM head (model/shard.h
 * ddt_shard_vocab_slice) and the ranks' blocks are gathered; without one (NULL)
 * every rank computes all of them. */
typedef ddt_status (*ddt_cuda_allgather_fn)(void *ctx, const float *send, int64_t count, float *recv, void *stream,
                                            ddt_error *err);

typedef struct ddt_cuda_target_options {
    int32_t max_ctx;               /* cache rows (committed + one forward) */
    int32_t max_tokens;            /* tokens per forward */
    const int32_t *capture_layers; /* layer ids whose hidden states are kept (HF hidden_states[id + 1]) */
    int32_t n_capture;
    bool fast_attention;           /* bf16 latent cache + the tensor-core kernel (mla_verify_cuda.h):
                                      needs kv_lora_rank 512, qk_rope_head_dim 64, max_tokens <= 64;
                                      faster at long contexts, but a tree node's logits are no longer
                                      bitwise those of its path's prefill (the split-KV plan depends on
                                      the token count) */
    bool tensor_cores;             /* projections, routed experts and LM head on the tensor cores
                                      (DDT_CUDA_MM_TENSOR, qmatmul_cuda.h): much faster for 8..64
                                      tokens, relative error ~1e-5 instead of ~1e-7; the router runs
                                      with the shared expert's gate / up as one product where they
                                      stack (sharded: where every rank holds a slice of the shared
                                      expert; else on the FP32 path).  Tree == AR equality
                                      still holds (both use the same kernels) */
    int32_t shared_fork;           /* a MoE layer's shared-expert down on a side branch beside the route
                                      and the routed experts (unsharded, tensor cores): 0 = where its
                                      weights are >= 4 MB (K2.6: yes; the shipped pair: no), 1 =
                                      wherever it can, -1 = never.  The same kernels on the same inputs:
                                      the same bits either way */
    /* Multi-GPU (model/shard.h): shard_world 0 = the whole model on this GPU, no
       reduction (the single-GPU path).  shard_world >= 1: this target is rank
       shard_rank of shard_world; it holds the rank's heads and experts and calls
       allreduce after each attention output projection (when the heads are split)
       and after each MLP / MoE.  shard_world 1 holds everything but still goes
       through allreduce (tests of the multi-GPU path on one GPU). */
    int32_t shard_rank, shard_world;
    ddt_cuda_allreduce_fn allreduce;
    void *allreduce_ctx;
    ddt_cuda_allgather_fn allgather; /* NULL: the logits are not split (every rank computes all) */
    /* Bytes the caller will hold on this GPU beside the target (the engine's drafter),
       counted in the memory check before the upload (model/shard.h
       ddt_shard_memory_check: a model too large fails there, at once); 0 for none. */
    uint64_t also_bytes;
} ddt_cuda_target_options;

/* How many MoE layers run their shared expert's down on the side branch
 * (ddt_cuda_target_options.shared_fork): tests and benchmarks. */
int32_t ddt_cuda_target_forked_layers(const ddt_cuda_target *t);
/* How many MoE layers run their router stacked with the shared expert's gate and up
 * (one product; sharded with the tensor cores only where every rank holds a slice
 * of the shared expert): tests. */
int32_t ddt_cuda_target_stacked_fronts(const ddt_cuda_target *t);
/* The LM head's rows whose logits this rank computes (the vocabulary unless they
 * are split over the ranks: ddt_cuda_target_options.allgather): tests. */
int64_t ddt_cuda_target_head_rows(const ddt_cuda_target *t);

ddt_status ddt_cuda_target_load(const char *dir, const ddt_cuda_target_options *opts, ddt_cuda_target **out,
                                ddt_error *err);
void ddt_cuda_target_free(ddt_cuda_target *t);

/*
 * A target of the config's shapes with random weights made on the device (no
 * checkpoint, no host copy): benchmarks at real model shapes (a few Kimi K2.6
 * layers).  Norms are 1, weights uniform with amplitude ~1/sqrt(fan-in) so that
 * activations stay finite.  cfg->num_hidden_layers layers are built, dense for
 * layers < first_k_dense_replace; the config's ignore list is not used.
 */
typedef struct ddt_cuda_synth_options {
    ddt_qformat dense_format;  /* attention, dense MLP, shared expert: DDT_Q_DENSE (bf16) or DDT_Q_FP8_BLOCK */
    ddt_qformat expert_format; /* routed experts: DDT_Q_DENSE (bf16), DDT_Q_FP8_BLOCK or DDT_Q_INT4_GROUP */
    bool lm_head;              /* an LM head of its own (else the embedding serves as the head) */
    uint64_t seed;
} ddt_cuda_synth_options;
ddt_status ddt_cuda_target_synthetic(const ddt_model_config *cfg, const ddt_cuda_target_options *opts,
                                     const ddt_cuda_synth_options *so, ddt_cuda_target **out, ddt_error *err);

const ddt_model_config *ddt_cuda_target_config(const ddt_cuda_target *t);
int32_t ddt_cuda_target_vocab(const ddt_cuda_target *t);
int32_t ddt_cuda_target_max_ctx(const ddt_cuda_target *t);
int32_t ddt_cuda_target_max_tokens(const ddt_cuda_target *t);
/* The stream every call of this target runs on (cudaStream_t). */
void *ddt_cuda_target_stream(const ddt_cuda_target *t);
/* The device latent cache (len, status words included). */
const ddt_cuda_kv *ddt_cuda_target_kv(const ddt_cuda_target *t);
/* Device weights a drafter borrows: embedding and LM head ([vocab][hidden]). */
const ddt_qweight *ddt_cuda_target_embed(const ddt_cuda_target *t);
const ddt_qweight *ddt_cuda_target_lm_head(const ddt_cuda_target *t);
/* Device capture buffer of slot s: [max_tokens][hidden], row i = token i of the last forward. */
const float *ddt_cuda_target_hidden(const ddt_cuda_target *t, int32_t slot);
/* Device bytes held: weights, and run state + cache. */
uint64_t ddt_cuda_target_weight_bytes(const ddt_cuda_target *t);
uint64_t ddt_cuda_target_state_bytes(const ddt_cuda_target *t);

/* Benchmarks: pretend len committed tokens (rows [0, len) filled with random
 * latent values): long contexts without prefilling them. */
ddt_status ddt_cuda_target_fake_context(ddt_cuda_target *t, int32_t len, uint64_t seed, ddt_error *err);
/* The committed length back to len (0..max_ctx - 1), on the stream: rows past it
 * are left as they are (a replayed measurement over a fake context rewinds to it). */
ddt_status ddt_cuda_target_rewind(ddt_cuda_target *t, int32_t len, ddt_error *err);

/* Forget everything: len = 0. */
ddt_status ddt_cuda_target_reset(ddt_cuda_target *t, ddt_error *err);

/*
 * Append n tokens ids (DEVICE [n], each checked on the device: an id outside
 * the vocabulary gives NaN logits) at positions len..len+n-1, then len += n.
 * logits: NULL, or DEVICE [n][vocab] when all_logits, else [vocab] for the last
 * token.  1 <= n <= max_tokens.
 */
ddt_status ddt_cuda_target_prefill(ddt_cuda_target *t, const int32_t *ids, int32_t n, float *logits,
                                   bool all_logits, ddt_error *err);

/*
 * Score a draft tree of n nodes (DEVICE tokens [n], depth [n], vis [n][vis_words]);
 * node i goes to position len + depth[i] and cache row len + i.  logits DEVICE
 * [n][vocab].  len is unchanged.
 */
ddt_status ddt_cuda_target_verify(ddt_cuda_target *t, const int32_t *tokens, const int32_t *depth,
                                  const uint64_t *vis, int32_t vis_words, int32_t n, float *logits,
                                  ddt_error *err);

/*
 * Tests only (test_cuda_target --diag-fast): while a probe is set, every forward
 * copies, for each layer l, that layer's intermediate values of its n tokens
 * into the caller's DEVICE buffers, layer l's block at row l * max_tokens (token
 * i at row l * max_tokens + i; the widths below), asynchronously on the
 * target's stream.  Any pointer may be NULL (not copied).  NULL (the default)
 * turns the probe off; no CUDA graph may be captured while one is set.
 */
typedef struct ddt_cuda_target_probe {
    float *q;         /* [layers][max_tokens][heads][qdim]: queries, rope part rotated */
    float *q_lat;     /* [layers][max_tokens][heads][rank]: absorbed queries */
    uint16_t *q16;    /* [layers][max_tokens][heads][rank + rope]: bf16 queries (fast attention only) */
    float *o_lat;     /* [layers][max_tokens][heads][rank]: attention output in latent space */
    float *x_attn;    /* [layers][max_tokens][hidden]: residual stream after the attention */
    float *x;         /* [layers][max_tokens][hidden]: residual stream after the layer */
    float *rlogits;   /* [layers][max_tokens][n_experts]: router logits (MoE layers only) */
    int32_t *ridx;    /* [layers][max_tokens][top_k]: routed experts (MoE layers only) */
    float *bias;      /* [layers][n_experts]: the router's correction bias (MoE layers only) */
} ddt_cuda_target_probe;
void ddt_cuda_target_set_probe(ddt_cuda_target *t, const ddt_cuda_target_probe *p);

/* Commit the accepted path (DEVICE path [..], *path_len) of the last verify: kv_cuda.h. */
ddt_status ddt_cuda_target_commit(ddt_cuda_target *t, const int32_t *path, const int32_t *path_len,
                                  ddt_error *err);

#endif
