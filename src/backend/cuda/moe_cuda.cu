/*
 * moe_cuda.cu — DeepSeek-V3 router and routed experts on the GPU (see moe_cuda.h).
 *
 * Experts run in four launches with no host sync:
 *   1. sort (one block): count the n*top_k (token, expert) entries per expert, an
 *      exclusive scan gives each expert a contiguous range of entry slots and the
 *      list of touched experts in increasing index, written as work items of at
 *      most C entries each (weights + range: an expert with many tokens becomes
 *      several items that run on different blocks side by side instead of one
 *      block looping over them all) so an expert block starts its weight loads
 *      after a single dependent load; every entry gets a slot.  The
 *      order of a token inside its expert's range comes from a shared-memory atomic
 *      cursor and may vary from run to run, but no value depends on it: each slot is
 *      computed from its own token only, and the combine reads slots by token.
 *   2. gate/up: grid (row blocks, work items); a warp takes 2 intermediate rows
 *      of gate and of up (4 weight rows, qmatmul_dev.cuh's fixed order) for every
 *      token of its expert and writes silu(g) * u.  Blocks of expert slots past the
 *      number touched leave at once (the grid is sized for min(n*top_k, experts)).
 *   3. down: the same shape over hidden rows, into one output row per entry.
 *      With a shared expert's down projection (ddt_cuda_moe_args.shared_down, FP32
 *      path) the grid has more work items in front, items of tokens instead of
 *      entries, whose warps run that product (shared_down_rows): one launch less
 *      per MoE layer, and its blocks run beside the routed ones instead of after.
 *   4. combine: per token, its entries sorted by expert index, acc = 0.0f then
 *      acc = acc + w * out, in that order (the CPU's order).
 * ddt_cuda_moe_run fuses the neighbours (issue 13): for n <= 64 the router runs
 * in step 1's block (moe_route_sort_kernel), and with a norm step 4 also adds the
 * shared expert and the residual and applies the next RMSNorm
 * (moe_combine_norm_kernel, norm_dev.cuh's arithmetic).  Each fused kernel runs
 * the same device functions as the launches it replaces, so the same bits.
 * With the layer's mode DDT_CUDA_MM_TENSOR, steps 2 and 3 are wstream.cuh's
 * weight-streaming kernels over the packed experts (ddt_cuda_moe_layer_pack),
 * items of at most 8, 16 or 32 entries by n.  They read their activations split
 * into bf16 hi / lo once (wstream.cuh's split rows), not per block: x by extra
 * blocks of step 1's launch (no launch more), h by gate/up's epilogue.  INT4
 * experts (K2.6's) run wgmma_experts.cuh's kernels instead: items of at most 16
 * entries, the wgmma's N set by the item's entry count (8, 16 or 32 columns, one
 * arithmetic), x and h in its wq rows.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/norm_dev.cuh"
#include "backend/cuda/qmatmul_dev.cuh"
#include "backend/cuda/wgmma_experts.cuh"
#include "backend/cuda/wstream.cuh"

#define MOE_MAX_EXPERTS 4096
#define MOE_MAX_TOPK 16
#define ROUTE_THREADS 256
#define SORT_THREADS 256
#define EX_WARPS 4
#define COMBINE_THREADS 256

/* ------------------------------------------------------------------ router */

struct Best {
    float v;
    int i; /* -1: none */
};

/* max value, lowest index on ties; "none" loses to anything */
static __device__ __forceinline__ Best best_of(Best a, Best b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
    return a;
}

/* The warp's best (value, index) by best_of, in every lane. */
static __device__ __forceinline__ Best warp_best(Best b) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        Best o;
        o.v = __shfl_xor_sync(0xffffffffu, b.v, off);
        o.i = __shfl_xor_sync(0xffffffffu, b.i, off);
        b = best_of(b, o);
    }
    return b;
}

/* A group's score: the sum of its top-2 choice scores, scanned in expert order
 * (one value when a group has one expert), as ddt_cpu_moe_route. */
static __device__ float group_score(const float *choice, int g, int per) {
    float b1 = -INFINITY, b2 = -INFINITY;
    for (int e = g * per; e < (g + 1) * per; e++) {
        const float c = choice[e];
        if (c > b1) {
            b2 = b1;
            b1 = c;
        } else if (c > b2) {
            b2 = c;
        }
    }
    return per >= 2 ? b1 + b2 : b1;
}

/* Mark the keep best groups (of gkeep, all 0) by score, the first on ties: the CPU loop. */
static __device__ void keep_groups(const float *gscore, unsigned char *gkeep, int G, int keep) {
    for (int k = 0; k < keep; k++) {
        int best = -1;
        for (int g = 0; g < G; g++)
            if (!gkeep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
        gkeep[best] = 1;
    }
}

/* One token's picks to idx / w: the experts in pick order, each weighted by its
 * unbiased sigmoid score s, normalised by the sum in pick order (+ 1e-20, when
 * norm_topk_prob) and scaled: ddt_cpu_moe_route's arithmetic.  Both routers. */
static __device__ void route_store(const ddt_moe_route_params &p, const int *chosen, const float *s, int32_t *it,
                                   float *wt) {
    /* the weights in registers, each stored once: the loop that stored s[k] to wt
       and read it back for the division waited a global round trip per expert
       (wt may alias s for all the compiler knows), ~5 of the route + sort
       launch's 15 us for one K2.6 token on the H200.  The same operations in the
       same order, so the same bits. */
    float v[MOE_MAX_TOPK];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < MOE_MAX_TOPK; k++)
        if (k < p.top_k) {
            v[k] = s[k];
            sum += v[k];
        }
    const float denom = sum + 1e-20f;
#pragma unroll
    for (int k = 0; k < MOE_MAX_TOPK; k++)
        if (k < p.top_k) {
            float x = v[k];
            if (p.norm_topk_prob) x = x / denom;
            it[k] = chosen[k];
            wt[k] = x * p.routed_scaling_factor;
        }
}

static __global__ void __launch_bounds__(ROUTE_THREADS)
route_kernel(const float *__restrict__ logits, int64_t ld, ddt_moe_route_params p, int32_t *idx, float *w) {
    DDT_GRID_DEP_WAIT();
    /* 40 KB: s is recomputed for the chosen experts instead of stored for all (same bits) */
    __shared__ float choice[MOE_MAX_EXPERTS];
    __shared__ float gscore[MOE_MAX_EXPERTS];
    __shared__ unsigned char gkeep[MOE_MAX_EXPERTS], taken[MOE_MAX_EXPERTS];
    __shared__ int chosen[MOE_MAX_TOPK];
    __shared__ float chosen_s[MOE_MAX_TOPK]; /* their s, recomputed from the logits (same bits) */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int E = p.n_experts, G = p.n_group > 0 ? p.n_group : 1, per = E / G;
    const float *lg = logits + (int64_t)blockIdx.x * ld;
    for (int e = tid; e < E; e += ROUTE_THREADS) {
        const float sv = 1.0f / (1.0f + expf(-lg[e]));
        choice[e] = p.bias ? sv + p.bias[e] : sv;
        taken[e] = 0;
    }
    __syncthreads();
    /* The selection runs in warp 0 alone: a few shuffles per pick, no block barriers. */
    if (warp != 0) return;
    const int keep = p.topk_group > 0 && p.topk_group < G ? p.topk_group : G;
    for (int g = lane; g < G; g += 32) {
        gkeep[g] = keep == G; /* every group kept: their scores do not matter */
        if (keep == G) continue;
        gscore[g] = group_score(choice, g, per);
    }
    __syncwarp();
    if (keep < G && lane == 0) keep_groups(gscore, gkeep, G, keep); /* a handful of groups */
    __syncwarp();
    for (int k = 0; k < p.top_k; k++) {
        Best b = {0.0f, -1};
        for (int e = lane; e < E; e += 32)
            if (!taken[e] && gkeep[e / per]) b = best_of(b, Best{choice[e], e});
        b = warp_best(b);
        const int e = b.i < 0 ? 0 : b.i; /* same in every lane */
        __syncwarp(); /* every lane's reads of taken[] before lane 0's write (racecheck: the shuffles order no memory) */
        if (lane == 0) taken[e] = 1, chosen[k] = e;
        __syncwarp();
    }
    if (lane == 0) {
        for (int k = 0; k < p.top_k; k++) chosen_s[k] = 1.0f / (1.0f + expf(-lg[chosen[k]]));
        route_store(p, chosen, chosen_s, idx + (int64_t)blockIdx.x * p.top_k, w + (int64_t)blockIdx.x * p.top_k);
    }
}

/* The router for up to 32 * ROUTE_VPL experts (every DeepSeek-V3 / Kimi model):
 * one warp per token, the token's choice scores in registers (expert e = lane +
 * 32 j in slot j), so a pick is a lane-local scan and one shuffle reduction,
 * with no block barrier.  route_kernel above spent ~25 us a token on the H200
 * (K2.6, 384 experts): its picks ran in one warp over shared memory.  Same
 * selection as route_kernel and ddt_cpu_moe_route: max choice, lowest index on
 * ties (a lane scans its slots in increasing expert order, best_of breaks ties
 * across lanes), group scores as the CPU loop, weights from the unbiased s. */
#define ROUTE_WARPS 4
#define ROUTE_VPL 16
#define ROUTE_WARP_MAX (32 * ROUTE_VPL)

/* One warp's shared scratch for route_token_warp. */
struct RouteWarpSmem {
    float sc[ROUTE_WARP_MAX];         /* choice scores, for the group scores */
    float gsc[ROUTE_WARP_MAX];        /* group scores [G] */
    unsigned char gk[ROUTE_WARP_MAX]; /* kept groups [G] */
    int chosen[MOE_MAX_TOPK];
    float chosen_s[MOE_MAX_TOPK];
};

/* An unsigned key that orders as the float does (negative values reversed below
 * the positive ones); NaN keys sort past +inf or below -inf by their sign. */
