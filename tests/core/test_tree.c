/*
 * test_tree.c — unit tests of the best-first tree builder, the chain, given
 * trees and visibility (src/core/tree.c).  The independent numpy reference
 * comparison over thousands of random problems is tests/python/test_tree_ref.py.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
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

/* ------------------------------------------------------------ refusal predicate */

/* A path-dependent refusal, as a grammar's is: a node's state is a hash of its
 * path's tokens from the root, and a candidate is refused when the hash of its
 * parent's state and its token falls in the lowest `percent` of 100.  The
 * builder's callback keeps the state per node index; the brute force below
 * recomputes it along each prefix, so the two share nothing but this step. */
static uint32_t path_step(uint32_t h, int32_t token) {
    h = (h ^ (uint32_t)token) * 0x9E3779B1u;
    h ^= h >> 15;
    h *= 0x85EBCA77u;
    return h ^ (h >> 13);
}

typedef struct refuser {
    uint32_t root;
    int32_t percent;        /* 0: accept all, 100: refuse all */
    uint32_t st[DDT_MAX_NODES];
    int32_t kept, refused;  /* callbacks so far that accepted / refused */
    bool in_order;          /* every call saw node == kept + 1 and parent < node */
} refuser;

static bool refuse_some(void *ctx, int32_t parent, int32_t node, int32_t token) {
    refuser *r = ctx;
    if (node != r->kept + 1 || parent < 0 || parent >= node) r->in_order = false;
    uint32_t h = path_step(r->st[parent], token);
    if ((int32_t)(h % 100u) < r->percent) {
        r->refused++;
        return false;
    }
    r->st[node] = h;
    r->kept++;
    return true;
}

static bool accept_all(void *ctx, int32_t parent, int32_t node, int32_t token) {
    (void)parent, (void)node, (void)token;
    (*(int64_t *)ctx)++;
    return true;
}

/* Every prefix with its weight and whether its whole path is allowed. */
typedef struct aprefix {
    prefix p;
    uint32_t h;
    bool ok;
} aprefix;

static int aprefix_cmp(const void *pa, const void *pb) {
    return prefix_cmp(&((const aprefix *)pa)->p, &((const aprefix *)pb)->p);
}

static void enumerate_allowed(const float *logq, const int32_t *tok, int32_t D, int32_t K, int32_t percent,
                              const aprefix *cur, aprefix *out, int32_t *n) {
    if (cur->p.d == D) return;
    for (int32_t r = 0; r < K; r++) {
        aprefix nx = *cur;
        nx.p.r[nx.p.d] = r;
        nx.p.w = cur->p.w + logq[nx.p.d * K + r];
        nx.h = path_step(cur->h, tok[nx.p.d * K + r]);
        nx.ok = cur->ok && (int32_t)(nx.h % 100u) >= percent;
        nx.p.d++;
        out[(*n)++] = nx;
        enumerate_allowed(logq, tok, D, K, percent, &nx, out, n);
    }
}

/* The filtered build equals the brute force's heaviest allowed prefixes (every
 * node of the path allowed), in order, whatever the refusal rate; the callback
 * sees candidates in pop order with consecutive node indices. */
