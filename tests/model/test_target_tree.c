/*
 * test_target_tree.c — tree verify, commit and rollback of the CPU target on the
 * fp32 fixture, checked against plain prefills on a second copy of the model:
 *  - every node's verify logits equal a prefill of its root-to-node path after
 *    the same prefix (normalised error <= 1e-5), for random trees (including
 *    more than 64 nodes, chains and a lone root) over random prefixes;
 *  - committing a random root-to-leaf path leaves the cache equal to that of
 *    prefilling the path, and the next step's logits match;
 *  - commit rejects what is not a root-to-node path of the last verify;
 *  - the engine's ddt_tree (ddt_tree_from_parents) drives verify directly;
 *  - rollback, chunked prefill and bad arguments.
 */
#include <math.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/target.h"

#define TOL 1e-5
#define MAX_NODES 80
#define WORDS ((MAX_NODES + 63) / 64)

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)((g_rng >> 16) % n);
}

static double norm_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num) / (sqrt(den) + 1e-30);
}

static ddt_target *load_fp32(int32_t max_ctx, int32_t max_tokens, int32_t threads) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/target/fp32", DDT_SOURCE_DIR);
    ddt_target_options o = {.max_ctx = max_ctx, .max_tokens = max_tokens, .n_threads = threads};
    ddt_target *t = NULL;
    ddt_error err = {0};
    if (ddt_target_load(dir, &o, &t, &err) != DDT_OK) fail_msg("load %s: %s", dir, err.msg);
    return t;
}

typedef struct tree {
    int32_t n;
    int32_t token[MAX_NODES], parent[MAX_NODES], depth[MAX_NODES];
    uint64_t vis[MAX_NODES][WORDS];
} tree;

/* shape: 0 random parents, 1 chain, 2 bushy (parents among the first few nodes) */
static void make_tree(tree *tr, int32_t n, int shape, int32_t vocab) {
    memset(tr, 0, sizeof *tr);
    tr->n = n;
    for (int32_t i = 0; i < n; i++) {
        tr->token[i] = (int32_t)rnd((uint32_t)vocab);
        if (i == 0) {
            tr->parent[i] = -1;
            tr->depth[i] = 0;
        } else {
            int32_t p = shape == 1 ? i - 1 : shape == 2 ? (int32_t)rnd(i < 4 ? (uint32_t)i : 4u) : (int32_t)rnd((uint32_t)i);
            tr->parent[i] = p;
            tr->depth[i] = tr->depth[p] + 1;
            memcpy(tr->vis[i], tr->vis[p], sizeof tr->vis[i]);
        }
        tr->vis[i][i / 64] |= 1ull << (i % 64);
    }
}

/* root-to-node path of node v: nodes in out[0..return) */
static int32_t path_to(const tree *tr, int32_t v, int32_t *out) {
    int32_t m = tr->depth[v] + 1;
    for (int32_t k = m - 1; k >= 0; k--, v = tr->parent[v]) out[k] = v;
    return m;
}

static void compare_caches(const ddt_cpu_kv *a, const ddt_cpu_kv *b, int32_t rows) {
    assert_int_equal(a->len, b->len);
    for (int32_t l = 0; l < a->n_layers; l++) {
        double e = norm_err(ddt_cpu_kv_row(a, l, 0), ddt_cpu_kv_row(b, l, 0), (size_t)rows * a->width);
        if (e > TOL) fail_msg("layer %d: committed cache differs from the prefilled one: error %g", l, e);
    }
}

