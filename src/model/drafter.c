/*
 * drafter.c — the DFlash drafter on the CPU backend (see drafter.h): the
 * config's RoPE (the reader is io/drafter_config.c), borrowed weight views, a context K/V cache that grows as tokens are
 * committed, and the non-causal block forward.
 *
 * Per drafter layer l and block token t (Qwen3 decoder layer, HF names):
 *   h = rmsnorm(x, input_layernorm)
 *   q = rope(q_norm(q_proj(h)))           per head, at the token's position
 *   K = [context K_l ; rope(k_norm(k_proj(h)))]   V = [context V_l ; v_proj(h)]
 *   x += o_proj(attention(q, K, V))         no mask, softmax scale head_dim^-0.5
 *                                           (backend/cpu/dflash.c, twin of dflash_cuda.cu)
 *   x += down(silu(gate(h2)) * up(h2)),     h2 = rmsnorm(x, post_attention_layernorm)
 * Context K_l/V_l rows are k_norm/RoPE'd k_proj(ctx) and v_proj(ctx) with
 * ctx = rmsnorm(fc(features), hidden_norm), computed once per committed token.
 * The block's own K/V go to the cache rows just after the context (scratch,
 * never committed), so attention reads one contiguous run of rows.
 */
#include "model/drafter.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/dflash.h"
#include "backend/cpu/nn.h"
#include "backend/cpu/qmatmul.h"
#include "backend/cpu/rope.h"
#include "core/alloc.h"
#include "core/error.h"
#include "io/config.h"
#include "model/drafter_desc.h"

_Static_assert(DDT_DRAFTER_MAX_HEAD_DIM <= DDT_CPU_DFLASH_MAX_HEAD_DIM,
               "io/drafter_config.c bounds head_dim by DDT_DRAFTER_MAX_HEAD_DIM: the attention must take it");

#define NAME_MAX_LEN 512
/* Tokens per append chunk: bounds the append scratch whatever m the caller passes. */
#define APPEND_CHUNK 32
/* A block position must fit in int32 after adding L - 1. */
#define MAX_POSITION (INT32_MAX - DDT_DRAFTER_MAX_BLOCK)

/* ------------------------------------------------------------------ config RoPE */

static void rope_params_of(const ddt_drafter_config *c, ddt_rope_params *rp) {
    memset(rp, 0, sizeof *rp);
    rp->dim = c->head_dim;
    rp->theta = c->rope_theta;
    rp->yarn = c->has_yarn;
    rp->factor = c->yarn_factor;
    rp->original_max_position = c->yarn_original_max_position;
    rp->beta_fast = c->yarn_beta_fast;
    rp->beta_slow = c->yarn_beta_slow;
    /* The legacy factor is HF's rule for a rope_scaling without mscale keys:
     * 0.1*ln(factor)+1, so leave them out. */
    rp->mscale = c->legacy_yarn_attention_factor ? 0.0f : c->yarn_mscale;
    rp->mscale_all_dim = c->legacy_yarn_attention_factor ? 0.0f : c->yarn_mscale_all_dim;
}

/* inv_freq[head_dim/2] and the cos/sin factor (an explicit attention_factor wins). */
float ddt_drafter_config_rope(const ddt_drafter_config *c, float *inv_freq) {
    ddt_rope_params rp;
    rope_params_of(c, &rp);
    float f = 1.0f;
    ddt_cpu_rope_freqs(&rp, inv_freq, &f);
    if (c->has_yarn && c->yarn_attention_factor > 0) f = c->yarn_attention_factor;
    return f;
}

float ddt_drafter_config_rope_attention_factor(const ddt_drafter_config *cfg) {
    float inv[DDT_ROPE_MAX_DIM / 2];
    return ddt_drafter_config_rope(cfg, inv);
}

/* ------------------------------------------------------------------ target head */

struct ddt_drafter_head {
    ddt_checkpoint *ck;
    ddt_qweight embed;   /* [V][H] */
    ddt_qweight lm_head; /* [V][H] */
    ddt_drafter_target view;
};

