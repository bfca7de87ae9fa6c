/*
 * logit_rules.c — logit_bias and the presence / frequency penalties over a
 * logits row, with the generated-token counts they read (logit_rules.h).
 */
#include "engine/logit_rules.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

ddt_status ddt_logit_state_init(ddt_logit_state *s, int32_t vocab, ddt_error *err) {
    memset(s, 0, sizeof *s);
    if (vocab < 1) return ddt_fail(err, DDT_ERR_INVALID, "logit rules: vocabulary of %d ids", vocab);
    s->vocab = vocab;
    s->count = ddt_calloc_array((size_t)vocab, sizeof(int32_t));
    s->seen = ddt_calloc_array((size_t)vocab, sizeof(int32_t));
    s->bias_ids = ddt_calloc_array(DDT_LOGIT_BIAS_MAX, sizeof(int32_t));
    s->bias = ddt_calloc_array(DDT_LOGIT_BIAS_MAX, sizeof(float));
    s->in_prompt = ddt_calloc_array((size_t)vocab, sizeof(uint8_t));
    s->prompt_seen = ddt_calloc_array((size_t)vocab, sizeof(int32_t));
    if (!s->count || !s->seen || !s->bias_ids || !s->bias || !s->in_prompt || !s->prompt_seen) {
        ddt_logit_state_free(s);
        return ddt_fail(err, DDT_ERR_NOMEM, "logit rules: out of memory for %d ids", vocab);
    }
    return DDT_OK;
}

void ddt_logit_state_free(ddt_logit_state *s) {
    if (!s) return;
    free(s->count);
    free(s->seen);
    free(s->bias_ids);
    free(s->bias);
    free(s->in_prompt);
    free(s->prompt_seen);
    memset(s, 0, sizeof *s);
}

ddt_status ddt_logit_state_set(ddt_logit_state *s, const ddt_logit_rules *r, ddt_error *err) {
    if (!r) {
        s->n_bias = 0;
        s->presence = s->frequency = s->repetition = 0.0f;
        s->active = false;
        return DDT_OK;
    }
    if (r->n_bias < 0 || r->n_bias > DDT_LOGIT_BIAS_MAX || (r->n_bias > 0 && (!r->bias_ids || !r->bias)))
        return ddt_fail(err, DDT_ERR_RANGE, "logit_bias: %d entries (0 .. %d, with ids and values)", r->n_bias,
                        DDT_LOGIT_BIAS_MAX);
    for (int32_t i = 0; i < r->n_bias; i++) {
        const int32_t id = r->bias_ids[i];
        const float b = r->bias[i];
        if (id < 0 || id >= s->vocab)
            return ddt_fail(err, DDT_ERR_RANGE, "logit_bias: token id %d outside this model's 0 .. %d", id, s->vocab - 1);
        if (!(b >= -DDT_LOGIT_BIAS_LIMIT && b <= DDT_LOGIT_BIAS_LIMIT))
            return ddt_fail(err, DDT_ERR_RANGE, "logit_bias: token %d's bias %g outside -%g .. %g", id, (double)b,
                            (double)DDT_LOGIT_BIAS_LIMIT, (double)DDT_LOGIT_BIAS_LIMIT);
        for (int32_t k = 0; k < i; k++)
            if (r->bias_ids[k] == id) return ddt_fail(err, DDT_ERR_INVALID, "logit_bias: token id %d given twice", id);
    }
    const float pen[2] = {r->presence, r->frequency};
    for (int k = 0; k < 2; k++)
        if (!(pen[k] >= -DDT_PENALTY_LIMIT && pen[k] <= DDT_PENALTY_LIMIT))
            return ddt_fail(err, DDT_ERR_RANGE, "%s %g outside -%g .. %g", k ? "frequency_penalty" : "presence_penalty",
                            (double)pen[k], (double)DDT_PENALTY_LIMIT, (double)DDT_PENALTY_LIMIT);
    if (r->repetition != 0.0f && !(r->repetition > 0.0f && r->repetition <= DDT_REPETITION_LIMIT))
        return ddt_fail(err, DDT_ERR_RANGE, "repetition_penalty %g outside (0, %g] (0: none)", (double)r->repetition,
                        (double)DDT_REPETITION_LIMIT);
    if (r->n_bias > 0) { /* the arrays may be NULL without entries (memcpy's arguments may not) */
        memcpy(s->bias_ids, r->bias_ids, sizeof(int32_t) * (size_t)r->n_bias);
        memcpy(s->bias, r->bias, sizeof(float) * (size_t)r->n_bias);
    }
    s->n_bias = r->n_bias;
    s->presence = r->presence;
    s->frequency = r->frequency;
    s->repetition = r->repetition == 1.0f ? 0.0f : r->repetition; /* 1 divides and multiplies by 1: none */
    s->active = r->n_bias > 0 || r->presence != 0.0f || r->frequency != 0.0f || s->repetition != 0.0f;
    return DDT_OK;
}

