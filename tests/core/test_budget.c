/*
 * test_budget.c — the cost-aware ("auto") budget: interpolation of the verify
 * cost table, checks of bad tables, and the stopping rule of the builder
 * (src/core/budget.c, src/core/tree.c); and the bound on exp_det that the GPU
 * build's early stop (src/backend/cuda/tree_cuda.cu, auto_stop) stands on.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/detmath.h"
#include "ddtree.h"

static void test_interpolation(void **state) {
    (void)state;
    float nodes[3] = {0.0f, 10.0f, 30.0f};
    float ctx[2] = {1000.0f, 3000.0f};
    float ver[6] = {1.0f, 2.0f, 6.0f, /* at 1000 */ 3.0f, 4.0f, 8.0f /* at 3000 */};
    ddt_cost_model c = {0.5f, 3, nodes, 2, ctx, ver, 2000.0f};
    assert_int_equal(ddt_cost_check(&c, NULL), DDT_OK);
    assert_float_equal(ddt_cost_verify(&c, 0.0f), 2.0f, 1e-6);
    assert_float_equal(ddt_cost_verify(&c, 5.0f), 2.5f, 1e-6);
    assert_float_equal(ddt_cost_verify(&c, 20.0f), 5.0f, 1e-6);
    assert_float_equal(ddt_cost_verify(&c, 99.0f), 7.0f, 1e-6); /* clamped */
    c.context_len = 0.0f;
    assert_float_equal(ddt_cost_verify(&c, 10.0f), 2.0f, 1e-6);
    c.context_len = 1e9f;
    assert_float_equal(ddt_cost_verify(&c, 10.0f), 4.0f, 1e-6);
    assert_float_equal(ddt_cost_theta(&c, 10.0f, 1.0f), 2.0f / 4.5f, 1e-6);
}

static void test_bad_models(void **state) {
    (void)state;
    ddt_error err;
    float nodes[3] = {0.0f, 10.0f, 5.0f};
    float ver[3] = {1.0f, 2.0f, 3.0f};
    ddt_cost_model c = {0.5f, 3, nodes, 1, NULL, ver, 0.0f};
    assert_int_equal(ddt_cost_check(&c, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "increasing"));
    nodes[2] = 20.0f;
    ver[1] = 0.0f;
    assert_int_equal(ddt_cost_check(&c, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "verify[0][1]"));
    ver[1] = NAN;
    assert_int_equal(ddt_cost_check(&c, &err), DDT_ERR_INVALID);
    ver[1] = 2.0f;
    c.draft = -1.0f;
    assert_int_equal(ddt_cost_check(&c, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "draft"));
    c.draft = 0.5f;
    c.n_nodes = 0;
    assert_int_equal(ddt_cost_check(&c, &err), DDT_ERR_INVALID);
}

/* The builder stops at the first n where theta(n+1) <= theta(n), and the tree
 * it returns is the fixed-budget tree cut at that n. */
