/*
 * drafter.h — the DFlash block-diffusion drafter on the CPU backend
 * (reference.md section 2).
 *
 * A drafter is a stack of Qwen3-style decoder layers plus fc, hidden_norm and a
 * final norm, loaded from a Hugging Face DFlash folder (config.json with
 * architectures ["DFlashDraftModel"] + safetensors, tensor names with or without
 * a "model." prefix).  It has no embedding and no LM head: it borrows the
 * target's embed_tokens and lm_head (ddt_drafter_target below).  Weights are
 * views into the checkpoint mapping; the run state (context K/V cache for
 * max_ctx tokens plus one block, activations for one block and one append chunk)
 * is allocated once at load.  Neither appending context nor drafting allocates.
 *
 * Context.  For every token the target commits, the caller appends its target
 * features: the hidden states output by target layers target_layer_ids
 * (HF output_hidden_states[id + 1]) concatenated in that order,
 * [n_ids * hidden] floats.  The drafter turns them into ctx = hidden_norm(fc(f))
 * and, per drafter layer, into a context key (k_proj, k_norm, RoPE at the
 * token's position) and value (v_proj), cached.  Rollback drops cached rows.
 *
 * Draft.  The block [bonus, MASK x (L-1)] sits at positions next..next+L-1,
 * where next is one past the last appended position (0 with no context).  Its
 * input is the target embedding of those ids.  In every layer the queries come
 * from the block only and attend, without a causal mask, to every cached
 * context row and every block row (GQA: query head h uses key/value head
 * h / (heads / kv_heads)).  After the final norm, block positions 1..L-1 go
 * through the target's lm_head: logits [L-1][vocab], row i-1 predicting the
 * token AT position next + i.
 *
 * Config keys and the legacy YaRN flag: io/drafter_config.h.
 */
#ifndef DDT_MODEL_DRAFTER_H
#define DDT_MODEL_DRAFTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/pool.h"
#include "ddtree.h"
#include "io/drafter_config.h"
#include "io/safetensors.h"

/* The cos/sin attention factor the drafter's RoPE uses (1 without YaRN). */
float ddt_drafter_config_rope_attention_factor(const ddt_drafter_config *cfg);
/* The RoPE frequencies inv_freq[head_dim / 2] (YaRN-scaled when configured);
 * returns the attention factor.  Every backend builds its cos/sin from these. */
float ddt_drafter_config_rope(const ddt_drafter_config *cfg, float *inv_freq);

/* What the drafter borrows from its target; every pointer must outlive the drafter. */
typedef struct ddt_drafter_target {
    int32_t hidden_size;        /* H */
    int32_t num_layers;         /* target decoder layers */
    int32_t vocab_size;         /* V */
    const ddt_qweight *embed;   /* [V][H] embed_tokens */
    const ddt_qweight *lm_head; /* [V][H] lm_head (embed_tokens when tied) */
} ddt_drafter_target;

/*
 * The target's embedding and LM head read from the target's own folder (config
 * + checkpoint, honouring tensor_prefix and tie_word_embeddings), for callers
 * whose target object does not hand out its weight views.  The checkpoint is
 * mapped a second time: address space only, no copy.
 */
typedef struct ddt_drafter_head ddt_drafter_head;
ddt_status ddt_drafter_head_open(const char *target_dir, ddt_drafter_head **out, ddt_error *err);
void ddt_drafter_head_close(ddt_drafter_head *h);
/* View valid until ddt_drafter_head_close. */
const ddt_drafter_target *ddt_drafter_head_target(const ddt_drafter_head *h);

typedef struct ddt_drafter_options {
    int32_t max_ctx;     /* context tokens the K/V cache holds, >= 1 */
    int32_t n_threads;   /* CPU threads of the drafter's own pool; <= 0 = every core */
    ddt_cpu_pool *pool;  /* borrowed pool to use instead (NULL = create one); it must not be
                            running other work while the drafter runs */
} ddt_drafter_options;

typedef struct ddt_drafter ddt_drafter;

/*
 * Load the drafter in folder `dir` for `target` (copied; its weight pointers are
 * borrowed).  Checks every tensor's presence, dtype and shape against the config,
 * and the config against the target: hidden_size, target_layer_ids (each in
 * 0..target layers-1), num_target_layers, vocab_size, mask_token_id, and the
 * embed / lm_head shapes.  Errors name the file and the tensor or field.
 */
ddt_status ddt_drafter_load(const char *dir, const ddt_drafter_target *target, const ddt_drafter_options *opts,
                            ddt_drafter **out, ddt_error *err);
void ddt_drafter_free(ddt_drafter *d);

const ddt_drafter_config *ddt_drafter_get_config(const ddt_drafter *d);
int32_t ddt_drafter_block_size(const ddt_drafter *d);  /* L */
int32_t ddt_drafter_feature_dim(const ddt_drafter *d); /* n_target_layers * hidden */
int32_t ddt_drafter_vocab(const ddt_drafter *d);
int32_t ddt_drafter_len(const ddt_drafter *d);         /* cached context tokens */
int32_t ddt_drafter_max_ctx(const ddt_drafter *d);
int32_t ddt_drafter_next_position(const ddt_drafter *d); /* position of the next block's bonus token */
uint64_t ddt_drafter_state_bytes(const ddt_drafter *d);  /* bytes allocated (weights excluded) */

/*
 * Append m >= 0 committed tokens' features: features [m][feature_dim] (row
 * stride feature_dim), positions [m] strictly increasing and above the last
 * appended position; len + m <= max_ctx.  Tokens are processed in chunks; the
 * result is bit-identical however the tokens are split across calls.
 */
ddt_status ddt_drafter_append_context(ddt_drafter *d, const float *features, const int32_t *positions, int32_t m,
                                      ddt_error *err);

/*
 * Append m tokens whose features lie in per-layer arrays, as a target's
 * hidden-state capture holds them: layers[i] is the [n_rows][hidden] capture of
 * target layer target_layer_ids[i] (row stride hidden) and rows[k] picks the row
 * of token k (e.g. the accepted path of a tree verify, or 0..n-1 after a
 * prefill).  Positions are next_position .. next_position + m - 1.
 */
ddt_status ddt_drafter_append_rows(ddt_drafter *d, const float *const *layers, int32_t n_rows,
                                   const int32_t *rows, int32_t m, ddt_error *err);

/* Forget cached context: len = new_len (0 <= new_len <= len). */
ddt_status ddt_drafter_rollback(ddt_drafter *d, int32_t new_len, ddt_error *err);

/*
 * Draft one block after the cached context: bonus in [0, vocab).  logits
 * [L-1][vocab] (row stride vocab): row i-1 is block position i.  Needs nothing
 * committed beyond what was appended; the cache is left as it was.
 */
ddt_status ddt_drafter_draft(ddt_drafter *d, int32_t bonus, float *logits, ddt_error *err);

#endif
