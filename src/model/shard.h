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
 *  - the dense MLPs and the shared experts: rows [i0, i0 + n) of their intermediate
 *    dimension (gate's and up's rows, down's columns; ddt_shard_mlp_slice), an
 *    even split where the world divides it into slices of whole units (32 rows, an
 *    FP8 block, an INT4 group), else the whole MLP on rank 0 (the others add zero;
 *    small models: the shipped pair's shared expert of 192 at 4 GPUs).  Small in
 *    storage (about 2% of Kimi K2.6), they are not small in what a token reads: K2.6's
 *    bf16 shared expert is 88 MB a layer against 198 MB for a token's 8 INT4 routed
 *    experts, and its dense layer 0's MLP 792 MB, which on rank 0 alone would make
 *    rank 0 the slowest GPU of every layer by that much.
 * Embedding, final norm and LM head are whole on every rank (a drafter borrows the
 * embedding and the head); a forward's logits are split by vocabulary rows where
 * the world divides the vocabulary into whole 32-row units (ddt_shard_vocab_slice:
 * each rank reads only its rows of the head, 2.35 GB a forward at K2.6, and the
 * ranks' logits are gathered), else every rank computes all of them.
 */
#ifndef DDT_MODEL_SHARD_H
#define DDT_MODEL_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddtree.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/target_desc.h"

#define DDT_SHARD_MAX_WORLD 64

typedef struct ddt_shard {
    int32_t rank, world;    /* 0 <= rank < world <= DDT_SHARD_MAX_WORLD */
    bool split_heads;       /* world divides num_attention_heads (else attention is replicated) */
    int32_t head0, n_heads; /* heads this rank computes: [head0, head0 + n_heads) */
    int32_t expert0, n_experts; /* routed experts this rank holds (0 for a model without MoE) */
} ddt_shard;

/* The unit an MLP's intermediate dimension is cut in: DDT_SHARD_MLP_UNIT rows (the
 * tensor-core products' 32-column units, so that no rank's down product has a
 * ragged unit), times what the formats need: an FP8 block (gate / up rows, down
 * columns), an INT4 group (down columns) (their least common multiple). */
#define DDT_SHARD_MLP_UNIT 32
int64_t ddt_shard_mlp_unit(const ddt_cpu_mlp *m);
/* The unit of an MLP whose three weights are of format f with FP8 block / INT4
 * group `block` (synthetic targets, which have no host views). */
int64_t ddt_shard_mlp_unit_of(ddt_qformat f, int64_t block);

/* The slice [*i0, *i0 + *n) of an MLP's intermediate dimension of size inter that
 * rank s computes (s NULL, or a world of 1: all of it): inter / world rows each when
 * the world divides inter into multiples of unit; else all of it on rank 0 and
 * *n = 0 on the others. */
void ddt_shard_mlp_slice(const ddt_shard *s, int64_t inter, int64_t unit, int64_t *i0, int64_t *n);

/* The rows [*v0, *v0 + *n) of the LM head (vocabulary ids) whose logits rank s
 * computes: vocab / world each where the world divides the vocabulary into
 * multiples of DDT_SHARD_VOCAB_UNIT (32 rows: whole 16-row tiles of the tensor
 * cores' packed layouts, and DeepSeek-V3's 129280 over 8 GPUs), else all of
 * them on every rank (s NULL or a world of 1 too).  *split: the former. */
#define DDT_SHARD_VOCAB_UNIT 32
void ddt_shard_vocab_slice(const ddt_shard *s, int64_t vocab, int64_t *v0, int64_t *n, bool *split);

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

/*
 * What a rank's GPU must hold, known before anything is uploaded, so that a model
 * too large for the GPUs fails in a second with the numbers instead of with an
 * out-of-memory error minutes into the upload (Kimi K2.6's INT4 checkpoint is
 * ~590 GB; a rank reads its share from disk before its first allocation fails).
 *
 * The weight bytes of a rank as the checkpoint stores them: quantised values and
 * their scales (INT4's weight_shape tensors left out), norm weights and biases in
 * their stored dtype, with the rank's slices of q_b / q_proj and kv_b (its heads'
 * rows) and o_proj (its heads' columns), its routed experts, and its slices of
 * the dense MLPs and shared experts (the rules above).  The CUDA target holds no
 * weight in fewer bytes than that (norms become fp32, products may gain a
 * repacked or transposed copy), so weights plus the KV cache are a lower bound of
 * the memory a rank allocates: a rank that does not fit it cannot load.
 */
typedef struct ddt_shard_bytes {
    uint64_t embed;     /* the embedding, the final norm and an untied LM head (every rank) */
    uint64_t attention; /* every layer's two norms, q / kv projections and o_proj (the rank's heads) */
    uint64_t router;    /* the MoE layers' routers and their correction biases (every rank) */
    uint64_t dense;     /* the rank's slices of the dense MLPs and the shared experts */
    uint64_t routed;    /* the rank's routed experts */
    uint64_t total;     /* the sum of the five */
} ddt_shard_bytes;

/* The weight bytes of rank s (NULL: the whole model on one GPU) of the target d. */
void ddt_shard_weight_bytes(const ddt_target_desc *d, const ddt_shard *s, ddt_shard_bytes *out);

/* The latent KV cache of max_ctx positions: every layer's rows of kv_lora_rank +
 * qk_rope_head_dim values of kv_elem bytes (4: fp32; 2: the bf16 cache of the
 * fast attention).  Whole on every rank (MLA's latent serves all heads). */
uint64_t ddt_shard_kv_bytes(const ddt_target_dims *dims, int64_t max_ctx, int32_t kv_elem);

/* DDT_OK when rank s (NULL: unsharded) of d fits free_bytes of GPU `device`:
 * its weight bytes plus its KV cache plus `also` (what the same GPU holds beside
 * the target on every rank: the drafter; 0 for none) at most free_bytes.  Else
 * DDT_ERR_NOMEM with a message that gives both figures, the parts of the need,
 * and what would fit: the fewest GPUs (up to DDT_SHARD_MAX_WORLD) whose every
 * rank fits GPUs of the same free memory, or, where the weights fit but the KV
 * cache does not, the largest --ctx that does. */
ddt_status ddt_shard_memory_check(const ddt_target_desc *d, const ddt_shard *s, int64_t max_ctx, int32_t kv_elem,
                                  uint64_t also, uint64_t free_bytes, int32_t device, ddt_error *err);

/* A weight's bytes as stored (values and scales; INT4's shape record left out) and
 * a vector's (the rule of ddt_shard_weight_bytes, for callers that add up other
 * models' weights the same way: ddtree inspect's drafter). */
uint64_t ddt_shard_stored_bytes(const ddt_qweight *w);
uint64_t ddt_shard_vec_bytes(const ddt_cpu_vec *v);

/* n bytes in words, GiB, MiB or KiB with `decimals` decimals, into buf[cap]
 * (the check's messages, ddtree inspect's tables); returns buf. */
const char *ddt_shard_fmt_bytes(char *buf, size_t cap, uint64_t n, int decimals);

#endif
