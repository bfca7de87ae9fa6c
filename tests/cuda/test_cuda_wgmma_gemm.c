/*
 * test_cuda_wgmma_gemm.c — the bf16 x W^T on wgmma + TMA (backend/cuda/wgmma_gemm.h),
 * the tensor-core mode's product for dense bf16 weights:
 *   - against a double-precision reference of the same bf16 weights and fp32
 *     activations, per element within 3e-5 of sum_j |w_j x_j| (the split
 *     activations keep ~16 mantissa bits; fp32 accumulation), on odd shapes:
 *     rows off 64, columns off 64 (a multiple of 8: the TMA's row pitch), k-split
 *     clusters of 1, 2 and 8, groups (rows of a group inside a larger weight, x
 *     and y at group strides), n = 1 .. 64 and two token tiles (70, 130);
 *   - every output element written, nothing else (y's padding poisoned with NaN
 *     stays poison), the workspace NaN-poisoned before the call;
 *   - batch invariance, bitwise: each token alone (n = 1, from a buffer of its
 *     own) and inside n = 17 equals its row of the n = 64 (and 70) batch;
 *   - through ddt_cuda_matmul_mode (tensor mode routes an eligible bf16 weight
 *     here): the same bits as the direct call;
 *   - the k-split rule depends on the shape only, keeps two k-blocks a split, fills at
 *     most one wave of the 132 SMs; launches of 133-266, 266-396 and more CTAs (2, 3
 *     and 2 CTAs an SM, rings of 6 down to 2 stages) give the same accuracy and
 *     batch invariance;
 *   - refusals: columns not a multiple of 8, a short or misaligned workspace;
 *   - the norms that write their output's split planes for the next product
 *     (ddt_cuda_add_rmsnorm_split, ddt_cuda_rmsnorm_pair_split,
 *     ddt_cuda_embed_rmsnorm_split) then ddt_cuda_matmul_presplit: bitwise the
 *     plain norm then ddt_cuda_matmul_mode (norm output, residual sum and product),
 *     rows of 200 / 1032 / 2080 (256 and 1024 norm threads), both summation paths
 *     (aligned rows and a stride off 4), n = 1, 5, 17, workspace NaN-poisoned;
 *     refusals of planes a product does not read;
 *   - a product whose epilogue writes the next product's split planes
 *     (ddt_cuda_matmul_grouped_next): its own output bitwise the plain product's,
 *     the planes bitwise the bf16 split of that output where the next product's
 *     groups read it and NaN poison elsewhere, and the next product run from them
 *     (x NULL) bitwise the plain one run from the output: q_b -> W_UK^T's shape
 *     (each head's first columns of its row, heads as groups) and W_UV -> o_proj's
 *     (groups into one row), odd sizes, n = 1, 3, 17, 64, 70; refusals.
 * --quick: fewer token counts (the sanitizer's run).
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/nn_cuda.h"
#include "backend/cuda/qmatmul_cuda.h"
#include "backend/cuda/wgmma_gemm.h"
#include "cuda_test.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static const ct_weight_values k_values = {1.0f, 17, 0.01f, 0.05f};
static bool quick = false;

typedef struct {
    int64_t rows, cols;
    ddt_row_groups g;
    int64_t wrows, ldx, ldy;
    ct_weight h;
    ddt_qweight dw;
    float *x; /* host, [nmax][ldx], padding poisoned */
    int nmax;
} problem;

static problem make_problem(int64_t rows, int64_t cols, int count, int nmax) {
    problem p;
    memset(&p, 0, sizeof p);
    p.rows = rows, p.cols = cols, p.nmax = nmax;
    if (count == 1) {
        p.g = (ddt_row_groups){1, 0, 0, rows, 0, 0};
        p.wrows = rows;
    } else { /* group k's rows at 3 + k * (rows + 5): inside a larger weight, off 64 */
        p.g = (ddt_row_groups){count, rows + 5, 3, rows, cols + 3, rows + 2};
        p.wrows = (int64_t)count * (rows + 5) + 3;
    }
    p.ldx = (int64_t)(p.g.count - 1) * p.g.x_stride + cols + 1;
    p.ldy = (int64_t)(p.g.count - 1) * p.g.y_stride + rows + 3;
    p.h = ct_make_weight(&g_rng, 1, p.wrows, cols, &k_values);
    OK(ddt_cuda_qweight_upload(&p.h.w, &p.dw, &err_));
    p.x = malloc(sizeof(float) * (size_t)(nmax * p.ldx));
    ct_poison(p.x, (size_t)(nmax * p.ldx));
    for (int t = 0; t < nmax; t++)
        for (int k = 0; k < p.g.count; k++)
            for (int64_t j = 0; j < cols; j++) p.x[t * p.ldx + k * p.g.x_stride + j] = ct_frand(&g_rng);
    return p;
}

static void free_problem(problem *p) {
    ddt_cuda_qweight_free(&p->dw);
    ct_free_weight(&p->h);
    free(p->x);
}

/* y (host, [n][ldy]) of tokens t0 .. t0+n-1 through the wgmma path (direct, or via
 * ddt_cuda_matmul_mode when via_mode), workspace and y poisoned first. */
