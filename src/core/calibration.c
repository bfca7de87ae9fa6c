/*
 * calibration.c — the draft calibration's application, fit data and fit (see
 * calibration.h).
 */
#include "core/calibration.h"

#include <math.h>
#include <string.h>

#include "core/error.h"

#define CAL_BIN_LO (-16.0)
#define CAL_BIN_STEP 0.1
#define CAL_RIDGE 1.0 /* pull toward the identity, in cells: negligible beside thousands of them */
#define CAL_MAX_ITER 100

void ddt_cal_identity(ddt_draft_calibration *c) {
    memset(c, 0, sizeof *c);
    for (int b = 0; b < DDT_CAL_BUCKETS; b++) {
        c->w[b][0] = 0.0f;
        c->w[b][1] = 1.0f;
        c->w[b][2] = 0.0f;
    }
}

ddt_status ddt_cal_check(const ddt_draft_calibration *c, ddt_error *err) {
    static const char *names[DDT_CAL_BUCKETS] = {"rank 0", "rank 1", "ranks 2-3", "ranks 4-7", "ranks 8+"};
    for (int b = 0; b < DDT_CAL_BUCKETS; b++) {
        for (int f = 0; f < DDT_CAL_FEATURES; f++) {
            const float v = c->w[b][f];
            if (!isfinite(v) || fabsf(v) > 100.0f)
                return ddt_fail(err, DDT_ERR_RANGE, "draft calibration: bucket %d (%s) weight %d = %g is not a finite "
                                "number within +-100", b, names[b], f, (double)v);
        }
        if (!(c->w[b][1] > 0.0f))
            return ddt_fail(err, DDT_ERR_RANGE, "draft calibration: bucket %d (%s) weight 1 = %g must be > 0 (the "
                            "acceptance must grow with the drafter's probability)", b, names[b], (double)c->w[b][1]);
    }
    if (c->lookup != 0 && c->lookup != 1)
        return ddt_fail(err, DDT_ERR_RANGE, "draft calibration: lookup flag %d is neither 0 nor 1", (int)c->lookup);
    if (!c->lookup) return DDT_OK;
    for (int m = 0; m < DDT_CAL_LOOKUP_LENS; m++)
        if (!(c->lookup_first[m] > 0.0f && c->lookup_first[m] <= 1.0f))
            return ddt_fail(err, DDT_ERR_RANGE, "draft calibration: lookup first-token chance after a match of %d "
                            "tokens = %g is not in (0, 1]", m + DDT_LOOKUP_MIN, (double)c->lookup_first[m]);
    if (!(c->lookup_next > 0.0f && c->lookup_next <= 1.0f))
        return ddt_fail(err, DDT_ERR_RANGE, "draft calibration: lookup next-token chance %g is not in (0, 1]",
                        (double)c->lookup_next);
    return DDT_OK;
}

void ddt_cal_apply(const ddt_draft_calibration *c, float *logq, int32_t depth, int32_t k, int32_t ld) {
    for (int32_t d = 0; d < depth; d++) {
        float *row = logq + (size_t)d * (size_t)ld;
        float run = 0.0f;
        for (int32_t r = 0; r < k; r++) {
            float v = ddt_cal_cell(c, row[r], d, r);
            if (r == 0 || v < run) run = v;
            row[r] = run;
        }
    }
}

void ddt_cal_stats_clear(ddt_cal_stats *s) { memset(s, 0, sizeof *s); }

static int32_t cal_bin(float logit) {
    if (!(logit > (float)CAL_BIN_LO)) return 0; /* -inf and below the range */
    double i = floor(((double)logit - CAL_BIN_LO) / CAL_BIN_STEP + 0.5);
    return i >= DDT_CAL_BINS - 1 ? DDT_CAL_BINS - 1 : (int32_t)i;
}

