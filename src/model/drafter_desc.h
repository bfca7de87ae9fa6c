/*
 * drafter_desc.h — what the CPU and the CUDA DFlash drafters share before any
 * backend state exists: the dimensions every step reads, filled once from the
 * drafter config (ddt_drafter_dims).
 */
#ifndef DDT_MODEL_DRAFTER_DESC_H
#define DDT_MODEL_DRAFTER_DESC_H

#include <stdint.h>

#include "backend/cpu/nn.h"
#include "io/safetensors.h"
#include "model/drafter.h"

typedef struct ddt_drafter_dims {
    int32_t H;        /* hidden_size (= the target's) */
    int32_t heads;    /* num_attention_heads */
    int32_t kv_heads; /* num_key_value_heads (divides heads) */
    int32_t hd;       /* head_dim (even) */
    int32_t qd;       /* heads * hd: the query / attention-output width */
    int32_t kvd;      /* kv_heads * hd: one cache row of K or of V */
    int32_t inter;    /* intermediate_size */
    int32_t L;        /* block_size */
    int32_t n_tl;     /* n_target_layers: feature layers taken from the target */
    int32_t F;        /* n_tl * H: one token's feature row */
    int32_t n_layers; /* num_hidden_layers */
    float eps;        /* rms_norm_eps */
    float scale;      /* attention softmax scale hd^-0.5 */
} ddt_drafter_dims;

/* Fill *d from c; no checks (ddt_drafter_config_parse made them). */
void ddt_drafter_dims_fill(const ddt_drafter_config *c, ddt_drafter_dims *d);

/* One decoder layer's weight views (Qwen3 names under "[model.]layers.<l>."). */
typedef struct ddt_drafter_layer {
    ddt_cpu_vec attn_norm;  /* [H] input_layernorm */
    ddt_cpu_vec mlp_norm;   /* [H] post_attention_layernorm */
    ddt_qweight q_proj;     /* [heads*hd][H] */
    ddt_qweight k_proj;     /* [kv_heads*hd][H] */
    ddt_qweight v_proj;     /* [kv_heads*hd][H] */
    ddt_qweight o_proj;     /* [H][heads*hd] */
    ddt_cpu_vec q_norm;     /* [hd] */
    ddt_cpu_vec k_norm;     /* [hd] */
    ddt_qweight gate;       /* [inter][H] */
    ddt_qweight up;         /* [inter][H] */
    ddt_qweight down;       /* [H][inter] */
} ddt_drafter_layer;

typedef struct ddt_drafter_desc {
    ddt_drafter_config cfg;
    ddt_drafter_dims dims;
    ddt_checkpoint *ck;          /* owned: every view below points into its mapping */
    char prefix[8];              /* "" or "model." */
    ddt_qweight fc;              /* [H][F] */
    ddt_cpu_vec hidden_norm;     /* [H] */
    ddt_cpu_vec final_norm;      /* [H] */
    ddt_drafter_layer *layers;   /* [n_layers] */
} ddt_drafter_desc;

/*
 * Describe the drafter in folder `dir` for `target` (only its sizes and the
 * embed / lm_head shapes are read: host or device weights alike): config,
 * the config against the target, every tensor's presence, dtype and shape, no
 * tensor beyond the config's layers and no bias.  Errors name the file and the
 * tensor or field (the caller adds the folder).  ddt_drafter_desc_free *d
 * whatever the result.
 */
ddt_status ddt_drafter_desc_load(const char *dir, const ddt_drafter_target *target, ddt_drafter_desc *d,
                                 ddt_error *err);
void ddt_drafter_desc_free(ddt_drafter_desc *d);

/* What a GPU that runs the drafter holds at least (the `also` of model/shard.h's
 * ddt_shard_memory_check): its own weights as stored (values and scales; the
 * embedding and LM head are the target's), and its K / V cache, every layer's rows
 * of fp32 for max_ctx positions and one block (drafter_cuda.c). */
uint64_t ddt_drafter_desc_weight_bytes(const ddt_drafter_desc *d);
uint64_t ddt_drafter_desc_cache_bytes(const ddt_drafter_desc *d, int64_t max_ctx);

#endif
