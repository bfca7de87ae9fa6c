/*
 * engine.c — the ar / chain / tree decoding loops on the CPU backend (see
 * engine.h for the round).  Everything a round touches is allocated in
 * ddt_engine_create; ddt_engine_generate allocates nothing.
 */
#include "engine/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/zsort.h"
#include "engine/emitter.h"
#include "engine/round.h"
#ifdef DDT_HAVE_CUDA
#include "engine/engine_cuda.h"
#include "engine/engine_multi_cuda.h"
#endif
#include "model/drafter.h"
#include "model/target.h"

#define DEFAULT_MAX_CTX 8192   /* when neither the caller nor a small model bounds it */

struct ddt_engine {
    ddt_engine_options opts;
#ifdef DDT_HAVE_CUDA
    ddt_engine_cuda *cuda; /* the CUDA backend's engine, when options.backend is cuda */
    ddt_engine_multi *multi; /* ... on several GPUs (options.gpus > 1 or nccl_always) */
#endif
    ddt_target *target;
    ddt_drafter *drafter;
    int32_t vocab, max_ctx, depth, kmax, max_nodes, n_capture;
    float *logits;        /* [max_nodes][vocab] verify logits (prefill: row 0) */
    float *draft_logits;  /* [depth][vocab] */
    float *logq;          /* [depth][kmax] */
    int32_t *table_tok;   /* [depth][kmax] */
    ddt_zid *pairs;       /* [vocab] top-K scratch */
    int32_t *rows;        /* [DDT_ENGINE_PREFILL_CHUNK] 0..DDT_ENGINE_PREFILL_CHUNK-1 */
    ddt_tree tree;
    ddt_builder *builder;
    ddt_sampler *sampler;
    bool have_cost;
    ddt_cost_model cost;
    float cost_nodes[DDT_ENGINE_COST_POINTS], cost_verify[DDT_ENGINE_COST_POINTS];
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

const char *ddt_mode_name(ddt_mode m) {
    switch (m) {
    case DDT_MODE_AR: return "ar";
    case DDT_MODE_CHAIN: return "chain";
    case DDT_MODE_TREE: return "tree";
    }
    return "?";
}


/* ------------------------------------------------------------------ top-K */

/* The top k of z[0..v) by (z desc, id asc) as log-probabilities z - logsumexp(z). */
static ddt_status topk_logsoftmax(const float *z, int32_t v, int32_t k, ddt_zid *scratch, float *logq,
                                  int32_t *tok, int32_t row, ddt_error *err) {
    float m = -INFINITY;
    for (int32_t i = 0; i < v; i++) {
        if (isnan(z[i])) return ddt_fail(err, DDT_ERR_INVALID, "drafter logit [%d][%d] is NaN", row, i);
        if (z[i] > m) m = z[i];
    }
    double s = 0.0;
    for (int32_t i = 0; i < v; i++) s += exp((double)z[i] - (double)m);
    float lse = (float)((double)m + log(s));
    ddt_zid_top_k(z, v, k, scratch);
    for (int32_t i = 0; i < k; i++) {
        logq[i] = scratch[i].z - lse;
        tok[i] = scratch[i].id;
    }
    return DDT_OK;
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
#ifdef DDT_HAVE_CUDA
    ddt_engine_cuda_free(e->cuda);
    ddt_engine_multi_free(e->multi);
#endif
    ddt_drafter_free(e->drafter);
    ddt_target_free(e->target);
    free(e->logits);
    free(e->draft_logits);
    free(e->logq);
    free(e->table_tok);
    free(e->pairs);
    free(e->rows);
    ddt_tree_free(&e->tree);
    ddt_builder_destroy(e->builder);
    ddt_sampler_destroy(e->sampler);
    free(e);
}

/* A star tree of n nodes (root + n-1 children) for timing verify. */
static void make_star(ddt_tree *t, int32_t n, int32_t vocab) {
    t->n_nodes = n;
    memset(t->vis, 0, (size_t)n * (size_t)t->vis_words * sizeof(uint64_t));
    for (int32_t i = 0; i < n; i++) {
        t->token[i] = i % vocab;
        t->parent[i] = i ? 0 : -1;
        t->depth[i] = i ? 1 : 0;
        uint64_t *row = t->vis + (size_t)i * (size_t)t->vis_words;
        row[0] |= 1u;
        row[i >> 6] |= (uint64_t)1 << (i & 63);
    }
}

/* Time one verify of n nodes (a star tree) after the committed token. */
static ddt_status time_verify(void *ctx, int32_t n, double *seconds, ddt_error *err) {
    ddt_engine *e = ctx;
    make_star(&e->tree, n, e->vocab);
    double t0 = ddt_engine_now();
    ddt_status st = ddt_target_verify(e->target, e->tree.token, e->tree.depth, e->tree.vis, e->tree.vis_words, n,
                                      NULL, err);
    *seconds = ddt_engine_now() - t0;
    return st;
}

static ddt_status time_draft(void *ctx, int32_t n, double *seconds, ddt_error *err) {
    ddt_engine *e = ctx;
    (void)n;
    double t0 = ddt_engine_now();
    ddt_status st = ddt_drafter_draft(e->drafter, 0, e->draft_logits, err);
    *seconds = ddt_engine_now() - t0;
    return st;
}

/* Measure C_verify(n) on this machine (round.h): verify of 1 + n nodes after one
 * committed token, and the drafter's draft. */
static ddt_status measure_cost(ddt_engine *e, ddt_error *err) {
    int32_t zero = 0;
    ddt_status st = ddt_target_prefill(e->target, &zero, 1, NULL, false, err);
    if (st) return st;
    st = ddt_engine_measure_cost(e->opts.budget, time_verify, e->drafter ? time_draft : NULL, e, e->cost_nodes,
                                 e->cost_verify, &e->cost, err);
    if (st) return st;
    st = ddt_target_rollback(e->target, 0, err);
    if (st) return st;
    e->have_cost = true;
    return DDT_OK;
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
    e->opts.backend = ddt_engine_backend(opts);

    /* the drafter's config names the target layers whose features it needs */
    ddt_drafter_config dcfg;
    /* a reserve keeps the drafter loaded in ar mode so later generations can switch */
    const bool spec = opts->mode != DDT_MODE_AR || (opts->reserve_budget > 0 && (opts->draft_dir || opts->draft_fn));
    bool dflash = spec && !opts->draft_fn;
    if (dflash) {
        st = ddt_drafter_config_load(opts->draft_dir, &dcfg, err);
        if (st) goto fail;
        e->depth = dcfg.block_size - 1;
        e->n_capture = dcfg.n_target_layers;
    } else {
        e->depth = spec ? opts->draft_depth : 0;
    }
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
#ifdef DDT_HAVE_CUDA
    if (e->opts.backend == DDT_BACKEND_CUDA) {
        if (opts->gpus > 1 || opts->nccl_always) {
            st = ddt_engine_multi_create(model_dir, opts, e->max_ctx, &e->multi, err);
            if (st) goto fail;
            e->vocab = ddt_engine_multi_vocab(e->multi);
            *out = e;
            return DDT_OK;
        }
        st = ddt_engine_cuda_create(model_dir, opts, e->max_ctx, &e->cuda, err);
        if (st) goto fail;
        e->vocab = ddt_engine_cuda_vocab(e->cuda);
        *out = e;
        return DDT_OK;
    }
#endif
    e->max_nodes = opts->mode == DDT_MODE_TREE ? opts->budget + 1
                 : opts->mode == DDT_MODE_CHAIN ? e->depth + 1 : 1;
    if (spec && opts->reserve_budget > 0) {
        if (e->max_nodes < opts->reserve_budget + 1) e->max_nodes = opts->reserve_budget + 1;
        if (e->max_nodes < e->depth + 1) e->max_nodes = e->depth + 1;
    }
    ddt_target_options topt = {e->max_ctx, e->max_nodes > DDT_ENGINE_PREFILL_CHUNK ? e->max_nodes : DDT_ENGINE_PREFILL_CHUNK,
                               opts->n_threads, dflash ? dcfg.target_layer_ids : NULL,
                               dflash ? dcfg.n_target_layers : 0};
    st = ddt_target_load(model_dir, &topt, &e->target, err);
    if (st) goto fail;
    e->vocab = ddt_target_vocab(e->target);
    if (dflash) {
        /* the drafter borrows the target's embedding, LM head and threads: it runs
         * between target forwards, never beside them */
        const ddt_model_config *tc = ddt_target_config(e->target);
        ddt_drafter_target dt = {tc->hidden_size, tc->num_hidden_layers, e->vocab,
                                 ddt_target_embed(e->target), ddt_target_lm_head(e->target)};
        ddt_drafter_options dopt = {e->max_ctx, opts->n_threads, ddt_target_pool(e->target)};
        st = ddt_drafter_load(opts->draft_dir, &dt, &dopt, &e->drafter, err);
        if (st) goto fail;
    }
    /* the round's k = min(budget, kmax) whatever the reserve, so a switched engine builds the trees a fresh one would */
    int32_t kcap = opts->mode == DDT_MODE_TREE ? opts->budget : 1;
    if (spec && opts->reserve_budget > kcap) kcap = opts->reserve_budget;
    e->kmax = ddt_engine_topk_cap(kcap, e->vocab);
    size_t depth_rows = e->depth > 0 ? (size_t)e->depth : 1;
    e->logits = ddt_malloc_array((size_t)e->max_nodes * (size_t)e->vocab, sizeof(float));
    e->draft_logits = ddt_malloc_array(depth_rows * (size_t)e->vocab, sizeof(float));
    e->logq = ddt_malloc_array(depth_rows * (size_t)e->kmax, sizeof(float));
    e->table_tok = ddt_malloc_array(depth_rows * (size_t)e->kmax, sizeof(int32_t));
    e->pairs = ddt_malloc_array((size_t)e->vocab, sizeof(ddt_zid));
    e->rows = ddt_malloc_array(DDT_ENGINE_PREFILL_CHUNK, sizeof(int32_t));
    if (!e->logits || !e->draft_logits || !e->logq || !e->table_tok || !e->pairs || !e->rows) {
        st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the engine's buffers (vocab %d, %d nodes)",
                      e->vocab, e->max_nodes);
        goto fail;
    }
    for (int32_t i = 0; i < DDT_ENGINE_PREFILL_CHUNK; i++) e->rows[i] = i;
    st = ddt_tree_alloc(e->max_nodes > DDT_ENGINE_PREFILL_CHUNK ? e->max_nodes : DDT_ENGINE_PREFILL_CHUNK, &e->tree, err);
    if (st) goto fail;
    st = ddt_builder_create(e->max_nodes - 1, &e->builder, err);
    if (st) goto fail;
    st = ddt_sampler_create(e->vocab, &e->sampler, err);
    if (st) goto fail;
    if (opts->mode == DDT_MODE_TREE && opts->budget_auto) {
        if (opts->cost) {
            memcpy(e->cost_nodes, opts->cost->nodes, (size_t)opts->cost->n_nodes * sizeof(float));
            memcpy(e->cost_verify, opts->cost->verify, (size_t)opts->cost->n_nodes * sizeof(float));
            e->cost = *opts->cost;
            e->cost.nodes = e->cost_nodes;
            e->cost.verify = e->cost_verify;
            e->have_cost = true;
        } else {
            st = measure_cost(e, err);
            if (st) goto fail;
        }
    }
    *out = e;
    return DDT_OK;
fail:
    ddt_engine_free(e);
    return st;
}

