/*
 * logprobs.c — see logprobs.h.
 */
#include "engine/logprobs.h"

#include <math.h>
#include <stdbool.h>

void ddt_logprobs_of_row(const float *logits, int32_t vocab, int32_t token, int32_t n_top, ddt_token_logprobs *out) {
    double mx = -INFINITY;
    bool nan = false;
    for (int32_t i = 0; i < vocab; i++) {
        if (isnan(logits[i])) nan = true;
        else if (logits[i] > mx) mx = logits[i];
    }
    double sum = 0.0;
    if (!nan && isfinite(mx))
        for (int32_t i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    /* log Z; a row of -inf (or +inf) has no distribution: NaN, like a NaN row */
    const double logz = nan || !isfinite(mx) ? NAN : mx + log(sum);
    out->logprob = (float)((double)logits[token] - logz);
    if (n_top > DDT_MAX_TOP_LOGPROBS) n_top = DDT_MAX_TOP_LOGPROBS;
    if (n_top > vocab) n_top = vocab;
    int32_t n = 0;
    for (int32_t i = 0; i < vocab; i++) {
        const float v = logits[i];
        if (isnan(v)) continue;
        /* the slot i takes among the best so far: after every larger value (and every
           equal one, which has a lower id) */
        int32_t at = n;
        while (at > 0 && v > logits[out->top_id[at - 1]]) at--;
        if (at >= n_top) continue;
        if (n < n_top) n++;
        for (int32_t j = n - 1; j > at; j--) out->top_id[j] = out->top_id[j - 1];
        out->top_id[at] = i;
    }
    out->n_top = n;
    for (int32_t j = 0; j < n; j++) out->top_logprob[j] = (float)((double)logits[out->top_id[j]] - logz);
}
