/*
 * drafter_cuda.c — the DFlash drafter on the GPU (see drafter_cuda.h): loads the
 * weights to the device and launches, per step, the same sequence of operations
 * as the CPU drafter (model/drafter.c):
 *
 * append (n = max_m or a prefix chunk rows; only the first m are stored):
 *   feat = gather(layers, rows)  ctx = hidden_norm(fc(feat))
 *   every layer: K = k_norm(k_proj(ctx)) per head, V = v_proj(ctx),
 *                cache rows len + k <- RoPE(K) at position len + k, V
 *   len += m
 * draft (L rows):
 *   x = embed([bonus, MASK...]); per layer:
 *     h = rmsnorm(x); q = RoPE(q_norm(q_proj(h))); block K/V -> cache rows len..len+L-1
 *     x += o_proj(attention(q, cache rows [0, len + L)))
 *     x += down(silu(gate(h2)) * up(h2)),  h2 = rmsnorm(x)
 *   logits = lm_head(norm(x[1..L-1]))
 * Every op computes a row from that row alone with a fixed order (qmatmul_cuda.h,
 * nn_cuda.h, dflash_cuda.h), so a token's cache rows are bitwise the same
 * however appends are chunked.
 *
 * The tiny drafters are launch-bound (a few microseconds a kernel whatever its
 * size), so the steps above run fused: the projections that read the same input
 * are one product over row-stacked weights (k, v, q; gate, up), the per-head
 * norms, RoPE and the K/V store are one kernel (ddt_dflash_qkv_prep), and every
 * residual add runs with the norm after it (ddt_cuda_add_rmsnorm; the last
 * layer's with the final norm), and gate and up, their rows interleaved at load,
 * are one product that writes silu(gate) * up itself (ddt_cuda_matmul_swiglu),
 * which down reads plainly (FP8, whose scale blocks do not interleave, keeps the
 * stacked gate | up, silu_mul and down).
 * The append's layers all read the same ctx, so it runs them together: the
 * target layers' rows in one gather (ddt_cuda_gather_rows_multi), every layer's
 * k | v in one product over a second stack of those rows (kv_all, built at
 * load from each layer's k | v prefix), every layer's K/V store in one
 * qkv_prep launch (its `layers`).
 * Draft: 8 launches per layer (was 18; 9 before the interleaved gate | up).
 * Append, with up to 8 target layers and 8 layers: gather (append_rows clamps
 * its path rows inside it), fc, hidden_norm, k | v, qkv_prep (whose last block
 * advances len): 5 launches whatever the layer count (was 7 with a separate
 * clamp and advance; 4 + 2 per target layer and layer before that, 16 for the
 * 4 + 4 of the shipped drafter).
 */
#include "model/drafter_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/rope.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dflash_cuda.h"
#include "backend/cuda/kv_cuda.h"
#include "backend/cuda/nn_cuda.h"
#include "backend/cuda/wgmma_gemm.h"
#include "core/alloc.h"
#include "core/error.h"
#include "model/drafter_desc.h"

/* Rows per attention split: the attention kernel's own (ddt_dflash_attn_split_hint:
 * a 32-row tile for each of its warps, 256 rows at the shipped drafter's head_dim
 * of 64, so a context that short takes one block per column and no merge); very
 * long contexts get longer splits, whole tiles, so the partial-result scratch and
 * the last split's merge stay within ATTN_MAX_SPLITS splits. */
#define ATTN_MAX_SPLITS 128

#define TRY(call)                                \
    do {                                         \
        ddt_status st_ = (call);                 \
        if (st_ != DDT_OK) return st_;           \
    } while (0)

/* Projections of one input computed as one product: their weights stacked by
 * rows (ddt_cuda_qweight_concat_rows) when the format allows, so y holds part
 * 0's outputs, then part 1's, ... in its columns.  When it does not (FP8 parts
 * off whole scale blocks), the parts stay separate and write the same columns,
 * one product each.  The FP32 matmul path sums an element in an order that
 * depends only on the weight's columns, so the stacked product is bitwise the
 * separate ones (a tensor-core product is not: its k-split follows the row count;
 * it stays batch-invariant, which is what the drafter needs). */
#define CAT_MAX 3
typedef struct cat_linear {
    int64_t rows[CAT_MAX];     /* rows of each part */
    ddt_qweight part[CAT_MAX]; /* device weights [rows[i]][cols]; empty once stacked */
    ddt_qweight whole;         /* [sum rows][cols] stacked copy; data NULL when not stacked */
} cat_linear;

typedef struct cuda_layer {
    float *attn_norm, *mlp_norm; /* [H] */
    float *q_norm, *k_norm;      /* [hd] */
    cat_linear kvq;              /* k_proj, v_proj, q_proj: [kvd | kvd | qd] outputs */
    cat_linear gu;               /* gate_proj, up_proj: [inter | inter] outputs (when not paired) */
    ddt_qweight gu_pair;         /* gate_proj, up_proj rows interleaved (ddt_cuda_qweight_interleave_rows):
                                    ddt_cuda_matmul_swiglu writes silu(gate) * up; data NULL when the
                                    format does not interleave (FP8), then gu */
    ddt_qweight o_proj, down;
} cuda_layer;

struct ddt_cuda_drafter {
    ddt_drafter_config cfg;
    ddt_cuda_drafter_target target; /* borrowed device weights */
    bool tc;                        /* target.mm is DDT_CUDA_MM_TENSOR: bf16 products on wgmma (mm) */
    uint64_t tc_min;                /* the least weight bytes a product on wgmma has (tensor_min_bytes) */
    void *mm_ws;                    /* tc: the products' split activations (ddt_cuda_matmul_workspace_bytes) */
    size_t mm_ws_bytes;
    ddt_drafter_dims dims;          /* drafter_desc.h */
    int32_t V, max_ctx, cap;
    ddt_dflash_attn attn;

