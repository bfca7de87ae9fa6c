/*
 * engine.c — the engine's facade (engine.h): the options, the context length
 * and the drafter's config are checked and resolved here, every generate call's
 * arguments are validated here, and the work is dispatched to one backend
 * through its table (backend.h): the CPU loop (engine_cpu.c), one GPU
 * (engine_cuda.c) or several (engine_multi_cuda.c).
 */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

#include "core/calibration.h"
#include "core/error.h"
#include "engine/backend.h"
#include "engine/round.h"
#ifdef DDT_HAVE_CUDA
#include "engine/engine_cuda.h"
#endif
#include "model/drafter.h"

#define DEFAULT_MAX_CTX 8192   /* when neither the caller nor a small model bounds it */

struct ddt_engine {
    ddt_engine_options opts;           /* as later generations run: mode, budget, auto, sampling */
    const ddt_engine_backend_ops *be;  /* the backend's table */
    void *impl;                        /* its engine */
    int32_t vocab, max_ctx;
};

bool ddt_mode_parse(const char *s, ddt_mode *out) {
    if (!s) return false;
    if (!strcmp(s, "ar")) *out = DDT_MODE_AR;
    else if (!strcmp(s, "chain") || !strcmp(s, "dflash")) *out = DDT_MODE_CHAIN;
    else if (!strcmp(s, "tree") || !strcmp(s, "ddtree")) *out = DDT_MODE_TREE;
    else return false;
    return true;
}

bool ddt_backend_parse(const char *s, ddt_backend *out) {
    if (!s) return false;
    if (!strcmp(s, "cpu")) *out = DDT_BACKEND_CPU;
    else if (!strcmp(s, "cuda") || !strcmp(s, "gpu")) *out = DDT_BACKEND_CUDA;
    else if (!strcmp(s, "auto")) *out = DDT_BACKEND_AUTO;
    else return false;
    return true;
}

