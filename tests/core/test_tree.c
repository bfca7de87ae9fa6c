/*
 * test_tree.c — unit tests of the best-first tree builder, the chain, given
 * trees and visibility (src/core/tree.c).  The independent numpy reference
 * comparison over thousands of random problems is tests/python/test_tree_ref.py.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "ddtree.h"

static int vis_bit(const ddt_tree *t, int32_t i, int32_t j) {
    return (int)((t->vis[(size_t)i * (size_t)t->vis_words + (size_t)(j >> 6)] >> (j & 63)) & 1u);
}

/* Brute force: enumerate every prefix of a tiny table, then the B heaviest
 * (ties by rank tuple) must be exactly the built tree's node set in pop order. */
typedef struct prefix {
    float w;
    int32_t d;
    int32_t r[8];
} prefix;

static int prefix_cmp(const void *pa, const void *pb) {
    const prefix *a = pa, *b = pb;
    if (a->w != b->w) return a->w > b->w ? -1 : 1;
    int32_t m = a->d < b->d ? a->d : b->d;
    for (int32_t i = 0; i < m; i++)
        if (a->r[i] != b->r[i]) return a->r[i] < b->r[i] ? -1 : 1;
    return a->d - b->d;
}

static void enumerate(const float *logq, int32_t D, int32_t K, prefix *cur, prefix *out, int32_t *n) {
    if (cur->d == D) return;
    for (int32_t r = 0; r < K; r++) {
        prefix nx = *cur;
        nx.r[nx.d] = r;
        nx.w = cur->w + logq[nx.d * K + r];
        nx.d++;
        out[(*n)++] = nx;
        enumerate(logq, D, K, &nx, out, n);
    }
}

static void test_matches_brute_force(void **state) {
    (void)state;
    srand(12345);
    ddt_builder *b;
    ddt_tree t;
    assert_int_equal(ddt_builder_create(DDT_MAX_BUDGET, &b, NULL), DDT_OK);
    assert_int_equal(ddt_tree_alloc(DDT_MAX_NODES, &t, NULL), DDT_OK);
    static prefix all[4000];
    for (int iter = 0; iter < 300; iter++) {
        int32_t D = 1 + rand() % 4, K = 1 + rand() % 5;
        float logq[4 * 5];
        int32_t tok[4 * 5];
        for (int32_t d = 0; d < D; d++) {
            for (int32_t r = 0; r < K; r++) {
                /* few distinct values: many exact ties */
                logq[d * K + r] = -(float)(rand() % 4) * 0.5f;
                tok[d * K + r] = 100 * d + r;
            }
            /* sort the row descending */
            for (int32_t i = 0; i < K; i++)
                for (int32_t j = i + 1; j < K; j++)
                    if (logq[d * K + j] > logq[d * K + i]) {
                        float x = logq[d * K + i];
                        logq[d * K + i] = logq[d * K + j];
                        logq[d * K + j] = x;
                    }
        }
        int32_t n = 0;
        prefix root = {0.0f, 0, {0}};
        enumerate(logq, D, K, &root, all, &n);
        qsort(all, (size_t)n, sizeof *all, prefix_cmp);
        int32_t B = rand() % (n + 3);
        ddt_draft_table tb = {D, K, logq, tok};
        assert_int_equal(ddt_tree_build(b, &tb, 7, B, NULL, 0, &t, NULL), DDT_OK);
        int32_t expect = B < n ? B : n;
        assert_int_equal(t.n_nodes, expect + 1);
        for (int32_t i = 1; i <= expect; i++) {
            /* node i's rank tuple, read back through its parents */
            int32_t r[8], d = t.depth[i];
            assert_int_equal(d, all[i - 1].d);
            for (int32_t j = i, k = d - 1; j > 0; j = t.parent[j], k--) r[k] = t.rank[j];
            assert_memory_equal(r, all[i - 1].r, (size_t)d * sizeof(int32_t));
            assert_true(t.parent[i] < i);
            assert_int_equal(t.token[i], 100 * (d - 1) + t.rank[i]);
        }
    }
    ddt_tree_free(&t);
    ddt_builder_destroy(b);
}