void ddt_cal_stats_add_table(ddt_cal_stats *s, const float *logq, const int32_t *tok, int32_t depth, int32_t k,
                             const int32_t *next, int32_t n_next) {
    const int32_t kk = k < DDT_CAL_RANKS ? k : DDT_CAL_RANKS;
    s->tables++;
    for (int32_t d = 0; d < depth && d < n_next; d++) {
        const int32_t dr = d < DDT_CAL_ROW_CAP ? d : DDT_CAL_ROW_CAP;
        bool on_path = false;
        for (int32_t r = 0; r < kk; r++) {
            const size_t e = (size_t)d * (size_t)k + (size_t)r;
            const bool hit = tok[e] == next[d];
            const int32_t b = ddt_cal_bucket(r), i = cal_bin(ddt_cal_logit(logq[e]));
            s->n[b][dr][i] += 1.0;
            s->hit[b][dr][i] += hit ? 1.0 : 0.0;
            s->cells++;
            on_path |= hit;
        }
        if (!on_path) break;
    }
}

void ddt_cal_stats_add_lookup(ddt_cal_stats *s, int32_t match_len, const int32_t *proposal, int32_t len,
                              const int32_t *next, int32_t n_next) {
    if (match_len < DDT_LOOKUP_MIN || match_len > DDT_LOOKUP_MAX || len < 1 || n_next < 1) return;
    const int32_t m = match_len - DDT_LOOKUP_MIN;
    s->lookup_n[m] += 1.0;
    if (proposal[0] != next[0]) return;
    s->lookup_hit[m] += 1.0;
    for (int32_t j = 1; j < len && j < n_next; j++) {
        s->lookup_next_n += 1.0;
        if (proposal[j] != next[j]) return;
        s->lookup_next_hit += 1.0;
    }
}

static double sigmoid(double z) { return z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z)); }

/* log p and log(1 - p) for p = sigmoid(z), without cancellation. */
static void log_pq(double z, double *lp, double *lq) {
    const double l1 = log1p(exp(-fabs(z)));
    *lp = (z >= 0 ? 0.0 : z) - l1;
    *lq = (z >= 0 ? -z : 0.0) - l1;
}

/* Solve the 3x3 system a x = y by Gaussian elimination with partial pivoting;
 * false when singular. */
static bool solve3(double a[3][3], const double y[3], double x[3]) {
    double m[3][4];
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++) m[i][j] = a[i][j];
        m[i][3] = y[i];
    }
    for (int c = 0; c < 3; c++) {
        int p = c;
        for (int i = c + 1; i < 3; i++)
            if (fabs(m[i][c]) > fabs(m[p][c])) p = i;
        if (!(fabs(m[p][c]) > 1e-300)) return false;
        if (p != c)
            for (int j = 0; j < 4; j++) {
                double t = m[c][j];
                m[c][j] = m[p][j];
                m[p][j] = t;
            }
        for (int i = c + 1; i < 3; i++) {
            double f = m[i][c] / m[c][c];
            for (int j = c; j < 4; j++) m[i][j] -= f * m[c][j];
        }
    }
    for (int i = 2; i >= 0; i--) {
        double v = m[i][3];
        for (int j = i + 1; j < 3; j++) v -= m[i][j] * x[j];
        x[i] = v / m[i][i];
    }
    return true;
}

/* Mean log-likelihood of one bucket's cells under weights w. */
static double bucket_loglik(const ddt_cal_stats *s, int b, const double w[3], double cells) {
    double ll = 0.0;
    for (int d = 0; d <= DDT_CAL_ROW_CAP; d++) {
        const double df = (double)d / DDT_CAL_ROW_CAP;
        for (int i = 0; i < DDT_CAL_BINS; i++) {
            const double n = s->n[b][d][i];
            if (n == 0.0) continue;
            const double h = s->hit[b][d][i], x = CAL_BIN_LO + CAL_BIN_STEP * i;
            double lp, lq;
            log_pq(w[0] + w[1] * x + w[2] * df, &lp, &lq);
            ll += h * lp + (n - h) * lq;
        }
    }
    return cells > 0 ? ll / cells : 0.0;
}

