/*
 * budget.c — the cost-aware budget of CaDDTree (arXiv 2606.01813).
 *
 * Each extra tree node raises the expected accepted length by its surrogate
 * probability but also the verify cost, which for MoE targets grows fast with
 * the node count (new experts are pulled in).  The builder keeps popping nodes
 * while the throughput theta(n) = (1 + Phi(n)) / (C_draft + C_verify(n, ctx))
 * rises.  C_verify comes from a measured table; between measured points it is
 * interpolated linearly in the node count and in the context length (clamped at
 * the table's ends), which keeps a convex table convex.
 */
#include <math.h>

#include "core/detmath.h"
#include "core/error.h"
#include "ddtree.h"

#define COST_MAX_POINTS 64

static ddt_status check_axis(const float *v, int32_t n, const char *name, ddt_error *err) {
    if (n < 1 || n > COST_MAX_POINTS)
        return ddt_fail(err, DDT_ERR_INVALID, "cost model: %s has %d points, must be 1..%d", name,
                        n, COST_MAX_POINTS);
    if (!v) return ddt_fail(err, DDT_ERR_INVALID, "cost model: %s is missing", name);
    for (int32_t i = 0; i < n; i++) {
        if (!isfinite(v[i]) || v[i] < 0.0f)
            return ddt_fail(err, DDT_ERR_INVALID, "cost model: %s[%d] = %g must be finite and >= 0",
                            name, i, (double)v[i]);
        if (i > 0 && !(v[i] > v[i - 1]))
            return ddt_fail(err, DDT_ERR_INVALID,
                            "cost model: %s must be strictly increasing ([%d] = %g after %g)", name,
                            i, (double)v[i], (double)v[i - 1]);
    }
    return DDT_OK;
}

ddt_status ddt_cost_check(const ddt_cost_model *c, ddt_error *err) {
    if (!c) return ddt_fail(err, DDT_ERR_INVALID, "cost model is NULL");
    if (!isfinite(c->draft) || c->draft < 0.0f)
        return ddt_fail(err, DDT_ERR_INVALID, "cost model: draft cost %g must be finite and >= 0",
                        (double)c->draft);
    ddt_status st = check_axis(c->nodes, c->n_nodes, "nodes", err);
    if (st) return st;
    if (c->n_contexts != 1 || c->contexts) {
        st = check_axis(c->contexts, c->n_contexts, "contexts", err);
        if (st) return st;
    }
    if (!c->verify) return ddt_fail(err, DDT_ERR_INVALID, "cost model: verify table is missing");
    for (int32_t j = 0; j < c->n_contexts; j++)
        for (int32_t i = 0; i < c->n_nodes; i++) {
            float v = c->verify[j * c->n_nodes + i];
            if (!isfinite(v) || !(v > 0.0f))
                return ddt_fail(err, DDT_ERR_INVALID,
                                "cost model: verify[%d][%d] = %g must be finite and > 0", j, i,
                                (double)v);
        }
    if (!isfinite(c->context_len) || c->context_len < 0.0f)
        return ddt_fail(err, DDT_ERR_INVALID, "cost model: context_len %g must be finite and >= 0",
                        (double)c->context_len);
    return DDT_OK;
}

/* Index i and fraction f with x between axis[i] and axis[i+1] (clamped). */
static void bracket(const float *axis, int32_t n, float x, int32_t *i, float *f) {
    if (n == 1 || x <= axis[0]) {
        *i = 0;
        *f = 0.0f;
        return;
    }
    if (x >= axis[n - 1]) {
        *i = n - 2;
        *f = 1.0f;
        return;
    }
    int32_t k = 0;
    while (x > axis[k + 1]) k++;
    *i = k;
    *f = (x - axis[k]) / (axis[k + 1] - axis[k]);
}

static float interp_row(const ddt_cost_model *c, int32_t row, float n) {
    int32_t i;
    float f;
    bracket(c->nodes, c->n_nodes, n, &i, &f);
    const float *v = c->verify + row * c->n_nodes;
    if (c->n_nodes == 1) return v[0];
    return v[i] + f * (v[i + 1] - v[i]);
}

float ddt_cost_verify(const ddt_cost_model *c, float n) {
    if (c->n_contexts == 1) return interp_row(c, 0, n);
    int32_t j;
    float f;
    bracket(c->contexts, c->n_contexts, c->context_len, &j, &f);
    float a = interp_row(c, j, n), b = interp_row(c, j + 1, n);
    return a + f * (b - a);
}

float ddt_cost_theta(const ddt_cost_model *c, float n, float phi) {
    return (1.0f + phi) / (c->draft + ddt_cost_verify(c, n));
}

int32_t ddt_cost_bucket_cut(const float *logw, int32_t n, const float *vcost, float draft, const int32_t *bucket,
                            int32_t n_buckets, int32_t *index) {
    double phi = 0.0, best = 0.0;
    int32_t have = 0, keep = 1, bj = 0; /* nodes after the root summed into phi so far */
    for (int32_t j = 0; j < n_buckets; j++) {
        const int32_t m = bucket[j] < n - 1 ? bucket[j] : n - 1;
        for (; have < m; have++) phi = phi + (double)ddt_exp_det(logw[have + 1]);
        const double th = (1.0 + phi) / ((double)draft + (double)vcost[bucket[j]]);
        if (j == 0 || th > best) {
            best = th;
            keep = m + 1;
            bj = j;
        }
    }
    if (index) *index = bj;
    return keep;
}