    ddt_qweight fc;            /* [H][F] */
    ddt_qweight kv_all;        /* [n_layers * 2 kvd][H]: layer 0's k_proj, v_proj rows, then layer 1's, ...
                                  (the append's one product); data NULL when the layers' kvq are not stacked */
    float *hidden_norm;        /* [H] */
    float *final_norm;         /* [H] */
    cuda_layer *layers;        /* host array [n_layers] of device weights */
    uint64_t weight_bytes, state_bytes;

    /* device state */
    float *kv;                 /* [n_layers][2][cap][kvd]: K (normed, rotated) then V */
    float *cos_t, *sin_t;      /* [cap][hd/2] */
    int32_t *len, *status;     /* [1] each */
    uint32_t *advance_ticket;  /* [1], 0 between launches: the append's qkv_prep advances len (dflash_cuda.h) */
    int32_t *ids;              /* [L]: MASK (row 0 read as the bonus) */
    int32_t *iota;             /* [PREFIX_CHUNK] 0, 1, ... */
    float *feat;               /* [PREFIX_CHUNK][F] */
    float *ctx;                /* [PREFIX_CHUNK][H] */
    float *kvq;                /* [L][2 kvd + qd]: the draft's raw k | v | q projections */
    float *kv_raw;             /* [PREFIX_CHUNK][n_layers * 2 kvd]: the append's raw k | v of every layer */
    float *x, *xn, *tmp;       /* [L][H] */
    float *q, *o;              /* [L][qd]: normed, rotated queries; attention output */
    float *gu;                 /* [L][2 inter]: gate | up (the down product computes silu(gate) * up) */
    float *attn_scratch;       /* ddt_dflash_attn_scratch_floats */
};

static float *kv_k(const ddt_cuda_drafter *d, int32_t l) {
    return d->kv + ((size_t)l * 2 + 0) * (size_t)d->cap * (size_t)d->dims.kvd;
}
static float *kv_v(const ddt_cuda_drafter *d, int32_t l) {
    return d->kv + ((size_t)l * 2 + 1) * (size_t)d->cap * (size_t)d->dims.kvd;
}

/* ------------------------------------------------------------------ load */

/* Upload one weight view of the description; `what` (and layer l >= 0) names it
 * in a failure. */
static ddt_status upload_linear(ddt_cuda_drafter *d, const ddt_qweight *host, const char *what, int32_t l,
                                ddt_qweight *w, ddt_error *err) {
    ddt_status st = ddt_cuda_qweight_upload(host, w, err);
    if (st != DDT_OK) {
        memset(w, 0, sizeof *w);
        if (l >= 0) ddt_error_prefix(err, "layer %d %s: ", l, what);
        else ddt_error_prefix(err, "%s: ", what);
        return st;
    }
    d->weight_bytes += ddt_cuda_qweight_bytes(w);
    return DDT_OK;
}

static ddt_status upload_vec(ddt_cuda_drafter *d, const ddt_cpu_vec *v, const char *what, int32_t l, float **out,
                             ddt_error *err) {
    ddt_status st = ddt_cuda_vec_upload(v->data, v->dtype, v->n, out, err);
    if (st != DDT_OK) {
        *out = NULL;
        if (l >= 0) ddt_error_prefix(err, "layer %d %s: ", l, what);
        else ddt_error_prefix(err, "%s: ", what);
        return st;
    }
    d->weight_bytes += (uint64_t)v->n * sizeof(float);
    return DDT_OK;
}

/* Upload the parts of a cat_linear and stack them when their format allows (the
 * device holds both copies for a moment, at load only). */
static ddt_status upload_cat(ddt_cuda_drafter *d, const ddt_qweight *const *host, const char *const *what, int32_t n,
                             int32_t l, cat_linear *c, ddt_error *err) {
    for (int32_t i = 0; i < n; i++) {
        TRY(upload_linear(d, host[i], what[i], l, &c->part[i], err));
        c->rows[i] = c->part[i].rows;
    }
    ddt_qweight *parts[CAT_MAX];
    for (int32_t i = 0; i < n; i++) parts[i] = &c->part[i];
    ddt_status st = ddt_cuda_qweight_stack_rows(parts, n, &c->whole, err); /* or separate products */
    if (st != DDT_OK) ddt_error_prefix(err, "layer %d %s..%s: ", l, what[0], what[n - 1]);
    return st;
}

/* The tensor-core rule on a weight's format and size (bytes: its own, or a stack's
 * it will join), which a host view tells before the upload: the drafter on the
 * tensor cores, bf16 rows of whole 16-byte pieces, at least tc_min bytes. */
static bool tc_rule(const ddt_cuda_drafter *d, const ddt_qweight *w, uint64_t bytes) {
    return d->tc && w->format == DDT_Q_DENSE && w->dtype == DDT_DTYPE_BF16 && w->cols % 8 == 0 && bytes >= d->tc_min;
}

/* Whether w's product runs on wgmma: tc_rule on the device weight, which the wgmma
 * path takes (ddt_cuda_wg_eligible: the row-major data streamed by TMA, no packed
 * copy, so row-prefix views work too). */
static bool on_tc(const ddt_cuda_drafter *d, const ddt_qweight *w) {
    return tc_rule(d, w, ddt_cuda_qweight_bytes(w)) && ddt_cuda_wg_eligible(w);
}

