/*
 * backend.h — the interface every decoding backend implements (internal to the
 * engine layer).  engine.c is a facade: it checks the options, resolves the
 * context length and the drafter's config, validates every generate call, and
 * dispatches through one of these tables:
 *
 *   ddt_engine_cpu_backend    engine_cpu.c         the CPU loop
 *   ddt_engine_cuda_backend   engine_cuda.c        the round as a CUDA graph on one GPU
 *   ddt_engine_multi_backend  engine_multi_cuda.c  that round on several GPUs over NCCL
 * (the two CUDA tables are adapters in backend_cuda.c over engine_cuda.h and
 * engine_multi_cuda.h, whose functions take their own engine types)
 *
 * What the loops share (clamps, cost points and measurement, the clock) is in
 * round.h, their output side (stop ids, max tokens, the stop reason) in emitter.h.
 */
#ifndef DDT_ENGINE_BACKEND_H
#define DDT_ENGINE_BACKEND_H

#include "engine/engine.h"
#include "model/drafter.h"

/* What engine.c resolved before a backend is created. */
typedef struct ddt_engine_setup {
    int32_t max_ctx;                 /* context tokens: options.max_ctx or the model's, checked */
    const ddt_drafter_config *draft; /* the DFlash drafter's config.json when one is loaded, else NULL */
} ddt_engine_setup;

/* Whether an engine with these options loads a drafter: a speculative mode, or a
 * reserve (ddt_engine_set_speculation) with a drafter to switch to. */
static inline bool ddt_engine_drafts(const ddt_engine_options *o) {
    return o->mode != DDT_MODE_AR || (o->reserve_budget > 0 && (o->draft_dir || o->draft_fn));
}

typedef struct ddt_engine_backend_ops {
    const char *name;
    /* opts as the caller gave them (checked); *out on success */
    ddt_status (*create)(const char *model_dir, const ddt_engine_options *opts, const ddt_engine_setup *setup,
                         void **out, ddt_error *err);
    void (*free)(void *impl);
    int32_t (*vocab)(const void *impl);
    const ddt_model_config *(*model_config)(const void *impl);
    void (*set_sampling)(void *impl, const ddt_sampling *s); /* checked by engine.c */
    /* NULL: the backend runs only the mode it was created for.  Called with a
     * known mode, budget_auto only in tree mode, and a change. */
    ddt_status (*set_speculation)(void *impl, ddt_mode mode, int32_t budget, bool budget_auto, ddt_error *err);
    /* NULL: the backend cannot report log-probabilities (engine.h ddt_engine_set_logprobs;
     * checked there) */
    void (*set_logprobs)(void *impl, ddt_token_logprobs *out, int32_t capacity, int32_t n_top);
    /* NULL: no grammar-constrained decoding (ddt_engine_set_constraint; c checked there, NULL = off) */
    ddt_status (*set_constraint)(void *impl, const ddt_json_constraint *c, ddt_error *err);
    /* NULL: no logit rules (ddt_engine_set_logit_rules; r NULL = off, values checked by the backend) */
    ddt_status (*set_logit_rules)(void *impl, const ddt_logit_rules *r, ddt_error *err);
    /* NULL: the setting means nothing here (no logit rules); start 0: none (engine.h
     * ddt_engine_set_answer_start) */
    void (*set_answer_start)(void *impl, int32_t start);
    /* NULL: no scoring (ddt_engine_score; arguments checked there) */
    ddt_status (*score)(void *impl, const int32_t *ids, int32_t n, int32_t n_top, ddt_token_logprobs *out,
                        ddt_error *err);
    /* NULL: no calibration data (ddt_engine_calibration_data; arguments checked there) */
    ddt_status (*calibration_data)(void *impl, const int32_t *prompt, int32_t n_prompt, int32_t max_new,
                                   struct ddt_cal_stats *stats, int32_t *n_out, ddt_error *err);
    /* the cost model of the auto budget in use; NULL (the entry or its result): none to report */
    const ddt_cost_model *(*cost)(const void *impl);
    /* arguments checked by engine.c (prompt ids in the vocabulary and shorter than
     * the context, stop list, max_new >= 0); fills stats, stop_reason included
     * (ddt_emitter_finish_stats) */
    ddt_status (*generate)(void *impl, const int32_t *prompt, int32_t n_prompt, int32_t max_new, const int32_t *stop,
                           int32_t n_stop, int32_t *out, int32_t *n_out, ddt_emit_fn emit_fn, void *emit_ctx,
                           ddt_gen_stats *stats, ddt_error *err);
} ddt_engine_backend_ops;

extern const ddt_engine_backend_ops ddt_engine_cpu_backend;
#ifdef DDT_HAVE_CUDA
extern const ddt_engine_backend_ops ddt_engine_cuda_backend;
extern const ddt_engine_backend_ops ddt_engine_multi_backend;
#endif

#endif
