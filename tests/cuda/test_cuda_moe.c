/*
 * test_cuda_moe.c — the GPU MoE (moe_cuda.h) against the CPU:
 *   - router vs ddt_cpu_moe_route: expert indices identical, weights within 1e-6,
 *     with and without group limits, with bias, and on logits full of exact ties;
 *   - routed experts (bf16, FP8 block 128, INT4 group 32; odd widths where the
 *     format allows) vs their CPU twin ddt_cpu_moe_experts (backend/cpu/moe.h:
 *     the same sum in increasing expert index) through the backend-op harness
 *     (backend_ops.h): normalised error < 1e-5;
 *   - the same on the tensor cores (layer mode DDT_CUDA_MM_TENSOR): normalised
 *     error < 5e-5 (the bound of test_cuda_qmatmul.c: exact weights, x as two
 *     bf16 halves, about 4e-6 per product; the down projection adds the error of
 *     h, so the bound is shared, not tightened), and bit for bit the expert
 *     kernels from before x and h were split once per launch (kept verbatim in
 *     test_cuda_moe_ref.cu / wstream_ref.cuh; odd inter: h's zero padding);
 *     INT4 and FP8 of whole 32-column units, on wgmma since (wgmma_experts.cuh),
 *     within 5e-5 of those kernels;
 *   - each token's output bit-identical alone and inside batches of 1, 5, 12, 33
 *     (experts with more tokens than a work item holds are split, and on the
 *     tensor cores experts with more than 16 go to the second item class: both
 *     checked too);
 *   - output padding (NaN poison) untouched; workspace poisoned before use;
 *   - a bad expert index: a NaN row for that token on both backends, the other
 *     tokens as the CPU's;
 *   - two calls on one workspace in a graph with programmatic edges, replayed:
 *     bitwise the eager calls (the wgmma down launch starts by flags), and the
 *     products-only conversion takes exactly the wgmma down launches' edges.
 * Usage: test_cuda_moe [--quick] [--racecheck]   (--racecheck: the tensor-core experts'
 * cases that launch no thread-block cluster, without the router's, the FP32 mode's and the
 * fused end's: compute-sanitizer racecheck stops with an internal error ("failed to handle
 * a hardware exception") at the test's first cluster launch, the fused end's combine over 2
 * CTAs, whichever kernels it instruments, where memcheck and the plain run pass)
 * Needs the CPU backend: link with src/core, src/io, src/backend/cpu.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/moe.h"
#include "backend/cpu/nn.h"
#include "backend/cpu/qmatmul.h"
#include "backend/cuda/graph_cuda.h"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/nn_cuda.h"
#include "backend_ops.h"
#include "cuda_test.h"

/* the tensor-core experts before the split (test_cuda_moe_ref.cu): idx, w on the host; a cudaError_t */
int ref_old_moe_tc(const ddt_cuda_moe_layer *m, const float *x, int64_t ldx, int32_t n, const int32_t *idx,
                   const float *w, int32_t K, float *out, int64_t ldo);

