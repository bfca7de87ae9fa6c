/*
 * shard.c — the multi-GPU split of a target (see shard.h): which heads and
 * experts a rank owns, and row / column slices of quantised weight views.
 */
#include "model/shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

static bool model_has_moe(const ddt_model_config *cfg) {
    for (int32_t l = 0; l < cfg->num_hidden_layers; l++)
        if (ddt_config_layer_is_moe(cfg, l)) return true;
    return false;
}

ddt_status ddt_shard_plan(const ddt_model_config *cfg, int32_t rank, int32_t world, ddt_shard *out, ddt_error *err) {
    if (!cfg || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_shard_plan: NULL argument");
    if (world < 1 || world > DDT_SHARD_MAX_WORLD)
        return ddt_fail(err, DDT_ERR_RANGE, "--gpus %d: the number of GPUs must be 1..%d", world, DDT_SHARD_MAX_WORLD);
    if (rank < 0 || rank >= world)
        return ddt_fail(err, DDT_ERR_RANGE, "rank %d outside 0..%d of %d GPUs", rank, world - 1, world);
    const int32_t H = cfg->num_attention_heads;
    if (H < 1) return ddt_fail(err, DDT_ERR_INVALID, "model has %d attention heads", H);
    memset(out, 0, sizeof *out);
    out->rank = rank;
    out->world = world;
    out->split_heads = H % world == 0;
    out->head0 = out->split_heads ? rank * (H / world) : 0;
    out->n_heads = out->split_heads ? H / world : H;
    if (model_has_moe(cfg)) {
        const int64_t E = cfg->n_routed_experts;
        if (E < world)
            return ddt_fail(err, DDT_ERR_RANGE,
                            "--gpus %d: the model has %lld routed experts, fewer than the GPUs (each GPU must hold "
                            "at least one)", world, (long long)E);
        out->expert0 = (int32_t)((int64_t)rank * E / world);
        out->n_experts = (int32_t)((int64_t)(rank + 1) * E / world) - out->expert0;
    }
    return DDT_OK;
}

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        const int64_t t = a % b;
        a = b, b = t;
    }
    return a;
}

static int64_t lcm64(int64_t a, int64_t b) { return a < 1 ? b : b < 1 ? a : a / gcd64(a, b) * b; }

int64_t ddt_shard_mlp_unit_of(ddt_qformat f, int64_t block) {
    return f == DDT_Q_FP8_BLOCK || f == DDT_Q_INT4_GROUP ? lcm64(DDT_SHARD_MLP_UNIT, block) : DDT_SHARD_MLP_UNIT;
}

int64_t ddt_shard_mlp_unit(const ddt_cpu_mlp *m) {
    int64_t u = DDT_SHARD_MLP_UNIT;
    /* rows of gate and up: FP8's blocks (INT4 groups run along a row); columns of down: both */
    if (m->gate.format == DDT_Q_FP8_BLOCK) u = lcm64(u, m->gate.block);
    if (m->up.format == DDT_Q_FP8_BLOCK) u = lcm64(u, m->up.block);
    if (m->down.format == DDT_Q_FP8_BLOCK) u = lcm64(u, m->down.block);
    if (m->down.format == DDT_Q_INT4_GROUP) u = lcm64(u, m->down.group);
    return u;
}

void ddt_shard_mlp_slice(const ddt_shard *s, int64_t inter, int64_t unit, int64_t *i0, int64_t *n) {
    *i0 = 0, *n = inter;
    if (!s || s->world <= 1) return;
    const int64_t per = inter / s->world;
    if (inter % s->world == 0 && unit > 0 && per % unit == 0 && per > 0) {
        *i0 = (int64_t)s->rank * per, *n = per;
    } else if (s->rank != 0) {
        *n = 0;
    }
}

void ddt_shard_vocab_slice(const ddt_shard *s, int64_t vocab, int64_t *v0, int64_t *n, bool *split) {
    *v0 = 0, *n = vocab, *split = false;
    if (!s || s->world <= 1 || vocab % s->world != 0) return;
    const int64_t per = vocab / s->world;
    if (per < 1 || per % DDT_SHARD_VOCAB_UNIT != 0) return;
    *v0 = (int64_t)s->rank * per, *n = per, *split = true;
}

