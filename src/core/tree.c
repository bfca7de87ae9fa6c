/*
 * tree.c — the DDTree draft tree: best-first build from a drafter's per-depth
 * top-K table (Algorithm 1 of DDTree, arXiv 2604.12989), the DFlash chain, and
 * trees given as parent arrays.
 *
 * The loop itself lives in best_first.h, shared with the CUDA backend.
 *
 * Best-first build.  The weight of a prefix u = (u_1..u_d) is
 * log w(u) = sum_i log q_i(u_i); the B heaviest prefixes form a tree because
 * weights only shrink along a path.  A max-heap holds the frontier: each entry is
 * (log w, parent node, depth, rank in its depth's row).  Popping a node pushes its
 * next sibling (same parent, rank + 1) and its first child (depth + 1, rank 0).
 *
 * Refusal (ddt_tree_build_filtered).  A caller that knows some prefixes can never
 * be accepted (a grammar refuses the token after its parent's path) passes a
 * predicate; a refused pop pushes only its next sibling and takes no node, so its
 * subtree is never expanded and the budget goes to the next allowed prefixes.
 * Because rows are sorted, this equals taking the heaviest prefixes among those
 * whose every node is allowed, in the unfiltered order (the tests' references
 * build it that way).  The GPU builder has no predicate.
 *
 * Reproducibility.  A child's weight is computed as fp32(logw(parent) + logq),
 * never by the incremental "subtract this rank, add the next" form, so a
 * reference in any language gets the same floats by summing along the path in
 * depth order.  Exact ties are broken by the rank tuple (r_1..r_d),
 * lexicographically, a prefix before its extensions.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/best_first.h"
#include "core/error.h"
#include "core/graft_merge.h"
#include "ddtree.h"

/* Open-addressing set of token ids, stamped with an epoch so it never needs clearing. */
#define DUP_SLOTS 4096

struct ddt_builder {
    int32_t max_budget;
    int32_t heap_cap;
    ddt_bf_entry *heap;               /* [heap_cap] */
    float *vcost;                     /* [max_budget + 1] verify cost per node count (auto budget) */
    int32_t dup_token[DUP_SLOTS];
    uint32_t dup_epoch[DUP_SLOTS];
    uint32_t epoch;
};

/* ------------------------------------------------------------------ tree storage */

ddt_status ddt_tree_alloc(int32_t capacity, ddt_tree *tree, ddt_error *err) {
    if (!tree) return ddt_fail(err, DDT_ERR_INVALID, "ddt_tree_alloc: tree is NULL");
    memset(tree, 0, sizeof *tree);
    if (capacity < 1 || capacity > DDT_MAX_NODES)
        return ddt_fail(err, DDT_ERR_RANGE, "tree capacity %d outside 1..%d", capacity,
                        DDT_MAX_NODES);
    size_t n = (size_t)capacity;
    tree->capacity = capacity;
    tree->vis_words = (capacity + 63) / 64;
    tree->token = ddt_calloc_array(n, sizeof(int32_t));
    tree->parent = ddt_calloc_array(n, sizeof(int32_t));
    tree->depth = ddt_calloc_array(n, sizeof(int32_t));
    tree->rank = ddt_calloc_array(n, sizeof(int32_t));
    tree->logw = ddt_calloc_array(n, sizeof(float));
    tree->first_child = ddt_calloc_array(n, sizeof(int32_t));
    tree->next_sibling = ddt_calloc_array(n, sizeof(int32_t));
    tree->vis = ddt_calloc_array(n * (size_t)tree->vis_words, sizeof(uint64_t));
    if (!tree->token || !tree->parent || !tree->depth || !tree->rank || !tree->logw ||
        !tree->first_child || !tree->next_sibling || !tree->vis) {
        ddt_tree_free(tree);
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory allocating a tree of %d nodes",
                        capacity);
    }
    return DDT_OK;
}

void ddt_tree_free(ddt_tree *tree) {
    if (!tree) return;
    free(tree->token);
    free(tree->parent);
    free(tree->depth);
    free(tree->rank);
    free(tree->logw);
    free(tree->first_child);
    free(tree->next_sibling);
    free(tree->vis);
    memset(tree, 0, sizeof *tree);
}

/* Child lists (children in index order) and ancestor-or-self visibility rows,
 * from parent[] of a topologically ordered tree. */
