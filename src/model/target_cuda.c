/*
 * target_cuda.c — the target model on the CUDA backend (see target_cuda.h):
 * the target description (target_desc.h: config, checks, weight views), upload
 * of its views, then forwards that are
 * sequences of launches on one stream (no host synchronisation anywhere).
 */
#include "model/target_cuda.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/mla_cuda.h"
#include "backend/cuda/mla_verify_cuda.h"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/nn_cuda.h"
#include "backend/cuda/qmatmul_cuda.h"
#include "core/alloc.h"
#include "core/error.h"
#include "model/target_desc.h"

#define LATENT_NORM_EPS 1e-6f /* as the CPU target: HF builds the latent norms with the default eps */

typedef struct dev_mlp {
    ddt_qweight gate, up, down;
    ddt_qweight gate_up; /* [gate; up] stacked (stack_pair), or with `paired` their rows interleaved
                            (ddt_cuda_qweight_interleave_rows): one product; gate and up then empty */
    bool paired;         /* gate_up interleaved: ddt_cuda_matmul_swiglu writes silu(gate) * up */
} dev_mlp;

typedef struct dev_layer {
    float *attn_norm, *mlp_norm, *q_a_norm, *kv_a_norm, *router_bias;
    ddt_qweight q_proj, q_a, q_b, kv_a, kv_b, o_proj, router;
    ddt_qweight qkv_a; /* [q_a; kv_a] stacked (stack_pair): one product; q_a and kv_a then empty */
    ddt_qweight front; /* MoE with a shared expert: [router; shared gate_up] stacked (stack_front),
                          one product; router and shared.gate_up then empty */
    ddt_qweight uk_t; /* tensor cores: W_UK^T per head [heads][rank][nope] (make_uk_t), else empty */
    bool moe, has_shared;
    bool shared_all; /* every rank holds a slice of the shared expert (unsharded, one rank, or split) */
    bool has_mlp; /* a dense layer whose MLP this rank holds a slice of (model/shard.h) */
    bool shared_in_moe; /* the shared expert's down runs in the routed experts' down launch
                           (ddt_cuda_moe_args.shared_down; fuse_shared_down) */
    bool shared_fork;   /* the shared expert's down (silu_split + product) runs on a side stream
                           beside the route and the routed experts, joined before their
                           combine (plan_shared_fork) */
    dev_mlp mlp, shared;
    ddt_cuda_moe_layer experts;
} dev_layer;

struct ddt_cuda_target {
    ddt_target_desc *desc; /* config, checks and the checkpoint views (target_desc.h; NULL for a synthetic target) */
    const ddt_model_config *cfg;
    ddt_model_config synth_cfg; /* a synthetic target's config (shallow copy: no ignore list) */
    cudaStream_t stream;
    /* the side branch of a MoE layer (plan_shared_fork): its stream, the event the
       branch waits on (the front written) and the one the combine waits on */
    cudaStream_t side;
    cudaEvent_t fork_ev, join_ev;
    int32_t fork_opt; /* ddt_cuda_target_options.shared_fork */
    int32_t max_ctx, max_tokens;
    /* target_desc.h; multi-GPU: dims.heads is the rank's own count (shard.n_heads),
       dims.n_experts stays the router's global count */
    ddt_target_dims dims;
    bool sharded;
    ddt_shard shard;
    ddt_cuda_allreduce_fn allreduce;
    void *allreduce_ctx;
    ddt_cuda_allgather_fn allgather;
    /* the logits' vocabulary rows this rank computes (model/shard.h ddt_shard_vocab_slice):
       head_split, rows [head_v0, head_v0 + head_n) into head_part [T][head_n], every rank's
       gathered into head_all [world][T][head_n] and set side by side into the logits */
    bool head_split;
    int64_t head_v0, head_n;
    float *head_part, *head_all;
    ddt_moe_route_params route;

    ddt_qweight embed, lm_head;
    bool tied;
    float *final_norm;
    dev_layer *layers;
    float *cos_t, *sin_t; /* [max_ctx][rope/2] */
    ddt_cuda_kv kv;

    /* run state, T = max_tokens rows (alloc_state sizes them) */
    float *x, *xn, *tmp, *acc; /* [T][hidden] residual stream, its norm, a projection out, the routed sum */
    float *qa;                 /* [T][q_lora + rank + rope]: q_a's output, or q_a's | kv_a's side by side
                                  when they run as one product (qkv_a) */
    float *q;                  /* [T][heads][qdim] queries (nope | rope) */
    float *kva;                /* [T][rank + rope] kv_a output: latent | k_rope */
    float *kvn;                /* [T][rank] normed latent */
    float *q_lat, *o_lat;      /* [T][heads][rank] absorbed queries, attention output in latent space */
    float *o_v;                /* [T][heads][vdim] per-head values after W_UV */
    float *g, *u;              /* [T][2 inter_max] gate | up side by side (gate_up), [T][inter_max] up
                                  when they run apart */
    float *rlogits, *rw;       /* [T][n_experts] router logits, [T][top_k] routing weights */
    float *front;              /* [T][n_experts + 2 inter_max]: router logits | shared gate | up of the
                                  layers with a stacked front (else unused) */
    void *attn_ws;             /* exact path: the attention's slice partials and counters
                                  (ddt_cuda_mla_attn_workspace), counters zeroed at load */
    int32_t *ridx;             /* [T][top_k] routed expert ids */
    int32_t *iota;             /* [T] 0, 1, 2, ...: a prefill's depths (a chain: row i at position len + i) */
    bool fast;           /* bf16 cache + mla_verify_cuda.h */
    ddt_cuda_mm_mode mm; /* opts->tensor_cores: how projections / experts / LM head run */
    uint16_t *q16;       /* fast: [max_tokens][heads][576] bf16 queries */
    uint64_t *causal;    /* fast: [max_tokens] prefill visibility rows */
    void *mla_ws;
    size_t mla_ws_bytes;
    void *moe_ws;
    size_t moe_ws_bytes;
    void *mm_ws;         /* tensor cores: the projections' split activations (mm_workspace_bytes) */
    size_t mm_ws_bytes;
    void *mm_next;       /* the same size: the planes a product's epilogue writes for the next product
                            (W_UK^T's from q_b, o_proj's from W_UV), apart from the planes it reads */
    int32_t n_capture, capture_layer[DDT_TARGET_MAX_CAPTURE];
    float *capture; /* [n_capture][max_tokens][hidden] */
    ddt_cuda_target_probe probe; /* tests (ddt_cuda_target_set_probe); every pointer NULL otherwise */

    uint64_t weight_bytes, state_bytes;
};

/* ------------------------------------------------------------------ load */

/* With the tensor cores, a weight the projections read gets its packed copy at
 * load (qmatmul_cuda.h); the embedding and the router never take that path. */
static ddt_status pack_w(ddt_cuda_target *t, ddt_qweight *d, ddt_error *err) {
    if (t->mm != DDT_CUDA_MM_TENSOR) return DDT_OK;
    return ddt_cuda_qweight_pack(d, err); /* weight_bytes counts one copy: the one a step reads */
}

/* The groups of kv_b that are W_UK (each head's k_nope rows), and of its
 * per-head transpose uk_t. */
static ddt_row_groups uk_groups(const ddt_cuda_target *t) {
    return (ddt_row_groups){.count = t->dims.heads, .w_row_stride = t->dims.nope + t->dims.vdim, .w_row_offset = 0,
                            .rows = t->dims.nope, .x_stride = t->dims.qdim, .y_stride = t->dims.rank};
}
static ddt_row_groups uk_t_groups(const ddt_cuda_target *t) {
    return (ddt_row_groups){.count = t->dims.heads, .w_row_stride = t->dims.rank, .w_row_offset = 0,
                            .rows = t->dims.rank, .x_stride = t->dims.qdim, .y_stride = t->dims.rank};
}

/* With the tensor cores, the absorbed q_lat = q_nope W_UK runs as a grouped
 * x W^T over a per-head transposed, packed copy of W_UK: the x W kernel
 * (mt_kernel) read those rows at a few percent of the copy bandwidth (61 us of
 * a 423 us K2.6 layer at n = 1 on the H200, for 8.4 MB).  A kv_b the transpose
 * does not take (INT4, FP8 blocks across heads) keeps x W.  The copy costs
 * heads * rank * nope weights more per layer (8.4 MB at K2.6 in bf16). */
static ddt_status make_uk_t(ddt_cuda_target *t, dev_layer *d, ddt_error *err) {
    const ddt_row_groups g = uk_groups(t);
    if (t->mm != DDT_CUDA_MM_TENSOR || !ddt_cuda_qweight_tc_eligible(&d->kv_b) ||
        !ddt_cuda_qweight_transpose_ok(&d->kv_b, &g) || uk_t_groups(t).w_row_stride % 16 != 0)
        return DDT_OK;
    ddt_status st = ddt_cuda_qweight_transpose_groups(&d->kv_b, &g, &d->uk_t, err);
    if (st == DDT_OK) st = ddt_cuda_qweight_pack(&d->uk_t, err);
    if (st == DDT_OK) t->weight_bytes += ddt_cuda_qweight_bytes(&d->uk_t);
    return st;
}

static ddt_status up_plain(ddt_cuda_target *t, const ddt_qweight *h, ddt_qweight *d, ddt_error *err) {
    ddt_status st = ddt_cuda_qweight_upload(h, d, err);
    if (st == DDT_OK) t->weight_bytes += ddt_cuda_qweight_bytes(d);
    return st;
}

static ddt_status up_w(ddt_cuda_target *t, const ddt_qweight *h, ddt_qweight *d, ddt_error *err) {
    ddt_status st = up_plain(t, h, d, err);
    return st != DDT_OK ? st : pack_w(t, d, err);
}

static ddt_status up_v(ddt_cuda_target *t, const ddt_cpu_vec *v, float **d, ddt_error *err) {
    ddt_status st = ddt_cuda_vec_upload(v->data, v->dtype, v->n, d, err);
    if (st == DDT_OK) t->weight_bytes += (uint64_t)v->n * sizeof(float);
    return st;
}

/* Two projections of one input as one product (ddt_cuda_qweight_stack_rows):
 * a and b stacked into *ab and freed, one launch fewer per use, or kept when
 * their format cannot stack (FP8 blocks that straddle the seam).  On the FP32
 * path each output is bitwise what the separate products give (an element's
 * order depends on the columns only); on the tensor-core path the k-split
 * follows the stacked row count, which changes the rounding but not batch
 * invariance. */
static ddt_status stack_pair(ddt_qweight *a, ddt_qweight *b, ddt_qweight *ab, ddt_error *err) {
    ddt_qweight *const parts[2] = {a, b};
    return ddt_cuda_qweight_stack_rows(parts, 2, ab, err);
}