/* The mode w's product runs in (qmatmul_cuda.h): the tensor cores where on_tc, else
 * the FP32 path, which ignores the workspace. */
static ddt_cuda_mm_mode mode_of(const ddt_cuda_drafter *d, const ddt_qweight *w) {
    return on_tc(d, w) ? DDT_CUDA_MM_TENSOR : DDT_CUDA_MM_FP32;
}

/* y = x W^T in mode_of(w). */
static ddt_status mm(const ddt_cuda_drafter *d, const ddt_qweight *w, const float *x, int64_t ldx, int32_t n, float *y,
                     int64_t ldy, ddt_cuda_stream s, ddt_error *err) {
    return ddt_cuda_matmul_mode(w, mode_of(d, w), x, ldx, n, y, ldy, d->mm_ws, d->mm_ws_bytes, s, err);
}

/* y [n][ldy] columns [0, rows[0] + .. + rows[used-1]) = the first `used` parts'
 * products of x [n][ldx]. */
static ddt_status cat_matmul(const ddt_cuda_drafter *d, const cat_linear *c, int32_t used, const float *x, int64_t ldx,
                             int32_t n, float *y, int64_t ldy, ddt_cuda_stream s, ddt_error *err) {
    if (c->whole.data) {
        /* the first parts' rows of the stacked weight: a row-prefix view (the FP32
           path reads data and scales by row; the packed copy is not a prefix) */
        ddt_qweight view = c->whole;
        view.rows = 0;
        for (int32_t i = 0; i < used; i++) view.rows += c->rows[i];
        view.mma = NULL;
        view.mma_scale = NULL;
        return mm(d, &view, x, ldx, n, y, ldy, s, err);
    }
    int64_t off = 0;
    for (int32_t i = 0; i < used; i++) {
        TRY(mm(d, &c->part[i], x, ldx, n, y + off, ldy, s, err));
        off += c->rows[i];
    }
    return DDT_OK;
}

static void free_weight(ddt_qweight *w);

static ddt_status upload_layer(ddt_cuda_drafter *d, const ddt_drafter_layer *h, int32_t l, ddt_error *err) {
    cuda_layer *Y = &d->layers[l];
    TRY(upload_vec(d, &h->attn_norm, "input_layernorm", l, &Y->attn_norm, err));
    TRY(upload_vec(d, &h->mlp_norm, "post_attention_layernorm", l, &Y->mlp_norm, err));
    TRY(upload_vec(d, &h->q_norm, "q_norm", l, &Y->q_norm, err));
    TRY(upload_vec(d, &h->k_norm, "k_norm", l, &Y->k_norm, err));
    /* k and v first: the append's product is the prefix of the draft's */
    const ddt_qweight *kvq[] = {&h->k_proj, &h->v_proj, &h->q_proj};
    static const char *const kvq_names[] = {"k_proj", "v_proj", "q_proj"};
    TRY(upload_cat(d, kvq, kvq_names, 3, l, &Y->kvq, err));
    /* gate and up interleaved where the format allows: the product writes
       silu(gate) * up (ddt_cuda_matmul_swiglu) and down reads it plainly, two
       launches where the stacked pair takes silu_mul between them at the draft's
       16 rows; the same values either way (silu_dev.cuh's arithmetic on the same
       products) */
    /* (the stacked pair where it goes to the tensor cores, tc_rule on the stack's bytes:
       the interleaved product is the FP32 path's) */
    const bool gu_tc = tc_rule(d, &h->gate, ddt_cuda_qweight_bytes(&h->gate) + ddt_cuda_qweight_bytes(&h->up));
    if (!gu_tc && ddt_cuda_qweight_interleave_ok(&h->gate, &h->up)) { /* shapes and formats: the host views tell */
        ddt_qweight g, u;
        TRY(upload_linear(d, &h->gate, "gate_proj", l, &g, err));
        ddt_status st = upload_linear(d, &h->up, "up_proj", l, &u, err);
        if (st == DDT_OK) {
            st = ddt_cuda_qweight_interleave_rows(&g, &u, &Y->gu_pair, err);
            if (st != DDT_OK) ddt_error_prefix(err, "layer %d gate_proj | up_proj: ", l);
        }
        free_weight(&g);
        free_weight(&u);
        TRY(st);
    } else {
        const ddt_qweight *gu[] = {&h->gate, &h->up};
        static const char *const gu_names[] = {"gate_proj", "up_proj"};
        TRY(upload_cat(d, gu, gu_names, 2, l, &Y->gu, err));
    }
    TRY(upload_linear(d, &h->o_proj, "o_proj", l, &Y->o_proj, err));
    return upload_linear(d, &h->down, "down_proj", l, &Y->down, err);
}

/* The append's weight for every layer's k | v in one product: each layer's
 * stacked kvq (k rows, v rows, q rows) cut to its k | v prefix, stacked again
 * layer after layer (a copy: the draft keeps reading each layer's k | v | q as
 * one weight).  The same rows in the same format, so on the FP32 path every
 * output element is summed as the layer's own product sums it (qmatmul_cuda.h: an
 * element's order depends on cols only) and the one product is bitwise the
 * per-layer ones (on the tensor cores its k-split follows its row count: the last
 * bits may differ from a layer's own product, the same for every append).  Left empty, for per-layer
 * products, when a layer's kvq is not stacked (FP8 k / v off whole scale
 * blocks); the prefixes of stacked ones always concatenate (FP8: they end on a
 * block edge, as k and v then do). */