static void tree_link(ddt_tree *t) {
    int32_t n = t->n_nodes;
    int32_t words = t->vis_words;
    for (int32_t i = 0; i < n; i++) t->first_child[i] = t->next_sibling[i] = -1;
    for (int32_t i = n - 1; i >= 1; i--) {
        int32_t p = t->parent[i];
        t->next_sibling[i] = t->first_child[p];
        t->first_child[p] = i;
    }
    uint64_t *vis = t->vis;
    memset(vis, 0, (size_t)words * sizeof(uint64_t));
    vis[0] = 1u;
    int32_t maxd = 0;
    for (int32_t i = 1; i < n; i++) {
        uint64_t *row = vis + (size_t)i * (size_t)words;
        memcpy(row, vis + (size_t)t->parent[i] * (size_t)words, (size_t)words * sizeof(uint64_t));
        row[i >> 6] |= (uint64_t)1 << (i & 63);
        if (t->depth[i] > maxd) maxd = t->depth[i];
    }
    t->max_depth = maxd;
}

/* ------------------------------------------------------------------ table checks */

static ddt_status check_token(int32_t tok, int32_t vocab, const char *what, int32_t a, int32_t b,
                              ddt_error *err) {
    if (tok < 0 || (vocab > 0 && tok >= vocab))
        return ddt_fail(err, DDT_ERR_INVALID, "%s [%d][%d]: token %d outside the vocabulary [0, %d)",
                        what, a, b, tok, vocab > 0 ? vocab : INT32_MAX);
    return DDT_OK;
}

/* Rows sorted descending, no NaN or +inf, tokens in range; columns [0, kcheck).
 * The table is the biggest input of a round (D x K), so a branch-free pass looks
 * for any fault first and only a faulty table pays for the search that names it. */
static ddt_status check_table(const ddt_draft_table *tb, int32_t kcheck, int32_t vocab,
                              ddt_error *err) {
    if (!tb || !tb->logq || !tb->token)
        return ddt_fail(err, DDT_ERR_INVALID, "draft table is missing");
    if (tb->depth < 1 || tb->depth > DDT_MAX_DEPTH)
        return ddt_fail(err, DDT_ERR_RANGE, "draft table depth %d outside 1..%d", tb->depth,
                        DDT_MAX_DEPTH);
    if (tb->k < 1 || tb->k > DDT_MAX_TOPK)
        return ddt_fail(err, DDT_ERR_RANGE, "draft table K %d outside 1..%d", tb->k, DDT_MAX_TOPK);
    uint32_t limit = vocab > 0 ? (uint32_t)vocab : (uint32_t)INT32_MAX + 1u;
    int bad = 0;
    for (int32_t d = 0; d < tb->depth; d++) {
        const float *row = tb->logq + (size_t)d * (size_t)tb->k;
        const int32_t *tok = tb->token + (size_t)d * (size_t)tb->k;
        bad |= !(row[0] < INFINITY); /* NaN or +inf */
        for (int32_t r = 1; r < kcheck; r++) bad |= !(row[r] <= row[r - 1]); /* NaN fails too */
        for (int32_t r = 0; r < kcheck; r++) bad |= (uint32_t)tok[r] >= limit;
    }
    if (!bad) return DDT_OK;
    for (int32_t d = 0; d < tb->depth; d++) {
        const float *row = tb->logq + (size_t)d * (size_t)tb->k;
        const int32_t *tok = tb->token + (size_t)d * (size_t)tb->k;
        for (int32_t r = 0; r < kcheck; r++) {
            if (isnan(row[r]) || row[r] == INFINITY)
                return ddt_fail(err, DDT_ERR_INVALID, "logq[%d][%d] is %s", d, r,
                                isnan(row[r]) ? "NaN" : "+inf");
            if (r > 0 && row[r] > row[r - 1])
                return ddt_fail(err, DDT_ERR_INVALID,
                                "logq row %d is not sorted descending: [%d] = %g > [%d] = %g", d,
                                r, (double)row[r], r - 1, (double)row[r - 1]);
            ddt_status st = check_token(tok[r], vocab, "tokens", d, r, err);
            if (st) return st;
        }
    }
    return ddt_fail(err, DDT_ERR_INTERNAL, "draft table check disagrees with itself");
}

/* ------------------------------------------------------------------ builder */