static uint64_t g_rng = 0xD1B54A32D192ED03ull;
static uint32_t rnd(void) { return ct_xorshift(&g_rng, 16); }
static float frand(void) { return (float)(rnd() & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f; }


static ddt_cpu_pool *g_pool;

/* ------------------------------------------------------------------ router */

static void route_case(int E, int top_k, int G, int keep, int n, int ties, int with_bias, int norm) {
    float *lg = malloc(sizeof(float) * (size_t)n * E), *bias = malloc(sizeof(float) * (size_t)E);
    for (int i = 0; i < n * E; i++) lg[i] = ties ? (float)((int)(rnd() % 5) - 2) * 0.5f : 4.0f * frand();
    for (int e = 0; e < E; e++) bias[e] = ties ? 0.25f * (float)(rnd() % 3) : 0.1f * frand();
    int32_t *iref = malloc(sizeof(int32_t) * (size_t)n * top_k), *igot = malloc(sizeof(int32_t) * (size_t)n * top_k);
    float *wref = malloc(sizeof(float) * (size_t)n * top_k), *wgot = malloc(sizeof(float) * (size_t)n * top_k);
    ddt_moe_route_params cp = {E, top_k, G, keep, norm != 0, 2.5f, with_bias ? bias : NULL};
    ddt_cpu_moe_route(lg, E, n, &cp, iref, wref);
    float *dlg, *dbias, *dw;
    int32_t *didx;
    CU(cudaMalloc((void **)&dlg, sizeof(float) * (size_t)n * E));
    CU(cudaMalloc((void **)&dbias, sizeof(float) * (size_t)E));
    CU(cudaMalloc((void **)&didx, sizeof(int32_t) * (size_t)n * top_k));
    CU(cudaMalloc((void **)&dw, sizeof(float) * (size_t)n * top_k));
    CU(cudaMemcpy(dlg, lg, sizeof(float) * (size_t)n * E, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dbias, bias, sizeof(float) * (size_t)E, cudaMemcpyHostToDevice));
    ddt_moe_route_params gp = {E, top_k, G, keep, norm != 0, 2.5f, with_bias ? dbias : NULL}; /* the same struct */
    OK(ddt_cuda_moe_route(dlg, E, n, &gp, didx, dw, NULL, &err_));
    CU(cudaMemcpy(igot, didx, sizeof(int32_t) * (size_t)n * top_k, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(wgot, dw, sizeof(float) * (size_t)n * top_k, cudaMemcpyDeviceToHost));
    int bad_i = 0;
    double maxw = 0;
    for (int i = 0; i < n * top_k; i++) {
        bad_i += iref[i] != igot[i];
        double d = fabs((double)wref[i] - wgot[i]) / (fabs((double)wref[i]) > 1 ? fabs((double)wref[i]) : 1.0);
        if (d > maxw) maxw = d;
    }
    CHECK(bad_i == 0, "route E=%d k=%d G=%d keep=%d n=%d ties=%d: %d indices differ", E, top_k, G, keep, n, ties, bad_i);
    CHECK(maxw < 1e-6, "route E=%d k=%d G=%d n=%d ties=%d: weight error %.3g", E, top_k, G, n, ties, maxw);
    printf("route E=%3d top%-2d groups %d keep %d n=%2d ties %d bias %d norm %d: idx %s, max w err %.2e\n", E, top_k, G,
           keep, n, ties, with_bias, norm, bad_i ? "DIFFER" : "equal", maxw);
    CU(cudaFree(dlg));
    CU(cudaFree(dbias));
    CU(cudaFree(didx));
    CU(cudaFree(dw));
    free(lg);
    free(bias);
    free(iref);
    free(igot);
    free(wref);
    free(wgot);
}

/* ------------------------------------------------------------------ route + sort */

/* ddt_cuda_moe_run with a router (one block routes and sorts for n <= 64 and at
 * most 512 experts; else the two launches) against ddt_cuda_moe_route then
 * ddt_cuda_moe_experts: idx, w and the routed sum bitwise, on a small random layer
 * of E experts (most of them with zero tokens); idx / w / out poisoned first. */
static void route_sort_case(int E, int top_k, int G, int keep, int n, int ties, int with_bias) {
    const int H = 68, I = 32;
    ddt_cuda_moe_layer layer;
    OK(ddt_cuda_moe_layer_random(E, H, I, DDT_Q_DENSE, DDT_DTYPE_BF16, 0.2f, 77u + (uint64_t)E, &layer, &err_));
    float *lg = malloc(sizeof(float) * (size_t)n * E), *bias = malloc(sizeof(float) * (size_t)E);
    for (int i = 0; i < n * E; i++) lg[i] = ties ? (float)((int)(rnd() % 5) - 2) * 0.5f : 4.0f * frand();
    for (int e = 0; e < E; e++) bias[e] = ties ? 0.25f * (float)(rnd() % 3) : 0.1f * frand();
    float *x = malloc(sizeof(float) * (size_t)n * H);
    for (int i = 0; i < n * H; i++) x[i] = frand();
    const size_t nk = (size_t)n * top_k, wsb = ddt_cuda_moe_workspace_bytes(&layer, n, top_k);
    float *dlg, *dbias, *dx, *dw[2], *dout[2];
    int32_t *didx[2];
    void *dws;
    CU(cudaMalloc((void **)&dlg, sizeof(float) * (size_t)n * E));
    CU(cudaMalloc((void **)&dbias, sizeof(float) * (size_t)E));
    CU(cudaMalloc((void **)&dx, sizeof(float) * (size_t)n * H));
    for (int k = 0; k < 2; k++) {
        CU(cudaMalloc((void **)&dw[k], sizeof(float) * nk));
        CU(cudaMalloc((void **)&didx[k], sizeof(int32_t) * nk));
        CU(cudaMalloc((void **)&dout[k], sizeof(float) * (size_t)n * H));
        bo_poison(dw[k], sizeof(float) * nk);
        bo_poison(didx[k], sizeof(int32_t) * nk);
        bo_poison(dout[k], sizeof(float) * (size_t)n * H);
    }
    CU(cudaMalloc(&dws, wsb));
    CU(cudaMemcpy(dlg, lg, sizeof(float) * (size_t)n * E, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dbias, bias, sizeof(float) * (size_t)E, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dx, x, sizeof(float) * (size_t)n * H, cudaMemcpyHostToDevice));
    const ddt_moe_route_params rp = {E, top_k, G, keep, true, 2.5f, with_bias ? dbias : NULL};
    /* the launches it replaces */
    bo_poison(dws, wsb);
    OK(ddt_cuda_moe_route(dlg, E, n, &rp, didx[0], dw[0], NULL, &err_));
    OK(ddt_cuda_moe_experts(&layer, dx, H, n, didx[0], dw[0], top_k, dout[0], H, dws, wsb, NULL, &err_));
    /* fused */
    bo_poison(dws, wsb);
    const ddt_cuda_moe_args a = {.x = dx, .ldx = H, .n = n, .top_k = top_k, .route = &rp, .logits = dlg,
                                 .ld_logits = E, .idx = didx[1], .w = dw[1], .out = dout[1], .ldo = H,
                                 .workspace = dws, .workspace_bytes = wsb};
    OK(ddt_cuda_moe_run(&layer, &a, NULL, &err_));
    CU(cudaDeviceSynchronize());
    int32_t *ih[2];
    float *wh[2], *oh[2];
    for (int k = 0; k < 2; k++) {
        ih[k] = malloc(sizeof(int32_t) * nk), wh[k] = malloc(sizeof(float) * nk);
        oh[k] = malloc(sizeof(float) * (size_t)n * H);
        CU(cudaMemcpy(ih[k], didx[k], sizeof(int32_t) * nk, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(wh[k], dw[k], sizeof(float) * nk, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(oh[k], dout[k], sizeof(float) * (size_t)n * H, cudaMemcpyDeviceToHost));
    }
    char what[96];
    snprintf(what, sizeof what, "route+sort E=%d top%d G=%d keep %d n=%d ties %d", E, top_k, G, keep, n, ties);
    CHECK(memcmp(ih[0], ih[1], sizeof(int32_t) * nk) == 0, "%s: indices differ", what);
    bo_compare(what, wh[1], wh[0], nk, (bo_cmp){.bitwise = true});
    bo_compare(what, oh[1], oh[0], (size_t)n * H, (bo_cmp){.bitwise = true});
    printf("%s%s: idx, w, out bitwise the two launches'\n", what,
           n <= 64 && E <= 512 ? " (one block)" : " (route, sort)");
    for (int k = 0; k < 2; k++) {
        CU(cudaFree(dw[k]));
        CU(cudaFree(didx[k]));
        CU(cudaFree(dout[k]));
        free(ih[k]), free(wh[k]), free(oh[k]);
    }
    CU(cudaFree(dlg));
    CU(cudaFree(dbias));
    CU(cudaFree(dx));
    CU(cudaFree(dws));
    ddt_cuda_moe_layer_free(&layer);
    free(lg), free(bias), free(x);
}

/* ------------------------------------------------------------------ fused end */

/* bf16 of f, round to nearest even (__float2bfloat16_rn; NaN stays NaN) */
static uint16_t bf16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf16_f(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/*
 * The MoE layer's end in the combine (ddt_cuda_moe_run with norm_w) against the
 * launches it replaces: ddt_cuda_moe_experts into acc, ddt_cuda_add(shared, acc)
 * (a copy of acc without a shared expert), ddt_cuda_add_rmsnorm(resid, shared):
 * the updated residual and the normed output bitwise, the output's padding (NaN
 * poison) untouched.  ld_resid a multiple of 4: the norm's register path; odd:
 * the strided one (both sides take the same).  Then against the CPU twins
 * (ddt_cpu_moe_experts, ddt_cpu_add twice, ddt_cpu_rmsnorm) within tol.  Device
 * inputs: dx [n][H], didx / dw [n][K]; host copies x, idx, wt for the CPU.  With
 * H a multiple of 8 the fused run also writes the output's split planes for a
 * tensor-core product (norm_split): each element's bf16 hi and lo, as the product's
 * split pass would compute them from the output, checked here on the host.
 */
/* --racecheck: no case that launches a thread-block cluster (the top says why) */
static int g_racecheck = 0;

static void fused_end_check(const ddt_cuda_moe_layer *layer, const ddt_cpu_moe_layer *cpu_layer, const float *dx,
                            const float *x, const int32_t *didx, const int32_t *idx, const float *dw, const float *wt,
                            int n, int K, int with_shared, int64_t ldr, void *dws, size_t wsb, double tol,
                            const char *name) {
    if (g_racecheck) return;
    const int H = layer->hidden;
    const int64_t ldo = H + 4; /* 4 poisoned floats a row */
    const size_t nr = (size_t)n * (size_t)ldr, no = (size_t)n * (size_t)ldo, nh = (size_t)n * H;
    float *resid = malloc(sizeof(float) * nr), *sh = malloc(sizeof(float) * nh), *nw = malloc(sizeof(float) * H);
    for (size_t i = 0; i < nr; i++) resid[i] = 2.0f * frand();
    for (size_t i = 0; i < nh; i++) sh[i] = 0.5f * frand();
    for (int i = 0; i < H; i++) nw[i] = 1.0f + 0.5f * frand();
    const float eps = 1e-6f;
    float *d_resid[2], *d_out[2], *d_sh, *d_tmp, *d_acc, *d_nw;
    for (int k = 0; k < 2; k++) {
        CU(cudaMalloc((void **)&d_resid[k], sizeof(float) * nr));
        CU(cudaMalloc((void **)&d_out[k], sizeof(float) * no));
        CU(cudaMemcpy(d_resid[k], resid, sizeof(float) * nr, cudaMemcpyHostToDevice));
        bo_poison(d_out[k], sizeof(float) * no);
    }
    CU(cudaMalloc((void **)&d_sh, sizeof(float) * nh));
    CU(cudaMalloc((void **)&d_tmp, sizeof(float) * nh));
    CU(cudaMalloc((void **)&d_acc, sizeof(float) * nh));
    CU(cudaMalloc((void **)&d_nw, sizeof(float) * H));
    CU(cudaMemcpy(d_sh, sh, sizeof(float) * nh, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_nw, nw, sizeof(float) * H, cudaMemcpyHostToDevice));
    /* the launches it replaces (the target's forward before issue 13) */
    OK(ddt_cuda_moe_experts(layer, dx, H, n, didx, dw, K, d_acc, H, dws, wsb, NULL, &err_));
    if (with_shared) {
        CU(cudaMemcpy(d_tmp, d_sh, sizeof(float) * nh, cudaMemcpyDeviceToDevice));
        OK(ddt_cuda_add(d_tmp, d_acc, (int64_t)nh, NULL, &err_));
    } else {
        CU(cudaMemcpy(d_tmp, d_acc, sizeof(float) * nh, cudaMemcpyDeviceToDevice));
    }
    OK(ddt_cuda_add_rmsnorm(d_resid[0], ldr, d_tmp, H, n, H, d_nw, eps, d_out[0], ldo, NULL, &err_));
    /* fused (the workspace poisoned again: nothing may be left from the first run) */
    CU(cudaMemset(dws, 0xFF, wsb));
    ddt_cuda_moe_args a = {.x = dx, .ldx = H, .n = n, .top_k = K, .idx = (int32_t *)didx, .w = (float *)dw,
                           .out = d_out[1], .ldo = ldo, .resid = d_resid[1], .ld_resid = ldr,
                           .shared = with_shared ? d_sh : NULL, .ld_shared = H, .norm_w = d_nw, .eps = eps,
                           .workspace = dws, .workspace_bytes = wsb};
    const bool planes = H % 8 == 0;
    uint16_t *d_planes = NULL;
    if (planes) {
        CU(cudaMalloc((void **)&d_planes, sizeof(uint16_t) * 2 * nh));
        CU(cudaMemset(d_planes, 0xFF, sizeof(uint16_t) * 2 * nh));
        a.norm_split = (ddt_cuda_split_planes){d_planes, d_planes + nh, H};
    }
    OK(ddt_cuda_moe_run(layer, &a, NULL, &err_));
    CU(cudaDeviceSynchronize());
    float *g_resid[2], *g_out[2];
    for (int k = 0; k < 2; k++) {
        g_resid[k] = malloc(sizeof(float) * nr), g_out[k] = malloc(sizeof(float) * no);
        CU(cudaMemcpy(g_resid[k], d_resid[k], sizeof(float) * nr, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(g_out[k], d_out[k], sizeof(float) * no, cudaMemcpyDeviceToHost));
    }
    char what[128];
    snprintf(what, sizeof what, "fused end %s n=%d shared %d ld_resid %lld", name, n, with_shared, (long long)ldr);
    int bad_pad = 0;
    for (int t = 0; t < n; t++)
        for (int64_t d = H; d < ldo; d++) bad_pad += memcmp(&g_out[1][t * ldo + d], &(uint32_t){0xFFFFFFFFu}, 4) != 0;
    CHECK(bad_pad == 0, "%s: %d padding floats written", what, bad_pad);
    CHECK(memcmp(g_resid[1], g_resid[0], sizeof(float) * nr) == 0, "%s: residual not bitwise the launches'", what);
    CHECK(memcmp(g_out[1], g_out[0], sizeof(float) * no) == 0, "%s: output not bitwise the launches'", what);
    if (planes) {
        uint16_t *hp = malloc(sizeof(uint16_t) * 2 * nh);
        CU(cudaMemcpy(hp, d_planes, sizeof(uint16_t) * 2 * nh, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int t = 0; t < n; t++)
            for (int d = 0; d < H; d++) {
                const float v = g_out[0][t * ldo + d];
                const uint16_t gh = hp[(size_t)t * H + d], gl = hp[nh + (size_t)t * H + d];
                if (isnan(v)) { /* a bad token's row: any NaN (the device's is canonical) */
                    bad += !isnan(bf16_f(gh)) || !isnan(bf16_f(gl));
                    continue;
                }
                const uint16_t h = bf16_rn(v), l = bf16_rn(v - bf16_f(h));
                bad += gh != h || gl != l;
            }
        CHECK(bad == 0, "%s: %d split-plane elements are not the output's bf16 hi / lo", what, bad);
        free(hp);
        CU(cudaFree(d_planes));
    }
    /* the CPU twins: routed sum, + shared, residual add, norm */
    float *c_acc = malloc(sizeof(float) * nh), *c_out = malloc(sizeof(float) * no);
    void *cws = malloc(ddt_cpu_moe_workspace_bytes(cpu_layer, n, K));
    ddt_cpu_moe_experts(g_pool, cpu_layer, x, H, n, idx, wt, K, c_acc, H, cws);
    if (with_shared) ddt_cpu_add(sh, c_acc, (int64_t)nh); /* sh + acc, as the GPU */
    else memcpy(sh, c_acc, sizeof(float) * nh);
    for (int t = 0; t < n; t++) ddt_cpu_add(resid + t * ldr, sh + (size_t)t * H, H);
    const ddt_cpu_vec wv = {nw, DDT_DTYPE_F32, H};
    ct_poison(c_out, no);
    ddt_cpu_rmsnorm(g_pool, resid, ldr, n, H, &wv, eps, c_out, ldo);
    const double e = bo_compare(what, g_out[1], c_out, no, (bo_cmp){.bound = tol});
    printf("%s: bitwise the launches', CPU err %.2e\n", what, e);
    for (int k = 0; k < 2; k++) {
        CU(cudaFree(d_resid[k]));
        CU(cudaFree(d_out[k]));
        free(g_resid[k]), free(g_out[k]);
    }
    CU(cudaFree(d_sh));
    CU(cudaFree(d_tmp));
    CU(cudaFree(d_acc));
    CU(cudaFree(d_nw));
    free(resid), free(sh), free(nw), free(c_acc), free(c_out), free(cws);
}

/* ------------------------------------------------------------------ experts */

typedef struct hexp {
    ddt_qweight w[3]; /* gate, up, down */
    void *buf[6];
} hexp;

static ddt_qweight make_w(int f, int64_t rows, int64_t cols, void **data, void **scale) {
    ddt_qweight w;
    memset(&w, 0, sizeof w);
    w.rows = rows, w.cols = cols, w.block = DDT_FP8_BLOCK, w.group = DDT_INT4_GROUP;
    size_t n = (size_t)rows * cols;
    *scale = NULL;
    if (f == 0) {
        w.format = DDT_Q_DENSE, w.dtype = DDT_DTYPE_BF16;
        uint16_t *d = malloc(n * 2);
        for (size_t i = 0; i < n; i++) d[i] = ddt_f32_to_bf16(0.2f * frand());
        *data = d;
    } else if (f == 1) {
        w.format = DDT_Q_FP8_BLOCK, w.dtype = DDT_DTYPE_F8_E4M3;
        uint8_t *d = malloc(n);
        for (size_t i = 0; i < n; i++) {
            uint8_t b = (uint8_t)rnd();
            if ((b & 0x7Fu) == 0x7Fu) b ^= 1u;
            d[i] = b;
        }
        int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
        float *s = malloc((size_t)(sr * sc) * 4);
        for (int64_t i = 0; i < sr * sc; i++) s[i] = 0.002f * (1.5f + frand());
        *data = d;
        *scale = s;
        w.scale_inv = s;
    } else {
        w.format = DDT_Q_INT4_GROUP, w.dtype = DDT_DTYPE_I32;
        int64_t words = (cols + 7) / 8, groups = (cols + 31) / 32;
        uint32_t *d = malloc((size_t)(rows * words) * 4);
        for (int64_t i = 0; i < rows * words; i++) d[i] = rnd() ^ (rnd() << 16);
        uint16_t *s = malloc((size_t)(rows * groups) * 2);
        for (int64_t i = 0; i < rows * groups; i++) s[i] = ddt_f32_to_bf16(0.03f * (1.5f + frand()));
        *data = d;
        *scale = s;
        w.scale = s;
    }
    w.data = *data;
    return w;
}

static const char *fname(int f) { return f == 0 ? "bf16" : f == 1 ? "FP8" : "INT4"; }

/* Two experts calls of one layer on one workspace (tokens 0..n-1, then 1..n-1 into another
 * buffer) captured into a graph whose kernel edges are all programmatic (the engine's round),
 * launched three times: both outputs bitwise the eager calls' each time, over NaN-poisoned
 * outputs.  On wgmma (wx) the down launch starts by flags (wgmma_experts.cuh) as soon as its
 * blocks are resident: a second call's down must not take the first call's flags, and a
 * replay must not take the previous replay's.  Then the products-only conversion (the
 * engine's ar step) must make exactly the edge into each wgmma down launch programmatic
 * (ddt_cuda_kernel_waits_late), none on the other paths. */
static void pdl_graph_check(const ddt_cuda_moe_layer *layer, const float *dx, const int32_t *didx, const float *dw,
                            int n, int K, int H, int64_t ldo, void *dws, size_t wsb, bool wx, const char *what) {
    const int nb = n > 1 ? n - 1 : 1;
    const size_t bytes_a = sizeof(float) * (size_t)n * ldo, bytes_b = sizeof(float) * (size_t)nb * ldo;
    float *da, *db, *wa = malloc(bytes_a), *wb = malloc(bytes_b), *ga = malloc(bytes_a), *gb = malloc(bytes_b);
    CU(cudaMalloc((void **)&da, bytes_a));
    CU(cudaMalloc((void **)&db, bytes_b));
    const float *xb = n > 1 ? dx + H : dx;
    const int32_t *ib = n > 1 ? didx + K : didx;
    const float *wtb = n > 1 ? dw + K : dw;
    bo_poison(da, bytes_a);
    bo_poison(db, bytes_b);
    OK(ddt_cuda_moe_experts(layer, dx, H, n, didx, dw, K, da, ldo, dws, wsb, NULL, &err_));
    OK(ddt_cuda_moe_experts(layer, xb, H, nb, ib, wtb, K, db, ldo, dws, wsb, NULL, &err_));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(wa, da, bytes_a, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(wb, db, bytes_b, cudaMemcpyDeviceToHost));
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int products = 0; products < 2; products++) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        OK(ddt_cuda_moe_experts(layer, dx, H, n, didx, dw, K, da, ldo, dws, wsb, s, &err_));
        OK(ddt_cuda_moe_experts(layer, xb, H, nb, ib, wtb, K, db, ldo, dws, wsb, s, &err_));
        CU(cudaStreamEndCapture(s, &g));
        int32_t conv = 0;
        OK(ddt_cuda_graph_programmatic(g, products != 0, &conv, &err_));
        if (products)
            CHECK(conv == (wx ? 2 : 0), "%s n=%d: %d edges made programmatic into the products, want %d", what, n,
                  (int)conv, wx ? 2 : 0);
        else
            CHECK(conv >= 6, "%s n=%d: only %d edges made programmatic", what, n, (int)conv);
        CU(cudaGraphInstantiate(&ge, g, 0));
        int bad = 0;
        for (int r = 0; r < 3; r++) {
            bo_poison(da, bytes_a);
            bo_poison(db, bytes_b);
            CU(cudaGraphLaunch(ge, s));
            CU(cudaStreamSynchronize(s));
            CU(cudaMemcpy(ga, da, bytes_a, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(gb, db, bytes_b, cudaMemcpyDeviceToHost));
            for (int t = 0; t < n; t++) bad += memcmp(ga + t * ldo, wa + t * ldo, sizeof(float) * (size_t)H) != 0;
            for (int t = 0; t < nb; t++) bad += memcmp(gb + t * ldo, wb + t * ldo, sizeof(float) * (size_t)H) != 0;
        }
        CHECK(bad == 0, "%s n=%d: %d token rows of the programmatic graph's %s differ from the eager calls", what, n,
              bad, products ? "products-only edges" : "edges");
        CU(cudaGraphExecDestroy(ge));
        CU(cudaGraphDestroy(g));
    }
    printf("%s n=%2d: two calls in a graph with programmatic edges, 3 replays == eager: %s\n", what, n,
           g_failures ? "see above" : "yes");
    CU(cudaStreamDestroy(s));
    CU(cudaFree(da));
    CU(cudaFree(db));
    free(wa);
    free(wb);
    free(ga);
    free(gb);
}

static void experts_case(int f, int E, int H, int I, int K, ddt_cuda_mm_mode mode) {
    if (g_racecheck && H >= 4096) return; /* gate/up's k-split is a cluster (wx_ksplit) */
    const char *mname = mode == DDT_CUDA_MM_TENSOR ? " TC" : "";
    const double tol = mode == DDT_CUDA_MM_TENSOR ? 5e-5 : 1e-5;
    hexp *ex = calloc((size_t)E, sizeof(hexp));
    ddt_qweight *gw = malloc(sizeof(ddt_qweight) * (size_t)E * 3);
    ddt_cpu_mlp *cw = malloc(sizeof(ddt_cpu_mlp) * (size_t)E);
    for (int e = 0; e < E; e++) {
        ex[e].w[0] = make_w(f, I, H, &ex[e].buf[0], &ex[e].buf[1]);
        ex[e].w[1] = make_w(f, I, H, &ex[e].buf[2], &ex[e].buf[3]);
        ex[e].w[2] = make_w(f, H, I, &ex[e].buf[4], &ex[e].buf[5]);
        gw[e] = ex[e].w[0], gw[E + e] = ex[e].w[1], gw[2 * E + e] = ex[e].w[2];
        cw[e] = (ddt_cpu_mlp){.gate = ex[e].w[0], .up = ex[e].w[1], .down = ex[e].w[2]};
    }
    const ddt_cpu_moe_layer cpu_layer = {.n_experts = E, .hidden = H, .inter = I, .experts = cw};
    ddt_cuda_moe_layer layer;
    OK(ddt_cuda_moe_layer_upload(gw, gw + E, gw + 2 * E, E, &layer, &err_));
    CHECK(layer.mode == DDT_CUDA_MM_FP32, "upload: mode %d, not FP32", (int)layer.mode);
    if (mode == DDT_CUDA_MM_TENSOR) {
        /* unpacked, the tensor mode is refused; packed, it runs */
        layer.mode = DDT_CUDA_MM_TENSOR;
        ddt_error e2;
        ddt_status st = ddt_cuda_moe_experts(&layer, NULL, H, 1, NULL, NULL, K, NULL, H, NULL, 0, NULL, &e2);
        CHECK(st == DDT_ERR_INVALID, "experts %s: tensor mode call with missing arguments: status %d", fname(f), (int)st);
        OK(ddt_cuda_moe_layer_pack(&layer, &err_));
        CHECK(layer.mode == DDT_CUDA_MM_TENSOR, "pack: mode %d", (int)layer.mode);
    }
    const int maxn = 33;
    size_t wsb = ddt_cuda_moe_workspace_bytes(&layer, maxn, K);
    void *dws;
    CU(cudaMalloc(&dws, wsb));
    void *cws = malloc(ddt_cpu_moe_workspace_bytes(&cpu_layer, maxn, K));
    const int64_t ldo = H + 3;
    float *x = malloc(sizeof(float) * (size_t)maxn * H);
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)maxn * K);
    float *wt = malloc(sizeof(float) * (size_t)maxn * K);
    float *ref = malloc(sizeof(float) * (size_t)maxn * ldo), *got = malloc(sizeof(float) * (size_t)maxn * ldo);
    float *one = malloc(sizeof(float) * (size_t)ldo);
    float *dx, *dout, *dw, *dout1;
    int32_t *didx;
    CU(cudaMalloc((void **)&dx, sizeof(float) * (size_t)maxn * H));
    CU(cudaMalloc((void **)&dout, sizeof(float) * (size_t)maxn * ldo));
    CU(cudaMalloc((void **)&dout1, sizeof(float) * (size_t)ldo));
    CU(cudaMalloc((void **)&dw, sizeof(float) * (size_t)maxn * K));
    CU(cudaMalloc((void **)&didx, sizeof(int32_t) * (size_t)maxn * K));
    /* tensor path: n = 12 splits experts over several items of 8; n = 33 sends the
       experts with more than 16 entries to the 4-tile kernel's items of 32 */
    static const int ns[] = {1, 5, 12, 33};
    for (int ni = 0; ni < 4; ni++) {
        const int n = ns[ni];
        for (int i = 0; i < n * H; i++) x[i] = frand();
        /* distinct experts per token, in a random order, with random weights;
           the first token's experts are reused by others so experts get several tokens */
        for (int t = 0; t < n; t++) {
            for (int k = 0; k < K; k++) {
                int e, dup, share = t % 3 == 1 && k < 2;
                do {
                    e = share ? idx[k] : (int)(rnd() % (uint32_t)E);
                    share = 0;
                    dup = 0;
                    for (int j = 0; j < k; j++) dup |= idx[t * K + j] == e;
                } while (dup);
                idx[t * K + k] = e;
                wt[t * K + k] = 0.5f + 0.5f * frand();
            }
        }
        ct_poison(ref, (size_t)n * ldo); /* the CPU writes hidden floats per row: its padding stays NaN */
        ddt_cpu_moe_experts(g_pool, &cpu_layer, x, H, n, idx, wt, K, ref, ldo, cws);
        CU(cudaMemcpy(dx, x, sizeof(float) * (size_t)n * H, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(didx, idx, sizeof(int32_t) * (size_t)n * K, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dw, wt, sizeof(float) * (size_t)n * K, cudaMemcpyHostToDevice));
        ct_poison(got, (size_t)n * ldo);
        CU(cudaMemcpy(dout, got, sizeof(float) * (size_t)n * ldo, cudaMemcpyHostToDevice));
        CU(cudaMemset(dws, 0xFF, wsb)); /* NaN everywhere: any unwritten read shows */
        OK(ddt_cuda_moe_experts(&layer, dx, H, n, didx, dw, K, dout, ldo, dws, wsb, NULL, &err_));
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(got, dout, sizeof(float) * (size_t)n * ldo, cudaMemcpyDeviceToHost));
        char what[96];
        snprintf(what, sizeof what, "experts %s%s E=%d [%d, %d] n=%d", fname(f), mname, E, H, I, n);
        /* padding is NaN on both sides, so the harness skips it: checked bit for bit below */
        double e = bo_compare(what, got, ref, (size_t)n * ldo, (bo_cmp){.bound = tol});
        int bad_pad = 0;
        for (int t = 0; t < n; t++)
            for (int d = H; d < ldo; d++) bad_pad += !ct_is_poison(&got[t * ldo + d]);
        CHECK(!isnan(e), "%s: normalised error is NaN", what);
        CHECK(bad_pad == 0, "experts %s%s n=%d: padding written", fname(f), mname, n);
        int vs_old = 0;
        if (mode == DDT_CUDA_MM_TENSOR) { /* bit for bit the kernels that split x and h in every block */
            float *dref, *oldh = malloc(sizeof(float) * (size_t)n * ldo);
            CU(cudaMalloc((void **)&dref, sizeof(float) * (size_t)n * ldo));
            bo_poison(dref, sizeof(float) * (size_t)n * ldo);
            CU((cudaError_t)ref_old_moe_tc(&layer, dx, H, n, idx, wt, K, dref, ldo));
            CU(cudaMemcpy(oldh, dref, sizeof(float) * (size_t)n * ldo, cudaMemcpyDeviceToHost));
            if (f == 2 || (f == 1 && H % 32 == 0 && I % 32 == 0)) {
                /* INT4, and FP8 of whole units (blocks of 128 here), run on wgmma now
                   (wgmma_experts.cuh): another summation, so within the tensor path's bound of the
                   old kernels, not bitwise */
                double num = 0, den = 0;
                for (int t = 0; t < n; t++)
                    for (int j = 0; j < H; j++) {
                        const double d = (double)got[t * ldo + j] - oldh[t * ldo + j];
                        num += d * d, den += (double)oldh[t * ldo + j] * oldh[t * ldo + j];
                    }
                vs_old = !(sqrt(num / (den > 0 ? den : 1)) < 5e-5);
                CHECK(vs_old == 0, "experts %s TC n=%d: normalised distance to the old kernels %.3g", fname(f), n,
                      sqrt(num / (den > 0 ? den : 1)));
            } else {
                for (int t = 0; t < n; t++)
                    vs_old += memcmp(oldh + t * ldo, got + t * ldo, sizeof(float) * (size_t)H) != 0;
                CHECK(vs_old == 0, "experts %s TC n=%d: %d tokens differ from the old kernels", fname(f), n, vs_old);
            }
            CU(cudaFree(dref));
            free(oldh);
        }
        /* each token alone (from an offset copy of its row) must match bit for bit */
        int mism = 0;
        for (int t = 0; t < n; t++) {
            OK(ddt_cuda_moe_experts(&layer, dx + (size_t)t * H, H, 1, didx + t * K, dw + t * K, K, dout1, ldo, dws, wsb,
                                    NULL, &err_));
            CU(cudaMemcpy(one, dout1, sizeof(float) * (size_t)H, cudaMemcpyDeviceToHost));
            mism += memcmp(one, got + t * ldo, sizeof(float) * (size_t)H) != 0;
        }
        CHECK(mism == 0, "experts %s%s n=%d: %d tokens differ alone vs in the batch", fname(f), mname, n, mism);
        printf("experts %-4s%s E=%d hidden %d inter %d top%d n=%2d: err %.2e, alone==batch %s%s\n", fname(f), mname, E,
               H, I, K, n, e, mism ? "NO" : "yes",
               mode != DDT_CUDA_MM_TENSOR ? "" : vs_old ? ", == old kernels NO" : ", == old kernels yes");
        char name[48];
        snprintf(name, sizeof name, "%s%s E=%d [%d, %d]", fname(f), mname, E, H, I);
        const bool wx = mode == DDT_CUDA_MM_TENSOR && (f == 2 || (f == 1 && H % 32 == 0 && I % 32 == 0));
        pdl_graph_check(&layer, dx, didx, dw, n, K, H, ldo, dws, wsb, wx, name);
        for (int v = 0; v < 4; v++) /* with and without a shared expert; register and strided norm paths */
            fused_end_check(&layer, &cpu_layer, dx, x, didx, idx, dw, wt, n, K, v & 1, v & 2 ? H + 1 : H + 8, dws, wsb,
                            tol, name);
    }
    /* a bad expert index gives a NaN row for that token and leaves the others alone,
       on both backends (dx, dw hold the last batch's first two tokens) */
    {
        int32_t save = idx[K];
        idx[K] = E + 3;
        CU(cudaMemcpy(didx, idx, sizeof(int32_t) * 2 * (size_t)K, cudaMemcpyHostToDevice));
        OK(ddt_cuda_moe_experts(&layer, dx, H, 2, didx, dw, K, dout, ldo, dws, wsb, NULL, &err_));
        CU(cudaMemcpy(got, dout, sizeof(float) * 2 * (size_t)ldo, cudaMemcpyDeviceToHost));
        CHECK(isnan(got[ldo]) && !isnan(got[0]), "experts %s: bad index not flagged", fname(f));
        ct_poison(ref, 2 * (size_t)ldo);
        ddt_cpu_moe_experts(g_pool, &cpu_layer, x, H, 2, idx, wt, K, ref, ldo, cws);
        CHECK(isnan(ref[ldo]) && !isnan(ref[0]), "experts %s: bad index not flagged on the CPU", fname(f));
        char what[64];
        snprintf(what, sizeof what, "experts %s%s bad index, token 0", fname(f), mname);
        bo_compare(what, got, ref, (size_t)H, (bo_cmp){.bound = tol});
        /* the fused end: token 1's rows NaN on both sides, bitwise the launches' */
        fused_end_check(&layer, &cpu_layer, dx, x, didx, idx, dw, wt, 2, K, 1, H, dws, wsb, tol, what);
        idx[K] = save;
    }
    ddt_cuda_moe_layer_free(&layer);
    CU(cudaFree(dws));
    CU(cudaFree(dx));
    CU(cudaFree(dout));
    CU(cudaFree(dout1));
    CU(cudaFree(dw));
    CU(cudaFree(didx));
    for (int e = 0; e < E; e++)
        for (int b = 0; b < 6; b++) free(ex[e].buf[b]);
    free(ex);
    free(gw);
    free(cw);
    free(cws);
    free(x);
    free(idx);
    free(wt);
    free(ref);
    free(got);
    free(one);
}

int main(int argc, char **argv) {
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = 1;
        else if (strcmp(argv[i], "--racecheck") == 0) g_racecheck = 1;
        else {
            fprintf(stderr, "test_cuda_moe: unknown argument '%s' (usage: test_cuda_moe [--quick] [--racecheck])\n",
                    argv[i]);
            return 2;
        }
    }
    OK(ddt_cpu_pool_create(4, &g_pool, &err_));
    static const int ns[] = {1, 5, 33};
    for (int i = 0; i < (g_racecheck ? 0 : 3); i++) {
        route_case(384, 8, 1, 1, ns[i], 0, 1, 1);   /* Kimi K2 */
        route_case(256, 8, 8, 4, ns[i], 0, 1, 1);   /* DeepSeek-V3 groups */
        route_case(64, 6, 8, 3, ns[i], 1, 1, 1);    /* ties everywhere */
        route_case(60, 4, 6, 2, ns[i], 1, 0, 0);    /* ties, no bias, no norm */
        route_case(7, 7, 7, 7, ns[i], 0, 0, 1);     /* one expert per group, all chosen */
        route_case(4096, 16, 16, 5, ns[i], 0, 1, 1); /* the limits */
    }
    static const int rs_ns[] = {1, 5, 33, 64, 65};
    for (int i = 0; i < (g_racecheck ? 0 : 5); i++) {
        route_sort_case(384, 8, 1, 1, rs_ns[i], 0, 1);    /* Kimi K2 */
        route_sort_case(256, 8, 8, 4, rs_ns[i], 0, 1);    /* DeepSeek-V3 groups */
        route_sort_case(64, 6, 8, 3, rs_ns[i], 1, 1);     /* ties everywhere */
        route_sort_case(7, 7, 7, 7, rs_ns[i], 0, 0);      /* one expert per group, all chosen */
        route_sort_case(512, 16, 16, 5, rs_ns[i], 0, 1);  /* the warp router's limits */
        if (!quick || i == 0) route_sort_case(4096, 16, 16, 5, rs_ns[i], 0, 1); /* the block router: never fused */
    }
    for (int mi = g_racecheck; mi < 2; mi++) { /* --racecheck: the tensor-core mode alone */
        const ddt_cuda_mm_mode mode = mi ? DDT_CUDA_MM_TENSOR : DDT_CUDA_MM_FP32;
        experts_case(0, 12, 200, 75, 4, mode);  /* bf16, odd inter: unaligned rows */
        experts_case(1, 10, 300, 130, 3, mode); /* FP8 partial 128-blocks (the mma.sync stream) */
        experts_case(1, 11, 320, 96, 3, mode);  /* FP8 of whole units: wgmma, partial 128-blocks */
        experts_case(1, 7, 4224, 64, 2, mode);  /* FP8 on wgmma, gate/up k-split in two */
        experts_case(2, 12, 160, 96, 4, mode);  /* INT4 group 32 */
        experts_case(2, 9, 1024, 64, 3, mode);  /* long rows: every pipeline buffer reused */
        experts_case(2, 6, 4160, 96, 2, mode);  /* hidden >= 4096: gate/up k-split in two (a cluster) on wgmma */
        if (!quick) experts_case(2, 40, 256, 224, 8, mode);
    }
    ddt_cpu_pool_destroy(g_pool);
    return ct_report("test_cuda_moe");
}