/* A gated MLP's gate and up as one product.  On the FP32 path, where the format
 * allows, their rows interleaved (paired), so that the product writes silu(gate) *
 * up itself (ddt_cuda_matmul_swiglu) and the down product reads it as a plain
 * input: two launches at every n, where the stacked pair takes silu_mul between
 * them from 3 tokens on (the fused gated load measured slower there); bitwise the
 * same values either way.  Else stacked (stack_pair) or, failing that, kept. */
static ddt_status mlp_stack(ddt_cuda_target *t, dev_mlp *m, ddt_error *err) {
    if (t->mm == DDT_CUDA_MM_FP32 && ddt_cuda_qweight_interleave_ok(&m->gate, &m->up)) {
        ddt_status st = ddt_cuda_qweight_interleave_rows(&m->gate, &m->up, &m->gate_up, err);
        if (st != DDT_OK) return st;
        ddt_cuda_qweight_free(&m->gate);
        ddt_cuda_qweight_free(&m->up);
        m->paired = true;
        return DDT_OK;
    }
    return stack_pair(&m->gate, &m->up, &m->gate_up, err);
}

/* A MoE layer's three products of the normed input, the router's and the shared
 * expert's gate and up, as one.  On the FP32 path bitwise the three (an element's
 * order depends on the columns only).  With the tensor cores the router then runs
 * on them too (split-bf16 activations, like every other product of that mode,
 * ~1e-6 of the FP32 logits) instead of its own FP32 launch, the layer's slowest
 * small product at K2.6 shapes (13 us at n = 1, 28 at n = 16 on the H200, for
 * 5.5 MB).  Sharded, only where every rank holds a slice of the shared expert
 * (shared_all: the slices are even, so every rank's front has the same shape and
 * gives the same router logits), because every rank routes for itself and a rank
 * without one would keep the FP32 router: all must pick alike. */
static ddt_status stack_front(ddt_cuda_target *t, dev_layer *d, ddt_error *err) {
    if (!d->has_shared || !d->shared.gate_up.data) return DDT_OK;
    if (t->mm != DDT_CUDA_MM_FP32 && t->sharded && !d->shared_all) return DDT_OK;
    /* interleaved pairs must start on an even row (ddt_cuda_matmul_swiglu) */
    if (d->shared.paired && d->router.rows % 2 != 0) return DDT_OK;
    return stack_pair(&d->router, &d->shared.gate_up, &d->front, err);
}

/* Unsharded, on the FP32 path, with the front stacked and the shared gate / up
 * paired (silu(gate) * up written by the front's product): the shared expert's
 * down projection runs in the routed experts' down launch, one launch less per
 * MoE layer, bitwise the separate product (moe_cuda.h).  Sharded, the shared
 * expert's partial sum meets the all-reduce as before; every other layer keeps
 * its own launch. */
static void fuse_shared_down(const ddt_cuda_target *t, dev_layer *d) {
    d->shared_in_moe = t->mm == DDT_CUDA_MM_FP32 && !t->sharded && d->has_shared && d->front.data &&
                       d->shared.paired && ddt_cuda_moe_shared_down_ok(&d->experts, &d->shared.down);
}

/* A shared expert this large (bytes of its down product's weights) runs its down
 * on a side branch (shared_fork).  Below it the layer is launch-bound (the
 * shipped pair's is 98 KB: a branch costs more than it hides, as the fork-join
 * measured on the tiny model); K2.6's is 29 MB, which streams while the route and
 * sort (one latency-bound block) and the routed experts run beside it.  A
 * property of the weights, never of n. */
#define SHARED_FORK_MIN_BYTES (4u << 20)

/* Unsharded on the tensor-core path, with the front stacked (router | shared gate
 * | up, one product, its shared half not paired): the shared expert's down needs
 * only the front's output, and only the MoE combine reads its own, so it runs as a
 * graph branch (forward: fork after the front, join before the combine).  The same
 * kernels on the same inputs, so the same bits.  Measured (sixteenth session, one
 * K2.6 MoE layer at N = 4096, graph + PDL): n = 1 0.271 -> 0.261 ms on the H100,
 * 0.231 -> 0.228 on the H200; the whole shared expert on the branch with the
 * router alone on the main stream gained nothing (the router alone costs 9 us
 * packed, 17 us on the FP32 path). */
static void plan_shared_fork(const ddt_cuda_target *t, dev_layer *d) {
    d->shared_fork = t->fork_opt >= 0 && !t->sharded && t->mm == DDT_CUDA_MM_TENSOR && d->moe && d->has_shared &&
                     d->front.data && !d->shared.paired && !d->shared_in_moe &&
                     (t->fork_opt > 0 || ddt_cuda_qweight_bytes(&d->shared.down) >= SHARED_FORK_MIN_BYTES);
}

/* The side stream and its two events, once, when a layer forks (no allocation in a forward). */
static ddt_status make_side(ddt_cuda_target *t, ddt_error *err) {
    if (ddt_cuda_target_forked_layers(t) == 0 || t->side) return DDT_OK;
    DDT_CUDA_TRY(cudaStreamCreateWithFlags(&t->side, cudaStreamNonBlocking), err);
    DDT_CUDA_TRY(cudaEventCreateWithFlags(&t->fork_ev, cudaEventDisableTiming), err);
    DDT_CUDA_TRY(cudaEventCreateWithFlags(&t->join_ev, cudaEventDisableTiming), err);
    return DDT_OK;
}

/* This rank's slice [*i0, *i0 + *n) of an MLP's intermediate dimension (model/shard.h:
 * an even split where it cuts into whole units, else all of it on rank 0); all of it
 * unsharded. */
static void mlp_slice(const ddt_cuda_target *t, int64_t inter, int64_t unit, int64_t *i0, int64_t *n) {
    ddt_shard_mlp_slice(t->sharded ? &t->shard : NULL, inter, unit, i0, n);
}

/* Upload rows [r0, r0 + n) of a host weight (the whole weight when that is all of it). */
static ddt_status up_rows(ddt_cuda_target *t, const ddt_qweight *h, int64_t r0, int64_t n, ddt_qweight *d,
                          ddt_error *err) {
    ddt_qweight v;
    ddt_status st = ddt_shard_rows(h, r0, n, &v, err);
    return st != DDT_OK ? st : up_w(t, &v, d, err);
}

/* Upload columns [c0, c0 + n) of a host weight (a host copy, freed after the upload). */
static ddt_status up_cols(ddt_cuda_target *t, const ddt_qweight *h, int64_t c0, int64_t n, ddt_qweight *d,
                          ddt_error *err) {
    if (c0 == 0 && n == h->cols) return up_w(t, h, d, err);
    ddt_qweight v;
    void *buf;
    ddt_status st = ddt_shard_cols(h, c0, n, &v, &buf, err);
    if (st == DDT_OK) st = up_w(t, &v, d, err);
    free(buf);
    return st;
}

/* Every rank holds a slice of an MLP of intermediate size inter cut in units of unit:
 * unsharded, one rank, or an even split (not the whole on rank 0). */
static bool mlp_on_every_rank(const ddt_cuda_target *t, int64_t inter, int64_t unit) {
    if (!t->sharded || t->shard.world <= 1) return true;
    int64_t i0, n;
    mlp_slice(t, inter, unit, &i0, &n);
    return n > 0 && n < inter;
}

/* The rank's slice of a host MLP: its rows of gate and up, the same columns of down
 * (whole unsharded); *has false, nothing uploaded, where the rank holds none.  The
 * ranks' down outputs are partial sums that the all-reduce after the MLP completes. */
static ddt_status up_mlp(ddt_cuda_target *t, const ddt_cpu_mlp *h, dev_mlp *d, bool *has, ddt_error *err) {
    int64_t i0, n;
    mlp_slice(t, h->gate.rows, ddt_shard_mlp_unit(h), &i0, &n);
    *has = n > 0;
    if (!*has) return DDT_OK;
    ddt_status st;
    if ((st = up_rows(t, &h->gate, i0, n, &d->gate, err)) != DDT_OK) return st;
    if ((st = up_rows(t, &h->up, i0, n, &d->up, err)) != DDT_OK) return st;
    if ((st = mlp_stack(t, d, err)) != DDT_OK) return st;
    return up_cols(t, &h->down, i0, n, &d->down, err);
}

static ddt_status upload_layer(ddt_cuda_target *t, int32_t l, ddt_error *err) {
    const ddt_target_layer *h = &t->desc->layers[l];
    dev_layer *d = &t->layers[l];
    ddt_status st;
    if ((st = up_v(t, &h->attn_norm, &d->attn_norm, err)) != DDT_OK) return st;
    if ((st = up_v(t, &h->mlp_norm, &d->mlp_norm, err)) != DDT_OK) return st;
    /* the rank's heads: q rows and kv_b rows per head are contiguous, o_proj's
       columns per head too (all heads when unsharded or replicated) */
    const int64_t h0 = t->sharded ? t->shard.head0 : 0;
    if (t->dims.q_lora > 0) {
        if ((st = up_w(t, &h->q_a, &d->q_a, err)) != DDT_OK) return st;
        if ((st = up_v(t, &h->q_a_norm, &d->q_a_norm, err)) != DDT_OK) return st;
        if ((st = up_rows(t, &h->q_b, h0 * t->dims.qdim, (int64_t)t->dims.heads * t->dims.qdim, &d->q_b, err)) != DDT_OK) return st;
    } else if ((st = up_rows(t, &h->q_proj, h0 * t->dims.qdim, (int64_t)t->dims.heads * t->dims.qdim, &d->q_proj, err)) != DDT_OK) {
        return st;
    }
    if ((st = up_w(t, &h->kv_a, &d->kv_a, err)) != DDT_OK) return st;
    if (t->dims.q_lora > 0 && (st = stack_pair(&d->q_a, &d->kv_a, &d->qkv_a, err)) != DDT_OK) return st;
    if ((st = up_v(t, &h->kv_a_norm, &d->kv_a_norm, err)) != DDT_OK) return st;
    const int64_t kvb = t->dims.nope + t->dims.vdim;
    if ((st = up_rows(t, &h->kv_b, h0 * kvb, (int64_t)t->dims.heads * kvb, &d->kv_b, err)) != DDT_OK) return st;
    if ((st = make_uk_t(t, d, err)) != DDT_OK) return st;
    if ((st = up_cols(t, &h->o_proj, h0 * t->dims.vdim, (int64_t)t->dims.heads * t->dims.vdim, &d->o_proj, err)) != DDT_OK)
        return st;
    d->moe = h->moe;
    if (!h->moe) return up_mlp(t, &h->mlp, &d->mlp, &d->has_mlp, err);
    if ((st = up_plain(t, &h->router, &d->router, err)) != DDT_OK) return st;
    if ((st = up_v(t, &h->router_bias, &d->router_bias, err)) != DDT_OK) return st;
    /* the rank's routed experts (all of them when unsharded) */
    const int32_t e0 = t->sharded ? t->shard.expert0 : 0, ne = t->sharded ? t->shard.n_experts : t->dims.n_experts;
    ddt_qweight *g = ddt_calloc_array((size_t)ne * 3, sizeof *g);
    if (!g) return ddt_fail(err, DDT_ERR_NOMEM, "layer %d: out of memory for expert views", l);
    ddt_qweight *u = g + ne, *dn = u + ne;
    for (int32_t e = 0; e < ne; e++) {
        g[e] = h->experts[e0 + e].gate;
        u[e] = h->experts[e0 + e].up;
        dn[e] = h->experts[e0 + e].down;
    }
    st = ddt_cuda_moe_layer_upload(g, u, dn, ne, &d->experts, err);
    free(g);
    if (st != DDT_OK) return st;
    d->experts.first_expert = e0;
    d->experts.total_experts = t->dims.n_experts;
    if (t->mm == DDT_CUDA_MM_TENSOR) {
        if ((st = ddt_cuda_moe_layer_pack(&d->experts, err)) != DDT_OK) return st;
    }
    for (int32_t e = e0; e < e0 + ne; e++)
        t->weight_bytes += ddt_cuda_qweight_bytes(&h->experts[e].gate) + ddt_cuda_qweight_bytes(&h->experts[e].up) +
                           ddt_cuda_qweight_bytes(&h->experts[e].down);
    d->has_shared = false;
    if (h->has_shared && (st = up_mlp(t, &h->shared, &d->shared, &d->has_shared, err)) != DDT_OK) return st;
    d->shared_all = h->has_shared && mlp_on_every_rank(t, h->shared.gate.rows, ddt_shard_mlp_unit(&h->shared));
    if ((st = stack_front(t, d, err)) != DDT_OK) return st;
    fuse_shared_down(t, d);
    plan_shared_fork(t, d);
    return DDT_OK;
}

