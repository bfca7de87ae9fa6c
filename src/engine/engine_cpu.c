/*
 * engine_cpu.c — the ar / chain / tree decoding loops on the CPU backend (see
 * engine.h for the round, backend.h for the interface engine.c calls).
 * Everything a round touches is allocated in create; generate allocates nothing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/calibration.h"
#include "core/error.h"
#include "core/lookup.h"
#include "core/topk.h"
#include "core/zsort.h"
#include "engine/backend.h"
#include "engine/choice.h"
#include "engine/emitter.h"
#include "engine/logprobs.h"
#include "engine/round.h"
#include "model/drafter.h"
#include "model/target.h"

typedef struct cpu_engine {
    ddt_engine_options opts;
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
    /* options.prefix_cache: the token of each of the target's context rows, kv_ids[0..n_kv)
       (n_kv = the target's length while it is valid, 0 after anything that lost track) */
    int32_t *kv_ids; /* [max_ctx] */
    int32_t n_kv;
    /* ddt_engine_set_logprobs: where emitted token i's values go (i < lp_cap), NULL = off */
    ddt_token_logprobs *lp_out;
    int32_t lp_cap, lp_top;
    float *score_logits; /* [DDT_ENGINE_PREFILL_CHUNK][vocab], made by the first ddt_engine_score */
    /* the target's choice under the request's logit rules and JSON constraint (choice.h);
       its state table covers the tree's capacity */
    ddt_choice ch;
    /* options.draft_calibration, copied: applied to greedy rounds' tables */
    bool have_cal;
    ddt_draft_calibration cal;
} cpu_engine;

/* ------------------------------------------------------------------ create */

static void cpu_free(void *impl) {
    cpu_engine *e = impl;
    if (!e) return;
    ddt_drafter_free(e->drafter);
    ddt_target_free(e->target);
    free(e->logits);
    free(e->draft_logits);
    free(e->logq);
    free(e->table_tok);
    free(e->pairs);
    free(e->rows);
    free(e->kv_ids);
    free(e->score_logits);
    ddt_choice_free(&e->ch);
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
    cpu_engine *e = ctx;
    make_star(&e->tree, n, e->vocab);
    double t0 = ddt_engine_now();
    ddt_status st = ddt_target_verify(e->target, e->tree.token, e->tree.depth, e->tree.vis, e->tree.vis_words, n,
                                      NULL, err);
    *seconds = ddt_engine_now() - t0;
    return st;
}

static ddt_status time_draft(void *ctx, int32_t n, double *seconds, ddt_error *err) {
    cpu_engine *e = ctx;
    (void)n;
    double t0 = ddt_engine_now();
    ddt_status st = ddt_drafter_draft(e->drafter, 0, e->draft_logits, err);
    *seconds = ddt_engine_now() - t0;
    return st;
}

/* Measure C_verify(n) on this machine (round.h): verify of 1 + n nodes after one
 * committed token, and the drafter's draft. */
