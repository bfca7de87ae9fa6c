/*
 * emitter.c — see emitter.h.
 */
#include "engine/emitter.h"

void ddt_emitter_push(ddt_emitter *em, const int32_t *ids, int32_t n) {
    int32_t start = em->n;
    for (int32_t i = 0; i < n && !em->done; i++) {
        if (em->n >= em->max) {
            em->done = true;
            break;
        }
        em->out[em->n++] = ids[i];
        for (int32_t s = 0; s < em->n_stop; s++)
            if (ids[i] == em->stop[s]) em->done = true;
    }
    if (em->n >= em->max) em->done = true;
    if (em->fn && em->n > start && !em->fn(em->ctx, em->out + start, em->n - start)) {
        em->done = true; /* the caller asked to stop: it knows why */
    }
}

void ddt_emitter_finish_stats(const ddt_emitter *em, double t_start, double t_decode, double t_end,
                              ddt_gen_stats *s) {
    s->tokens = em->n;
    s->t_total = t_end - t_start;
    s->mean_acceptance = s->rounds ? (double)s->accepted / (double)s->rounds : 0.0;
    s->tokens_per_s = t_end > t_decode ? (double)(em->n > 1 ? em->n - 1 : 0) / (t_end - t_decode) : 0.0;
}
