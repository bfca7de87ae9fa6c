/*
 * target.c — DeepSeek-V3 / Kimi K2.x target on the CPU backend (see target.h):
 * description (config, dims, borrowed weight views: target_desc.c) -> run state -> forward (prefill, tree
 * verify), commit and rollback of the latent cache.
 *
 * Per layer and token (HF DeepseekV3DecoderLayer):
 *   h  = rmsnorm(x, input_layernorm)
 *   q  = q_b(rmsnorm(q_a(h), q_a_layernorm, 1e-6))  or q_proj(h)  -> [heads][nope | rope]
 *   kv = kv_a_proj_with_mqa(h) -> c = rmsnorm(kv[:rank], kv_a_layernorm, 1e-6), k_rope = rope(kv[rank:])
 *   attention in the absorbed form: q_lat = q_nope W_UK (per head), MLA over (c, k_rope),
 *   out = W_UV(out_lat) per head, x += o_proj(out)
 *   x += mlp(rmsnorm(x, post_attention_layernorm))   (dense SiLU MLP, or MoE + shared experts)
 * then logits = lm_head(rmsnorm(x, norm)).
 * The latent norms use eps 1e-6 whatever rms_norm_eps says: HF (and DeepSeek's
 * reference code) build them with the default eps.
 */
#include "model/target.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/mla.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/nn.h"
#include "backend/cpu/pool.h"
#include "backend/cpu/qmatmul.h"
#include "backend/cpu/rope.h"
#include "core/alloc.h"
#include "core/error.h"
#include "model/target_desc.h"

#define LATENT_NORM_EPS 1e-6f

/* ------------------------------------------------------------------ model */

struct ddt_target {
    ddt_target_desc desc;    /* config, dims and the weight views (target_desc.h) */
    ddt_cpu_pool *pool;
    int32_t max_ctx, max_tokens;
    float rope_attn;
    float *inv_freq;         /* [rope/2] */
    uint64_t state_bytes;    /* run state + latent cache */
    ddt_moe_route_params route; /* bias NULL: moe_forward points it at the layer's row of route_bias */
    float *route_bias;          /* [n_layers][n_experts] each MoE layer's e_score_correction_bias in fp32,
                                   converted at load (the GPU's device copy holds the same floats) */

    ddt_cpu_kv kv;

    /* run state, T = max_tokens */
    float *x;        /* [T][hidden] residual stream */
    float *xn;       /* [T][hidden] normed input of a block */
    float *qa;       /* [T][q_lora] */
    float *q;        /* [T][heads][nope+rope] */
    float *kva;      /* [T][rank+rope] */
    float *q_lat;    /* [T][heads][rank] */
    float *o_lat;    /* [T][heads][rank] */
    float *o_v;      /* [T][heads*v] */
    float *tmp;      /* [T][hidden] block output */
    float *acc;      /* [T][hidden] routed-expert sum */
    float *g, *u;    /* [T][inter_max] */
    float *cosv;     /* [T][rope/2] */
    float *sinv;     /* [T][rope/2] */
    float *rlogits;  /* [T][experts] */
    int32_t *ridx;   /* [T][top_k] */
    float *rw;       /* [T][top_k] */
    void *moe_ws;    /* ddt_cpu_moe_workspace_bytes for T tokens */
    int32_t *pos;    /* [T] positions of the current forward */

    int32_t n_capture;
    int32_t capture_layer[DDT_TARGET_MAX_CAPTURE];
    float *capture;  /* [n_capture][T][hidden] */
    int32_t n_last;  /* tokens of the last forward, 0 = none */

    /* the last verify, for commit */
    bool verify_valid;
    int32_t vis_words;
    int32_t *last_depth; /* [T] */
    uint64_t *last_vis;  /* [T][vis_words_max] */
    int32_t vis_words_max;
};

/* ------------------------------------------------------------------ loading */

/* The routed experts of layer L as the backend op takes them (L NULL: the sizes
 * only, for the workspace). */