static ddt_status measure_cost(cpu_engine *e, ddt_error *err) {
    e->n_kv = 0; /* the timing forwards replace the context */
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

static ddt_status cpu_create(const char *model_dir, const ddt_engine_options *opts, const ddt_engine_setup *setup,
                             void **out, ddt_error *err) {
    *out = NULL;
    ddt_status st;
    cpu_engine *e = calloc(1, sizeof *e);
    if (!e) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory creating the engine");
    e->opts = *opts;
    e->opts.cost = NULL;
    e->opts.backend = DDT_BACKEND_CPU;
    e->max_ctx = setup->max_ctx;
    /* a reserve keeps the drafter loaded in ar mode so later generations can switch */
    const bool spec = ddt_engine_drafts(opts);
    /* the drafter's config names the target layers whose features it needs */
    const ddt_drafter_config *dcfg = setup->draft;
    const bool dflash = dcfg != NULL;
    if (dflash) {
        e->depth = dcfg->block_size - 1;
        e->n_capture = dcfg->n_target_layers;
    } else {
        e->depth = spec ? opts->draft_depth : 0;
    }
    e->max_nodes = opts->mode == DDT_MODE_TREE ? opts->budget + 1
                 : opts->mode == DDT_MODE_CHAIN ? e->depth + 1 : 1;
    if (spec && opts->reserve_budget > 0) {
        if (e->max_nodes < opts->reserve_budget + 1) e->max_nodes = opts->reserve_budget + 1;
        if (e->max_nodes < e->depth + 1) e->max_nodes = e->depth + 1;
    }
    const int32_t max_tokens = e->max_nodes > DDT_ENGINE_PREFILL_CHUNK ? e->max_nodes : DDT_ENGINE_PREFILL_CHUNK;
    ddt_target_options topt = {e->max_ctx, max_tokens,
                               opts->n_threads, dflash ? dcfg->target_layer_ids : NULL,
                               dflash ? dcfg->n_target_layers : 0};
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
    /* the round's k = min(budget, kmax) whatever the reserve, so a switched engine builds
     * the trees a fresh one would */
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
    e->kv_ids = ddt_malloc_array((size_t)e->max_ctx, sizeof(int32_t));
    if (!e->logits || !e->draft_logits || !e->logq || !e->table_tok || !e->pairs || !e->rows || !e->kv_ids) {
        st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the engine's buffers (vocab %d, %d nodes)",
                      e->vocab, e->max_nodes);
        goto fail;
    }
    for (int32_t i = 0; i < DDT_ENGINE_PREFILL_CHUNK; i++) e->rows[i] = i;
    st = ddt_tree_alloc(max_tokens, &e->tree, err);
    if (st) goto fail;
    ddt_choice_init(&e->ch, e->vocab, e->tree.capacity);
    st = ddt_builder_create(e->max_nodes - 1, &e->builder, err);
    if (st) goto fail;
    st = ddt_sampler_create(e->vocab, &e->sampler, err);
    if (st) goto fail;
    if (opts->draft_calibration) {
        e->cal = *opts->draft_calibration;
        e->have_cal = true;
    }
    if (opts->mode == DDT_MODE_TREE && opts->budget_auto) {
        if (opts->cost) {
            ddt_engine_adopt_cost(opts->cost, e->cost_nodes, e->cost_verify, &e->cost);
            e->have_cost = true;
        } else {
            st = measure_cost(e, err);
            if (st) goto fail;
        }
    }
    *out = e;
    return DDT_OK;
fail:
    cpu_free(e);
    return st;
}

static int32_t cpu_vocab(const void *impl) { return ((const cpu_engine *)impl)->vocab; }

static const ddt_model_config *cpu_model_config(const void *impl) {
    return ddt_target_config(((const cpu_engine *)impl)->target);
}

static void cpu_set_sampling(void *impl, const ddt_sampling *s) { ((cpu_engine *)impl)->opts.sampling = *s; }

static void cpu_set_logprobs(void *impl, ddt_token_logprobs *out, int32_t capacity, int32_t n_top) {
    cpu_engine *e = impl;
    e->lp_out = out;
    e->lp_cap = capacity;
    e->lp_top = n_top;
}

/* The values of the token about to be emitted as output index `index`, from the
 * logits row it was chosen from. */
static void record_logprobs(const cpu_engine *e, const float *row, int32_t token, int32_t index) {
    if (e->lp_out && index < e->lp_cap) ddt_logprobs_of_row(row, e->vocab, token, e->lp_top, &e->lp_out[index]);
}

static ddt_status cpu_set_constraint(void *impl, const ddt_json_constraint *c, ddt_error *err) {
    return ddt_choice_set_constraint(&((cpu_engine *)impl)->ch, c, err);
}

static ddt_status cpu_set_logit_rules(void *impl, const ddt_logit_rules *r, ddt_error *err) {
    return ddt_choice_set_rules(&((cpu_engine *)impl)->ch, r, err);
}

static void cpu_set_answer_start(void *impl, int32_t start) {
    ddt_choice_set_answer_start(&((cpu_engine *)impl)->ch, start);
}

/* The target's token from a logits row after the emitted tokens (choice.h). */
static ddt_status choose(cpu_engine *e, const float *row, uint64_t round, int32_t *token, ddt_error *err) {
    return ddt_choice_pick(&e->ch, e->sampler, &e->opts.sampling, row, &e->ch.jstate, NULL, 0, round, 0, token, err);
}

/* Emitted ids[0..n) move on what follows the output: the constraint's state and
 * the logit rules' generated-token counts. */
static ddt_status take_emitted(cpu_engine *e, const int32_t *ids, int32_t n, ddt_error *err) {
    return ddt_choice_take(&e->ch, ids, n, err);
}

/* The round's draft tree: the best-first tree (under a constraint, of allowed nodes
 * only) or the chain (under a constraint, cut before its first refused token). */
