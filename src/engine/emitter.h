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

/*
 * Ranks that decode the same tokens in lockstep (the multi-GPU engine: one
 * engine_cuda per GPU) must end after the same round, or the ranks still going
 * wait for ever in a collective.  Every reason to end is the same on every rank
 * (same tokens, same max_new and stop ids, same context) except the caller's
 * callback, which only rank 0 has.  So each round every rank contributes a stop
 * flag to a sum over the ranks, exchanged before the round's own collectives,
 * and every rank ends after the round whose sum is set, that round's tokens
 * dropped (rank 0 has already emitted all it will).
 *
 * Before each round: returns whether this rank runs it, and *flag, its
 * contribution: 1 when this emitter was cancelled by its callback (rank 0 then
 * runs one round more, only to say so), else 0.  lockstep false (one engine
 * alone): runs while not done, *flag 0.
 */
bool ddt_emitter_next_round(const ddt_emitter *em, bool lockstep, float *flag);

/* The totals of a finished generation (times in seconds since any common origin):
 * tokens, total time, mean acceptance and decode tokens/s, which leaves out the
 * first token (it comes from the prompt pass, timed as prefill), and the stop
 * reason: the emitter's, else max tokens when max_new is 0, else the context
 * (a loop ends before it is done only when the context is full). */
void ddt_emitter_finish_stats(const ddt_emitter *em, double t_start, double t_decode, double t_end,
                              ddt_gen_stats *s);

#endif