static void test_auto_budget_stops_where_theta_peaks(void **state) {
    (void)state;
    enum { D = 6, K = 8 };
    float logq[D * K];
    int32_t tok[D * K];
    srand(3);
    for (int d = 0; d < D; d++) {
        float v = -0.05f;
        for (int r = 0; r < K; r++) {
            logq[d * K + r] = v;
            v -= 0.2f + (float)(rand() % 100) / 50.0f;
            tok[d * K + r] = r;
        }
    }
    ddt_draft_table tb = {D, K, logq, tok};
    float nodes[4] = {0.0f, 8.0f, 32.0f, 128.0f};
    float ver[4] = {1.0f, 1.05f, 1.6f, 4.0f};
    ddt_cost_model c = {0.2f, 4, nodes, 1, NULL, ver, 0.0f};
    ddt_builder *b;
    ddt_tree t, full;
    assert_int_equal(ddt_builder_create(256, &b, NULL), DDT_OK);
    assert_int_equal(ddt_tree_alloc(257, &t, NULL), DDT_OK);
    assert_int_equal(ddt_tree_alloc(257, &full, NULL), DDT_OK);
    assert_int_equal(ddt_tree_build(b, &tb, 0, 256, &c, 0, &t, NULL), DDT_OK);
    assert_int_equal(ddt_tree_build(b, &tb, 0, 256, NULL, 0, &full, NULL), DDT_OK);
    int32_t n = t.n_nodes - 1;
    assert_true(n > 0 && n < 256);
    assert_memory_equal(t.token, full.token, (size_t)t.n_nodes * sizeof(int32_t));
    assert_memory_equal(t.parent, full.parent, (size_t)t.n_nodes * sizeof(int32_t));
    /* recompute theta along the full tree's pop order */
    /* in double, as the builder accumulates */
    double phi = 0.0, theta = 1.0 / ((double)c.draft + (double)ddt_cost_verify(&c, 0.0f));
    for (int32_t i = 1; i <= n; i++) {
        phi += (double)ddt_exp_det(full.logw[i]);
        double th = (1.0 + phi) / ((double)c.draft + (double)ddt_cost_verify(&c, (float)i));
        assert_true(th > theta);
        theta = th;
    }
    double phi_next = phi + (double)ddt_exp_det(full.logw[n + 1]);
    assert_true((1.0 + phi_next) / ((double)c.draft + (double)ddt_cost_verify(&c, (float)(n + 1))) <= theta);
    /* flat cost: more nodes always help, so the cap is reached */
    float flat[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    c.verify = flat;
    assert_int_equal(ddt_tree_build(b, &tb, 0, 100, &c, 0, &t, NULL), DDT_OK);
    assert_int_equal(t.n_nodes, 101);
    ddt_tree_free(&t);
    ddt_tree_free(&full);
    ddt_builder_destroy(b);
}

/* ddt_cost_bucket_cut: the bucket end of the highest theta, the first on ties,
 * against a from-scratch sum per bucket; a flat table takes the largest bucket,
 * a jump after the root the root alone, a tree shorter than the buckets the
 * first bucket that holds it. */
static void test_bucket_cut(void **state) {
    (void)state;
    float logw[65], vcost[65];
    const int32_t buckets[5] = {0, 4, 8, 16, 64};
    int32_t j;
    for (int i = 0; i < 65; i++) logw[i] = -0.1f * (float)i;
    for (int i = 0; i < 65; i++) vcost[i] = 1.0f; /* flat: every node is free */
    assert_int_equal(ddt_cost_bucket_cut(logw, 65, vcost, 0.5f, buckets, 5, &j), 65);
    assert_int_equal(j, 4);
    for (int i = 1; i < 65; i++) vcost[i] = 100.0f; /* any node costs 100x */
    assert_int_equal(ddt_cost_bucket_cut(logw, 65, vcost, 0.5f, buckets, 5, &j), 1);
    assert_int_equal(j, 0);
    for (int i = 0; i < 65; i++) vcost[i] = 1.0f + 0.001f * (float)i;
    assert_int_equal(ddt_cost_bucket_cut(logw, 11, vcost, 0.5f, buckets, 5, &j), 11); /* 10 nodes: bucket 16 */
    assert_int_equal(j, 3);
    assert_int_equal(ddt_cost_bucket_cut(logw, 1, vcost, 0.5f, buckets, 5, &j), 1); /* the root alone */
    assert_int_equal(j, 0);
    uint32_t r = 12345u;
    for (int it = 0; it < 2000; it++) {
        const int n = 1 + (int)((r = r * 1664525u + 1013904223u) >> 26);
        float acc = 0.0f;
        for (int i = 1; i < n; i++) logw[i] = acc -= (float)((r = r * 1664525u + 1013904223u) >> 8) / 16777216.0f;
        const float base = 1.0f, slope = (float)((r = r * 1664525u + 1013904223u) >> 16) / 65536.0f * 0.05f;
        for (int i = 0; i < 65; i++) vcost[i] = base + slope * (float)i * (float)(1 + i / 16);
        const float draft = 0.3f;
        const int32_t keep = ddt_cost_bucket_cut(logw, n, vcost, draft, buckets, 5, &j);
        double best = -1.0;
        int32_t want = -1, wj = -1;
        for (int b = 0; b < 5; b++) {
            const int m = buckets[b] < n - 1 ? buckets[b] : n - 1;
            double phi = 0.0;
            for (int i = 1; i <= m; i++) phi += (double)ddt_exp_det(logw[i]);
            const double th = (1.0 + phi) / ((double)draft + (double)vcost[buckets[b]]);
            if (th > best) {
                best = th;
                want = m + 1;
                wj = b;
            }
        }
        assert_int_equal(keep, want);
        assert_int_equal(j, wj);
    }
}

/* The GPU auto build stops early on a bound: a node's exp_det term is at most
 * 1 + 1e-6 times the last built node's, because later nodes weigh no more.
 * exp_det is not monotone to the ulp (at range-reduction boundaries a lower x
 * can give one ulp more), so check the bound itself over every float from
 * -88 (below -87.3 exp_det is 0) up to -0.0, and +0.0: the running maximum of
 * the values so far is within 1 + 5e-7 of each value (measured: 1 + 8e-8). */
static void test_exp_det_bound(void **state) {
    (void)state;
    float hi = 0.0f;
    double worst = 1.0;
    const float lo = -88.0f;
    uint32_t ulo;
    memcpy(&ulo, &lo, sizeof ulo);
    for (uint32_t u = ulo; u >= 0x80000000u; u--) { /* negative floats rise as the bits fall */
        float x;
        memcpy(&x, &u, sizeof x);
        const float e = ddt_exp_det_inline(x); /* the same code, without a call */
        if (e > hi) hi = e;
        else if (hi > 0.0f && (double)hi > (double)e * worst) worst = (double)hi / (double)e;
        if (u == 0x80000000u) break;
    }
    const float e0 = ddt_exp_det(0.0f);
    if ((double)hi > (double)e0 * worst) worst = (double)hi / (double)e0;
    assert_true(worst < 1.0 + 5e-7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interpolation),
        cmocka_unit_test(test_bad_models),
        cmocka_unit_test(test_auto_budget_stops_where_theta_peaks),
        cmocka_unit_test(test_bucket_cut),
        cmocka_unit_test(test_exp_det_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