static ddt_cpu_moe_layer moe_layer(const ddt_target *t, const ddt_target_layer *L) {
    return (ddt_cpu_moe_layer){.n_experts = t->desc.dims.n_experts, .hidden = t->desc.dims.hidden,
                               .inter = t->desc.cfg.moe_intermediate_size, .experts = L ? L->experts : NULL};
}

/* Allocate one run-state array of n x sz; records NOMEM via *ok. */
static void *state_alloc(ddt_target *t, size_t n, size_t sz, bool *ok) {
    void *p = ddt_calloc_array(n ? n : 1, sz);
    if (!p) *ok = false;
    else t->state_bytes += (uint64_t)(n ? n : 1) * sz;
    return p;
}

static ddt_status alloc_state(ddt_target *t, ddt_error *err) {
    ddt_status st;
    size_t T = (size_t)t->max_tokens;
    size_t th, tq, tl, ti;
    if (!ddt_mul_size(T, (size_t)t->desc.dims.hidden, &th) ||
        !ddt_mul_size(T, (size_t)t->desc.dims.heads * (size_t)t->desc.dims.qdim, &tq) ||
        !ddt_mul_size(T, (size_t)t->desc.dims.heads * (size_t)t->desc.dims.rank, &tl) ||
        !ddt_mul_size(T, (size_t)t->desc.dims.inter_max, &ti))
        return ddt_fail(err, DDT_ERR_RANGE, "run state for %d tokens per forward overflows", t->max_tokens);
    bool ok = true;
    t->x = state_alloc(t, th, sizeof(float), &ok);
    t->xn = state_alloc(t, th, sizeof(float), &ok);
    t->tmp = state_alloc(t, th, sizeof(float), &ok);
    t->acc = state_alloc(t, th, sizeof(float), &ok);
    t->qa = state_alloc(t, T * (size_t)(t->desc.dims.q_lora > 0 ? t->desc.dims.q_lora : 1), sizeof(float), &ok);
    t->q = state_alloc(t, tq, sizeof(float), &ok);
    t->kva = state_alloc(t, T * (size_t)(t->desc.dims.rank + t->desc.dims.rope), sizeof(float), &ok);
    t->q_lat = state_alloc(t, tl, sizeof(float), &ok);
    t->o_lat = state_alloc(t, tl, sizeof(float), &ok);
    t->o_v = state_alloc(t, T * (size_t)t->desc.dims.heads * (size_t)t->desc.dims.vdim, sizeof(float), &ok);
    t->g = state_alloc(t, ti, sizeof(float), &ok);
    t->u = state_alloc(t, ti, sizeof(float), &ok);
    t->cosv = state_alloc(t, T * (size_t)(t->desc.dims.rope / 2), sizeof(float), &ok);
    t->sinv = state_alloc(t, T * (size_t)(t->desc.dims.rope / 2), sizeof(float), &ok);
    t->pos = state_alloc(t, T, sizeof(int32_t), &ok);
    t->inv_freq = state_alloc(t, (size_t)(t->desc.dims.rope / 2), sizeof(float), &ok);
    if (t->desc.dims.n_experts > 0) {
        t->rlogits = state_alloc(t, T * (size_t)t->desc.dims.n_experts, sizeof(float), &ok);
        t->ridx = state_alloc(t, T * (size_t)t->desc.dims.top_k, sizeof(int32_t), &ok);
        t->rw = state_alloc(t, T * (size_t)t->desc.dims.top_k, sizeof(float), &ok);
        ddt_cpu_moe_layer ml = moe_layer(t, NULL);
        t->moe_ws = state_alloc(t, ddt_cpu_moe_workspace_bytes(&ml, t->max_tokens, t->desc.dims.top_k), 1, &ok);
        const size_t E = (size_t)t->desc.dims.n_experts;
        t->route_bias = state_alloc(t, (size_t)t->desc.dims.n_layers * E, sizeof(float), &ok);
        for (int32_t l = 0; ok && l < t->desc.dims.n_layers; l++) {
            const ddt_target_layer *L = &t->desc.layers[l];
            if (!L->moe) continue;
            for (size_t e = 0; e < E; e++)
                t->route_bias[(size_t)l * E + e] = ddt_cpu_vec_at(L->router_bias.data, L->router_bias.dtype, (int64_t)e);
        }
    }
    if (t->n_capture > 0) {
        size_t cap;
        if (!ddt_mul_size(th, (size_t)t->n_capture, &cap))
            return ddt_fail(err, DDT_ERR_RANGE, "hidden-state capture overflows");
        t->capture = state_alloc(t, cap, sizeof(float), &ok);
    }
    t->vis_words_max = (t->max_tokens + 63) / 64;
    t->last_depth = state_alloc(t, T, sizeof(int32_t), &ok);
    t->last_vis = state_alloc(t, T * (size_t)t->vis_words_max, sizeof(uint64_t), &ok);
    if (!ok) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the run state (%d tokens)", t->max_tokens);
    st = ddt_cpu_kv_alloc(t->desc.dims.n_layers, t->desc.dims.rank + t->desc.dims.rope, t->max_ctx, &t->kv, err);
    if (st == DDT_OK)
        t->state_bytes += (uint64_t)t->kv.n_layers * (uint64_t)t->kv.capacity * (uint64_t)t->kv.width * sizeof(float);
    return st;
}