static void test_filtered_matches_brute_force(void **state) {
    (void)state;
    srand(4242);
    ddt_builder *b;
    ddt_tree t;
    assert_int_equal(ddt_builder_create(DDT_MAX_BUDGET, &b, NULL), DDT_OK);
    assert_int_equal(ddt_tree_alloc(DDT_MAX_NODES, &t, NULL), DDT_OK);
    static aprefix all[6000];
    static refuser ref;
    const int32_t percents[] = {0, 10, 30, 50, 80, 100};
    int64_t refused = 0, short_trees = 0, refilled = 0;
    for (int iter = 0; iter < 2000; iter++) {
        int32_t D = 1 + rand() % 5, K = 1 + rand() % 5;
        if (D == 5 && K > 4) K = 4; /* 5 + 25 + ... + 4^5: the table fits `all` */
        float logq[5 * 5];
        int32_t tok[5 * 5];
        const bool ties = rand() % 2;
        for (int32_t d = 0; d < D; d++) {
            for (int32_t r = 0; r < K; r++) {
                logq[d * K + r] = ties ? -(float)(rand() % 4) * 0.5f : -(float)(rand() % 10000) * 1e-3f;
                tok[d * K + r] = 100 * d + r;
            }
            for (int32_t i = 0; i < K; i++)
                for (int32_t j = i + 1; j < K; j++)
                    if (logq[d * K + j] > logq[d * K + i]) {
                        float x = logq[d * K + i];
                        logq[d * K + i] = logq[d * K + j];
                        logq[d * K + j] = x;
                    }
        }
        const int32_t percent = percents[rand() % 6];
        const uint32_t root_h = (uint32_t)rand();
        int32_t n = 0;
        aprefix root = {{0.0f, 0, {0}}, root_h, true};
        enumerate_allowed(logq, tok, D, K, percent, &root, all, &n);
        qsort(all, (size_t)n, sizeof *all, aprefix_cmp);
        int32_t n_ok = 0;
        for (int32_t i = 0; i < n; i++) {
            if (all[i].ok) all[n_ok++] = all[i]; /* stable: the allowed ones in order */
        }
        const int32_t B = rand() % ((n < DDT_MAX_BUDGET - 2 ? n : DDT_MAX_BUDGET - 2) + 3);
        memset(&ref, 0, sizeof ref);
        ref.root = root_h;
        ref.st[0] = root_h;
        ref.percent = percent;
        ref.in_order = true;
        ddt_draft_table tb = {D, K, logq, tok};
        assert_int_equal(ddt_tree_build_filtered(b, &tb, 7, B, NULL, 0, refuse_some, &ref, &t, NULL), DDT_OK);
        const int32_t expect = B < n_ok ? B : n_ok;
        assert_int_equal(t.n_nodes, expect + 1);
        assert_true(ref.in_order);
        assert_int_equal(ref.kept, expect); /* no cost model: every accepted candidate is a node */
        for (int32_t i = 1; i <= expect; i++) {
            int32_t r[8], d = t.depth[i];
            assert_int_equal(d, all[i - 1].p.d);
            for (int32_t j = i, k = d - 1; j > 0; j = t.parent[j], k--) r[k] = t.rank[j];
            assert_memory_equal(r, all[i - 1].p.r, (size_t)d * sizeof(int32_t));
            assert_true(t.logw[i] == all[i - 1].p.w);
            assert_int_equal(t.token[i], 100 * (d - 1) + t.rank[i]);
            /* the children lists and visibility are the tree's own: the path is visible */
            for (int32_t j = i; j >= 0; j = t.parent[j]) assert_int_equal(vis_bit(&t, i, j), 1);
        }
        refused += ref.refused;
        short_trees += expect < B;
        /* the refill at work: a refused node's budget went to a lighter allowed prefix */
        refilled += ref.refused > 0 && expect == B && B > 0;
    }
    /* the cases cover refusals, trees cut short by the table and refilled trees */
    assert_true(refused > 1000 && short_trees > 50 && refilled > 50);
    ddt_tree_free(&t);
    ddt_builder_destroy(b);
}

/* An always-true predicate builds exactly the unfiltered tree, bit for bit,
 * larger problems included, and is asked once per node. */
static void test_filtered_accept_all_is_unfiltered(void **state) {
    (void)state;
    srand(99);
    ddt_builder *b;
    ddt_tree t, u;
    assert_int_equal(ddt_builder_create(DDT_MAX_BUDGET, &b, NULL), DDT_OK);
    assert_int_equal(ddt_tree_alloc(DDT_MAX_NODES, &t, NULL), DDT_OK);
    assert_int_equal(ddt_tree_alloc(DDT_MAX_NODES, &u, NULL), DDT_OK);
    static float logq[16 * 64];
    static int32_t tok[16 * 64];
    for (int iter = 0; iter < 300; iter++) {
        int32_t D = 1 + rand() % 16, K = 1 + rand() % 64, B = rand() % (DDT_MAX_BUDGET + 1);
        for (int32_t d = 0; d < D; d++) {
            float x = 0.0f;
            for (int32_t r = 0; r < K; r++) {
                x -= (float)(rand() % 3) * 0.25f; /* exact ties along the row and across rows */
                logq[d * K + r] = x;
                tok[d * K + r] = r;
            }
        }
        ddt_draft_table tb = {D, K, logq, tok};
        int64_t calls = 0;
        assert_int_equal(ddt_tree_build(b, &tb, 3, B, NULL, 0, &u, NULL), DDT_OK);
        assert_int_equal(ddt_tree_build_filtered(b, &tb, 3, B, NULL, 0, accept_all, &calls, &t, NULL), DDT_OK);
        assert_int_equal(t.n_nodes, u.n_nodes);
        assert_int_equal(calls, t.n_nodes - 1);
        const size_t n = (size_t)t.n_nodes;
        assert_memory_equal(t.token, u.token, n * sizeof(int32_t));
        assert_memory_equal(t.parent, u.parent, n * sizeof(int32_t));
        assert_memory_equal(t.depth, u.depth, n * sizeof(int32_t));
        assert_memory_equal(t.rank, u.rank, n * sizeof(int32_t));
        assert_memory_equal(t.logw, u.logw, n * sizeof(float));
        assert_memory_equal(t.vis, u.vis, n * (size_t)t.vis_words * sizeof(uint64_t));
        /* and a NULL predicate is the unfiltered build itself */
        assert_int_equal(ddt_tree_build_filtered(b, &tb, 3, B, NULL, 0, NULL, NULL, &t, NULL), DDT_OK);
        assert_int_equal(t.n_nodes, u.n_nodes);
        assert_memory_equal(t.logw, u.logw, n * sizeof(float));
    }
    ddt_tree_free(&t);
    ddt_tree_free(&u);
    ddt_builder_destroy(b);
}