/* The tensor-core projections' workspace (qmatmul_cuda.h): the widest input a
 * forward's tensor-path product reads, for max_tokens tokens.  Inputs: hidden
 * (q_a, kv_a, q_proj, the shared / dense gate and up, the LM head), q_lora
 * (q_b), per head nope (W_UK transposed) and rank (W_UV), heads x vdim (o_proj),
 * an MLP's intermediate (down).  A product left out here is refused at run time
 * (DDT_ERR_RANGE), not run out of bounds. */
static size_t mm_workspace_bytes(const ddt_cuda_target *t) {
    if (t->mm != DDT_CUDA_MM_TENSOR) return 0;
    const ddt_target_dims *d = &t->dims;
    const int64_t in[][2] = {{d->hidden, 1}, {d->q_lora, 1}, {d->nope, d->heads}, {d->rank, d->heads},
                             {(int64_t)d->heads * d->vdim, 1}, {d->inter_max, 1}};
    size_t b = 0;
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        const size_t w = ddt_cuda_matmul_workspace_bytes(in[i][0], (int32_t)in[i][1], t->max_tokens);
        if (w > b) b = w;
    }
    return b;
}

static ddt_status alloc_state(ddt_cuda_target *t, ddt_error *err) {
    const size_t T = (size_t)t->max_tokens, H = (size_t)t->dims.hidden;
    ddt_status st;
#define A(ptr, count, type)                                                             \
    do {                                                                                \
        if ((st = ddt_cuda_malloc_array((void **)&(ptr), (count), sizeof(type), &t->state_bytes, err)) != DDT_OK) return st; \
    } while (0)
    A(t->x, T * H, float);
    A(t->xn, T * H, float);
    A(t->tmp, T * H, float);
    A(t->acc, T * H, float);
    A(t->qa, T * (size_t)(t->dims.q_lora > 0 ? t->dims.q_lora + t->dims.rank + t->dims.rope : 1), float);
    A(t->q, T * (size_t)t->dims.heads * (size_t)t->dims.qdim, float);
    A(t->kva, T * (size_t)(t->dims.rank + t->dims.rope), float);
    A(t->kvn, T * (size_t)t->dims.rank, float);
    A(t->q_lat, T * (size_t)t->dims.heads * (size_t)t->dims.rank, float);
    A(t->o_lat, T * (size_t)t->dims.heads * (size_t)t->dims.rank, float);
    A(t->o_v, T * (size_t)t->dims.heads * (size_t)t->dims.vdim, float);
    A(t->g, T * 2 * (size_t)t->dims.inter_max, float);
    A(t->u, T * (size_t)t->dims.inter_max, float);
    if (t->fast) {
        A(t->q16, T * (size_t)t->dims.heads * (size_t)(t->dims.rank + t->dims.rope), uint16_t);
        A(t->causal, T, uint64_t);
        t->mla_ws_bytes = ddt_cuda_mla_verify_workspace(t->max_tokens, t->dims.heads, t->max_ctx);
        if ((st = ddt_cuda_malloc_array(&t->mla_ws, t->mla_ws_bytes, 1, &t->state_bytes, err)) != DDT_OK) return st;
    } else {
        const size_t ws = ddt_cuda_mla_attn_workspace(t->max_tokens, t->dims.heads, t->dims.rank, t->dims.rope,
                                                      t->max_ctx);
        if (ws == 0)
            return ddt_fail(err, DDT_ERR_UNSUPPORTED, "exact attention: %d tokens x %d heads, rank %d + %d, %d rows",
                            t->max_tokens, t->dims.heads, t->dims.rank, t->dims.rope, t->max_ctx);
        if ((st = ddt_cuda_malloc_array(&t->attn_ws, ws, 1, &t->state_bytes, err)) != DDT_OK) return st;
        /* on the target's stream, ahead of every forward */
        if ((st = ddt_cuda_mla_attn_prepare(t->attn_ws, t->max_tokens, t->dims.heads, t->dims.rank, t->dims.rope,
                                            t->max_ctx, t->stream, err)) != DDT_OK)
            return st;
    }
    A(t->iota, T, int32_t);
    if (t->head_split) {
        A(t->head_part, T * (size_t)t->head_n, float);
        A(t->head_all, (size_t)t->shard.world * T * (size_t)t->head_n, float);
    }
    t->mm_ws_bytes = mm_workspace_bytes(t);
    if (t->mm_ws_bytes > 0 && (st = ddt_cuda_malloc_array(&t->mm_ws, t->mm_ws_bytes, 1, &t->state_bytes, err)) != DDT_OK)
        return st;
    if (t->mm_ws_bytes > 0 && (st = ddt_cuda_malloc_array(&t->mm_next, t->mm_ws_bytes, 1, &t->state_bytes, err)) != DDT_OK)
        return st;
    A(t->cos_t, (size_t)t->max_ctx * (size_t)(t->dims.rope / 2), float);
    A(t->sin_t, (size_t)t->max_ctx * (size_t)(t->dims.rope / 2), float);
    if (t->dims.n_experts > 0) {
        A(t->rlogits, T * (size_t)t->dims.n_experts, float);
        int64_t front = 0; /* the widest stacked front (loaded before this runs) */
        for (int32_t l = 0; l < t->dims.n_layers; l++)
            if (t->layers[l].front.data && t->layers[l].front.rows > front) front = t->layers[l].front.rows;
        if (front > 0) A(t->front, T * (size_t)front, float);
        A(t->ridx, T * (size_t)t->dims.top_k, int32_t);
        A(t->rw, T * (size_t)t->dims.top_k, float);
    }
    if (t->n_capture > 0) A(t->capture, (size_t)t->n_capture * T * H, float);
    const size_t width = (size_t)(t->dims.rank + t->dims.rope);
    const size_t elem = t->fast ? 2 : sizeof(float);
    if ((st = ddt_cuda_malloc_array(&t->kv.data, (size_t)t->dims.n_layers * (size_t)t->max_ctx * width, elem, &t->state_bytes, err)) != DDT_OK) return st;
    A(t->kv.len, 1, int32_t);
    A(t->kv.status, 1, int32_t);
    A(t->kv.ticket, 1, uint32_t); /* makes the commit one launch (kv_cuda.h) */
#undef A
    t->kv.n_layers = t->dims.n_layers;
    t->kv.capacity = t->max_ctx;
    t->kv.row_bytes = (int32_t)(width * elem);
    DDT_CUDA_TRY(cudaMemset(t->kv.len, 0, sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMemset(t->kv.status, 0, sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMemset(t->kv.ticket, 0, sizeof(uint32_t)), err);
    /* iota (prefill depths) and the RoPE tables, computed by the CPU code */
    const size_t half = (size_t)(t->dims.rope / 2);
    int32_t *io = malloc(T * sizeof *io);
    float *cs = malloc((size_t)t->max_ctx * half * sizeof *cs), *sn = malloc((size_t)t->max_ctx * half * sizeof *sn);
    if (!io || !cs || !sn) {
        free(io), free(cs), free(sn);
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the RoPE tables");
    }
    for (size_t i = 0; i < T; i++) io[i] = (int32_t)i;
    if (t->fast) {
        uint64_t causal[DDT_MLA_MAX_TOKENS];
        for (size_t i = 0; i < T; i++) causal[i] = i == 63 ? ~0ull : (2ull << i) - 1;
        cudaError_t ce = cudaMemcpy(t->causal, causal, T * sizeof(uint64_t), cudaMemcpyHostToDevice);
        if (ce != cudaSuccess) {
            free(io), free(cs), free(sn);
            DDT_CUDA_TRY(ce, err);
        }
    }
    ddt_status rst = ddt_target_rope_table(t->cfg, 0, t->max_ctx, cs, sn, err);
    if (rst != DDT_OK) {
        free(io), free(cs), free(sn);
        return rst;
    }
    cudaError_t e1 = cudaMemcpy(t->iota, io, T * sizeof *io, cudaMemcpyHostToDevice);
    cudaError_t e2 = cudaMemcpy(t->cos_t, cs, (size_t)t->max_ctx * half * sizeof *cs, cudaMemcpyHostToDevice);
    cudaError_t e3 = cudaMemcpy(t->sin_t, sn, (size_t)t->max_ctx * half * sizeof *sn, cudaMemcpyHostToDevice);
    free(io), free(cs), free(sn);
    DDT_CUDA_TRY(e1, err);
    DDT_CUDA_TRY(e2, err);
    DDT_CUDA_TRY(e3, err);
    if (t->dims.n_experts > 0) {
        for (int32_t l = 0; l < t->dims.n_layers; l++)
            if (t->layers[l].moe) {
                t->moe_ws_bytes = ddt_cuda_moe_workspace_bytes(&t->layers[l].experts, t->max_tokens, t->dims.top_k);
                break;
            }
        if ((st = ddt_cuda_malloc_array(&t->moe_ws, t->moe_ws_bytes, 1, &t->state_bytes, err)) != DDT_OK) return st;
    }
    return DDT_OK;
}

/* Sizes and options every forward reads, from the config. */
static void init_dims(ddt_cuda_target *t, const ddt_model_config *c, const ddt_cuda_target_options *opts) {
    t->cfg = c;
    t->max_ctx = opts->max_ctx;
    t->max_tokens = opts->max_tokens;
    ddt_target_dims_fill(c, &t->dims);
    t->n_capture = opts->n_capture;
    for (int32_t i = 0; i < opts->n_capture; i++) t->capture_layer[i] = opts->capture_layers[i];
    t->fast = opts->fast_attention;
    t->mm = opts->tensor_cores ? DDT_CUDA_MM_TENSOR : DDT_CUDA_MM_FP32;
    t->fork_opt = opts->shared_fork;
    t->route = ddt_target_route_params(c, &t->dims);
}

/* The rank's part of the model (model/shard.h); after init_dims. */
static ddt_status setup_shard(ddt_cuda_target *t, const ddt_cuda_target_options *opts, ddt_error *err) {
    if (opts->shard_world == 0) return DDT_OK;
    if (!opts->allreduce) return ddt_fail(err, DDT_ERR_INVALID, "a sharded target needs an all-reduce function");
    ddt_status st = ddt_shard_plan(t->cfg, opts->shard_rank, opts->shard_world, &t->shard, err);
    if (st != DDT_OK) return st;
    t->sharded = true;
    t->dims.heads = t->shard.n_heads;
    t->allreduce = opts->allreduce;
    t->allreduce_ctx = opts->allreduce_ctx;
    t->allgather = opts->allgather;
    if (t->allgather) ddt_shard_vocab_slice(&t->shard, t->dims.vocab, &t->head_v0, &t->head_n, &t->head_split);
    /* the largest sum a forward asks for: a hidden row a token (target_cuda.h: the reservation) */
    return t->allreduce(t->allreduce_ctx, NULL, (int64_t)t->max_tokens * t->dims.hidden, NULL, err);
}

/* Before the upload: the rank's weights as stored and its KV cache, a lower bound of
 * what it allocates (model/shard.h), against the GPU's free memory, so that a
 * model too large for it fails at once with the figures and what would fit
 * (more GPUs, a shorter context) instead of out of memory minutes into the upload. */
static ddt_status check_memory(const ddt_cuda_target *t, uint64_t also, ddt_error *err) {
    size_t free_b = 0, total_b = 0;
    int dev = 0;
    DDT_CUDA_TRY(cudaGetDevice(&dev), err);
    DDT_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b), err);
    return ddt_shard_memory_check(t->desc, t->sharded ? &t->shard : NULL, t->max_ctx, t->fast ? 2 : (int32_t)sizeof(float),
                                  also, (uint64_t)free_b, dev, err);
}