int32_t ddt_engine_vocab(const ddt_engine *e) { return e->vocab; }

ddt_status ddt_engine_set_sampling(ddt_engine *e, const ddt_sampling *s, ddt_error *err) {
    if (!e) return ddt_fail(err, DDT_ERR_INVALID, "ddt_engine_set_sampling: engine is NULL");
    ddt_status st = ddt_sampling_check(s, err);
    if (st) return st;
    e->opts.sampling = *s;
#ifdef DDT_HAVE_CUDA
    if (e->cuda) ddt_engine_cuda_set_sampling(e->cuda, s);
    if (e->multi) ddt_engine_multi_set_sampling(e->multi, s);
#endif
    return DDT_OK;
}
int32_t ddt_engine_max_ctx(const ddt_engine *e) { return e->max_ctx; }
const ddt_model_config *ddt_engine_model_config(const ddt_engine *e) {
#ifdef DDT_HAVE_CUDA
    if (e->cuda) return ddt_engine_cuda_model_config(e->cuda);
    if (e->multi) return ddt_engine_multi_model_config(e->multi);
#endif
    return ddt_target_config(e->target);
}
const ddt_cost_model *ddt_engine_cost(const ddt_engine *e) {
    return e->have_cost && e->opts.budget_auto ? &e->cost : NULL;
}

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
#ifdef DDT_HAVE_CUDA
    if (e->cuda || e->multi)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "switching the mode or budget needs the CPU backend; the CUDA "
                        "engine runs the %s mode it was started with", ddt_mode_name(e->opts.mode));
