/*
 * emitter.h — the engine's output side, shared by its CPU and CUDA loops:
 * appends a round's tokens to the caller's array, stops at max_new or after a
 * stop id (which is emitted), streams each round's new tokens to a callback,
 * and records why it stopped.
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
    ddt_stop_reason reason; /* set when done by a stop id, max_new or the callback */
} ddt_emitter;

/* An emitter into out [max_new] (done at once when max_new is 0). */
ddt_emitter ddt_emitter_start(int32_t *out, int32_t max_new, const int32_t *stop, int32_t n_stop, ddt_emit_fn fn,
                              void *ctx);

/* Emit ids in order until max_new or a stop id (emitted, then done), or until the callback says stop. */
void ddt_emitter_push(ddt_emitter *em, const int32_t *ids, int32_t n);

/* The totals of a finished generation (times in seconds since any common origin):
 * tokens, total time, mean acceptance and decode tokens/s, which leaves out the
 * first token (it comes from the prompt pass, timed as prefill), and the stop
 * reason: the emitter's, else max tokens when max_new is 0, else the context
 * (a loop ends before it is done only when the context is full). */
void ddt_emitter_finish_stats(const ddt_emitter *em, double t_start, double t_decode, double t_end,
                              ddt_gen_stats *s);

#endif