static ddt_status check_fast(const ddt_cuda_target *t, ddt_error *err) {
    if (t->fast && (t->dims.rank != DDT_MLA_DV || t->dims.rank + t->dims.rope != DDT_MLA_DK || t->max_tokens > DDT_MLA_MAX_TOKENS))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "fast attention needs kv_lora_rank %d + qk_rope_head_dim %d and <= %d tokens per forward "
                        "(have %d + %d, %d)", DDT_MLA_DV, DDT_MLA_DK - DDT_MLA_DV, DDT_MLA_MAX_TOKENS, t->dims.rank,
                        t->dims.rope, t->max_tokens);
    return DDT_OK;
}

ddt_status ddt_cuda_target_load(const char *dir, const ddt_cuda_target_options *opts, ddt_cuda_target **out,
                                ddt_error *err) {
    if (!dir || !opts || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_target_load: NULL argument");
    *out = NULL;
    if (opts->max_ctx < 1 || opts->max_tokens < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "target options: max_ctx %d and max_tokens %d must be >= 1",
                        opts->max_ctx, opts->max_tokens);
    int dev_count = 0;
    if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count < 1)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "--backend cuda: no CUDA device is available");
    ddt_cuda_target *t = calloc(1, sizeof *t);
    if (!t) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    /* the description checks the config, the capture list and every tensor, as
       the CPU target's load does and with its messages */
    ddt_status st = ddt_target_capture_check(opts->capture_layers, opts->n_capture, err);
    if (st != DDT_OK) {
        free(t);
        return st;
    }
    t->desc = calloc(1, sizeof *t->desc);
    if (!t->desc) {
        free(t);
        return ddt_fail(err, DDT_ERR_NOMEM, "model %s: out of memory", dir);
    }
    if ((st = ddt_target_desc_load(dir, opts->capture_layers, opts->n_capture, t->desc, err)) != DDT_OK) {
        ddt_error_prefix(err, "model %s: ", dir);
        ddt_target_desc_free(t->desc);
        free(t->desc);
        free(t);
        return st;
    }
    init_dims(t, &t->desc->cfg, opts);
    if ((st = setup_shard(t, opts, err)) != DDT_OK) goto fail;
    if ((st = check_fast(t, err)) != DDT_OK) goto fail;
    if ((st = check_memory(t, opts->also_bytes, err)) != DDT_OK) goto fail;
    if (cudaStreamCreateWithFlags(&t->stream, cudaStreamNonBlocking) != cudaSuccess) {
        st = ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: cannot create a stream");
        goto fail;
    }
    t->tied = t->cfg->tie_word_embeddings;
    if ((st = up_plain(t, &t->desc->embed, &t->embed, err)) != DDT_OK) goto fail;
    if (t->tied && (st = pack_w(t, &t->embed, err)) != DDT_OK) goto fail; /* it is the LM head too */
    if (t->tied) t->lm_head = t->embed;
    else if ((st = up_w(t, &t->desc->lm_head, &t->lm_head, err)) != DDT_OK) goto fail;
    if ((st = up_v(t, &t->desc->final_norm, &t->final_norm, err)) != DDT_OK) goto fail;
    t->layers = ddt_calloc_array((size_t)t->dims.n_layers, sizeof *t->layers);
    if (!t->layers) {
        st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t l = 0; l < t->dims.n_layers; l++)
        if ((st = upload_layer(t, l, err)) != DDT_OK) goto fail;
    if ((st = make_side(t, err)) != DDT_OK) goto fail;
    if ((st = alloc_state(t, err)) != DDT_OK) goto fail;
    *out = t;
    return DDT_OK;
fail:
    ddt_error_prefix(err, "model %s (cuda): ", dir);
    ddt_cuda_target_free(t);
    return st;
}

/* ------------------------------------------------------------------ synthetic */

static ddt_status rand_w(ddt_cuda_target *t, ddt_qformat f, int64_t rows, int64_t cols, uint64_t *seed,
                         ddt_qweight *w, ddt_error *err) {
    /* amp ~ 1/sqrt(cols) keeps activations O(1) through the layers */
    float amp = 1.0f / sqrtf((float)cols);
    ddt_dtype dt = f == DDT_Q_DENSE ? DDT_DTYPE_BF16 : f == DDT_Q_FP8_BLOCK ? DDT_DTYPE_F8_E4M3 : DDT_DTYPE_I32;
    if (f == DDT_Q_FP8_BLOCK) amp /= 240.0f; /* FP8 values reach +-448: scales bring them to amp */
    if (f == DDT_Q_INT4_GROUP) amp /= 8.0f;  /* nibbles reach +-8 */
    ddt_status st = ddt_cuda_qweight_random(f, dt, rows, cols, amp, (*seed)++, w, err);
    if (st == DDT_OK) t->weight_bytes += ddt_cuda_qweight_bytes(w);
    return st != DDT_OK ? st : pack_w(t, w, err);
}

static ddt_status ones(ddt_cuda_target *t, int64_t n, float **p, ddt_error *err) {
    DDT_CUDA_TRY(cudaMalloc((void **)p, sizeof(float) * (size_t)n), err);
    t->weight_bytes += sizeof(float) * (uint64_t)n;
    return ddt_cuda_fill_uniform(*p, n, 1.0f, 1.0f, 0, t->stream, err);
}

/* The unit a synthetic MLP of format f is cut in (ddt_cuda_qweight_random's FP8 blocks). */
static int64_t synth_mlp_unit(ddt_qformat f) {
    return ddt_shard_mlp_unit_of(f, f == DDT_Q_FP8_BLOCK ? DDT_FP8_BLOCK : 0);
}

/* The rank's slice of an MLP of intermediate size inter, as up_mlp cuts it. */
static ddt_status rand_mlp(ddt_cuda_target *t, ddt_qformat f, int64_t inter, uint64_t *seed, dev_mlp *m, bool *has,
                           ddt_error *err) {
    int64_t i0, n;
    mlp_slice(t, inter, synth_mlp_unit(f), &i0, &n);
    *has = n > 0;
    if (!*has) return DDT_OK;
    ddt_status st;
    if ((st = rand_w(t, f, n, t->dims.hidden, seed, &m->gate, err)) != DDT_OK) return st;
    if ((st = rand_w(t, f, n, t->dims.hidden, seed, &m->up, err)) != DDT_OK) return st;
    if ((st = mlp_stack(t, m, err)) != DDT_OK) return st;
    return rand_w(t, f, t->dims.hidden, n, seed, &m->down, err);
}

