/*
 * logprobs.h — the log-probabilities a generation reports per emitted token
 * (engine.h ddt_engine_set_logprobs), from one row of target logits.  Shared by
 * the engines that have their logits on the host.
 */
#ifndef DDT_ENGINE_LOGPROBS_H
#define DDT_ENGINE_LOGPROBS_H

#include <stdint.h>

#include "engine/engine.h"

/* out = token's log-softmax value in logits[0..vocab) and the n_top largest
 * (value descending, ties by lower id; NaN entries never among them).  The sum
 * runs in double in index order, so the same row always gives the same bits.  A
 * row holding a NaN gives NaN. */
void ddt_logprobs_of_row(const float *logits, int32_t vocab, int32_t token, int32_t n_top, ddt_token_logprobs *out);

#endif
