/*
 * moe_cuda.h — the DeepSeek-V3 mixture of experts for a few tokens on the GPU:
 * the noaux_tc router (as backend/cpu/moe.h) and the routed experts, grouped by
 * expert so that each touched expert's weights are read once for all the
 * tokens routed to it, with bf16 / FP8-block / INT4 weights dequantised inside
 * the kernels.  The shared expert is a plain MLP the caller runs with
 * qmatmul_cuda.h, except, on the FP32 path, its down projection, which may run
 * inside the routed experts' down launch (ddt_cuda_moe_args.shared_down).
 *
 * Determinism contract (as qmatmul_cuda.h): every output value depends only on
 * its own token's inputs, whatever the other tokens and n are; a token's routed
 * experts are summed in increasing expert index, starting from 0.0f
 * (acc += w_k * expert_k(x), an fp32 multiply then an add, as the CPU does).
 */
#ifndef DDT_CUDA_MOE_H
#define DDT_CUDA_MOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/qmatmul_cuda.h"
#include "backend/moe_route.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The router's parameters are backend/moe_route.h's ddt_moe_route_params (one
 * struct for both backends; here top_k <= 16 and the bias a device array).  The
 * old name stays for callers that still use it. */
typedef ddt_moe_route_params ddt_cuda_route_params;

/* Router: logits [n][n_experts] (device, row stride ld) -> idx [n][top_k] chosen
 * experts in decreasing choice score and w [n][top_k] their weights; the same
 * arithmetic as ddt_cpu_moe_route (sigmoid in fp32, group scores, ties to the
 * lower index, weight = s / (sum + 1e-20) * scale). */
ddt_status ddt_cuda_moe_route(const float *logits, int64_t ld, int32_t n, const ddt_moe_route_params *p,
                              int32_t *idx, float *w, ddt_cuda_stream stream, ddt_error *err);

/* Routed experts of one MoE layer: device arrays of n_experts weights each
 * (gate/up [inter][hidden], down [hidden][inter]); all experts share one
 * format.  The arrays of ddt_qweight structs themselves live in device memory
 * (ddt_cuda_moe_layer_upload builds them). */
typedef struct ddt_cuda_moe_layer {
    int32_t n_experts, hidden, inter;
    /* Expert parallel (model/shard.h): this layer holds global experts
     * [first_expert, first_expert + n_experts) of total_experts; the router's
     * indices are global, and a token's experts held elsewhere add nothing here
     * (an index outside 0..total_experts-1 still gives NaN).  Upload / random
     * set 0 and n_experts (the whole layer); a sharded caller sets both after. */
    int32_t first_expert, total_experts;
    /* How the expert products run (qmatmul_cuda.h): upload / random set
     * DDT_CUDA_MM_FP32; ddt_cuda_moe_layer_pack sets DDT_CUDA_MM_TENSOR. */
    ddt_cuda_mm_mode mode;
    ddt_qweight *gate, *up, *down; /* device arrays [n_experts] of device weights */
    ddt_qweight *host_copy;        /* host mirror [3][n_experts] (for freeing) */
} ddt_cuda_moe_layer;

/* Upload n_experts experts' three host views (gate[e], up[e], down[e]). */
ddt_status ddt_cuda_moe_layer_upload(const ddt_qweight *gate, const ddt_qweight *up, const ddt_qweight *down,
                                     int32_t n_experts, ddt_cuda_moe_layer *out, ddt_error *err);
void ddt_cuda_moe_layer_free(ddt_cuda_moe_layer *m);

/* Tests and benchmarks: a layer of n_experts experts filled on the device with
 * random weights (ddt_cuda_qweight_random: format, dtype, amp), no host copy of
 * the weights.  Free with ddt_cuda_moe_layer_free.  Syncs. */
ddt_status ddt_cuda_moe_layer_random(int32_t n_experts, int32_t hidden, int32_t inter, ddt_qformat format,
                                     ddt_dtype dtype, float amp, uint64_t seed, ddt_cuda_moe_layer *out,
                                     ddt_error *err);

/* Pack every expert for the tensor cores (ddt_cuda_qweight_pack; the row-major
 * copies stay) and set the layer's mode to DDT_CUDA_MM_TENSOR.  At load: it
 * allocates and synchronises.  A layer the tensor cores do not take (F32 / F16,
 * other FP8 blocks) keeps the FP32 path in that mode. */
ddt_status ddt_cuda_moe_layer_pack(ddt_cuda_moe_layer *m, ddt_error *err);

/* Workspace bytes for up to max_tokens tokens with top_k experts each. */
size_t ddt_cuda_moe_workspace_bytes(const ddt_cuda_moe_layer *m, int32_t max_tokens, int32_t top_k);

/* out[t] = sum over the token's top_k experts e held by the layer (increasing e) of
 * w[t][k] * down_e(silu(gate_e x[t]) * up_e x[t]).  x [n][hidden] (row stride ldx),
 * idx / w [n][top_k] from ddt_cuda_moe_route, out [n][hidden] (row stride ldo).
 * n <= max_tokens of the workspace (and <= 65535).  Everything stays on the device: no
 * host sync.  An expert index outside 0..n_experts-1 makes its token's row NaN. */