static void test_visibility_and_children(void **state) {
    (void)state;
    ddt_tree t;
    assert_int_equal(ddt_tree_alloc(200, &t, NULL), DDT_OK);
    int32_t tok[200], par[200];
    srand(7);
    tok[0] = 0;
    par[0] = -1;
    for (int32_t i = 1; i < 200; i++) {
        par[i] = rand() % i;
        while (par[i] > 0 && rand() % 3) par[i] = par[par[i]]; /* keep it shallow */
        tok[i] = i; /* unique tokens: no sibling clash */
    }
    assert_int_equal(ddt_tree_from_parents(tok, par, 200, 0, &t, NULL), DDT_OK);
    for (int32_t i = 0; i < 200; i++)
        for (int32_t j = 0; j < 200; j++) {
            int anc = 0;
            for (int32_t a = i; a >= 0; a = par[a]) anc |= a == j;
            assert_int_equal(vis_bit(&t, i, j), anc);
        }
    /* child lists: every non-root node appears once, under its parent, in index order */
    int seen[200] = {0};
    for (int32_t p = 0; p < 200; p++) {
        int32_t last = -1;
        for (int32_t c = t.first_child[p]; c >= 0; c = t.next_sibling[c]) {
            assert_int_equal(t.parent[c], p);
            assert_true(c > last);
            last = c;
            seen[c]++;
        }
    }
    for (int32_t i = 1; i < 200; i++) assert_int_equal(seen[i], 1);
    ddt_tree_free(&t);
}

static void test_chain(void **state) {
    (void)state;
    float logq[3 * 2] = {-0.1f, -2.0f, -0.2f, -3.0f, -0.3f, -4.0f};
    int32_t tok[3 * 2] = {5, 6, 7, 8, 9, 10};
    ddt_draft_table tb = {3, 2, logq, tok};
    ddt_tree t;
    assert_int_equal(ddt_tree_alloc(8, &t, NULL), DDT_OK);
    assert_int_equal(ddt_tree_build_chain(&tb, 1, 10, 0, &t, NULL), DDT_OK);
    assert_int_equal(t.n_nodes, 4);
    int32_t want_tok[4] = {1, 5, 7, 9}, want_par[4] = {-1, 0, 1, 2};
    assert_memory_equal(t.token, want_tok, sizeof want_tok);
    assert_memory_equal(t.parent, want_par, sizeof want_par);
    assert_true(t.logw[3] == (-0.1f + -0.2f) + -0.3f);
    assert_int_equal(ddt_tree_build_chain(&tb, 1, 2, 0, &t, NULL), DDT_OK);
    assert_int_equal(t.n_nodes, 3);
    ddt_tree_free(&t);
}

