/*
 * lookup.c — the context lookup's proposal (see lookup.h).
 */
#include "core/lookup.h"

int32_t ddt_lookup_propose(const int32_t *ctx, int32_t n, int32_t max_len, int32_t *out, int32_t *match_len) {
    *match_len = 0;
    if (!ctx || n < DDT_LOOKUP_MIN + 1 || max_len < 1) return 0;
    int32_t best = 0, at = -1;
    /* from the most recent earlier position back: a longer match wins, the first
       found of a length is the most recent; the longest possible ends the search */
    for (int32_t s = n - 2; s >= 0 && best < DDT_LOOKUP_MAX; s--) {
        if (ctx[s] != ctx[n - 1]) continue;
        const int32_t m = ddt_lookup_match_at(ctx, n, s);
        if (m > best) {
            best = m;
            at = s;
        }
    }
    if (best < DDT_LOOKUP_MIN) return 0;
    int32_t len = n - 1 - at; /* tokens after the occurrence, up to the context's end */
    if (len > max_len) len = max_len;
    for (int32_t i = 0; i < len; i++) out[i] = ctx[at + 1 + i];
    *match_len = best;
    return len;
}
