/*
 * drafter_config.h — config.json of a DFlash block-diffusion drafter
 * (model/drafter.h is the model), beside the target's config reader (config.h).
 *
 * Config keys read (top level unless noted; dflash_config wins where a key may
 * sit in both, as in the DFlash reference code): architectures (must contain
 * "DFlashDraftModel"), hidden_size, num_hidden_layers, num_attention_heads,
 * num_key_value_heads, head_dim, intermediate_size, rms_norm_eps, rope_theta and
 * rope_scaling (or transformers 5's rope_parameters), block_size,
 * dflash_config.mask_token_id, dflash_config.target_layer_ids, and, checked when
 * present: num_target_layers, vocab_size, hidden_act ("silu"), attention_bias
 * (false), partial_rotary_factor (1), layer_types (all "full_attention"),
 * use_sliding_window / is_causal (false), input_embedding_scale,
 * output_multiplier (1) and final_logit_softcapping (null/0).
 * RoPE is Qwen3's rotate_half over head_dim; rope_scaling may be null/"default"
 * or "yarn" (factor, original_max_position_embeddings, beta_fast, beta_slow,
 * mscale, mscale_all_dim, attention_factor; truncate must be true).
 *
 * Legacy YaRN attention factor: released Kimi drafters were trained with cos/sin
 * scaled by 0.1*ln(factor)+1 (1.416 for factor 64), while current transformers
 * computes 1.0 from their mscale == mscale_all_dim.  Setting
 * "dflash_config": {"legacy_yarn_attention_factor": true} forces 0.1*ln(factor)+1
 * whatever mscale/mscale_all_dim say (it cannot be combined with an explicit
 * rope_scaling.attention_factor).
 */
#ifndef DDT_IO_DRAFTER_CONFIG_H
#define DDT_IO_DRAFTER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddtree.h"

#define DDT_DRAFTER_MAX_TARGET_LAYERS 64 /* len(target_layer_ids) */
#define DDT_DRAFTER_MAX_HEAD_DIM 512
#define DDT_DRAFTER_MAX_BLOCK (DDT_MAX_DEPTH + 1)

/* The parsed config.json of a DFlash drafter. */
typedef struct ddt_drafter_config {
    int32_t hidden_size;
    int32_t num_hidden_layers;
    int32_t num_attention_heads;
    int32_t num_key_value_heads;  /* divides num_attention_heads */
    int32_t head_dim;             /* even, <= DDT_DRAFTER_MAX_HEAD_DIM */
    int32_t intermediate_size;
    float rms_norm_eps;
    int32_t block_size;           /* L, 2..DDT_DRAFTER_MAX_BLOCK */
    int32_t mask_token_id;        /* >= 0; < the target's vocab (checked at load) */
    int32_t n_target_layers;      /* len(target_layer_ids), 1..DDT_DRAFTER_MAX_TARGET_LAYERS */
    int32_t target_layer_ids[DDT_DRAFTER_MAX_TARGET_LAYERS]; /* target layers whose outputs are the features */
    int32_t num_target_layers;    /* -1 when absent; else must equal the target's layer count */
    int32_t vocab_size;           /* -1 when absent; else must equal the target's vocab */
    float rope_theta;
    bool has_yarn;
    float yarn_factor;
    float yarn_original_max_position;
    float yarn_beta_fast;         /* 0 = default 32 */
    float yarn_beta_slow;         /* 0 = default 1 */
    float yarn_mscale;            /* 0 = absent */
    float yarn_mscale_all_dim;    /* 0 = absent */
    float yarn_attention_factor;  /* 0 = absent (derived from mscale or the legacy rule) */
    bool legacy_yarn_attention_factor; /* dflash_config.legacy_yarn_attention_factor */
} ddt_drafter_config;

/* Parse config.json text; `where` names the file in messages.  Nothing to free. */
ddt_status ddt_drafter_config_parse(const char *text, size_t len, const char *where, ddt_drafter_config *cfg,
                                    ddt_error *err);
/* Read and parse `path`: a config.json or the drafter folder holding one. */
ddt_status ddt_drafter_config_load(const char *path, ddt_drafter_config *cfg, ddt_error *err);

#endif