static ddt_status upload_kv_all(ddt_cuda_drafter *d, ddt_error *err) {
    const int32_t nl = d->dims.n_layers;
    for (int32_t l = 0; l < nl; l++)
        if (!d->layers[l].kvq.whole.data) return DDT_OK;
    ddt_qweight *view = ddt_calloc_array((size_t)nl, sizeof *view);
    const ddt_qweight **parts = ddt_calloc_array((size_t)nl, sizeof *parts);
    ddt_status st = DDT_OK;
    if (!view || !parts) {
        st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    } else {
        for (int32_t l = 0; l < nl; l++) {
            const cat_linear *c = &d->layers[l].kvq;
            /* a row-prefix view, as cat_matmul's (the packed copy is not a prefix) */
            view[l] = c->whole;
            view[l].rows = c->rows[0] + c->rows[1];
            view[l].mma = NULL;
            view[l].mma_scale = NULL;
            parts[l] = &view[l];
        }
        if (ddt_cuda_qweight_concat_ok(parts, nl)) {
            st = ddt_cuda_qweight_concat_rows(parts, nl, &d->kv_all, err);
            if (st == DDT_OK) d->weight_bytes += ddt_cuda_qweight_bytes(&d->kv_all);
            else ddt_error_prefix(err, "k_proj | v_proj of every layer: ");
        }
    }
    free(view);
    free(parts);
    return st;
}

/* Every view of the description, uploaded as stored (bf16 / FP8 / INT4 stay quantised). */
static ddt_status upload_weights(ddt_cuda_drafter *d, const ddt_drafter_desc *desc, ddt_error *err) {
    TRY(upload_linear(d, &desc->fc, "fc", -1, &d->fc, err));
    TRY(upload_vec(d, &desc->hidden_norm, "hidden_norm", -1, &d->hidden_norm, err));
    TRY(upload_vec(d, &desc->final_norm, "norm", -1, &d->final_norm, err));
    for (int32_t l = 0; l < d->dims.n_layers; l++) TRY(upload_layer(d, &desc->layers[l], l, err));
    return upload_kv_all(d, err);
}

/* cos/sin of every position 0..cap-1 with the CPU drafter's frequencies and factor
 * (ddt_drafter_config_rope), uploaded once. */
static ddt_status upload_rope_table(ddt_cuda_drafter *d, ddt_error *err) {
    const ddt_drafter_config *c = &d->cfg;
    const int32_t half = d->dims.hd / 2;
    float inv_freq[DDT_ROPE_MAX_DIM / 2];
    const float attn = ddt_drafter_config_rope(c, inv_freq);
    size_t n = (size_t)d->cap * (size_t)half;
    float *cs = ddt_calloc_array(n, sizeof(float)), *sn = ddt_calloc_array(n, sizeof(float));
    ddt_status st = DDT_OK;
    if (!cs || !sn) {
        st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the RoPE table (%d positions)", d->cap);
    } else {
        for (int32_t p = 0; p < d->cap; p++)
            ddt_cpu_rope_cos_sin(inv_freq, half, p, attn, cs + (size_t)p * half, sn + (size_t)p * half);
        cudaError_t e = cudaMemcpy(d->cos_t, cs, n * sizeof(float), cudaMemcpyHostToDevice);
        if (e == cudaSuccess) e = cudaMemcpy(d->sin_t, sn, n * sizeof(float), cudaMemcpyHostToDevice);
        if (e != cudaSuccess)
            st = ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: RoPE table upload failed: %s", cudaGetErrorString(e));
    }
    free(cs);
    free(sn);
    return st;
}