/* Bytes of one element row of data (INT4: packed int32 words). */
static size_t data_row_bytes(const ddt_qweight *w, int64_t cols) {
    if (w->format == DDT_Q_INT4_GROUP) return (size_t)((cols + 7) / 8) * 4;
    return (size_t)cols * ddt_dtype_size(w->dtype);
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static ddt_status check_range(const char *what, int64_t a, int64_t n, int64_t limit, ddt_error *err) {
    if (a < 0 || n < 1 || a > limit - n)
        return ddt_fail(err, DDT_ERR_RANGE, "shard: %s [%lld, %lld) outside [0, %lld)", what, (long long)a,
                        (long long)(a + n), (long long)limit);
    return DDT_OK;
}

/* The slice [a, a + n) of a dimension of length len cut in units of `unit`. */
static ddt_status check_aligned(const char *what, int64_t a, int64_t n, int64_t len, int64_t unit, ddt_error *err) {
    if (unit > 1 && (a % unit != 0 || ((a + n) % unit != 0 && a + n != len)))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "shard: %s [%lld, %lld) of a quantised weight does not fall on its %lld-element blocks",
                        what, (long long)a, (long long)(a + n), (long long)unit);
    return DDT_OK;
}

ddt_status ddt_shard_rows(const ddt_qweight *w, int64_t r0, int64_t n, ddt_qweight *out, ddt_error *err) {
    ddt_status st = check_range("rows", r0, n, w->rows, err);
    if (st != DDT_OK) return st;
    *out = *w;
    out->rows = n;
    out->data = (const uint8_t *)w->data + (size_t)r0 * data_row_bytes(w, w->cols);
    if (w->format == DDT_Q_FP8_BLOCK) {
        if ((st = check_aligned("rows", r0, n, w->rows, w->block, err)) != DDT_OK) return st;
        out->scale_inv = w->scale_inv + (size_t)(r0 / w->block) * (size_t)ceil_div(w->cols, w->block);
    } else if (w->format == DDT_Q_INT4_GROUP) {
        out->scale = w->scale + (size_t)r0 * (size_t)ceil_div(w->cols, w->group);
    }
    return DDT_OK;
}

ddt_status ddt_shard_cols(const ddt_qweight *w, int64_t c0, int64_t n, ddt_qweight *out, void **buf,
                          ddt_error *err) {
    *buf = NULL;
    ddt_status st = check_range("columns", c0, n, w->cols, err);
    if (st != DDT_OK) return st;
    const int64_t unit = w->format == DDT_Q_FP8_BLOCK ? w->block : w->format == DDT_Q_INT4_GROUP ? w->group : 1;
    if ((st = check_aligned("columns", c0, n, w->cols, unit, err)) != DDT_OK) return st;
    const size_t src_row = data_row_bytes(w, w->cols), dst_row = data_row_bytes(w, n);
    const size_t src_off = data_row_bytes(w, c0); /* c0 is a multiple of 8 for INT4 (group 32) */
    size_t data_bytes, scale_bytes = 0, total;
    if (!ddt_mul_size((size_t)w->rows, dst_row, &data_bytes))
        return ddt_fail(err, DDT_ERR_RANGE, "shard: column slice size overflows");
    int64_t s_rows = 0, s_src = 0, s_dst = 0, s_off = 0; /* scale grid: rows, row lengths, first column */
    size_t s_elem = 0;
    if (w->format == DDT_Q_FP8_BLOCK) {
        s_rows = ceil_div(w->rows, w->block), s_src = ceil_div(w->cols, w->block), s_dst = ceil_div(n, w->block);
        s_off = c0 / w->block, s_elem = sizeof(float);
    } else if (w->format == DDT_Q_INT4_GROUP) {
        s_rows = w->rows, s_src = ceil_div(w->cols, w->group), s_dst = ceil_div(n, w->group);
        s_off = c0 / w->group, s_elem = sizeof(uint16_t);
    }
    if (s_elem && !ddt_mul_size((size_t)s_rows * (size_t)s_dst, s_elem, &scale_bytes))
        return ddt_fail(err, DDT_ERR_RANGE, "shard: column slice size overflows");
    /* scales first, padded to 16 bytes: INT4 data is read as 32-bit words (and by the
     * GPU as 16-byte vectors), while INT4 scales are 2-byte and FP8 data may be odd */
    scale_bytes = (scale_bytes + 15) & ~(size_t)15;
    total = scale_bytes + data_bytes;
    uint8_t *p = malloc(total ? total : 1);
    if (!p) return ddt_fail(err, DDT_ERR_NOMEM, "shard: out of memory for a %zu-byte column slice", total);
    const uint8_t *src = w->data;
    uint8_t *dst = p + scale_bytes;
    for (int64_t r = 0; r < w->rows; r++)
        memcpy(dst + (size_t)r * dst_row, src + (size_t)r * src_row + src_off, dst_row);
    *out = *w;
    out->cols = n;
    out->data = dst;
    if (s_elem) {
        const uint8_t *ssrc = w->format == DDT_Q_FP8_BLOCK ? (const uint8_t *)w->scale_inv : (const uint8_t *)w->scale;
        for (int64_t r = 0; r < s_rows; r++)
            memcpy(p + (size_t)(r * s_dst) * s_elem, ssrc + (size_t)(r * s_src + s_off) * s_elem,
                   (size_t)s_dst * s_elem);
        if (w->format == DDT_Q_FP8_BLOCK) out->scale_inv = (const float *)p;
        else out->scale = (const uint16_t *)p;
    }
    *buf = p;
    return DDT_OK;
}