static __device__ __forceinline__ uint32_t route_key(float v) {
    const uint32_t b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* One token's routing by the calling warp (all 32 lanes, warp-level sync only):
 * logits row lg -> it / wt [top_k].  route_warp_kernel and moe_route_sort_kernel
 * both run this, so a token's picks and weights are the same bits in either. */
static __device__ __forceinline__ void route_token_warp(const float *__restrict__ lg, const ddt_moe_route_params &p,
                                                        RouteWarpSmem &sm, int32_t *it, float *wt) {
    const int lane = threadIdx.x & 31;
    const int E = p.n_experts, G = p.n_group > 0 ? p.n_group : 1, per = E / G;
    const int keep = p.topk_group > 0 && p.topk_group < G ? p.topk_group : G;
    /* every load first: with the division's call between them, loads issued one
       slot at a time cost a memory latency each (the first version: ~16 us) */
    float c[ROUTE_VPL], sg[ROUTE_VPL], bb[ROUTE_VPL];
#pragma unroll
    for (int j = 0; j < ROUTE_VPL; j++) {
        const int e = lane + 32 * j;
        c[j] = e < E ? lg[e] : 0.0f;
        bb[j] = e < E && p.bias ? p.bias[e] : 0.0f;
    }
    uint32_t live = 0; /* slot j holds an expert that may still be picked */
#pragma unroll
    for (int j = 0; j < ROUTE_VPL; j++) {
        sg[j] = 0.0f;
        if (lane + 32 * j < E) {
            sg[j] = 1.0f / (1.0f + expf(-c[j])); /* s, kept for the weights */
            c[j] = p.bias ? sg[j] + bb[j] : sg[j];
            live |= 1u << j;
        }
    }
    if (keep < G) {
#pragma unroll
        for (int j = 0; j < ROUTE_VPL; j++)
            if ((live >> j) & 1u) sm.sc[lane + 32 * j] = c[j];
        __syncwarp();
        for (int g = lane; g < G; g += 32) {
            sm.gsc[g] = group_score(sm.sc, g, per);
            sm.gk[g] = 0;
        }
        __syncwarp();
        if (lane == 0) keep_groups(sm.gsc, sm.gk, G, keep);
        __syncwarp();
#pragma unroll
        for (int j = 0; j < ROUTE_VPL; j++)
            if (((live >> j) & 1u) && !sm.gk[(lane + 32 * j) / per]) live &= ~(1u << j);
    }
    /* Each pick is two single-instruction warp reductions (redux.sync) over an
       order-preserving integer key of the choice score, not five shuffle rounds of
       (value, index): the max key, then the lowest index holding it, which is
       best_of's order (max value, lowest index on ties) for every value but NaN
       (-0 is made +0 first, so the two zeros tie as they compare).  Eight picks of
       five dependent shuffle pairs were most of the one-token router's ~3 us. */
    uint32_t key[ROUTE_VPL];
#pragma unroll
    for (int j = 0; j < ROUTE_VPL; j++) key[j] = route_key(c[j] + 0.0f);
    for (int k = 0; k < p.top_k; k++) {
        uint32_t bk = 0u;
        int bi = 0x7FFFFFFF; /* none: loses every tie */
#pragma unroll
        for (int j = 0; j < ROUTE_VPL; j++) /* slots in increasing expert order: strict > keeps the lowest */
            if (((live >> j) & 1u) && (bi == 0x7FFFFFFF || key[j] > bk)) bk = key[j], bi = lane + 32 * j;
        const uint32_t mk = __reduce_max_sync(0xffffffffu, bk);
        const int bmin = (int)__reduce_min_sync(0xffffffffu, (uint32_t)(bk == mk ? bi : 0x7FFFFFFF));
        const int e = bmin == 0x7FFFFFFF ? 0 : bmin; /* same in every lane; none left: expert 0, as the CPU */
        if ((e & 31) == lane) live &= ~(1u << (e >> 5));
        float mine = 0.0f; /* slot e >> 5 of every lane (a constant index per unrolled step) */
#pragma unroll
        for (int j = 0; j < ROUTE_VPL; j++)
            if (j == (e >> 5)) mine = sg[j];
        const float sv = __shfl_sync(0xffffffffu, mine, e & 31);
        if (lane == 0) sm.chosen[k] = e, sm.chosen_s[k] = sv;
    }
    __syncwarp();
    if (lane == 0) route_store(p, sm.chosen, sm.chosen_s, it, wt);
    __syncwarp(); /* the scratch is free again for the warp's next token */
}

static __global__ void __launch_bounds__(ROUTE_WARPS * 32)
route_warp_kernel(const float *__restrict__ logits, int64_t ld, int n, ddt_moe_route_params p, int32_t *idx,
                  float *w) {
    DDT_GRID_DEP_WAIT();
    __shared__ RouteWarpSmem sm[ROUTE_WARPS];
    const int warp = threadIdx.x >> 5;
    const int64_t tok = (int64_t)blockIdx.x * ROUTE_WARPS + warp;
    if (tok >= n) return; /* warp-level sync only below */
    route_token_warp(logits + tok * ld, p, sm[warp], idx + tok * p.top_k, w + tok * p.top_k);
}

/* The router's argument check, shared by ddt_cuda_moe_route and ddt_cuda_moe_run. */
static ddt_status route_check(const ddt_moe_route_params *p, ddt_error *err) {
    const int G = p->n_group > 0 ? p->n_group : 1;
    if (p->n_experts < 1 || p->n_experts > MOE_MAX_EXPERTS || p->top_k < 1 || p->top_k > MOE_MAX_TOPK ||
        p->top_k > p->n_experts || p->n_experts % G != 0 || p->topk_group < 1 || p->topk_group > G)
        return ddt_fail(err, DDT_ERR_INVALID, "moe_route: %d experts, top %d, %d groups keep %d", p->n_experts,
                        p->top_k, p->n_group, p->topk_group);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_moe_route(const float *logits, int64_t ld, int32_t n, const ddt_moe_route_params *p,
                                         int32_t *idx, float *w, ddt_cuda_stream stream, ddt_error *err) {
    if (!p || !logits || !idx || !w || n < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "moe_route: missing arguments or %d tokens", n);
    const ddt_status st = route_check(p, err);
    if (st != DDT_OK) return st;
    if (n > 0x7FFFFFFF) return ddt_fail(err, DDT_ERR_RANGE, "moe_route: %d tokens", n);
    if (p->n_experts <= ROUTE_WARP_MAX)
        route_warp_kernel<<<(unsigned)((n + ROUTE_WARPS - 1) / ROUTE_WARPS), ROUTE_WARPS * 32, 0, (cudaStream_t)stream>>>(
            logits, ld, n, *p, idx, w);
    else
        route_kernel<<<(unsigned)n, ROUTE_THREADS, 0, (cudaStream_t)stream>>>(logits, ld, *p, idx, w);
    DDT_CUDA_LAUNCHED("moe_route", (cudaStream_t)stream, err);
    return DDT_OK;
}

/* ------------------------------------------------------------------ layers */

static ddt_status upload_fail_cleanup(ddt_qweight *hc, int32_t count, ddt_status st) {
    for (int32_t i = 0; i < count; i++) ddt_cuda_qweight_free(&hc[i]);
    free(hc);
    return st;
}

static ddt_status layer_finish(ddt_qweight *hc, int32_t E, const ddt_qweight *ref, ddt_cuda_moe_layer *out,
                               ddt_error *err) {
    ddt_qweight *darr = NULL;
    cudaError_t e = cudaMalloc((void **)&darr, sizeof(ddt_qweight) * 3 * (size_t)E);
    if (e == cudaSuccess) e = cudaMemcpy(darr, hc, sizeof(ddt_qweight) * 3 * (size_t)E, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        if (darr) cudaFree(darr);
        return upload_fail_cleanup(hc, 3 * E, ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: moe layer table: %s",
                                                       cudaGetErrorString(e)));
    }
    out->n_experts = E;
    out->first_expert = 0;
    out->total_experts = E;
    out->mode = DDT_CUDA_MM_FP32;
    out->hidden = (int32_t)ref->cols;
    out->inter = (int32_t)ref->rows;
    out->gate = darr;
    out->up = darr + E;
    out->down = darr + 2 * (size_t)E;
    out->host_copy = hc;
    return DDT_OK;
}

static ddt_status check_expert(const ddt_qweight *w, const ddt_qweight *ref, int64_t rows, int64_t cols, int32_t e,
                               const char *which, ddt_error *err) {
    if (w->format != ref->format || w->dtype != ref->dtype || w->rows != rows || w->cols != cols ||
        (w->format == DDT_Q_INT4_GROUP && w->group != ref->group) ||
        (w->format == DDT_Q_FP8_BLOCK && w->block != ref->block))
        return ddt_fail(err, DDT_ERR_INVALID,
                        "moe_layer_upload: expert %d %s: format %d dtype %d [%lld, %lld], expected format %d dtype %d "
                        "[%lld, %lld]",
                        e, which, (int)w->format, (int)w->dtype, (long long)w->rows, (long long)w->cols,
                        (int)ref->format, (int)ref->dtype, (long long)rows, (long long)cols);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_moe_layer_upload(const ddt_qweight *gate, const ddt_qweight *up,
                                                const ddt_qweight *down, int32_t n_experts, ddt_cuda_moe_layer *out,
                                                ddt_error *err) {
    if (!gate || !up || !down || !out || n_experts < 1 || n_experts > MOE_MAX_EXPERTS)
        return ddt_fail(err, DDT_ERR_INVALID, "moe_layer_upload: %d experts", n_experts);
    const int64_t I = gate[0].rows, H = gate[0].cols;
    for (int32_t e = 0; e < n_experts; e++) {
        ddt_status st = check_expert(&gate[e], &gate[0], I, H, e, "gate", err);
        if (st == DDT_OK) st = check_expert(&up[e], &gate[0], I, H, e, "up", err);
        if (st == DDT_OK) st = check_expert(&down[e], &gate[0], H, I, e, "down", err);
        if (st != DDT_OK) return st;
    }
    ddt_qweight *hc = (ddt_qweight *)calloc(3 * (size_t)n_experts, sizeof(ddt_qweight));
    if (!hc) return ddt_fail(err, DDT_ERR_NOMEM, "moe_layer_upload: %d experts", n_experts);
    for (int32_t k = 0; k < 3; k++) {
        const ddt_qweight *src = k == 0 ? gate : k == 1 ? up : down;
        for (int32_t e = 0; e < n_experts; e++) {
            ddt_status st = ddt_cuda_qweight_upload(&src[e], &hc[k * n_experts + e], err);
            if (st != DDT_OK) return upload_fail_cleanup(hc, k * n_experts + e, st);
        }
    }
    return layer_finish(hc, n_experts, &hc[0], out, err);
}

extern "C" ddt_status ddt_cuda_moe_layer_random(int32_t n_experts, int32_t hidden, int32_t inter, ddt_qformat format,
                                                ddt_dtype dtype, float amp, uint64_t seed, ddt_cuda_moe_layer *out,
                                                ddt_error *err) {
    if (!out || n_experts < 1 || n_experts > MOE_MAX_EXPERTS || hidden < 1 || inter < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "moe_layer_random: %d experts [%d, %d]", n_experts, inter, hidden);
    ddt_qweight *hc = (ddt_qweight *)calloc(3 * (size_t)n_experts, sizeof(ddt_qweight));
    if (!hc) return ddt_fail(err, DDT_ERR_NOMEM, "moe_layer_random: %d experts", n_experts);
    for (int32_t k = 0; k < 3; k++)
        for (int32_t e = 0; e < n_experts; e++) {
            const int64_t r = k < 2 ? inter : hidden, c = k < 2 ? hidden : inter;
            ddt_status st = ddt_cuda_qweight_random(format, dtype, r, c, amp, seed + 7919u * (uint64_t)(k * n_experts + e),
                                                    &hc[k * n_experts + e], err);
            if (st != DDT_OK) return upload_fail_cleanup(hc, k * n_experts + e, st);
        }
    return layer_finish(hc, n_experts, &hc[0], out, err);
}

extern "C" void ddt_cuda_moe_layer_free(ddt_cuda_moe_layer *m) {
    if (!m) return;
    if (m->host_copy)
        for (int32_t i = 0; i < 3 * m->n_experts; i++) ddt_cuda_qweight_free(&m->host_copy[i]);
    free(m->host_copy);
    if (m->gate) cudaFree(m->gate);
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------ workspace */

/* What an expert kernel's block needs, in one 64-byte load: the expert's weights
 * (gate, up, down data and scales; the packed copies on the tensor-core path) and
 * its range of at most C entry slots; cnt 0 = no work (wstream.cuh's WsItem). */
typedef WsItem SlotRec;

struct MoeWs {
    SlotRec *rec;                                           /* [min(M, E) + M] work items */
    int32_t *sorted_tok, *pos_of;                           /* [M] x 2 */
    float *h;                                               /* [M][inter]; tensor path: split rows of
                                                               ceil(inter / 32) units, as many floats */
    float *o;                                               /* [M][hidden] */
    uint4 *xs;                                              /* tensor path: x split, [n][ceil(hidden / 32) units] */
    int32_t *done;                                          /* [min(M, E) + M] the wgmma down's flags (WxArgs) */
    uint32_t *sync;                                         /* [2] the same: the call's gen, down CTAs counted */
    size_t bytes;
};

static size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

static MoeWs ws_layout(void *base, int32_t E, int64_t M, int64_t n, int32_t hidden, int32_t inter) {
    MoeWs w;
    uint8_t *p = (uint8_t *)base;
    size_t off = 0;
#define WS_TAKE(field, type, count)                                  \
    w.field = (type *)(p ? p + off : NULL);                          \
    off += align256(sizeof(type) * (size_t)(count));
    /* work items: sum over experts of ceil(c_e / C) <= min(M, E) + M / C, and C >= 1 */
    WS_TAKE(rec, SlotRec, (E < M ? E : M) + M)
    WS_TAKE(sorted_tok, int32_t, M)
    WS_TAKE(pos_of, int32_t, M)
    WS_TAKE(h, float, M * ((inter + 63) / 64 * 64))    /* also h's wq rows (wgmma_experts.cuh) */
    WS_TAKE(o, float, M * hidden)
    WS_TAKE(xs, uint4, n * ((hidden + 63) / 64 * 16)) /* also x's wq rows: 256 bytes a 64 columns */
    WS_TAKE(done, int32_t, (E < M ? E : M) + M)
    WS_TAKE(sync, uint32_t, 2)
#undef WS_TAKE
    w.bytes = off;
    return w;
}

extern "C" size_t ddt_cuda_moe_workspace_bytes(const ddt_cuda_moe_layer *m, int32_t max_tokens, int32_t top_k) {
    if (!m || max_tokens < 1 || top_k < 1) return 0;
    return ws_layout(NULL, m->n_experts, (int64_t)max_tokens * top_k, max_tokens, m->hidden, m->inter).bytes;
}

/* ------------------------------------------------------------------ sort */

/* Exclusive block scan of one 64-bit value per thread (SORT_THREADS threads). */
static __device__ long long block_excl_scan(long long v, long long *wsum, long long *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    long long inc = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        long long o = __shfl_up_sync(0xffffffffu, inc, off);
        if (lane >= off) inc += o;
    }
    if (lane == 31) wsum[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        long long t = lane < SORT_THREADS / 32 ? wsum[lane] : 0;
        long long ti = t;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            long long o = __shfl_up_sync(0xffffffffu, ti, off);
            if (lane >= off) ti += o;
        }
        if (lane < SORT_THREADS / 32) wsum[lane] = ti - t; /* exclusive prefix of warp totals */
        if (lane == 31) *total = ti;
    }
    __syncthreads();
    return wsum[warp] + inc - v;
}

static __device__ __forceinline__ const void *wscale(const ddt_qweight &w) {
    return w.format == DDT_Q_FP8_BLOCK ? (const void *)w.scale_inv : (const void *)w.scale;
}

/* What the sort needs besides the entries: the layer and the work-item classes. */
struct SortArgs {
    int M, K, E, first;            /* entries (n * top_k), top_k, local experts, first global index */
    int C, max_slots;              /* first list: items of <= C entries, max_slots of them */
    int C_big, big_min, big_slots; /* second list (C_big > 0): experts of > big_min entries, items of <= C_big */
    const ddt_qweight *gate, *up, *down;
    bool packed;
};

/* The sort's shared memory (a union member in moe_route_sort_kernel). */
struct SortSmem {
    int cnt[MOE_MAX_EXPERTS], cur[MOE_MAX_EXPERTS];
    long long wsum[SORT_THREADS / 32], total, total_big;
};

/* Step 1 of the experts (see the top of the file) by the calling block of
 * SORT_THREADS threads.  idx is read after a block barrier only, so the same block
 * may have written it (moe_route_sort_kernel). */
static __device__ __forceinline__ void sort_entries(const int32_t *idx, const SortArgs &a, const MoeWs &ws,
                                                    SortSmem &sm) {
    int *cnt = sm.cnt, *cur = sm.cur;
    long long *wsum = sm.wsum;
    const int M = a.M, K = a.K, E = a.E, first = a.first, C = a.C, max_slots = a.max_slots, C_big = a.C_big,
              big_min = a.big_min, big_slots = a.big_slots;
    const ddt_qweight *gate = a.gate, *up = a.up, *down = a.down;
    const bool packed = a.packed;
    const int tid = threadIdx.x;
    for (int e = tid; e < E; e += SORT_THREADS) cnt[e] = 0;
    __syncthreads();
    for (int i = tid; i < M; i += SORT_THREADS) {
        const int e = idx[i] - first; /* local index; experts of other ranks fall outside 0..E-1 */
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    const int per = (E + SORT_THREADS - 1) / SORT_THREADS, e0 = tid * per;
    long long c_sum = 0, t_sum = 0, b_sum = 0;
    /* an expert with c entries takes ceil(c / C) work items (slots); with two
       classes (C_big > 0) an expert with more than big_min entries takes
       ceil(c / C_big) items of the second list instead */
    for (int e = e0; e < e0 + per && e < E; e++) {
        const int c = cnt[e];
        c_sum += c;
        if (C_big > 0 && c > big_min) b_sum += (c + C_big - 1) / C_big;
        else t_sum += (c + C - 1) / C;
    }
    const long long ex = block_excl_scan((c_sum << 32) | t_sum, wsum, &sm.total);
    int off = (int)(ex >> 32), slot = (int)(ex & 0xFFFFFFFFll), bslot = max_slots;
    if (C_big > 0) {
        __syncthreads(); /* every thread has read wsum */
        bslot += (int)block_excl_scan(b_sum, wsum, &sm.total_big);
    }
    for (int e = e0; e < e0 + per && e < E; e++) {
        const int c = cnt[e];
        cur[e] = off;
        if (c > 0) {
            SlotRec r;
            const ddt_qweight *ws3[3] = {&gate[e], &up[e], &down[e]};
            for (int k = 0; k < 3; k++) {
                const ddt_qweight &q = *ws3[k];
                r.d[k] = (const uint8_t *)(packed ? q.mma : q.data);
                r.s[k] = packed && q.format == DDT_Q_INT4_GROUP ? q.mma_scale : wscale(q);
            }
            if (C_big > 0 && c > big_min) {
                for (int j = 0; j < c; j += C_big) {
                    r.off = off + j;
                    r.cnt = c - j < C_big ? c - j : C_big;
                    ws.rec[bslot++] = r;
                }
            } else {
                for (int j = 0; j < c; j += C) {
                    r.off = off + j;
                    r.cnt = c - j < C ? c - j : C;
                    ws.rec[slot++] = r;
                }
            }
        }
        off += c;
    }
    /* the wgmma experts' flags (wgmma_experts.cuh, WxArgs): the down CTAs read them only after
       the gate/up launch has passed its grid wait, so after this launch's end */
    for (int sl = tid; sl < max_slots + big_slots; sl += SORT_THREADS) ws.done[sl] = 0;
    if (tid == 0) ws.sync[1] = 0;
    __syncthreads();
    /* the grid has max_slots expert slots: the ones no expert took do nothing */
    for (int sl = (int)(sm.total & 0xFFFFFFFFll) + tid; sl < max_slots; sl += SORT_THREADS) ws.rec[sl].cnt = 0;
    if (C_big > 0)
        for (int sl = (int)sm.total_big + tid; sl < big_slots; sl += SORT_THREADS) ws.rec[max_slots + sl].cnt = 0;
    for (int i = tid; i < M; i += SORT_THREADS) {
        const int e = idx[i] - first;
        if (e >= 0 && e < E) {
            const int pos = atomicAdd(&cur[e], 1);
            ws.sorted_tok[pos] = i / K;
            ws.pos_of[i] = pos;
        } else {
            ws.pos_of[i] = -1;
        }
    }
}

/* The tensor path's x split into bf16 hi / lo once for every expert item that
 * gathers its rows (wstream.cuh's split rows, into ws.xs), by the sort launch's
 * blocks 1 .. (block 0 sorts; nothing the sort writes is read here).  A launch
 * of its own would add its fixed cost (~2-5 us) to experts whose one-token
 * floor is ~47 us (K2.6); the sort block stays the launch's long pole. */
struct XSplit {
    const float *x;
    int64_t ldx, n, cols, nq;
    int64_t wq_row;  /* > 0: wq rows of this many bytes (the INT4 wgmma experts), else split rows */
    bool vec;  /* x and ldx 16-byte aligned */
    uint4 *out;
};

static __device__ __forceinline__ void split_x_blocks(const XSplit &p) {
    if (p.wq_row > 0) { /* cols % 32 == 0 (INT4 experts): whole quads */
        const int64_t nq4 = p.cols / 4;
        for (int64_t i = (int64_t)(blockIdx.x - 1) * SORT_THREADS + threadIdx.x; i < p.n * nq4;
             i += (int64_t)(gridDim.x - 1) * SORT_THREADS) {
            const int64_t r = i / nq4, q = i - r * nq4;
            const float *src = p.x + r * p.ldx + 4 * q;
            const float4 v = p.vec ? *(const float4 *)src : make_float4(src[0], src[1], src[2], src[3]);
            wx_store_quad((uint8_t *)p.out + r * p.wq_row, q, v);
        }
        return;
    }
    ws_presplit([&](int64_t r) { return p.x + r * p.ldx; }, p.n, p.cols, p.nq, p.vec, p.out,
                (int64_t)(blockIdx.x - 1) * SORT_THREADS + threadIdx.x, (int64_t)(gridDim.x - 1) * SORT_THREADS);
}

static __global__ void __launch_bounds__(SORT_THREADS)
moe_sort_kernel(const int32_t *__restrict__ idx, SortArgs a, MoeWs ws, XSplit xsp) {
    DDT_GRID_DEP_WAIT();
    if (blockIdx.x > 0) {
        split_x_blocks(xsp);
        return;
    }
    __shared__ SortSmem sm;
    sort_entries(idx, a, ws, sm);
}

/*
 * The router and the sort in one block for a few tokens (n <= MOE_ROUTE_SORT_MAX,
 * a router of at most ROUTE_WARP_MAX experts): each of the 8 warps routes tokens
 * warp, warp + 8, ... as route_warp_kernel does (the same function: the same bits),
 * writes idx / w, and after a block barrier the block sorts them.  One launch less
 * per MoE layer; a warp routes up to 8 tokens one after the other, which is why
 * larger n keep the two launches (the router's grid spreads them).
 */
/* 8: one token per warp.  Profiled at K2.6 shapes (384 experts) the block took
 * 14 us at n = 1 and 44 us at n = 32 (8 warps routing 4 tokens each in turn),
 * where the two launches cost about 11 and 17 us; the result is the same bits
 * either way (the same device functions). */
#define MOE_ROUTE_SORT_MAX 8

static __global__ void __launch_bounds__(SORT_THREADS)
moe_route_sort_kernel(const float *__restrict__ logits, int64_t ld, int n, ddt_moe_route_params p, int32_t *idx,
                      float *w, SortArgs a, MoeWs ws, XSplit xsp) {
    DDT_GRID_DEP_WAIT();
    if (blockIdx.x > 0) {
        split_x_blocks(xsp);
        return;
    }
    __shared__ union {
        RouteWarpSmem route[SORT_THREADS / 32];
        SortSmem sort;
    } sm;
    const int warp = threadIdx.x >> 5;
    for (int t = warp; t < n; t += SORT_THREADS / 32)
        route_token_warp(logits + (int64_t)t * ld, p, sm.route[warp], idx + (int64_t)t * p.top_k,
                         w + (int64_t)t * p.top_k);
    __syncthreads(); /* idx written and visible to the block; the routers' scratch free */
    sort_entries(idx, a, ws, sm.sort);
}

/* ------------------------------------------------------------------ expert GEMMs */

/* warp: intermediate rows o0, o0+1 of gate and up -> h = silu(g) * u */
template <int F, int TB, int U>
static __global__ void __launch_bounds__(EX_WARPS * 32)
moe_gateup_kernel(const QView W, MoeWs ws, const float *__restrict__ x, int64_t ldx, bool xvec, int inter) {
    DDT_GRID_DEP_WAIT();
    const SlotRec rec = ws.rec[blockIdx.y];
    if (rec.cnt == 0) return;
    const int lane = threadIdx.x & 31;
    const int o0 = (blockIdx.x * EX_WARPS + (threadIdx.x >> 5)) * 2;
    if (o0 >= inter) return;
    const int o1 = o0 + 1 < inter ? o0 + 1 : o0;
    const uint8_t *wd[4] = {rec.d[0], rec.d[1], rec.d[0], rec.d[1]};
    const void *wsc[4] = {rec.s[0], rec.s[1], rec.s[0], rec.s[1]};
    const int64_t row[4] = {o0, o0, o1, o1};
    for (int t0 = 0; t0 < rec.cnt; t0 += TB) {
        const int ntok = rec.cnt - t0 < TB ? rec.cnt - t0 : TB;
        const float *xr[TB];
#pragma unroll
        for (int t = 0; t < TB; t++) xr[t] = x + (int64_t)ws.sorted_tok[rec.off + t0 + (t < ntok ? t : 0)] * ldx;
        float out[4][TB];
        warp_dot<F, 4, TB, U>(W, wd, wsc, row, xr, ntok, xvec, out);
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int t = 0; t < TB; t++)
                if (lane == j * TB + t && t < ntok && o0 + j < inter) {
                    const float g = out[2 * j][t], u = out[2 * j + 1][t];
                    ws.h[(int64_t)(rec.off + t0 + t) * inter + o0 + j] = g / (1.0f + expf(-g)) * u;
                }
    }
}

/* The shared expert's down projection inside the routed down launch
 * (ddt_cuda_moe_args.shared_down): y[t] = x[t] W^T for tokens t < n, in items of
 * per_item tokens, one item per grid row blockIdx.y < items. */
struct SharedDown {
    QView W;           /* [hidden][s_inter]: qview_make of the weight, as ddt_cuda_matmul builds it */
    const float *x;    /* [n][s_inter], row stride ldx */
    int64_t ldx;
    float *y;          /* [n][hidden], row stride ldy */
    int64_t ldy;
    int n, items, per_item;
    bool xvec;         /* x and ldx 16-byte aligned: float4 loads (the same values) */
};

/* No shared down in the launch: the down kernel's instance without that branch. */
#define SH_NONE (-1)

/* warp: hidden rows o0 .. o0+R-1 of the shared down for the item's tokens, TB at
 * a time.  Each element is warp_dot of one weight row with one token's row, the
 * function ddt_cuda_matmul's mm_kernel runs, and warp_dot's order depends on the
 * weight's columns only (never on R, TB, U, which tokens share a warp or the
 * alignment path): the bits of the separate product. */
template <int F, int R, int TB, int U>
static __device__ __forceinline__ void shared_down_rows(const SharedDown &sd, int hidden) {
    const int lane = threadIdx.x & 31;
    const int o0 = (blockIdx.x * EX_WARPS + (threadIdx.x >> 5)) * R;
    if (o0 >= hidden) return;
    const int tok0 = (int)blockIdx.y * sd.per_item;
    const int cnt = sd.n - tok0 < sd.per_item ? sd.n - tok0 : sd.per_item;
    const uint8_t *wd[R];
    const void *wsc[R];
    int64_t row[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        wd[r] = sd.W.data;
        wsc[r] = sd.W.scale;
        row[r] = o0 + r < hidden ? o0 + r : hidden - 1; /* spare rows recompute the last one, unwritten */
    }
    for (int t0 = 0; t0 < cnt; t0 += TB) {
        const int ntok = cnt - t0 < TB ? cnt - t0 : TB;
        const float *xr[TB];
#pragma unroll
        for (int t = 0; t < TB; t++) xr[t] = sd.x + (int64_t)(tok0 + t0 + (t < ntok ? t : 0)) * sd.ldx;
        float out[R][TB];
        warp_dot<F, R, TB, U>(sd.W, wd, wsc, row, xr, ntok, sd.xvec, out);
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < TB; t++)
                if (lane == r * TB + t && t < ntok && o0 + r < hidden)
                    sd.y[(int64_t)(tok0 + t0 + t) * sd.ldy + o0 + r] = out[r][t];
    }
}