ddt_status ddt_drafter_head_open(const char *target_dir, ddt_drafter_head **out, ddt_error *err) {
    if (!target_dir || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_drafter_head_open: NULL argument");
    *out = NULL;
    ddt_drafter_head *h = calloc(1, sizeof *h);
    if (!h) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    ddt_model_config cfg;
    ddt_status st = ddt_config_load(target_dir, &cfg, err);
    if (st != DDT_OK) {
        free(h);
        return st;
    }
    char name[NAME_MAX_LEN];
    if ((st = ddt_checkpoint_open(target_dir, &h->ck, err)) != DDT_OK) goto fail;
    snprintf(name, sizeof name, "%smodel.embed_tokens", cfg.tensor_prefix);
    if ((st = ddt_checkpoint_weight(h->ck, name, cfg.vocab_size, cfg.hidden_size, &h->embed, err)) != DDT_OK) goto fail;
    if (cfg.tie_word_embeddings) {
        h->lm_head = h->embed;
    } else {
        snprintf(name, sizeof name, "%slm_head", cfg.tensor_prefix);
        if ((st = ddt_checkpoint_weight(h->ck, name, cfg.vocab_size, cfg.hidden_size, &h->lm_head, err)) != DDT_OK)
            goto fail;
    }
    h->view = (ddt_drafter_target){.hidden_size = cfg.hidden_size, .num_layers = cfg.num_hidden_layers,
                                   .vocab_size = cfg.vocab_size, .embed = &h->embed, .lm_head = &h->lm_head};
    ddt_config_free(&cfg);
    *out = h;
    return DDT_OK;
fail:
    ddt_error_prefix(err, "target %s: ", target_dir);
    ddt_config_free(&cfg);
    ddt_drafter_head_close(h);
    return st;
}

void ddt_drafter_head_close(ddt_drafter_head *h) {
    if (!h) return;
    ddt_checkpoint_close(h->ck);
    free(h);
}

const ddt_drafter_target *ddt_drafter_head_target(const ddt_drafter_head *h) { return &h->view; }

/* ------------------------------------------------------------------ model */

struct ddt_drafter {
    ddt_drafter_desc desc;       /* config, dims and the weight views (drafter_desc.h) */
    ddt_drafter_target target;   /* borrowed views */
    ddt_cpu_pool *pool;
    bool own_pool;

    int32_t V, max_ctx;
    float rope_attn;

    /* context: rows [0, len) committed; rows [len, len + L) hold the block during a draft */
    int32_t len;
    int32_t cap;                 /* max_ctx + L */
    float *kv;                   /* [n_layers][2][cap][kvd]: K (normed, rotated) then V */
    int32_t *positions;          /* [max_ctx] position of each context row */

    /* run state */
    float *inv_freq;             /* [hd/2] */
    float *x, *xn, *tmp;         /* [L][H] */
    float *q, *o;                /* [L][heads*hd] */
    float *g, *u;                /* [L][inter] */
    float *cos_b, *sin_b;        /* [L][hd/2] */
    float *ctx;                  /* [APPEND_CHUNK][H] fc output, normed in place */
    float *feat;                 /* [APPEND_CHUNK][F] gathered features (append_rows) */
    float *cos_c, *sin_c;        /* [APPEND_CHUNK][hd/2] */
    int32_t *pos_c;              /* [APPEND_CHUNK] */
    uint64_t state_bytes;
};

static float *kv_k(const ddt_drafter *d, int32_t l, int32_t row) {
    return d->kv + (((size_t)l * 2 + 0) * (size_t)d->cap + (size_t)row) * (size_t)d->desc.dims.kvd;
}
static float *kv_v(const ddt_drafter *d, int32_t l, int32_t row) {
    return d->kv + (((size_t)l * 2 + 1) * (size_t)d->cap + (size_t)row) * (size_t)d->desc.dims.kvd;
}

static void *state_alloc(ddt_drafter *d, size_t n, size_t sz, bool *ok) {
    if (n == 0) n = 1;
    void *p = ddt_calloc_array(n, sz);
    if (!p) *ok = false;
    else d->state_bytes += (uint64_t)n * sz;
    return p;
}

static ddt_status alloc_state(ddt_drafter *d, ddt_error *err) {
    size_t L = (size_t)d->desc.dims.L, C = APPEND_CHUNK, half = (size_t)d->desc.dims.hd / 2;
    size_t kv_n, feat_n;
    if (!ddt_mul_size((size_t)d->desc.dims.n_layers * 2, (size_t)d->cap, &kv_n) || !ddt_mul_size(kv_n, (size_t)d->desc.dims.kvd, &kv_n) ||
        !ddt_mul_size(C, (size_t)d->desc.dims.F, &feat_n))
        return ddt_fail(err, DDT_ERR_RANGE, "drafter cache for %d tokens overflows", d->max_ctx);
    bool ok = true;
    d->kv = state_alloc(d, kv_n, sizeof(float), &ok);
    d->positions = state_alloc(d, (size_t)d->max_ctx, sizeof(int32_t), &ok);
    d->inv_freq = state_alloc(d, half, sizeof(float), &ok);
    d->x = state_alloc(d, L * (size_t)d->desc.dims.H, sizeof(float), &ok);
    d->xn = state_alloc(d, L * (size_t)d->desc.dims.H, sizeof(float), &ok);
    d->tmp = state_alloc(d, L * (size_t)d->desc.dims.H, sizeof(float), &ok);
    d->q = state_alloc(d, L * (size_t)d->desc.dims.qd, sizeof(float), &ok);
    d->o = state_alloc(d, L * (size_t)d->desc.dims.qd, sizeof(float), &ok);
    d->g = state_alloc(d, L * (size_t)d->desc.dims.inter, sizeof(float), &ok);
    d->u = state_alloc(d, L * (size_t)d->desc.dims.inter, sizeof(float), &ok);
    d->cos_b = state_alloc(d, L * half, sizeof(float), &ok);
    d->sin_b = state_alloc(d, L * half, sizeof(float), &ok);
    d->ctx = state_alloc(d, C * (size_t)d->desc.dims.H, sizeof(float), &ok);
    d->feat = state_alloc(d, feat_n, sizeof(float), &ok);
    d->cos_c = state_alloc(d, C * half, sizeof(float), &ok);
    d->sin_c = state_alloc(d, C * half, sizeof(float), &ok);
    d->pos_c = state_alloc(d, C, sizeof(int32_t), &ok);
    if (!ok) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the drafter state (%d context tokens)", d->max_ctx);
    return DDT_OK;
}

ddt_status ddt_drafter_load(const char *dir, const ddt_drafter_target *target, const ddt_drafter_options *opts,
                            ddt_drafter **out, ddt_error *err) {
    if (!dir || !target || !opts || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_drafter_load: NULL argument");
    *out = NULL;
    if (opts->max_ctx < 1 || opts->max_ctx > INT32_MAX - DDT_DRAFTER_MAX_BLOCK)
        return ddt_fail(err, DDT_ERR_INVALID, "drafter options: max_ctx %d must be >= 1", opts->max_ctx);
    ddt_drafter *d = calloc(1, sizeof *d);
    if (!d) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    ddt_status st = ddt_drafter_desc_load(dir, target, &d->desc, err);
    if (st != DDT_OK) goto fail;
    const ddt_drafter_config *c = &d->desc.cfg;
    d->target = *target;
    d->V = target->vocab_size;
    d->max_ctx = opts->max_ctx;
    d->cap = opts->max_ctx + d->desc.dims.L;
    if ((st = alloc_state(d, err)) != DDT_OK) goto fail;
    d->rope_attn = ddt_drafter_config_rope(c, d->inv_freq);
    if (opts->pool) {
        d->pool = opts->pool;
    } else {
        if ((st = ddt_cpu_pool_create(opts->n_threads, &d->pool, err)) != DDT_OK) goto fail;
        d->own_pool = true;
    }
    *out = d;
    return DDT_OK;
fail:
    ddt_error_prefix(err, "drafter %s: ", dir);
    ddt_drafter_free(d);
    return st;
}

void ddt_drafter_free(ddt_drafter *d) {
    if (!d) return;
    if (d->own_pool) ddt_cpu_pool_destroy(d->pool);
    void *bufs[] = {d->kv,  d->positions, d->inv_freq, d->x,     d->xn,    d->tmp,   d->q,   d->o,
                    d->g,   d->u,         d->cos_b,    d->sin_b, d->ctx,   d->feat,  d->cos_c,
                    d->sin_c, d->pos_c};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    ddt_drafter_desc_free(&d->desc);
    free(d);
}

const ddt_drafter_config *ddt_drafter_get_config(const ddt_drafter *d) { return &d->desc.cfg; }
int32_t ddt_drafter_block_size(const ddt_drafter *d) { return d->desc.dims.L; }
int32_t ddt_drafter_feature_dim(const ddt_drafter *d) { return d->desc.dims.F; }
int32_t ddt_drafter_vocab(const ddt_drafter *d) { return d->V; }
int32_t ddt_drafter_len(const ddt_drafter *d) { return d->len; }
int32_t ddt_drafter_max_ctx(const ddt_drafter *d) { return d->max_ctx; }
int32_t ddt_drafter_next_position(const ddt_drafter *d) { return d->len > 0 ? d->positions[d->len - 1] + 1 : 0; }
uint64_t ddt_drafter_state_bytes(const ddt_drafter *d) { return d->state_bytes; }

/* ------------------------------------------------------------------ forward */

/*
 * Normalise (per head) and rotate n rows of nh heads x hd values, packed (row
 * stride nh*hd), in place: Qwen3's q_norm/k_norm then RoPE (rotate_half), the
 * angles of row i in cs/sn [i][hd/2].
 */
static void norm_rope_heads(ddt_drafter *d, float *rows, int32_t n, int32_t nh, const ddt_cpu_vec *w,
                            const float *cs, const float *sn) {
    /* the CPU twin of the GPU's qkv_prep (packed rows, in place) */
    const int64_t width = (int64_t)nh * d->desc.dims.hd;
    ddt_cpu_dflash_norm_rope(d->pool, rows, width, n, nh, d->desc.dims.hd, w, d->desc.dims.eps, cs, sn, rows, width);
}

/* K/V of n context tokens (ctx [n][H], normed) into cache rows len..len+n-1 of every layer. */
static void context_kv(ddt_drafter *d, const float *ctx, int32_t n, const int32_t *pos) {
    const int32_t half = d->desc.dims.hd / 2;
    for (int32_t i = 0; i < n; i++)
        ddt_cpu_rope_cos_sin(d->inv_freq, half, pos[i], d->rope_attn, d->cos_c + (size_t)i * half,
                             d->sin_c + (size_t)i * half);
    for (int32_t l = 0; l < d->desc.dims.n_layers; l++) {
        const ddt_drafter_layer *Y = &d->desc.layers[l];
        float *k = kv_k(d, l, d->len), *v = kv_v(d, l, d->len);
        ddt_cpu_matmul(d->pool, &Y->k_proj, ctx, d->desc.dims.H, n, k, d->desc.dims.kvd);
        norm_rope_heads(d, k, n, d->desc.dims.kv_heads, &Y->k_norm, d->cos_c, d->sin_c);
        ddt_cpu_matmul(d->pool, &Y->v_proj, ctx, d->desc.dims.H, n, v, d->desc.dims.kvd);
    }
}

/* One chunk (n <= APPEND_CHUNK) of features [n][F] (row stride ldf) at positions pos. */
static void append_chunk(ddt_drafter *d, const float *features, int64_t ldf, int32_t n, const int32_t *pos) {
    ddt_cpu_matmul(d->pool, &d->desc.fc, features, ldf, n, d->ctx, d->desc.dims.H);
    ddt_cpu_rmsnorm(d->pool, d->ctx, d->desc.dims.H, n, d->desc.dims.H, &d->desc.hidden_norm, d->desc.dims.eps, d->ctx, d->desc.dims.H);
    context_kv(d, d->ctx, n, pos);
    memcpy(d->positions + d->len, pos, sizeof(int32_t) * (size_t)n);
    d->len += n;
}

static ddt_status check_append(const ddt_drafter *d, int32_t m, ddt_error *err) {
    if (m < 0) return ddt_fail(err, DDT_ERR_INVALID, "drafter append: %d tokens", m);
    if ((int64_t)d->len + m > d->max_ctx)
        return ddt_fail(err, DDT_ERR_RANGE, "drafter append: %d cached + %d new tokens exceed the context of %d",
                        d->len, m, d->max_ctx);
    return DDT_OK;
}

ddt_status ddt_drafter_append_context(ddt_drafter *d, const float *features, const int32_t *positions, int32_t m,
                                      ddt_error *err) {
    ddt_status st = check_append(d, m, err);
    if (st != DDT_OK || m == 0) return st;
    if (!features || !positions) return ddt_fail(err, DDT_ERR_INVALID, "drafter append: NULL features or positions");
    int64_t prev = d->len > 0 ? d->positions[d->len - 1] : -1;
    for (int32_t i = 0; i < m; i++) {
        if (positions[i] <= prev || positions[i] > MAX_POSITION)
            return ddt_fail(err, DDT_ERR_INVALID,
                            "drafter append: position %d (token %d) must exceed the previous position %lld and be <= %d",
                            positions[i], i, (long long)prev, MAX_POSITION);
        prev = positions[i];
    }
    for (int32_t i = 0; i < m; i += APPEND_CHUNK) {
        int32_t n = m - i < APPEND_CHUNK ? m - i : APPEND_CHUNK;
        append_chunk(d, features + (size_t)i * d->desc.dims.F, d->desc.dims.F, n, positions + i);
    }
    return DDT_OK;
}

ddt_status ddt_drafter_append_rows(ddt_drafter *d, const float *const *layers, int32_t n_rows, const int32_t *rows,
                                   int32_t m, ddt_error *err) {
    ddt_status st = check_append(d, m, err);
    if (st != DDT_OK || m == 0) return st;
    if (!layers || !rows) return ddt_fail(err, DDT_ERR_INVALID, "drafter append: NULL layers or rows");
    for (int32_t i = 0; i < d->desc.cfg.n_target_layers; i++)
        if (!layers[i]) return ddt_fail(err, DDT_ERR_INVALID, "drafter append: feature layer %d is NULL", i);
    for (int32_t k = 0; k < m; k++)
        if (rows[k] < 0 || rows[k] >= n_rows)
            return ddt_fail(err, DDT_ERR_INVALID, "drafter append: rows[%d] = %d outside 0..%d", k, rows[k], n_rows - 1);
    int32_t next = ddt_drafter_next_position(d);
    if ((int64_t)next + m - 1 > MAX_POSITION)
        return ddt_fail(err, DDT_ERR_RANGE, "drafter append: positions beyond %d", MAX_POSITION);
    for (int32_t i = 0; i < m; i += APPEND_CHUNK) {
        int32_t n = m - i < APPEND_CHUNK ? m - i : APPEND_CHUNK;
        /* feature row k = [layer 0 row | layer 1 row | ...] of token rows[i + k] */
        for (int32_t s = 0; s < d->desc.cfg.n_target_layers; s++)
            ddt_cpu_gather_rows(d->feat + (size_t)s * d->desc.dims.H, d->desc.dims.F, layers[s], d->desc.dims.H,
                                rows + i, n, d->desc.dims.H);
        for (int32_t k = 0; k < n; k++) d->pos_c[k] = next + i + k;
        append_chunk(d, d->feat, d->desc.dims.F, n, d->pos_c);
    }
    return DDT_OK;
}

ddt_status ddt_drafter_rollback(ddt_drafter *d, int32_t new_len, ddt_error *err) {
    if (new_len < 0 || new_len > d->len)
        return ddt_fail(err, DDT_ERR_INVALID, "drafter rollback: new length %d outside 0..%d", new_len, d->len);
    d->len = new_len;
    return DDT_OK;
}

ddt_status ddt_drafter_draft(ddt_drafter *d, int32_t bonus, float *logits, ddt_error *err) {
    if (!logits) return ddt_fail(err, DDT_ERR_INVALID, "drafter draft: NULL logits");
    if (bonus < 0 || bonus >= d->V)
        return ddt_fail(err, DDT_ERR_INVALID, "drafter draft: bonus token %d outside the vocabulary 0..%d", bonus,
                        d->V - 1);
    const int32_t H = d->desc.dims.H, L = d->desc.dims.L, half = d->desc.dims.hd / 2, p0 = ddt_drafter_next_position(d);
    for (int32_t i = 0; i < L; i++) {
        int32_t id = i == 0 ? bonus : d->desc.cfg.mask_token_id;
        ddt_cpu_dequant(d->target.embed, id, 0, H, d->x + (size_t)i * H);
        ddt_cpu_rope_cos_sin(d->inv_freq, half, (int64_t)p0 + i, d->rope_attn, d->cos_b + (size_t)i * half,
                             d->sin_b + (size_t)i * half);
    }
    for (int32_t l = 0; l < d->desc.dims.n_layers; l++) {
        const ddt_drafter_layer *Y = &d->desc.layers[l];
        ddt_cpu_rmsnorm(d->pool, d->x, H, L, H, &Y->attn_norm, d->desc.dims.eps, d->xn, H);
        ddt_cpu_matmul(d->pool, &Y->q_proj, d->xn, H, L, d->q, d->desc.dims.qd);
        norm_rope_heads(d, d->q, L, d->desc.dims.heads, &Y->q_norm, d->cos_b, d->sin_b);
        /* block K/V in the scratch rows after the context */
        float *k = kv_k(d, l, d->len), *v = kv_v(d, l, d->len);
        ddt_cpu_matmul(d->pool, &Y->k_proj, d->xn, H, L, k, d->desc.dims.kvd);
        norm_rope_heads(d, k, L, d->desc.dims.kv_heads, &Y->k_norm, d->cos_b, d->sin_b);
        ddt_cpu_matmul(d->pool, &Y->v_proj, d->xn, H, L, v, d->desc.dims.kvd);
        /* non-causal GQA attention of the block's queries over all rows [0, len + L) */
        ddt_cpu_dflash_attn att = {.n_block = L, .heads = d->desc.dims.heads, .kv_heads = d->desc.dims.kv_heads,
                                   .hd = d->desc.dims.hd, .scale = d->desc.dims.scale, .q = d->q,
                                   .k = kv_k(d, l, 0), .v = kv_v(d, l, 0), .n_rows = (int64_t)d->len + L, .o = d->o};
        ddt_cpu_dflash_attention(d->pool, &att);
        ddt_cpu_matmul(d->pool, &Y->o_proj, d->o, d->desc.dims.qd, L, d->tmp, H);
        ddt_cpu_add(d->x, d->tmp, (int64_t)L * H);
        ddt_cpu_rmsnorm(d->pool, d->x, H, L, H, &Y->mlp_norm, d->desc.dims.eps, d->xn, H);
        ddt_cpu_matmul(d->pool, &Y->gate, d->xn, H, L, d->g, d->desc.dims.inter);
        ddt_cpu_matmul(d->pool, &Y->up, d->xn, H, L, d->u, d->desc.dims.inter);
        ddt_cpu_silu_mul(d->pool, d->g, d->desc.dims.inter, d->u, d->desc.dims.inter, L, d->desc.dims.inter);
        ddt_cpu_matmul(d->pool, &Y->down, d->g, d->desc.dims.inter, L, d->tmp, H);
        ddt_cpu_add(d->x, d->tmp, (int64_t)L * H);
    }
    /* only positions 1..L-1 are drafts */
    ddt_cpu_rmsnorm(d->pool, d->x + H, H, L - 1, H, &d->desc.final_norm, d->desc.dims.eps, d->xn, H);
    ddt_cpu_matmul(d->pool, d->target.lm_head, d->xn, H, L - 1, logits, d->V);
    return DDT_OK;
}
