/*
 * target.h — the DeepSeek-V3 / Kimi K2.x target model on the CPU backend.
 *
 * A target is loaded from a Hugging Face folder (config.json + safetensors,
 * one file or shards): the config picks the architecture, the tensor prefix
 * ("" or "language_model.") and the weight formats; every weight is a view into
 * the checkpoint mapping (nothing is copied or converted, whatever the dtype);
 * the run state (activations, latent KV cache, hidden-state capture) is
 * allocated once for `max_ctx` cache rows and `max_tokens` tokens per forward.
 * No forward allocates.
 *
 * The maths is transformers' DeepseekV3ForCausalLM (see tests/fixtures/README.md
 * and reference.md section 3), with attention in the absorbed MLA form over a
 * latent cache (backend/cpu/mla.h) and fp32 activations throughout.
 *
 * Sequence state: `len` committed tokens at positions 0..len-1.
 *  - prefill appends n tokens at positions len..len+n-1 (causal), len += n.
 *    An autoregressive decode step is a prefill of one token.
 *  - verify runs a draft tree: node i at position len + depth[i] attends to the
 *    committed tokens and to the tree nodes set in its visibility row; its
 *    latent KV goes to cache row len + i, which is scratch: len is unchanged.
 *  - commit keeps a root-to-node path of the last verify: its rows move to
 *    len..len+m-1 and len += m.  rollback shortens len.
 * Every forward needs len + n <= max_ctx (cache rows).
 *
 * Hidden-state capture: for each layer id in options.capture_layers the last
 * forward's per-token hidden state equal to HF output_hidden_states[id + 1] is
 * kept: the decoder layer's output (residual stream), except for the last layer,
 * where HF returns the final-normed state and so does this.
 */
#ifndef DDT_MODEL_TARGET_H
#define DDT_MODEL_TARGET_H

#include <stdbool.h>
#include <stdint.h>

#include "ddtree.h"
#include "io/config.h"
#include "backend/cpu/nn.h"
#include "io/safetensors.h"
#include "backend/cpu/kv.h"
#include "model/target_desc.h"

typedef struct ddt_target_options {
    int32_t max_ctx;               /* cache rows per layer (committed + one forward), >= 1 */
    int32_t max_tokens;            /* tokens per forward (prefill chunk or tree nodes), >= 1 */
    int32_t n_threads;             /* CPU threads; <= 0 = every core */
    const int32_t *capture_layers; /* [n_capture] layer ids, or NULL */
    int32_t n_capture;             /* 0..DDT_TARGET_MAX_CAPTURE */
} ddt_target_options;

typedef struct ddt_target ddt_target;

/* Load config and checkpoint from folder `dir`; errors name the file and tensor. */
ddt_status ddt_target_load(const char *dir, const ddt_target_options *opts, ddt_target **out, ddt_error *err);
void ddt_target_free(ddt_target *t);

const ddt_model_config *ddt_target_config(const ddt_target *t);
int32_t ddt_target_vocab(const ddt_target *t);
int32_t ddt_target_len(const ddt_target *t);        /* committed tokens */
int32_t ddt_target_max_ctx(const ddt_target *t);
int32_t ddt_target_max_tokens(const ddt_target *t);
int32_t ddt_target_threads(const ddt_target *t);    /* CPU threads of its pool */
/* Weight views a drafter borrows: the embedding [vocab][hidden] and the LM head
 * [vocab][hidden] (the embedding when tied); valid while the target lives. */
const ddt_qweight *ddt_target_embed(const ddt_target *t);
const ddt_qweight *ddt_target_lm_head(const ddt_target *t);
/* Layer l's weight views (NULL when l is out of range) and the final norm: the
 * description's (target_desc.h). */
const ddt_target_layer *ddt_target_layer_at(const ddt_target *t, int32_t l);
const ddt_cpu_vec *ddt_target_final_norm(const ddt_target *t);
/* ddt_target_rope_table (the RoPE cos/sin of a config): model/target_desc.h. */
/* The target's thread pool, for a drafter that runs between target forwards. */
struct ddt_cpu_pool *ddt_target_pool(ddt_target *t);
/* The latent cache (read-only view, for tests and tools). */
const ddt_cpu_kv *ddt_target_cache(const ddt_target *t);
/* Bytes of every weight the model reads (as stored: quantised bytes + scales). */
uint64_t ddt_target_weight_bytes(const ddt_target *t);
/* Weight bytes one decode step (one token) reads: everything, except one row of
 * an untied embedding table and top_k of n_experts routed experts per MoE layer. */
uint64_t ddt_target_decode_bytes(const ddt_target *t);
/* Bytes the target allocated: run state and latent cache (weights excluded). */
uint64_t ddt_target_state_bytes(const ddt_target *t);

/*
 * Append ids[0..n) (each in [0, vocab)), 1 <= n <= max_tokens, len + n <= max_ctx.
 * logits: NULL (none computed), [n][vocab] when all_logits, else [vocab] for the
 * last token only.
 */
ddt_status ddt_target_prefill(ddt_target *t, const int32_t *ids, int32_t n, float *logits, bool all_logits,
                              ddt_error *err);

/*
 * Score a draft tree of n nodes (1 <= n <= max_tokens, len + n <= max_ctx):
 * tokens[n], depth[n] (0 <= depth < n), vis [n][vis_words] with bit j of row i
 * set when node i sees node j (bit i must be set, no bit >= n).  With a ddt_tree:
 * (tree.token, tree.depth, tree.vis, tree.vis_words, tree.n_nodes).
 * logits [n][vocab] (may be NULL).  Nothing is committed.
 */
ddt_status ddt_target_verify(ddt_target *t, const int32_t *tokens, const int32_t *depth, const uint64_t *vis,
                             int32_t vis_words, int32_t n, float *logits, ddt_error *err);

/*
 * Commit path[0..m) (node indices of the last verify): node path[k] must have
 * depth k and see exactly the nodes path[0..k] — a root-to-node path — so its
 * KV is what a prefill of the path would have written.  m = 0 commits nothing.
 * Must follow a verify with no other forward, commit or rollback in between.
 */
ddt_status ddt_target_commit(ddt_target *t, const int32_t *path, int32_t m, ddt_error *err);

/* Forget committed tokens: len = new_len, 0 <= new_len <= len. */
ddt_status ddt_target_rollback(ddt_target *t, int32_t new_len, ddt_error *err);

/*
 * Captured hidden states of the last forward for capture slot `slot` (the
 * order of options.capture_layers): [n_tokens][hidden_size], row i = token i of
 * that forward (node i for verify).  NULL when slot is out of range or no
 * forward ran yet.
 */
const float *ddt_target_hidden(const ddt_target *t, int32_t slot, int32_t *n_tokens);

#endif