static ddt_status rand_layer(ddt_cuda_target *t, int32_t l, const ddt_cuda_synth_options *so, uint64_t *seed,
                             ddt_error *err) {
    const ddt_model_config *c = t->cfg;
    dev_layer *d = &t->layers[l];
    const ddt_qformat f = so->dense_format;
    ddt_status st;
    const int64_t qrows = (int64_t)t->dims.heads * t->dims.qdim;
    if ((st = ones(t, t->dims.hidden, &d->attn_norm, err)) || (st = ones(t, t->dims.hidden, &d->mlp_norm, err)) ||
        (st = ones(t, t->dims.rank, &d->kv_a_norm, err)))
        return st;
    if (t->dims.q_lora > 0) {
        if ((st = rand_w(t, f, t->dims.q_lora, t->dims.hidden, seed, &d->q_a, err)) || (st = ones(t, t->dims.q_lora, &d->q_a_norm, err)) ||
            (st = rand_w(t, f, qrows, t->dims.q_lora, seed, &d->q_b, err)))
            return st;
    } else if ((st = rand_w(t, f, qrows, t->dims.hidden, seed, &d->q_proj, err))) {
        return st;
    }
    if ((st = rand_w(t, f, t->dims.rank + t->dims.rope, t->dims.hidden, seed, &d->kv_a, err)) ||
        (t->dims.q_lora > 0 && (st = stack_pair(&d->q_a, &d->kv_a, &d->qkv_a, err))) ||
        (st = rand_w(t, f, (int64_t)t->dims.heads * (t->dims.nope + t->dims.vdim), t->dims.rank, seed, &d->kv_b, err)) ||
        (st = rand_w(t, f, t->dims.hidden, (int64_t)t->dims.heads * t->dims.vdim, seed, &d->o_proj, err)) ||
        (st = make_uk_t(t, d, err)))
        return st;
    d->moe = ddt_config_layer_is_moe(c, l);
    if (!d->moe) return rand_mlp(t, f, c->intermediate_size, seed, &d->mlp, &d->has_mlp, err);
    /* router and its bias stay bf16 / fp32 in every checkpoint */
    if ((st = rand_w(t, DDT_Q_DENSE, t->dims.n_experts, t->dims.hidden, seed, &d->router, err))) return st;
    DDT_CUDA_TRY(cudaMalloc((void **)&d->router_bias, sizeof(float) * (size_t)t->dims.n_experts), err);
    if ((st = ddt_cuda_fill_uniform(d->router_bias, t->dims.n_experts, -0.01f, 0.01f, (*seed)++, t->stream, err))) return st;
    const ddt_qformat ef = so->expert_format;
    ddt_dtype edt = ef == DDT_Q_DENSE ? DDT_DTYPE_BF16 : ef == DDT_Q_FP8_BLOCK ? DDT_DTYPE_F8_E4M3 : DDT_DTYPE_I32;
    float amp = 1.0f / sqrtf((float)t->dims.hidden) / (ef == DDT_Q_INT4_GROUP ? 8.0f : ef == DDT_Q_FP8_BLOCK ? 240.0f : 1.0f);
    const int32_t ne = t->sharded ? t->shard.n_experts : t->dims.n_experts;
    if ((st = ddt_cuda_moe_layer_random(ne, t->dims.hidden, c->moe_intermediate_size, ef, edt, amp, (*seed)++,
                                        &d->experts, err)))
        return st;
    d->experts.first_expert = t->sharded ? t->shard.expert0 : 0;
    d->experts.total_experts = t->dims.n_experts;
    if (t->mm == DDT_CUDA_MM_TENSOR) {
        if ((st = ddt_cuda_moe_layer_pack(&d->experts, err)) != DDT_OK) return st;
    }
    for (int32_t e = 0; e < ne; e++)
        t->weight_bytes += 3 * ddt_cuda_qweight_bytes(&d->experts.host_copy[e]);
    d->has_shared = false;
    const int64_t shared_inter = (int64_t)c->moe_intermediate_size * c->n_shared_experts;
    if (c->n_shared_experts > 0 && (st = rand_mlp(t, f, shared_inter, seed, &d->shared, &d->has_shared, err)))
        return st;
    d->shared_all = c->n_shared_experts > 0 && mlp_on_every_rank(t, shared_inter, synth_mlp_unit(f));
    if ((st = stack_front(t, d, err)) != DDT_OK) return st;
    fuse_shared_down(t, d);
    plan_shared_fork(t, d);
    return DDT_OK;
}

ddt_status ddt_cuda_target_synthetic(const ddt_model_config *cfg, const ddt_cuda_target_options *opts,
                                     const ddt_cuda_synth_options *so, ddt_cuda_target **out, ddt_error *err) {
    if (!cfg || !opts || !so || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_target_synthetic: NULL argument");
    *out = NULL;
    if (opts->max_ctx < 1 || opts->max_tokens < 1 || cfg->num_hidden_layers < 1 || cfg->hidden_size < 1 ||
        cfg->num_attention_heads < 1 || cfg->kv_lora_rank < 1 || cfg->vocab_size < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "synthetic target: bad sizes");
    if (so->dense_format == DDT_Q_INT4_GROUP)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "synthetic target: INT4 is for routed experts only");
    ddt_cuda_target *t = calloc(1, sizeof *t);
    if (!t) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    t->synth_cfg = *cfg;
    t->synth_cfg.ignore = NULL;
    t->synth_cfg.n_ignore = 0;
    t->synth_cfg.priv = NULL;
    init_dims(t, &t->synth_cfg, opts);
    ddt_status st = setup_shard(t, opts, err);
    if (st == DDT_OK) st = check_fast(t, err);
    if (st != DDT_OK) {
        free(t);
        return st;
    }
    uint64_t seed = so->seed;
    if (cudaStreamCreateWithFlags(&t->stream, cudaStreamNonBlocking) != cudaSuccess) {
        st = ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: cannot create a stream");
        goto fail;
    }
    if ((st = rand_w(t, DDT_Q_DENSE, t->dims.vocab, t->dims.hidden, &seed, &t->embed, err))) goto fail;
    t->tied = !so->lm_head; /* without its own head the logits come from the embedding (still [vocab][hidden]) */
    if (t->tied) t->lm_head = t->embed;
    else if ((st = rand_w(t, DDT_Q_DENSE, t->dims.vocab, t->dims.hidden, &seed, &t->lm_head, err))) goto fail;
    if ((st = ones(t, t->dims.hidden, &t->final_norm, err))) goto fail;
    t->layers = ddt_calloc_array((size_t)t->dims.n_layers, sizeof *t->layers);
    if (!t->layers) {
        st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t l = 0; l < t->dims.n_layers; l++)
        if ((st = rand_layer(t, l, so, &seed, err))) goto fail;
    if ((st = make_side(t, err))) goto fail;
    if ((st = alloc_state(t, err))) goto fail;
    DDT_CUDA_TRY(cudaStreamSynchronize(t->stream), err);
    *out = t;
    return DDT_OK;
fail:
    ddt_error_prefix(err, "synthetic target: ");
    ddt_cuda_target_free(t);
    return st;
}

static void free_mlp(dev_mlp *m) {
    ddt_cuda_qweight_free(&m->gate);
    ddt_cuda_qweight_free(&m->up);
    ddt_cuda_qweight_free(&m->down);
    ddt_cuda_qweight_free(&m->gate_up);
}

void ddt_cuda_target_free(ddt_cuda_target *t) {
    if (!t) return;
    if (t->stream) cudaStreamSynchronize(t->stream);
    if (t->layers) {
        for (int32_t l = 0; l < t->dims.n_layers; l++) {
            dev_layer *d = &t->layers[l];
            float *vecs[] = {d->attn_norm, d->mlp_norm, d->q_a_norm, d->kv_a_norm, d->router_bias};
            for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) ddt_cuda_free(vecs[i]);
            ddt_qweight *ws[] = {&d->q_proj, &d->q_a, &d->q_b, &d->kv_a, &d->qkv_a, &d->kv_b, &d->uk_t, &d->o_proj,
                                 &d->router, &d->front};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) ddt_cuda_qweight_free(ws[i]);
            free_mlp(&d->mlp);
            free_mlp(&d->shared);
            if (d->moe) ddt_cuda_moe_layer_free(&d->experts);
        }
        free(t->layers);
    }
    ddt_cuda_qweight_free(&t->embed);
    if (!t->tied) ddt_cuda_qweight_free(&t->lm_head);
    void *bufs[] = {t->final_norm, t->cos_t, t->sin_t, t->kv.data, t->kv.len, t->kv.status, t->kv.ticket, t->x,
                    t->xn, t->qa, t->q, t->kva, t->kvn, t->q_lat, t->o_lat, t->o_v, t->tmp, t->acc, t->g, t->u,
                    t->rlogits, t->front, t->rw, t->attn_ws, t->ridx, t->iota, t->moe_ws, t->mm_ws, t->mm_next,
                    t->capture, t->q16, t->causal, t->mla_ws, t->head_part, t->head_all};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ddt_cuda_free(bufs[i]);
    if (t->stream) cudaStreamDestroy(t->stream);
    if (t->side) cudaStreamDestroy(t->side);
    if (t->fork_ev) cudaEventDestroy(t->fork_ev);
    if (t->join_ev) cudaEventDestroy(t->join_ev);
    if (t->desc) {
        ddt_target_desc_free(t->desc);
        free(t->desc);
    }
    free(t);
}

const ddt_model_config *ddt_cuda_target_config(const ddt_cuda_target *t) { return t->cfg; }
int32_t ddt_cuda_target_vocab(const ddt_cuda_target *t) { return t->dims.vocab; }
int32_t ddt_cuda_target_max_ctx(const ddt_cuda_target *t) { return t->max_ctx; }
int64_t ddt_cuda_target_head_rows(const ddt_cuda_target *t) { return t->head_split ? t->head_n : t->dims.vocab; }

int32_t ddt_cuda_target_stacked_fronts(const ddt_cuda_target *t) {
    int32_t k = 0;
    for (int32_t l = 0; l < t->dims.n_layers; l++) k += t->layers[l].front.data != NULL;
    return k;
}

int32_t ddt_cuda_target_forked_layers(const ddt_cuda_target *t) {
    int32_t k = 0;
    for (int32_t l = 0; l < t->dims.n_layers; l++) k += t->layers[l].shared_fork;
    return k;
}
int32_t ddt_cuda_target_max_tokens(const ddt_cuda_target *t) { return t->max_tokens; }
void *ddt_cuda_target_stream(const ddt_cuda_target *t) { return t->stream; }
const ddt_cuda_kv *ddt_cuda_target_kv(const ddt_cuda_target *t) { return &t->kv; }
const ddt_qweight *ddt_cuda_target_embed(const ddt_cuda_target *t) { return &t->embed; }
const ddt_qweight *ddt_cuda_target_lm_head(const ddt_cuda_target *t) { return &t->lm_head; }
const float *ddt_cuda_target_hidden(const ddt_cuda_target *t, int32_t slot) {
    if (slot < 0 || slot >= t->n_capture) return NULL;
    return t->capture + (size_t)slot * (size_t)t->max_tokens * (size_t)t->dims.hidden;
}
uint64_t ddt_cuda_target_weight_bytes(const ddt_cuda_target *t) { return t->weight_bytes; }
uint64_t ddt_cuda_target_state_bytes(const ddt_cuda_target *t) { return t->state_bytes; }

ddt_status ddt_cuda_target_fake_context(ddt_cuda_target *t, int32_t len, uint64_t seed, ddt_error *err) {
    if (len < 0 || len >= t->max_ctx)
        return ddt_fail(err, DDT_ERR_RANGE, "fake context of %d rows in a cache of %d", len, t->max_ctx);
    ddt_status st = ddt_cuda_mla_cache_fill(t->kv.data, t->dims.n_layers, t->max_ctx, t->dims.rank + t->dims.rope, len, t->fast,
                                            seed, t->stream, err);
    if (st != DDT_OK) return st;
    return ddt_cuda_kv_set_len(&t->kv, len, t->stream, err);
}

ddt_status ddt_cuda_target_rewind(ddt_cuda_target *t, int32_t len, ddt_error *err) {
    if (len < 0 || len >= t->max_ctx)
        return ddt_fail(err, DDT_ERR_RANGE, "rewind to %d rows in a cache of %d", len, t->max_ctx);
    return ddt_cuda_kv_set_len(&t->kv, len, t->stream, err);
}

