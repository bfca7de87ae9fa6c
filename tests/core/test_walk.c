/*
 * test_walk.c — the walk accepts the longest agreed path and rejects malformed
 * trees (cycles, late parents, bad tokens, sizes over the limits) with an error
 * instead of looping or overrunning (src/core/walk.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "ddtree.h"

static void test_walk_paths(void **state) {
    (void)state;
    ddt_tree t;
    assert_int_equal(ddt_tree_alloc(16, &t, NULL), DDT_OK);
    /*        0(r)
     *      /   \
     *    1(a)  2(b)
     *    / \     \
     *  3(c) 4(d)  5(e)
     *  |
     *  6(f)                      tokens: a=10 b=11 c=12 d=13 e=14 f=15 */
    int32_t tok[7] = {1, 10, 11, 12, 13, 14, 15}, par[7] = {-1, 0, 0, 1, 1, 2, 3};
    assert_int_equal(ddt_tree_from_parents(tok, par, 7, 100, &t, NULL), DDT_OK);
    ddt_walk_result w;
    int32_t next1[7] = {10, 12, 0, 15, 0, 0, 77}; /* r->a->c->f, bonus 77 */
    assert_int_equal(ddt_tree_walk(&t, next1, 100, &w, NULL), DDT_OK);
    assert_int_equal(w.length, 4);
    int32_t p1[4] = {0, 1, 3, 6};
    assert_memory_equal(w.path, p1, sizeof p1);
    assert_int_equal(w.bonus, 77);
    int32_t next2[7] = {11, 0, 99, 0, 0, 0, 0}; /* r->b, target says 99: bonus */
    assert_int_equal(ddt_tree_walk(&t, next2, 100, &w, NULL), DDT_OK);
    assert_int_equal(w.length, 2);
    assert_int_equal(w.path[1], 2);
    assert_int_equal(w.bonus, 99);
    int32_t next3[7] = {42, 0, 0, 0, 0, 0, 0}; /* nothing accepted */
    assert_int_equal(ddt_tree_walk(&t, next3, 100, &w, NULL), DDT_OK);
    assert_int_equal(w.length, 1);
    assert_int_equal(w.bonus, 42);
    ddt_tree_free(&t);
}

static void test_walk_rejects_damaged_trees(void **state) {
    (void)state;
    ddt_tree t;
    ddt_error err;
    assert_int_equal(ddt_tree_alloc(8, &t, NULL), DDT_OK);
    int32_t tok[5] = {1, 10, 11, 12, 13}, par[5] = {-1, 0, 1, 2, 3};
    int32_t next[5] = {10, 11, 12, 13, 5};
    assert_int_equal(ddt_tree_from_parents(tok, par, 5, 0, &t, NULL), DDT_OK);
    ddt_walk_result w;
    assert_int_equal(ddt_tree_walk(&t, next, 0, &w, NULL), DDT_OK);
    assert_int_equal(w.length, 5);
    /* a cycle written straight into the arrays: 2 -> 3 -> 2 */
    t.parent[2] = 3;
    assert_int_equal(ddt_tree_walk(&t, next, 0, &w, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "node 2"));
    t.parent[2] = 1;
    t.parent[0] = 0; /* root pointing at itself */
    assert_int_equal(ddt_tree_walk(&t, next, 0, &w, &err), DDT_ERR_INVALID);
    t.parent[0] = -1;
    t.depth[3] = 7; /* inconsistent depth */
    assert_int_equal(ddt_tree_walk(&t, next, 0, &w, &err), DDT_ERR_INVALID);
    t.depth[3] = 3;
    t.token[4] = -3;
    assert_int_equal(ddt_tree_walk(&t, next, 0, &w, &err), DDT_ERR_INVALID);
    t.token[4] = 13;
    assert_int_equal(ddt_tree_walk(&t, next, 13, &w, &err), DDT_ERR_INVALID); /* token 13 >= vocab */
    next[4] = 500;
    assert_int_equal(ddt_tree_walk(&t, next, 100, &w, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "target_next[4]"));
    next[4] = 5;
    t.n_nodes = 9; /* over capacity */
    assert_int_equal(ddt_tree_walk(&t, next, 0, &w, &err), DDT_ERR_RANGE);
    t.n_nodes = 0;
    assert_int_equal(ddt_tree_walk(&t, next, 0, &w, &err), DDT_ERR_RANGE);
    t.n_nodes = 5;
    assert_int_equal(ddt_tree_walk(NULL, next, 0, &w, &err), DDT_ERR_INVALID);
    ddt_tree_free(&t);
}