ddt_status ddt_cuda_moe_experts(const ddt_cuda_moe_layer *m, const float *x, int64_t ldx, int32_t n,
                                const int32_t *idx, const float *w, int32_t top_k, float *out, int64_t ldo,
                                void *workspace, size_t workspace_bytes, ddt_cuda_stream stream,
                                ddt_error *err);

/* One MoE layer's routed part with the launches around it fused (issue 13).
 *
 * Routing: with route set, the router runs here on logits (ddt_cuda_moe_route's
 * arithmetic, the same device function: the same bits) and writes idx / w (the
 * caller's buffers, for probes); for n <= 64 tokens and a router of at most 512
 * experts it runs inside the experts' sort block, one launch less.  route->top_k
 * must equal top_k and route->n_experts the layer's total_experts.  Without route,
 * idx / w are the inputs, as for ddt_cuda_moe_experts.
 *
 * Result: without norm_w, out = the routed sum, as ddt_cuda_moe_experts.  With
 * norm_w, the layer's end runs in the combine's launch: for each token t
 *     r[t] = shared[t] + routed[t]  (routed[t] alone when shared is NULL)
 *     resid[t] = resid[t] + r[t]    (stored)
 *     out[t] = rmsnorm(resid[t]) * norm_w   (ddt_cuda_add_rmsnorm's arithmetic)
 * bitwise what ddt_cuda_moe_experts into a buffer, ddt_cuda_add(shared, buffer)
 * (or a copy of the buffer without shared) and ddt_cuda_add_rmsnorm(resid, shared)
 * store, when the buffer's rows would be 16-byte aligned with a stride a multiple
 * of 4 like shared's (ddt_cuda_add_rmsnorm's alignment condition).  out may be x
 * (read by earlier launches only) but not resid or shared.
 *
 * Shared expert's down projection (issue 13: one launch less per MoE layer): with
 * shared_down set, the routed experts' down launch also computes
 *     shared_y[t] = shared_down(shared_x[t])   for every token t < n
 * as more blocks of the same grid, each element by the same device function and
 * order as ddt_cuda_matmul (qmatmul_dev.cuh's warp_dot: an element's order depends
 * on the weight's columns only), so shared_y is bitwise that product's output.
 * The combine runs after that launch, so shared may be shared_y (the fused end
 * then adds it).  Only where ddt_cuda_moe_shared_down_ok(m, shared_down) holds
 * (else DDT_ERR_UNSUPPORTED).  shared_y must not overlap shared_x, resid, out
 * or the workspace. */
typedef struct ddt_cuda_moe_args {
    const float *x; int64_t ldx;            /* [n][hidden] the experts' input */
    int32_t n, top_k;                       /* n <= the workspace's max_tokens (and <= 65535) */
    const ddt_moe_route_params *route;      /* NULL: idx / w are given */
    const float *logits; int64_t ld_logits; /* [n][route->n_experts] with route */
    int32_t *idx; float *w;                 /* [n][top_k] written (route) or read */
    float *out; int64_t ldo;                /* [n][hidden] */
    float *resid; int64_t ld_resid;         /* [n][hidden] with norm_w */
    const float *shared; int64_t ld_shared; /* [n][hidden] with norm_w, or NULL */
    const float *norm_w; float eps;         /* [hidden], or NULL: no fused end */
    void *workspace; size_t workspace_bytes;
    const ddt_qweight *shared_down;         /* device weight [hidden][s_inter], or NULL: no shared down here */
    const float *shared_x; int64_t ld_shared_x; /* [n][s_inter] its input, silu(gate) * up */
    float *shared_y; int64_t ld_shared_y;   /* [n][hidden] its output */
    ddt_cuda_split_planes norm_split;       /* with norm_w: out's split planes for the next product too
                                               (ddt_cuda_add_rmsnorm_split's sp; hi NULL: none) */
    void *join;                             /* a cudaEvent_t the stream waits on before the combine
                                               launch (a side branch that writes `shared`), or NULL */
} ddt_cuda_moe_args;

ddt_status ddt_cuda_moe_run(const ddt_cuda_moe_layer *m, const ddt_cuda_moe_args *a, ddt_cuda_stream stream,
                            ddt_error *err);

/* Can ddt_cuda_moe_run take `down` (a device weight, a shared expert's down
 * projection) as its shared_down?  The layer's experts must run the FP32 path
 * (mode DDT_CUDA_MM_FP32), down must have hidden rows and be a weight
 * ddt_cuda_matmul takes, in the experts' format (F32, BF16, F16, FP8 blocks, INT4
 * groups), or BF16 beside INT4 experts (Kimi K2's layout): the pairs the down
 * kernel is instantiated for.  A property of the weights only (never of n), so a
 * caller decides once at load. */
bool ddt_cuda_moe_shared_down_ok(const ddt_cuda_moe_layer *m, const ddt_qweight *down);

/* For benchmarks: the tensor-core path's work items hold at most 8*nt tokens (nt 1, 2
 * or 4; 0 = the default choice by n).  Process-wide; results do not change, only speed. */
void ddt_cuda_moe_set_item_ntiles(int nt);

#ifdef __cplusplus
}
#endif
#endif