ddt_status ddt_cuda_target_reset(ddt_cuda_target *t, ddt_error *err) {
    return ddt_cuda_kv_set_len(&t->kv, 0, t->stream, err);
}

/* ------------------------------------------------------------------ forward */

#define TRY(call)                              \
    do {                                       \
        ddt_status st_ = (call);               \
        if (st_ != DDT_OK) return st_;         \
    } while (0)

/* out[n][hidden] = down(silu(g) * u).  Paired (m->paired): gu holds silu(g) * u
 * already (ddt_cuda_matmul_swiglu), a plain product.  Else gate | up side by side
 * at gu (row stride ld): ddt_cuda_matmul_silu_mode, one launch on the FP32 path
 * for an ar step (bitwise silu_mul then down), those two for a verify or with the
 * tensor cores (whose product splits its activations into mm_ws first), g
 * overwritten. */
/* ws: the split workspace (mm_ws, or mm_next on the side branch: apart from the
   planes the main stream's products read meanwhile) */
static ddt_status mlp_down_on(ddt_cuda_target *t, const dev_mlp *m, float *gu, int64_t ld, int32_t n, float *out,
                              void *ws, cudaStream_t s, ddt_error *err) {
    const int64_t inter = m->down.cols;
    if (m->paired)
        return ddt_cuda_matmul_mode(&m->down, t->mm, gu, ld, n, out, t->dims.hidden, ws, t->mm_ws_bytes, s, err);
    return ddt_cuda_matmul_silu_mode(&m->down, t->mm, gu, ld, gu + inter, ld, n, out, t->dims.hidden, ws,
                                     t->mm_ws_bytes, s, err);
}

static ddt_status mlp_down(ddt_cuda_target *t, const dev_mlp *m, float *gu, int64_t ld, int32_t n, float *out,
                           ddt_error *err) {
    return mlp_down_on(t, m, gu, ld, n, out, t->mm_ws, t->stream, err);
}

/* out[n][hidden] = down(silu(gate(in)) * up(in)) */
static ddt_status mlp_forward(ddt_cuda_target *t, const dev_mlp *m, const float *in, int32_t n, float *out,
                              ddt_error *err) {
    const int64_t inter = m->gate_up.data ? m->gate_up.rows / 2 : m->gate.rows;
    if (m->paired) { /* silu(g) * u in t->g */
        TRY(ddt_cuda_matmul_swiglu(&m->gate_up, 0, in, t->dims.hidden, n, t->g, inter, t->stream, err));
        return mlp_down(t, m, t->g, inter, n, out, err);
    }
    if (m->gate_up.data) { /* g | u side by side in t->g */
        TRY(ddt_cuda_matmul_mode(&m->gate_up, t->mm, in, t->dims.hidden, n, t->g, 2 * inter,
                                 t->mm_ws, t->mm_ws_bytes, t->stream, err));
        return mlp_down(t, m, t->g, 2 * inter, n, out, err);
    }
    TRY(ddt_cuda_matmul_mode(&m->gate, t->mm, in, t->dims.hidden, n, t->g, inter,
                             t->mm_ws, t->mm_ws_bytes, t->stream, err));
    TRY(ddt_cuda_matmul_mode(&m->up, t->mm, in, t->dims.hidden, n, t->u, inter,
                             t->mm_ws, t->mm_ws_bytes, t->stream, err));
    return ddt_cuda_matmul_silu_mode(&m->down, t->mm, t->g, inter, t->u, inter, n, out, t->dims.hidden, t->mm_ws,
                                     t->mm_ws_bytes, t->stream, err);
}

/* Layer l's rows of the latent cache. */
static char *layer_cache_of(const ddt_cuda_target *t, int32_t l) {
    return (char *)t->kv.data + (size_t)l * (size_t)t->max_ctx * (size_t)t->kv.row_bytes;
}

/* rope_write's arguments for layer l's n tokens (kva: kv_a's output, row stride kva_ld;
 * q16: the rotated queries' bf16 also into the fast attention's query, see q16_pre). */
static ddt_cuda_mla_rope_args rope_args(const ddt_cuda_target *t, int32_t l, int32_t n, const int32_t *depth,
                                        const float *kva, int64_t kva_ld, bool q16) {
    char *layer_cache = layer_cache_of(t, l);
    const ddt_cuda_mla_rope_args ra = {.n = n, .heads = t->dims.heads, .nope = t->dims.nope, .rope = t->dims.rope,
                                       .rank = t->dims.rank, .qdim = t->dims.qdim,
                                       .interleave = t->cfg->rope_interleave, .len = t->kv.len, .depth = depth,
                                       .cos_t = t->cos_t, .sin_t = t->sin_t, .max_pos = t->max_ctx, .q = t->q,
                                       .kvn = t->kvn, .kva = kva, .kva_ld = (int32_t)kva_ld, .cache = layer_cache,
                                       .capacity = t->max_ctx, .bf16_cache = t->fast,
                                       .q16 = q16 ? t->q16 : NULL};
    return ra;
}

/* The query rope can be applied where the rows are made: a q latent (q_b makes
 * the queries), interleaved rope pairs and even sizes, so that a pair's two rows
 * share a warp (FP32 path) or meet by one shuffle (the wgmma epilogue). */
static bool rope_pairs_fold(const ddt_cuda_target *t) {
    return t->dims.q_lora > 0 && t->cfg->rope_interleave && t->dims.nope % 2 == 0 && t->dims.rope % 2 == 0 &&
           t->dims.rope >= 2;
}

/* Whether rope_write's halves run inside the norms' launch and q_b's product
 * (ddt_cuda_mla_norm_write, ddt_cuda_matmul_rope): q_b on the FP32 path (the
 * tensor-core path folds them as rope_folds_tc says). */
static bool rope_folds(const ddt_cuda_target *t) { return t->mm == DDT_CUDA_MM_FP32 && rope_pairs_fold(t); }

/* The same fold on the tensor-core path: q_b on the wgmma kernel, whose epilogue
 * applies the rope (ddt_cuda_next_planes.rope); the cache row in the norms' launch
 * beside q_b's split planes (ddt_cuda_mla_norm_write's sp0). */
static bool rope_folds_tc(const ddt_cuda_target *t, const dev_layer *L) {
    return t->mm == DDT_CUDA_MM_TENSOR && rope_pairs_fold(t) && ddt_cuda_matmul_writes_next(&L->q_b, t->mm);
}

static ddt_status capture_store(ddt_cuda_target *t, int32_t layer, const float *src, int32_t n, ddt_error *err) {
    for (int32_t s = 0; s < t->n_capture; s++)
        if (t->capture_layer[s] == layer)
            DDT_CUDA_TRY(cudaMemcpyAsync(t->capture + (size_t)s * t->max_tokens * t->dims.hidden, src,
                                         sizeof(float) * (size_t)n * t->dims.hidden, cudaMemcpyDeviceToDevice, t->stream),
                         err);
    return DDT_OK;
}

void ddt_cuda_target_set_probe(ddt_cuda_target *t, const ddt_cuda_target_probe *p) {
    if (p) t->probe = *p;
    else memset(&t->probe, 0, sizeof t->probe);
}

/* Tests' probe: n rows of row_bytes from src to layer l's block of dst (NULL: nothing). */
static ddt_status probe_copy(ddt_cuda_target *t, void *dst, int32_t l, size_t rows_per_layer, size_t row_bytes,
                             const void *src, int32_t n, ddt_error *err) {
    if (!dst || !src) return DDT_OK; /* no probe set: every destination is NULL */
    DDT_CUDA_TRY(cudaMemcpyAsync((char *)dst + (size_t)l * rows_per_layer * row_bytes, src, (size_t)n * row_bytes,
                                 cudaMemcpyDeviceToDevice, t->stream),
                 err);
    return DDT_OK;
}

/* The split planes (cuda_types.h) w's product reads at n tokens when its input's
 * producer writes them (the tensor-core mode's wgmma path), else none (hi NULL). */
static ddt_cuda_split_planes planes_for(const ddt_cuda_target *t, const ddt_qweight *w, int32_t n) {
    ddt_cuda_split_planes p;
    if (!w || !w->data || !ddt_cuda_matmul_split_planes(w, t->mm, n, t->mm_ws, t->mm_ws_bytes, &p))
        memset(&p, 0, sizeof p);
    return p;
}

/* Layer l's one product of its normed input xn (q_a | kv_a stacked), whose split
 * the norm before it may write; NULL when xn feeds several (q_proj and kv_a). */
static const ddt_qweight *attn_input_product(const ddt_cuda_target *t, int32_t l) {
    const dev_layer *L = &t->layers[l];
    return t->dims.q_lora > 0 && L->qkv_a.data ? &L->qkv_a : NULL;
}

/* Where the product `from` writes, in its epilogue, the split planes of the
 * grouped product `to` (count groups of `width` output columns, `cols` of each
 * read) into mm_next, so that `to` runs without its split launch: true and *out
 * set when both are on the wgmma path (ddt_cuda_matmul_writes_next). */
static bool next_planes_for(const ddt_cuda_target *t, const ddt_qweight *from, const ddt_qweight *to, int32_t count,
                            int64_t width, int64_t cols, int32_t n, ddt_cuda_next_planes *out) {
    memset(out, 0, sizeof *out);
    if (!from || !from->data || !to || !to->data || !ddt_cuda_matmul_writes_next(from, t->mm) ||
        !ddt_cuda_matmul_split_planes_grouped(to, t->mm, count, n, t->mm_next, t->mm_ws_bytes, &out->planes))
        return false;
    out->width = width;
    out->cols = cols;
    return true;
}

/* x W^T of the normed input whose split planes the norm wrote for this weight
 * (planes.hi), or the plain product that splits x itself; next (from
 * next_planes_for, or NULL): the epilogue also writes the next product's planes. */
static ddt_status product_of_normed(ddt_cuda_target *t, const ddt_qweight *w, const ddt_cuda_split_planes *planes,
                                    const float *x, int64_t ldx, int32_t n, float *y, int64_t ldy,
                                    const ddt_cuda_next_planes *next, ddt_error *err) {
    if (next) {
        const ddt_row_groups g = {1, 0, 0, w->rows, 0, 0};
        return ddt_cuda_matmul_grouped_next(w, t->mm, &g, planes->hi ? NULL : x, ldx, n, y, ldy, t->mm_ws,
                                            t->mm_ws_bytes, next, t->stream, err);
    }
    if (planes->hi) return ddt_cuda_matmul_presplit(w, t->mm, n, y, ldy, t->mm_ws, t->mm_ws_bytes, t->stream, err);
    return ddt_cuda_matmul_mode(w, t->mm, x, ldx, n, y, ldy, t->mm_ws, t->mm_ws_bytes, t->stream, err);
}