static ddt_status build_draft(cpu_engine *e, const ddt_draft_table *tb, int32_t bonus, int32_t budget,
                              int32_t len, ddt_error *err) {
    const bool json = e->ch.json.vocab != NULL;
    ddt_choice_root(&e->ch);
    if (e->opts.mode == DDT_MODE_TREE) {
        const bool use_cost = e->have_cost && e->opts.budget_auto;
        if (use_cost) e->cost.context_len = (float)len;
        return ddt_tree_build_filtered(e->builder, tb, bonus, budget, use_cost ? &e->cost : NULL, e->vocab,
                                       json ? ddt_choice_allows : NULL, &e->ch, &e->tree, err);
    }
    ddt_status st = ddt_tree_build_chain(tb, bonus, budget, e->vocab, &e->tree, err);
    if (st || !json) return st;
    for (int32_t i = 1; i < e->tree.n_nodes; i++)
        if (!ddt_choice_allows(&e->ch, i - 1, i, e->tree.token[i]))
            return ddt_tree_build_chain(tb, bonus, i - 1, e->vocab, &e->tree, err);
    return DDT_OK;
}

static const ddt_cost_model *cpu_cost(const void *impl) {
    const cpu_engine *e = impl;
    return e->have_cost && e->opts.budget_auto ? &e->cost : NULL;
}

static ddt_status cpu_set_speculation(void *impl, ddt_mode mode, int32_t budget, bool budget_auto, ddt_error *err) {
    cpu_engine *e = impl;
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
    cpu_engine *e;
    uint64_t round;
} node_sampler;

static ddt_status sample_node(void *ctx, int32_t node, int32_t *token, ddt_error *err) {
    const node_sampler *ns = ctx;
    cpu_engine *e = ns->e;
    /* under a constraint the state is the one build_draft stepped the node to */
    return ddt_choice_pick_node(&e->ch, e->sampler, &e->opts.sampling, &e->tree,
                                e->logits + (size_t)node * (size_t)e->vocab, node, ns->round, token, err);
}

/* Append the drafter features of rows[0..m) of the last target forward. */
static ddt_status feed_drafter(cpu_engine *e, const int32_t *rows, int32_t m, ddt_error *err) {
    if (!e->drafter || m == 0) return DDT_OK;
    const float *layers[DDT_TARGET_MAX_CAPTURE];
    int32_t n_rows = 0;
    for (int32_t s = 0; s < e->n_capture; s++) {
        layers[s] = ddt_target_hidden(e->target, s, &n_rows);
        if (!layers[s]) return ddt_fail(err, DDT_ERR_INTERNAL, "target hidden-state capture %d missing", s);
    }
    return ddt_drafter_append_rows(e->drafter, layers, n_rows, rows, m, err);
}

/* Whether this generation's trees take calibrated weights: a calibration is
 * fitted on greedy decodes, and at T = 1 one gained nothing (calibration.h). */
static bool calibrated(const cpu_engine *e) { return e->have_cal && e->opts.sampling.temperature == 0.0f; }

/* Fill the draft table [depth][k] for the block after the committed context
 * (the drafter's own log-probabilities: the caller calibrates). */
static ddt_status draft_table_raw(cpu_engine *e, int32_t bonus, int32_t k, ddt_error *err) {
    int32_t pos = ddt_target_len(e->target);
    if (e->opts.draft_fn)
        return e->opts.draft_fn(e->opts.draft_ctx, bonus, pos, e->depth, k, e->logq, e->table_tok, err);
    ddt_status st = ddt_drafter_draft(e->drafter, bonus, e->draft_logits, err);
    if (st) return st;
    /* drafts follow the bias the target's choices will get */
    ddt_choice_bias_rows(&e->ch, e->draft_logits, e->depth);
    for (int32_t d = 0; d < e->depth; d++) {
        st = ddt_topk_logsoftmax(e->draft_logits + (size_t)d * (size_t)e->vocab, e->vocab, k, e->pairs,
                                 e->logq + (size_t)d * (size_t)k, e->table_tok + (size_t)d * (size_t)k, d, err);
        if (st) return st;
    }
    return DDT_OK;
}

/* Whether this round's tree takes the context lookup's path: a calibration that
 * rates it, greedy, a tree round, and no JSON constraint (whose build tracks the
 * grammar per node, which a grafted node would lack). */
