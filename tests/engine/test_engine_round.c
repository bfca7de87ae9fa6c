/*
 * test_engine_round.c — the clamps and cost points every backend's loop shares
 * (engine/round.h): K = min(budget, vocab, DDT_MAX_TOPK) and at least 1; a
 * round's nodes cut to the context's room with k = min(nodes, K) in tree mode,
 * 1 in chain mode; the cost points of every budget fit DDT_ENGINE_COST_POINTS;
 * the measurement takes the best run after a warm-up and is non-decreasing; a
 * given table is copied into the engine's own arrays; the auto budget's fallback
 * to ar steps holds, probes and backs off as round.h says.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/round.h"

static void test_topk_cap(void **state) {
    (void)state;
    assert_int_equal(ddt_engine_topk_cap(16, 50000), 16);
    assert_int_equal(ddt_engine_topk_cap(100, 64), 64);      /* the vocabulary bounds K */
    assert_int_equal(ddt_engine_topk_cap(1024, 163840), 1024);
    assert_int_equal(ddt_engine_topk_cap(5000, 163840), DDT_MAX_TOPK);
    assert_int_equal(ddt_engine_topk_cap(1, 2), 1);
    assert_int_equal(ddt_engine_topk_cap(0, 100), 1);        /* ar / chain tables hold one column */
    /* no budget an engine accepts is cut by DDT_MAX_TOPK: K is min(budget, vocab) as before */
    for (int32_t b = 1; b <= DDT_MAX_BUDGET; b++) {
        assert_int_equal(ddt_engine_topk_cap(b, 100000), b);
        assert_int_equal(ddt_engine_topk_cap(b, 300), b < 300 ? b : 300);
    }
}

static void test_round_nodes(void **state) {
    (void)state;
    int32_t k;
    assert_int_equal(ddt_engine_round_nodes(DDT_MODE_TREE, 32, 15, 1000, 32, &k), 32);
    assert_int_equal(k, 32);
    assert_int_equal(ddt_engine_round_nodes(DDT_MODE_TREE, 32, 15, 1000, 20, &k), 32); /* K < budget (vocab) */
    assert_int_equal(k, 20);
    assert_int_equal(ddt_engine_round_nodes(DDT_MODE_TREE, 32, 15, 5, 32, &k), 5); /* the context's last rounds */
    assert_int_equal(k, 5);
    assert_int_equal(ddt_engine_round_nodes(DDT_MODE_TREE, 32, 15, 0, 32, &k), 0); /* root alone */
    assert_int_equal(k, 1);
    assert_int_equal(ddt_engine_round_nodes(DDT_MODE_CHAIN, 32, 15, 1000, 32, &k), 15); /* chain: the depth */
    assert_int_equal(k, 1);
    assert_int_equal(ddt_engine_round_nodes(DDT_MODE_CHAIN, 0, 15, 7, 1, &k), 7);
    assert_int_equal(k, 1);
}

static void test_cost_points(void **state) {
    (void)state;
    float nodes[64];
    int32_t most = 0;
    for (int32_t b = 0; b <= DDT_MAX_BUDGET; b++) {
        int32_t n = ddt_engine_cost_points(b, nodes, 64);
        assert_true(n <= DDT_ENGINE_COST_POINTS);
        assert_true(n >= 1);
        assert_true(nodes[0] == 0.0f);
        assert_true(nodes[n - 1] == (float)b); /* the table reaches the budget */
        for (int32_t i = 1; i < n; i++) assert_true(nodes[i] > nodes[i - 1]);
        if (n > most) most = n;
    }
    assert_int_equal(most, DDT_ENGINE_COST_POINTS); /* and the constant is not larger than needed */
    static const float want64[] = {0, 1, 2, 4, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64};
    int32_t n = ddt_engine_cost_points(64, nodes, 64);
    assert_int_equal(n, 14);
    for (int32_t i = 0; i < n; i++) assert_true(nodes[i] == want64[i]);
    n = ddt_engine_cost_points(22, nodes, 64);
    assert_int_equal(n, 10); /* 0 1 2 4 8 10 12 16 20 22 */
    assert_true(nodes[8] == 20.0f && nodes[9] == 22.0f);
    n = ddt_engine_cost_points(5, nodes, 64);
    assert_int_equal(n, 5); /* 0 1 2 4 5 */
    assert_true(nodes[4] == 5.0f);
}

