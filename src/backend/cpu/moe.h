/*
 * moe.h — the DeepSeek-V3 mixture of experts on the CPU: the router and the
 * routed experts (CPU twins of backend/cuda/moe_cuda.h; the shared expert is a
 * plain MLP, nn.h).
 *
 * The router ("noaux_tc"), as HF DeepseekV3TopkRouter does it:
 *   s = sigmoid(logits) in fp32;  choice = s + e_score_correction_bias;
 *   group score = sum of the top-2 choice values of each of n_group equal groups,
 *   keep the topk_group best groups, then the top_k experts by choice among them;
 *   weight = s of the chosen expert (unbiased), divided by (sum + 1e-20) when
 *   norm_topk_prob, times routed_scaling_factor.
 * Ties go to the lower index, groups and experts alike.  The parameters
 * (ddt_moe_route_params, one struct for both backends) are in backend/moe_route.h.
 */
#ifndef DDT_BACKEND_CPU_MOE_H
#define DDT_BACKEND_CPU_MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/nn.h"
#include "backend/moe_route.h"

/* For each of n tokens: idx[t][0..top_k) chosen experts in decreasing choice
 * score and w[t][..] their weights.  logits [n][n_experts] (row stride ld). */
void ddt_cpu_moe_route(const float *logits, int64_t ld, int64_t n, const ddt_moe_route_params *p,
                       int32_t *idx, float *w);

/* The routed experts of one MoE layer (borrowed views; every expert's gate.rows
 * is inter). */
typedef struct ddt_cpu_moe_layer {
    int32_t n_experts, hidden, inter;
    const ddt_cpu_mlp *experts; /* [n_experts] */
} ddt_cpu_moe_layer;

/* Workspace bytes of ddt_cpu_moe_experts for up to max_tokens tokens with top_k
 * experts each (grows with max_tokens, so a workspace sized for the most tokens a
 * forward holds serves every smaller call). */
size_t ddt_cpu_moe_workspace_bytes(const ddt_cpu_moe_layer *m, int32_t max_tokens, int32_t top_k);

/*
 * out[t] = sum over the token's top_k experts e (increasing e, starting from 0.0f,
 * acc += w * y as one fp32 multiply then an add) of w[t][k] * mlp_e(x[t]).
 * x [n][hidden] (row stride ldx), idx / w [n][top_k] from ddt_cpu_moe_route,
 * out [n][hidden] (row stride ldo, must not alias x), workspace at least
 * ddt_cpu_moe_workspace_bytes(m, n, top_k) bytes, aligned as malloc's.
 *
 * The tokens of an expert are gathered (in increasing token order) and run as one
 * batch, so each touched expert's weights are read once; a row's result does not
 * depend on the batch (nn.h), so a token's output is the same alone or with others.
 * An expert index outside 0..n_experts-1 makes its token's row NaN (as the GPU's
 * ddt_cuda_moe_experts does) and leaves the other tokens alone.  Nothing allocates.
 */
void ddt_cpu_moe_experts(ddt_cpu_pool *pool, const ddt_cpu_moe_layer *m, const float *x, int64_t ldx, int32_t n,
                         const int32_t *idx, const float *w, int32_t top_k, float *out, int64_t ldo,
                         void *workspace);

#endif
