/*
 * round.c — see round.h.
 */
#include "engine/round.h"

#include "core/error.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

_Static_assert(DDT_MAX_BUDGET <= 1024, "DDT_ENGINE_COST_POINTS = 26 holds the cost points of budgets up to 1024");

double ddt_engine_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int32_t ddt_engine_topk_cap(int32_t budget, int32_t vocab) {
    int32_t k = budget < vocab ? budget : vocab;
    if (k > DDT_MAX_TOPK) k = DDT_MAX_TOPK;
    return k < 1 ? 1 : k;
}

int32_t ddt_engine_round_nodes(ddt_mode mode, int32_t budget, int32_t depth, int32_t room, int32_t kmax,
                               int32_t *k) {
    int32_t nodes = mode == DDT_MODE_TREE ? budget : depth;
    if (nodes > room) nodes = room;
    int32_t kk = mode == DDT_MODE_TREE ? (nodes < kmax ? nodes : kmax) : 1;
    *k = kk < 1 ? 1 : kk;
    return nodes;
}

/* The point after n: doubling up to 8, then three a power of two, p, 1.25 p and 1.5 p
 * (8 10 12 16 20 24 32 40 48 64 ...).  The auto budget picks its trees among these
 * sizes (the GPU verifies at them), and a small model's verify cost is flat over a
 * stretch and then steps up (the shipped pair on an H100: rounds of 9..21 rows cost
 * the same, 25 rows 7% more); with octaves only, the picks jumped from 16 to 32 and
 * never reached the best fixed budget, 20. */
static int32_t next_cost_point(int32_t n) {
    if (n < 8) return n ? 2 * n : 1;
    int32_t p = 8;
    while (2 * p <= n) p *= 2;
    if (n < p + p / 4) return p + p / 4;
    if (n < p + p / 2) return p + p / 2;
    return 2 * p;
}

int32_t ddt_engine_cost_points(int32_t budget, float *nodes, int32_t max_points) {
    int32_t pts = 0;
    for (int32_t n = 0; n <= budget && pts < max_points; n = next_cost_point(n)) {
        nodes[pts++] = (float)n;
        if (pts < max_points && next_cost_point(n) > budget && n != budget) {
            nodes[pts++] = (float)budget;
            break;
        }
    }
    return pts;
}

/* The best of DDT_ENGINE_COST_REPS runs after a warm-up. */
static ddt_status best_of(ddt_cost_timer_fn timer, void *ctx, int32_t n, double *best, ddt_error *err) {
    *best = 1e30;
    for (int rep = 0; rep <= DDT_ENGINE_COST_REPS; rep++) {
        double dt;
        ddt_status st = timer(ctx, n, &dt, err);
        if (st) return st;
        if (rep > 0 && dt < *best) *best = dt; /* rep 0 warms up */
    }
    return DDT_OK;
}

ddt_status ddt_engine_measure_cost(int32_t budget, ddt_cost_timer_fn forward, ddt_cost_timer_fn draft,
                                   void *ctx, float *nodes, float *verify, ddt_cost_model *out, ddt_error *err) {
    const int32_t pts = ddt_engine_cost_points(budget, nodes, DDT_ENGINE_COST_POINTS);
    /* two sweeps, the second kept: the first ones after a load ran up to 3x slow on the
       CPU (the smallest sizes, measured first, most: caches, clocks), which made an ar
       step look 2.7x dearer than it is */
    for (int sweep = 0; sweep < 2; sweep++)
        for (int32_t p = 0; p < pts; p++) {
            double best;
            ddt_status st = best_of(forward, ctx, (int32_t)nodes[p] + 1, &best, err);
            if (st) return st;
            verify[p] = (float)(best > 1e-7 ? best : 1e-7);
            if (p > 0 && verify[p] < verify[p - 1]) verify[p] = verify[p - 1];
        }
    double d = 0.0;
    if (draft) {
        ddt_status st = best_of(draft, ctx, 0, &d, err);
        if (st) return st;
    }
    *out = (ddt_cost_model){(float)d, pts, nodes, 1, NULL, verify, 0.0f};
    return ddt_cost_check(out, err);
}

void ddt_engine_adopt_cost(const ddt_cost_model *given, float *nodes, float *verify, ddt_cost_model *out) {
    const int32_t n = given->n_nodes < DDT_ENGINE_COST_POINTS ? given->n_nodes : DDT_ENGINE_COST_POINTS;
    for (int32_t i = 0; i < n; i++) {
        nodes[i] = given->nodes[i];
        verify[i] = given->verify[i];
    }
    *out = *given;
    out->n_nodes = n;
    out->nodes = nodes;
    out->verify = verify;
    out->contexts = NULL; /* one context row: never read, and the caller's may go away */
}

