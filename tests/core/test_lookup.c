/*
 * test_lookup.c — the context lookup (src/core/lookup.c) and the graft of its path
 * onto a best-first tree (ddt_tree_graft, src/core/tree.c).  The proposal against
 * a brute-force search (every suffix length from the longest down, every earlier
 * position from the latest back) on random contexts over small alphabets, where
 * matches of every length happen, and the edge cases (too short, no match, the
 * continuation cut at max_len and at the context's end).  The graft against a
 * reference that sorts the union of the tree's nodes and the path's prefixes by
 * weight (the tree's first on ties) and takes them while they fit: the same nodes
 * kept and taken; then the tree it leaves: at most budget + 1 nodes, a prefix of
 * the pop order with its weights, the path below the root, no two siblings with
 * one token, parents before children and visibility rows of ancestors.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/lookup.h"
#include "ddtree.h"

static uint64_t g_rng = 0x0123456789ABCDEFull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

/* The rule as lookup.h states it, by brute force. */
static int32_t ref_propose(const int32_t *ctx, int32_t n, int32_t max_len, int32_t *out, int32_t *ml) {
    *ml = 0;
    for (int32_t len = DDT_LOOKUP_MAX; len >= DDT_LOOKUP_MIN; len--) {
        if (len > n - 1) continue;
        for (int32_t s = n - 2; s >= len - 1; s--) {
            bool eq = true;
            for (int32_t k = 0; k < len && eq; k++) eq = ctx[s - k] == ctx[n - 1 - k];
            if (!eq) continue;
            int32_t c = n - 1 - s < max_len ? n - 1 - s : max_len;
            for (int32_t i = 0; i < c; i++) out[i] = ctx[s + 1 + i];
            *ml = len;
            return c;
        }
    }
    return 0;
}

static void test_propose(void **state) {
    (void)state;
    int32_t ctx[600], a[40], b[40];
    int hits[DDT_LOOKUP_MAX + 1] = {0};
    for (int it = 0; it < 20000; it++) {
        const int32_t n = 1 + (int32_t)(rnd() % 600), alpha = 2 + (int32_t)(rnd() % 30);
        const int32_t max_len = 1 + (int32_t)(rnd() % 31);
        for (int32_t i = 0; i < n; i++) ctx[i] = (int32_t)(rnd() % (uint32_t)alpha);
        if (it % 7 == 0 && n > 20) { /* a planted repeat */
            const int32_t at = (int32_t)(rnd() % (uint32_t)(n - 12));
            memmove(ctx + n - 10, ctx + at, 10 * sizeof(int32_t)); /* may overlap */
        }
        int32_t ma, mb;
        const int32_t la = ddt_lookup_propose(ctx, n, max_len, a, &ma);
        const int32_t lb = ref_propose(ctx, n, max_len, b, &mb);
        if (la != lb || ma != mb || memcmp(a, b, sizeof(int32_t) * (size_t)la) != 0)
            fail_msg("n %d alphabet %d max_len %d: got %d tokens (match %d), reference %d (match %d)", n, alpha,
                     max_len, la, ma, lb, mb);
        hits[ma]++;
        assert_true(la <= max_len);
        if (ma) assert_true(la >= 1 && ma >= DDT_LOOKUP_MIN && ma <= DDT_LOOKUP_MAX);
    }
    for (int m = DDT_LOOKUP_MIN; m <= DDT_LOOKUP_MAX; m++) assert_true(hits[m] > 50); /* every length was seen */
    assert_true(hits[0] > 50);
    /* edges */
    int32_t ml;
    const int32_t two[2] = {5, 5}, none[6] = {1, 2, 3, 4, 5, 6}, rep[7] = {1, 2, 9, 1, 2, 7, 7};
    assert_int_equal(ddt_lookup_propose(two, 2, 4, a, &ml), 0);
    assert_int_equal(ml, 0);
    assert_int_equal(ddt_lookup_propose(none, 6, 4, a, &ml), 0);
    assert_int_equal(ddt_lookup_propose(rep, 5, 8, a, &ml), 3); /* "1 2" seen at 0: then 9 1 2 */
    assert_int_equal(ml, 2);
    assert_true(a[0] == 9 && a[1] == 1 && a[2] == 2);
    assert_int_equal(ddt_lookup_propose(rep, 5, 1, a, &ml), 1);
    assert_int_equal(ddt_lookup_propose(rep, 7, 8, a, &ml), 0); /* "7 7": the 7 before is the suffix's own */
    assert_int_equal(ddt_lookup_propose(NULL, 7, 8, a, &ml), 0);
}

