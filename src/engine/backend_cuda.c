/*
 * backend_cuda.c — the backend tables (backend.h) of the CUDA engines: one GPU
 * (engine_cuda.h) and several over NCCL (engine_multi_cuda.h).  Both take the
 * same calls on their own engine type (named as their functions' prefix); the
 * adapters are written once, below.
 * Both take logit rules and the JSON constraint (with the walk on the host); one
 * GPU also switches mode and budget within what create allocated, several GPUs
 * run the mode they were created with.  The one-GPU engine reports the
 * auto budget's cost model it measured (ddt_engine_cost, the stats' cost_model),
 * so that it can be set beside measured round times.
 */
#include "engine/backend.h"
#include "engine/engine_cuda.h"
#include "engine/engine_multi_cuda.h"

/* SCORE, LOGPROBS, CONSTRAINT, RULES, ANSWER, SPECULATION: the engine's
 * ddt_engine_score / set_logprobs / set_constraint / set_logit_rules /
 * set_answer_start / set_speculation, or NULL (the multi-GPU engine does not switch
 * modes: its ranks' graphs are captured for the mode they were created in) */
#define CUDA_BACKEND(NAME, P, SCORE, LOGPROBS, CONSTRAINT, RULES, ANSWER, SPECULATION)                                                                    \
    static ddt_status NAME##_create(const char *model_dir, const ddt_engine_options *opts,                        \
                                    const ddt_engine_setup *setup, void **out, ddt_error *err) {                  \
        P *e = NULL;                                                                                              \
        ddt_status st = P##_create(model_dir, opts, setup->max_ctx, &e, err);                                     \
        *out = e;                                                                                                 \
        return st;                                                                                                \
    }                                                                                                             \
    static void NAME##_free(void *e) { P##_free(e); }                                                             \
    static int32_t NAME##_vocab(const void *e) { return P##_vocab(e); }                                           \
    static const ddt_model_config *NAME##_model_config(const void *e) { return P##_model_config(e); }             \
    static void NAME##_set_sampling(void *e, const ddt_sampling *s) { P##_set_sampling(e, s); }                   \
    static const ddt_cost_model *NAME##_cost(const void *e) { return P##_cost(e); }                               \
    static ddt_status NAME##_generate(void *e, const int32_t *prompt, int32_t n_prompt, int32_t max_new,          \
                                      const int32_t *stop, int32_t n_stop, int32_t *out, int32_t *n_out,          \
                                      ddt_emit_fn emit_fn, void *emit_ctx, ddt_gen_stats *stats,                  \
                                      ddt_error *err) {                                                           \
        return P##_generate(e, prompt, n_prompt, max_new, stop, n_stop, out, n_out, emit_fn, emit_ctx, stats,     \
                            err);                                                                                 \
    }                                                                                                             \
    const ddt_engine_backend_ops ddt_engine_##NAME##_backend = {                                                  \
        .name = #NAME,                                                                                            \
        .create = NAME##_create,                                                                                  \
        .free = NAME##_free,                                                                                      \
        .vocab = NAME##_vocab,                                                                                    \
        .model_config = NAME##_model_config,                                                                      \
        .set_sampling = NAME##_set_sampling,                                                                      \
        .cost = NAME##_cost,                                                                                      \
        .generate = NAME##_generate,                                                                              \
        .score = SCORE,                                                                                           \
        .set_logprobs = LOGPROBS,                                                                                 \
        .set_constraint = CONSTRAINT,                                                                             \
        .set_logit_rules = RULES,                                                                                 \
        .set_answer_start = ANSWER,                                                                               \
        .set_speculation = SPECULATION,                                                                           \
    };

static ddt_status cuda_score(void *e, const int32_t *ids, int32_t n, int32_t n_top, ddt_token_logprobs *out,
                             ddt_error *err) {
    return ddt_engine_cuda_score(e, ids, n, n_top, out, err);
}

static void cuda_set_logprobs(void *e, ddt_token_logprobs *out, int32_t capacity, int32_t n_top) {
    ddt_engine_cuda_set_logprobs(e, out, capacity, n_top);
}

static ddt_status cuda_set_constraint(void *e, const ddt_json_constraint *c, ddt_error *err) {
    return ddt_engine_cuda_set_constraint(e, c, err);
}

static ddt_status cuda_set_logit_rules(void *e, const ddt_logit_rules *r, ddt_error *err) {
    return ddt_engine_cuda_set_logit_rules(e, r, err);
}

static void cuda_set_answer_start(void *e, int32_t start) { ddt_engine_cuda_set_answer_start(e, start); }

static ddt_status cuda_set_speculation(void *e, ddt_mode mode, int32_t budget, bool budget_auto, ddt_error *err) {
    return ddt_engine_cuda_set_speculation(e, mode, budget, budget_auto, err);
}

CUDA_BACKEND(cuda, ddt_engine_cuda, cuda_score, cuda_set_logprobs, cuda_set_constraint, cuda_set_logit_rules,
             cuda_set_answer_start, cuda_set_speculation)
static ddt_status multi_set_constraint(void *m, const ddt_json_constraint *c, ddt_error *err) {
    return ddt_engine_multi_set_constraint(m, c, err);
}

static ddt_status multi_set_logit_rules(void *m, const ddt_logit_rules *r, ddt_error *err) {
    return ddt_engine_multi_set_logit_rules(m, r, err);
}

static void multi_set_answer_start(void *m, int32_t start) { ddt_engine_multi_set_answer_start(m, start); }

static ddt_status multi_score(void *m, const int32_t *ids, int32_t n, int32_t n_top, ddt_token_logprobs *out,
                              ddt_error *err) {
    return ddt_engine_multi_score(m, ids, n, n_top, out, err);
}

static void multi_set_logprobs(void *m, ddt_token_logprobs *out, int32_t capacity, int32_t n_top) {
    ddt_engine_multi_set_logprobs(m, out, capacity, n_top);
}

CUDA_BACKEND(multi, ddt_engine_multi, multi_score, multi_set_logprobs, multi_set_constraint, multi_set_logit_rules,
             multi_set_answer_start, NULL)