ddt_status ddt_builder_create(int32_t max_budget, ddt_builder **out, ddt_error *err) {
    if (!out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_builder_create: out is NULL");
    *out = NULL;
    if (max_budget < 0 || max_budget > DDT_MAX_BUDGET)
        return ddt_fail(err, DDT_ERR_RANGE, "max budget %d outside 0..%d", max_budget,
                        DDT_MAX_BUDGET);
    ddt_builder *b = calloc(1, sizeof *b);
    if (!b) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory creating a tree builder");
    b->max_budget = max_budget;
    b->heap_cap = max_budget + 2; /* each pop removes one entry and adds at most two */
    b->heap = ddt_calloc_array((size_t)b->heap_cap, sizeof *b->heap);
    b->vcost = ddt_calloc_array((size_t)max_budget + 1, sizeof *b->vcost);
    if (!b->heap || !b->vcost) {
        ddt_builder_destroy(b);
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory creating a tree builder");
    }
    *out = b;
    return DDT_OK;
}

void ddt_builder_destroy(ddt_builder *b) {
    if (!b) return;
    free(b->heap);
    free(b->vcost);
    free(b);
}

/* Siblings drawn from one row must carry distinct tokens, or the walk could not
 * tell them apart: check the ranks each depth actually used. */
static ddt_status check_used_distinct(ddt_builder *b, const ddt_draft_table *tb,
                                      const int32_t *max_rank, ddt_error *err) {
    for (int32_t d = 0; d < tb->depth; d++) {
        if (max_rank[d] < 1) continue;
        if (++b->epoch == 0) { /* wrapped: clear once every 2^32 uses */
            memset(b->dup_epoch, 0, sizeof b->dup_epoch);
            b->epoch = 1;
        }
        const int32_t *tok = tb->token + (size_t)d * (size_t)tb->k;
        for (int32_t r = 0; r <= max_rank[d]; r++) {
            uint32_t h = ((uint32_t)tok[r] * 2654435761u) & (DUP_SLOTS - 1);
            while (b->dup_epoch[h] == b->epoch) {
                if (b->dup_token[h] == tok[r])
                    return ddt_fail(err, DDT_ERR_INVALID,
                                    "tokens row %d holds token %d twice (within its first %d ranks)",
                                    d, tok[r], max_rank[d] + 1);
                h = (h + 1) & (DUP_SLOTS - 1);
            }
            b->dup_epoch[h] = b->epoch;
            b->dup_token[h] = tok[r];
        }
    }
    return DDT_OK;
}

ddt_status ddt_tree_build(ddt_builder *b, const ddt_draft_table *tb, int32_t root_token,
                          int32_t budget, const ddt_cost_model *cost, int32_t vocab,
                          ddt_tree *tree, ddt_error *err) {
    return ddt_tree_build_filtered(b, tb, root_token, budget, cost, vocab, NULL, NULL, tree, err);
}

ddt_status ddt_tree_build_filtered(ddt_builder *b, const ddt_draft_table *tb, int32_t root_token,
                                   int32_t budget, const ddt_cost_model *cost, int32_t vocab,
                                   ddt_tree_allow_fn allow, void *allow_ctx, ddt_tree *tree,
                                   ddt_error *err) {
    if (!b || !tree) return ddt_fail(err, DDT_ERR_INVALID, "ddt_tree_build: builder or tree is NULL");
    if (budget < 0 || budget > b->max_budget)
        return ddt_fail(err, DDT_ERR_RANGE, "budget %d outside 0..%d (the builder's maximum)",
                        budget, b->max_budget);
    if (tree->capacity < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "tree has no storage (call ddt_tree_alloc)");
    ddt_status st = check_table(tb, tb ? tb->k : 0, vocab, err);
    if (st) return st;
    st = check_token(root_token, vocab, "root", 0, 0, err);
    if (st) return st;
    if (cost) {
        st = ddt_cost_check(cost, err);
        if (st) return st;
    }
    /* The table holds sum_d K^d prefixes; the tree can never be bigger. */
    int64_t table_nodes = 0, level = 1;
    for (int32_t d = 0; d < tb->depth && table_nodes < budget; d++) {
        level = level * tb->k > DDT_MAX_NODES ? DDT_MAX_NODES : level * tb->k;
        table_nodes += level;
    }
    int32_t want = (int32_t)(table_nodes < budget ? table_nodes : budget);
    if (tree->capacity < want + 1)
        return ddt_fail(err, DDT_ERR_RANGE, "tree capacity %d is below budget + 1 = %d",
                        tree->capacity, want + 1);

    int32_t max_rank[DDT_MAX_DEPTH];
    if (cost)
        for (int32_t n = 0; n <= want; n++) b->vcost[n] = ddt_cost_verify(cost, (float)n);
    ddt_bf_args args = {
        .logq = tb->logq, .token = tb->token, .depth = tb->depth, .k = tb->k, .ld = tb->k,
        .want = want,
        .root_token = root_token, .vcost = cost ? b->vcost : NULL,
        .draft_cost = cost ? cost->draft : 0.0f, .allow = allow, .allow_ctx = allow_ctx,
        .heap = b->heap,
        .out_token = tree->token, .out_parent = tree->parent, .out_depth = tree->depth,
        .out_rank = tree->rank, .out_logw = tree->logw, .max_rank = max_rank};
    tree->n_nodes = ddt_best_first(&args);
    st = check_used_distinct(b, tb, max_rank, err);
    if (st) {
        tree->n_nodes = 0;
        return st;
    }
    tree_link(tree);
    return DDT_OK;
}

ddt_status ddt_tree_build_chain(const ddt_draft_table *tb, int32_t root_token, int32_t length,
                                int32_t vocab, ddt_tree *tree, ddt_error *err) {
    if (!tree) return ddt_fail(err, DDT_ERR_INVALID, "ddt_tree_build_chain: tree is NULL");
    ddt_status st = check_table(tb, 1, vocab, err);
    if (st) return st;
    st = check_token(root_token, vocab, "root", 0, 0, err);
    if (st) return st;
    if (length < 0)
        return ddt_fail(err, DDT_ERR_RANGE, "chain length %d is negative", length);
    int32_t n = length < tb->depth ? length : tb->depth;
    if (tree->capacity < n + 1)
        return ddt_fail(err, DDT_ERR_RANGE, "tree capacity %d is below chain length + 1 = %d",
                        tree->capacity, n + 1);
    tree->n_nodes = n + 1;
    tree->token[0] = root_token;
    tree->parent[0] = -1;
    tree->depth[0] = 0;
    tree->rank[0] = -1;
    tree->logw[0] = 0.0f;
    for (int32_t i = 1; i <= n; i++) {
        tree->token[i] = tb->token[(size_t)(i - 1) * (size_t)tb->k];
        tree->parent[i] = i - 1;
        tree->depth[i] = i;
        tree->rank[i] = 0;
        tree->logw[i] = tree->logw[i - 1] + tb->logq[(size_t)(i - 1) * (size_t)tb->k];
    }
    tree_link(tree);
    return DDT_OK;
}

/* The node of tree t below `parent` with token `tok` among nodes [0, limit), or -1. */
static int32_t child_with(const ddt_tree *t, int32_t parent, int32_t tok, int32_t limit) {
    for (int32_t c = t->first_child[parent]; c >= 0 && c < limit; c = t->next_sibling[c])
        if (t->token[c] == tok) return c;
    return -1;
}

int32_t ddt_tree_graft_plan(const ddt_tree *tree, const int32_t *path, const float *v, int32_t len, int32_t budget,
                            int32_t *twin, int32_t *keep) {
    const int32_t n = tree->n_nodes;
    /* twin[j]: the tree's node for the path's prefix of j + 1 tokens, -1 when the tree has none */
    for (int32_t j = 0, cur = 0; j < len; j++) {
        cur = cur < 0 ? -1 : child_with(tree, cur, path[j], n);
        twin[j] = cur;
    }
    /* merge the pop order with the path's prefixes (core/graft_merge.h, the GPU's too) */
    return ddt_graft_merge(tree->logw, n, twin, v, len, budget, keep);
}

ddt_status ddt_tree_graft(ddt_tree *tree, const int32_t *path, const float *v, int32_t len, int32_t budget,
                          int32_t vocab, int32_t *grafted, ddt_error *err) {
    if (grafted) *grafted = 0;
    if (!tree || (len > 0 && (!path || !v))) return ddt_fail(err, DDT_ERR_INVALID, "ddt_tree_graft: NULL argument");
    if (len < 0 || len > DDT_MAX_DEPTH)
        return ddt_fail(err, DDT_ERR_RANGE, "graft of %d tokens: must be 0..%d", len, DDT_MAX_DEPTH);
    if (budget < 0 || budget + 1 > tree->capacity)
        return ddt_fail(err, DDT_ERR_RANGE, "graft budget %d: the tree holds %d nodes", budget, tree->capacity);
    if (tree->n_nodes < 1 || tree->n_nodes > budget + 1)
        return ddt_fail(err, DDT_ERR_RANGE, "graft onto a tree of %d nodes with budget %d", tree->n_nodes, budget);
    for (int32_t j = 0; j < len; j++) {
        ddt_status st = check_token(path[j], vocab, "graft path", j, 0, err);
        if (st) return st;
        if (v[j] != v[j] || v[j] > 0.0f || (j > 0 && v[j] > v[j - 1]))
            return ddt_fail(err, DDT_ERR_INVALID, "graft weight %d = %g: weights must be <= 0 and non-increasing", j,
                            (double)v[j]);
    }
    int32_t twin[DDT_MAX_DEPTH], keep;
    const int32_t take = ddt_tree_graft_plan(tree, path, v, len, budget, twin, &keep);
    int32_t n = keep, parent = 0;
    for (int32_t j = 0; j < take; j++) {
        if (twin[j] >= 1 && twin[j] < keep) { /* the kept tree holds this prefix */
            parent = twin[j];
            continue;
        }
        tree->token[n] = path[j];
        tree->parent[n] = parent;
        tree->depth[n] = tree->depth[parent] + 1;
        tree->rank[n] = -1;
        tree->logw[n] = v[j];
        parent = n++;
    }
    if (grafted) *grafted = n - keep;
    tree->n_nodes = n;
    tree_link(tree);
    return DDT_OK;
}

ddt_status ddt_tree_from_parents(const int32_t *tokens, const int32_t *parents, int32_t n,
                                 int32_t vocab, ddt_tree *tree, ddt_error *err) {
    if (!tree || !tokens || !parents)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_tree_from_parents: NULL argument");
    if (n < 1 || n > tree->capacity)
        return ddt_fail(err, DDT_ERR_RANGE, "tree of %d nodes: must be 1..%d", n, tree->capacity);
    if (parents[0] != -1)
        return ddt_fail(err, DDT_ERR_INVALID, "node 0 must be the root (parent -1), has parent %d",
                        parents[0]);
    for (int32_t i = 0; i < n; i++) {
        ddt_status st = check_token(tokens[i], vocab, "tree tokens", i, 0, err);
        if (st) return st;
        if (i == 0) continue;
        if (parents[i] < 0 || parents[i] >= i)
            return ddt_fail(err, DDT_ERR_INVALID,
                            "node %d has parent %d: a parent must be an earlier node (0..%d)", i,
                            parents[i], i - 1);
    }
    tree->n_nodes = n;
    tree->token[0] = tokens[0];
    tree->parent[0] = -1;
    tree->depth[0] = 0;
    tree->rank[0] = -1;
    tree->logw[0] = 0.0f;
    for (int32_t i = 1; i < n; i++) {
        tree->token[i] = tokens[i];
        tree->parent[i] = parents[i];
        tree->depth[i] = tree->depth[parents[i]] + 1;
        tree->rank[i] = -1;
        tree->logw[i] = 0.0f;
        if (tree->depth[i] > DDT_MAX_DEPTH) {
            tree->n_nodes = 0;
            return ddt_fail(err, DDT_ERR_RANGE, "node %d is at depth %d, over the limit %d", i,
                            tree->depth[i], DDT_MAX_DEPTH);
        }
    }
    tree_link(tree);
    /* Two siblings with one token would make the walk ambiguous. */
    for (int32_t p = 0; p < n; p++)
        for (int32_t a = tree->first_child[p]; a >= 0; a = tree->next_sibling[a])
            for (int32_t c = tree->next_sibling[a]; c >= 0; c = tree->next_sibling[c])
                if (tree->token[a] == tree->token[c]) {
                    tree->n_nodes = 0;
                    return ddt_fail(err, DDT_ERR_INVALID,
                                    "nodes %d and %d share parent %d and token %d", a, c, p,
                                    tree->token[a]);
                }
    return DDT_OK;
}