/* ------------------------------------------------------------------ memory */

/* A weight's bytes as stored: values (INT4: packed words) and scales. */
static uint64_t stored_bytes(const ddt_qweight *w) {
    const uint64_t rows = (uint64_t)w->rows;
    uint64_t b = rows * (uint64_t)data_row_bytes(w, w->cols);
    if (w->format == DDT_Q_FP8_BLOCK)
        b += sizeof(float) * (uint64_t)ceil_div(w->rows, w->block) * (uint64_t)ceil_div(w->cols, w->block);
    else if (w->format == DDT_Q_INT4_GROUP)
        b += sizeof(uint16_t) * rows * (uint64_t)ceil_div(w->cols, w->group);
    return b;
}

/* rows [.., + n) or columns [.., + n) of w: what ddt_shard_rows / _cols make of it */
static uint64_t rows_bytes(const ddt_qweight *w, int64_t n) {
    ddt_qweight v = *w;
    v.rows = n;
    return stored_bytes(&v);
}

static uint64_t cols_bytes(const ddt_qweight *w, int64_t n) {
    ddt_qweight v = *w;
    v.cols = n;
    return stored_bytes(&v);
}

static uint64_t vec_bytes(const ddt_cpu_vec *v) { return (uint64_t)v->n * ddt_dtype_size(v->dtype); }

uint64_t ddt_shard_stored_bytes(const ddt_qweight *w) { return stored_bytes(w); }
uint64_t ddt_shard_vec_bytes(const ddt_cpu_vec *v) { return vec_bytes(v); }

static uint64_t mlp_bytes(const ddt_cpu_mlp *m) {
    return stored_bytes(&m->gate) + stored_bytes(&m->up) + stored_bytes(&m->down);
}

/* rank s's slice of m (ddt_shard_mlp_slice): n rows of gate and up, n columns of down */
static uint64_t mlp_slice_bytes(const ddt_cpu_mlp *m, const ddt_shard *s) {
    int64_t i0, n;
    ddt_shard_mlp_slice(s, m->gate.rows, ddt_shard_mlp_unit(m), &i0, &n);
    if (n == m->gate.rows) return mlp_bytes(m);
    return n == 0 ? 0 : rows_bytes(&m->gate, n) + rows_bytes(&m->up, n) + cols_bytes(&m->down, n);
}

void ddt_shard_weight_bytes(const ddt_target_desc *d, const ddt_shard *s, ddt_shard_bytes *out) {
    memset(out, 0, sizeof *out);
    const ddt_target_dims *D = &d->dims;
    /* the heads and experts this rank uploads (target_cuda.c's upload_layer) */
    const int64_t heads = s ? s->n_heads : D->heads;
    const int32_t e0 = s ? s->expert0 : 0, ne = s ? s->n_experts : D->n_experts;
    out->embed = stored_bytes(&d->embed) + vec_bytes(&d->final_norm);
    if (!d->cfg.tie_word_embeddings) out->embed += stored_bytes(&d->lm_head);
    for (int32_t l = 0; l < D->n_layers; l++) {
        const ddt_target_layer *L = &d->layers[l];
        uint64_t a = vec_bytes(&L->attn_norm) + vec_bytes(&L->mlp_norm) + stored_bytes(&L->kv_a) +
                     vec_bytes(&L->kv_a_norm) + rows_bytes(&L->kv_b, heads * (D->nope + D->vdim)) +
                     cols_bytes(&L->o_proj, heads * D->vdim);
        if (D->q_lora > 0) a += stored_bytes(&L->q_a) + vec_bytes(&L->q_a_norm) + rows_bytes(&L->q_b, heads * D->qdim);
        else a += rows_bytes(&L->q_proj, heads * D->qdim);
        out->attention += a;
        if (!L->moe) {
            out->dense += mlp_slice_bytes(&L->mlp, s);
            continue;
        }
        out->router += stored_bytes(&L->router) + vec_bytes(&L->router_bias);
        for (int32_t e = e0; e < e0 + ne; e++) out->routed += mlp_bytes(&L->experts[e]);
        if (L->has_shared) out->dense += mlp_slice_bytes(&L->shared, s);
    }
    out->total = out->embed + out->attention + out->router + out->dense + out->routed;
}