static ddt_status forward(ddt_cuda_target *t, const int32_t *ids, int32_t n, const int32_t *depth,
                          const uint64_t *vis, int32_t vis_words, float *logits, int32_t logit_row0,
                          ddt_error *err) {
    const int32_t H = t->dims.hidden, heads = t->dims.heads, qd = t->dims.qdim, rank = t->dims.rank, rope = t->dims.rope;
    const int64_t width = rank + rope;
    cudaStream_t s = t->stream;
    /* the gather and layer 0's attention norm in one launch (bitwise the two); each
       later residual add runs fused with the norm that follows it (ddt_cuda_add_rmsnorm):
       layer l's attention norm comes from the end of layer l - 1 */
    /* xn's split planes for the next product of it (tensor-core mode): written by
       the norm that makes xn, read by that product instead of its own split launch */
    ddt_cuda_split_planes xn_planes = planes_for(t, attn_input_product(t, 0), n);
    TRY(ddt_cuda_embed_rmsnorm_split(&t->embed, ids, NULL, n, t->x, H, t->layers[0].attn_norm, t->dims.eps, t->xn, H,
                                     &xn_planes, s, err));
    for (int32_t l = 0; l < t->dims.n_layers; l++) {
        const dev_layer *L = &t->layers[l];
        /* kv_a's output: its own buffer, or beside q_a's when they run as one product */
        const float *kva = t->kva;
        int64_t kva_ld = width;
        bool roped = false; /* the queries' rope and the cache row written (rope_folds) */
        ddt_cuda_next_planes uk_next; /* W_UK^T's split planes, when q_b's epilogue writes them */
        bool uk_pre = false;
        ddt_cuda_split_planes uv_planes; /* W_UV's, when the attention's merge writes them */
        bool uv_pre = false;
        /* the fast attention's bf16 query written by the launches that make its parts
           (the rope's by rope_write or q_b's epilogue, the latent's by W_UK^T's), the
           same bits as the pack launch they replace */
        const bool q16_pre =
            t->fast && !rope_folds(t) && L->uk_t.data && ddt_cuda_matmul_writes_next(&L->uk_t, t->mm);
        if (t->dims.q_lora > 0) {
            int64_t qa_ld = t->dims.q_lora;
            if (L->qkv_a.data) {
                qa_ld = t->dims.q_lora + width;
                TRY(product_of_normed(t, &L->qkv_a, &xn_planes, t->xn, H, n, t->qa, qa_ld, NULL, err));
                kva = t->qa + t->dims.q_lora;
                kva_ld = qa_ld;
            } else {
                TRY(ddt_cuda_matmul_mode(&L->q_a, t->mm, t->xn, H, n, t->qa, qa_ld, t->mm_ws, t->mm_ws_bytes, s, err));
            }
            if (!L->qkv_a.data) TRY(ddt_cuda_matmul_mode(&L->kv_a, t->mm, t->xn, H, n, t->kva, width,
                                                         t->mm_ws, t->mm_ws_bytes, s, err));
            /* both latents' norms in one launch (the same bits as two) */
            const ddt_cuda_norm_job jobs[2] = {{t->qa, qa_ld, t->dims.q_lora, L->q_a_norm, t->qa, qa_ld},
                                               {kva, kva_ld, rank, L->kv_a_norm, t->kvn, rank}};
            if (rope_folds(t)) {
                /* the cache row written by the norms' launch, the queries' rope by
                   q_b's epilogue: rope_write's two halves, the same bits, one
                   launch fewer (mla_cuda.h) */
                const ddt_cuda_mla_rope_args ra = rope_args(t, l, n, depth, kva, kva_ld, false);
                TRY(ddt_cuda_mla_norm_write(jobs, LATENT_NORM_EPS, &ra, NULL, s, err));
                TRY(ddt_cuda_matmul_rope(&L->q_b, t->qa, qa_ld, t->q, (int64_t)heads * qd, &ra, 0, 0, s, err));
                roped = true;
            } else {
                /* q_b reads the q latent's split planes written by the norms' launch,
                   and writes W_UK^T's (each head's nope columns) for it; on the wgmma
                   path rope_write's halves fold too: the cache row into the norms'
                   launch, the queries' rope (and their bf16 copy for the fast
                   attention) into q_b's epilogue, the same bits, one launch fewer */
                const ddt_cuda_split_planes qa_planes = planes_for(t, &L->q_b, n);
                const bool tc_rope = rope_folds_tc(t, L);
                const ddt_cuda_mla_rope_args ra = rope_args(t, l, n, depth, kva, kva_ld, q16_pre);
                if (tc_rope) TRY(ddt_cuda_mla_norm_write(jobs, LATENT_NORM_EPS, &ra, &qa_planes, s, err));
                else TRY(ddt_cuda_rmsnorm_pair_split(jobs, n, LATENT_NORM_EPS, &qa_planes, s, err));
                uk_pre = next_planes_for(t, &L->q_b, &L->uk_t, heads, qd, t->dims.nope, n, &uk_next);
                if (tc_rope) uk_next.rope = &ra;
                TRY(product_of_normed(t, &L->q_b, &qa_planes, t->qa, qa_ld, n, t->q, (int64_t)heads * qd,
                                      uk_pre || tc_rope ? &uk_next : NULL, err));
                roped = tc_rope;
            }
        } else {
            TRY(ddt_cuda_matmul_mode(&L->q_proj, t->mm, t->xn, H, n, t->q, (int64_t)heads * qd,
                                     t->mm_ws, t->mm_ws_bytes, s, err));
            TRY(ddt_cuda_matmul_mode(&L->kv_a, t->mm, t->xn, H, n, t->kva, width, t->mm_ws, t->mm_ws_bytes, s, err));
            TRY(ddt_cuda_rmsnorm(kva, kva_ld, n, rank, L->kv_a_norm, LATENT_NORM_EPS, t->kvn, rank, s, err));
        }
        char *layer_cache = layer_cache_of(t, l);
        ddt_cuda_next_planes q16_out;
        memset(&q16_out, 0, sizeof q16_out);
        q16_out.b16 = t->q16, q16_out.b16_ld = (int64_t)heads * width, q16_out.b16_gstride = width;
        if (!roped) {
            const ddt_cuda_mla_rope_args ra = rope_args(t, l, n, depth, kva, kva_ld, q16_pre);
            TRY(ddt_cuda_mla_rope_write(&ra, s, err));
        }
        if (L->uk_t.data) { /* the transposed copy exists (make_uk_t) */
            const ddt_row_groups ukt = uk_t_groups(t);
            /* from q_b's planes in mm_next (the rope between changes only the rope
               columns: the planes hold), else splitting q itself; with neither planes
               nor q16 this is the plain grouped product */
            TRY(ddt_cuda_matmul_grouped_next(&L->uk_t, t->mm, &ukt, uk_pre ? NULL : t->q, (int64_t)heads * qd, n,
                                             t->q_lat, (int64_t)heads * rank, uk_pre ? t->mm_next : t->mm_ws,
                                             t->mm_ws_bytes, q16_pre ? &q16_out : NULL, s, err));
        } else {
            const ddt_row_groups uk = uk_groups(t);
            TRY(ddt_cuda_matmul_t_grouped(&L->kv_b, &uk, t->q, (int64_t)heads * qd, n, t->q_lat, (int64_t)heads * rank,
                                          s, err));
        }
        const size_t T = (size_t)t->max_tokens;
        TRY(probe_copy(t, t->probe.q, l, T, sizeof(float) * (size_t)heads * qd, t->q, n, err));
        TRY(probe_copy(t, t->probe.q_lat, l, T, sizeof(float) * (size_t)heads * rank, t->q_lat, n, err));
        if (t->fast) {
            if (!q16_pre)
                TRY(ddt_cuda_mla_pack_q(t->q_lat, t->q + t->dims.nope, (int64_t)heads * qd, qd, n, heads, rank, rope,
                                        t->q16, s, err));
            TRY(probe_copy(t, t->probe.q16, l, T, sizeof(uint16_t) * (size_t)heads * width, t->q16, n, err));
            /* the merge writes W_UV's split planes beside o_lat (its split launch's bits) */
            uv_pre = ddt_cuda_matmul_split_planes_grouped(&L->kv_b, t->mm, heads, n, t->mm_ws, t->mm_ws_bytes,
                                                          &uv_planes);
            ddt_cuda_mla_verify va = {.n_tokens = n, .n_heads = heads, .q = t->q16, .kv = (const uint16_t *)layer_cache,
                                      .kv_ld = width, .kv_rows = t->max_ctx, .n_prefix = t->kv.len,
                                      .max_prefix = t->max_ctx - n, .vis = vis ? vis : t->causal, .scale = t->dims.softmax_scale,
                                      .out = t->o_lat, .out_fp32 = 1, .out_ld = rank, .lse = NULL,
                                      .workspace = t->mla_ws, .path = DDT_MLA_PATH_AUTO,
                                      .out_planes = uv_pre ? uv_planes : (ddt_cuda_split_planes){NULL, NULL, 0}};
            TRY(ddt_cuda_mla_verify_run(&va, s, err));
        } else {
            ddt_cuda_mla_attn_args aa = {.n = n, .heads = heads, .rank = rank, .rope = rope, .q_lat = t->q_lat,
                                         .q_rope = t->q + t->dims.nope, .q_rope_ld_t = (int64_t)heads * qd,
                                         .q_rope_ld_h = qd, .cache = (const float *)layer_cache,
                                         .capacity = t->max_ctx, .len = t->kv.len, .depth = depth, .vis = vis,
                                         .vis_words = vis_words, .scale = t->dims.softmax_scale,
                                         .workspace = t->attn_ws, .max_tokens = t->max_tokens, .out = t->o_lat};
            TRY(ddt_cuda_mla_attention(&aa, s, err));
        }
        TRY(probe_copy(t, t->probe.o_lat, l, T, sizeof(float) * (size_t)heads * rank, t->o_lat, n, err));
        ddt_row_groups uv = {.count = heads, .w_row_stride = t->dims.nope + t->dims.vdim, .w_row_offset = t->dims.nope,
                              .rows = t->dims.vdim, .x_stride = rank, .y_stride = t->dims.vdim};
        /* W_UV's epilogue writes o_proj's split planes (one group: the whole row) */
        const int64_t vw = (int64_t)heads * t->dims.vdim;
        ddt_cuda_next_planes o_next;
        const bool o_pre = next_planes_for(t, &L->kv_b, &L->o_proj, 1, vw, vw, n, &o_next);
        TRY(ddt_cuda_matmul_grouped_next(&L->kv_b, t->mm, &uv, uv_pre ? NULL : t->o_lat, (int64_t)heads * rank, n,
                                         t->o_v, vw, t->mm_ws, t->mm_ws_bytes, o_pre ? &o_next : NULL, s, err));
        if (o_pre)
            TRY(ddt_cuda_matmul_presplit(&L->o_proj, t->mm, n, t->tmp, H, t->mm_next, t->mm_ws_bytes, s, err));
        else
            TRY(ddt_cuda_matmul_mode(&L->o_proj, t->mm, t->o_v, vw, n, t->tmp, H, t->mm_ws, t->mm_ws_bytes, s, err));
        if (t->sharded && t->shard.split_heads) TRY(t->allreduce(t->allreduce_ctx, t->tmp, (int64_t)n * H, s, err));
        /* the front (router | shared gate | up) reads xn's split planes from this norm */
        const bool front_plain = L->moe && L->front.data && !L->shared.paired;
        xn_planes = planes_for(t, front_plain ? &L->front : NULL, n);
        TRY(ddt_cuda_add_rmsnorm_split(t->x, H, t->tmp, H, n, H, L->mlp_norm, t->dims.eps, t->xn, H, &xn_planes, s,
                                       err));
        TRY(probe_copy(t, t->probe.x_attn, l, T, sizeof(float) * (size_t)H, t->x, n, err));
        const bool last = l == t->dims.n_layers - 1;
        const float *next_norm = last ? t->final_norm : t->layers[l + 1].attn_norm;
        /* the next layer's attention input product reads the end norm's split planes
           (the LM head splits its rows itself: it may start past row 0) */
        const ddt_cuda_split_planes next_planes = planes_for(t, last ? NULL : attn_input_product(t, l + 1), n);
        /* unsharded, a MoE layer's end (shared + routed, the residual add, the next
           norm) runs in the experts' combine (ddt_cuda_moe_run, the same bits);
           sharded, the ranks' partial sums meet in an all-reduce before the add */
        bool ended = false;
        if (L->moe) {
            const float *rlogits = t->rlogits;
            int64_t ld_rl = t->dims.n_experts;
            if (L->front.data && L->shared.paired) { /* router | silu(shared gate) * up: one product */
                ld_rl = t->dims.n_experts + L->shared.down.cols;
                TRY(ddt_cuda_matmul_swiglu(&L->front, t->dims.n_experts, t->xn, H, n, t->front, ld_rl, s, err));
                rlogits = t->front;
                if (!L->shared_in_moe) /* else in ddt_cuda_moe_run's down launch, below */
                    TRY(mlp_down(t, &L->shared, t->front + t->dims.n_experts, ld_rl, n, t->tmp, err));
            } else if (L->front.data) { /* router | shared gate | shared up: one product */
                ld_rl = L->front.rows;
                TRY(product_of_normed(t, &L->front, &xn_planes, t->xn, H, n, t->front, ld_rl, NULL, err));
                rlogits = t->front;
                if (L->shared_fork) {
                    /* the branch: after the front, beside the route and the experts; its
                       split in mm_next, apart from the planes of this stream's products
                       (the combine, after the join, writes the next layer's in mm_ws) */
                    DDT_CUDA_TRY(cudaEventRecord(t->fork_ev, s), err);
                    DDT_CUDA_TRY(cudaStreamWaitEvent(t->side, t->fork_ev, 0), err);
                    TRY(mlp_down_on(t, &L->shared, t->front + t->dims.n_experts, ld_rl, n, t->tmp, t->mm_next,
                                    t->side, err));
                    DDT_CUDA_TRY(cudaEventRecord(t->join_ev, t->side), err);
                } else {
                    TRY(mlp_down(t, &L->shared, t->front + t->dims.n_experts, ld_rl, n, t->tmp, err));
                }
            } else {
                TRY(ddt_cuda_matmul(&L->router, t->xn, H, n, t->rlogits, t->dims.n_experts, s, err));
                if (L->has_shared) TRY(mlp_forward(t, &L->shared, t->xn, n, t->tmp, err));
            }
            ddt_moe_route_params rp = t->route;
            rp.bias = L->router_bias;
            ddt_cuda_moe_args ma = {.x = t->xn, .ldx = H, .n = n, .top_k = t->dims.top_k, .route = &rp,
                                    .logits = rlogits, .ld_logits = ld_rl, .idx = t->ridx, .w = t->rw,
                                    .out = t->acc, .ldo = H, .workspace = t->moe_ws,
                                    .workspace_bytes = t->moe_ws_bytes};
            if (L->shared_fork) ma.join = t->join_ev; /* the branch's end, before the combine */
            if (!t->sharded) {
                ma.out = t->xn; /* the experts read xn in earlier launches */
                ma.resid = t->x, ma.ld_resid = H;
                ma.shared = L->has_shared ? t->tmp : NULL, ma.ld_shared = H;
                ma.norm_w = next_norm, ma.eps = t->dims.eps;
                ma.norm_split = next_planes;
                ended = true;
            }
            if (L->shared_in_moe) { /* mlp_down's product on the same rows, into the same buffer */
                ma.shared_down = &L->shared.down;
                ma.shared_x = t->front + t->dims.n_experts, ma.ld_shared_x = ld_rl;
                ma.shared_y = t->tmp, ma.ld_shared_y = H;
            }
            TRY(ddt_cuda_moe_run(&L->experts, &ma, s, err));
            if (t->probe.rlogits)
                DDT_CUDA_TRY(cudaMemcpy2DAsync(t->probe.rlogits + (size_t)l * T * (size_t)t->dims.n_experts,
                                               sizeof(float) * (size_t)t->dims.n_experts, rlogits,
                                               sizeof(float) * (size_t)ld_rl, sizeof(float) * (size_t)t->dims.n_experts,
                                               (size_t)n, cudaMemcpyDeviceToDevice, s),
                             err);
            TRY(probe_copy(t, t->probe.ridx, l, T, sizeof(int32_t) * (size_t)t->dims.top_k, t->ridx, n, err));
            TRY(probe_copy(t, t->probe.bias, l, 1, sizeof(float) * (size_t)t->dims.n_experts, L->router_bias, 1, err));
            if (!ended) {
                if (L->has_shared) {
                    TRY(ddt_cuda_add(t->tmp, t->acc, (int64_t)n * H, s, err)); /* acc + shared: + commutes */
                } else {
                    DDT_CUDA_TRY(cudaMemcpyAsync(t->tmp, t->acc, sizeof(float) * (size_t)n * H,
                                                 cudaMemcpyDeviceToDevice, s),
                                 err);
                }
            }
        } else if (L->has_mlp) {
            TRY(mlp_forward(t, &L->mlp, t->xn, n, t->tmp, err));
        } else {
            DDT_CUDA_TRY(cudaMemsetAsync(t->tmp, 0, sizeof(float) * (size_t)n * H, s), err);
        }
        if (!ended) {
            /* the ranks' partial sums (their experts, their slices of the dense MLP and the
               shared expert, or zero where a rank holds none): x + 0 = x,
               so at one rank this is bitwise the unsharded forward */
            if (t->sharded) TRY(t->allreduce(t->allreduce_ctx, t->tmp, (int64_t)n * H, s, err));
            TRY(ddt_cuda_add_rmsnorm_split(t->x, H, t->tmp, H, n, H, next_norm, t->dims.eps, t->xn, H, &next_planes,
                                           s, err));
        }
        xn_planes = next_planes;
        TRY(probe_copy(t, t->probe.x, l, T, sizeof(float) * (size_t)H, t->x, n, err));
        if (!last) TRY(capture_store(t, l, t->x, n, err));
    }
    TRY(capture_store(t, t->dims.n_layers - 1, t->xn, n, err));
    if (logits && t->head_split) {
        /* this rank's vocabulary rows of the head (every rank's, 1/world of the head's
           bytes: 2.35 GB a forward at K2.6), then the ranks' blocks gathered and set side
           by side: every rank holds the same logits */
        const int32_t nl = n - logit_row0;
        const ddt_row_groups g = {.count = 1, .w_row_stride = t->head_n, .w_row_offset = t->head_v0,
                                  .rows = t->head_n, .x_stride = 0, .y_stride = 0};
        TRY(ddt_cuda_matmul_grouped_mode(&t->lm_head, t->mm, &g, t->xn + (size_t)logit_row0 * H, H, nl, t->head_part,
                                         t->head_n, t->mm_ws, t->mm_ws_bytes, s, err));
        TRY(t->allgather(t->allreduce_ctx, t->head_part, (int64_t)nl * t->head_n, t->head_all, s, err));
        TRY(ddt_cuda_unshard_cols(t->head_all, t->shard.world, nl, t->head_n, logits, t->dims.vocab, s, err));
    } else if (logits) {
        TRY(ddt_cuda_matmul_mode(&t->lm_head, t->mm, t->xn + (size_t)logit_row0 * H, H, n - logit_row0, logits,
                                 t->dims.vocab, t->mm_ws, t->mm_ws_bytes, s, err));
    }
    return DDT_OK;
}

