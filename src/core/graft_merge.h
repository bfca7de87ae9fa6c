/*
 * graft_merge.h — the merge of the context lookup's graft (ddt_tree_graft_plan,
 * src/core/tree.c), inline code that also compiles for CUDA so the device graft
 * (src/backend/cuda/tree_cuda.cu) runs the same lines and keeps the same bits.
 *
 * The tree's nodes 1..n-1 come in pop order (weights non-increasing) and the path's
 * prefixes too; the merge takes the heavier first, the tree's node on ties, within
 * `budget` nodes.  A tree node that is a taken path prefix's twin costs nothing (the
 * path reuses it); a path prefix whose twin is kept already is skipped.  The caller
 * finds the twins (its own way: child lists on the CPU, one warp on the GPU); every
 * size here is checked by the caller.
 */
#ifndef DDT_CORE_GRAFT_MERGE_H
#define DDT_CORE_GRAFT_MERGE_H

#include <stdint.h>

#ifdef __CUDACC__
#define DDT_GRAFT_HD __host__ __device__
#else
#define DDT_GRAFT_HD
#endif

/* logw: the tree's weights [n]; twin[j]: the tree's node for the path's prefix of
 * j + 1 tokens, -1 if none; v: the path prefixes' weights [len].  Returns how many of
 * the path's prefixes the merge reaches (j), and in *keep how many tree nodes stay
 * (the root included); path prefixes below j whose twin is below *keep are not new. */
DDT_GRAFT_HD static inline int32_t ddt_graft_merge(const float *logw, int32_t n, const int32_t *twin,
                                                   const float *v, int32_t len, int32_t budget,
                                                   int32_t *keep) {
    int32_t i = 1, j = 0, count = 0;
    for (;;) {
        while (j < len && twin[j] >= 1 && twin[j] < i) j++;
        const int has_tree = i < n, has_path = j < len;
        if (!has_tree && !has_path) break;
        if (has_tree && (!has_path || logw[i] >= v[j])) {
            int taken_twin = 0;
            for (int32_t q = 0; q < j && !taken_twin; q++) taken_twin = twin[q] == i;
            if (!taken_twin && count + 1 > budget) break;
            count += taken_twin ? 0 : 1;
            i++;
        } else {
            if (count + 1 > budget) break;
            count++;
            j++;
        }
    }
    *keep = i;
    return j;
}

#endif