static void run(const problem *p, int t0, int n, bool via_mode, float *y) {
    const size_t xn = (size_t)(n * p->ldx), yn = (size_t)(n * p->ldy);
    const size_t wsb = ddt_cuda_matmul_workspace_bytes(p->cols, p->g.count, n);
    float *dx, *dy;
    void *ws;
    CU(cudaMalloc((void **)&dx, sizeof(float) * xn));
    CU(cudaMalloc((void **)&dy, sizeof(float) * yn));
    CU(cudaMalloc(&ws, wsb));
    CU(cudaMemset(ws, 0xFF, wsb)); /* NaN as bf16 and fp32 */
    CU(cudaMemcpy(dx, p->x + t0 * p->ldx, sizeof(float) * xn, cudaMemcpyHostToDevice));
    ct_poison(y, yn);
    CU(cudaMemcpy(dy, y, sizeof(float) * yn, cudaMemcpyHostToDevice));
    if (via_mode)
        OK(ddt_cuda_matmul_grouped_mode(&p->dw, DDT_CUDA_MM_TENSOR, &p->g, dx, p->ldx, n, dy, p->ldy, ws, wsb, NULL,
                                        &err_));
    else
        OK(ddt_cuda_wg_matmul(&p->dw, &p->g, dx, p->ldx, n, dy, p->ldy, ws, wsb, NULL, &err_));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(y, dy, sizeof(float) * yn, cudaMemcpyDeviceToHost));
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    CU(cudaFree(ws));
}