/* warp: hidden rows o0 .. o0+R-1 of down for every token of the expert.  FS: the
 * shared down's format when grid rows 0 .. sd.items-1 run it (shared_down_rows;
 * the routed items follow), SH_NONE for the launch without it (no such branch in
 * the code: an epilogue variant is an instance, not a runtime branch). */
template <int F, int R, int TB, int U, int FS>
static __global__ void __launch_bounds__(EX_WARPS * 32)
moe_down_kernel(const QView W, MoeWs ws, bool hvec, int hidden, int inter, const SharedDown sd) {
    DDT_GRID_DEP_WAIT();
    unsigned item = blockIdx.y; /* unsigned: without FS, the index arithmetic of the kernel before the fold */
    if constexpr (FS != SH_NONE) {
        if (item < (unsigned)sd.items) {
            shared_down_rows<FS, R, TB, U>(sd, hidden);
            return;
        }
        item -= (unsigned)sd.items;
    }
    const SlotRec rec = ws.rec[item];
    if (rec.cnt == 0) return;
    const int lane = threadIdx.x & 31;
    const int o0 = (blockIdx.x * EX_WARPS + (threadIdx.x >> 5)) * R;
    if (o0 >= hidden) return;
    const uint8_t *wd[R];
    const void *wsc[R];
    int64_t row[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        wd[r] = rec.d[2];
        wsc[r] = rec.s[2];
        row[r] = o0 + r < hidden ? o0 + r : hidden - 1;
    }
    for (int t0 = 0; t0 < rec.cnt; t0 += TB) {
        const int ntok = rec.cnt - t0 < TB ? rec.cnt - t0 : TB;
        const float *xr[TB];
#pragma unroll
        for (int t = 0; t < TB; t++) xr[t] = ws.h + (int64_t)(rec.off + t0 + (t < ntok ? t : 0)) * inter;
        float out[R][TB];
        warp_dot<F, R, TB, U>(W, wd, wsc, row, xr, ntok, hvec, out);
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < TB; t++)
                if (lane == r * TB + t && t < ntok && o0 + r < hidden)
                    ws.o[(int64_t)(rec.off + t0 + t) * hidden + o0 + r] = out[r][t];
    }
}

