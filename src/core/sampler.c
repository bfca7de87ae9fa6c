/*
 * sampler.c — the target's next token at a node: argmax at T = 0, and at T > 0 a
 * sample from softmax(logits / T) with top-k and top-p, drawn from a
 * counter-based RNG (Philox4x32-10) keyed by (seed, round, node).
 *
 * Why counter-based: sample-and-match needs one independent target sample per
 * tree node, and the CUDA backend must reproduce the CPU's samples bit for bit.
 * A counter-based generator gives node i of round r its uniform without any
 * sequential state.
 *
 * The arithmetic is pinned down so another backend can reproduce it:
 *  1. m = max over finite logits; e_i = ddt_exp_det((z_i - m) / T) (one IEEE
 *     subtract, one IEEE divide, deterministic exp).
 *  2. Candidates: all ids, or the top_k by (z desc, id asc).  Canonical order:
 *     id ascending, or (z desc, id asc) when top-p is on.
 *  3. Cumulative sums in canonical order are "chunked": position i in chunk c
 *     (chunks of DDT_SAMPLE_CHUNK positions) has cum(i) = P(c) + s_c(i), where
 *     s_c(i) sums the chunk's weights up to i sequentially and P(c) sums the
 *     totals of chunks 0..c-1 sequentially.  A GPU computes each chunk's sums in
 *     one thread and the chunk prefix in one pass, in the same order.
 *  4. top-p keeps canonical positions 0..j, j the first with cum(j) >= top_p *
 *     cum(last); the kept mass is cum(j).
 *  5. u = ddt_rng_uniform(seed, round, node, 0); the token is the first kept
 *     position with cum(i) > u * mass (the last kept one if rounding leaves none).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/detmath.h"
#include "core/error.h"
#include "core/zsort.h"
#include "ddtree.h"

#define DDT_SAMPLE_CHUNK 1024

/* ------------------------------------------------------------------ Philox */