static void fit_bucket(const ddt_cal_stats *s, int b, double w[3]) {
    static const double id[3] = {0.0, 1.0, 0.0};
    for (int it = 0; it < CAL_MAX_ITER; it++) {
        double g[3], h[3][3];
        for (int i = 0; i < 3; i++) {
            g[i] = CAL_RIDGE * (w[i] - id[i]);
            for (int j = 0; j < 3; j++) h[i][j] = i == j ? CAL_RIDGE : 0.0;
        }
        for (int d = 0; d <= DDT_CAL_ROW_CAP; d++) {
            const double df = (double)d / DDT_CAL_ROW_CAP;
            for (int i = 0; i < DDT_CAL_BINS; i++) {
                const double n = s->n[b][d][i];
                if (n == 0.0) continue;
                const double f[3] = {1.0, CAL_BIN_LO + CAL_BIN_STEP * i, df};
                const double p = sigmoid(w[0] + w[1] * f[1] + w[2] * f[2]);
                const double r = n * p - s->hit[b][d][i], v = n * p * (1.0 - p);
                for (int u = 0; u < 3; u++) {
                    g[u] += r * f[u];
                    for (int t = 0; t < 3; t++) h[u][t] += v * f[u] * f[t];
                }
            }
        }
        double step[3];
        if (!solve3(h, g, step)) return;
        double norm = sqrt(step[0] * step[0] + step[1] * step[1] + step[2] * step[2]);
        const double scale = norm > 4.0 ? 4.0 / norm : 1.0; /* a bounded step: never overshoot far */
        for (int i = 0; i < 3; i++) w[i] -= scale * step[i];
        if (norm * scale < 1e-10) break;
    }
}

ddt_status ddt_cal_fit(const ddt_cal_stats *s, ddt_draft_calibration *out, ddt_cal_fit_info *info, ddt_error *err) {
    ddt_cal_fit_info local;
    if (!info) info = &local;
    memset(info, 0, sizeof *info);
    int fitted = 0;
    for (int b = 0; b < DDT_CAL_BUCKETS; b++) {
        double cells = 0.0, hits = 0.0;
        for (int d = 0; d <= DDT_CAL_ROW_CAP; d++)
            for (int i = 0; i < DDT_CAL_BINS; i++) {
                cells += s->n[b][d][i];
                hits += s->hit[b][d][i];
            }
        info->cells[b] = cells;
        info->hits[b] = hits;
        double w[3] = {0.0, 1.0, 0.0};
        info->loglik_identity[b] = bucket_loglik(s, b, w, cells);
        info->identity[b] = cells < DDT_CAL_MIN_CELLS || hits < DDT_CAL_MIN_HITS;
        if (!info->identity[b]) {
            fit_bucket(s, b, w);
            /* a fit that does not grow with q, or that is no better than the identity, is not kept */
            if (!(w[1] > 1e-3) || !(fabs(w[0]) <= 100 && fabs(w[1]) <= 100 && fabs(w[2]) <= 100) ||
                !(bucket_loglik(s, b, w, cells) >= info->loglik_identity[b])) {
                w[0] = 0.0;
                w[1] = 1.0;
                w[2] = 0.0;
                info->identity[b] = true;
            } else {
                fitted++;
            }
        }
        info->loglik[b] = bucket_loglik(s, b, w, cells);
        for (int f = 0; f < DDT_CAL_FEATURES; f++) out->w[b][f] = (float)w[f];
    }
    /* the lookup: (hits + 1) / (tries + 2), a chance that never reaches 0 or 1 on little data */
    double proposals = 0.0;
    for (int m = 0; m < DDT_CAL_LOOKUP_LENS; m++) proposals += s->lookup_n[m];
    info->lookup_proposals = proposals;
    info->lookup_tokens = proposals + s->lookup_next_n;
    out->lookup = proposals >= DDT_CAL_MIN_LOOKUP;
    for (int m = 0; m < DDT_CAL_LOOKUP_LENS; m++)
        out->lookup_first[m] = out->lookup ? (float)((s->lookup_hit[m] + 1.0) / (s->lookup_n[m] + 2.0)) : 0.0f;
    out->lookup_next = out->lookup ? (float)((s->lookup_next_hit + 1.0) / (s->lookup_next_n + 2.0)) : 0.0f;
    if (!fitted)
        return ddt_fail(err, DDT_ERR_RANGE, "draft calibration: too little data to fit (rank-0 cells %.0f, hits %.0f; "
                        "each bucket needs %d cells and %d hits): decode more prompts or tokens",
                        info->cells[0], info->hits[0], DDT_CAL_MIN_CELLS, DDT_CAL_MIN_HITS);
    return DDT_OK;
}
