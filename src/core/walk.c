/*
 * walk.c — acceptance ("walk") of a verified draft tree.
 *
 * From the root, while the target's next token at the current node is the token
 * of one of its children, move to that child; the first unmatched target token
 * is the bonus.  Lossless at any temperature when target_next holds target
 * samples (sample-and-match).
 *
 * The walk trusts nothing about the tree it is given: the first version of this
 * engine's accept kernel looped forever on a tree with a cycle.  It checks the
 * whole input in O(n) first and then searches children by scanning parent[]
 * (not the child lists, which a damaged tree could make cyclic), so every step
 * moves to a higher node index and the walk ends within n steps.
 */
#include "core/error.h"
#include "ddtree.h"

/* Check the tree, and target_next when given, in one O(n) pass. */
static ddt_status check_input(const ddt_tree *t, const int32_t *target_next, int32_t vocab,
                              ddt_error *err) {
    int32_t n = t->n_nodes;
    if (n < 1 || n > t->capacity || n > DDT_MAX_NODES)
        return ddt_fail(err, DDT_ERR_RANGE, "tree of %d nodes: must be 1..%d", n,
                        t->capacity < DDT_MAX_NODES ? t->capacity : DDT_MAX_NODES);
    if (!t->token || !t->parent || !t->depth)
        return ddt_fail(err, DDT_ERR_INVALID, "tree arrays missing");
    if (t->parent[0] != -1 || t->depth[0] != 0)
        return ddt_fail(err, DDT_ERR_INVALID, "node 0 must be the root (parent -1, depth 0)");
    for (int32_t i = 0; i < n; i++) {
        if (t->token[i] < 0 || (vocab > 0 && t->token[i] >= vocab))
            return ddt_fail(err, DDT_ERR_INVALID, "node %d: token %d outside the vocabulary", i,
                            t->token[i]);
        if (target_next && (target_next[i] < 0 || (vocab > 0 && target_next[i] >= vocab)))
            return ddt_fail(err, DDT_ERR_INVALID,
                            "target_next[%d] = %d is outside the vocabulary", i, target_next[i]);
        if (i == 0) continue;
        int32_t p = t->parent[i];
        if (p < 0 || p >= i)
            return ddt_fail(err, DDT_ERR_INVALID,
                            "node %d has parent %d: a parent must be an earlier node (0..%d)", i,
                            p, i - 1);
        if (t->depth[i] != t->depth[p] + 1 || t->depth[i] > DDT_MAX_DEPTH)
            return ddt_fail(err, DDT_ERR_INVALID, "node %d: depth %d inconsistent or over %d", i,
                            t->depth[i], DDT_MAX_DEPTH);
    }
    return DDT_OK;
}

/* The walk over a checked tree; next(node) is asked only at the nodes visited. */
static ddt_status walk_checked(const ddt_tree *t, ddt_next_token_fn next, void *ctx,
                               int32_t vocab, ddt_walk_result *out, ddt_error *err) {
    int32_t n = t->n_nodes, cur = 0, len = 0, want;
    out->path[len++] = 0;
    for (;;) {
        ddt_status st = next(ctx, cur, &want, err);
        if (st) return st;
        if (want < 0 || (vocab > 0 && want >= vocab))
            return ddt_fail(err, DDT_ERR_INVALID,
                            "target token %d at node %d is outside the vocabulary", want, cur);
        int32_t found = -1;
        for (int32_t j = cur + 1; j < n; j++)
            if (t->parent[j] == cur && t->token[j] == want) {
                found = j;
                break;
            }
        if (found < 0) break;
        /* depth grows by one per step and is capped, so this cannot trip */
        if (len >= DDT_MAX_PATH)
            return ddt_fail(err, DDT_ERR_INTERNAL, "walk longer than %d nodes", DDT_MAX_PATH);
        out->path[len++] = found;
        cur = found;
    }
    out->length = len;
    out->bonus = want;
    return DDT_OK;
}

static ddt_status next_from_array(void *ctx, int32_t node, int32_t *token, ddt_error *err) {
    (void)err;
    *token = ((const int32_t *)ctx)[node];
    return DDT_OK;
}

ddt_status ddt_tree_walk(const ddt_tree *t, const int32_t *target_next, int32_t vocab,
                         ddt_walk_result *out, ddt_error *err) {
    if (!t || !target_next || !out)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_tree_walk: NULL argument");
    ddt_status st = check_input(t, target_next, vocab, err);
    if (st) return st;
    return walk_checked(t, next_from_array, (void *)target_next, vocab, out, err);
}

ddt_status ddt_tree_walk_fn(const ddt_tree *t, ddt_next_token_fn next, void *ctx, int32_t vocab,
                            ddt_walk_result *out, ddt_error *err) {
    if (!t || !next || !out)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_tree_walk_fn: NULL argument");
    ddt_status st = check_input(t, NULL, vocab, err);
    if (st) return st;
    return walk_checked(t, next, ctx, vocab, out, err);
}