static void test_bad_tables(void **state) {
    (void)state;
    ddt_builder *b;
    ddt_tree t;
    ddt_error err;
    assert_int_equal(ddt_builder_create(64, &b, NULL), DDT_OK);
    assert_int_equal(ddt_tree_alloc(65, &t, NULL), DDT_OK);
    float logq[2 * 3] = {-0.1f, -0.2f, -0.3f, -0.1f, -0.5f, -0.4f}; /* row 1 unsorted */
    int32_t tok[2 * 3] = {1, 2, 3, 4, 5, 6};
    ddt_draft_table tb = {2, 3, logq, tok};
    assert_int_equal(ddt_tree_build(b, &tb, 0, 5, NULL, 0, &t, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "row 1"));
    logq[5] = -0.6f;
    logq[1] = NAN;
    assert_int_equal(ddt_tree_build(b, &tb, 0, 5, NULL, 0, &t, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "NaN"));
    logq[1] = -0.2f;
    assert_int_equal(ddt_tree_build(b, &tb, 0, 5, NULL, 0, &t, &err), DDT_OK);
    assert_int_equal(ddt_tree_build(b, &tb, 0, 5, NULL, 5, &t, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "token 5"));
    tok[4] = 4; /* duplicate token in row 1, used ranks */
    assert_int_equal(ddt_tree_build(b, &tb, 0, 6, NULL, 0, &t, &err), DDT_OK); /* rank 1 unused */
    assert_int_equal(ddt_tree_build(b, &tb, 0, 8, NULL, 0, &t, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "twice"));
    tok[4] = 5;
    assert_int_equal(ddt_tree_build(b, &tb, 0, 65, NULL, 0, &t, &err), DDT_ERR_RANGE);
    tb.depth = 32;
    assert_int_equal(ddt_tree_build(b, &tb, 0, 5, NULL, 0, &t, &err), DDT_ERR_RANGE);
    tb.depth = 2;
    tb.k = 0;
    assert_int_equal(ddt_tree_build(b, &tb, 0, 5, NULL, 0, &t, &err), DDT_ERR_RANGE);
    ddt_tree_free(&t);
    assert_int_equal(ddt_tree_alloc(3, &t, NULL), DDT_OK);
    tb.k = 3;
    assert_int_equal(ddt_tree_build(b, &tb, 0, 5, NULL, 0, &t, &err), DDT_ERR_RANGE);
    assert_non_null(strstr(err.msg, "capacity"));
    ddt_tree_free(&t);
    ddt_builder_destroy(b);
    assert_int_equal(ddt_tree_alloc(0, &t, &err), DDT_ERR_RANGE);
    assert_int_equal(ddt_builder_create(DDT_MAX_BUDGET + 1, &b, &err), DDT_ERR_RANGE);
}

static void test_bad_given_trees(void **state) {
    (void)state;
    ddt_tree t;
    ddt_error err;
    assert_int_equal(ddt_tree_alloc(40, &t, NULL), DDT_OK);
    int32_t tok[4] = {1, 2, 3, 4};
    int32_t cyc[4] = {-1, 0, 3, 2}; /* 2 <-> 3 cycle, also parent after child */
    assert_int_equal(ddt_tree_from_parents(tok, cyc, 4, 0, &t, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "node 2"));
    int32_t noroot[4] = {0, 0, 1, 2};
    assert_int_equal(ddt_tree_from_parents(tok, noroot, 4, 0, &t, &err), DDT_ERR_INVALID);
    int32_t neg[4] = {-1, 0, -2, 1};
    assert_int_equal(ddt_tree_from_parents(tok, neg, 4, 0, &t, &err), DDT_ERR_INVALID);
    int32_t ok[4] = {-1, 0, 0, 1};
    int32_t dup[4] = {1, 2, 2, 4};
    assert_int_equal(ddt_tree_from_parents(dup, ok, 4, 0, &t, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "share parent 0"));
    assert_int_equal(ddt_tree_from_parents(tok, ok, 4, 4, &t, &err), DDT_ERR_INVALID);
    assert_int_equal(ddt_tree_from_parents(tok, ok, 41, 0, &t, &err), DDT_ERR_RANGE);
    /* a chain deeper than the depth limit */
    int32_t ct[40], cp[40];
    for (int32_t i = 0; i < 40; i++) {
        ct[i] = i;
        cp[i] = i - 1;
    }
    assert_int_equal(ddt_tree_from_parents(ct, cp, 40, 0, &t, &err), DDT_ERR_RANGE);
    assert_non_null(strstr(err.msg, "depth"));
    assert_int_equal(ddt_tree_from_parents(ct, cp, 32, 0, &t, &err), DDT_OK);
    ddt_tree_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_brute_force),
        cmocka_unit_test(test_visibility_and_children),
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_bad_tables),
        cmocka_unit_test(test_bad_given_trees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