#endif
    if (mode != DDT_MODE_AR && !e->drafter && !e->opts.draft_fn)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "mode %s needs a drafter, and this engine was started without one",
                        ddt_mode_name(mode));
    if (mode != DDT_MODE_AR && e->depth < 1)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "mode %s: the engine was created for ar only (no reserved budget)",
                        ddt_mode_name(mode));
    if (mode == DDT_MODE_CHAIN && e->depth + 1 > e->max_nodes)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "mode chain verifies %d nodes, the engine holds %d", e->depth + 1,
                        e->max_nodes);
    if (mode == DDT_MODE_TREE && (budget < 1 || budget > e->max_nodes - 1))
        return ddt_fail(err, DDT_ERR_RANGE, "budget %d outside the 1..%d nodes this engine allocated", budget,
                        e->max_nodes - 1);
    ddt_engine_options prev = e->opts;
    e->opts.mode = mode;
    if (mode == DDT_MODE_TREE) e->opts.budget = budget;
    e->opts.budget_auto = budget_auto;
    /* the cost table's points run up to the budget it was measured for */
    bool fits = e->have_cost && e->cost.n_nodes > 0 && e->cost.nodes[e->cost.n_nodes - 1] >= (float)budget;
    if (budget_auto && !fits) {
        ddt_status st = measure_cost(e, err);
        if (st) {
            e->opts = prev;
            return st;
        }
    }
    return DDT_OK;
}