/* ------------------------------------------------------------------ combine */

/* One token's entries in increasing expert index (the CPU's order): their rows of
 * ws.o (spos; < 0: an expert another rank holds) and weights, and whether an index
 * is bad.  Filled by token_entries. */
struct TokenEntries {
    int spos[MOE_MAX_TOPK], ridx[MOE_MAX_TOPK], rpos[MOE_MAX_TOPK];
    float sw[MOE_MAX_TOPK], rw[MOE_MAX_TOPK];
    int bad;
};

/* Token t's entries into te (shared), by the calling block (>= K threads; it holds
 * block barriers).  The order is the CPU's: by expert index, ties by k (a stable
 * sort); each of K threads computes its entry's rank in that order, so no thread
 * walks the list (thread 0's insertion sort kept its order array in local memory,
 * ~1 us a token on the H200). */
static __device__ __forceinline__ void token_entries(const int32_t *__restrict__ idx, const float *__restrict__ w,
                                                     int K, int E_total, const MoeWs &ws, int t, TokenEntries &te) {
    /* the token's K entries in parallel first: one thread reading them in its
       sort loop paid a memory latency per read (~9 us a call on the H200) */
    if ((int)threadIdx.x < K) {
        te.ridx[threadIdx.x] = idx[(int64_t)t * K + threadIdx.x];
        te.rw[threadIdx.x] = w[(int64_t)t * K + threadIdx.x];
        te.rpos[threadIdx.x] = ws.pos_of[(int64_t)t * K + threadIdx.x];
    }
    if (threadIdx.x == 0) te.bad = 0;
    __syncthreads();
    if ((int)threadIdx.x < K) {
        const int k = threadIdx.x, e = te.ridx[k];
        int rank = 0;
        for (int j = 0; j < K; j++) {
            const int ej = te.ridx[j];
            rank += (ej < e || (ej == e && j < k)) ? 1 : 0;
        }
        te.spos[rank] = te.rpos[k];
        te.sw[rank] = te.rw[k];
        if (e < 0 || e >= E_total) te.bad = 1;
    }
    __syncthreads();
}

