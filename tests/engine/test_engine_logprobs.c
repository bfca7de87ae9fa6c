/*
 * test_engine_logprobs.c — per-token log-probabilities (ddt_engine_set_logprobs)
 * on the CPU engine:
 *  - ddt_logprobs_of_row on crafted rows: ties by lower id, -inf entries, a NaN
 *    entry (NaN logprob, never among the top), n_top past the vocabulary;
 *  - each emitted token's values against an independent double-precision
 *    log-softmax of the logits a one-token-at-a-time prefill of the same
 *    sequence gives (the target alone), greedy and T = 1, top ids in order;
 *  - ar, chain, tree and auto give bitwise the same values greedy (a tree's
 *    verify rows are its path's prefill rows), on the shipped pair, whose rounds
 *    accept several tokens (checked), so rows past the root are read;
 *  - entries past the capacity stay untouched (NaN-poisoned), and turning it
 *    off stops the writes; bad arguments are refused;
 *  - ddt_engine_score of prompt + output gives bitwise the generation's values
 *    for the output's tokens (its chunks cut the sequence elsewhere), the
 *    target's for the prompt's, clears the prefix cache, and refuses bad input.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/engine.h"
#include "engine/logprobs.h"
#include "model/target.h"

#define N_GEN 40
#define TOP 7

static char g_target[1024], g_draft[1024];
/* text the shipped drafter guesses well (a greedy continuation of a held-out prompt), so tree rounds
   accept paths of several tokens and read verify rows other than the root's */
static const int32_t k_prompt[] = {261, 809, 2452, 46,  32,  718, 292, 2385, 1275, 285, 2597, 44, 292, 2385,
                                   319, 285, 2597, 398, 261, 556, 261, 313,  291,  333, 1420, 526, 457, 328};
#define N_PROMPT ((int32_t)(sizeof k_prompt / sizeof k_prompt[0]))

static void paths(void) {
    snprintf(g_target, sizeof g_target, "%s/models/pystdlib-target", DDT_SOURCE_DIR);
    snprintf(g_draft, sizeof g_draft, "%s/models/pystdlib-dflash", DDT_SOURCE_DIR);
}

static void test_row(void **state) {
    (void)state;
    ddt_token_logprobs o;
    /* ties: ids 1 and 3 share the maximum, 1 first; -inf never beats a finite value */
    const float row[6] = {0.5f, 2.0f, -INFINITY, 2.0f, 1.0f, -3.0f};
    ddt_logprobs_of_row(row, 6, 4, 4, &o);
    assert_int_equal(o.n_top, 4);
    const int32_t want[4] = {1, 3, 4, 0};
    for (int j = 0; j < 4; j++) assert_int_equal(o.top_id[j], want[j]);
    double z = 0;
    for (int i = 0; i < 6; i++) z += exp((double)row[i]);
    assert_true(fabs(o.logprob - (1.0 - log(z))) < 1e-6);
    assert_true(fabs(o.top_logprob[0] - (2.0 - log(z))) < 1e-6);
    assert_true(o.top_logprob[0] == o.top_logprob[1]);
    /* n_top past the vocabulary: every entry, -inf last */
    ddt_logprobs_of_row(row, 6, 2, 20, &o);
    assert_int_equal(o.n_top, 6);
    assert_int_equal(o.top_id[5], 2);
    assert_true(isinf(o.logprob) && o.logprob < 0);
    /* a NaN entry: no distribution; the NaN is never among the top */
    const float bad[4] = {1.0f, NAN, 3.0f, 0.0f};
    ddt_logprobs_of_row(bad, 4, 0, 4, &o);
    assert_true(isnan(o.logprob));
    assert_int_equal(o.n_top, 3);
    for (int j = 0; j < 3; j++) assert_int_not_equal(o.top_id[j], 1);
    /* n_top 0: the token's value only */
    ddt_logprobs_of_row(row, 6, 0, 0, &o);
    assert_int_equal(o.n_top, 0);
}

typedef struct run {
    int32_t n;
    int32_t ids[N_GEN];
    ddt_token_logprobs lp[N_GEN + 4];
} run;