/* A fake backend: forward times fall with each call of a sweep (so the warm-up is
 * the slowest), the first sweep 3x slow (as a CPU just after a load: it must be
 * left out), and one point is faster than the one before (monotone fix). */
typedef struct fake {
    int calls[2048];
    int draft_calls;
} fake;

static ddt_status fake_forward(void *ctx, int32_t n, double *seconds, ddt_error *err) {
    (void)err;
    fake *f = ctx;
    int c = f->calls[n]++;
    const int k = c % (1 + DDT_ENGINE_COST_REPS); /* 0: the warm-up */
    double base = n == 5 ? 0.5e-3 : 1e-3 * n;    /* 4 nodes (n = 5) cheaper than 2 (n = 3) */
    *seconds = base * (k == 0 ? 10.0 : 1.0 + 0.1 * (DDT_ENGINE_COST_REPS - k)) * (c <= DDT_ENGINE_COST_REPS ? 3.0 : 1.0);
    return DDT_OK;
}

static ddt_status fake_draft(void *ctx, int32_t n, double *seconds, ddt_error *err) {
    (void)err;
    assert_int_equal(n, 0);
    fake *f = ctx;
    *seconds = f->draft_calls++ == 0 ? 1.0 : 2e-3;
    return DDT_OK;
}

static void test_measure_cost(void **state) {
    (void)state;
    static fake f;
    float nodes[DDT_ENGINE_COST_POINTS], verify[DDT_ENGINE_COST_POINTS];
    ddt_cost_model c;
    ddt_error err;
    assert_int_equal(ddt_engine_measure_cost(8, fake_forward, fake_draft, &f, nodes, verify, &c, &err), DDT_OK);
    assert_int_equal(c.n_nodes, 5); /* 0 1 2 4 8 */
    assert_int_equal(c.n_contexts, 1);
    assert_ptr_equal(c.nodes, nodes);
    assert_ptr_equal(c.verify, verify);
    /* two sweeps of warm-up + reps, the second kept */
    for (int32_t p = 0; p < c.n_nodes; p++)
        assert_int_equal(f.calls[(int32_t)nodes[p] + 1], 2 * (1 + DDT_ENGINE_COST_REPS));
    assert_int_equal(f.draft_calls, 1 + DDT_ENGINE_COST_REPS);
    assert_float_equal(verify[0], 1e-3f, 1e-9f); /* best run, warm-up left out */
    assert_float_equal(verify[1], 2e-3f, 1e-9f);
    assert_float_equal(verify[2], 3e-3f, 1e-9f);
    assert_float_equal(verify[3], 3e-3f, 1e-9f); /* made non-decreasing */
    assert_float_equal(verify[4], 9e-3f, 1e-9f);
    assert_float_equal(c.draft, 2e-3f, 1e-9f);
    /* no drafter: no draft cost */
    static fake g;
    assert_int_equal(ddt_engine_measure_cost(1, fake_forward, NULL, &g, nodes, verify, &c, &err), DDT_OK);
    assert_int_equal(c.n_nodes, 2);
    assert_true(c.draft == 0.0f);
}

static void test_adopt_cost(void **state) {
    (void)state;
    float gn[3] = {0.0f, 4.0f, 16.0f}, gv[3] = {1e-3f, 2e-3f, 5e-3f}, ctx1 = 100.0f;
    const ddt_cost_model given = {0.5e-3f, 3, gn, 1, &ctx1, gv, 7.0f};
    float nodes[DDT_ENGINE_COST_POINTS], verify[DDT_ENGINE_COST_POINTS];
    ddt_cost_model c;
    ddt_engine_adopt_cost(&given, nodes, verify, &c);
    assert_int_equal(c.n_nodes, 3);
    assert_int_equal(c.n_contexts, 1);
    assert_ptr_equal(c.nodes, nodes);
    assert_ptr_equal(c.verify, verify);
    assert_null(c.contexts);
    assert_true(c.draft == given.draft && c.context_len == given.context_len);
    /* the caller's arrays may change or go away afterwards */
    gn[1] = 8.0f;
    gv[1] = 9.0f;
    assert_true(nodes[0] == 0.0f && nodes[1] == 4.0f && nodes[2] == 16.0f);
    assert_true(verify[0] == 1e-3f && verify[1] == 2e-3f && verify[2] == 5e-3f);
    ddt_error err;
    assert_int_equal(ddt_cost_check(&c, &err), DDT_OK);
    assert_true(ddt_cost_verify(&c, 10.0f) == 2e-3f + 0.5f * (5e-3f - 2e-3f));
}