/* Element d of the token's routed sum: acc = 0.0f, then acc = acc + w * row, in the
 * entries' order; NaN for a token with a bad expert index.  combine_at4 is the same
 * per component for elements 4i..4i+3 (rows of a multiple of 4 floats, ws.o 16-byte
 * aligned). */
static __device__ __forceinline__ float combine_at(const TokenEntries &te, int K, const float *o, int hidden, int d) {
    float acc = __int_as_float(0x7FC00000); /* a token with a bad expert index gets NaN */
    if (!te.bad) {
        acc = 0.0f;
        for (int k = 0; k < K; k++) /* spos < 0: an expert another rank holds */
            if (te.spos[k] >= 0) acc = acc + te.sw[k] * o[(int64_t)te.spos[k] * hidden + d];
    }
    return acc;
}

#define COMBINE_BATCH 8 /* K2.6's top-8 in one batch */
static __device__ __forceinline__ float4 combine_at4(const TokenEntries &te, int K, const float *o, int hidden, int i) {
    const float nan = __int_as_float(0x7FC00000);
    float4 acc = make_float4(nan, nan, nan, nan);
    if (!te.bad) {
        /* COMBINE_BATCH rows' loads issued before their adds (a loop over a
           runtime K waited a memory latency per expert: 34 us for one K2.6 token);
           not all MOE_MAX_TOPK at once: 16 float4 are the whole register budget of
           a thread of a 1024-thread block, which spilled (25.7 us a token).  The adds
           keep their order, so the same bits */
        acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int k0 = 0; k0 < MOE_MAX_TOPK; k0 += COMBINE_BATCH) {
            if (k0 >= K) break;
            float4 v[COMBINE_BATCH];
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; u++) {
                const int k = k0 + u;
                if (k < K && te.spos[k] >= 0) v[u] = ((const float4 *)(o + (int64_t)te.spos[k] * hidden))[i];
            }
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; u++) {
                const int k = k0 + u;
                if (k < K && te.spos[k] >= 0) {
                    const float g = te.sw[k];
                    acc.x = acc.x + g * v[u].x, acc.y = acc.y + g * v[u].y, acc.z = acc.z + g * v[u].z,
                    acc.w = acc.w + g * v[u].w;
                }
            }
        }
    }
    return acc;
}

static __global__ void __launch_bounds__(COMBINE_THREADS)
moe_combine_kernel(const int32_t *__restrict__ idx, const float *__restrict__ w, int K, int E_total, MoeWs ws, int hidden,
                   float *out, int64_t ldo) {
    DDT_GRID_DEP_WAIT();
    __shared__ TokenEntries te;
    const int t = blockIdx.y;
    token_entries(idx, w, K, E_total, ws, t, te);
    float *orow = out + (int64_t)t * ldo;
    for (int d = blockIdx.x * COMBINE_THREADS + threadIdx.x; d < hidden; d += gridDim.x * COMBINE_THREADS)
        orow[d] = combine_at(te, K, ws.o, hidden, d);
}

/*
 * The layer's end in the combine's launch (ddt_cuda_moe_run with norm_w): x = x +
 * (sh + routed), the bits ddt_cuda_add(sh, routed) then ddt_cuda_add_rmsnorm's
 * residual add stored before (sh + acc: the add kernel's x + y with x the shared
 * expert's row; the routed sum alone without a shared expert, the copy it
 * replaces), then the next norm of that row: norm_row without a residual reads
 * back exactly the sums add_rmsnorm's register path would have squared, in the
 * same thread order, so the same bits.
 *
 * Why two phases.  With the residual inside norm_row every thread held its
 * float4s' K + 2 source rows at once, more than a thread's registers: it spilled
 * to local memory, and the launch took 17.7 us for one K2.6 token on the H200.
 * Here each float4 is one round of K + 2 loads, and the norm reads the stored row
 * back from L1 / L2.
 *
 * Why a cluster.  A K2.6 row is 1792 float4 over 512 threads: one block ran 4
 * rounds of K + 2 loads one after the other, each a memory latency, on a path
 * where nothing else runs (ncu, H100: the launch added 10.5 us to the layer at
 * n = 1).  The sums are elementwise, so any CTA may store any of them: a token's
 * cl CTAs (one cluster, cl = the rounds one block would run, at most 8) each store
 * one slice of the row in one round, then after the cluster barrier (release /
 * acquire at cluster scope: the slices the others stored are visible) the first
 * CTA norms the whole row exactly as before: the same bits.
 */