static void run_tree_case(ddt_target *A, ddt_target *B, int32_t prefix_len, int32_t n, int shape) {
    ddt_error err = {0};
    const int32_t V = ddt_target_vocab(A);
    int32_t prefix[64];
    for (int32_t i = 0; i < prefix_len; i++) prefix[i] = (int32_t)rnd((uint32_t)V);
    assert_int_equal(ddt_target_rollback(A, 0, &err), DDT_OK);
    assert_int_equal(ddt_target_rollback(B, 0, &err), DDT_OK);
    if (prefix_len > 0) {
        assert_int_equal(ddt_target_prefill(A, prefix, prefix_len, NULL, false, &err), DDT_OK);
        assert_int_equal(ddt_target_prefill(B, prefix, prefix_len, NULL, false, &err), DDT_OK);
    }
    tree tr;
    make_tree(&tr, n, shape, V);
    float *lv = malloc(sizeof(float) * (size_t)n * V);
    float *lp = malloc(sizeof(float) * (size_t)MAX_NODES * V);
    if (ddt_target_verify(A, tr.token, tr.depth, &tr.vis[0][0], WORDS, n, lv, &err) != DDT_OK)
        fail_msg("verify: %s", err.msg);
    assert_int_equal(ddt_target_len(A), prefix_len);

    /* every node against a prefill of its path */
    int32_t path[MAX_NODES], toks[MAX_NODES];
    for (int32_t v = 0; v < n; v++) {
        int32_t m = path_to(&tr, v, path);
        for (int32_t k = 0; k < m; k++) toks[k] = tr.token[path[k]];
        assert_int_equal(ddt_target_rollback(B, prefix_len, &err), DDT_OK);
        assert_int_equal(ddt_target_prefill(B, toks, m, lp, false, &err), DDT_OK);
        double e = norm_err(lv + (size_t)v * V, lp, V);
        if (e > TOL) fail_msg("prefix %d, %d nodes, shape %d: node %d (depth %d): error %g", prefix_len, n, shape, v, tr.depth[v], e);
    }

    /* commit a random root-to-leaf path */
    int32_t leaves[MAX_NODES], n_leaves = 0;
    for (int32_t v = 0; v < n; v++) {
        bool is_leaf = true;
        for (int32_t j = v + 1; j < n; j++)
            if (tr.parent[j] == v) is_leaf = false;
        if (is_leaf) leaves[n_leaves++] = v;
    }
    int32_t leaf = leaves[rnd((uint32_t)n_leaves)];
    int32_t m = path_to(&tr, leaf, path);
    for (int32_t k = 0; k < m; k++) toks[k] = tr.token[path[k]];
    if (ddt_target_commit(A, path, m, &err) != DDT_OK) fail_msg("commit: %s", err.msg);
    assert_int_equal(ddt_target_len(A), prefix_len + m);
    assert_int_equal(ddt_target_rollback(B, prefix_len, &err), DDT_OK);
    assert_int_equal(ddt_target_prefill(B, toks, m, NULL, false, &err), DDT_OK);
    compare_caches(ddt_target_cache(A), ddt_target_cache(B), prefix_len + m);
    /* a commit is single-use */
    assert_int_equal(ddt_target_commit(A, path, m, &err), DDT_ERR_INVALID);

    /* the next step */
    int32_t next = (int32_t)rnd((uint32_t)V);
    assert_int_equal(ddt_target_prefill(A, &next, 1, lv, false, &err), DDT_OK);
    assert_int_equal(ddt_target_prefill(B, &next, 1, lp, false, &err), DDT_OK);
    double e = norm_err(lv, lp, V);
    if (e > TOL) fail_msg("next step after commit: error %g", e);
    free(lv);
    free(lp);
}

static void test_verify_matches_prefill(void **state) {
    (void)state;
    ddt_target *A = load_fp32(200, MAX_NODES, 2), *B = load_fp32(200, MAX_NODES, 1);
    run_tree_case(A, B, 5, 1, 0);   /* lone root */
    run_tree_case(A, B, 0, 9, 0);   /* no prefix */
    run_tree_case(A, B, 11, 17, 0);
    run_tree_case(A, B, 7, 12, 1);  /* chain */
    run_tree_case(A, B, 13, 31, 2); /* bushy */
    run_tree_case(A, B, 3, 70, 0);  /* two visibility words */
    run_tree_case(A, B, 20, 80, 2);
    for (int r = 0; r < 4; r++) run_tree_case(A, B, 1 + (int32_t)rnd(30), 2 + (int32_t)rnd(40), (int)rnd(3));
    ddt_target_free(A);
    ddt_target_free(B);
}

