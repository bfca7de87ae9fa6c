/*
 * moe.h — the DeepSeek-V3 router ("noaux_tc"), as HF DeepseekV3TopkRouter does it:
 *   s = sigmoid(logits) in fp32;  choice = s + e_score_correction_bias;
 *   group score = sum of the top-2 choice values of each of n_group equal groups,
 *   keep the topk_group best groups, then the top_k experts by choice among them;
 *   weight = s of the chosen expert (unbiased), divided by (sum + 1e-20) when
 *   norm_topk_prob, times routed_scaling_factor.
 * Ties go to the lower index, groups and experts alike.
 */
#ifndef DDT_BACKEND_CPU_MOE_H
#define DDT_BACKEND_CPU_MOE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/nn.h"

#define DDT_MOE_MAX_EXPERTS 4096

typedef struct ddt_moe_route_params {
    int32_t n_experts;          /* 1..DDT_MOE_MAX_EXPERTS */
    int32_t top_k;              /* 1..n_experts */
    int32_t n_group;            /* divides n_experts; 1 = no group limit */
    int32_t topk_group;         /* 1..n_group */
    bool norm_topk_prob;
    float routed_scaling_factor;
    const ddt_cpu_vec *bias;    /* e_score_correction_bias [n_experts], or NULL */
} ddt_moe_route_params;

/* For each of n tokens: idx[t][0..top_k) chosen experts in decreasing choice
 * score and w[t][..] their weights.  logits [n][n_experts] (row stride ld). */
void ddt_cpu_moe_route(const float *logits, int64_t ld, int64_t n, const ddt_moe_route_params *p,
                       int32_t *idx, float *w);

#endif