static bool lookup_on(const cpu_engine *e) {
    return calibrated(e) && e->cal.lookup && !e->opts.no_lookup && e->opts.mode == DDT_MODE_TREE &&
           e->ch.json.vocab == NULL;
}

/* The lookup's proposal (at most depth tokens into path, match length *ml) for the
 * committed context kv_ids[0..n_kv) followed by the round's root. */
static int32_t propose_lookup(cpu_engine *e, int32_t bonus, int32_t *path, int32_t *ml) {
    e->kv_ids[e->n_kv] = bonus; /* the round's commit writes the same id there */
    return ddt_lookup_propose(e->kv_ids, e->n_kv + 1, e->depth, path, ml);
}

/* Graft the lookup's proposal for the committed context + bonus onto the round's
 * tree, within `budget` nodes; *grafted: nodes appended. */
static ddt_status graft_lookup(cpu_engine *e, int32_t bonus, int32_t budget, int32_t *grafted, ddt_error *err) {
    *grafted = 0;
    int32_t path[DDT_MAX_DEPTH], ml;
    const int32_t len = propose_lookup(e, bonus, path, &ml);
    if (len == 0) return DDT_OK;
    float v[DDT_MAX_DEPTH];
    ddt_cal_lookup_weights(&e->cal, ml, len, v);
    return ddt_tree_graft(&e->tree, path, v, len, budget, e->vocab, grafted, err);
}

/* The round's table: the drafter's, calibrated where calibrated() says. */
static ddt_status draft_table(cpu_engine *e, int32_t bonus, int32_t k, ddt_error *err) {
    ddt_status st = draft_table_raw(e, bonus, k, err);
    if (st) return st;
    if (calibrated(e)) ddt_cal_apply(&e->cal, e->logq, e->depth, k, k);
    return DDT_OK;
}

/* The context rows of the last generation that this prompt may start from
 * (options.prefix_cache): their longest common prefix, less the prompt's last
 * token (its logits give the first new token, so it is always computed), and no
 * longer than the drafter's context, which must cover the same rows (ar rounds do
 * not feed the drafter: after an ar generation it holds only that prompt). */
static int32_t reusable_prefix(const cpu_engine *e, const int32_t *prompt, int32_t n_prompt) {
    if (!e->opts.prefix_cache || e->n_kv != ddt_target_len(e->target)) return 0;
    int32_t lim = e->n_kv < n_prompt - 1 ? e->n_kv : n_prompt - 1;
    if (e->drafter && ddt_drafter_len(e->drafter) < lim) lim = ddt_drafter_len(e->drafter);
    int32_t keep = 0;
    while (keep < lim && e->kv_ids[keep] == prompt[keep]) keep++;
    return keep;
}

/* Prefill prompt[from..n) after the context, in chunks: their ids into kv_ids, and
 * every chunk's features to the drafter. */
static ddt_status prefill_prompt(cpu_engine *e, const int32_t *prompt, int32_t from, int32_t n, ddt_error *err) {
    for (int32_t i = from; i < n; i += DDT_ENGINE_PREFILL_CHUNK) {
        int32_t c = n - i < DDT_ENGINE_PREFILL_CHUNK ? n - i : DDT_ENGINE_PREFILL_CHUNK;
        ddt_status st = ddt_target_prefill(e->target, prompt + i, c, e->logits, false, err);
        if (st) return st;
        memcpy(e->kv_ids + e->n_kv, prompt + i, sizeof(int32_t) * (size_t)c);
        e->n_kv += c;
        if ((st = feed_drafter(e, e->rows, c, err))) return st;
    }
    return DDT_OK;
}

