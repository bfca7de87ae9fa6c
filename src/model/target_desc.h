/*
 * target_desc.h — what the CPU and the CUDA targets share before any backend
 * state exists: the dimensions every forward reads, filled once from the
 * config (ddt_target_dims).
 */
#ifndef DDT_MODEL_TARGET_DESC_H
#define DDT_MODEL_TARGET_DESC_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/nn.h"
#include "backend/cpu/rope.h"
#include "backend/moe_route.h"
#include "io/config.h"
#include "io/safetensors.h"

#define DDT_TARGET_MAX_CAPTURE 64 /* hidden-state capture layers per target */

/* Sizes and constants of a DeepSeek-V3 target, from its config.  A sharded CUDA
 * target overwrites heads with its rank's own count (model/shard.h). */
typedef struct ddt_target_dims {
    int32_t hidden;       /* hidden_size */
    int32_t heads;        /* num_attention_heads */
    int32_t nope;         /* qk_nope_head_dim */
    int32_t rope;         /* qk_rope_head_dim (even) */
    int32_t vdim;         /* v_head_dim */
    int32_t rank;         /* kv_lora_rank: the latent width; a cache row is rank + rope */
    int32_t qdim;         /* nope + rope: one head's query */
    int32_t q_lora;       /* q_lora_rank; 0 = one q_proj [heads*qdim][hidden] */
    int32_t vocab;        /* vocab_size */
    int32_t n_layers;     /* num_hidden_layers */
    int32_t n_experts;    /* n_routed_experts when some layer is MoE, else 0 */
    int32_t top_k;        /* num_experts_per_tok when some layer is MoE, else 0 */
    int32_t inter_max;    /* widest MLP of any layer (dense, or moe_intermediate_size x
                             max(1, n_shared_experts)), >= 1 */
    float eps;            /* rms_norm_eps (the latent norms use 1e-6 whatever it says) */
    float softmax_scale;  /* ddt_config_softmax_scale */
} ddt_target_dims;

/* Fill *d from c; no checks (the config reader and the description check). */
void ddt_target_dims_fill(const ddt_model_config *c, ddt_target_dims *d);

/* The weight views of one decoder layer (borrowed from the checkpoint mapping):
 * the CPU target runs on them, the CUDA target uploads them.  An MLP's three
 * views are a ddt_cpu_mlp (backend/cpu/nn.h), the struct the CPU's MLP and
 * routed-expert ops take. */

typedef struct ddt_target_layer {
    ddt_cpu_vec attn_norm;   /* [hidden] input_layernorm */
    ddt_cpu_vec mlp_norm;    /* [hidden] post_attention_layernorm */
    ddt_qweight q_proj;      /* [heads*(nope+rope)][hidden], when q_lora_rank == 0 */
    ddt_qweight q_a;         /* [q_lora][hidden] */
    ddt_cpu_vec q_a_norm;    /* [q_lora] */
    ddt_qweight q_b;         /* [heads*(nope+rope)][q_lora] */
    ddt_qweight kv_a;        /* [rank+rope][hidden] kv_a_proj_with_mqa */
    ddt_cpu_vec kv_a_norm;   /* [rank] */
    ddt_qweight kv_b;        /* [heads*(nope+v)][rank]: per head W_UK [nope][rank] then W_UV [v][rank] */
    ddt_qweight o_proj;      /* [hidden][heads*v] */
    bool moe;
    ddt_cpu_mlp mlp;         /* dense MLP (inter = intermediate_size) */
    ddt_qweight router;      /* [experts][hidden] mlp.gate */
    ddt_cpu_vec router_bias; /* [experts] e_score_correction_bias */
    ddt_cpu_mlp *experts;    /* [experts] (inter = moe_intermediate_size) */
    bool has_shared;
    ddt_cpu_mlp shared;      /* inter = moe_intermediate_size * n_shared_experts */
} ddt_target_layer;

/* The description of one checkpoint folder. */
typedef struct ddt_target_desc {
    ddt_model_config cfg;       /* owned */
    ddt_target_dims dims;
    ddt_checkpoint *ck;         /* owned: every view below points into its mapping */
    ddt_qweight embed;          /* [vocab][hidden] model.embed_tokens */
    ddt_cpu_vec final_norm;     /* [hidden] model.norm */
    ddt_qweight lm_head;        /* [vocab][hidden] lm_head (the embedding when tied) */
    ddt_target_layer *layers;   /* [n_layers] */
    uint64_t weight_bytes;      /* every weight the model reads, as stored (quantised bytes + scales) */
    uint64_t routed_bytes;      /* of which routed experts */
    uint64_t embed_bytes;       /* of which the embedding table */
    int32_t expert_layout;      /* loader state: the routed-expert layout of the MoE layers so far */
    int32_t expert_layout_layer; /* and the last of them, for messages */
} ddt_target_desc;

/* Options' capture list: 0..DDT_TARGET_MAX_CAPTURE layer ids, not NULL when n > 0
 * (the ids are checked against the config by ddt_target_desc_load). */
ddt_status ddt_target_capture_check(const int32_t *capture_layers, int32_t n_capture, ddt_error *err);

/* Describe folder `dir` (config.json + safetensors): config checks, each capture
 * layer id in 0..num_hidden_layers-1, then every weight's presence, dtype, shape
 * and format.  Errors name the file and tensor (the caller adds the folder).  On
 * failure *d holds what was made so far: ddt_target_desc_free it either way. */
ddt_status ddt_target_desc_load(const char *dir, const int32_t *capture_layers, int32_t n_capture,
                                ddt_target_desc *d, ddt_error *err);
void ddt_target_desc_free(ddt_target_desc *d);

/* The router's parameters of a config for both backends, bias NULL: each
 * backend points it at its fp32 copy of the layer's bias.  n_experts and top_k
 * from d (the router's global count, sharded or not). */
ddt_moe_route_params ddt_target_route_params(const ddt_model_config *c, const ddt_target_dims *d);

/* The RoPE parameters of a config, and its cos/sin (attention factor applied)
 * for positions pos0..pos0+n-1: [n][qk_rope_head_dim / 2] each, the values the
 * CPU forward uses. */
ddt_rope_params ddt_target_rope_params(const ddt_model_config *c);
ddt_status ddt_target_rope_table(const ddt_model_config *c, int32_t pos0, int32_t n, float *cos_out,
                                 float *sin_out, ddt_error *err);

#endif
