/*
 * lookup.h — the context lookup: a draft path taken from the context itself.
 * Code and structured text repeat, and where the last tokens of the context
 * occurred before, what followed them then is a good guess of what follows now
 * ("prompt lookup decoding").  The engine grafts that continuation onto the
 * DDTree tree (ddt_tree_graft, ddtree.h) in place of the tree's lightest nodes
 * where its weight says it is the likelier draft, so the same budget holds both:
 * on the shipped pair greedy tree 16 accepts ~7% more tokens a round with it
 * (NOTES.md, eighteenth session).  The output is the target's either way.
 *
 * The match: the longest suffix of the context, DDT_LOOKUP_MIN..DDT_LOOKUP_MAX
 * tokens, that occurred earlier, its most recent occurrence on ties; the
 * proposal is what followed that occurrence, up to max_len tokens.  One pass
 * over the context from its end (O(n), mostly one compare a position).  Pure C,
 * inline where the GPU can use it.
 */
#ifndef DDT_CORE_LOOKUP_H
#define DDT_CORE_LOOKUP_H

#include <stdint.h>

#ifdef __CUDACC__
#define DDT_LOOKUP_HD __host__ __device__
#else
#define DDT_LOOKUP_HD
#endif

#define DDT_LOOKUP_MIN 2 /* shortest suffix that counts as a match */
#define DDT_LOOKUP_MAX 8 /* longest suffix compared: a match this long is taken at once */

/* The length of the match of ctx's suffix ending at position s (s < n - 1):
 * how many k < DDT_LOOKUP_MAX have ctx[s - k] == ctx[n - 1 - k] in a row. */
DDT_LOOKUP_HD static inline int32_t ddt_lookup_match_at(const int32_t *ctx, int32_t n, int32_t s) {
    int32_t k = 0;
    while (k < DDT_LOOKUP_MAX && k <= s && ctx[s - k] == ctx[n - 1 - k]) k++;
    return k;
}

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The proposal for ctx[0..n): out[0..returned) (at most max_len tokens), the
 * match's length in *match_len (DDT_LOOKUP_MIN..DDT_LOOKUP_MAX; 0 and nothing
 * proposed when no suffix of DDT_LOOKUP_MIN tokens occurred before).
 */
int32_t ddt_lookup_propose(const int32_t *ctx, int32_t n, int32_t max_len, int32_t *out, int32_t *match_len);

#ifdef __cplusplus
}
#endif

#endif