/* The sums of the row's float4 [lo, hi) (vec) or elements [lo, hi) (not vec). */
template <int NT>
static __device__ __forceinline__ void combine_resid_row(const TokenEntries &te, int K, const float *o, int hidden,
                                                         const float *sh, float *xr, bool vec, int lo, int hi) {
    if (vec) {
#pragma unroll 1
        for (int i = lo + (int)threadIdx.x; i < hi; i += NT) {
            const float4 acc = combine_at4(te, K, o, hidden, i);
            const float4 a = sh ? ((const float4 *)sh)[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float4 v = ((float4 *)xr)[i];
            const float4 r = sh ? make_float4(a.x + acc.x, a.y + acc.y, a.z + acc.z, a.w + acc.w) : acc;
            v.x = v.x + r.x, v.y = v.y + r.y, v.z = v.z + r.z, v.w = v.w + r.w;
            ((float4 *)xr)[i] = v;
        }
        return;
    }
#pragma unroll 1
    for (int d = lo + (int)threadIdx.x; d < hi; d += NT) {
        const float acc = combine_at(te, K, o, hidden, d);
        xr[d] = xr[d] + (sh ? sh[d] + acc : acc);
    }
}

/* The CTAs (one cluster) a token's combine + norm takes: the rounds of loads one
 * block of nt threads would run over the row's units (float4 when vec, else
 * elements), at most 8 (the portable cluster size). */
static int combine_cluster(int hidden, bool vec, int nt) {
    const int units = vec ? hidden / 4 : hidden, rounds = (units + nt - 1) / nt;
    return rounds < 1 ? 1 : rounds > 8 ? 8 : rounds;
}

/* cl CTAs of NT = norm_threads(hidden) per token (grid n * cl; for cl > 1 one
 * cluster a token, launched with cl as its size): the token's entries in each,
 * the residual add of CTA r's slice of the row, then norm_row by CTA 0. */
template <int NT>
static __global__ void __launch_bounds__(NT, 1)
moe_combine_norm_kernel(const int32_t *__restrict__ idx, const float *__restrict__ w, int K, int E_total, MoeWs ws,
                        int hidden, float *x, int64_t ldx, const float *__restrict__ sh, int64_t ldsh,
                        const float *__restrict__ norm_w, float eps, float *out, int64_t ldo, bool vec,
                        const ddt_cuda_split_planes sp, int cl) {
    DDT_GRID_DEP_WAIT();
    __shared__ TokenEntries te;
    const int t = blockIdx.x / cl, r = blockIdx.x % cl; /* r: the CTA's rank in its cluster (x-major) */
    token_entries(idx, w, K, E_total, ws, t, te);
    float *xr = x + (int64_t)t * ldx;
    const int units = vec ? hidden / 4 : hidden, per = (units + cl - 1) / cl;
    const int lo = r * per < units ? r * per : units, hi = lo + per < units ? lo + per : units;
    combine_resid_row<NT>(te, K, ws.o, hidden, sh ? sh + (int64_t)t * ldsh : nullptr, xr, vec, lo, hi);
    if (cl > 1) {
        cluster_sync(); /* every slice stored and, at cluster scope, visible */
        if (r != 0) return;
    } else {
        __syncthreads(); /* the norm's threads read sums other threads stored */
    }
    norm_row<NT>(xr, hidden, NormNoResid{}, norm_w, eps, out + (int64_t)t * ldo, vec, norm_split_row(sp, t));
}

/* ------------------------------------------------------------------ experts */

/*
 * FP32 path: TB tokens per pass (work items hold C >= TB entries; C = TB unless
 * the grid would overflow), U chunks of loads in flight, R down rows per warp.
 * Decode (about one token per expert) wants many loads in flight and no idle
 * token slots; big batches want several tokens per weight load.
 */
template <int F, int TB, int U, int RD, int UD, int FS>
static ddt_status experts_launch(const ddt_cuda_moe_layer *m, const float *x, int64_t ldx, bool xvec, int slots,
                                 const MoeWs &ws, const SharedDown &sd, cudaStream_t s, ddt_error *err) {
    const int H = m->hidden, I = m->inter;
    const bool hvec = I % 4 == 0;
    const QView Wgu = qview_make<F>(m->host_copy[0]), Wd = qview_make<F>(m->host_copy[2 * m->n_experts]);
    dim3 g1((unsigned)((I + 2 * EX_WARPS - 1) / (2 * EX_WARPS)), (unsigned)slots);
    moe_gateup_kernel<F, TB, U><<<g1, EX_WARPS * 32, 0, s>>>(Wgu, ws, x, ldx, xvec, I);
    DDT_CUDA_LAUNCHED("moe_gateup", s, err);
    /* the shared down's items (none without it) in front of the routed ones */
    dim3 g2((unsigned)((H + RD * EX_WARPS - 1) / (RD * EX_WARPS)), (unsigned)(sd.items + slots));
    moe_down_kernel<F, RD, TB, UD, FS><<<g2, EX_WARPS * 32, 0, s>>>(Wd, ws, hvec, H, I, sd);
    DDT_CUDA_LAUNCHED(FS == SH_NONE ? "moe_down" : "moe_down + shared down", s, err);
    return DDT_OK;
}

template <int F, int FS>
static ddt_status experts_launch_tb(const ddt_cuda_moe_layer *m, const float *x, int64_t ldx, bool xvec, int slots,
                                    int TB, const MoeWs &ws, const SharedDown &sd, cudaStream_t s, ddt_error *err) {
    if (TB == 1) return experts_launch<F, 1, 4, 8, 2, FS>(m, x, ldx, xvec, slots, ws, sd, s, err);
    if (TB == 2) return experts_launch<F, 2, 2, 8, 1, FS>(m, x, ldx, xvec, slots, ws, sd, s, err);
    return experts_launch<F, 4, 1, 4, 1, FS>(m, x, ldx, xvec, slots, ws, sd, s, err);
}

/* The FP32 experts of format F with the shared down of format fs (sd.items > 0)
 * or without it: the pairs ddt_cuda_moe_shared_down_ok admits (the same format,
 * or BF16 beside INT4) are the only instances, to keep the build's kernel count
 * down. */
template <int F>
static ddt_status experts_launch_fs(const ddt_cuda_moe_layer *m, const float *x, int64_t ldx, bool xvec, int slots,
                                    int TB, const MoeWs &ws, const SharedDown &sd, int fs, cudaStream_t s,
                                    ddt_error *err) {
    if (sd.items == 0) return experts_launch_tb<F, SH_NONE>(m, x, ldx, xvec, slots, TB, ws, sd, s, err);
    if (fs == F) return experts_launch_tb<F, F>(m, x, ldx, xvec, slots, TB, ws, sd, s, err);
    if constexpr (F == QF_INT4) {
        if (fs == QF_BF16) return experts_launch_tb<F, QF_BF16>(m, x, ldx, xvec, slots, TB, ws, sd, s, err);
    }
    return ddt_fail(err, DDT_ERR_UNSUPPORTED, "moe_experts: shared down format %d beside experts of format %d", fs,
                    F);
}

/* The format pairs experts_launch_fs runs. */
static bool shared_pair_ok(int f, int fs) { return fs == f || (f == QF_INT4 && fs == QF_BF16); }

/*
 * Tensor-core path (wstream.cuh): work items of at most C = 8*NT entries, grid
 * (item, row block) with the item fastest, so the items of one big expert run
 * side by side and share its weights in L2.
 */
template <int F, int NT>
static ddt_status tc_experts_launch(const ddt_cuda_moe_layer *m, const WsItem *items, int slots, int n,
                                    const MoeWs &ws, cudaStream_t s, ddt_error *err) {
    constexpr int MT = ws_mt<F>(NT);
    const int H = m->hidden, I = m->inter;
    const ddt_qweight *gw = &m->host_copy[0], *dw = &m->host_copy[2 * m->n_experts];
    WsArgs a;
    memset(&a, 0, sizeof a);
    a.rows = I;
    a.cols = H;
    a.nu = (H + 31) / 32;
    a.mtiles = (I + 15) / 16;
    a.fp8_block = gw->block;
    a.fp8_scols = gw->block > 0 ? (int32_t)((H + gw->block - 1) / gw->block) : 0;
    a.ks = 1;
    a.xcap = n < 8 * NT ? n : 8 * NT; /* a token reaches an expert at most once: an item has <= n entries */
    a.units_per_split = a.nu;
    a.xs = ws.xs; /* x split by the sort launch, rows by token */
    a.ldxs = a.nu * 8;
    a.items = items;
    a.sorted_tok = ws.sorted_tok;
    a.hs = (uint4 *)ws.h; /* h out split, rows by entry */
    ws_kernel<F, WS_GATEUP, NT><<<dim3((unsigned)slots, (unsigned)((I + 8 * MT - 1) / (8 * MT))), ws_threads<F>(NT),
                                  ws_smem_bytes<F>(NT, a.xcap), s>>>(a);
    DDT_CUDA_LAUNCHED("moe_gateup (tensor cores)", s, err);
    WsArgs b = a;
    b.rows = H;
    b.cols = I;
    b.nu = (I + 31) / 32;
    b.mtiles = (H + 15) / 16;
    b.fp8_block = dw->block;
    b.fp8_scols = dw->block > 0 ? (int32_t)((I + dw->block - 1) / dw->block) : 0;
    b.units_per_split = b.nu;
    b.xs = (const uint4 *)ws.h;
    b.ldxs = b.nu * 8;
    b.hs = NULL;
    b.y = ws.o;
    ws_kernel<F, WS_DOWN, NT><<<dim3((unsigned)slots, (unsigned)((H + 16 * MT - 1) / (16 * MT))), ws_threads<F>(NT),
                                ws_smem_bytes<F>(NT, b.xcap), s>>>(b);
    DDT_CUDA_LAUNCHED("moe_down (tensor cores)", s, err);
    return DDT_OK;
}

/* grid (items, row blocks x k-split), the k-split's CTAs one cluster */
template <int KIND, int F>
static cudaError_t wx_launch(const WxArgs &a, int slots, int64_t row_blocks, cudaStream_t s) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)slots, (unsigned)(row_blocks * a.ks));
    cfg.blockDim = dim3(WX_THREADS);
    cfg.dynamicSmemBytes = WX_SMEM;
    cfg.stream = s;
    cudaLaunchAttribute attr;
    if (a.ks > 1) ddt_cuda_set_cluster(&cfg, &attr, 1, (unsigned)a.ks);
    return cudaLaunchKernelEx(&cfg, wx_kernel<KIND, F>, a);
}

/* One projection's arguments: rows x cols weights reading wq rows of x (ldxs apart). */
static WxArgs wx_args(const ddt_cuda_moe_layer *m, const MoeWs &ws, const uint8_t *xs, int64_t rows, int64_t cols) {
    WxArgs a;
    memset(&a, 0, sizeof a);
    a.items = ws.rec;
    a.sorted_tok = ws.sorted_tok;
    a.xs = xs;
    a.ldxs = wx_row_bytes(cols);
    a.rows = rows;
    a.cols = cols;
    a.nu = (cols + 31) / 32;
    a.mtiles = (rows + 15) / 16;
    a.ks = wx_ksplit(cols);
    a.ups = ((a.nu + a.ks - 1) / a.ks + WX_U - 1) / WX_U * WX_U;
    const ddt_qweight &q = m->host_copy[rows == m->inter ? 0 : 2 * m->n_experts]; /* gate/up or down */
    if (q.format == DDT_Q_FP8_BLOCK) {
        a.fp8_block = q.block;
        a.fp8_scols = (int32_t)((cols + q.block - 1) / q.block);
    }
    return a;
}

/* A call's own value for the wgmma down launch's flags (WxArgs.gen): never 0 (the reset
 * value) or ~0 (a poisoned workspace), and from a per-process random start, so a value a
 * workspace holds from elsewhere is not taken for this call's.  Graph replays repeat their
 * captured gens, which each call's last down CTA resets. */
static uint32_t wx_next_gen() {
    static uint32_t counter = 0; /* __atomic: calls from several host threads */
    static uint32_t base = 0;
    if (__atomic_load_n(&base, __ATOMIC_RELAXED) == 0) {
        uint64_t h = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)&counter << 16) ^ (uint64_t)clock();
        h *= 0x9E3779B97F4A7C15ull; /* spread the bits */
        uint32_t b = (uint32_t)(h >> 32);
        if (b == 0) b = 1;
        uint32_t zero = 0;
        __atomic_compare_exchange_n(&base, &zero, b, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    }
    for (;;) {
        const uint32_t g = __atomic_load_n(&base, __ATOMIC_RELAXED) + __atomic_add_fetch(&counter, 1u, __ATOMIC_RELAXED);
        if (g != 0 && g != ~0u) return g;
    }
}

/* The INT4 experts on wgmma (wgmma_experts.cuh): one list of items of at most
 * WX_N entries; gate/up then down, x and h in wq rows.  Down starts by flags: see
 * WxArgs and wx_kernel (ddt_cuda_kernel_waits_late counts it, so a graph's edge
 * into it is programmatic even where only the products' are). */
