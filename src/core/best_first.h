/*
 * best_first.h — the best-first loop of the DDTree builder (src/core/tree.c),
 * inline code that also compiles for CUDA; the GPU (src/backend/cuda/tree_cuda.cu)
 * runs a warp-parallel equivalent, tested bitwise against it node for node (with no
 * predicate: the refusal below is the CPU engine's, for its JSON constraint).
 *
 * Inputs are raw arrays with every size already checked by the caller; nothing
 * here allocates or reports errors.  See tree.c for the algorithm and the tie
 * order (rank tuple, lexicographic, a prefix before its extensions).
 */
#ifndef DDT_CORE_BEST_FIRST_H
#define DDT_CORE_BEST_FIRST_H

#include <stdint.h>

#include "core/detmath.h"
#include "ddtree.h"

#ifdef __CUDACC__
#define DDT_HD __host__ __device__
#else
#define DDT_HD
#endif

typedef struct ddt_bf_entry {
    float logw;     /* weight of the prefix this entry would add */
    int32_t parent; /* node index of its parent */
    int32_t depth;  /* 1..D */
    int32_t rank;   /* rank in row depth-1 of the table */
} ddt_bf_entry;

typedef struct ddt_bf_args {
    const float *logq;      /* [D][K] */
    const int32_t *token;   /* [D][K] */
    int32_t depth, k;       /* D, K */
    int32_t ld;             /* row stride of logq and token (>= the ranks ever read; K on the CPU) */
    int32_t want;           /* nodes to pop at most (budget, capped by the table size) */
    int32_t root_token;
    /* cost-aware stop: NULL for a fixed budget, else verify cost per node count
     * [want + 1] and the draft cost; stop where theta stops rising */
    const float *vcost;
    float draft_cost;
    /* optional refusal (ddt_tree_allow_fn, ddtree.h): NULL keeps every popped candidate; else a
     * candidate it refuses takes no node and no budget, and only its next sibling is pushed,
     * never its child, so the budget goes to the next-heaviest prefixes it accepts */
    ddt_tree_allow_fn allow;
    void *allow_ctx;
    /* workspace */
    ddt_bf_entry *heap;               /* [want + 2] */
    /* outputs, [want + 1] each */
    int32_t *out_token, *out_parent, *out_depth, *out_rank;
    float *out_logw;
    int32_t *max_rank; /* [D] highest rank used per depth, -1 if none */
} ddt_bf_args;

DDT_HD static inline ddt_bf_entry ddt_bf_make(float logw, int32_t parent, int32_t depth,
                                             int32_t rank) {
    ddt_bf_entry e;
    e.logw = logw;
    e.parent = parent;
    e.depth = depth;
    e.rank = rank;
    return e;
}

/* Rank tuple of an entry: its parent's ranks from the root down, then its own.
 * Built only on exact weight ties, which are rare, so nodes store no tuples. */
DDT_HD static inline void ddt_bf_tuple(const ddt_bf_args *a, const ddt_bf_entry *e,
                                       int32_t *tuple) {
    tuple[e->depth - 1] = e->rank;
    for (int32_t node = e->parent, i = e->depth - 2; i >= 0; node = a->out_parent[node], i--)
        tuple[i] = a->out_rank[node];
}

/* True when entry x pops before entry y: heavier first, then the lower rank
 * tuple (lexicographic, a prefix before its extensions). */
DDT_HD static inline int ddt_bf_before(const ddt_bf_args *a, const ddt_bf_entry *x,
                                       const ddt_bf_entry *y) {
    if (x->logw != y->logw) return x->logw > y->logw;
    int32_t tx[DDT_MAX_DEPTH], ty[DDT_MAX_DEPTH];
    ddt_bf_tuple(a, x, tx);
    ddt_bf_tuple(a, y, ty);
    int32_t m = x->depth < y->depth ? x->depth : y->depth;
    for (int32_t i = 0; i < m; i++)
        if (tx[i] != ty[i]) return tx[i] < ty[i];
    return x->depth < y->depth;
}