static ddt_engine *make(ddt_mode mode, int32_t budget, bool autob, float temperature) {
    ddt_engine_options o;
    memset(&o, 0, sizeof o);
    o.mode = mode;
    o.budget = budget;
    o.budget_auto = autob;
    o.draft_dir = mode == DDT_MODE_AR ? NULL : g_draft;
    o.sampling.temperature = temperature;
    o.sampling.top_p = 1.0f;
    o.sampling.seed = 3;
    o.n_threads = 2;
    ddt_engine *e;
    ddt_error err = {0};
    if (ddt_engine_create(g_target, &o, &e, &err) != DDT_OK) fail_msg("create: %s", err.msg);
    return e;
}

static void poison(run *r) {
    for (size_t i = 0; i < sizeof r->lp / sizeof r->lp[0]; i++) {
        r->lp[i].logprob = NAN;
        r->lp[i].n_top = -1;
    }
}

static double generate(ddt_engine *e, int32_t capacity, int32_t n_top, run *r) {
    ddt_error err = {0};
    poison(r);
    if (ddt_engine_set_logprobs(e, r->lp, capacity, n_top, &err) != DDT_OK) fail_msg("set_logprobs: %s", err.msg);
    ddt_gen_stats s;
    if (ddt_engine_generate(e, k_prompt, N_PROMPT, N_GEN, NULL, 0, r->ids, &r->n, NULL, NULL, &s, &err) != DDT_OK)
        fail_msg("generate: %s", err.msg);
    assert_int_equal(r->n, N_GEN);
    return s.mean_acceptance;
}

/* Every entry against the target's own logits, prefilled one token at a time. */
static void check_against_target(const run *r, int32_t n_top) {
    ddt_target_options to = {.max_ctx = 128, .max_tokens = 32, .n_threads = 1};
    ddt_target *t;
    ddt_error err = {0};
    if (ddt_target_load(g_target, &to, &t, &err) != DDT_OK) fail_msg("target: %s", err.msg);
    const int32_t V = ddt_target_vocab(t);
    float *logits = malloc(sizeof(float) * (size_t)V);
    assert_non_null(logits);
    assert_int_equal(ddt_target_prefill(t, k_prompt, N_PROMPT, logits, false, &err), DDT_OK);
    for (int32_t i = 0; i < r->n; i++) {
        double mx = -INFINITY, z = 0;
        for (int32_t v = 0; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
        for (int32_t v = 0; v < V; v++) z += exp((double)logits[v] - mx);
        const double logz = mx + log(z);
        const ddt_token_logprobs *p = &r->lp[i];
        if (fabs(p->logprob - ((double)logits[r->ids[i]] - logz)) > 1e-5)
            fail_msg("token %d (id %d): logprob %g, the target's %g", i, r->ids[i], p->logprob,
                     (double)logits[r->ids[i]] - logz);
        assert_int_equal(p->n_top, n_top);
        for (int32_t j = 0; j < n_top; j++) {
            /* the j-th largest: larger than every id not listed before it */
            const int32_t id = p->top_id[j];
            for (int32_t v = 0; v < V; v++) {
                bool listed = false;
                for (int32_t k = 0; k <= j; k++) listed |= p->top_id[k] == v;
                if (!listed && (logits[v] > logits[id] || (logits[v] == logits[id] && v < id)))
                    fail_msg("token %d: top %d is id %d, but id %d is not listed before it", i, j, id, v);
            }
            assert_true(fabs(p->top_logprob[j] - ((double)logits[id] - logz)) < 1e-5);
        }
        assert_int_equal(ddt_target_prefill(t, &r->ids[i], 1, logits, false, &err), DDT_OK);
    }
    free(logits);
    ddt_target_free(t);
}

/* Bitwise equal where defined (the slots past n_top are not). */
static bool same_values(const ddt_token_logprobs *a, const ddt_token_logprobs *b) {
    if (memcmp(&a->logprob, &b->logprob, sizeof a->logprob) || a->n_top != b->n_top) return false;
    return !memcmp(a->top_id, b->top_id, sizeof(int32_t) * (size_t)a->n_top) &&
           !memcmp(a->top_logprob, b->top_logprob, sizeof(float) * (size_t)a->n_top);
}

static void test_against_target_and_modes(void **state) {
    (void)state;
    paths();
    static const struct {
        ddt_mode mode;
        int32_t budget;
        bool autob;
    } modes[] = {{DDT_MODE_AR, 0, false}, {DDT_MODE_CHAIN, 0, false}, {DDT_MODE_TREE, 8, false},
                 {DDT_MODE_TREE, 32, false}, {DDT_MODE_TREE, 16, true}};
    run ar, other;
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        ddt_engine *e = make(modes[m].mode, modes[m].budget, modes[m].autob, 0.0f);
        run *r = m == 0 ? &ar : &other;
        const double tau = generate(e, N_GEN, TOP, r);
        /* (auto may run plain ar steps where speculation does not pay on this CPU) */
        if (m > 0 && !modes[m].autob && tau < 2.0)
            fail_msg("mode %s: mean acceptance %.2f; the check needs multi-token rounds", ddt_mode_name(modes[m].mode),
                     tau);
        if (m == 0) {
            check_against_target(&ar, TOP);
            for (int32_t i = 0; i < ar.n; i++) { /* greedy: the emitted token is the most likely */
                assert_int_equal(ar.lp[i].top_id[0], ar.ids[i]);
                assert_true(ar.lp[i].top_logprob[0] == ar.lp[i].logprob);
            }
        } else {
            assert_memory_equal(other.ids, ar.ids, sizeof ar.ids);
            for (int32_t i = 0; i < ar.n; i++)
                if (!same_values(&other.lp[i], &ar.lp[i]))
                    fail_msg("mode %s budget %d: token %d's log-probabilities differ from ar's",
                             ddt_mode_name(modes[m].mode), modes[m].budget, i);
        }
        /* nothing past the generated tokens is written */
        for (size_t i = N_GEN; i < sizeof r->lp / sizeof r->lp[0]; i++) assert_true(isnan(r->lp[i].logprob));
        ddt_engine_free(e);
    }
    /* T = 1: the sampled tokens' values are the target's too */
    for (int tree = 0; tree < 2; tree++) {
        ddt_engine *e = make(tree ? DDT_MODE_TREE : DDT_MODE_AR, 16, false, 1.0f);
        generate(e, N_GEN, 3, &other);
        check_against_target(&other, 3);
        ddt_engine_free(e);
    }
}