template <int F>
static ddt_status wx_experts(const ddt_cuda_moe_layer *m, int slots, const MoeWs &ws, cudaStream_t s, ddt_error *err) {
    const int H = m->hidden, I = m->inter;
    WxArgs a = wx_args(m, ws, (const uint8_t *)ws.xs, I, H); /* gate/up: x in, h out */
    a.hs = (uint8_t *)ws.h;
    a.ldhs = wx_row_bytes(I);
    const int64_t gu_blocks = (I + WX_ROWS / 2 - 1) / (WX_ROWS / 2);
    a.done = ws.done;
    a.sync = ws.sync;
    a.gen = wx_next_gen();
    cudaError_t e = wx_launch<WX_GATEUP, F>(a, slots, gu_blocks, s);
    if (e != cudaSuccess) return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: moe_gateup (wgmma): %s", cudaGetErrorString(e));
    DDT_CUDA_LAUNCHED("moe_gateup (wgmma)", s, err);
    WxArgs b = wx_args(m, ws, (const uint8_t *)ws.h, H, I); /* down: h in, one output row per entry */
    b.y = ws.o;
    b.done = ws.done;
    b.done_target = (int32_t)(gu_blocks * a.ks); /* the gate/up CTAs of a slot */
    b.sync = ws.sync;
    b.gen = a.gen;
    e = wx_launch<WX_DOWN, F>(b, slots, (H + WX_ROWS - 1) / WX_ROWS, s);
    if (e != cudaSuccess) return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: moe_down (wgmma): %s", cudaGetErrorString(e));
    DDT_CUDA_LAUNCHED("moe_down (wgmma)", s, err);
    return DDT_OK;
}

/* The first list's items (at most 8*nt entries) on the nt-tile kernel; then, when
 * big_slots > 0, the second list's (experts with more than 8 entries, items of at
 * most 32) on the 4-tile kernel. */
template <int F>
static ddt_status tc_experts(const ddt_cuda_moe_layer *m, int slots, int nt, int big_slots, int n, const MoeWs &ws,
                             cudaStream_t s, ddt_error *err) {
    ddt_status st;
    if (nt == 1) st = tc_experts_launch<F, 1>(m, ws.rec, slots, n, ws, s, err);
    else if (nt == 2) st = tc_experts_launch<F, 2>(m, ws.rec, slots, n, ws, s, err);
    else st = tc_experts_launch<F, 4>(m, ws.rec, slots, n, ws, s, err);
    if (st == DDT_OK && big_slots > 0) st = tc_experts_launch<F, 4>(m, ws.rec + slots, big_slots, n, ws, s, err);
    return st;
}

static int g_item_nt_cap = 0; /* ddt_cuda_moe_set_item_ntiles */
extern "C" void ddt_cuda_moe_set_item_ntiles(int nt) { g_item_nt_cap = nt == 1 || nt == 2 || nt == 4 ? nt : 0; }

extern "C" ddt_status ddt_cuda_moe_layer_pack(ddt_cuda_moe_layer *m, ddt_error *err) {
    if (!m || !m->host_copy || !m->gate) return ddt_fail(err, DDT_ERR_INVALID, "moe_layer_pack: no layer");
    /* gate / up ([inter, hidden]) and down ([hidden, inter]) share one format */
    if (ddt_cuda_qweight_tc_eligible(&m->host_copy[0]) && ddt_cuda_qweight_tc_eligible(&m->host_copy[2 * m->n_experts])) {
        cudaError_t e = ws_set_smem<WS_GATEUP, 1, 2, 4>();
        if (e == cudaSuccess) e = ws_set_smem<WS_DOWN, 1, 2, 4>();
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(wx_kernel<WX_GATEUP, QF_INT4>, cudaFuncAttributeMaxDynamicSharedMemorySize, WX_SMEM);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(wx_kernel<WX_DOWN, QF_INT4>, cudaFuncAttributeMaxDynamicSharedMemorySize, WX_SMEM);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(wx_kernel<WX_GATEUP, QF_FP8>, cudaFuncAttributeMaxDynamicSharedMemorySize, WX_SMEM);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(wx_kernel<WX_DOWN, QF_FP8>, cudaFuncAttributeMaxDynamicSharedMemorySize, WX_SMEM);
        if (e != cudaSuccess)
            return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: expert kernels' shared memory attribute: %s",
                            cudaGetErrorString(e));
        for (int32_t i = 0; i < 3 * m->n_experts; i++) {
            ddt_status st = ddt_cuda_qweight_pack_stream(&m->host_copy[i], err); /* bf16 experts too */
            if (st != DDT_OK) return st;
        }
        /* the device table of weight structs now carries the packed pointers */
        DDT_CUDA_TRY(cudaMemcpy(m->gate, m->host_copy, sizeof(ddt_qweight) * 3 * (size_t)m->n_experts,
                                cudaMemcpyHostToDevice),
                     err);
    }
    m->mode = DDT_CUDA_MM_TENSOR;
    return DDT_OK;
}

/* A weight ddt_cuda_matmul's FP32 path takes (qmatmul_cuda.cu's check_weight and
 * mm_check, for a weight read as x W^T), and its format. */
static bool plain_weight_ok(const ddt_qweight *w) {
    if (!w || !w->data || w->rows < 1 || w->cols < 1) return false;
    switch (w->format) {
    case DDT_Q_DENSE: return w->dtype == DDT_DTYPE_F32 || w->dtype == DDT_DTYPE_BF16 || w->dtype == DDT_DTYPE_F16;
    case DDT_Q_FP8_BLOCK: return w->block >= 16 && w->block % 16 == 0 && w->scale_inv;
    case DDT_Q_INT4_GROUP:
        return w->scale && w->group == 32 && w->cols % 32 == 0 && qview_make<QF_INT4>(*w).wvec;
    }
    return false;
}

extern "C" bool ddt_cuda_moe_shared_down_ok(const ddt_cuda_moe_layer *m, const ddt_qweight *down) {
    if (!m || !m->host_copy || m->mode != DDT_CUDA_MM_FP32 || !plain_weight_ok(down) || down->rows != m->hidden)
        return false;
    return shared_pair_ok(qfmt_of(m->host_copy[0]), qfmt_of(*down));
}

/* qview_make for a format known at run time. */
static QView qview_of(const ddt_qweight &w) {
    switch (qfmt_of(w)) {
    case QF_F32: return qview_make<QF_F32>(w);
    case QF_BF16: return qview_make<QF_BF16>(w);
    case QF_F16: return qview_make<QF_F16>(w);
    case QF_FP8: return qview_make<QF_FP8>(w);
    default: return qview_make<QF_INT4>(w);
    }
}

extern "C" ddt_status ddt_cuda_moe_experts(const ddt_cuda_moe_layer *m, const float *x, int64_t ldx, int32_t n,
                                           const int32_t *idx, const float *w, int32_t top_k, float *out, int64_t ldo,
                                           void *workspace, size_t workspace_bytes, ddt_cuda_stream stream,
                                           ddt_error *err) {
    ddt_cuda_moe_args a;
    memset(&a, 0, sizeof a);
    a.x = x, a.ldx = ldx, a.n = n, a.top_k = top_k;
    a.idx = (int32_t *)idx, a.w = (float *)w; /* read only without route */
    a.out = out, a.ldo = ldo;
    a.workspace = workspace, a.workspace_bytes = workspace_bytes;
    return ddt_cuda_moe_run(m, &a, stream, err);
}

