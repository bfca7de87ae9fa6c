/*
 * fuzz_tree.c — libFuzzer target for the tree builder, given trees and the walk.
 * The first byte picks a mode; the rest fills the inputs raw (unsorted rows, NaN,
 * negative or huge tokens, parents anywhere, depths that lie), so every check of
 * the builder and the walk is exercised.  Any crash, hang, overrun or UB is a bug:
 * the walk in particular must survive a damaged tree written straight into the
 * ddt_tree arrays (the bug that crashed the first accept kernel).
 */
#include <stdint.h>
#include <string.h>

#include "ddtree.h"

static ddt_builder *g_builder;
static ddt_tree g_tree;

static uint32_t take(const uint8_t **p, size_t *n, size_t bytes) {
    uint32_t v = 0;
    for (size_t i = 0; i < bytes && *n > 0; i++, (*p)++, (*n)--) v |= (uint32_t)**p << (8 * i);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_builder) {
        if (ddt_builder_create(DDT_MAX_BUDGET, &g_builder, NULL)) return 0;
        if (ddt_tree_alloc(DDT_MAX_NODES, &g_tree, NULL)) return 0;
    }
    const uint8_t *p = data;
    size_t n = size;
    uint32_t mode = take(&p, &n, 1) % 3;
    ddt_error err;
    if (mode == 0) { /* build from a raw table, then walk with raw targets */
        static float logq[DDT_MAX_DEPTH * 64];
        static int32_t tok[DDT_MAX_DEPTH * 64];
        int32_t D = (int32_t)(take(&p, &n, 1) % 33);          /* includes 0 and 32: invalid */
        int32_t K = (int32_t)(take(&p, &n, 1) % 66);          /* includes 0, 64, 65 */
        int32_t B = (int32_t)(take(&p, &n, 2) % 1100) - 20;   /* negative .. over max */
        int32_t vocab = (int32_t)(take(&p, &n, 2) % 300);
        int32_t root = (int32_t)take(&p, &n, 2) - 100;
        int32_t kk = K > 64 ? 64 : K, dd = D > DDT_MAX_DEPTH ? DDT_MAX_DEPTH : D;
        for (int32_t i = 0; i < dd * kk; i++) {
            uint32_t bits = take(&p, &n, 4);
            memcpy(&logq[i], &bits, 4);
            tok[i] = (int32_t)take(&p, &n, 2) - 10;
        }
        ddt_draft_table tb = {D, kk == K ? K : 64, logq, tok};
        if (ddt_tree_build(g_builder, &tb, root, B, NULL, vocab, &g_tree, &err) == DDT_OK) {
            static int32_t next[DDT_MAX_NODES];
            for (int32_t i = 0; i < g_tree.n_nodes; i++) next[i] = (int32_t)take(&p, &n, 2) - 10;
            ddt_walk_result w;
            if (ddt_tree_walk(&g_tree, next, vocab, &w, &err) == DDT_OK &&
                (w.length < 1 || w.length > DDT_MAX_PATH))
                __builtin_trap();
        }
    } else if (mode == 1) { /* a given tree from raw parents */
        static int32_t tok[DDT_MAX_NODES], par[DDT_MAX_NODES], next[DDT_MAX_NODES];
        int32_t cnt = (int32_t)(take(&p, &n, 2) % (DDT_MAX_NODES + 5));
        for (int32_t i = 0; i < cnt && i < DDT_MAX_NODES; i++) {
            tok[i] = (int32_t)take(&p, &n, 1);
            par[i] = (int32_t)(int8_t)take(&p, &n, 1) + (i > 8 ? i - 8 : 0);
            next[i] = (int32_t)take(&p, &n, 1);
        }
        if (cnt <= DDT_MAX_NODES &&
            ddt_tree_from_parents(tok, par, cnt, 256, &g_tree, &err) == DDT_OK) {
            ddt_walk_result w;
            if (ddt_tree_walk(&g_tree, next, 256, &w, &err) != DDT_OK) __builtin_trap();
        }
    } else { /* a damaged tree written straight into the arrays */
        static int32_t next[DDT_MAX_NODES];
        int32_t cnt = (int32_t)(take(&p, &n, 2) % (DDT_MAX_NODES + 5)) - 2;
        g_tree.n_nodes = cnt;
        for (int32_t i = 0; i < DDT_MAX_NODES; i++) {
            g_tree.token[i] = (int32_t)(int8_t)take(&p, &n, 1);
            g_tree.parent[i] = (int32_t)(int8_t)take(&p, &n, 1) + i;
            g_tree.depth[i] = (int32_t)(int8_t)take(&p, &n, 1);
            next[i] = (int32_t)(int8_t)take(&p, &n, 1);
        }
        ddt_walk_result w;
        (void)ddt_tree_walk(&g_tree, next, 0, &w, &err);
    }
    return 0;
}