/* The longest possible walk: a full-depth chain, every token accepted. */
static void test_walk_full_depth(void **state) {
    (void)state;
    ddt_tree t;
    assert_int_equal(ddt_tree_alloc(DDT_MAX_NODES, &t, NULL), DDT_OK);
    int32_t tok[DDT_MAX_DEPTH + 1], par[DDT_MAX_DEPTH + 1], next[DDT_MAX_DEPTH + 1];
    for (int32_t i = 0; i <= DDT_MAX_DEPTH; i++) {
        tok[i] = i;
        par[i] = i - 1;
        next[i] = i + 1;
    }
    assert_int_equal(ddt_tree_from_parents(tok, par, DDT_MAX_DEPTH + 1, 0, &t, NULL), DDT_OK);
    ddt_walk_result w;
    assert_int_equal(ddt_tree_walk(&t, next, 0, &w, NULL), DDT_OK);
    assert_int_equal(w.length, DDT_MAX_PATH);
    assert_int_equal(w.bonus, DDT_MAX_DEPTH + 1);
    ddt_tree_free(&t);
}

typedef struct counted {
    const int32_t *next;
    int32_t calls, fail_at;
    int32_t seen[DDT_MAX_NODES];
} counted;

static ddt_status counted_next(void *ctx, int32_t node, int32_t *token, ddt_error *err) {
    counted *c = ctx;
    c->seen[c->calls++] = node;
    if (node == c->fail_at) {
        snprintf(err->msg, sizeof err->msg, "callback failed at %d", node);
        err->status = DDT_ERR_INVALID;
        return DDT_ERR_INVALID;
    }
    *token = c->next[node];
    return DDT_OK;
}

/* The on-demand walk asks only for the visited nodes, in path order, and agrees
 * with the array walk; callback errors and bad tokens stop it. */
static void test_walk_on_demand(void **state) {
    (void)state;
    ddt_tree t;
    assert_int_equal(ddt_tree_alloc(16, &t, NULL), DDT_OK);
    int32_t tok[7] = {1, 10, 11, 12, 13, 14, 15}, par[7] = {-1, 0, 0, 1, 1, 2, 3};
    assert_int_equal(ddt_tree_from_parents(tok, par, 7, 100, &t, NULL), DDT_OK);
    int32_t next[7] = {10, 12, 0, 15, 0, 0, 77};
    ddt_walk_result a, b;
    ddt_error err;
    assert_int_equal(ddt_tree_walk(&t, next, 100, &a, NULL), DDT_OK);
    counted c = {next, 0, -1, {0}};
    assert_int_equal(ddt_tree_walk_fn(&t, counted_next, &c, 100, &b, &err), DDT_OK);
    assert_int_equal(b.length, a.length);
    assert_memory_equal(b.path, a.path, (size_t)a.length * sizeof(int32_t));
    assert_int_equal(b.bonus, a.bonus);
    assert_int_equal(c.calls, a.length); /* one call per visited node, none elsewhere */
    assert_memory_equal(c.seen, a.path, (size_t)a.length * sizeof(int32_t));
    counted f = {next, 0, 3, {0}};
    assert_int_equal(ddt_tree_walk_fn(&t, counted_next, &f, 100, &b, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "callback failed at 3"));
    int32_t bad[7] = {10, 12, 0, 500, 0, 0, 0};
    counted g = {bad, 0, -1, {0}};
    assert_int_equal(ddt_tree_walk_fn(&t, counted_next, &g, 100, &b, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "node 3"));
    t.parent[2] = 5; /* damaged trees are rejected before any call */
    counted h = {next, 0, -1, {0}};
    assert_int_equal(ddt_tree_walk_fn(&t, counted_next, &h, 100, &b, &err), DDT_ERR_INVALID);
    assert_int_equal(h.calls, 0);
    ddt_tree_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_walk_paths),
        cmocka_unit_test(test_walk_rejects_damaged_trees),
        cmocka_unit_test(test_walk_full_depth),
        cmocka_unit_test(test_walk_on_demand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