/* The multi-GPU engine's shared cost table (ddt_engine_cost_pack / _unpack): W
 * simulated ranks, each with its own measured table (different point counts, a
 * draft cost of 0), rank 0 packing its own, the others zeros; the sum
 * over the ranks, taken in several orders (as an all-reduce may), unpacks on every
 * rank to rank 0's model bit for bit.  A buffer no rank packed, a point count past
 * the wire's, and padding that is not zero (ranks out of step) are errors that say
 * so; so is a packed table ddt_cost_check refuses. */
static void test_cost_share(void **state) {
    (void)state;
    enum { W = 4 };
    float n0[DDT_ENGINE_COST_POINTS], v0[DDT_ENGINE_COST_POINTS];
    const int32_t pts0 = ddt_engine_cost_points(64, n0, DDT_ENGINE_COST_POINTS);
    for (int32_t i = 0; i < pts0; i++) v0[i] = 1e-4f * (1.0f + 0.37f * (float)i);
    float n1[3] = {0.0f, 4.0f, 8.0f}, v1[3] = {1.0f, 2.0f, 3.0f};
    float n2[DDT_ENGINE_COST_POINTS], v2[DDT_ENGINE_COST_POINTS];
    const int32_t pts2 = ddt_engine_cost_points(1024, n2, DDT_ENGINE_COST_POINTS);
    for (int32_t i = 0; i < pts2; i++) v2[i] = 5e-3f + 1e-3f * (float)i;
    const ddt_cost_model rank[W] = {{3.25e-4f, pts0, n0, 1, NULL, v0, 0.0f},
                                    {0.0f, 3, n1, 1, NULL, v1, 0.0f},
                                    {1.0f, pts2, n2, 1, NULL, v2, 0.0f},
                                    {2e-4f, 3, n1, 1, NULL, v1, 0.0f}};
    float buf[W][DDT_ENGINE_COST_WIRE];
    for (int r = 0; r < W; r++) ddt_engine_cost_pack(&rank[r], r == 0, buf[r]);
    static const int order[3][W] = {{0, 1, 2, 3}, {3, 2, 1, 0}, {2, 0, 3, 1}};
    for (int o = 0; o < 3; o++) {
        float sum[DDT_ENGINE_COST_WIRE];
        for (int i = 0; i < DDT_ENGINE_COST_WIRE; i++) {
            sum[i] = buf[order[o][0]][i];
            for (int k = 1; k < W; k++) sum[i] += buf[order[o][k]][i];
        }
        float nodes[DDT_ENGINE_COST_POINTS], verify[DDT_ENGINE_COST_POINTS];
        ddt_cost_model c;
        ddt_error err;
        assert_int_equal(ddt_engine_cost_unpack(sum, nodes, verify, &c, &err), DDT_OK);
        assert_int_equal(c.n_nodes, pts0);
        assert_int_equal(c.n_contexts, 1);
        assert_null(c.contexts);
        assert_ptr_equal(c.nodes, nodes);
        assert_ptr_equal(c.verify, verify);
        assert_memory_equal(&c.draft, &rank[0].draft, sizeof c.draft);
        assert_memory_equal(nodes, n0, sizeof(float) * (size_t)pts0);
        assert_memory_equal(verify, v0, sizeof(float) * (size_t)pts0);
    }
    /* what is not a packed model */
    float nodes[DDT_ENGINE_COST_POINTS], verify[DDT_ENGINE_COST_POINTS], bad[DDT_ENGINE_COST_WIRE];
    ddt_cost_model c;
    ddt_error err;
    ddt_engine_cost_pack(&rank[1], false, bad); /* nobody packed: all zeros */
    assert_int_equal(ddt_engine_cost_unpack(bad, nodes, verify, &c, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "point count 0"));
    ddt_engine_cost_pack(&rank[1], true, bad);
    bad[1] = (float)(DDT_ENGINE_COST_POINTS + 1);
    assert_int_equal(ddt_engine_cost_unpack(bad, nodes, verify, &c, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "point count"));
    bad[1] = 2.5f;
    assert_int_equal(ddt_engine_cost_unpack(bad, nodes, verify, &c, &err), DDT_ERR_INVALID);
    ddt_engine_cost_pack(&rank[1], true, bad);
    bad[2 + DDT_ENGINE_COST_POINTS + 5] = 1.0f; /* a verify entry past the 3 points */
    assert_int_equal(ddt_engine_cost_unpack(bad, nodes, verify, &c, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "entry 5"));
    ddt_engine_cost_pack(&rank[1], true, bad);
    bad[2 + DDT_ENGINE_COST_POINTS + 1] = -1.0f; /* a verify cost ddt_cost_check refuses */
    assert_int_equal(ddt_engine_cost_unpack(bad, nodes, verify, &c, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "shared cost table: "));
    assert_non_null(strstr(err.msg, "verify"));
}