static inline void mulhilo32(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

void ddt_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
    const uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo32(M0, c0, &hi0, &lo0);
        mulhilo32(M1, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += W0;
        k1 += W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

float ddt_rng_uniform(uint64_t seed, uint64_t round, uint32_t node, uint32_t lane) {
    const uint32_t ctr[4] = {node, lane, (uint32_t)round, (uint32_t)(round >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    ddt_philox4x32_10(ctr, key, out);
    return (float)(out[0] >> 8) * (1.0f / 16777216.0f);
}

/* ------------------------------------------------------------------ settings */

ddt_status ddt_sampling_check(const ddt_sampling *s, ddt_error *err) {
    if (!s) return ddt_fail(err, DDT_ERR_INVALID, "sampling settings are NULL");
    if (!(s->temperature >= 0.0f) || isinf(s->temperature))
        return ddt_fail(err, DDT_ERR_INVALID, "temperature %g: must be finite and >= 0",
                        (double)s->temperature);
    if (s->top_k < 0)
        return ddt_fail(err, DDT_ERR_INVALID, "top_k %d: must be >= 0 (0 = off)", s->top_k);
    if (!(s->top_p > 0.0f && s->top_p <= 1.0f))
        return ddt_fail(err, DDT_ERR_INVALID, "top_p %g: must be in (0, 1]", (double)s->top_p);
    return DDT_OK;
}

/* ------------------------------------------------------------------ workspace */

struct ddt_sampler {
    int32_t vocab;
    int32_t *order; /* [vocab] candidate ids in canonical order */
    float *weight;  /* [vocab] e_i in canonical order */
    float *cum;     /* [vocab] chunked cumulative sums */
    ddt_zid *pairs; /* [vocab] sort buffer */
};

ddt_status ddt_sampler_create(int32_t vocab, ddt_sampler **out, ddt_error *err) {
    if (!out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_sampler_create: out is NULL");
    *out = NULL;
    if (vocab < 1) return ddt_fail(err, DDT_ERR_RANGE, "vocabulary size %d must be >= 1", vocab);
    ddt_sampler *s = calloc(1, sizeof *s);
    if (!s) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory creating a sampler");
    s->vocab = vocab;
    s->order = ddt_malloc_array((size_t)vocab, sizeof(int32_t));
    s->weight = ddt_malloc_array((size_t)vocab, sizeof(float));
    s->cum = ddt_malloc_array((size_t)vocab, sizeof(float));
    s->pairs = ddt_malloc_array((size_t)vocab, sizeof(ddt_zid));
    if (!s->order || !s->weight || !s->cum || !s->pairs) {
        ddt_sampler_destroy(s);
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory creating a sampler for %d tokens",
                        vocab);
    }
    *out = s;
    return DDT_OK;
}

void ddt_sampler_destroy(ddt_sampler *s) {
    if (!s) return;
    free(s->order);
    free(s->weight);
    free(s->cum);
    free(s->pairs);
    free(s);
}

/* Chunked cumulative sums (see the file comment, step 3). */
static void chunked_cumsum(const float *w, int32_t n, float *cum) {
    float prefix = 0.0f;
    for (int32_t c0 = 0; c0 < n; c0 += DDT_SAMPLE_CHUNK) {
        int32_t c1 = c0 + DDT_SAMPLE_CHUNK < n ? c0 + DDT_SAMPLE_CHUNK : n;
        float s = 0.0f;
        for (int32_t i = c0; i < c1; i++) {
            s += w[i];
            cum[i] = prefix + s;
        }
        prefix += s;
    }
}

ddt_status ddt_sample_token(ddt_sampler *smp, const float *logits, int32_t vocab,
                            const ddt_sampling *s, uint64_t round, uint32_t node,
                            int32_t *out_token, ddt_error *err) {
    if (!logits || !out_token) return ddt_fail(err, DDT_ERR_INVALID, "ddt_sample_token: NULL argument");
    ddt_status st = ddt_sampling_check(s, err);
    if (st) return st;
    if (vocab < 1) return ddt_fail(err, DDT_ERR_RANGE, "vocabulary size %d must be >= 1", vocab);
    /* Greedy needs no workspace: argmax, lowest id on ties. */
    int32_t best = -1;
    float m = -INFINITY;
    for (int32_t i = 0; i < vocab; i++) {
        if (isnan(logits[i]))
            return ddt_fail(err, DDT_ERR_INVALID, "logit of token %d is NaN", i);
        if (best < 0 || logits[i] > m) {
            m = logits[i];
            best = i;
        }
    }
    if (s->temperature == 0.0f) {
        *out_token = best;
        return DDT_OK;
    }
    if (!smp || smp->vocab < vocab)
        return ddt_fail(err, DDT_ERR_INVALID, "sampler workspace missing or smaller than vocab %d",
                        vocab);
    if (m == -INFINITY) return ddt_fail(err, DDT_ERR_INVALID, "every logit is -inf");
    if (m == INFINITY) return ddt_fail(err, DDT_ERR_INVALID, "logit of token %d is +inf", best);

    int32_t n = vocab;
    bool use_topk = s->top_k > 0 && s->top_k < vocab;
    bool use_topp = s->top_p < 1.0f;
    for (int32_t i = 0; i < vocab; i++) smp->order[i] = i;
    if (use_topk) { /* only the k kept need ordering */
        n = s->top_k;
        ddt_zid_top_k(logits, vocab, n, smp->pairs);
        for (int32_t i = 0; i < n; i++) smp->order[i] = smp->pairs[i].id;
        if (!use_topp) ddt_i32_sort_asc(smp->order, n);
    } else if (use_topp) {
        for (int32_t i = 0; i < vocab; i++) smp->pairs[i] = (ddt_zid){logits[i], i};
        ddt_zid_sort_desc(smp->pairs, vocab);
        for (int32_t i = 0; i < vocab; i++) smp->order[i] = smp->pairs[i].id;
    }
    for (int32_t i = 0; i < n; i++) smp->weight[i] = ddt_exp_det((logits[smp->order[i]] - m) / s->temperature);
    chunked_cumsum(smp->weight, n, smp->cum);
    if (use_topp) {
        float limit = s->top_p * smp->cum[n - 1];
        int32_t j = 0;
        while (j < n - 1 && !(smp->cum[j] >= limit)) j++;
        n = j + 1;
    }
    float mass = smp->cum[n - 1];
    float target = ddt_rng_uniform(s->seed, round, node, 0) * mass;
    int32_t pick = -1;
    for (int32_t i = 0; i < n; i++)
        if (smp->cum[i] > target) {
            pick = i;
            break;
        }
    if (pick < 0) { /* u * mass rounded up to the mass: take the last weighted candidate */
        pick = n - 1;
        while (pick > 0 && smp->weight[pick] == 0.0f) pick--;
    }
    *out_token = smp->order[pick];
    return DDT_OK;
}
