/*
 * emitter.h — the engine's output side, shared by its CPU and CUDA loops:
 * appends a round's tokens to the caller's array, stops at max_new or after a
 * stop id (which is emitted), and streams each round's new tokens to a callback.
 */
#ifndef DDT_ENGINE_EMITTER_H
#define DDT_ENGINE_EMITTER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

typedef struct ddt_emitter {
    int32_t *out;
    int32_t n, max;
    const int32_t *stop;
    int32_t n_stop;
    bool done;
    ddt_emit_fn fn;
    void *ctx;
} ddt_emitter;

/* Emit ids in order until max_new or a stop id (emitted, then done). */
void ddt_emitter_push(ddt_emitter *em, const int32_t *ids, int32_t n);

#endif