/* The auto budget's fallback to ar steps (ddt_ar_fallback): a draft of 200 us and a
 * verify of 250 us (the root) to 280 us (16 nodes) break even at 1.92 tokens a round.
 * After a 4-token round, poor 1-token rounds pull the average (0.85 on the past) under
 * that at the 8th: a hold of 4 x ceil(plain / spec) = 8 ar steps, then a probe; a
 * losing probe doubles the hold (16), a winning one resets it; the longest is 64;
 * DDT_AR_FALLBACK_DECAY overrides the weight (0.5: the 2nd poor round holds); off, it
 * never holds. */
static void test_ar_fallback(void **state) {
    (void)state;
    static const float nodes[2] = {0.0f, 16.0f}, verify[2] = {2.5e-4f, 2.8e-4f};
    const ddt_cost_model c = {2e-4f, 2, nodes, 1, NULL, verify, 0.0f};
    unsetenv("DDT_AR_FALLBACK_DECAY");
    ddt_ar_fallback f;
    ddt_ar_fallback_start(&f, false);
    for (int i = 1; i <= 20; i++) ddt_ar_fallback_after_round(&f, (uint64_t)i, 1, 17, &c);
    assert_false(ddt_ar_fallback_step(&f));
    ddt_ar_fallback_start(&f, true);
    assert_true(f.decay == 0.85);
    uint64_t round = 1;
    ddt_ar_fallback_after_round(&f, round++, 4, 17, &c);
    assert_int_equal(f.hold, 0);
    int poor = 0;
    while (f.hold == 0 && poor < 20) {
        ddt_ar_fallback_after_round(&f, round++, 1, 17, &c);
        poor++;
    }
    assert_int_equal(poor, 8);
    assert_int_equal(f.hold, 8);
    int held = 0;
    while (ddt_ar_fallback_step(&f)) held++, round++;
    assert_int_equal(held, 8);
    ddt_ar_fallback_after_round(&f, round++, 1, 17, &c); /* a losing probe: the average starts at 1 */
    assert_int_equal(f.hold, 16);
    while (ddt_ar_fallback_step(&f)) round++;
    ddt_ar_fallback_after_round(&f, round++, 5, 17, &c); /* a winning one */
    assert_int_equal(f.hold, 0);
    assert_int_equal(f.backoff, DDT_AR_HOLD_MIN);
    /* a draft of 100 ms never pays: the longest hold */
    const ddt_cost_model dear = {0.1f, 2, nodes, 1, NULL, verify, 0.0f};
    ddt_ar_fallback_start(&f, true);
    ddt_ar_fallback_after_round(&f, 1, 16, 17, &dear);
    assert_int_equal(f.hold, DDT_AR_HOLD_MAX);
    /* the weight from the environment */
    setenv("DDT_AR_FALLBACK_DECAY", "0.5", 1);
    ddt_ar_fallback_start(&f, true);
    assert_true(f.decay == 0.5);
    ddt_ar_fallback_after_round(&f, 1, 4, 17, &c);
    ddt_ar_fallback_after_round(&f, 2, 1, 17, &c);
    assert_int_equal(f.hold, 0);
    ddt_ar_fallback_after_round(&f, 3, 1, 17, &c);
    assert_true(f.hold > 0);
    setenv("DDT_AR_FALLBACK_DECAY", "1.5", 1); /* out of (0, 1): the default */
    ddt_ar_fallback_start(&f, true);
    assert_true(f.decay == 0.85);
    unsetenv("DDT_AR_FALLBACK_DECAY");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk_cap),
        cmocka_unit_test(test_round_nodes),
        cmocka_unit_test(test_cost_points),
        cmocka_unit_test(test_measure_cost),
        cmocka_unit_test(test_adopt_cost),
        cmocka_unit_test(test_cost_share),
        cmocka_unit_test(test_ar_fallback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
