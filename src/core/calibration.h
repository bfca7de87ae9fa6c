/*
 * calibration.h — the draft calibration: the drafter's per-depth top-K
 * log-probabilities mapped to the chance that the target accepts each token, the
 * weights the best-first build (tree.c) then ranks prefixes by.
 *
 * Why: the build takes the B heaviest prefixes under log w(u) = sum log q_d(u_d),
 * which is the optimal tree when q_d(u_d) is the chance that the target agrees at
 * depth d given the path so far.  A block-diffusion drafter's q_d is a marginal, not
 * that chance: on the shipped pair (NOTES.md, eighteenth session) a rank-0 token
 * whose path was accepted so far is accepted 82-94% of the time against a mean q of
 * 65-70%, and ranks 2-3 less often than their q, so the plain tree spends its budget
 * on siblings where going deeper pays more.  Calibrated weights give the greedy tree
 * at budget 16 ~6% more tokens a round there; the output is unchanged (any tree is
 * verified: greedy tree == ar still holds), and at T = 1 a calibration gained nothing,
 * so it is applied to greedy decoding only (the engine's rule).
 *
 * Model: per rank bucket b (rank 0, 1, 2-3, 4-7, 8 and up) a logistic regression
 *     p = sigmoid(w_b0 + w_b1 * logit(q) + w_b2 * min(row, 8) / 8),
 * row = depth - 1, fitted on greedy decodes (ddt_cal_fit over ddt_cal_stats, the
 * samples `ddtree calibrate` gathers); w = (0, 1, 0) is the identity up to rounding.
 * Then each row is made non-increasing by a running minimum over its ranks, which
 * the build needs (rows sorted; the GPU build checks it) and which a fit with
 * different buckets need not give.  The arithmetic is core/detmath.h's, inline,
 * so the GPU build can compute the same bits.
 */
#ifndef DDT_CORE_CALIBRATION_H
#define DDT_CORE_CALIBRATION_H

#include <stdbool.h>
#include <stdint.h>

#include "core/detmath.h"
#include "core/lookup.h"
#include "ddtree.h"

#ifdef __CUDACC__
#define DDT_CAL_HD __host__ __device__
#else
#define DDT_CAL_HD
#endif

#define DDT_CAL_BUCKETS 5    /* rank 0, 1, 2-3, 4-7, 8+ */
#define DDT_CAL_FEATURES 3   /* 1, logit(q), min(row, 8) / 8 */
#define DDT_CAL_ROW_CAP 8    /* rows past this share the last depth feature */
#define DDT_CAL_RANKS 16     /* ranks per row the samples cover */
#define DDT_CAL_BINS 321     /* logit(q) in [-16, 16] in steps of 0.1 */

/* The context lookup's match lengths (core/lookup.h) the calibration rates. */
#define DDT_CAL_LOOKUP_LENS (DDT_LOOKUP_MAX - DDT_LOOKUP_MIN + 1)

typedef struct ddt_draft_calibration {
    float w[DDT_CAL_BUCKETS][DDT_CAL_FEATURES];
    /* the context lookup (core/lookup.h), fitted on the same decodes: lookup != 0 when rated;
       lookup_first[m - DDT_LOOKUP_MIN] the chance that the first token proposed after a match
       of m tokens is accepted, lookup_next the chance of each next one after the ones before
       it were (an int, not a bool: the struct has no padding, so it compares by bytes) */
    int32_t lookup;
    float lookup_first[DDT_CAL_LOOKUP_LENS];
    float lookup_next;
} ddt_draft_calibration;

DDT_CAL_HD static inline int32_t ddt_cal_bucket(int32_t rank) {
    return rank == 0 ? 0 : rank == 1 ? 1 : rank <= 3 ? 2 : rank <= 7 ? 3 : 4;
}

/* logit(q) from log q: log q - log(1 - q), with 1 - q held at 2^-24 or more so that
 * q = 1 stays finite; -inf for q = 0. */
DDT_CAL_HD static inline float ddt_cal_logit(float logq) {
    float om = 1.0f - ddt_exp_det_inline(logq);
    if (om < 5.96046448e-8f) om = 5.96046448e-8f;
    return logq - ddt_log_det_inline(om);
}

/* log sigmoid(z), stable on both sides; -inf at z = -inf. */
DDT_CAL_HD static inline float ddt_cal_log_sigmoid(float z) {
    if (z >= 0.0f) return -ddt_log_det_inline(1.0f + ddt_exp_det_inline(-z));
    return z - ddt_log_det_inline(1.0f + ddt_exp_det_inline(z));
}

/* One cell's calibrated log-weight before the row's running minimum. */
DDT_CAL_HD static inline float ddt_cal_cell(const ddt_draft_calibration *c, float logq, int32_t row, int32_t rank) {
    const float *w = c->w[ddt_cal_bucket(rank)];
    const float dfeat = (float)(row < DDT_CAL_ROW_CAP ? row : DDT_CAL_ROW_CAP) / (float)DDT_CAL_ROW_CAP;
    const float z = (w[0] + w[1] * ddt_cal_logit(logq)) + w[2] * dfeat;
    return ddt_cal_log_sigmoid(z);
}