extern "C" ddt_status ddt_cuda_moe_run(const ddt_cuda_moe_layer *m, const ddt_cuda_moe_args *args,
                                       ddt_cuda_stream stream, ddt_error *err) {
    if (!m || !m->host_copy || !args || !args->x || !args->idx || !args->w || !args->out || !args->workspace ||
        args->n < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "moe_experts: missing arguments or %d tokens", args ? args->n : 0);
    const float *x = args->x;
    const int64_t ldx = args->ldx;
    const int32_t n = args->n, top_k = args->top_k;
    const int32_t *idx = args->idx;
    const float *w = args->w;
    if (top_k < 1 || top_k > MOE_MAX_TOPK)
        return ddt_fail(err, DDT_ERR_INVALID, "moe_experts: top_k %d outside 1..%d", top_k, MOE_MAX_TOPK);
    if (m->first_expert < 0 || m->total_experts > MOE_MAX_EXPERTS || m->first_expert > m->total_experts - m->n_experts)
        return ddt_fail(err, DDT_ERR_INVALID, "moe_experts: experts [%d, %d) of %d", m->first_expert,
                        m->first_expert + m->n_experts, m->total_experts);
    if (args->route) {
        const ddt_status st = route_check(args->route, err);
        if (st != DDT_OK) return st;
        if (!args->logits || args->route->top_k != top_k || args->route->n_experts != m->total_experts)
            return ddt_fail(err, DDT_ERR_INVALID, "moe_run: router of %d experts top %d for a layer of %d top %d",
                            args->route->n_experts, args->route->top_k, m->total_experts, top_k);
    }
    if (args->norm_w) {
        if (!args->resid || args->out == args->resid || (args->shared && (args->out == args->shared ||
                                                                          args->shared == args->resid)))
            return ddt_fail(err, DDT_ERR_INVALID, "moe_run: fused end without a residual, or aliased buffers");
    }
    const ddt_qweight *sdw = args->shared_down;
    if (sdw) {
        if (!ddt_cuda_moe_shared_down_ok(m, sdw))
            return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                            "moe_run: shared down [%lld, %lld] format %d dtype %d beside a layer of hidden %d, mode "
                            "%d (ddt_cuda_moe_shared_down_ok)",
                            (long long)sdw->rows, (long long)sdw->cols, (int)sdw->format, (int)sdw->dtype, m->hidden,
                            (int)m->mode);
        const float *sy = args->shared_y;
        if (!args->shared_x || !sy || args->ld_shared_x < sdw->cols || args->ld_shared_y < m->hidden ||
            sy == args->shared_x || sy == args->out || (args->norm_w && sy == args->resid))
            return ddt_fail(err, DDT_ERR_INVALID, "moe_run: shared down without its rows, or aliased buffers");
    }
    if ((uintptr_t)args->workspace % 256 != 0) /* ws_layout's alignment: float4 reads of its rows */
        return ddt_fail(err, DDT_ERR_INVALID, "moe_experts: workspace not 256-byte aligned");
    const int64_t M = (int64_t)n * top_k;
    if (M > 0x7FFFFFFF / 2 || n > 65535) return ddt_fail(err, DDT_ERR_RANGE, "moe_experts: %d tokens x top %d", n, top_k);
    MoeWs ws = ws_layout(args->workspace, m->n_experts, M, n, m->hidden, m->inter);
    if (ws.bytes > args->workspace_bytes)
        return ddt_fail(err, DDT_ERR_RANGE, "moe_experts: %d tokens need %zu workspace bytes, %zu given", n, ws.bytes,
                        args->workspace_bytes);
    const ddt_qweight *ref = &m->host_copy[0];
    const int F = qfmt_of(*ref);
    if (F == QF_INT4 && (ref->group != 32 || m->hidden % 32 != 0 || m->inter % 32 != 0))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "moe_experts: INT4 experts need group 32 and sizes multiple of 32");
    if (F == QF_FP8 && (ref->block < 16 || ref->block % 16 != 0))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "moe_experts: FP8 block %d", ref->block);
    if (m->mode != DDT_CUDA_MM_FP32 && m->mode != DDT_CUDA_MM_TENSOR)
        return ddt_fail(err, DDT_ERR_INVALID, "moe_experts: unknown mode %d", (int)m->mode);
    cudaStream_t s = (cudaStream_t)stream;
    /* the tensor path takes bf16, INT4 and FP8 with blocks of whole sub-chunks; the
       choice depends on the layer only (never on n), as batch invariance needs */
    const bool tc = m->mode == DDT_CUDA_MM_TENSOR && ddt_cuda_qweight_tc_eligible(ref) &&
                    ddt_cuda_qweight_tc_eligible(&m->host_copy[2 * m->n_experts]);
    const int64_t E = m->n_experts, touched = M < E ? M : E;
    /* the wgmma experts (wgmma_experts.cuh): INT4, and FP8 with scale blocks of whole units and
       sizes of whole units (DeepSeek-V3's 128 blocks, 7168 / 2048); other FP8 layers keep the
       mma.sync stream.  A property of the layer, never of n */
    const bool wx = tc && (F == QF_INT4 || (F == QF_FP8 && ref->block % 32 == 0 && m->hidden % 32 == 0 &&
                                            m->inter % 32 == 0));
    int TB = 0, C, nt = 1, C_big = 0, big_min = 0, big_slots = 0;
    if (tc) {
        if (!ref->mma)
            return ddt_fail(err, DDT_ERR_INVALID, "moe_experts: tensor-core mode on a layer that was not packed "
                                                  "(ddt_cuda_moe_layer_pack)");
        /* Two classes of work items.  An expert with at most 16 entries (nearly all
           of them under spread routing: n = 64 tokens, top 8 of 384 give ~94 experts
           of ~5) takes items of at most 8 on the 1-tile kernel, whose stages hold 8
           token rows, so two blocks fit an SM; sizing every block for the largest
           expert's tokens (items of 32) capped occupancy at one block per SM: H200,
           384 x INT4 [2048, 7168], uniform routing, n = 16 / 32 / 64: 773 / 1127 /
           1568 us with items of 8 against 1000 / 1859 / 2409 us with items of 16 /
           32 / 32.  An expert with more entries (tree tokens share context, so
           routing can concentrate) takes items of up to 32 on the 4-tile kernel in
           a second launch, where one dequantised weight tile serves 4 n-tiles
           instead of 4 items re-doing it; the threshold is 16, not 8, because
           sending 9..16-entry experts there cost 7% at n = 64 under uniform
           routing (1681 against 1566 us).  Only n picks the launches; no value
           depends on the class. */
        nt = 1;
        C = 8;
        if (n > 16) { /* an expert gets at most n entries: none is big otherwise */
            C_big = 32;
            big_min = 16;
            big_slots = (int)(M / 17); /* sum over big experts of ceil(c / 32) <= sum c / 17 */
        }
        if (g_item_nt_cap > 0) nt = g_item_nt_cap, C = 8 * nt, C_big = 0, big_slots = 0; /* one class (benchmarks) */
        /* INT4 and FP8 on wgmma: one list of items of at most WX_N entries (the kernel picks
           the instruction's N by the item's count) */
        if (wx) C = WX_N, C_big = 0, big_min = 0, big_slots = 0; /* (nt: the mma.sync stream's only) */
        if (touched + M / C > 65535) /* the FP32 path's grid bound, kept here too (never reached for n <= 65535) */
            return ddt_fail(err, DDT_ERR_RANGE, "moe_experts: %d tokens x top %d", n, top_k);
    } else {
        TB = M * 2 <= E ? 1 : M <= 2 * E ? 2 : 4;
        C = TB;
        /* grid.y limit: longer items, looped TB at a time; the shared down's items
           of C tokens share the down launch's grid */
        const int64_t sh_n = sdw ? n : 0;
        while (touched + M / C + (sh_n + C - 1) / C > 65535) C *= 2;
    }
    /* first-list slots: one item per touched expert when no expert can exceed C
       entries (n <= C); else ceil(c / C) each, at most touched + M / C */
    const int slots = (int)(touched + (n <= C ? 0 : M / C));
    const bool xvec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
    const SortArgs sa = {(int)M, top_k, m->n_experts, m->first_expert, C, slots, C_big, big_min, big_slots,
                         m->gate, m->up, m->down, tc};
    /* the tensor path's x split: blocks 1 .. split_blocks of the sort launch */
    const XSplit xsp = {x, ldx, n, m->hidden, (m->hidden + 31) / 32 * 8, wx ? wx_row_bytes(m->hidden) : 0,
                        xvec, ws.xs};
    int split_blocks = 0;
    if (tc) {
        const int64_t b = (xsp.n * xsp.nq + SORT_THREADS - 1) / SORT_THREADS;
        split_blocks = b < 256 ? (int)b : 256;
    }
    if (args->route && n <= MOE_ROUTE_SORT_MAX && args->route->n_experts <= ROUTE_WARP_MAX) {
        moe_route_sort_kernel<<<1 + split_blocks, SORT_THREADS, 0, s>>>(args->logits, args->ld_logits, n, *args->route,
                                                                        args->idx, args->w, sa, ws, xsp);
        DDT_CUDA_LAUNCHED("moe_route_sort", s, err);
    } else {
        if (args->route) {
            const ddt_status st = ddt_cuda_moe_route(args->logits, args->ld_logits, n, args->route, args->idx, args->w,
                                                     stream, err);
            if (st != DDT_OK) return st;
        }
        moe_sort_kernel<<<1 + split_blocks, SORT_THREADS, 0, s>>>(idx, sa, ws, xsp);
        DDT_CUDA_LAUNCHED("moe_sort", s, err);
    }
    /* the shared down's launch arguments (items 0: none): ddt_cuda_matmul's view of
       the weight and its alignment test of x */
    SharedDown sd;
    memset(&sd, 0, sizeof sd);
    int fs = -1;
    if (sdw) { /* never tc: ddt_cuda_moe_shared_down_ok took an FP32-mode layer only */
        fs = qfmt_of(*sdw);
        sd.W = qview_of(*sdw);
        sd.x = args->shared_x;
        sd.ldx = args->ld_shared_x;
        sd.y = args->shared_y;
        sd.ldy = args->ld_shared_y;
        sd.n = n;
        sd.per_item = C;
        sd.items = (n + C - 1) / C;
        sd.xvec = (uintptr_t)sd.x % 16 == 0 && sd.ldx % 4 == 0;
    }
    ddt_status st;
    if (tc) {
        switch (F) {
        case QF_BF16: st = tc_experts<QF_BF16>(m, slots, nt, big_slots, n, ws, s, err); break;
        case QF_FP8:
            st = wx ? wx_experts<QF_FP8>(m, slots, ws, s, err) : tc_experts<QF_FP8>(m, slots, nt, big_slots, n, ws, s, err);
            break;
        default: st = wx_experts<QF_INT4>(m, slots, ws, s, err); break;
        }
    } else {
        switch (F) {
        case QF_F32: st = experts_launch_fs<QF_F32>(m, x, ldx, xvec, slots, TB, ws, sd, fs, s, err); break;
        case QF_BF16: st = experts_launch_fs<QF_BF16>(m, x, ldx, xvec, slots, TB, ws, sd, fs, s, err); break;
        case QF_F16: st = experts_launch_fs<QF_F16>(m, x, ldx, xvec, slots, TB, ws, sd, fs, s, err); break;
        case QF_FP8: st = experts_launch_fs<QF_FP8>(m, x, ldx, xvec, slots, TB, ws, sd, fs, s, err); break;
        default: st = experts_launch_fs<QF_INT4>(m, x, ldx, xvec, slots, TB, ws, sd, fs, s, err); break;
        }
    }
    if (st != DDT_OK) return st;
    /* a side branch's output (the shared expert) is read from here on */
    if (args->join) DDT_CUDA_TRY(cudaStreamWaitEvent(s, (cudaEvent_t)args->join, 0), err);
    if (args->norm_w) {
        const void *ptrs[4] = {args->resid, args->shared, args->norm_w, args->out};
        const int64_t lds[4] = {args->ld_resid, args->ld_shared, 0, args->ldo};
        const bool vec = norm_vec_ok(m->hidden, ptrs, lds, 4);
        ddt_cuda_split_planes sp;
        const ddt_status sst = norm_split_check("moe_run", &args->norm_split, m->hidden, &sp, err);
        if (sst != DDT_OK) return sst;
        const int cl = combine_cluster(m->hidden, vec, norm_threads(m->hidden));
        cudaError_t ce = cudaSuccess;
        norm_launch(norm_threads(m->hidden), [&](auto nt) {
            constexpr int NT = decltype(nt)::value;
            cudaLaunchConfig_t cfg = {};
            cudaLaunchAttribute attr[1];
            cfg.gridDim = dim3((unsigned)(n * cl));
            cfg.blockDim = dim3(NT);
            cfg.stream = s;
            if (cl > 1) ddt_cuda_set_cluster(&cfg, attr, (unsigned)cl, 1);
            ce = cudaLaunchKernelEx(&cfg, moe_combine_norm_kernel<NT>, idx, (const float *)w, top_k,
                                    (int)m->total_experts, ws, (int)m->hidden, args->resid, args->ld_resid,
                                    (const float *)args->shared, args->ld_shared, (const float *)args->norm_w,
                                    args->eps, args->out, args->ldo, vec, sp, cl);
        });
        DDT_CUDA_TRY(ce, err);
        DDT_CUDA_LAUNCHED("moe_combine_norm", s, err);
        return DDT_OK;
    }
    float *out = args->out;
    const int64_t ldo = args->ldo;
    int bx = (m->hidden + COMBINE_THREADS - 1) / COMBINE_THREADS;
    if (bx > 8) bx = 8;
    moe_combine_kernel<<<dim3((unsigned)bx, (unsigned)n), COMBINE_THREADS, 0, s>>>(idx, w, top_k, m->total_experts, ws,
                                                                                  m->hidden, out, ldo);
    DDT_CUDA_LAUNCHED("moe_combine", s, err);
    return DDT_OK;
}