static ddt_status generate_body(cpu_engine *e, const int32_t *prompt, int32_t n_prompt, int32_t max_new,
                                const int32_t *stop, int32_t n_stop, int32_t *out, int32_t *n_out, ddt_emit_fn emit_fn,
                                void *emit_ctx, ddt_gen_stats *stats, ddt_error *err) {
    /* the grammar at its start, the penalties' counts; a constraint needs a stop id */
    ddt_status st = ddt_choice_start(&e->ch, prompt, n_prompt, stop, n_stop, err);
    if (st) return st;
    ddt_gen_stats s;
    memset(&s, 0, sizeof s);
    double forecast = 0.0; /* sum over speculative rounds of the drafter's expected acceptance */
    int64_t forecast_rounds = 0;
    const int32_t keep = reusable_prefix(e, prompt, n_prompt);
    if ((st = ddt_target_rollback(e->target, keep, err))) return st;
    if (e->drafter && (st = ddt_drafter_rollback(e->drafter, keep, err))) return st;
    e->n_kv = keep;

    ddt_emitter em = ddt_emitter_start(out, max_new, stop, n_stop, emit_fn, emit_ctx);
    double t_start = ddt_engine_now();
    s.prompt_tokens = n_prompt;
    s.cached_tokens = keep;
    /* the rest of the prompt */
    if ((st = prefill_prompt(e, prompt, keep, n_prompt, err))) return st;
    int32_t bonus;
    st = choose(e, e->logits, 0, &bonus, err);
    if (st) return st;
    if ((st = take_emitted(e, &bonus, 1, err))) return st;
    double t_decode = ddt_engine_now();
    s.t_prefill = t_decode - t_start;
    record_logprobs(e, e->logits, bonus, em.n);
    ddt_emitter_push(&em, &bonus, 1);
    /* --budget auto's fallback to ar steps where speculation does not pay (round.h) */
    ddt_ar_fallback fb;
    ddt_ar_fallback_start(&fb, e->opts.mode == DDT_MODE_TREE && e->opts.budget_auto && e->have_cost);

    for (uint64_t round = 1; !em.done; round++) {
        int32_t len = ddt_target_len(e->target);
        int32_t room = e->max_ctx - len - 1; /* nodes beyond the root that still fit */
        if (room < 0) break;                 /* context full */
        double t0 = ddt_engine_now(), t1, t2, t3, t4;
        int32_t n;
        const bool fallback_step = ddt_ar_fallback_step(&fb);
        if (e->opts.mode == DDT_MODE_AR || fallback_step) {
            t1 = t2 = ddt_engine_now();
            st = ddt_target_prefill(e->target, &bonus, 1, e->logits, false, err);
            if (st) return st;
            e->kv_ids[e->n_kv++] = bonus;
            if (fallback_step) { /* a speculative engine's drafter follows the context */
                s.ar_rounds++;
                if ((st = feed_drafter(e, e->rows, 1, err))) return st;
            }
            t3 = ddt_engine_now();
            st = choose(e, e->logits, round, &bonus, err);
            if (st) return st;
            if ((st = take_emitted(e, &bonus, 1, err))) return st;
            t4 = ddt_engine_now();
            n = 1;
            s.accepted += 1;
            record_logprobs(e, e->logits, bonus, em.n);
            ddt_emitter_push(&em, &bonus, 1);
        } else {
            int32_t k, budget = ddt_engine_round_nodes(e->opts.mode, e->opts.budget, e->depth, room, e->kmax, &k);
            st = draft_table(e, bonus, k, err);
            if (st) return st;
            t1 = ddt_engine_now();
            ddt_draft_table tb = {e->depth, k, e->logq, e->table_tok};
            if ((st = build_draft(e, &tb, bonus, budget, len, err))) return st;
            if (lookup_on(e)) {
                /* the auto budget's cut stands: the lookup competes within the nodes it chose */
                int32_t grafted;
                const int32_t b = e->opts.budget_auto ? e->tree.n_nodes - 1 : budget;
                if ((st = graft_lookup(e, bonus, b, &grafted, err))) return st;
                s.lookup_nodes += grafted;
            }
            t2 = ddt_engine_now();
            n = e->tree.n_nodes;
            double phi = 1.0; /* the bonus, then each node's chance that its whole path is accepted */
            for (int32_t i = 1; i < n; i++) phi += exp((double)e->tree.logw[i]);
            forecast += phi;
            forecast_rounds++;
            st = ddt_target_verify(e->target, e->tree.token, e->tree.depth, e->tree.vis,
                                   e->tree.vis_words, n, e->logits, err);
            if (st) return st;
            t3 = ddt_engine_now();
            /* the target's token is drawn only at the nodes the walk visits */
            node_sampler ns = {e, round};
            ddt_walk_result w;
            st = ddt_tree_walk_fn(&e->tree, sample_node, &ns, e->vocab, &w, err);
            if (st) return st;
            t4 = ddt_engine_now();
            st = ddt_target_commit(e->target, w.path, w.length, err);
            if (st) return st;
            for (int32_t i = 0; i < w.length; i++) e->kv_ids[e->n_kv++] = e->tree.token[w.path[i]];
            st = feed_drafter(e, w.path, w.length, err);
            if (st) return st;
            int32_t ids[DDT_MAX_PATH];
            for (int32_t i = 1; i < w.length; i++) ids[i - 1] = e->tree.token[w.path[i]];
            ids[w.length - 1] = w.bonus;
            if ((st = take_emitted(e, ids, w.length, err))) return st;
            /* emitted token i was chosen from the logits of path node i (its parent) */
            for (int32_t i = 0; i < w.length; i++)
                record_logprobs(e, e->logits + (size_t)w.path[i] * (size_t)e->vocab, ids[i], em.n + i);
            bonus = w.bonus;
            s.accepted += w.length;
            ddt_emitter_push(&em, ids, w.length);
            ddt_ar_fallback_after_round(&fb, round, w.length, n, &e->cost);
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
    s.expected_acceptance = forecast_rounds ? forecast / (double)forecast_rounds : 0.0;
    *n_out = em.n;
    s.draft_calibrated = calibrated(e) && e->opts.mode != DDT_MODE_AR;
    if (stats) *stats = s;
    return DDT_OK;
}

static ddt_status cpu_score(void *impl, const int32_t *ids, int32_t n, int32_t n_top, ddt_token_logprobs *out,
                            ddt_error *err) {
    cpu_engine *e = impl;
    if (!e->score_logits) {
        e->score_logits = ddt_malloc_array((size_t)DDT_ENGINE_PREFILL_CHUNK * (size_t)e->vocab, sizeof(float));
        if (!e->score_logits)
            return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for %d rows of %d logits", DDT_ENGINE_PREFILL_CHUNK,
                            e->vocab);
    }
    e->n_kv = 0; /* the context becomes the scored text, which the drafter has not seen */
    ddt_status st = ddt_target_rollback(e->target, 0, err);
    if (st) return st;
    out[0].logprob = NAN;
    out[0].n_top = 0;
    /* row r of a chunk starting at i predicts token i + r + 1 */
    for (int32_t i = 0; i < n - 1; i += DDT_ENGINE_PREFILL_CHUNK) {
        const int32_t c = n - 1 - i < DDT_ENGINE_PREFILL_CHUNK ? n - 1 - i : DDT_ENGINE_PREFILL_CHUNK;
        if ((st = ddt_target_prefill(e->target, ids + i, c, e->score_logits, true, err))) return st;
        for (int32_t r = 0; r < c; r++)
            ddt_logprobs_of_row(e->score_logits + (size_t)r * (size_t)e->vocab, e->vocab, ids[i + r + 1], n_top,
                                &out[i + r + 1]);
    }
    return DDT_OK;
}

/* engine.h ddt_engine_calibration_data: a greedy ar decode that drafts at every
 * step; the tables are kept until the tokens after them are known.  kv_ids follows
 * the context, as in a generation, for the lookup's proposals. */
static ddt_status calibration_body(cpu_engine *e, const int32_t *prompt, int32_t n_prompt, int32_t max_new,
                                   ddt_cal_stats *stats, int32_t *n_out, float *tab_q, int32_t *tab_t,
                                   int32_t *toks, int32_t *props, int32_t k, ddt_error *err) {
    /* props: per step, the lookup's match length, proposal length and proposal (depth + 2 ints) */
    const size_t pstride = (size_t)e->depth + 2;
    ddt_status st = ddt_choice_start(&e->ch, prompt, n_prompt, NULL, 0, err);
    if (st) return st;
    if ((st = ddt_target_rollback(e->target, 0, err))) return st;
    if (e->drafter && (st = ddt_drafter_rollback(e->drafter, 0, err))) return st;
    e->n_kv = 0;
    if ((st = prefill_prompt(e, prompt, 0, n_prompt, err))) return st;
    if ((st = choose(e, e->logits, 0, &toks[0], err))) return st;
    if ((st = take_emitted(e, &toks[0], 1, err))) return st;
    int32_t n = 1;
    const size_t cells = (size_t)e->depth * (size_t)k;
    for (; n < max_new && ddt_target_len(e->target) < e->max_ctx; n++) {
        const int32_t bonus = toks[n - 1];
        int32_t *pr = props + (size_t)(n - 1) * pstride;
        pr[1] = propose_lookup(e, bonus, pr + 2, &pr[0]);
        if ((st = draft_table_raw(e, bonus, k, err))) return st;
        memcpy(tab_q + (size_t)(n - 1) * cells, e->logq, cells * sizeof(float));
        memcpy(tab_t + (size_t)(n - 1) * cells, e->table_tok, cells * sizeof(int32_t));
        if ((st = ddt_target_prefill(e->target, &bonus, 1, e->logits, false, err))) return st;
        e->kv_ids[e->n_kv++] = bonus;
        if ((st = feed_drafter(e, e->rows, 1, err))) return st;
        if ((st = choose(e, e->logits, (uint64_t)n, &toks[n], err))) return st;
        if ((st = take_emitted(e, &toks[n], 1, err))) return st;
    }
    for (int32_t i = 0; i + 1 < n; i++) {
        ddt_cal_stats_add_table(stats, tab_q + (size_t)i * cells, tab_t + (size_t)i * cells, e->depth, k, toks + i + 1,
                                n - i - 1);
        const int32_t *pr = props + (size_t)i * pstride;
        ddt_cal_stats_add_lookup(stats, pr[0], pr + 2, pr[1], toks + i + 1, n - i - 1);
    }
    *n_out = n;
    return DDT_OK;
}

static ddt_status cpu_calibration_data(void *impl, const int32_t *prompt, int32_t n_prompt, int32_t max_new,
                                       ddt_cal_stats *stats, int32_t *n_out, ddt_error *err) {
    cpu_engine *e = impl;
    if ((!e->drafter && !e->opts.draft_fn) || e->depth < 1)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "calibration data needs a drafter, and this engine has none");
    if (e->opts.sampling.temperature != 0.0f)
        return ddt_fail(err, DDT_ERR_INVALID, "calibration data comes from greedy decodes: the temperature is %g, "
                        "not 0", (double)e->opts.sampling.temperature);
    const int32_t room = e->max_ctx - n_prompt; /* tokens that fit after the prompt */
    if (max_new > room) max_new = room;
    const int32_t k = e->kmax < DDT_CAL_RANKS ? e->kmax : DDT_CAL_RANKS;
    const size_t cells = (size_t)e->depth * (size_t)k;
    float *tab_q = ddt_malloc_array((size_t)max_new * cells, sizeof(float));
    int32_t *tab_t = ddt_malloc_array((size_t)max_new * cells, sizeof(int32_t));
    int32_t *toks = ddt_malloc_array((size_t)max_new, sizeof(int32_t));
    int32_t *props = ddt_malloc_array((size_t)max_new * ((size_t)e->depth + 2), sizeof(int32_t));
    ddt_status st;
    if (!tab_q || !tab_t || !toks || !props)
        st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory for %d draft tables of %zu cells", max_new, cells);
    else
        st = calibration_body(e, prompt, n_prompt, max_new, stats, n_out, tab_q, tab_t, toks, props, k, err);
    free(tab_q);
    free(tab_t);
    free(toks);
    free(props);
    e->n_kv = 0; /* the context is the decode's, which no generation tracked */
    return st;
}

