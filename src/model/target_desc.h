/*
 * target_desc.h — what the CPU and the CUDA targets share before any backend
 * state exists: the dimensions every forward reads, filled once from the
 * config (ddt_target_dims).
 */
#ifndef DDT_MODEL_TARGET_DESC_H
#define DDT_MODEL_TARGET_DESC_H

#include <stdbool.h>
#include <stdint.h>

#include "io/config.h"

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

#endif