static void test_capacity_and_off(void **state) {
    (void)state;
    paths();
    ddt_engine *e = make(DDT_MODE_TREE, 16, false, 0.0f);
    run r;
    generate(e, 5, 2, &r); /* room for 5 */
    for (int32_t i = 0; i < 5; i++) assert_int_equal(r.lp[i].n_top, 2);
    for (size_t i = 5; i < sizeof r.lp / sizeof r.lp[0]; i++) {
        assert_true(isnan(r.lp[i].logprob));
        assert_int_equal(r.lp[i].n_top, -1);
    }
    ddt_error err = {0};
    poison(&r);
    assert_int_equal(ddt_engine_set_logprobs(e, NULL, 0, 0, &err), DDT_OK);
    assert_int_equal(ddt_engine_generate(e, k_prompt, N_PROMPT, N_GEN, NULL, 0, r.ids, &r.n, NULL, NULL, NULL, &err),
                     DDT_OK);
    for (size_t i = 0; i < sizeof r.lp / sizeof r.lp[0]; i++) assert_true(isnan(r.lp[i].logprob));
    assert_int_equal(ddt_engine_set_logprobs(e, r.lp, 4, DDT_MAX_TOP_LOGPROBS + 1, &err), DDT_ERR_RANGE);
    assert_int_equal(ddt_engine_set_logprobs(e, r.lp, -1, 0, &err), DDT_ERR_RANGE);
    assert_int_equal(ddt_engine_set_logprobs(NULL, r.lp, 4, 0, &err), DDT_ERR_INVALID);
    ddt_engine_free(e);
}

