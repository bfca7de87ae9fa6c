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
    if (em->fn && em->n > start) em->fn(em->ctx, em->out + start, em->n - start);
}
