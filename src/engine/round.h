/*
 * round.h — what every backend's decoding loop shares (internal to the engine
 * layer): the prefill chunk, the clock, the per-round budget and top-K clamps,
 * and the verify-cost measurement of the auto budget (or the adoption of a
 * given table), and the auto budget's fallback to ar steps.  The CPU loop
 * (engine_cpu.c) and the CUDA loop (engine_cuda.c) call these; neither keeps a
 * copy of its own.
 */
#ifndef DDT_ENGINE_ROUND_H
#define DDT_ENGINE_ROUND_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

#define DDT_ENGINE_PREFILL_CHUNK 64 /* prompt tokens per forward */
/* Node-count points of a measured verify cost: ddt_engine_cost_points gives at
 * most 26 for any budget up to DDT_MAX_BUDGET = 1024 (0, 1, 2, 4, 8, 10, 12, 16, 20,
 * 24, ..., 768 and the budget); tests/engine/test_engine_round.c checks every budget. */
#define DDT_ENGINE_COST_POINTS 26
/* The context (rows already in the cache) a GPU measures its verify costs after:
 * about a short prompt plus a reply so far. */
#define DDT_ENGINE_COST_CONTEXT 128
#define DDT_ENGINE_COST_REPS 3 /* a measurement is the best of this many runs, after one warm-up run */

/* Monotonic seconds (the phase timers of ddt_gen_stats). */
double ddt_engine_now(void);

/* K, the candidates per depth an engine allocates for: min(budget, vocab,
 * DDT_MAX_TOPK), at least 1.  budget is the largest tree budget the engine
 * runs (1 for ar and chain). */
int32_t ddt_engine_topk_cap(int32_t budget, int32_t vocab);

/*
 * One round's size: the nodes beyond the root (tree: the budget, chain: the
 * draft depth) cut to the room left in the context, returned; *k, the
 * candidates per depth of the round's draft table: min(nodes, kmax) in tree
 * mode, 1 in chain mode, at least 1.
 */
int32_t ddt_engine_round_nodes(ddt_mode mode, int32_t budget, int32_t depth, int32_t room, int32_t kmax,
                               int32_t *k);

/* A backend's timer, in seconds: of one target forward of n tokens (the root
 * and n - 1 nodes) as the forward timer, of one draft as the draft timer (n = 0). */
typedef ddt_status (*ddt_cost_timer_fn)(void *ctx, int32_t n, double *seconds, ddt_error *err);

/*
 * Measure the cost model of the auto budget: C_verify at the node counts of
 * ddt_engine_cost_points(budget) and the draft cost (0 when draft is NULL),
 * each the best of DDT_ENGINE_COST_REPS runs after a warm-up, at least 1e-7 s
 * (the verify points in two sweeps, the second kept: see round.c),
 * verify made non-decreasing so that noise cannot end a build early.  nodes and
 * verify [DDT_ENGINE_COST_POINTS] are the caller's and become out's tables.
 */
ddt_status ddt_engine_measure_cost(int32_t budget, ddt_cost_timer_fn forward, ddt_cost_timer_fn draft,
                                   void *ctx, float *nodes, float *verify, ddt_cost_model *out, ddt_error *err);

/*
 * Adopt a cost model the caller gave (options.cost) instead of measuring one:
 * its node and verify tables copied into nodes / verify [DDT_ENGINE_COST_POINTS]
 * (the engine's own, so the caller's may go away), *out = *given pointing at
 * them.  given was checked by the facade (engine.c: valid, one context row, at
 * most DDT_ENGINE_COST_POINTS points).  Every backend takes a given table so.
 */
void ddt_engine_adopt_cost(const ddt_cost_model *given, float *nodes, float *verify, ddt_cost_model *out);

/*
 * The auto budget over several ranks (the multi-GPU engine): every rank must build
 * the same trees, so every rank takes rank 0's table, whatever its own GPU timed.
 * One all-reduce (a sum) carries it: ddt_engine_cost_pack writes rank 0's model into
 * buf [DDT_ENGINE_COST_WIRE] (draft cost, point count, the node and verify columns
 * zero-padded) and zeros on every other rank; x + 0 = x exactly, in any order, so
 * after the sum every rank holds rank 0's bits, which ddt_engine_cost_unpack turns
 * back into a model over the rank's own nodes / verify [DDT_ENGINE_COST_POINTS]
 * (DDT_ERR_INVALID, naming the entry, for a buffer that is no packed model: ranks
 * that did not all take part, or a source rank that packed none).
 */
#define DDT_ENGINE_COST_WIRE (2 + 2 * DDT_ENGINE_COST_POINTS)
void ddt_engine_cost_pack(const ddt_cost_model *c, bool source, float *buf);
ddt_status ddt_engine_cost_unpack(const float *buf, float *nodes, float *verify, ddt_cost_model *out,
                                  ddt_error *err);

/*
 * --budget auto's fallback to plain ar steps, for every backend's loop: when a
 * speculative round's tokens per cost (smoothed) fall below an ar step's, the
 * next `hold` rounds are ar steps (the drafter still fed, so a later round can
 * draft), then one speculative round probes again; a probe that still loses
 * doubles the hold, one that wins resets it.  The hold is also scaled by how far
 * speculation is from paying (ar rate over its rate): a probe costs a draft,
 * which on a CPU is several ar steps.  The average weighs the past 0.85
 * (DDT_AR_FALLBACK_DECAY overrides it; bench/bench_fallback_model.c ranks values
 * under a GPU's costs).  Costs are the auto budget's table, so the
 * choice is deterministic for an engine; tokens are the target's either way
 * (greedy: equal; sampled: each a target sample).
 */
#define DDT_AR_HOLD_MIN 4
#define DDT_AR_HOLD_MAX 64

typedef struct ddt_ar_fallback {
    bool on;        /* an auto-budget tree generation with a cost table */
    double tau_avg; /* tokens a speculative round yields, smoothed (< 0: none yet) */
    int32_t hold, backoff;
    double decay;   /* the smoothing's weight on the past */
} ddt_ar_fallback;

/* A generation's start: nothing held; off unless `on`. */
void ddt_ar_fallback_start(ddt_ar_fallback *f, bool on);

/* Whether this round is an ar step (taking one from the hold). */
bool ddt_ar_fallback_step(ddt_ar_fallback *f);

/* After speculative round `round` (1, 2, ...) that verified `nodes` rows (the
 * root included) and emitted `accepted` tokens, under cost table c. */
void ddt_ar_fallback_after_round(ddt_ar_fallback *f, uint64_t round, int32_t accepted, int32_t nodes,
                                 const ddt_cost_model *c);

#endif