uint64_t ddt_shard_kv_bytes(const ddt_target_dims *dims, int64_t max_ctx, int32_t kv_elem) {
    return (uint64_t)dims->n_layers * (uint64_t)(max_ctx > 0 ? max_ctx : 0) * (uint64_t)(dims->rank + dims->rope) *
           (uint64_t)kv_elem;
}

const char *ddt_shard_fmt_bytes(char *buf, size_t cap, uint64_t n, int decimals) {
    const double v = (double)n;
    if (v >= 1024.0 * 1024 * 1024) snprintf(buf, cap, "%.*f GiB", decimals, v / (1024.0 * 1024 * 1024));
    else if (v >= 1024.0 * 1024) snprintf(buf, cap, "%.*f MiB", decimals, v / (1024.0 * 1024));
    else snprintf(buf, cap, "%.*f KiB", decimals, v / 1024.0);
    return buf;
}

/* a message's figures: one decimal */
static const char *fmt_bytes(char *buf, size_t cap, uint64_t n) { return ddt_shard_fmt_bytes(buf, cap, n, 1); }

/* The largest weight bytes of any rank of `world` (0 when world is not a valid split). */
static uint64_t world_max_bytes(const ddt_target_desc *d, int32_t world) {
    uint64_t most = 0;
    for (int32_t r = 0; r < world; r++) {
        ddt_shard s;
        ddt_error e;
        if (ddt_shard_plan(&d->cfg, r, world, &s, &e) != DDT_OK) return 0;
        ddt_shard_bytes b;
        ddt_shard_weight_bytes(d, &s, &b);
        if (b.total > most) most = b.total;
    }
    return most;
}

ddt_status ddt_shard_memory_check(const ddt_target_desc *d, const ddt_shard *s, int64_t max_ctx, int32_t kv_elem,
                                  uint64_t also, uint64_t free_bytes, int32_t device, ddt_error *err) {
    ddt_shard_bytes b;
    ddt_shard_weight_bytes(d, s, &b);
    /* beside its weights every rank holds the whole cache and `also` */
    const uint64_t per_pos = ddt_shard_kv_bytes(&d->dims, 1, kv_elem), cache = per_pos * (uint64_t)max_ctx;
    const uint64_t beside_w = cache + also;
    if (b.total + beside_w <= free_bytes) return DDT_OK;
    char f[32], n[32], w[32], r[32], o[32], k[32], x[32];
    const uint64_t other = b.embed + b.attention + b.router + b.dense;
    /* what would fit: more GPUs (each holds less of the weights, the whole cache), or
       on these GPUs a shorter context where the weights alone fit */
    char advice[192] = "";
    int32_t fit = 0, tried = s ? s->world : 1;
    uint64_t fit_need = 0;
    for (int32_t g = tried + 1; g <= DDT_SHARD_MAX_WORLD && !fit; g++) {
        const uint64_t m = world_max_bytes(d, g);
        if (m == 0) break; /* more GPUs than routed experts: no larger split either */
        tried = g;
        if (m + beside_w <= free_bytes) fit = g, fit_need = m + beside_w;
    }
    const uint64_t ctx_fit = b.total + also < free_bytes ? (free_bytes - b.total - also) / per_pos : 0;
    if (fit)
        snprintf(advice, sizeof advice, "; --gpus %d would need at least %s a GPU", fit,
                 fmt_bytes(x, sizeof x, fit_need));
    if (ctx_fit >= 1) {
        const size_t used = strlen(advice);
        snprintf(advice + used, sizeof advice - used, "%s --ctx %llu would fit", fit ? ", or" : ";",
                 (unsigned long long)ctx_fit);
    }
    if (!fit && ctx_fit < 1)
        snprintf(advice, sizeof advice, "; no split over up to %d GPUs (the most this model splits over) fits "
                 "GPUs with this much free memory", tried);
    char who[48] = "", beside[64] = "", a[32];
    if (s && s->world > 1) snprintf(who, sizeof who, " (rank %d of %d)", s->rank, s->world);
    if (also) snprintf(beside, sizeof beside, ", and the drafter's %s", fmt_bytes(a, sizeof a, also));
    return ddt_fail(err, DDT_ERR_NOMEM,
                    "GPU %d has %s free, but the target%s needs at least %s there: weights %s as stored (routed "
                    "experts %s, the rest %s), a KV cache of %s (%lld positions x %d layers x %d values of %d "
                    "bytes)%s%s",
                    device, fmt_bytes(f, sizeof f, free_bytes), who, fmt_bytes(n, sizeof n, b.total + beside_w),
                    fmt_bytes(w, sizeof w, b.total), fmt_bytes(r, sizeof r, b.routed), fmt_bytes(o, sizeof o, other),
                    fmt_bytes(k, sizeof k, cache), (long long)max_ctx, d->dims.n_layers,
                    d->dims.rank + d->dims.rope, kv_elem, beside, advice);
}