static void test_commit_rejects_non_paths(void **state) {
    (void)state;
    ddt_target *A = load_fp32(100, 16, 1);
    ddt_error err = {0};
    const int32_t V = ddt_target_vocab(A);
    int32_t pre[4] = {5, 6, 7, 8};
    assert_int_equal(ddt_target_prefill(A, pre, 4, NULL, false, &err), DDT_OK);
    int32_t path0[1] = {0};
    assert_int_equal(ddt_target_commit(A, path0, 1, &err), DDT_ERR_INVALID); /* no verify yet */
    /* root 0 with children 1, 2; 3 under 1 */
    int32_t tok[4] = {10, 11, 12, 13}, depth[4] = {0, 1, 1, 2};
    uint64_t vis[4] = {0x1, 0x3, 0x5, 0xB};
    float *lg = malloc(sizeof(float) * 4 * V);
    assert_int_equal(ddt_target_verify(A, tok, depth, vis, 1, 4, lg, &err), DDT_OK);
    int32_t bad1[2] = {0, 3};    /* node 3 has depth 2 */
    int32_t bad2[3] = {0, 2, 3}; /* 3's parent is 1, not 2 */
    int32_t bad3[2] = {1, 3};    /* does not start at the root */
    int32_t bad4[1] = {4};       /* no such node */
    assert_int_equal(ddt_target_commit(A, bad1, 2, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "depth"));
    assert_int_equal(ddt_target_commit(A, bad2, 3, &err), DDT_ERR_INVALID);
    assert_int_equal(ddt_target_commit(A, bad3, 2, &err), DDT_ERR_INVALID);
    assert_int_equal(ddt_target_commit(A, bad4, 1, &err), DDT_ERR_INVALID);
    assert_int_equal(ddt_target_len(A), 4);
    int32_t good[3] = {0, 1, 3};
    assert_int_equal(ddt_target_commit(A, good, 3, &err), DDT_OK);
    assert_int_equal(ddt_target_len(A), 7);
    /* bad trees */
    uint64_t noself[2] = {0x1, 0x1};
    int32_t d2[2] = {0, 1};
    assert_int_equal(ddt_target_verify(A, tok, d2, noself, 1, 2, lg, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "itself"));
    uint64_t beyond[2] = {0x1, 0x7};
    assert_int_equal(ddt_target_verify(A, tok, d2, beyond, 1, 2, lg, &err), DDT_ERR_INVALID);
    int32_t dbad[2] = {0, 2};
    uint64_t ok2[2] = {0x1, 0x3};
    assert_int_equal(ddt_target_verify(A, tok, dbad, ok2, 1, 2, lg, &err), DDT_ERR_INVALID);
    assert_int_equal(ddt_target_verify(A, tok, d2, ok2, 0, 2, lg, &err), DDT_ERR_INVALID);
    /* a failed verify leaves nothing to commit */
    assert_int_equal(ddt_target_commit(A, path0, 1, &err), DDT_ERR_INVALID);
    /* an empty commit is allowed and changes nothing */
    assert_int_equal(ddt_target_verify(A, tok, d2, ok2, 1, 2, lg, &err), DDT_OK);
    assert_int_equal(ddt_target_commit(A, NULL, 0, &err), DDT_OK);
    assert_int_equal(ddt_target_len(A), 7);
    free(lg);
    ddt_target_free(A);
}

static void test_rollback_and_chunks(void **state) {
    (void)state;
    ddt_target *A = load_fp32(64, 16, 2), *B = load_fp32(64, 16, 1);
    ddt_error err = {0};
    const int32_t V = ddt_target_vocab(A);
    float *la = malloc(sizeof(float) * 16 * V), *lb = malloc(sizeof(float) * 16 * V);
    int32_t p1[6] = {3, 40, 7, 99, 250, 12}, p2[5] = {8, 8, 8, 1, 2}, p3[4] = {77, 66, 55, 44};
    /* A: p1, p2, roll back to |p1|, p3.  B: p1 then p3 in one go. */
    assert_int_equal(ddt_target_prefill(A, p1, 6, NULL, false, &err), DDT_OK);
    assert_int_equal(ddt_target_prefill(A, p2, 5, NULL, false, &err), DDT_OK);
    assert_int_equal(ddt_target_len(A), 11);
    assert_int_equal(ddt_target_rollback(A, 12, &err), DDT_ERR_INVALID);
    assert_int_equal(ddt_target_rollback(A, -1, &err), DDT_ERR_INVALID);
    assert_int_equal(ddt_target_rollback(A, 6, &err), DDT_OK);
    assert_int_equal(ddt_target_prefill(A, p3, 4, la, true, &err), DDT_OK);
    int32_t all[10];
    memcpy(all, p1, sizeof p1);
    memcpy(all + 6, p3, sizeof p3);
    assert_int_equal(ddt_target_prefill(B, all, 10, lb, true, &err), DDT_OK);
    assert_true(norm_err(la, lb + 6 * (size_t)V, 4 * (size_t)V) <= TOL);
    /* chunked prefill (3 + 3 + 4) equals the single prefill of B */
    assert_int_equal(ddt_target_rollback(A, 0, &err), DDT_OK);
    assert_int_equal(ddt_target_prefill(A, all, 3, NULL, false, &err), DDT_OK);
    assert_int_equal(ddt_target_prefill(A, all + 3, 3, NULL, false, &err), DDT_OK);
    assert_int_equal(ddt_target_prefill(A, all + 6, 4, la, false, &err), DDT_OK);
    assert_true(norm_err(la, lb + 9 * (size_t)V, V) <= TOL);
    compare_caches(ddt_target_cache(A), ddt_target_cache(B), 10);
    free(la);
    free(lb);
    ddt_target_free(A);
    ddt_target_free(B);
}