ddt_status ddt_target_load(const char *dir, const ddt_target_options *opts, ddt_target **out, ddt_error *err) {
    if (!dir || !opts || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_target_load: NULL argument");
    *out = NULL;
    if (opts->max_ctx < 1 || opts->max_tokens < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "target options: max_ctx %d and max_tokens %d must be >= 1",
                        opts->max_ctx, opts->max_tokens);
    ddt_status st = ddt_target_capture_check(opts->capture_layers, opts->n_capture, err);
    if (st != DDT_OK) return st;
    ddt_target *t = calloc(1, sizeof *t);
    if (!t) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    st = ddt_target_desc_load(dir, opts->capture_layers, opts->n_capture, &t->desc, err);
    if (st != DDT_OK) goto fail;
    const ddt_model_config *c = &t->desc.cfg;
    for (int32_t i = 0; i < opts->n_capture; i++) t->capture_layer[i] = opts->capture_layers[i];
    t->n_capture = opts->n_capture;
    t->max_ctx = opts->max_ctx;
    t->max_tokens = opts->max_tokens;

    t->route = ddt_target_route_params(c, &t->desc.dims);
    if ((st = alloc_state(t, err)) != DDT_OK) goto fail;
    ddt_rope_params rp = ddt_target_rope_params(c);
    ddt_cpu_rope_freqs(&rp, t->inv_freq, &t->rope_attn);
    if ((st = ddt_cpu_pool_create(opts->n_threads, &t->pool, err)) != DDT_OK) goto fail;
    *out = t;
    return DDT_OK;
fail:
    ddt_error_prefix(err, "model %s: ", dir);
    ddt_target_free(t);
    return st;
}

void ddt_target_free(ddt_target *t) {
    if (!t) return;
    ddt_cpu_pool_destroy(t->pool);
    ddt_cpu_kv_free(&t->kv);
    void *bufs[] = {t->x, t->xn, t->qa, t->q, t->kva, t->q_lat, t->o_lat, t->o_v, t->tmp, t->acc, t->g,
                    t->u, t->cosv, t->sinv, t->rlogits, t->ridx, t->rw, t->moe_ws, t->route_bias, t->pos, t->capture, t->last_depth, t->last_vis, t->inv_freq};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    ddt_target_desc_free(&t->desc);
    free(t);
}

const ddt_model_config *ddt_target_config(const ddt_target *t) { return &t->desc.cfg; }
int32_t ddt_target_vocab(const ddt_target *t) { return t->desc.dims.vocab; }
int32_t ddt_target_len(const ddt_target *t) { return t->kv.len; }
int32_t ddt_target_max_ctx(const ddt_target *t) { return t->max_ctx; }
int32_t ddt_target_max_tokens(const ddt_target *t) { return t->max_tokens; }
int32_t ddt_target_threads(const ddt_target *t) { return ddt_cpu_pool_threads(t->pool); }
const ddt_qweight *ddt_target_embed(const ddt_target *t) { return &t->desc.embed; }
const ddt_target_layer *ddt_target_layer_at(const ddt_target *t, int32_t l) {
    return l >= 0 && l < t->desc.dims.n_layers ? &t->desc.layers[l] : NULL;
}
const ddt_cpu_vec *ddt_target_final_norm(const ddt_target *t) { return &t->desc.final_norm; }
const ddt_qweight *ddt_target_lm_head(const ddt_target *t) { return &t->desc.lm_head; }
ddt_cpu_pool *ddt_target_pool(ddt_target *t) { return t->pool; }
const ddt_cpu_kv *ddt_target_cache(const ddt_target *t) { return &t->kv; }
uint64_t ddt_target_weight_bytes(const ddt_target *t) { return t->desc.weight_bytes; }
uint64_t ddt_target_decode_bytes(const ddt_target *t) {
    uint64_t b = t->desc.weight_bytes;
    /* an untied embedding table is read one row per token */
    if (!t->desc.cfg.tie_word_embeddings) b = b - t->desc.embed_bytes + t->desc.embed_bytes / (uint64_t)t->desc.dims.vocab;
    /* routed experts are equal in size: a token reads top_k of n_experts per layer */
    if (t->desc.dims.n_experts > 0)
        b = b - t->desc.routed_bytes + t->desc.routed_bytes / (uint64_t)t->desc.dims.n_experts * (uint64_t)t->desc.dims.top_k;
    return b;
}
uint64_t ddt_target_state_bytes(const ddt_target *t) { return t->state_bytes; }

const float *ddt_target_hidden(const ddt_target *t, int32_t slot, int32_t *n_tokens) {
    if (n_tokens) *n_tokens = t->n_last;
    if (slot < 0 || slot >= t->n_capture || t->n_last == 0) return NULL;
    return t->capture + (size_t)slot * (size_t)t->max_tokens * (size_t)t->desc.dims.hidden;
}

/* ------------------------------------------------------------------ forward */

/* out[n][hidden] = down(silu(gate(in)) * up(in)) for n rows of in [n][hidden]. */
static void mlp_forward(ddt_target *t, const ddt_cpu_mlp *m, const float *in, int64_t n, float *out) {
    ddt_cpu_mlp_forward(t->pool, m, in, t->desc.dims.hidden, n, t->g, t->u, out, t->desc.dims.hidden);
}

/* MoE block of layer l on t->xn [n][hidden] -> t->tmp [n][hidden]. */
static void moe_forward(ddt_target *t, int32_t l, int32_t n) {
    const ddt_target_layer *L = &t->desc.layers[l];
    const int32_t H = t->desc.dims.hidden, E = t->desc.dims.n_experts, K = t->desc.dims.top_k;
    ddt_cpu_matmul(t->pool, &L->router, t->xn, H, n, t->rlogits, E);
    ddt_moe_route_params rp = t->route;
    rp.bias = t->route_bias + (size_t)l * (size_t)E;
    ddt_cpu_moe_route(t->rlogits, E, n, &rp, t->ridx, t->rw);
    const ddt_cpu_moe_layer ml = moe_layer(t, L);
    ddt_cpu_moe_experts(t->pool, &ml, t->xn, H, n, t->ridx, t->rw, K, t->acc, H, t->moe_ws);
    if (L->has_shared) {
        mlp_forward(t, &L->shared, t->xn, n, t->tmp);
        ddt_cpu_add(t->tmp, t->acc, (int64_t)n * H); /* tmp + acc: IEEE addition commutes */
    } else {
        memcpy(t->tmp, t->acc, sizeof(float) * (size_t)n * H);
    }
}

static void capture_store(ddt_target *t, int32_t layer, const float *src, int32_t n) {
    for (int32_t s = 0; s < t->n_capture; s++)
        if (t->capture_layer[s] == layer)
            memcpy(t->capture + (size_t)s * t->max_tokens * t->desc.dims.hidden, src, sizeof(float) * (size_t)n * t->desc.dims.hidden);
}

/*
 * One forward over n tokens whose positions are in t->pos; their cache rows are
 * len..len+n-1; vis NULL = causal.  Leaves the final-normed states in t->xn and
 * writes logits for rows [logit_row0, n) when logits is not NULL.
 */
static void forward(ddt_target *t, const int32_t *ids, int32_t n, const uint64_t *vis, int32_t vis_words,
                    float *logits, int32_t logit_row0) {
    const int32_t H = t->desc.dims.hidden, heads = t->desc.dims.heads, nope = t->desc.dims.nope, rope = t->desc.dims.rope, rank = t->desc.dims.rank;
    const int32_t half = rope / 2, qd = t->desc.dims.qdim, len = t->kv.len;
    for (int32_t i = 0; i < n; i++) {
        ddt_cpu_dequant(&t->desc.embed, ids[i], 0, H, t->x + (size_t)i * H);
        ddt_cpu_rope_cos_sin(t->inv_freq, half, t->pos[i], t->rope_attn, t->cosv + (size_t)i * half,
                             t->sinv + (size_t)i * half);
    }
    for (int32_t l = 0; l < t->desc.dims.n_layers; l++) {
        const ddt_target_layer *L = &t->desc.layers[l];
        ddt_cpu_rmsnorm(t->pool, t->x, H, n, H, &L->attn_norm, t->desc.dims.eps, t->xn, H);
        /* queries [n][heads][nope | rope] */
        if (t->desc.dims.q_lora > 0) {
            ddt_cpu_matmul(t->pool, &L->q_a, t->xn, H, n, t->qa, t->desc.dims.q_lora);
            ddt_cpu_rmsnorm(t->pool, t->qa, t->desc.dims.q_lora, n, t->desc.dims.q_lora, &L->q_a_norm, LATENT_NORM_EPS, t->qa, t->desc.dims.q_lora);
            ddt_cpu_matmul(t->pool, &L->q_b, t->qa, t->desc.dims.q_lora, n, t->q, (int64_t)heads * qd);
        } else {
            ddt_cpu_matmul(t->pool, &L->q_proj, t->xn, H, n, t->q, (int64_t)heads * qd);
        }
        /* latent KV of the new tokens straight into their cache rows */
        ddt_cpu_matmul(t->pool, &L->kv_a, t->xn, H, n, t->kva, rank + rope);
        float *rows = ddt_cpu_kv_row(&t->kv, l, len);
        const int64_t kw = t->kv.width;
        ddt_cpu_rmsnorm(t->pool, t->kva, rank + rope, n, rank, &L->kv_a_norm, LATENT_NORM_EPS, rows, kw);
        ddt_mla_rope rw = {.n = n, .n_heads = heads, .nope = nope, .rank = rank, .rope_dim = rope, .qdim = qd,
                           .interleave = t->desc.cfg.rope_interleave, .cos_v = t->cosv, .sin_v = t->sinv, .q = t->q,
                           .kva = t->kva, .rows = rows, .rows_ld = kw};
        ddt_cpu_mla_rope_write(&rw);
        /* absorbed attention */
        ddt_row_groups uk = {.count = heads, .w_row_stride = nope + t->desc.dims.vdim, .w_row_offset = 0, .rows = nope,
                             .x_stride = qd, .y_stride = rank};
        ddt_cpu_matmul_t_grouped(t->pool, &L->kv_b, &uk, t->q, (int64_t)heads * qd, n, t->q_lat,
                                 (int64_t)heads * rank);
        ddt_mla_attn a = {.n = n, .n_heads = heads, .rank = rank, .rope_dim = rope, .q_lat = t->q_lat,
                          .q_lat_ld_t = (int64_t)heads * rank, .q_lat_ld_h = rank, .q_rope = t->q + nope,
                          .q_rope_ld_t = (int64_t)heads * qd, .q_rope_ld_h = qd,
                          .kv = ddt_cpu_kv_row(&t->kv, l, 0), .kv_ld = kw, .n_prefix = len, .vis = vis,
                          .vis_words = vis_words, .scale = t->desc.dims.softmax_scale, .out = t->o_lat,
                          .out_ld_t = (int64_t)heads * rank, .out_ld_h = rank};
        ddt_cpu_mla_attention(t->pool, &a);
        ddt_row_groups uv = {.count = heads, .w_row_stride = nope + t->desc.dims.vdim, .w_row_offset = nope, .rows = t->desc.dims.vdim,
                             .x_stride = rank, .y_stride = t->desc.dims.vdim};
        ddt_cpu_matmul_grouped(t->pool, &L->kv_b, &uv, t->o_lat, (int64_t)heads * rank, n, t->o_v,
                               (int64_t)heads * t->desc.dims.vdim);
        ddt_cpu_matmul(t->pool, &L->o_proj, t->o_v, (int64_t)heads * t->desc.dims.vdim, n, t->tmp, H);
        ddt_cpu_add(t->x, t->tmp, (int64_t)n * H);
        /* MLP */
        ddt_cpu_rmsnorm(t->pool, t->x, H, n, H, &L->mlp_norm, t->desc.dims.eps, t->xn, H);
        if (L->moe) moe_forward(t, l, n);
        else mlp_forward(t, &L->mlp, t->xn, n, t->tmp);
        ddt_cpu_add(t->x, t->tmp, (int64_t)n * H);
        if (l < t->desc.dims.n_layers - 1) capture_store(t, l, t->x, n);
    }
    ddt_cpu_rmsnorm(t->pool, t->x, H, n, H, &t->desc.final_norm, t->desc.dims.eps, t->xn, H);
    capture_store(t, t->desc.dims.n_layers - 1, t->xn, n); /* HF hidden_states[L] is the normed state */
    t->n_last = n;
    if (logits)
        ddt_cpu_matmul(t->pool, &t->desc.lm_head, t->xn + (size_t)logit_row0 * H, H, n - logit_row0, logits, t->desc.dims.vocab);
}

static ddt_status check_tokens(const ddt_target *t, const int32_t *ids, int32_t n, const char *what,
                               ddt_error *err) {
    if (!ids) return ddt_fail(err, DDT_ERR_INVALID, "%s: NULL token array", what);
    if (n < 1 || n > t->max_tokens)
        return ddt_fail(err, DDT_ERR_RANGE, "%s: %d tokens, allowed 1..%d per forward", what, n, t->max_tokens);
    if ((int64_t)t->kv.len + n > t->max_ctx)
        return ddt_fail(err, DDT_ERR_RANGE, "%s: %d committed + %d new tokens exceed the context of %d", what,
                        t->kv.len, n, t->max_ctx);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->desc.dims.vocab)
            return ddt_fail(err, DDT_ERR_INVALID, "%s: token %d (index %d) outside the vocabulary 0..%d", what, ids[i],
                            i, t->desc.dims.vocab - 1);
    return DDT_OK;
}