ddt_status ddt_cuda_target_prefill(ddt_cuda_target *t, const int32_t *ids, int32_t n, float *logits,
                                   bool all_logits, ddt_error *err) {
    if (!ids) return ddt_fail(err, DDT_ERR_INVALID, "prefill: NULL token array");
    if (n < 1 || n > t->max_tokens)
        return ddt_fail(err, DDT_ERR_RANGE, "prefill: %d tokens, allowed 1..%d per forward", n, t->max_tokens);
    TRY(forward(t, ids, n, t->iota, NULL, 0, logits, all_logits ? 0 : n - 1, err));
    return ddt_cuda_kv_advance(&t->kv, n, t->stream, err);
}

ddt_status ddt_cuda_target_verify(ddt_cuda_target *t, const int32_t *tokens, const int32_t *depth,
                                  const uint64_t *vis, int32_t vis_words, int32_t n, float *logits,
                                  ddt_error *err) {
    if (!tokens || !depth || !vis) return ddt_fail(err, DDT_ERR_INVALID, "verify: NULL tree array");
    if (n < 1 || n > t->max_tokens)
        return ddt_fail(err, DDT_ERR_RANGE, "verify: %d nodes, allowed 1..%d per forward", n, t->max_tokens);
    if (vis_words < (n + 63) / 64)
        return ddt_fail(err, DDT_ERR_INVALID, "verify: %d visibility words per row cannot hold %d nodes", vis_words, n);
    if (t->fast && vis_words != 1)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "verify: fast attention takes one visibility word per node");
    return forward(t, tokens, n, depth, vis, vis_words, logits, 0, err);
}

ddt_status ddt_cuda_target_commit(ddt_cuda_target *t, const int32_t *path, const int32_t *path_len,
                                  ddt_error *err) {
    return ddt_cuda_kv_commit(&t->kv, path, path_len, t->stream, err);
}
