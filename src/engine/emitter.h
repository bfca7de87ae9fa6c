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

/* Emit ids in order until max_new or a stop id (emitted, then done), or until the callback says stop. */
void ddt_emitter_push(ddt_emitter *em, const int32_t *ids, int32_t n);

/* The totals of a finished generation (times in seconds since any common origin):
 * tokens, total time, mean acceptance and decode tokens/s, which leaves out the
 * first token (it comes from the prompt pass, timed as prefill). */
void ddt_emitter_finish_stats(const ddt_emitter *em, double t_start, double t_decode, double t_end,
                              ddt_gen_stats *s);

#endif