ddt_status ddt_target_prefill(ddt_target *t, const int32_t *ids, int32_t n, float *logits, bool all_logits,
                              ddt_error *err) {
    ddt_status st = check_tokens(t, ids, n, "prefill", err);
    if (st != DDT_OK) return st;
    t->verify_valid = false;
    for (int32_t i = 0; i < n; i++) t->pos[i] = t->kv.len + i;
    forward(t, ids, n, NULL, 0, logits, all_logits ? 0 : n - 1);
    t->kv.len += n;
    return DDT_OK;
}

ddt_status ddt_target_verify(ddt_target *t, const int32_t *tokens, const int32_t *depth, const uint64_t *vis,
                             int32_t vis_words, int32_t n, float *logits, ddt_error *err) {
    ddt_status st = check_tokens(t, tokens, n, "verify", err);
    if (st != DDT_OK) return st;
    if (!depth || !vis) return ddt_fail(err, DDT_ERR_INVALID, "verify: NULL depth or visibility");
    if (vis_words < (n + 63) / 64)
        return ddt_fail(err, DDT_ERR_INVALID, "verify: %d visibility words per row cannot hold %d nodes", vis_words, n);
    for (int32_t i = 0; i < n; i++) {
        if (depth[i] < 0 || depth[i] >= n)
            return ddt_fail(err, DDT_ERR_INVALID, "verify: node %d: depth %d outside 0..%d", i, depth[i], n - 1);
        const uint64_t *row = vis + (size_t)i * vis_words;
        if (!((row[i / 64] >> (i % 64)) & 1u))
            return ddt_fail(err, DDT_ERR_INVALID, "verify: node %d does not see itself", i);
        for (int32_t w = 0; w < vis_words; w++) {
            uint64_t beyond = w * 64 >= n ? ~0ull : (n - w * 64 >= 64 ? 0 : ~0ull << (n - w * 64));
            if (row[w] & beyond)
                return ddt_fail(err, DDT_ERR_INVALID, "verify: node %d sees a node beyond the %d nodes", i, n);
        }
    }
    t->verify_valid = false;
    for (int32_t i = 0; i < n; i++) t->pos[i] = t->kv.len + depth[i];
    /* keep the tree for commit, compacted to vis_words_max words per row */
    int32_t keep = t->vis_words_max;
    for (int32_t i = 0; i < n; i++) {
        t->last_depth[i] = depth[i];
        memset(t->last_vis + (size_t)i * keep, 0, sizeof(uint64_t) * keep);
        memcpy(t->last_vis + (size_t)i * keep, vis + (size_t)i * vis_words,
               sizeof(uint64_t) * (size_t)((n + 63) / 64));
    }
    forward(t, tokens, n, t->last_vis, keep, logits, 0);
    t->vis_words = keep;
    t->verify_valid = true;
    return DDT_OK;
}

