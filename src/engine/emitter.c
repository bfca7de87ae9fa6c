/*
 * emitter.c — see emitter.h.
 */
#include "engine/emitter.h"

ddt_emitter ddt_emitter_start(int32_t *out, int32_t max_new, const int32_t *stop, int32_t n_stop, ddt_emit_fn fn,
                              void *ctx) {
    return (ddt_emitter){out, 0, max_new, stop, n_stop, max_new == 0, fn, ctx, DDT_STOP_NONE};
}

void ddt_emitter_push(ddt_emitter *em, const int32_t *ids, int32_t n) {
    int32_t start = em->n;
    for (int32_t i = 0; i < n && !em->done; i++) {
        if (em->n >= em->max) {
            em->done = true;
            break;
        }
        em->out[em->n++] = ids[i];
        for (int32_t s = 0; s < em->n_stop; s++)
            if (ids[i] == em->stop[s]) {
                em->done = true;
                em->reason = DDT_STOP_TOKEN;
            }
    }
    if (em->n >= em->max) {
        em->done = true;
        if (!em->reason) em->reason = DDT_STOP_MAX_TOKENS;
    }
    if (em->fn && em->n > start && !em->fn(em->ctx, em->out + start, em->n - start)) {
        em->done = true; /* the caller asked to stop: it knows why */
        if (!em->reason) em->reason = DDT_STOP_CANCELLED;
    }
}

bool ddt_emitter_next_round(const ddt_emitter *em, bool lockstep, float *flag) {
    /* DDT_STOP_CANCELLED is set only when no other reason was (ddt_emitter_push),
       so a cancelled emitter is exactly one whose callback-less twins go on */
    const bool tell = lockstep && em->done && em->reason == DDT_STOP_CANCELLED;
    *flag = tell ? 1.0f : 0.0f;
    return !em->done || tell;
}

void ddt_emitter_finish_stats(const ddt_emitter *em, double t_start, double t_decode, double t_end,
                              ddt_gen_stats *s) {
    s->tokens = em->n;
    s->t_total = t_end - t_start;
    s->mean_acceptance = s->rounds ? (double)s->accepted / (double)s->rounds : 0.0;
    s->tokens_per_s = t_end > t_decode ? (double)(em->n > 1 ? em->n - 1 : 0) / (t_end - t_decode) : 0.0;
    s->stop_reason = em->reason ? em->reason : em->n >= em->max ? DDT_STOP_MAX_TOKENS : DDT_STOP_CONTEXT;
}