void ddt_logit_state_reset(ddt_logit_state *s, const int32_t *prompt, int32_t n_prompt) {
    for (int32_t i = 0; i < s->n_seen; i++) s->count[s->seen[i]] = 0;
    s->n_seen = 0;
    for (int32_t i = 0; i < s->n_prompt_seen; i++) s->in_prompt[s->prompt_seen[i]] = 0;
    s->n_prompt_seen = 0;
    for (int32_t i = 0; i < n_prompt; i++) {
        const int32_t id = prompt[i];
        if (id < 0 || id >= s->vocab || s->in_prompt[id]) continue;
        s->in_prompt[id] = 1;
        s->prompt_seen[s->n_prompt_seen++] = id;
    }
}

/* vLLM's repetition penalty of one value */
static inline float repeat(float l, float r) { return l > 0.0f ? l / r : l * r; }

void ddt_logit_state_push(ddt_logit_state *s, const int32_t *ids, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        const int32_t id = ids[i];
        if (id < 0 || id >= s->vocab) continue; /* the engines emit only ids of the vocabulary */
        if (s->count[id]++ == 0) s->seen[s->n_seen++] = id;
    }
}

/* Undo ddt_logit_state_push(ids, n): the ids come off in reverse, so an id first
 * seen among them leaves the end of the seen list. */
static void pop(ddt_logit_state *s, const int32_t *ids, int32_t n) {
    for (int32_t i = n - 1; i >= 0; i--) {
        const int32_t id = ids[i];
        if (id < 0 || id >= s->vocab) continue;
        if (--s->count[id] == 0) s->n_seen--;
    }
}

void ddt_logit_state_apply(ddt_logit_state *s, const float *row, const int32_t *path, int32_t n_path, float *out) {
    if (out != row) memcpy(out, row, sizeof(float) * (size_t)s->vocab);
    ddt_logit_state_bias_rows(s, out, 1);
    if (s->presence == 0.0f && s->frequency == 0.0f && s->repetition == 0.0f) return;
    ddt_logit_state_push(s, path, n_path);
    if (s->repetition != 0.0f) {
        /* each id once: the generated ones, then the prompt's not generated */
        for (int32_t i = 0; i < s->n_seen; i++) out[s->seen[i]] = repeat(out[s->seen[i]], s->repetition);
        for (int32_t i = 0; i < s->n_prompt_seen; i++) {
            const int32_t id = s->prompt_seen[i];
            if (s->count[id] == 0) out[id] = repeat(out[id], s->repetition);
        }
    }
    if (s->presence != 0.0f || s->frequency != 0.0f)
        for (int32_t i = 0; i < s->n_seen; i++) {
            const int32_t id = s->seen[i];
            out[id] = out[id] - (float)s->count[id] * s->frequency - s->presence;
        }
    pop(s, path, n_path);
}

void ddt_logit_state_bias_rows(const ddt_logit_state *s, float *rows, int32_t n_rows) {
    for (int32_t d = 0; d < n_rows; d++) {
        float *row = rows + (size_t)d * (size_t)s->vocab;
        for (int32_t i = 0; i < s->n_bias; i++) row[s->bias_ids[i]] = row[s->bias_ids[i]] + s->bias[i];
    }
}