#ifdef __cplusplus
extern "C" {
#endif

/* The log-weights of a lookup proposal's prefixes after a match of match_len
 * tokens: v[j] = log(first) + j log(next), accumulated in order (detmath: the GPU
 * computes the same bits). */
DDT_CAL_HD static inline void ddt_cal_lookup_weights(const ddt_draft_calibration *c, int32_t match_len, int32_t len,
                                                    float *v) {
    const float lf = ddt_log_det_inline(c->lookup_first[match_len - DDT_LOOKUP_MIN]);
    const float ln = ddt_log_det_inline(c->lookup_next);
    float acc = lf;
    for (int32_t j = 0; j < len; j++) {
        v[j] = acc;
        acc = acc + ln;
    }
}

/* The identity: w = (0, 1, 0) in every bucket, no lookup rating. */
void ddt_cal_identity(ddt_draft_calibration *c);

/* Check a calibration: finite weights, w_b1 > 0 (the weight grows with q) and
 * |w| <= 100; with a lookup rating, chances in (0, 1]; the message names the
 * bucket and the weight, or the lookup field. */
ddt_status ddt_cal_check(const ddt_draft_calibration *c, ddt_error *err);

/* Calibrate rows [0, depth) of a table in place: logq[row * ld + r] for r < k. */
void ddt_cal_apply(const ddt_draft_calibration *c, float *logq, int32_t depth, int32_t k, int32_t ld);

/*
 * Fit data: per (bucket, min(row, 8), logit bin) the cells seen and how many of
 * them the target accepted.  A table contributes the cells of the rows its truth
 * path reaches: row d's first min(k, DDT_CAL_RANKS) cells (hit: the cell's token
 * is next[d], the token the target emitted at that position), then row d + 1 while
 * next[d] is among them (the path goes on through that node), so every cell counts
 * exactly when its parent prefix was accepted: the conditional the build needs.
 */
typedef struct ddt_cal_stats {
    double n[DDT_CAL_BUCKETS][DDT_CAL_ROW_CAP + 1][DDT_CAL_BINS];
    double hit[DDT_CAL_BUCKETS][DDT_CAL_ROW_CAP + 1][DDT_CAL_BINS];
    int64_t tables, cells;
    /* the lookup's proposals: first tokens by match length, then each next token whose
       predecessors were all accepted */
    double lookup_n[DDT_CAL_LOOKUP_LENS], lookup_hit[DDT_CAL_LOOKUP_LENS];
    double lookup_next_n, lookup_next_hit;
} ddt_cal_stats;

void ddt_cal_stats_clear(ddt_cal_stats *s);
/* Add one draft table (logq / tok [depth][k], row-major) against next[0..n_next). */
void ddt_cal_stats_add_table(ddt_cal_stats *s, const float *logq, const int32_t *tok, int32_t depth, int32_t k,
                             const int32_t *next, int32_t n_next);

/* Add one lookup proposal (match of match_len tokens, proposal[0..len)) against
 * next[0..n_next), the tokens the target emitted after the context. */
void ddt_cal_stats_add_lookup(ddt_cal_stats *s, int32_t match_len, const int32_t *proposal, int32_t len,
                              const int32_t *next, int32_t n_next);

/* What a fit found per bucket: cells and hits, the mean log-likelihood of the
 * hits under the fit and under the identity, and whether the bucket fell back to
 * the identity (fewer than DDT_CAL_MIN_CELLS cells or DDT_CAL_MIN_HITS hits). */
#define DDT_CAL_MIN_CELLS 200
#define DDT_CAL_MIN_HITS 20
typedef struct ddt_cal_fit_info {
    double cells[DDT_CAL_BUCKETS], hits[DDT_CAL_BUCKETS];
    double loglik[DDT_CAL_BUCKETS], loglik_identity[DDT_CAL_BUCKETS];
    bool identity[DDT_CAL_BUCKETS];
    double lookup_proposals, lookup_tokens; /* proposals rated, tokens compared in all */
} ddt_cal_fit_info;

/* Maximum-likelihood weights per bucket (Newton's method on the binned cells,
 * a small ridge so that a bucket whose cells all hit or all miss stays finite),
 * and the lookup's chances ((hits + 1) / (tries + 2) each) when it made at least
 * DDT_CAL_MIN_LOOKUP proposals.  Fails only when no bucket has enough data; info
 * may be NULL. */
#define DDT_CAL_MIN_LOOKUP 20
ddt_status ddt_cal_fit(const ddt_cal_stats *s, ddt_draft_calibration *out, ddt_cal_fit_info *info, ddt_error *err);

#ifdef __cplusplus
}
#endif

#endif