void ddt_engine_cost_pack(const ddt_cost_model *c, bool source, float *buf) {
    for (int32_t i = 0; i < DDT_ENGINE_COST_WIRE; i++) buf[i] = 0.0f;
    if (!source) return;
    const int32_t n = c->n_nodes < DDT_ENGINE_COST_POINTS ? c->n_nodes : DDT_ENGINE_COST_POINTS;
    buf[0] = c->draft;
    buf[1] = (float)n; /* exact: at most DDT_ENGINE_COST_POINTS */
    for (int32_t i = 0; i < n; i++) {
        buf[2 + i] = c->nodes[i];
        buf[2 + DDT_ENGINE_COST_POINTS + i] = c->verify[i]; /* the one context row */
    }
}

ddt_status ddt_engine_cost_unpack(const float *buf, float *nodes, float *verify, ddt_cost_model *out,
                                  ddt_error *err) {
    const float fn = buf[1];
    if (!(fn >= 1.0f && fn <= (float)DDT_ENGINE_COST_POINTS) || fn != floorf(fn))
        return ddt_fail(err, DDT_ERR_INVALID, "shared cost table: point count %g is not 1..%d", (double)fn,
                        DDT_ENGINE_COST_POINTS);
    const int32_t n = (int32_t)fn;
    for (int32_t i = n; i < DDT_ENGINE_COST_POINTS; i++)
        if (buf[2 + i] != 0.0f || buf[2 + DDT_ENGINE_COST_POINTS + i] != 0.0f)
            return ddt_fail(err, DDT_ERR_INVALID, "shared cost table: entry %d past its %d points is not zero", i, n);
    const ddt_cost_model wire = {buf[0], n, buf + 2, 1, NULL, buf + 2 + DDT_ENGINE_COST_POINTS, 0.0f};
    ddt_engine_adopt_cost(&wire, nodes, verify, out); /* the tables copied out of buf */
    ddt_status st = ddt_cost_check(out, err);
    if (st) ddt_error_prefix(err, "shared cost table: ");
    return st;
}

void ddt_ar_fallback_start(ddt_ar_fallback *f, bool on) {
    f->on = on;
    /* the smoothing's weight on the past: 0.85 (was 0.75) lets a few poor rounds pass
       where greedy speculation still pays (bench_fallback_model under the H100's costs:
       T = 0 auto 1.85x -> 1.88x ar, tree 16 1.89x; T > 0 within the draws' noise);
       DDT_AR_FALLBACK_DECAY (0..1) overrides it, for measuring */
    const char *d = getenv("DDT_AR_FALLBACK_DECAY");
    const double v = d ? atof(d) : 0.0;
    f->decay = v > 0.0 && v < 1.0 ? v : 0.85;
    f->tau_avg = -1.0;
    f->hold = 0;
    f->backoff = DDT_AR_HOLD_MIN;
}

bool ddt_ar_fallback_step(ddt_ar_fallback *f) {
    if (f->hold <= 0) return false;
    f->hold--;
    return true;
}

void ddt_ar_fallback_after_round(ddt_ar_fallback *f, uint64_t round, int32_t accepted, int32_t nodes,
                                 const ddt_cost_model *c) {
    if (!f->on) return;
    /* a probe after a hold starts the average afresh: the text may have changed */
    const bool probe = round > 1 && f->tau_avg >= 0.0 && f->backoff > DDT_AR_HOLD_MIN;
    f->tau_avg = f->tau_avg < 0.0 || probe ? (double)accepted
                                              : f->decay * f->tau_avg + (1.0 - f->decay) * (double)accepted;
    const double spec = f->tau_avg / ((double)c->draft + (double)ddt_cost_verify(c, (float)(nodes - 1)));
    const double plain = 1.0 / (double)ddt_cost_verify(c, 0.0f);
    if (spec < plain) {
        const double scaled = (double)f->backoff * ceil(plain / spec);
        f->hold = scaled > DDT_AR_HOLD_MAX ? DDT_AR_HOLD_MAX : (int32_t)scaled;
        f->backoff = f->backoff * 2 > DDT_AR_HOLD_MAX ? DDT_AR_HOLD_MAX : f->backoff * 2;
    } else {
        f->backoff = DDT_AR_HOLD_MIN;
    }
}