/* A hand case: rows [a -0.1, b -0.2, c -0.3] and [x -0.1, y -0.5, z -0.6] (tokens
 * 1 2 3, 7 8 9), budget 4, b refused: a, ax, c, cx.  b is asked once and its child
 * never; c takes b's place and gets children, the budget is full. */
typedef struct asked {
    int32_t n, parent[16], node[16], token[16];
    bool refuse_all;
} asked;

static bool refuse_b(void *ctx, int32_t parent, int32_t node, int32_t token) {
    asked *a = ctx;
    a->parent[a->n] = parent;
    a->node[a->n] = node;
    a->token[a->n++] = token;
    return !a->refuse_all && token != 2;
}

static void test_filtered_hand_example(void **state) {
    (void)state;
    float logq[2 * 3] = {-0.1f, -0.2f, -0.3f, -0.1f, -0.5f, -0.6f};
    int32_t tok[2 * 3] = {1, 2, 3, 7, 8, 9};
    ddt_draft_table tb = {2, 3, logq, tok};
    ddt_builder *b;
    ddt_tree t;
    assert_int_equal(ddt_builder_create(8, &b, NULL), DDT_OK);
    assert_int_equal(ddt_tree_alloc(9, &t, NULL), DDT_OK);
    asked a = {0};
    assert_int_equal(ddt_tree_build_filtered(b, &tb, 0, 4, NULL, 0, refuse_b, &a, &t, NULL), DDT_OK);
    assert_int_equal(t.n_nodes, 5);
    int32_t want_tok[5] = {0, 1, 7, 3, 7}, want_par[5] = {-1, 0, 1, 0, 3};
    assert_memory_equal(t.token, want_tok, sizeof want_tok);
    assert_memory_equal(t.parent, want_par, sizeof want_par);
    /* pops: a (-0.1), ax (-0.2, before b on the tie: rank tuple (0,0) < (1)), b (refused),
       c (-0.3), cx (-0.4) */
    assert_int_equal(a.n, 5);
    int32_t want_asked_tok[5] = {1, 7, 2, 3, 7}, want_asked_par[5] = {0, 1, 0, 0, 3}, want_asked_node[5] = {1, 2, 3, 3, 4};
    assert_memory_equal(a.token, want_asked_tok, sizeof want_asked_tok);
    assert_memory_equal(a.parent, want_asked_par, sizeof want_asked_par);
    assert_memory_equal(a.node, want_asked_node, sizeof want_asked_node);
    /* refusing everything leaves the root alone, and only depth 1 is ever asked */
    memset(&a, 0, sizeof a);
    a.refuse_all = true;
    assert_int_equal(ddt_tree_build_filtered(b, &tb, 0, 8, NULL, 0, refuse_b, &a, &t, NULL), DDT_OK);
    assert_int_equal(t.n_nodes, 1);
    assert_int_equal(t.first_child[0], -1);
    assert_int_equal(a.n, 3);
    int32_t depth1[3] = {1, 2, 3};
    assert_memory_equal(a.token, depth1, sizeof depth1);
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
        cmocka_unit_test(test_filtered_matches_brute_force),
        cmocka_unit_test(test_filtered_accept_all_is_unfiltered),
        cmocka_unit_test(test_filtered_hand_example),
        cmocka_unit_test(test_visibility_and_children),
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_bad_tables),
        cmocka_unit_test(test_bad_given_trees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