ddt_status ddt_target_commit(ddt_target *t, const int32_t *path, int32_t m, ddt_error *err) {
    if (!t->verify_valid) return ddt_fail(err, DDT_ERR_INVALID, "commit: no tree verify to commit from");
    int32_t n = t->n_last;
    if (m < 0 || m > n || (m > 0 && !path))
        return ddt_fail(err, DDT_ERR_INVALID, "commit: path of %d nodes for a tree of %d", m, n);
    for (int32_t k = 0; k < m; k++) {
        int32_t v = path[k];
        if (v < 0 || v >= n) return ddt_fail(err, DDT_ERR_INVALID, "commit: path[%d] = %d outside 0..%d", k, v, n - 1);
        if (t->last_depth[v] != k)
            return ddt_fail(err, DDT_ERR_INVALID, "commit: path[%d] = node %d has depth %d, expected %d", k, v,
                            t->last_depth[v], k);
        /* node v must see exactly path[0..k] */
        const uint64_t *row = t->last_vis + (size_t)v * t->vis_words;
        int32_t seen = 0;
        for (int32_t w = 0; w < t->vis_words; w++) seen += __builtin_popcountll(row[w]);
        bool ok = seen == k + 1;
        for (int32_t j = 0; ok && j <= k; j++) ok = (row[path[j] / 64] >> (path[j] % 64)) & 1u;
        if (!ok)
            return ddt_fail(err, DDT_ERR_INVALID,
                            "commit: path[%d] = node %d does not see exactly the path before it: not a root-to-node path",
                            k, v);
    }
    ddt_status st = ddt_cpu_kv_commit(&t->kv, path, m, err);
    if (st != DDT_OK) return st;
    t->verify_valid = false;
    return DDT_OK;
}

ddt_status ddt_target_rollback(ddt_target *t, int32_t new_len, ddt_error *err) {
    ddt_status st = ddt_cpu_kv_truncate(&t->kv, new_len, err);
    if (st == DDT_OK) t->verify_valid = false;
    return st;
}