/* ------------------------------------------------------------------ graft */

typedef struct cand {
    float w;
    int kind; /* 0 tree node, 1 path prefix */
    int32_t idx;
} cand;

static int cmp_cand(const void *pa, const void *pb) {
    const cand *a = pa, *b = pb;
    if (a->w != b->w) return a->w > b->w ? -1 : 1;
    if (a->kind != b->kind) return a->kind - b->kind;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

/* The union sorted by weight, taken while it fits: a path prefix whose twin is
 * taken is free, and a twin of a taken path prefix is free. */
static void ref_plan(const ddt_tree *t, const int32_t *twin, const float *v, int32_t len, int32_t budget,
                     int32_t *keep, int32_t *take) {
    static cand c[DDT_MAX_NODES + DDT_MAX_DEPTH];
    int32_t m = 0;
    for (int32_t i = 1; i < t->n_nodes; i++) c[m++] = (cand){t->logw[i], 0, i};
    for (int32_t j = 0; j < len; j++) c[m++] = (cand){v[j], 1, j};
    qsort(c, (size_t)m, sizeof *c, cmp_cand);
    int32_t count = 0, k = 1, j = 0;
    for (int32_t q = 0; q < m; q++) {
        if (c[q].kind == 0) {
            bool free_ = false;
            for (int32_t p = 0; p < j; p++) free_ |= twin[p] == c[q].idx;
            if (!free_ && count + 1 > budget) break;
            count += free_ ? 0 : 1;
            k = c[q].idx + 1;
        } else {
            if (twin[c[q].idx] >= 1 && twin[c[q].idx] < k) { /* held by the kept tree */
                j = c[q].idx + 1;
                continue;
            }
            if (count + 1 > budget) break;
            count++;
            j = c[q].idx + 1;
        }
    }
    *keep = k;
    *take = j;
}

static void test_graft(void **state) {
    (void)state;
    enum { D = 9, K = 6 };
    ddt_builder *b;
    ddt_tree t;
    ddt_error err = {0};
    assert_int_equal(ddt_builder_create(80, &b, &err), DDT_OK);
    assert_int_equal(ddt_tree_alloc(81, &t, &err), DDT_OK);
    float lq[D * K];
    int32_t tok[D * K], path[D], twin[DDT_MAX_DEPTH];
    float v[D];
    int grafted_total = 0, shared_total = 0, cut_total = 0;
    for (int it = 0; it < 5000; it++) {
        for (int d = 0; d < D; d++) {
            float x = -0.3f * (float)(rnd() % 4);
            for (int r = 0; r < K; r++) {
                lq[d * K + r] = x;
                x -= 0.25f * (float)(rnd() % 5);
                tok[d * K + r] = r * 3 + (int32_t)(rnd() % 3); /* distinct within a row */
            }
        }
        const int32_t budget = (int32_t)(rnd() % 80);
        const ddt_draft_table tb = {D, K, lq, tok};
        assert_int_equal(ddt_tree_build(b, &tb, 1, budget, NULL, 100, &t, &err), DDT_OK);
        const int32_t n0 = t.n_nodes;
        static float logw0[81];
        static int32_t tok0[81], par0[81];
        memcpy(logw0, t.logw, sizeof(float) * (size_t)n0);
        memcpy(tok0, t.token, sizeof(int32_t) * (size_t)n0);
        memcpy(par0, t.parent, sizeof(int32_t) * (size_t)n0);
        /* a path: often along the tree's own ranks (shared prefixes), then off it */
        const int32_t len = (int32_t)(rnd() % (D + 1));
        for (int32_t j = 0; j < len; j++) path[j] = rnd() % 3 ? tok[j * K + (int32_t)(rnd() % 2)] : 50 + (int32_t)(rnd() % 40);
        float acc = -(float)(rnd() % 8) * 0.2f;
        for (int32_t j = 0; j < len; j++) {
            v[j] = acc;
            acc -= 0.05f * (float)(rnd() % 6);
        }
        int32_t keep, take, rkeep, rtake;
        take = ddt_tree_graft_plan(&t, path, v, len, budget, twin, &keep);
        ref_plan(&t, twin, v, len, budget, &rkeep, &rtake);
        if (keep != rkeep || take != rtake)
            fail_msg("it %d: budget %d, tree %d nodes, path %d: kept %d took %d, reference %d / %d", it, budget, n0, len,
                     keep, take, rkeep, rtake);
        int32_t grafted;
        assert_int_equal(ddt_tree_graft(&t, path, v, len, budget, 100, &grafted, &err), DDT_OK);
        const int32_t n = t.n_nodes;
        assert_true(n <= budget + 1);
        assert_int_equal(n, keep + grafted);
        grafted_total += grafted;
        shared_total += take - grafted;
        cut_total += keep < n0;
        /* the kept nodes are the pop order's prefix, as built */
        assert_memory_equal(t.logw, logw0, sizeof(float) * (size_t)keep);
        assert_memory_equal(t.token, tok0, sizeof(int32_t) * (size_t)keep);
        assert_memory_equal(t.parent, par0, sizeof(int32_t) * (size_t)keep);
        /* the path's first `take` tokens hang below the root */
        int32_t cur = 0;
        for (int32_t j = 0; j < take; j++) {
            int32_t c = t.first_child[cur];
            while (c >= 0 && t.token[c] != path[j]) c = t.next_sibling[c];
            if (c < 0) fail_msg("it %d: path token %d (%d) is not below node %d", it, j, path[j], cur);
            if (c >= keep) assert_true(t.logw[c] == v[j] && t.rank[c] == -1);
            cur = c;
        }
        /* the structure: parents before children, depth, distinct siblings, visibility */
        for (int32_t i = 1; i < n; i++) {
            assert_true(t.parent[i] >= 0 && t.parent[i] < i);
            assert_int_equal(t.depth[i], t.depth[t.parent[i]] + 1);
            for (int32_t c = t.next_sibling[i]; c >= 0; c = t.next_sibling[c]) assert_true(t.token[c] != t.token[i]);
            for (int32_t a = 0; a < n; a++) {
                bool anc = false;
                for (int32_t x = i; x >= 0 && !anc; x = t.parent[x]) anc = x == a;
                const bool bit = (t.vis[(size_t)i * (size_t)t.vis_words + (size_t)(a >> 6)] >> (a & 63)) & 1u;
                assert_true(bit == anc);
            }
        }
    }
    print_message("  graft: %d nodes grafted, %d path tokens the tree held, %d trees cut\n", grafted_total,
                  shared_total, cut_total);
    assert_true(grafted_total > 1000 && shared_total > 1000 && cut_total > 500); /* every case was exercised */
    /* bad input */
    const float bad_v[2] = {-0.5f, -0.1f};
    assert_int_equal(ddt_tree_graft(&t, path, bad_v, 2, 80, 100, NULL, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "non-increasing"));
    const int32_t far[1] = {1000};
    assert_int_equal(ddt_tree_graft(&t, far, v, 1, 80, 100, NULL, &err), DDT_ERR_INVALID);
    assert_int_equal(ddt_tree_graft(&t, path, v, 1, 200, 100, NULL, &err), DDT_ERR_RANGE);
    ddt_tree_free(&t);
    ddt_builder_destroy(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_propose),
        cmocka_unit_test(test_graft),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