bool ddt_backend_cuda_built(void) {
#ifdef DDT_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

const char *ddt_backend_name(ddt_backend b) {
    return b == DDT_BACKEND_CPU ? "cpu" : b == DDT_BACKEND_CUDA ? "cuda" : b == DDT_BACKEND_AUTO ? "auto" : "?";
}

ddt_backend ddt_engine_backend(const ddt_engine_options *o) {
    if (o->backend != DDT_BACKEND_AUTO) return o->backend;
#ifdef DDT_HAVE_CUDA
    return ddt_engine_cuda_available() ? DDT_BACKEND_CUDA : DDT_BACKEND_CPU;
#else
    return DDT_BACKEND_CPU;
#endif
}

const char *ddt_stop_reason_name(ddt_stop_reason r) {
    switch (r) {
    case DDT_STOP_NONE: return "none";
    case DDT_STOP_MAX_TOKENS: return "max tokens";
    case DDT_STOP_TOKEN: return "stop token";
    case DDT_STOP_CONTEXT: return "context full";
    case DDT_STOP_CANCELLED: return "cancelled";
    }
    return "?";
}

const char *ddt_mode_name(ddt_mode m) {
    switch (m) {
    case DDT_MODE_AR: return "ar";
    case DDT_MODE_CHAIN: return "chain";
    case DDT_MODE_TREE: return "tree";
    }
    return "?";
}


/* ------------------------------------------------------------------ create */

static ddt_status check_options(const ddt_engine_options *o, ddt_error *err) {
    if (o->mode != DDT_MODE_AR && o->mode != DDT_MODE_CHAIN && o->mode != DDT_MODE_TREE)
        return ddt_fail(err, DDT_ERR_INVALID, "unknown decoding mode %d", (int)o->mode);
    if (o->backend != DDT_BACKEND_CPU && o->backend != DDT_BACKEND_CUDA && o->backend != DDT_BACKEND_AUTO)
        return ddt_fail(err, DDT_ERR_INVALID, "unknown backend %d", (int)o->backend);
    if (o->backend == DDT_BACKEND_CUDA && !ddt_backend_cuda_built())
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "--backend cuda: this build has no CUDA backend (nvcc was not found when it was configured)");
    if (o->fast_attention && ddt_engine_backend(o) != DDT_BACKEND_CUDA)
        return ddt_fail(err, DDT_ERR_INVALID, "--fast-attention is a CUDA backend option (add --backend cuda)");
    if (o->tensor_cores && ddt_engine_backend(o) != DDT_BACKEND_CUDA)
        return ddt_fail(err, DDT_ERR_INVALID, "--tensor-cores is a CUDA backend option (add --backend cuda)");
    if (o->cuda_no_pdl && ddt_engine_backend(o) != DDT_BACKEND_CUDA)
        return ddt_fail(err, DDT_ERR_INVALID, "--no-pdl is a CUDA backend option (add --backend cuda)");
    if (o->cuda_pdl_edges < DDT_PDL_EDGES_DEFAULT || o->cuda_pdl_edges > DDT_PDL_EDGES_PRODUCTS)
        return ddt_fail(err, DDT_ERR_INVALID, "pdl edges: %d is none of default (0), all (1), products (2)",
                        (int)o->cuda_pdl_edges);
    if (o->cuda_pdl_edges != DDT_PDL_EDGES_DEFAULT && ddt_engine_backend(o) != DDT_BACKEND_CUDA)
        return ddt_fail(err, DDT_ERR_INVALID, "--pdl-edges is a CUDA backend option (add --backend cuda)");
    if (o->cuda_no_phase_times && ddt_engine_backend(o) != DDT_BACKEND_CUDA)
        return ddt_fail(err, DDT_ERR_INVALID, "--no-phase-times is a CUDA backend option (add --backend cuda)");
    if (o->cuda_host_sampler && ddt_engine_backend(o) != DDT_BACKEND_CUDA)
        return ddt_fail(err, DDT_ERR_INVALID, "--host-sampler is a CUDA backend option (add --backend cuda)");
    if (o->gpus < 0 || o->gpus > DDT_ENGINE_MAX_GPUS)
        return ddt_fail(err, DDT_ERR_RANGE, "--gpus %d: the number of GPUs must be 1..%d", o->gpus,
                        DDT_ENGINE_MAX_GPUS);
    if ((o->gpus > 1 || o->nccl_always) && ddt_engine_backend(o) != DDT_BACKEND_CUDA)
        return ddt_fail(err, DDT_ERR_INVALID, "--gpus %d needs the CUDA backend (add --backend cuda); the %s backend "
                        "runs on one CPU", o->gpus, ddt_backend_name(ddt_engine_backend(o)));
    if (o->mode != DDT_MODE_AR && !o->draft_fn && !o->draft_dir)
        return ddt_fail(err, DDT_ERR_INVALID, "mode %s needs a drafter (--draft DIR)",
                        ddt_mode_name(o->mode));
    if (o->draft_fn && (o->draft_depth < 1 || o->draft_depth > DDT_MAX_DEPTH))
        return ddt_fail(err, DDT_ERR_RANGE, "custom drafter depth %d outside 1..%d",
                        o->draft_depth, DDT_MAX_DEPTH);
    if (o->budget < 0 || o->budget > DDT_MAX_BUDGET)
        return ddt_fail(err, DDT_ERR_RANGE, "budget %d outside 0..%d", o->budget, DDT_MAX_BUDGET);
    if (o->mode == DDT_MODE_TREE && o->budget < 1)
        return ddt_fail(err, DDT_ERR_RANGE, "tree mode needs a budget of at least 1 node");
    if (o->reserve_budget < 0 || o->reserve_budget > DDT_MAX_BUDGET)
        return ddt_fail(err, DDT_ERR_RANGE, "reserved budget %d outside 0..%d", o->reserve_budget, DDT_MAX_BUDGET);
    if (o->draft_calibration) {
        ddt_status st = ddt_cal_check(o->draft_calibration, err);
        if (st) return st;
    }
    if (o->cost) {
        ddt_status st = ddt_cost_check(o->cost, err);
        if (st) return st;
        if (o->cost->n_nodes > DDT_ENGINE_COST_POINTS || o->cost->n_contexts != 1)
            return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                            "engine cost models hold one context row of at most %d points",
                            DDT_ENGINE_COST_POINTS);
    }
    return ddt_sampling_check(&o->sampling, err);
}