DDT_HD static inline void ddt_bf_push(const ddt_bf_args *a, int32_t *n, ddt_bf_entry e) {
    int32_t i = (*n)++;
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (!ddt_bf_before(a, &e, &a->heap[p])) break;
        a->heap[i] = a->heap[p];
        i = p;
    }
    a->heap[i] = e;
}

DDT_HD static inline ddt_bf_entry ddt_bf_pop(const ddt_bf_args *a, int32_t *n) {
    ddt_bf_entry top = a->heap[0];
    ddt_bf_entry last = a->heap[--(*n)];
    int32_t cnt = *n, i = 0;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= cnt) break;
        if (c + 1 < cnt && ddt_bf_before(a, &a->heap[c + 1], &a->heap[c])) c++;
        if (!ddt_bf_before(a, &a->heap[c], &last)) break;
        a->heap[i] = a->heap[c];
        i = c;
    }
    if (cnt > 0) a->heap[i] = last;
    return top;
}

/* Runs the best-first loop; returns the node count including the root. */
DDT_HD static inline int32_t ddt_best_first(const ddt_bf_args *a) {
    a->out_token[0] = a->root_token;
    a->out_parent[0] = -1;
    a->out_depth[0] = 0;
    a->out_rank[0] = -1;
    a->out_logw[0] = 0.0f;
    for (int32_t d = 0; d < a->depth; d++) a->max_rank[d] = -1;
    int32_t nodes = 1, heap_n = 0;
    /* double: a node's gain in theta can be below fp32 resolution long before it
     * stops being a gain */
    double phi = 0.0, theta = 0.0;
    if (a->vcost) theta = 1.0 / ((double)a->draft_cost + (double)a->vcost[0]);
    if (a->want > 0) ddt_bf_push(a, &heap_n, ddt_bf_make(a->out_logw[0] + a->logq[0], 0, 1, 0));
    /* Every rank read below is below k (checked before a sibling is pushed); without a
     * predicate also at most `want`, as a rank r needs r earlier pops at its depth.  The heap
     * never holds more than want + 1 entries: a kept pop adds at most one, a refused one none. */
    while (nodes - 1 < a->want && heap_n > 0) {
        ddt_bf_entry e = ddt_bf_pop(a, &heap_n);
        size_t row = (size_t)(e.depth - 1) * (size_t)a->ld;
        const int32_t tok = a->token[row + (size_t)e.rank];
        if (a->allow && !a->allow(a->allow_ctx, e.parent, nodes, tok)) {
            /* refused: its prefixes are never verified, but the ranks after it at this
             * depth still are candidates (a lighter sibling may be allowed) */
            if (e.rank + 1 < a->k)
                ddt_bf_push(a, &heap_n,
                            ddt_bf_make(a->out_logw[e.parent] + a->logq[row + (size_t)e.rank + 1],
                                        e.parent, e.depth, e.rank + 1));
            continue;
        }
        if (a->vcost) {
            double phi_next = phi + (double)ddt_exp_det(e.logw);
            double theta_next = (1.0 + phi_next) / ((double)a->draft_cost + (double)a->vcost[nodes]);
            if (!(theta_next > theta)) break; /* throughput stopped rising */
            phi = phi_next;
            theta = theta_next;
        }
        int32_t id = nodes++;
        a->out_token[id] = tok;
        a->out_parent[id] = e.parent;
        a->out_depth[id] = e.depth;
        a->out_rank[id] = e.rank;
        a->out_logw[id] = e.logw;
        if (e.rank > a->max_rank[e.depth - 1]) a->max_rank[e.depth - 1] = e.rank;
        /* a child's weight is always fp32(parent weight + logq): reproducible anywhere */
        if (e.rank + 1 < a->k)
            ddt_bf_push(a, &heap_n,
                        ddt_bf_make(a->out_logw[e.parent] + a->logq[row + (size_t)e.rank + 1],
                                    e.parent, e.depth, e.rank + 1));
        if (e.depth < a->depth)
            ddt_bf_push(a, &heap_n,
                        ddt_bf_make(e.logw + a->logq[(size_t)e.depth * (size_t)a->ld], id,
                                    e.depth + 1, 0));
    }
    return nodes;
}

#endif