static ddt_status alloc_state(ddt_cuda_drafter *d, ddt_error *err) {
    const size_t L = (size_t)d->dims.L, C = DDT_CUDA_DRAFTER_PREFIX_CHUNK, half = (size_t)d->dims.hd / 2;
    const size_t kvq_w = 2 * (size_t)d->dims.kvd + (size_t)d->dims.qd;
    const size_t kv_raw_w = (size_t)d->dims.n_layers * 2 * (size_t)d->dims.kvd;
    size_t kv_n;
    if (!ddt_mul_size((size_t)d->dims.n_layers * 2, (size_t)d->cap, &kv_n) || !ddt_mul_size(kv_n, (size_t)d->dims.kvd, &kv_n))
        return ddt_fail(err, DDT_ERR_RANGE, "drafter cache for %d tokens overflows", d->max_ctx);
    uint64_t attn_n = ddt_dflash_attn_scratch_floats(&d->attn);
    if (d->tc) { /* the widest product's split activations (fc's F, q's, the MLP's, the head's H) at the most rows */
        const int32_t rows = (int32_t)(L > C ? L : C);
        const int64_t cols[] = {d->dims.H, d->dims.qd, d->dims.inter, d->dims.F};
        for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) {
            const size_t b = ddt_cuda_matmul_workspace_bytes(cols[i], 1, rows);
            if (b > d->mm_ws_bytes) d->mm_ws_bytes = b;
        }
        TRY(ddt_cuda_malloc_array(&d->mm_ws, d->mm_ws_bytes, 1, &d->state_bytes, err));
    }
    TRY(ddt_cuda_malloc_array((void **)&d->kv, kv_n, sizeof(float), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->cos_t, (size_t)d->cap * half, sizeof(float), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->sin_t, (size_t)d->cap * half, sizeof(float), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->len, 1, sizeof(int32_t), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->status, 1, sizeof(int32_t), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->advance_ticket, 1, sizeof(uint32_t), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->ids, L, sizeof(int32_t), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->iota, C, sizeof(int32_t), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->feat, C * (size_t)d->dims.F, sizeof(float), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->ctx, C * (size_t)d->dims.H, sizeof(float), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->kvq, L * kvq_w, sizeof(float), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->kv_raw, C * kv_raw_w, sizeof(float), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->x, L * (size_t)d->dims.H, sizeof(float), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->xn, L * (size_t)d->dims.H, sizeof(float), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->tmp, L * (size_t)d->dims.H, sizeof(float), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->q, L * (size_t)d->dims.qd, sizeof(float), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->o, L * (size_t)d->dims.qd, sizeof(float), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->gu, L * 2 * (size_t)d->dims.inter, sizeof(float), &d->state_bytes, err));
    TRY(ddt_cuda_malloc_array((void **)&d->attn_scratch, (size_t)attn_n, sizeof(float), &d->state_bytes, err));

    /* NaN in every activation and cache row until written, so a read of a row
     * nothing wrote shows in the logits (the tests rely on it) */
    float *poison[] = {d->kv, d->feat, d->ctx, d->kvq, d->kv_raw, d->x, d->xn, d->tmp, d->q, d->o, d->gu,
                       d->attn_scratch};
    const size_t poison_n[] = {kv_n, C * (size_t)d->dims.F, C * (size_t)d->dims.H, L * kvq_w, C * kv_raw_w,
                               L * (size_t)d->dims.H, L * (size_t)d->dims.H, L * (size_t)d->dims.H, L * (size_t)d->dims.qd,
                               L * (size_t)d->dims.qd, L * 2 * (size_t)d->dims.inter, (size_t)attn_n};
    for (size_t i = 0; i < sizeof poison / sizeof poison[0]; i++)
        DDT_CUDA_TRY(cudaMemset(poison[i], 0xFF, poison_n[i] * sizeof(float)), err);
    /* the attention's arrival tickets start at 0 (its partials stay poisoned) */
    TRY(ddt_dflash_attn_prepare(&d->attn, d->attn_scratch, NULL, err));

    /* constant inputs: the block's ids (slot 0 stays the mask: each draft reads its bonus
     * in place of it, ddt_cuda_embed_rmsnorm's first_id)
     * and the prefix rows 0..C-1; the cache starts empty */
    int32_t host[DDT_CUDA_DRAFTER_PREFIX_CHUNK > DDT_DRAFTER_MAX_BLOCK ? DDT_CUDA_DRAFTER_PREFIX_CHUNK
                                                                       : DDT_DRAFTER_MAX_BLOCK];
    for (size_t i = 0; i < L; i++) host[i] = d->cfg.mask_token_id;
    DDT_CUDA_TRY(cudaMemcpy(d->ids, host, L * sizeof(int32_t), cudaMemcpyHostToDevice), err);
    for (size_t i = 0; i < C; i++) host[i] = (int32_t)i;
    DDT_CUDA_TRY(cudaMemcpy(d->iota, host, C * sizeof(int32_t), cudaMemcpyHostToDevice), err);
    DDT_CUDA_TRY(cudaMemset(d->len, 0, sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMemset(d->status, 0, sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMemset(d->advance_ticket, 0, sizeof(uint32_t)), err);
    return DDT_OK;
}

ddt_status ddt_cuda_drafter_load(const char *dir, const ddt_cuda_drafter_target *t, int32_t max_ctx,
                                 ddt_cuda_drafter **out, ddt_error *err) {
    if (!dir || !t || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_drafter_load: NULL argument");
    *out = NULL;
    if (max_ctx < 1 || max_ctx > INT32_MAX / 2)
        return ddt_fail(err, DDT_ERR_INVALID, "drafter options: max_ctx %d must be >= 1", max_ctx);

    /* Every check the CPU drafter makes (config, tensors, target), with its messages:
     * the same description (drafter_desc.h), kept until the weights are uploaded. */
    ddt_drafter_target ht = {.hidden_size = t->hidden_size, .num_layers = t->num_layers,
                             .vocab_size = t->vocab_size, .embed = t->embed, .lm_head = t->lm_head};
    ddt_drafter_desc *desc = calloc(1, sizeof *desc);
    if (!desc) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    ddt_status st = ddt_drafter_desc_load(dir, &ht, desc, err);
    if (st != DDT_OK) {
        ddt_error_prefix(err, "drafter %s: ", dir);
        ddt_drafter_desc_free(desc);
        free(desc);
        return st;
    }
    ddt_cuda_drafter *d = calloc(1, sizeof *d);
    if (!d) {
        ddt_drafter_desc_free(desc);
        free(desc);
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    }
    d->cfg = desc->cfg;

    const ddt_drafter_config *c = &d->cfg;
    d->target = *t;
    d->tc = t->mm == DDT_CUDA_MM_TENSOR;
    d->tc_min = t->tensor_min_bytes ? t->tensor_min_bytes : DDT_CUDA_DRAFTER_TC_MIN_BYTES;
    ddt_drafter_dims_fill(c, &d->dims);
    d->V = t->vocab_size;
    d->max_ctx = max_ctx;
    d->cap = max_ctx + d->dims.L;
    int32_t split = ddt_dflash_attn_split_hint(d->dims.hd);
    if ((d->cap + split - 1) / split > ATTN_MAX_SPLITS)
        split = ((d->cap + ATTN_MAX_SPLITS - 1) / ATTN_MAX_SPLITS + 31) / 32 * 32;
    d->attn = (ddt_dflash_attn){.n_block = d->dims.L, .heads = d->dims.heads, .kv_heads = d->dims.kv_heads, .hd = d->dims.hd,
                                .max_rows = d->cap, .split = split, .scale = d->dims.scale};

    if (d->dims.hd > DDT_DFLASH_MAX_HEAD_DIM) {
        st = ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s/config.json: head_dim %d (the GPU drafter handles up to %d)", dir,
                      d->dims.hd, DDT_DFLASH_MAX_HEAD_DIM);
        goto fail;
    }
    d->layers = ddt_calloc_array((size_t)d->dims.n_layers, sizeof *d->layers);
    if (!d->layers) {
        st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    st = upload_weights(d, desc, err);
    ddt_drafter_desc_free(desc); /* the device holds its own copy of every weight now */
    free(desc);
    desc = NULL;
    if (st != DDT_OK) goto fail;
    if (d->tc && (st = ddt_cuda_ws_prepare(err)) != DDT_OK) goto fail; /* the wgmma kernels' attributes */
    if ((st = alloc_state(d, err)) != DDT_OK) goto fail;
    if ((st = upload_rope_table(d, err)) != DDT_OK) goto fail;
    *out = d;
    return DDT_OK;
fail:
    ddt_error_prefix(err, "drafter %s: ", dir);
    if (desc) {
        ddt_drafter_desc_free(desc);
        free(desc);
    }
    ddt_cuda_drafter_free(d);
    return st;
}

static void free_weight(ddt_qweight *w) {
    if (w->data) ddt_cuda_qweight_free(w);
}

void ddt_cuda_drafter_free(ddt_cuda_drafter *d) {
    if (!d) return;
    free_weight(&d->fc);
    free_weight(&d->kv_all);
    ddt_cuda_free(d->hidden_norm);
    ddt_cuda_free(d->final_norm);
    for (int32_t l = 0; d->layers && l < d->dims.n_layers; l++) {
        cuda_layer *Y = &d->layers[l];
        ddt_cuda_free(Y->attn_norm);
        ddt_cuda_free(Y->mlp_norm);
        ddt_cuda_free(Y->q_norm);
        ddt_cuda_free(Y->k_norm);
        ddt_qweight *w[] = {&Y->kvq.whole, &Y->kvq.part[0], &Y->kvq.part[1], &Y->kvq.part[2], &Y->gu.whole,
                            &Y->gu.part[0],  &Y->gu.part[1],   &Y->gu_pair,      &Y->o_proj,       &Y->down};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) free_weight(w[i]);
    }
    free(d->layers);
    void *bufs[] = {d->kv,  d->cos_t, d->sin_t,  d->len, d->status, d->ids, d->iota, d->feat, d->ctx,
                    d->kvq, d->kv_raw, d->x,     d->xn,  d->tmp,    d->q,   d->o,    d->gu,   d->attn_scratch,
                    d->advance_ticket, d->mm_ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) cudaFree(bufs[i]);
    free(d);
}

/* The weight a cat_linear's product reads first (its stack, else its first part). */
static const ddt_qweight *cat_first(const cat_linear *c) { return c->whole.data ? &c->whole : &c->part[0]; }

int32_t ddt_cuda_drafter_tensor_products(const ddt_cuda_drafter *d) {
    int32_t k = on_tc(d, d->target.lm_head);
    for (int32_t l = 0; l < d->dims.n_layers; l++) {
        const cuda_layer *Y = &d->layers[l];
        k += on_tc(d, cat_first(&Y->kvq)) + on_tc(d, &Y->o_proj) + on_tc(d, &Y->down) +
             (!Y->gu_pair.data && on_tc(d, cat_first(&Y->gu)));
    }
    return k;
}

const ddt_drafter_config *ddt_cuda_drafter_config(const ddt_cuda_drafter *d) { return &d->cfg; }
int32_t ddt_cuda_drafter_block_size(const ddt_cuda_drafter *d) { return d->dims.L; }
int32_t ddt_cuda_drafter_max_ctx(const ddt_cuda_drafter *d) { return d->max_ctx; }
const int32_t *ddt_cuda_drafter_len_device(const ddt_cuda_drafter *d) { return d->len; }
const int32_t *ddt_cuda_drafter_status_device(const ddt_cuda_drafter *d) { return d->status; }
uint64_t ddt_cuda_drafter_weight_bytes(const ddt_cuda_drafter *d) { return d->weight_bytes; }
uint64_t ddt_cuda_drafter_state_bytes(const ddt_cuda_drafter *d) { return d->state_bytes; }

ddt_status ddt_cuda_drafter_reset(ddt_cuda_drafter *d, ddt_cuda_stream s, ddt_error *err) {
    if (!d) return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_drafter_reset: NULL drafter");
    DDT_CUDA_TRY(cudaMemsetAsync(d->len, 0, sizeof(int32_t), (cudaStream_t)s), err);
    DDT_CUDA_TRY(cudaMemsetAsync(d->status, 0, sizeof(int32_t), (cudaStream_t)s), err);
    return DDT_OK;
}

ddt_status ddt_cuda_drafter_rollback(ddt_cuda_drafter *d, int32_t len, ddt_cuda_stream s, ddt_error *err) {
    if (!d) return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_drafter_rollback: NULL drafter");
    /* the cache's length-setting kernel over the drafter's two scalars */
    _Static_assert((int)DDT_DFLASH_OK == (int)DDT_CUDA_KV_OK, "the kernel writes the cache's OK into the drafter's status");
    const ddt_cuda_kv view = {.capacity = d->max_ctx, .len = d->len, .status = d->status};
    return ddt_cuda_kv_set_len(&view, len, s, err);
}

/* ------------------------------------------------------------------ append */

/* feat [n][F] = the n rows picked by rows (device) of every target layer,
 * layers[i] + row0 rows, side by side: one launch per DDT_CUDA_GATHER_MAX_SRC
 * target layers. */
static ddt_status gather_feat(ddt_cuda_drafter *d, const float *const *layers, size_t row0, const int32_t *rows,
                              const int32_t *n_dev, int32_t n, ddt_cuda_stream s, ddt_error *err) {
    const int32_t H = d->dims.H;
    for (int32_t i0 = 0; i0 < d->dims.n_tl; i0 += DDT_CUDA_GATHER_MAX_SRC) {
        const int32_t count = d->dims.n_tl - i0 < DDT_CUDA_GATHER_MAX_SRC ? d->dims.n_tl - i0 : DDT_CUDA_GATHER_MAX_SRC;
        const float *src[DDT_CUDA_GATHER_MAX_SRC];
        for (int32_t i = 0; i < count; i++) src[i] = layers[i0 + i] + row0 * (size_t)H;
        if (n_dev)
            TRY(ddt_cuda_gather_rows_multi_clamped(d->feat + (size_t)i0 * H, d->dims.F, src, count, H, rows, n_dev,
                                                   n, H, s, err));
        else
            TRY(ddt_cuda_gather_rows_multi(d->feat + (size_t)i0 * H, d->dims.F, src, count, H, rows, n, H, s, err));
    }
    return DDT_OK;
}

/*
 * The context rows of n gathered tokens (feat [n][F]): the first count of them
 * (count_dev on the device, else count_host; at most max_count) go to cache rows
 * len.. and len advances, all gated on the device by the same fit rule.  The
 * advance is folded into the last K/V store launch (its last block to finish):
 * that launch is the last reader of len before the advance (the products and
 * the norm before it do not read it; earlier store launches of a drafter of more
 * than DDT_DFLASH_MAX_KV_LAYERS layers finish before it starts).
 */
static ddt_status append_feat(ddt_cuda_drafter *d, int32_t n, const int32_t *count_dev, int32_t count_host,
                              int32_t max_count, ddt_cuda_stream s, ddt_error *err) {
    const int32_t H = d->dims.H, kvd = d->dims.kvd, nl = d->dims.n_layers;
    const int64_t KV = 2 * (int64_t)kvd, W = nl * KV; /* a layer's k | v; kv_raw's row */
    TRY(mm(d, &d->fc, d->feat, d->dims.F, n, d->ctx, H, s, err));
    TRY(ddt_cuda_rmsnorm(d->ctx, H, n, H, d->hidden_norm, d->dims.eps, d->ctx, H, s, err));
    /* kv_raw [n][W]: layer l's k | v in columns [l KV, (l + 1) KV), from one
       product or (kv_all not stacked) one per layer, the same bits either way */
    if (d->kv_all.data) {
        TRY(mm(d, &d->kv_all, d->ctx, H, n, d->kv_raw, W, s, err));
    } else {
        for (int32_t l = 0; l < nl; l++)
            TRY(cat_matmul(d, &d->layers[l].kvq, 2, d->ctx, H, n, d->kv_raw + l * KV, W, s, err));
    }
    /* every layer's K/V store, DDT_DFLASH_MAX_KV_LAYERS layers a launch; all of
       them read len before the last one's last block moves it */
    ddt_dflash_qkv kv = {.ldk = W, .ldv = W, .kv_heads = d->dims.kv_heads, .n = n, .hd = d->dims.hd,
                         .eps = d->dims.eps, .count_dev = count_dev, .count_host = count_host,
                         .max_count = max_count, .len = d->len, .limit = d->max_ctx, .cos_t = d->cos_t,
                         .sin_t = d->sin_t, .layer_cols = KV};
    for (int32_t l0 = 0; l0 < nl; l0 += DDT_DFLASH_MAX_KV_LAYERS) {
        kv.layers = nl - l0 < DDT_DFLASH_MAX_KV_LAYERS ? nl - l0 : DDT_DFLASH_MAX_KV_LAYERS;
        kv.k = d->kv_raw + l0 * KV;
        kv.v = kv.k + kvd;
        for (int32_t i = 0; i < kv.layers; i++) {
            kv.k_norms[i] = d->layers[l0 + i].k_norm;
            kv.k_caches[i] = kv_k(d, l0 + i);
            kv.v_caches[i] = kv_v(d, l0 + i);
        }
        if (l0 + kv.layers == nl) { /* the last launch: len += count, or the status set */
            kv.advance_ticket = d->advance_ticket;
            kv.advance_len = d->len;
            kv.advance_status = d->status;
        }
        TRY(ddt_dflash_qkv_prep(&kv, s, err));
    }
    return DDT_OK;
}

static ddt_status check_layers(const ddt_cuda_drafter *d, const float *const *layers, ddt_error *err) {
    if (!layers) return ddt_fail(err, DDT_ERR_INVALID, "drafter append: NULL layers");
    for (int32_t i = 0; i < d->dims.n_tl; i++)
        if (!layers[i]) return ddt_fail(err, DDT_ERR_INVALID, "drafter append: feature layer %d is NULL", i);
    return DDT_OK;
}

ddt_status ddt_cuda_drafter_append_rows(ddt_cuda_drafter *d, const float *const *layers, const int32_t *rows,
                                        const int32_t *m, int32_t max_m, ddt_cuda_stream s, ddt_error *err) {
    if (!d || !rows || !m) return ddt_fail(err, DDT_ERR_INVALID, "drafter append: NULL argument");
    TRY(check_layers(d, layers, err));
    if (max_m < 1 || max_m > DDT_MAX_PATH)
        return ddt_fail(err, DDT_ERR_INVALID, "drafter append: max_m %d outside 1..%d", max_m, DDT_MAX_PATH);
    /* rows past m may hold anything: gather max_m rows that exist (the gather
       clamps the row indices itself to rows that exist), store only m */
    TRY(gather_feat(d, layers, 0, rows, m, max_m, s, err));
    return append_feat(d, max_m, m, 0, max_m, s, err);
}

ddt_status ddt_cuda_drafter_append_prefix(ddt_cuda_drafter *d, const float *const *layers, int32_t m,
                                          ddt_cuda_stream s, ddt_error *err) {
    if (!d) return ddt_fail(err, DDT_ERR_INVALID, "drafter append: NULL drafter");
    TRY(check_layers(d, layers, err));
    if (m < 0 || m > d->max_ctx)
        return ddt_fail(err, DDT_ERR_INVALID, "drafter append: %d tokens (context of %d)", m, d->max_ctx);
    for (int32_t i = 0; i < m; i += DDT_CUDA_DRAFTER_PREFIX_CHUNK) {
        const int32_t n = m - i < DDT_CUDA_DRAFTER_PREFIX_CHUNK ? m - i : DDT_CUDA_DRAFTER_PREFIX_CHUNK;
        TRY(gather_feat(d, layers, (size_t)i, d->iota, NULL, n, s, err));
        TRY(append_feat(d, n, NULL, n, n, s, err));
    }
    return DDT_OK;
}

/* ------------------------------------------------------------------ draft */

ddt_status ddt_cuda_drafter_draft(ddt_cuda_drafter *d, const int32_t *bonus, float *logits, ddt_cuda_stream s,
                                  ddt_error *err) {
    if (!d || !bonus || !logits) return ddt_fail(err, DDT_ERR_INVALID, "drafter draft: NULL argument");
    const int32_t H = d->dims.H, L = d->dims.L, kvd = d->dims.kvd, qd = d->dims.qd, I = d->dims.inter;
    const int64_t W = 2 * (int64_t)kvd + qd;
    const float eps = d->dims.eps;
    /* the block's embedding (the bonus read in place as row 0, the mask tokens after
     * it: no copy into d->ids) and layer 0's input norm in one launch; later layers'
     * input norms run with the residual add before them */
    TRY(ddt_cuda_embed_rmsnorm(d->target.embed, d->ids, bonus, L, d->x, H, d->layers[0].attn_norm, eps, d->xn, H, s,
                               err));
    /* the block's K/V go to the cache rows just after the context (scratch, never committed) */
    ddt_dflash_qkv qkv = {.q = d->kvq + 2 * kvd, .ldq = W, .qo = d->q, .ldqo = qd, .heads = d->dims.heads,
                          .k = d->kvq, .ldk = W, .v = d->kvq + kvd, .ldv = W, .kv_heads = d->dims.kv_heads, .n = L,
                          .hd = d->dims.hd, .eps = eps, .count_host = L, .max_count = L, .len = d->len,
                          .limit = d->cap, .cos_t = d->cos_t, .sin_t = d->sin_t};
    for (int32_t l = 0; l < d->dims.n_layers; l++) {
        const cuda_layer *Y = &d->layers[l];
        TRY(cat_matmul(d, &Y->kvq, 3, d->xn, H, L, d->kvq, W, s, err)); /* k | v | q */
        qkv.q_norm = Y->q_norm;
        qkv.k_norm = Y->k_norm;
        qkv.k_cache = kv_k(d, l);
        qkv.v_cache = kv_v(d, l);
        TRY(ddt_dflash_qkv_prep(&qkv, s, err));
        TRY(ddt_dflash_attention(&d->attn, d->q, kv_k(d, l), kv_v(d, l), d->len, d->attn_scratch, d->o, s, err));
        TRY(mm(d, &Y->o_proj, d->o, qd, L, d->tmp, H, s, err));
        TRY(ddt_cuda_add_rmsnorm(d->x, H, d->tmp, H, L, H, Y->mlp_norm, eps, d->xn, H, s, err));
        if (Y->gu_pair.data) { /* silu(gate) * up, then a plain down */
            TRY(ddt_cuda_matmul_swiglu(&Y->gu_pair, 0, d->xn, H, L, d->gu, I, s, err));
            TRY(ddt_cuda_matmul(&Y->down, d->gu, I, L, d->tmp, H, s, err));
        } else {
            TRY(cat_matmul(d, &Y->gu, 2, d->xn, H, L, d->gu, 2 * (int64_t)I, s, err)); /* gate | up */
            TRY(ddt_cuda_matmul_silu_mode(&Y->down, mode_of(d, &Y->down), d->gu, 2 * (int64_t)I, d->gu + I,
                                          2 * (int64_t)I, L, d->tmp, H, d->mm_ws, d->mm_ws_bytes, s, err));
        }
        if (l + 1 < d->dims.n_layers) {
            TRY(ddt_cuda_add_rmsnorm(d->x, H, d->tmp, H, L, H, d->layers[l + 1].attn_norm, eps, d->xn, H, s, err));
        } else {
            /* only positions 1..L-1 are drafts: row 0 skips its last add, which
               nothing reads (the next draft embeds x afresh) */
            TRY(ddt_cuda_add_rmsnorm(d->x + H, H, d->tmp + H, H, L - 1, H, d->final_norm, eps, d->xn, H, s, err));
        }
    }
    return mm(d, d->target.lm_head, d->xn, H, L - 1, logits, d->V, s, err);
}