void ddt_engine_free(ddt_engine *e) {
    if (!e) return;
    if (e->impl) e->be->free(e->impl);
    free(e);
}

/* The backend's table for checked options. */
static const ddt_engine_backend_ops *backend_for(const ddt_engine_options *o) {
#ifdef DDT_HAVE_CUDA
    if (ddt_engine_backend(o) == DDT_BACKEND_CUDA)
        return o->gpus > 1 || o->nccl_always ? &ddt_engine_multi_backend : &ddt_engine_cuda_backend;
#endif
    (void)o;
    return &ddt_engine_cpu_backend;
}

ddt_status ddt_engine_create(const char *model_dir, const ddt_engine_options *opts,
                             ddt_engine **out, ddt_error *err) {
    if (!model_dir || !opts || !out)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_engine_create: NULL argument");
    *out = NULL;
    ddt_status st = check_options(opts, err);
    if (st) return st;
    ddt_engine *e = calloc(1, sizeof *e);
    if (!e) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory creating the engine");
    e->opts = *opts;
    e->opts.cost = NULL;
    e->opts.draft_calibration = NULL; /* the backend keeps its copy */
    e->opts.backend = ddt_engine_backend(opts);
    e->be = backend_for(opts);

    /* the drafter's config names the target layers whose features it needs */
    ddt_drafter_config dcfg;
    const bool dflash = ddt_engine_drafts(opts) && !opts->draft_fn;
    if (dflash && (st = ddt_drafter_config_load(opts->draft_dir, &dcfg, err))) goto fail;
    ddt_model_config mcfg;
    st = ddt_config_load(model_dir, &mcfg, err);
    if (st) goto fail;
    int32_t model_ctx = mcfg.max_position_embeddings;
    ddt_config_free(&mcfg);
    e->max_ctx = opts->max_ctx > 0 ? opts->max_ctx
                                   : (model_ctx > 0 && model_ctx < DEFAULT_MAX_CTX ? model_ctx : DEFAULT_MAX_CTX);
    if (model_ctx > 0 && e->max_ctx > model_ctx) {
        st = ddt_fail(err, DDT_ERR_RANGE, "context %d is longer than the model's maximum %d",
                      e->max_ctx, model_ctx);
        goto fail;
    }
    const ddt_engine_setup setup = {e->max_ctx, dflash ? &dcfg : NULL};
    st = e->be->create(model_dir, opts, &setup, &e->impl, err);
    if (st) goto fail;
    e->vocab = e->be->vocab(e->impl);
    *out = e;
    return DDT_OK;
fail:
    ddt_engine_free(e);
    return st;
}

int32_t ddt_engine_vocab(const ddt_engine *e) { return e->vocab; }
int32_t ddt_engine_max_ctx(const ddt_engine *e) { return e->max_ctx; }
const ddt_model_config *ddt_engine_model_config(const ddt_engine *e) { return e->be->model_config(e->impl); }

ddt_status ddt_engine_set_sampling(ddt_engine *e, const ddt_sampling *s, ddt_error *err) {
    if (!e) return ddt_fail(err, DDT_ERR_INVALID, "ddt_engine_set_sampling: engine is NULL");
    ddt_status st = ddt_sampling_check(s, err);
    if (st) return st;
    e->opts.sampling = *s;
    e->be->set_sampling(e->impl, s);
    return DDT_OK;
}