/* ------------------------------------------------------------------ generate */

/* The walk's callback: the target's next token at one node of the last verify,
 * keyed (seed, round, node) so any backend draws the same sample. */
typedef struct node_sampler {
    ddt_engine *e;
    const ddt_sampling *samp;
    uint64_t round;
} node_sampler;

static ddt_status sample_node(void *ctx, int32_t node, int32_t *token, ddt_error *err) {
    const node_sampler *ns = ctx;
    ddt_engine *e = ns->e;
    return ddt_sample_token(e->sampler, e->logits + (size_t)node * (size_t)e->vocab, e->vocab, ns->samp,
                            ns->round, (uint32_t)node, token, err);
}

/* Append the drafter features of rows[0..m) of the last target forward. */
static ddt_status feed_drafter(ddt_engine *e, const int32_t *rows, int32_t m, ddt_error *err) {
    if (!e->drafter || m == 0) return DDT_OK;
    const float *layers[DDT_TARGET_MAX_CAPTURE];
    int32_t n_rows = 0;
    for (int32_t s = 0; s < e->n_capture; s++) {
        layers[s] = ddt_target_hidden(e->target, s, &n_rows);
        if (!layers[s]) return ddt_fail(err, DDT_ERR_INTERNAL, "target hidden-state capture %d missing", s);
    }
    return ddt_drafter_append_rows(e->drafter, layers, n_rows, rows, m, err);
}