static void test_bad_arguments(void **state) {
    (void)state;
    ddt_target *A = load_fp32(8, 4, 1);
    ddt_error err = {0};
    const int32_t V = ddt_target_vocab(A);
    float *lg = malloc(sizeof(float) * 4 * V);
    int32_t ids[5] = {1, 2, 3, 4, 5};
    assert_int_equal(ddt_target_prefill(A, ids, 5, lg, true, &err), DDT_ERR_RANGE); /* > max_tokens */
    assert_int_equal(ddt_target_prefill(A, ids, 0, lg, true, &err), DDT_ERR_RANGE);
    int32_t oov[1] = {V};
    assert_int_equal(ddt_target_prefill(A, oov, 1, lg, true, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "vocabulary"));
    int32_t neg[1] = {-1};
    assert_int_equal(ddt_target_prefill(A, neg, 1, lg, true, &err), DDT_ERR_INVALID);
    assert_int_equal(ddt_target_len(A), 0);
    assert_int_equal(ddt_target_prefill(A, ids, 4, NULL, false, &err), DDT_OK);
    assert_int_equal(ddt_target_prefill(A, ids, 4, NULL, false, &err), DDT_OK);
    assert_int_equal(ddt_target_prefill(A, ids, 1, lg, false, &err), DDT_ERR_RANGE); /* context full */
    assert_non_null(strstr(err.msg, "context"));
    assert_int_equal(ddt_target_len(A), 8);
    free(lg);
    ddt_target_free(A);
    /* options */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/target/fp32", DDT_SOURCE_DIR);
    ddt_target *t = NULL;
    ddt_target_options o = {.max_ctx = 0, .max_tokens = 1};
    assert_int_equal(ddt_target_load(dir, &o, &t, &err), DDT_ERR_INVALID);
    assert_null(t);
    int32_t cap[1] = {3};
    ddt_target_options o2 = {.max_ctx = 4, .max_tokens = 1, .capture_layers = cap, .n_capture = 1};
    assert_int_equal(ddt_target_load(dir, &o2, &t, &err), DDT_ERR_INVALID); /* fixture has 3 layers */
    assert_null(t);
}

/* The engine's ddt_tree (ddt_tree_from_parents) feeds verify directly and gives
 * the same logits as the tree built here. */
static void test_verify_with_ddt_tree(void **state) {
    (void)state;
    ddt_target *A = load_fp32(100, MAX_NODES, 2);
    ddt_error err = {0};
    const int32_t V = ddt_target_vocab(A);
    tree tr;
    make_tree(&tr, 40, 0, V);
    for (int32_t i = 0; i < tr.n; i++) tr.token[i] = 3 + i; /* siblings must differ */
    ddt_tree dt;
    assert_int_equal(ddt_tree_alloc(DDT_MAX_NODES, &dt, &err), DDT_OK);
    if (ddt_tree_from_parents(tr.token, tr.parent, tr.n, V, &dt, &err) != DDT_OK) fail_msg("tree: %s", err.msg);
    int32_t pre[3] = {9, 19, 29};
    float *l1 = malloc(sizeof(float) * (size_t)tr.n * V), *l2 = malloc(sizeof(float) * (size_t)tr.n * V);
    assert_int_equal(ddt_target_prefill(A, pre, 3, NULL, false, &err), DDT_OK);
    assert_int_equal(ddt_target_verify(A, dt.token, dt.depth, dt.vis, dt.vis_words, dt.n_nodes, l1, &err), DDT_OK);
    assert_int_equal(ddt_target_verify(A, tr.token, tr.depth, &tr.vis[0][0], WORDS, tr.n, l2, &err), DDT_OK);
    assert_memory_equal(l1, l2, sizeof(float) * (size_t)tr.n * V);
    free(l1);
    free(l2);
    ddt_tree_free(&dt);
    ddt_target_free(A);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_matches_prefill),
        cmocka_unit_test(test_verify_with_ddt_tree),
        cmocka_unit_test(test_commit_rejects_non_paths),
        cmocka_unit_test(test_rollback_and_chunks),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