ddt_status ddt_engine_set_logprobs(ddt_engine *e, ddt_token_logprobs *out, int32_t capacity, int32_t n_top,
                                   ddt_error *err) {
    if (!e) return ddt_fail(err, DDT_ERR_INVALID, "ddt_engine_set_logprobs: engine is NULL");
    if (out && (capacity < 0 || n_top < 0 || n_top > DDT_MAX_TOP_LOGPROBS))
        return ddt_fail(err, DDT_ERR_RANGE, "logprobs: %d alternatives (0..%d) for %d tokens", n_top,
                        DDT_MAX_TOP_LOGPROBS, capacity);
    if (!e->be->set_logprobs) {
        if (!out) return DDT_OK;
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "log-probabilities need the CPU backend; the %s engine keeps "
                        "its logits on the device", e->be->name);
    }
    e->be->set_logprobs(e->impl, out, out ? capacity : 0, out ? n_top : 0);
    return DDT_OK;
}

ddt_status ddt_engine_set_constraint(ddt_engine *e, const ddt_json_constraint *c, ddt_error *err) {
    if (!e) return ddt_fail(err, DDT_ERR_INVALID, "ddt_engine_set_constraint: engine is NULL");
    if (c && !c->vocab) c = NULL;
    if (!e->be->set_constraint) {
        if (!c) return DDT_OK;
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "this engine (%s) takes no JSON constraint", e->be->name);
    }
    if (c && ddt_json_vocab_size(c->vocab) != e->be->vocab(e->impl))
        return ddt_fail(err, DDT_ERR_INVALID, "JSON constraint built for a vocabulary of %d ids, the model has %d",
                        ddt_json_vocab_size(c->vocab), e->be->vocab(e->impl));
    return e->be->set_constraint(e->impl, c, err);
}

ddt_status ddt_engine_set_logit_rules(ddt_engine *e, const ddt_logit_rules *r, ddt_error *err) {
    if (!e) return ddt_fail(err, DDT_ERR_INVALID, "ddt_engine_set_logit_rules: engine is NULL");
    if (r && r->n_bias == 0 && r->presence == 0.0f && r->frequency == 0.0f &&
        (r->repetition == 0.0f || r->repetition == 1.0f))
        r = NULL;
    if (!e->be->set_logit_rules) {
        if (!r) return DDT_OK;
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "this engine (%s) takes no logit_bias or presence / frequency / "
                        "repetition penalties", e->be->name);
    }
    return e->be->set_logit_rules(e->impl, r, err);
}

void ddt_engine_set_answer_start(ddt_engine *e, int32_t start) {
    if (e && e->be->set_answer_start) e->be->set_answer_start(e->impl, start < 1 ? 0 : start);
}

const ddt_cost_model *ddt_engine_cost(const ddt_engine *e) { return e->be->cost ? e->be->cost(e->impl) : NULL; }

void ddt_engine_speculation(const ddt_engine *e, ddt_mode *mode, int32_t *budget, bool *budget_auto) {
    if (mode) *mode = e->opts.mode;
    if (budget) *budget = e->opts.budget;
    if (budget_auto) *budget_auto = e->opts.budget_auto;
}

ddt_status ddt_engine_set_speculation(ddt_engine *e, ddt_mode mode, int32_t budget, bool budget_auto,
                                      ddt_error *err) {
    if (!e) return ddt_fail(err, DDT_ERR_INVALID, "ddt_engine_set_speculation: engine is NULL");
    if (mode != DDT_MODE_AR && mode != DDT_MODE_CHAIN && mode != DDT_MODE_TREE)
        return ddt_fail(err, DDT_ERR_INVALID, "unknown decoding mode %d", (int)mode);
    if (mode != DDT_MODE_TREE) budget_auto = false;
    if (mode == e->opts.mode &&
        (mode != DDT_MODE_TREE || (budget == e->opts.budget && budget_auto == e->opts.budget_auto)))
        return DDT_OK;
    if (!e->be->set_speculation)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "switching the mode or budget needs the CPU backend or one "
                        "GPU; the %s engine runs the %s mode it was started with", e->be->name,
                        ddt_mode_name(e->opts.mode));
    ddt_status st = e->be->set_speculation(e->impl, mode, budget, budget_auto, err);
    if (st) return st;
    e->opts.mode = mode;
    if (mode == DDT_MODE_TREE) e->opts.budget = budget;
    e->opts.budget_auto = budget_auto;
    return DDT_OK;
}

