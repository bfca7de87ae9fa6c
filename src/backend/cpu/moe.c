/*
 * moe.c — sigmoid router with group-limited top-k (see moe.h).  Single-threaded:
 * it is O(tokens x experts x top_k), negligible next to the expert matmuls.
 */
#include "backend/cpu/moe.h"

#include <math.h>

#include "backend/cpu/qmatmul.h"

void ddt_cpu_moe_route(const float *logits, int64_t ld, int64_t n, const ddt_moe_route_params *p,
                       int32_t *idx, float *w) {
    float s[DDT_MOE_MAX_EXPERTS], choice[DDT_MOE_MAX_EXPERTS];
    float gscore[DDT_MOE_MAX_EXPERTS];
    unsigned char gkeep[DDT_MOE_MAX_EXPERTS], taken[DDT_MOE_MAX_EXPERTS];
    const int32_t E = p->n_experts, G = p->n_group > 0 ? p->n_group : 1, per = E / G;
    for (int64_t t = 0; t < n; t++) {
        const float *lg = logits + t * ld;
        for (int32_t e = 0; e < E; e++) {
            s[e] = 1.0f / (1.0f + expf(-lg[e]));
            choice[e] = p->bias ? s[e] + ddt_cpu_vec_at(p->bias->data, p->bias->dtype, e) : s[e];
            taken[e] = 0;
        }
        for (int32_t g = 0; g < G; g++) {
            /* top-2 of the group (one value when a group has one expert) */
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int32_t e = g * per; e < (g + 1) * per; e++) {
                if (choice[e] > b1) {
                    b2 = b1;
                    b1 = choice[e];
                } else if (choice[e] > b2) {
                    b2 = choice[e];
                }
            }
            gscore[g] = per >= 2 ? b1 + b2 : b1;
            gkeep[g] = 0;
        }
        int32_t keep = p->topk_group > 0 && p->topk_group < G ? p->topk_group : G;
        for (int32_t k = 0; k < keep; k++) {
            int32_t best = -1;
            for (int32_t g = 0; g < G; g++)
                if (!gkeep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
            gkeep[best] = 1;
        }
        float sum = 0.0f;
        int32_t *it = idx + t * p->top_k;
        float *wt = w + t * p->top_k;
        for (int32_t k = 0; k < p->top_k; k++) {
            int32_t best = -1;
            for (int32_t e = 0; e < E; e++) {
                if (taken[e] || !gkeep[e / per]) continue;
                if (best < 0 || choice[e] > choice[best]) best = e;
            }
            /* top_k <= experts in kept groups is checked at load; keep a defined value anyway */
            if (best < 0) best = 0;
            taken[best] = 1;
            it[k] = best;
            wt[k] = s[best];
            sum += s[best];
        }
        float denom = sum + 1e-20f;
        for (int32_t k = 0; k < p->top_k; k++) {
            if (p->norm_topk_prob) wt[k] /= denom;
            wt[k] *= p->routed_scaling_factor;
        }
    }
}