static ddt_status cpu_generate(void *impl, const int32_t *prompt, int32_t n_prompt, int32_t max_new,
                               const int32_t *stop, int32_t n_stop, int32_t *out, int32_t *n_out, ddt_emit_fn emit_fn,
                               void *emit_ctx, ddt_gen_stats *stats, ddt_error *err) {
    cpu_engine *e = impl;
    ddt_status st = generate_body(e, prompt, n_prompt, max_new, stop, n_stop, out, n_out, emit_fn, emit_ctx, stats, err);
    /* a failed generation leaves a context nobody tracked: the next starts empty */
    if (st || e->n_kv != ddt_target_len(e->target)) e->n_kv = 0;
    return st;
}

const ddt_engine_backend_ops ddt_engine_cpu_backend = {
    .name = "cpu",
    .create = cpu_create,
    .free = cpu_free,
    .vocab = cpu_vocab,
    .model_config = cpu_model_config,
    .set_sampling = cpu_set_sampling,
    .set_speculation = cpu_set_speculation,
    .set_logprobs = cpu_set_logprobs,
    .set_constraint = cpu_set_constraint,
    .set_logit_rules = cpu_set_logit_rules,
    .set_answer_start = cpu_set_answer_start,
    .score = cpu_score,
    .calibration_data = cpu_calibration_data,
    .cost = cpu_cost,
    .generate = cpu_generate,
};