/* Every id of a prompt or text within the vocabulary; what names the sequence. */
static ddt_status check_ids(const ddt_engine *e, const int32_t *ids, int32_t n, const char *what, ddt_error *err) {
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= e->vocab)
            return ddt_fail(err, DDT_ERR_INVALID, "%s token %d (position %d) outside the vocabulary [0, %d)", what,
                            ids[i], i, e->vocab);
    return DDT_OK;
}

ddt_status ddt_engine_score(ddt_engine *e, const int32_t *ids, int32_t n, int32_t n_top, ddt_token_logprobs *out,
                            ddt_error *err) {
    if (!e || !ids || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_engine_score: NULL argument");
    if (n < 2) return ddt_fail(err, DDT_ERR_INVALID, "scoring needs at least 2 tokens, %d given", n);
    if (n > e->max_ctx)
        return ddt_fail(err, DDT_ERR_RANGE, "%d tokens to score, more than the context of %d", n, e->max_ctx);
    if (n_top < 0 || n_top > DDT_MAX_TOP_LOGPROBS)
        return ddt_fail(err, DDT_ERR_RANGE, "%d alternatives asked, 0..%d allowed", n_top, DDT_MAX_TOP_LOGPROBS);
    ddt_status st = check_ids(e, ids, n, "scored", err);
    if (st) return st;
    if (!e->be->score)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "scoring needs the CPU backend; the %s engine keeps its logits on "
                        "the device", e->be->name);
    return e->be->score(e->impl, ids, n, n_top, out, err);
}

ddt_status ddt_engine_calibration_data(ddt_engine *e, const int32_t *prompt, int32_t n_prompt, int32_t max_new,
                                       struct ddt_cal_stats *stats, int32_t *n_out, ddt_error *err) {
    if (!e || !prompt || !stats || !n_out)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_engine_calibration_data: NULL argument");
    *n_out = 0;
    if (n_prompt < 1) return ddt_fail(err, DDT_ERR_INVALID, "the prompt is empty");
    if (n_prompt >= e->max_ctx)
        return ddt_fail(err, DDT_ERR_RANGE, "prompt of %d tokens does not fit the context of %d", n_prompt,
                        e->max_ctx);
    if (max_new < 1) return ddt_fail(err, DDT_ERR_RANGE, "calibration data needs at least 1 token to decode");
    ddt_status st = check_ids(e, prompt, n_prompt, "prompt", err);
    if (st) return st;
    if (!e->be->calibration_data)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "calibration data needs the CPU backend (the %s engine drafts on "
                        "the device)", e->be->name);
    return e->be->calibration_data(e->impl, prompt, n_prompt, max_new, stats, n_out, err);
}

/* ------------------------------------------------------------------ generate */

ddt_status ddt_engine_generate(ddt_engine *e, const int32_t *prompt, int32_t n_prompt,
                               int32_t max_new, const int32_t *stop, int32_t n_stop,
                               int32_t *out, int32_t *n_out, ddt_emit_fn emit_fn, void *emit_ctx,
                               ddt_gen_stats *stats, ddt_error *err) {
    if (!e || !prompt || !n_out || (max_new > 0 && !out))
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_engine_generate: NULL argument");
    *n_out = 0;
    if (n_prompt < 1) return ddt_fail(err, DDT_ERR_INVALID, "the prompt is empty");
    if (max_new < 0) return ddt_fail(err, DDT_ERR_RANGE, "max new tokens %d is negative", max_new);
    if (n_stop < 0 || (n_stop > 0 && !stop)) return ddt_fail(err, DDT_ERR_INVALID, "bad stop-token list");
    ddt_status st = check_ids(e, prompt, n_prompt, "prompt", err);
    if (st) return st;
    if (n_prompt >= e->max_ctx)
        return ddt_fail(err, DDT_ERR_RANGE,
                        "the prompt of %d tokens is longer than the context of %d tokens (which must "
                        "also hold one generated token)", n_prompt, e->max_ctx);
    return e->be->generate(e->impl, prompt, n_prompt, max_new, stop, n_stop, out, n_out, emit_fn, emit_ctx, stats,
                           err);
}