/* the bf16 weight value of row r, column j */
static double wval(const problem *p, int64_t r, int64_t j) {
    const uint16_t b = ((const uint16_t *)p->h.data)[r * p->cols + j];
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* one shape: accuracy and coverage at nmax tokens, then batch invariance */
static void wg_case(int64_t rows, int64_t cols, int count, int nmax) {
    problem p = make_problem(rows, cols, count, nmax);
    const size_t yn = (size_t)(nmax * p.ldy);
    float *y = malloc(sizeof(float) * yn), *y2 = malloc(sizeof(float) * yn);
    run(&p, 0, nmax, false, y);
    int64_t bad = 0, written = 0, stray = 0;
    double worst = 0;
    for (int t = 0; t < nmax; t++)
        for (int64_t c = 0; c < p.ldy; c++) {
            const float v = y[t * p.ldy + c];
            int k = -1;
            for (int kk = 0; kk < p.g.count; kk++)
                if (c >= kk * p.g.y_stride && c < kk * p.g.y_stride + rows) k = kk;
            if (k < 0) {
                stray += !ct_is_poison(&v);
                continue;
            }
            written += !ct_is_poison(&v);
            const int64_t o = c - k * p.g.y_stride, wr = k * p.g.w_row_stride + p.g.w_row_offset + o;
            double ref = 0, mag = 0;
            for (int64_t j = 0; j < cols; j++) {
                const double prod = wval(&p, wr, j) * (double)p.x[t * p.ldx + k * p.g.x_stride + j];
                ref += prod;
                mag += fabs(prod);
            }
            const double e = fabs((double)v - ref) / (mag + 1e-30);
            if (!(e <= 3e-5)) bad++;
            if (e > worst || e != e) worst = e;
        }
    const int32_t ks = ddt_cuda_wg_ksplit(rows, count, cols);
    CHECK(bad == 0 && written == (int64_t)nmax * count * rows && stray == 0,
          "wgmma [%lld x %lld] x%d n=%d (ks %d): %lld beyond 3e-5 (worst %.3g), %lld of %lld written, %lld stray",
          (long long)rows, (long long)cols, count, nmax, ks, (long long)bad, worst, (long long)written,
          (long long)nmax * count * rows, (long long)stray);
    /* tensor mode routes this weight here: the same bits */
    run(&p, 0, nmax, true, y2);
    CHECK(memcmp(y, y2, sizeof(float) * yn) == 0, "wgmma [%lld x %lld]: ddt_cuda_matmul_mode differs from the direct call",
          (long long)rows, (long long)cols);
    /* batch invariance: alone, and in a batch of 17 from token 1 */
    int64_t mism = 0;
    float *y1 = malloc(sizeof(float) * (size_t)(17 * p.ldy));
    for (int t = 0; t < nmax; t++) {
        if (quick && t % 7 != 0 && t != nmax - 1) continue;
        run(&p, t, 1, false, y1);
        mism += memcmp(y1, y + t * p.ldy, sizeof(float) * (size_t)p.ldy) != 0;
    }
    if (nmax >= 18) {
        run(&p, 1, 17, false, y1);
        mism += memcmp(y1, y + p.ldy, sizeof(float) * (size_t)(17 * p.ldy)) != 0;
    }
    CHECK(mism == 0, "wgmma [%lld x %lld] x%d: %lld tokens differ alone or in 17 vs in %d", (long long)rows,
          (long long)cols, count, (long long)mism, nmax);
    printf("wgmma [%5lld x %5lld] x%d n=%3d ks %d: worst %.2e of sum|wx|, alone == batch %s\n", (long long)rows,
           (long long)cols, count, nmax, ks, worst, mism ? "NO" : "yes");
    free(y), free(y2), free(y1);
    free_problem(&p);
}

static void ksplit_rule(void) {
    /* K2.6's dense products, and small ones: a split keeps >= 2 k-blocks, its CTAs one wave,
       its clusters within the capacities (the device's, or none: powers of two) */
    static const int64_t sh[][3] = {{24576, 1536, 1}, {163840, 7168, 1}, {7168, 8192, 1}, {1536, 7168, 1},
                                    {576, 7168, 1},   {37, 200, 1},      {40, 2080, 1},  {5, 64, 3},
                                    {2112, 7168, 1},  {4480, 7168, 1},   {50, 384, 1},   {70, 640, 1}};
    const int32_t *dev = ddt_cuda_wg_cluster_caps();
    CHECK(dev != NULL, "no cluster capacities after ddt_cuda_ws_prepare");
    /* gpc: 8 GPCs of 16 SMs, floor(16 / ks) clusters each */
    int32_t gpc[9] = {0, 132};
    for (int k = 2; k <= 8; k++) gpc[k] = 8 * (16 / k);
    for (int i = 0; i < 12; i++)
        for (int t = 0; t < 3; t++) {
            const int32_t *cap = t == 0 ? NULL : t == 1 ? gpc : dev;
            const int32_t ks = ddt_cuda_wg_ksplit_rule(sh[i][0], (int32_t)sh[i][2], sh[i][1], cap);
            const int64_t nkb = (sh[i][1] + 63) / 64, tiles = (sh[i][0] + 127) / 128 * sh[i][2];
            CHECK(ks >= 1 && ks <= 8 && (ks == 1 || (nkb >= 2 * ks && tiles * ks <= 132)) &&
                      (cap ? ks == 1 || tiles <= cap[ks] : (ks & (ks - 1)) == 0),
                  "k-split of [%lld x %lld] (caps %d): %d", (long long)sh[i][0], (long long)sh[i][1], t, ks);
        }
    /* without capacities, the powers of two: o_proj (56 tiles) splits 2 ways, q_a (12 tiles) 8,
       q_a | kv_a (17) 4; q_b of 192 tiles and the LM head do not split */
    CHECK(ddt_cuda_wg_ksplit_rule(24576, 1, 1536, NULL) == 1 && ddt_cuda_wg_ksplit_rule(7168, 1, 8192, NULL) == 2 &&
              ddt_cuda_wg_ksplit_rule(163840, 1, 7168, NULL) == 1 && ddt_cuda_wg_ksplit_rule(1536, 1, 7168, NULL) == 8 &&
              ddt_cuda_wg_ksplit_rule(2112, 1, 7168, NULL) == 4,
          "k-split of the K2.6 shapes without capacities");
    /* with 8 GPCs of 16: q_a | kv_a 5 ways (17 clusters of 6 or 7 would not all fit), the front
       (35 tiles) 3, o_proj 2; small k: [50 x 384] 3, [70 x 640] 5 */
    CHECK(ddt_cuda_wg_ksplit_rule(2112, 1, 7168, gpc) == 5 && ddt_cuda_wg_ksplit_rule(4480, 1, 7168, gpc) == 3 &&
              ddt_cuda_wg_ksplit_rule(7168, 1, 8192, gpc) == 2 && ddt_cuda_wg_ksplit_rule(50, 1, 384, gpc) == 3 &&
              ddt_cuda_wg_ksplit_rule(70, 1, 640, gpc) == 5,
          "k-split under 8 GPCs of 16: q_a|kv_a %d front %d o_proj %d [50x384] %d [70x640] %d",
          ddt_cuda_wg_ksplit_rule(2112, 1, 7168, gpc), ddt_cuda_wg_ksplit_rule(4480, 1, 7168, gpc),
          ddt_cuda_wg_ksplit_rule(7168, 1, 8192, gpc), ddt_cuda_wg_ksplit_rule(50, 1, 384, gpc),
          ddt_cuda_wg_ksplit_rule(70, 1, 640, gpc));
    for (int64_t r = 64; r <= 40000; r = r * 3 / 2 + 7) /* never more CTAs than one wave holds, unless 1 */
        for (int64_t c = 64; c <= 20000; c = c * 2 + 8) {
            const int32_t ks = ddt_cuda_wg_ksplit(r, 1, c);
            CHECK(ks == 1 || (((r + 127) / 128) * ks <= 132 && (r + 127) / 128 <= dev[ks]),
                  "k-split %d of [%lld x %lld]: past one wave", ks, (long long)r, (long long)c);
        }
    printf("this device's cluster capacities (ks 2..8):");
    for (int k = 2; k <= 8; k++) printf(" %d", dev[k]);
    printf("; k-splits: q_a|kv_a %d, front %d, o_proj %d, q_a %d\n", ddt_cuda_wg_ksplit(2112, 1, 7168),
           ddt_cuda_wg_ksplit(4480, 1, 7168), ddt_cuda_wg_ksplit(7168, 1, 8192), ddt_cuda_wg_ksplit(1536, 1, 7168));
}

static void refusals(void) {
    ct_weight h = ct_make_weight(&g_rng, 1, 10, 36, &k_values); /* 36 columns: not a multiple of 8 */
    ddt_qweight dw;
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    CHECK(!ddt_cuda_wg_eligible(&dw), "a [10 x 36] bf16 weight is not wgmma-eligible");
    const ddt_row_groups g = {1, 0, 0, 10, 0, 0};
    float *dx, *dy;
    void *ws;
    CU(cudaMalloc((void **)&dx, 4 * 64));
    CU(cudaMalloc((void **)&dy, 4 * 64));
    CU(cudaMalloc(&ws, 4096));
    ddt_error e;
    CHECK(ddt_cuda_wg_matmul(&dw, &g, dx, 36, 1, dy, 10, ws, 4096, NULL, &e) == DDT_ERR_UNSUPPORTED,
          "36 columns accepted");
    ddt_cuda_qweight_free(&dw);
    ct_free_weight(&h);
    h = ct_make_weight(&g_rng, 1, 10, 40, &k_values);
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    const ddt_row_groups g2 = {1, 0, 0, 10, 0, 0};
    CHECK(ddt_cuda_wg_matmul(&dw, &g2, dx, 40, 2, dy, 10, ws, 2 * 40 * 4 - 1, NULL, &e) == DDT_ERR_RANGE,
          "a short workspace accepted");
    CHECK(ddt_cuda_wg_matmul(&dw, &g2, dx, 40, 2, dy, 10, (char *)ws + 4, 1024, NULL, &e) == DDT_ERR_RANGE,
          "a misaligned workspace accepted");
    CHECK(ddt_cuda_wg_matmul(&dw, &g2, dx, 40, 0, dy, 10, ws, 1024, NULL, &e) == DDT_ERR_INVALID, "0 tokens accepted");
    CHECK(strstr(e.msg, "wgmma") != NULL, "refusal message names the path: %s", e.msg);
    ddt_cuda_qweight_free(&dw);
    ct_free_weight(&h);
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    CU(cudaFree(ws));
}

/* host [rows][ld] -> device, and back */
static float *dev_of(const float *h, size_t count) { return (float *)ct_dev_copy(h, sizeof(float) * count); }
static void host_of(float *h, const float *d, size_t count) {
    CU(cudaMemcpy(h, d, sizeof(float) * count, cudaMemcpyDeviceToHost));
}
static bool same_bits(const float *a, const float *b, size_t count) { return memcmp(a, b, sizeof(float) * count) == 0; }

/* One norm kind (0 add_rmsnorm, 1 rmsnorm_pair job 0, 2 embed_rmsnorm) over n rows of
 * dim, output then product of a [37 x dim] bf16 weight: plain vs split planes. */
static void presplit_case(int kind, int dim, int n, bool aligned) {
    const int64_t ld = aligned ? dim + 4 : dim + 1, rows = 37;
    ct_weight hw = ct_make_weight(&g_rng, 1, rows, dim, &k_values);
    ddt_qweight w;
    OK(ddt_cuda_qweight_upload(&hw.w, &w, &err_));
    const int V = 23; /* embedding rows (kind 2) */
    ct_weight he = ct_make_weight(&g_rng, 1, V, dim, &k_values);
    ddt_qweight emb;
    OK(ddt_cuda_qweight_upload(&he.w, &emb, &err_));
    const size_t xc = (size_t)n * (size_t)ld;
    float *hx = malloc(sizeof(float) * xc), *hr = malloc(sizeof(float) * xc), *hn = malloc(sizeof(float) * dim);
    float *k1 = malloc(sizeof(float) * 64 * (size_t)n);
    for (size_t i = 0; i < xc; i++) hx[i] = ct_frand(&g_rng), hr[i] = ct_frand(&g_rng);
    for (int i = 0; i < dim; i++) hn[i] = 0.5f + ct_frand(&g_rng);
    for (int i = 0; i < 64 * n; i++) k1[i] = ct_frand(&g_rng);
    int32_t ids[32];
    for (int t = 0; t < n; t++) ids[t] = (t * 7 + 3) % V;
    int32_t *dids = ct_dev_copy(ids, sizeof(int32_t) * (size_t)n);
    float *dnw = dev_of(hn, (size_t)dim), *dr = dev_of(hr, xc);
    const size_t wsb = ddt_cuda_matmul_workspace_bytes(dim, 1, n);
    const size_t yc = (size_t)n * (size_t)rows;
    float *out[2], *xs[2], *ys[2], *kv[2];
    for (int v = 0; v < 2; v++) { /* v = 0: plain, 1: split planes */
        float *dx = dev_of(hx, xc), *dout, *dy, *dk = dev_of(k1, 64 * (size_t)n);
        void *ws;
        CU(cudaMalloc((void **)&dout, sizeof(float) * xc));
        CU(cudaMalloc((void **)&dy, sizeof(float) * yc));
        CU(cudaMalloc(&ws, wsb));
        CU(cudaMemset(ws, 0xFF, wsb)); /* NaN as bf16 */
        CU(cudaMemset(dout, 0xFF, sizeof(float) * xc));
        ddt_cuda_split_planes p;
        memset(&p, 0, sizeof p);
        if (v == 1) CHECK(ddt_cuda_matmul_split_planes(&w, DDT_CUDA_MM_TENSOR, n, ws, wsb, &p) && p.hi && p.lo,
                          "no split planes for a bf16 [%lld x %d] product", (long long)rows, dim);
        const ddt_cuda_norm_job jobs[2] = {{dx, ld, dim, dnw, dout, ld}, {dk, 64, 64, dnw, dk, 64}};
        if (kind == 0) OK(ddt_cuda_add_rmsnorm_split(dx, ld, dr, ld, n, dim, dnw, 1e-6f, dout, ld, v ? &p : NULL, NULL,
                                                    &err_));
        else if (kind == 1) OK(ddt_cuda_rmsnorm_pair_split(jobs, n, 1e-6f, v ? &p : NULL, NULL, &err_));
        else OK(ddt_cuda_embed_rmsnorm_split(&emb, dids, NULL, n, dx, ld, dnw, 1e-6f, dout, ld, v ? &p : NULL, NULL,
                                             &err_));
        if (v == 1) OK(ddt_cuda_matmul_presplit(&w, DDT_CUDA_MM_TENSOR, n, dy, rows, ws, wsb, NULL, &err_));
        else OK(ddt_cuda_matmul_mode(&w, DDT_CUDA_MM_TENSOR, dout, ld, n, dy, rows, ws, wsb, NULL, &err_));
        CU(cudaDeviceSynchronize());
        out[v] = malloc(sizeof(float) * xc), xs[v] = malloc(sizeof(float) * xc), ys[v] = malloc(sizeof(float) * yc);
        kv[v] = malloc(sizeof(float) * 64 * (size_t)n);
        host_of(out[v], dout, xc);
        host_of(xs[v], dx, xc);
        host_of(ys[v], dy, yc);
        host_of(kv[v], dk, 64 * (size_t)n);
        CU(cudaFree(dx));
        CU(cudaFree(dout));
        CU(cudaFree(dy));
        CU(cudaFree(ws));
        CU(cudaFree(dk));
    }
    static const char *names[] = {"add_rmsnorm", "rmsnorm_pair", "embed_rmsnorm"};
    bool finite = true;
    for (size_t i = 0; i < yc; i++) finite &= isfinite(ys[1][i]) != 0;
    CHECK(finite, "%s dim %d n %d: a product of the split planes is not finite", names[kind], dim, n);
    CHECK(same_bits(out[0], out[1], xc), "%s dim %d n %d %s: output differs with split planes", names[kind], dim, n,
          aligned ? "aligned" : "ld off 4");
    CHECK(same_bits(xs[0], xs[1], xc), "%s dim %d n %d: residual rows differ", names[kind], dim, n);
    CHECK(same_bits(ys[0], ys[1], yc), "%s dim %d n %d %s: presplit product differs from the plain one", names[kind],
          dim, n, aligned ? "aligned" : "ld off 4");
    CHECK(same_bits(kv[0], kv[1], 64 * (size_t)n), "%s dim %d n %d: the second job differs", names[kind], dim, n);
    for (int v = 0; v < 2; v++) free(out[v]), free(xs[v]), free(ys[v]), free(kv[v]);
    free(hx), free(hr), free(hn), free(k1);
    CU(cudaFree(dids));
    CU(cudaFree(dnw));
    CU(cudaFree(dr));
    ddt_cuda_qweight_free(&w), ddt_cuda_qweight_free(&emb);
    ct_free_weight(&hw), ct_free_weight(&he);
}

/* Product 1 (count1 groups of rows1 rows over cols1 columns, y at group stride
 * rows1, no gaps) writes product 2's planes: count2 groups of `width` of its output
 * columns, ncols read of each, rows2 output rows a group. */
static void next_case(int count1, int64_t rows1, int64_t cols1, int count2, int64_t width, int64_t ncols,
                      int64_t rows2, int n) {
    const int64_t ldy1 = (int64_t)count1 * rows1, ldx1 = (int64_t)count1 * (cols1 + 3);
    const ddt_row_groups g1 = {count1, rows1 + 5, 3, rows1, cols1 + 3, rows1};
    const ddt_row_groups g2 = {count2, rows2, 0, rows2, width, rows2};
    const int64_t ldy2 = (int64_t)count2 * rows2;
    ct_weight h1 = ct_make_weight(&g_rng, 1, (int64_t)count1 * (rows1 + 5) + 3, cols1, &k_values);
    ct_weight h2 = ct_make_weight(&g_rng, 1, (int64_t)count2 * rows2, ncols, &k_values);
    ddt_qweight w1, w2;
    OK(ddt_cuda_qweight_upload(&h1.w, &w1, &err_));
    OK(ddt_cuda_qweight_upload(&h2.w, &w2, &err_));
    const size_t xc = (size_t)n * (size_t)ldx1, y1c = (size_t)n * (size_t)ldy1, y2c = (size_t)n * (size_t)ldy2;
    float *hx = malloc(sizeof(float) * xc);
    for (size_t i = 0; i < xc; i++) hx[i] = ct_frand(&g_rng);
    const size_t ws1 = ddt_cuda_matmul_workspace_bytes(cols1, count1, n), ws2 = ddt_cuda_matmul_workspace_bytes(ncols, count2, n);
    float *dx = dev_of(hx, xc), *dy1[2], *dy2[2];
    void *dws1, *dws2;
    CU(cudaMalloc(&dws1, ws1));
    CU(cudaMalloc(&dws2, ws2));
    ddt_cuda_next_planes next;
    memset(&next, 0, sizeof next);
    CHECK(ddt_cuda_matmul_writes_next(&w1, DDT_CUDA_MM_TENSOR) && !ddt_cuda_matmul_writes_next(&w1, DDT_CUDA_MM_FP32),
          "writes_next of a bf16 weight: tensor mode only");
    CHECK(ddt_cuda_matmul_split_planes_grouped(&w2, DDT_CUDA_MM_TENSOR, count2, n, dws2, ws2, &next.planes) &&
              next.planes.hi && next.planes.pitch >= ncols,
          "no grouped split planes for %d groups of [%lld x %lld]", count2, (long long)rows2, (long long)ncols);
    next.width = width;
    next.cols = ncols;
    for (int v = 0; v < 2; v++) { /* v = 0: plain products; 1: planes from the epilogue, product 2 presplit */
        CU(cudaMalloc((void **)&dy1[v], sizeof(float) * y1c));
        CU(cudaMalloc((void **)&dy2[v], sizeof(float) * y2c));
        CU(cudaMemset(dy1[v], 0xFF, sizeof(float) * y1c));
        CU(cudaMemset(dy2[v], 0xFF, sizeof(float) * y2c));
        CU(cudaMemset(dws1, 0xFF, ws1));
        CU(cudaMemset(dws2, 0xFF, ws2)); /* NaN as bf16 */
        if (v == 0) {
            OK(ddt_cuda_matmul_grouped_mode(&w1, DDT_CUDA_MM_TENSOR, &g1, dx, ldx1, n, dy1[0], ldy1, dws1, ws1, NULL,
                                            &err_));
            OK(ddt_cuda_matmul_grouped_mode(&w2, DDT_CUDA_MM_TENSOR, &g2, dy1[0], ldy1, n, dy2[0], ldy2, dws2, ws2,
                                            NULL, &err_));
        } else {
            /* and the output as bf16 at its own strides (the MLA query's latent part: groups
               rows1 + 3 apart, tokens 5 more than the groups), poison around it */
            const int64_t bg = rows1 + 3, bld = (int64_t)count1 * bg + 5;
            const size_t bc = (size_t)n * (size_t)bld;
            uint16_t *db16;
            CU(cudaMalloc((void **)&db16, sizeof(uint16_t) * bc));
            CU(cudaMemset(db16, 0xFF, sizeof(uint16_t) * bc));
            next.b16 = db16, next.b16_ld = bld, next.b16_gstride = bg;
            OK(ddt_cuda_matmul_grouped_next(&w1, DDT_CUDA_MM_TENSOR, &g1, dx, ldx1, n, dy1[1], ldy1, dws1, ws1, &next,
                                            NULL, &err_));
            CU(cudaDeviceSynchronize());
            next.b16 = NULL;
            {
                uint16_t *hb = malloc(sizeof(uint16_t) * bc);
                float *hy = malloc(sizeof(float) * y1c);
                CU(cudaMemcpy(hb, db16, sizeof(uint16_t) * bc, cudaMemcpyDeviceToHost));
                host_of(hy, dy1[1], y1c);
                int64_t bad = 0;
                for (int t = 0; t < n; t++)
                    for (int64_t c = 0; c < bld; c++) {
                        const int64_t grp = c / bg, row = c % bg;
                        const uint16_t want = grp < count1 && row < rows1
                                                  ? ddt_f32_to_bf16(hy[(size_t)t * ldy1 + grp * rows1 + row])
                                                  : 0xFFFF;
                        bad += hb[(size_t)t * bld + c] != want;
                    }
                CHECK(bad == 0, "bf16 output [%d x %lld] n %d: %lld values not bf16(y) or written out of place", count1,
                      (long long)rows1, n, (long long)bad);
                free(hb), free(hy);
                CU(cudaFree(db16));
            }
            /* the planes: the split of y1 where product 2 reads, poison elsewhere */
            const size_t pc = 2 * (size_t)next.planes.pitch * (size_t)count2 * (size_t)n;
            uint16_t *hp = malloc(sizeof(uint16_t) * pc);
            float *hy = malloc(sizeof(float) * y1c);
            CU(cudaMemcpy(hp, next.planes.hi, sizeof(uint16_t) * pc, cudaMemcpyDeviceToHost));
            host_of(hy, dy1[1], y1c);
            const size_t lo_off = (size_t)(next.planes.lo - next.planes.hi);
            char *hit = calloc(pc / 2, 1);
            int64_t bad = 0, wrote = 0, stray = 0;
            for (int t = 0; t < n; t++)
                for (int64_t c = 0; c < ldy1; c++) {
                    const int64_t ng = c / width, col = c % width;
                    if (col >= ncols || ng >= count2) continue;
                    const size_t r = (size_t)((ng * n + t) * next.planes.pitch + col);
                    const uint16_t h = ddt_f32_to_bf16(hy[t * ldy1 + c]),
                                   l = ddt_f32_to_bf16(hy[t * ldy1 + c] - ddt_bf16_to_f32(ddt_f32_to_bf16(hy[t * ldy1 + c])));
                    bad += hp[r] != h || hp[lo_off + r] != l;
                    hit[r] = 1;
                    wrote++;
                }
            for (size_t r = 0; r < pc / 2; r++)
                if (!hit[r]) stray += hp[r] != 0xFFFF || hp[lo_off + r] != 0xFFFF;
            CHECK(bad == 0 && stray == 0 && wrote == (int64_t)n * count2 * ncols,
                  "next planes [%d x %lld -> %d x %lld of %lld] n %d: %lld not the split of y, %lld stray, %lld of %lld "
                  "written", count1, (long long)rows1, count2, (long long)ncols, (long long)width, n, (long long)bad,
                  (long long)stray, (long long)wrote, (long long)n * count2 * ncols);
            free(hp), free(hy), free(hit);
            OK(ddt_cuda_matmul_grouped_next(&w2, DDT_CUDA_MM_TENSOR, &g2, NULL, 0, n, dy2[1], ldy2, dws2, ws2, NULL,
                                            NULL, &err_));
        }
        CU(cudaDeviceSynchronize());
    }
    float *a = malloc(sizeof(float) * (y1c > y2c ? y1c : y2c)), *b = malloc(sizeof(float) * (y1c > y2c ? y1c : y2c));
    host_of(a, dy1[0], y1c);
    host_of(b, dy1[1], y1c);
    CHECK(same_bits(a, b, y1c), "next planes [%d x %lld] n %d: the product's own output differs", count1,
          (long long)rows1, n);
    host_of(a, dy2[0], y2c);
    host_of(b, dy2[1], y2c);
    bool finite = true;
    for (size_t i = 0; i < y2c; i++) finite &= isfinite(b[i]) != 0;
    CHECK(finite && same_bits(a, b, y2c), "next planes [%d x %lld -> %d x %lld] n %d: the presplit next product %s",
          count1, (long long)rows1, count2, (long long)rows2, n, finite ? "differs from the plain one" : "is not finite");
    printf("next planes [%d x %4lld x %4lld] -> [%d x %3lld of %4lld] -> %3lld rows, n=%2d: checked\n", count1,
           (long long)rows1, (long long)cols1, count2, (long long)ncols, (long long)width, (long long)rows2, n);
    free(a), free(b), free(hx);
    for (int v = 0; v < 2; v++) {
        CU(cudaFree(dy1[v]));
        CU(cudaFree(dy2[v]));
    }
    CU(cudaFree(dx));
    CU(cudaFree(dws1));
    CU(cudaFree(dws2));
    ddt_cuda_qweight_free(&w1), ddt_cuda_qweight_free(&w2);
    ct_free_weight(&h1), ct_free_weight(&h2);
}

static void next_refusals(void) {
    ct_weight h = ct_make_weight(&g_rng, 1, 10, 36, &k_values); /* not wgmma-eligible */
    ddt_qweight dw;
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    void *ws;
    float *dy, *dx;
    CU(cudaMalloc(&ws, 1 << 16));
    CU(cudaMalloc((void **)&dy, 4 * 256));
    CU(cudaMalloc((void **)&dx, 4 * 256));
    ddt_error e;
    const ddt_row_groups g = {1, 0, 0, 10, 0, 0};
    ddt_cuda_next_planes next = {{(uint16_t *)ws, (uint16_t *)ws + 1024, 16}, 10, 8, NULL, 0, 0, NULL};
    CHECK(ddt_cuda_matmul_grouped_next(&dw, DDT_CUDA_MM_TENSOR, &g, dx, 36, 2, dy, 10, ws, 1 << 15, &next, NULL, &e) ==
              DDT_ERR_UNSUPPORTED && strstr(e.msg, "wgmma") != NULL,
          "next planes from a weight off the wgmma path accepted (%s)", e.msg);
    CHECK(ddt_cuda_matmul_grouped_next(&dw, DDT_CUDA_MM_TENSOR, &g, NULL, 0, 2, dy, 10, ws, 1 << 15, NULL, NULL, &e) ==
              DDT_ERR_UNSUPPORTED,
          "a presplit product off the wgmma path accepted");
    ddt_cuda_qweight_free(&dw);
    ct_free_weight(&h);
    h = ct_make_weight(&g_rng, 1, 10, 40, &k_values);
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    next.cols = 12; /* more than the width */
    CHECK(ddt_cuda_matmul_grouped_next(&dw, DDT_CUDA_MM_TENSOR, &g, dx, 40, 2, dy, 10, ws, 1 << 15, &next, NULL, &e) ==
              DDT_ERR_INVALID && strstr(e.msg, "width") != NULL,
          "next planes of 12 columns in groups of 10 accepted (%s)", e.msg);
    CHECK(ddt_cuda_matmul_grouped_next(&dw, DDT_CUDA_MM_FP32, &g, NULL, 0, 2, dy, 10, ws, 1 << 15, NULL, NULL, &e) ==
              DDT_ERR_UNSUPPORTED,
          "a presplit product in FP32 mode accepted");
    /* a bf16 output whose groups or tokens overlap, and a next with nothing to write */
    ddt_cuda_next_planes b = {{NULL, NULL, 0}, 0, 0, (uint16_t *)ws, 12, 9, NULL};
    CHECK(ddt_cuda_matmul_grouped_next(&dw, DDT_CUDA_MM_TENSOR, &g, dx, 40, 2, dy, 10, ws, 1 << 15, &b, NULL, &e) ==
              DDT_ERR_INVALID && strstr(e.msg, "bf16") != NULL,
          "a bf16 output of group stride 9 for rows of 10 accepted (%s)", e.msg);
    b.b16_gstride = 10, b.b16_ld = 9;
    CHECK(ddt_cuda_matmul_grouped_next(&dw, DDT_CUDA_MM_TENSOR, &g, dx, 40, 2, dy, 10, ws, 1 << 15, &b, NULL, &e) ==
              DDT_ERR_INVALID && strstr(e.msg, "token stride") != NULL,
          "a bf16 output of token stride 9 for rows of 10 accepted (%s)", e.msg);
    b.b16 = NULL;
    CHECK(ddt_cuda_matmul_grouped_next(&dw, DDT_CUDA_MM_TENSOR, &g, dx, 40, 2, dy, 10, ws, 1 << 15, &b, NULL, &e) ==
              DDT_ERR_INVALID,
          "a next with neither planes nor a bf16 output accepted");
    ddt_cuda_qweight_free(&dw);
    ct_free_weight(&h);
    CU(cudaFree(ws));
    CU(cudaFree(dy));
    CU(cudaFree(dx));
}

static void presplit_refusals(void) {
    ct_weight h = ct_make_weight(&g_rng, 1, 10, 36, &k_values); /* not wgmma-eligible */
    ddt_qweight dw;
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    void *ws;
    CU(cudaMalloc(&ws, 1 << 16));
    ddt_cuda_split_planes p;
    ddt_error e;
    CHECK(!ddt_cuda_matmul_split_planes(&dw, DDT_CUDA_MM_TENSOR, 2, ws, 1 << 16, &p) && !p.hi,
          "split planes for a weight the wgmma path does not take");
    float *dy;
    CU(cudaMalloc((void **)&dy, 4 * 64));
    CHECK(ddt_cuda_matmul_presplit(&dw, DDT_CUDA_MM_TENSOR, 2, dy, 10, ws, 1 << 16, NULL, &e) == DDT_ERR_UNSUPPORTED,
          "a presplit product of an ineligible weight accepted");
    ddt_cuda_qweight_free(&dw);
    ct_free_weight(&h);
    h = ct_make_weight(&g_rng, 1, 10, 40, &k_values);
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    CHECK(!ddt_cuda_matmul_split_planes(&dw, DDT_CUDA_MM_FP32, 2, ws, 1 << 16, &p), "split planes in FP32 mode");
    CHECK(!ddt_cuda_matmul_split_planes(&dw, DDT_CUDA_MM_TENSOR, 2, ws, 2 * 40 * 4 - 1, &p),
          "split planes in a short workspace");
    CHECK(ddt_cuda_matmul_split_planes(&dw, DDT_CUDA_MM_TENSOR, 2, ws, 1 << 16, &p), "no split planes for [10 x 40]");
    /* a norm refuses planes narrower than its rows */
    ddt_cuda_split_planes bad = p;
    bad.pitch = 32;
    float *dx, *dn;
    CU(cudaMalloc((void **)&dx, 4 * 2 * 40));
    CU(cudaMalloc((void **)&dn, 4 * 40));
    CHECK(ddt_cuda_add_rmsnorm_split(dx, 40, dx, 40, 2, 40, dn, 1e-6f, dy, 40, &bad, NULL, &e) == DDT_ERR_INVALID,
          "planes of pitch 32 for rows of 40 accepted");
    CHECK(strstr(e.msg, "pitch") != NULL, "refusal names the pitch: %s", e.msg);
    ddt_cuda_qweight_free(&dw);
    ct_free_weight(&h);
    CU(cudaFree(ws));
    CU(cudaFree(dy));
    CU(cudaFree(dx));
    CU(cudaFree(dn));
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) quick |= strcmp(argv[i], "--quick") == 0;
    int dev;
    struct cudaDeviceProp prop;
    CU(cudaGetDevice(&dev));
    CU(cudaGetDeviceProperties(&prop, dev));
    if (prop.major != 9) {
        fprintf(stderr, "test_cuda_wgmma_gemm: needs an sm_90 GPU (found sm_%d%d)\n", prop.major, prop.minor);
        return 1;
    }
    OK(ddt_cuda_ws_prepare(&err_));
    ksplit_rule();
    refusals();
    presplit_refusals();
    next_refusals();
    /* q_b -> W_UK^T: 5 heads of 40 columns, the first 24 read, rows of 33; W_UV ->
       o_proj: 3 groups of 40 rows into one row of 120 read by 70 rows (ks > 1 on the
       first product: 1032 columns) */
    static const int nn[] = {1, 3, 17, 64, 70};
    for (int i = 0; i < 5; i++) {
        if (quick && (i == 1 || i == 4)) continue;
        next_case(1, 5 * 40, 136, 5, 40, 24, 33, nn[i]);
        next_case(3, 40, 1032, 1, 120, 120, 70, nn[i]);
    }
    static const int dims[] = {200, 1032, 2080}, pns[] = {1, 5, 17};
    for (int kind = 0; kind < 3; kind++)
        for (int d = 0; d < 3; d++)
            for (int i = 0; i < 3; i++)
                for (int al = 0; al < 2; al++) {
                    if (quick && i == 1) continue;
                    presplit_case(kind, dims[d], pns[i], al == 1);
                }
    /* [37 x 200]: one row tile, ks 2, columns off 64; [131 x 1032]: 3 row tiles;
       [40 x 2080]: ks 8; [300 x 96]: 5 tiles; groups of 21 rows in a larger weight; odd
       splits: [50 x 384] 3, [70 x 640] 5, [200 x 896] 7 (two tiles) */
    static const int64_t sh[][3] = {{37, 200, 1},  {131, 1032, 1}, {40, 2080, 1}, {300, 96, 1},
                                    {21, 136, 3},  {50, 384, 1},   {70, 640, 1},  {200, 896, 1}};
    static const int ns[] = {1, 3, 17, 64, 70, 130};
    for (int s = 0; s < 8; s++)
        for (int i = 0; i < 6; i++) {
            if (quick && (i == 1 || i == 5)) continue;
            wg_case(sh[s][0], sh[s][1], (int)sh[s][2], ns[i]);
        }
    /* launches past 132 CTAs, whose CTAs share SMs with rings cut to fit (wg_per_sm):
       [17000 x 136] 133 row tiles (2 an SM: 6 stages at 8 token rows, 3 at 64; at 70
       tokens two token tiles, 266 CTAs: 3 an SM, 2 stages), [33900 x 200] 265 (3 an SM,
       4 stages), [51300 x 72] 401 (2 an SM again) */
    static const int64_t big[][2] = {{17000, 136}, {33900, 200}, {51300, 72}};
    static const int bn[] = {1, 17, 64, 70};
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 4; i++) {
            if (quick && i != 0 && i != 3) continue;
            wg_case(big[s][0], big[s][1], 1, bn[i]);
        }
    /* every n from 1 to 64 on one shape (bitwise alone == batch for each) */
    if (!quick)
        for (int n = 2; n <= 64; n += 5) wg_case(67, 264, 1, n);
    return ct_report("test_cuda_wgmma_gemm");
}