/* Fill the draft table [depth][k] for the block after the committed context. */
static ddt_status draft_table(ddt_engine *e, int32_t bonus, int32_t k, ddt_error *err) {
    int32_t pos = ddt_target_len(e->target);
    if (e->opts.draft_fn)
        return e->opts.draft_fn(e->opts.draft_ctx, bonus, pos, e->depth, k, e->logq, e->table_tok, err);
    ddt_status st = ddt_drafter_draft(e->drafter, bonus, e->draft_logits, err);
    if (st) return st;
    for (int32_t d = 0; d < e->depth; d++) {
        st = topk_logsoftmax(e->draft_logits + (size_t)d * (size_t)e->vocab, e->vocab, k, e->pairs,
                             e->logq + (size_t)d * (size_t)k, e->table_tok + (size_t)d * (size_t)k, d, err);
        if (st) return st;
    }
    return DDT_OK;
}

ddt_status ddt_engine_generate(ddt_engine *e, const int32_t *prompt, int32_t n_prompt,
                               int32_t max_new, const int32_t *stop, int32_t n_stop,
                               int32_t *out, int32_t *n_out, ddt_emit_fn emit_fn, void *emit_ctx,
                               ddt_gen_stats *stats, ddt_error *err) {
    if (!e || !prompt || !n_out || (max_new > 0 && !out))
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_engine_generate: NULL argument");
    ddt_gen_stats s;
    memset(&s, 0, sizeof s);
    *n_out = 0;
    if (n_prompt < 1) return ddt_fail(err, DDT_ERR_INVALID, "the prompt is empty");
    if (max_new < 0) return ddt_fail(err, DDT_ERR_RANGE, "max new tokens %d is negative", max_new);
    if (n_stop < 0 || (n_stop > 0 && !stop)) return ddt_fail(err, DDT_ERR_INVALID, "bad stop-token list");
    for (int32_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->vocab)
            return ddt_fail(err, DDT_ERR_INVALID, "prompt token %d (position %d) outside the vocabulary [0, %d)",
                            prompt[i], i, e->vocab);
    if (n_prompt >= e->max_ctx)
        return ddt_fail(err, DDT_ERR_RANGE,
                        "the prompt of %d tokens is longer than the context of %d tokens (which must "
                        "also hold one generated token)", n_prompt, e->max_ctx);
#ifdef DDT_HAVE_CUDA
    if (e->cuda)
        return ddt_engine_cuda_generate(e->cuda, prompt, n_prompt, max_new, stop, n_stop, out, n_out, emit_fn,
                                        emit_ctx, stats, err);
    if (e->multi)
        return ddt_engine_multi_generate(e->multi, prompt, n_prompt, max_new, stop, n_stop, out, n_out, emit_fn,
                                        emit_ctx, stats, err);
#endif
    ddt_status st = ddt_target_rollback(e->target, 0, err);
    if (st) return st;
    if (e->drafter && (st = ddt_drafter_rollback(e->drafter, 0, err))) return st;

    ddt_emitter em = {out, 0, max_new, stop, n_stop, max_new == 0, emit_fn, emit_ctx};
    const ddt_sampling *samp = &e->opts.sampling;
    double t_start = ddt_engine_now();
    s.prompt_tokens = n_prompt;
    /* prompt, in chunks; the drafter gets every chunk's features */
    for (int32_t i = 0; i < n_prompt; i += DDT_ENGINE_PREFILL_CHUNK) {
        int32_t c = n_prompt - i < DDT_ENGINE_PREFILL_CHUNK ? n_prompt - i : DDT_ENGINE_PREFILL_CHUNK;
        st = ddt_target_prefill(e->target, prompt + i, c, e->logits, false, err);
        if (st) return st;
        st = feed_drafter(e, e->rows, c, err);
        if (st) return st;
    }
    int32_t bonus;
    st = ddt_sample_token(e->sampler, e->logits, e->vocab, samp, 0, 0, &bonus, err);
    if (st) return st;
    double t_decode = ddt_engine_now();
    s.t_prefill = t_decode - t_start;
    ddt_emitter_push(&em, &bonus, 1);

    for (uint64_t round = 1; !em.done; round++) {
        int32_t len = ddt_target_len(e->target);
        int32_t room = e->max_ctx - len - 1; /* nodes beyond the root that still fit */
        if (room < 0) break;                 /* context full */
        double t0 = ddt_engine_now(), t1, t2, t3, t4;
        int32_t n;
        if (e->opts.mode == DDT_MODE_AR) {
            t1 = t2 = ddt_engine_now();
            st = ddt_target_prefill(e->target, &bonus, 1, e->logits, false, err);
            if (st) return st;
            t3 = ddt_engine_now();
            st = ddt_sample_token(e->sampler, e->logits, e->vocab, samp, round, 0, &bonus, err);
            if (st) return st;
            t4 = ddt_engine_now();
            n = 1;
            s.accepted += 1;
            ddt_emitter_push(&em, &bonus, 1);
        } else {
            int32_t k, budget = ddt_engine_round_nodes(e->opts.mode, e->opts.budget, e->depth, room, e->kmax, &k);
            st = draft_table(e, bonus, k, err);
            if (st) return st;
            t1 = ddt_engine_now();
            ddt_draft_table tb = {e->depth, k, e->logq, e->table_tok};
            if (e->opts.mode == DDT_MODE_TREE) {
                const bool use_cost = e->have_cost && e->opts.budget_auto;
                if (use_cost) e->cost.context_len = (float)len;
                st = ddt_tree_build(e->builder, &tb, bonus, budget, use_cost ? &e->cost : NULL,
                                    e->vocab, &e->tree, err);
            } else {
                st = ddt_tree_build_chain(&tb, bonus, budget, e->vocab, &e->tree, err);
            }
            if (st) return st;
            t2 = ddt_engine_now();
            n = e->tree.n_nodes;
            st = ddt_target_verify(e->target, e->tree.token, e->tree.depth, e->tree.vis,
                                   e->tree.vis_words, n, e->logits, err);
            if (st) return st;
            t3 = ddt_engine_now();
            /* the target's token is drawn only at the nodes the walk visits */
            node_sampler ns = {e, samp, round};
            ddt_walk_result w;
            st = ddt_tree_walk_fn(&e->tree, sample_node, &ns, e->vocab, &w, err);
            if (st) return st;
            t4 = ddt_engine_now();
            st = ddt_target_commit(e->target, w.path, w.length, err);
            if (st) return st;
            st = feed_drafter(e, w.path, w.length, err);
            if (st) return st;
            int32_t ids[DDT_MAX_PATH];
            for (int32_t i = 1; i < w.length; i++) ids[i - 1] = e->tree.token[w.path[i]];
            ids[w.length - 1] = w.bonus;
            bonus = w.bonus;
            s.accepted += w.length;
            ddt_emitter_push(&em, ids, w.length);
        }
        double t5 = ddt_engine_now();
        s.rounds++;
        s.nodes_verified += n;
        s.t_draft += t1 - t0;
        s.t_build += t2 - t1;
        s.t_verify += t3 - t2;
        s.t_walk += t4 - t3;
        s.t_commit += t5 - t4;
    }
    double t_end = ddt_engine_now();
    ddt_emitter_finish_stats(&em, t_start, t_decode, t_end, &s);
    *n_out = em.n;
    if (stats) *stats = s;
    return DDT_OK;
}
