/*
 * moe.c — sigmoid router with group-limited top-k, and the routed experts grouped
 * by expert (see moe.h).  The router is single-threaded: it is O(tokens x experts
 * x top_k), negligible next to the expert matmuls, which use the pool.
 */
#include "backend/cpu/moe.h"

#include <math.h>
#include <string.h>

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
            choice[e] = p->bias ? s[e] + p->bias[e] : s[e];
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

/* ------------------------------------------------------------------ experts */

/* The workspace of ddt_cpu_moe_experts for n tokens, carved in this order, each
 * part starting on a 64-byte boundary. */
typedef struct moe_work {
    int32_t *start; /* [n_experts + 1] first entry of each expert, then the end */
    int32_t *tok;   /* [n * top_k] token of each (expert, slot) entry, grouped by expert */
    float *wt;      /* [n * top_k] its weight */
    float *gx;      /* [n][hidden] the tokens of one expert, gathered */
    float *y;       /* [n][hidden] that expert's output rows */
    float *g, *u;   /* [n][inter] the MLP's scratch */
} moe_work;

static size_t round64(size_t b) { return (b + 63) & ~(size_t)63; }

/* Bytes of each part in moe_work order; returns the total. */
static size_t work_parts(const ddt_cpu_moe_layer *m, int32_t n, int32_t top_k, size_t part[7]) {
    const size_t nk = (size_t)n * (size_t)top_k, nh = (size_t)n * (size_t)m->hidden;
    const size_t ni = (size_t)n * (size_t)m->inter;
    part[0] = round64(sizeof(int32_t) * ((size_t)m->n_experts + 1));
    part[1] = round64(sizeof(int32_t) * nk);
    part[2] = round64(sizeof(float) * nk);
    part[3] = part[4] = round64(sizeof(float) * nh);
    part[5] = part[6] = round64(sizeof(float) * ni);
    size_t total = 0;
    for (int i = 0; i < 7; i++) total += part[i];
    return total;
}

size_t ddt_cpu_moe_workspace_bytes(const ddt_cpu_moe_layer *m, int32_t max_tokens, int32_t top_k) {
    size_t part[7];
    return work_parts(m, max_tokens, top_k, part);
}

static moe_work work_carve(const ddt_cpu_moe_layer *m, int32_t n, int32_t top_k, void *workspace) {
    size_t part[7];
    work_parts(m, n, top_k, part);
    char *p = workspace;
    moe_work w;
    w.start = (int32_t *)p, p += part[0];
    w.tok = (int32_t *)p, p += part[1];
    w.wt = (float *)p, p += part[2];
    w.gx = (float *)p, p += part[3];
    w.y = (float *)p, p += part[4];
    w.g = (float *)p, p += part[5];
    w.u = (float *)p;
    return w;
}

void ddt_cpu_moe_experts(ddt_cpu_pool *pool, const ddt_cpu_moe_layer *m, const float *x, int64_t ldx, int32_t n,
                         const int32_t *idx, const float *w, int32_t top_k, float *out, int64_t ldo,
                         void *workspace) {
    const int32_t E = m->n_experts, H = m->hidden, K = top_k;
    moe_work ws = work_carve(m, n, K, workspace);
    /* Bucket (token, weight) entries by expert, tokens in increasing order: count,
     * prefix-sum, place each at start[e]++ (which ends at the next expert's start),
     * then shift the starts back.  Indices outside the layer are left out here and
     * flagged below. */
    memset(ws.start, 0, sizeof(int32_t) * ((size_t)E + 1));
    for (int32_t i = 0; i < n * K; i++)
        if (idx[i] >= 0 && idx[i] < E) ws.start[idx[i] + 1]++;
    for (int32_t e = 0; e < E; e++) ws.start[e + 1] += ws.start[e];
    for (int32_t i = 0; i < n * K; i++) {
        if (idx[i] < 0 || idx[i] >= E) continue;
        int32_t slot = ws.start[idx[i]]++;
        ws.tok[slot] = i / K;
        ws.wt[slot] = w[i];
    }
    for (int32_t e = E; e > 0; e--) ws.start[e] = ws.start[e - 1];
    ws.start[0] = 0;
    for (int32_t t = 0; t < n; t++) memset(out + (size_t)t * ldo, 0, sizeof(float) * (size_t)H);
    /* Experts in increasing index order, as HF accumulates them. */
    for (int32_t e = 0; e < E; e++) {
        const int32_t b = ws.start[e], cnt = ws.start[e + 1] - b;
        if (cnt == 0) continue;
        for (int32_t j = 0; j < cnt; j++)
            memcpy(ws.gx + (size_t)j * H, x + (size_t)ws.tok[b + j] * ldx, sizeof(float) * H);
        ddt_cpu_mlp_forward(pool, &m->experts[e], ws.gx, H, cnt, ws.g, ws.u, ws.y, H);
        for (int32_t j = 0; j < cnt; j++) {
            const float wj = ws.wt[b + j];
            float *dst = out + (size_t)ws.tok[b + j] * ldo;
            const float *src = ws.y + (size_t)j * H;
            for (int32_t d = 0; d < H; d++) dst[d] += wj * src[d];
        }
    }
    for (int32_t i = 0; i < n * K; i++) {
        if (idx[i] >= 0 && idx[i] < E) continue;
        float *row = out + (size_t)(i / K) * ldo;
        for (int32_t d = 0; d < H; d++) row[d] = NAN;
    }
}
