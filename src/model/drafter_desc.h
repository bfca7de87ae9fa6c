/*
 * drafter_desc.h — what the CPU and the CUDA DFlash drafters share before any
 * backend state exists: the dimensions every step reads, filled once from the
 * drafter config (ddt_drafter_dims).
 */
#ifndef DDT_MODEL_DRAFTER_DESC_H
#define DDT_MODEL_DRAFTER_DESC_H

#include <stdint.h>

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

#endif