static void test_score(void **state) {
    (void)state;
    paths();
    ddt_engine_options o;
    memset(&o, 0, sizeof o);
    o.mode = DDT_MODE_TREE;
    o.budget = 16;
    o.draft_dir = g_draft;
    o.sampling.top_p = 1.0f;
    o.n_threads = 2;
    o.prefix_cache = true;
    o.max_ctx = 160;
    ddt_engine *e;
    ddt_error err = {0};
    if (ddt_engine_create(g_target, &o, &e, &err) != DDT_OK) fail_msg("create: %s", err.msg);
    run g;
    generate(e, N_GEN, 4, &g);
    /* the sequence, long enough for three of the scorer's chunks */
    enum { N_SEQ = N_PROMPT + N_GEN };
    int32_t seq[N_SEQ];
    memcpy(seq, k_prompt, sizeof k_prompt);
    memcpy(seq + N_PROMPT, g.ids, sizeof g.ids);
    static ddt_token_logprobs sc[N_SEQ];
    assert_int_equal(ddt_engine_score(e, seq, N_SEQ, 4, sc, &err), DDT_OK);
    assert_true(isnan(sc[0].logprob) && sc[0].n_top == 0);
    for (int32_t i = 0; i < N_GEN; i++)
        if (!same_values(&sc[N_PROMPT + i], &g.lp[i]))
            fail_msg("output token %d: the score's values differ from the generation's", i);
    /* the prompt's tokens against a double log-softmax of the target's own logits (one prefill, every row) */
    {
        ddt_target_options to = {.max_ctx = 64, .max_tokens = N_PROMPT, .n_threads = 1};
        ddt_target *t;
        if (ddt_target_load(g_target, &to, &t, &err) != DDT_OK) fail_msg("target: %s", err.msg);
        const int32_t V = ddt_target_vocab(t);
        float *rows = malloc(sizeof(float) * (size_t)V * N_PROMPT);
        assert_non_null(rows);
        assert_int_equal(ddt_target_prefill(t, k_prompt, N_PROMPT, rows, true, &err), DDT_OK);
        for (int32_t i = 0; i + 1 < N_PROMPT; i++) {
            const float *row = rows + (size_t)i * V;
            double mx = -INFINITY, z = 0;
            for (int32_t v = 0; v < V; v++) mx = row[v] > mx ? row[v] : mx;
            for (int32_t v = 0; v < V; v++) z += exp((double)row[v] - mx);
            const double want = (double)row[k_prompt[i + 1]] - mx - log(z);
            if (fabs(sc[i + 1].logprob - want) > 1e-5)
                fail_msg("prompt token %d: score %g, the target's %g", i + 1, sc[i + 1].logprob, want);
        }
        free(rows);
        ddt_target_free(t);
    }
    /* a longer sequence scored in one piece vs in a smaller engine context: refused */
    static ddt_token_logprobs big[200];
    static int32_t long_ids[200];
    for (int i = 0; i < 200; i++) long_ids[i] = seq[i % N_SEQ];
    assert_int_equal(ddt_engine_score(e, long_ids, 200, 0, big, &err), DDT_ERR_RANGE);
    assert_int_equal(ddt_engine_score(e, seq, 1, 0, sc, &err), DDT_ERR_INVALID);
    assert_int_equal(ddt_engine_score(e, seq, 4, 21, sc, &err), DDT_ERR_RANGE);
    int32_t bad[3] = {1, 2, 1 << 20};
    assert_int_equal(ddt_engine_score(e, bad, 3, 0, sc, &err), DDT_ERR_INVALID);
    /* the scored text replaced the context: the next generation reuses nothing, and is unchanged */
    assert_int_equal(ddt_engine_score(e, seq, N_SEQ, 0, sc, &err), DDT_OK);
    run again;
    ddt_gen_stats s;
    poison(&again);
    assert_int_equal(ddt_engine_set_logprobs(e, again.lp, N_GEN, 4, &err), DDT_OK);
    assert_int_equal(ddt_engine_generate(e, k_prompt, N_PROMPT, N_GEN, NULL, 0, again.ids, &again.n, NULL, NULL, &s,
                                         &err), DDT_OK);
    assert_int_equal(s.cached_tokens, 0);
    assert_memory_equal(again.ids, g.ids, sizeof g.ids);
    ddt_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row),
        cmocka_unit_test(test_against_target_and_modes),
        cmocka_unit_test(test_capacity_and_off),
        cmocka_unit_test(test_score),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
