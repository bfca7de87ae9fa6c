/*
 * test_cuda_qmatmul.c — the GPU quantised matmuls (qmatmul_cuda.h) against the CPU
 * twins (backend/cpu/qmatmul.h) for every weight format (F32, BF16, F16, FP8 block
 * 128, INT4 group 32) on odd shapes and token counts 1, 3, 17, 64:
 *   - x W^T, grouped x W^T and x W: normalised error < 1e-5 against the CPU;
 *   - the tensor-core path (DDT_CUDA_MM_TENSOR) of x W^T and grouped x W^T for
 *     BF16, FP8 and INT4 on the same odd shapes (rows not a multiple of 16,
 *     columns not a multiple of 32 where the format allows) and n = 1, 3, 9, 17,
 *     64, 70 (every n-tile count and two token blocks), weights packed by
 *     ddt_cuda_qweight_pack, groups on 16-row tiles: normalised error < 5e-5.
 *     Why 5e-5: the weights are exact and the products are accumulated in fp32;
 *     the only approximation is x = bf16 hi + bf16 lo, whose error is at most
 *     2^-9 of the residual, i.e. about 2^-18 = 3.8e-6 of |x| per term, so the
 *     error relative to the sum is about that (measured: printed); 5e-5 leaves
 *     room for the accumulation order and still catches any real mistake (a
 *     wrong column or scale gives errors of order 1, plain bf16 x about 2e-3).
 *     F32 and F16 weights, and groups off the 16-row tiles, in tensor mode take
 *     the FP32 path: bit-identical; an unpacked weight in tensor mode is refused;
 *   - the determinism contract: every token of a batch is bit-identical to the same
 *     token computed alone (from a separate, differently aligned buffer);
 *   - output padding (poisoned with NaN) is never written;
 *   - x W and the embedding gather are bit-identical to the CPU (same operations);
 *   - the tensor path with its activations split once per product (a pre-pass
 *     into the caller's workspace) is bit-identical, over the whole output
 *     buffer, to the kernel that split them in every block (kept verbatim in
 *     test_cuda_qmatmul_ref.cu / wstream_ref.cuh): BF16, FP8, INT4; n = 1, 2, 5,
 *     16, 17, 33, 64, 70; rows off 16, columns off 32 and off 4 (BF16, FP8),
 *     k-split clusters, groups, aligned and unaligned x; the activations'
 *     padding, the output's and the workspace poisoned with NaN; each token of
 *     n = 64 bit-identical to the same token alone; a missing, short or
 *     misaligned workspace refused.
 * Needs the CPU backend: link with src/core, src/io, src/backend/cpu.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/qmatmul.h"
#include "backend/cuda/qmatmul_cuda.h"
#include "backend/cuda/wgmma_gemm.h"
#include "cuda_test.h"

/* the x W kernel before the latency rework (test_cuda_qmatmul_ref.cu): a cudaError_t */
int ref_old_matmul_t_grouped(const ddt_qweight *w, const ddt_row_groups *g, const float *x, int64_t ldx, int32_t n,
                             float *y, int64_t ldy);
/* the tensor-core x W^T before the split pre-pass (test_cuda_qmatmul_ref.cu): a cudaError_t */
int ref_old_tc_matmul_grouped(const ddt_qweight *w, const ddt_row_groups *g, const float *x, int64_t ldx, int32_t n,
                              float *y, int64_t ldy);

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { return ct_frand(&g_rng); }

/* A host weight plus its buffers, values as this test always drew them. */
typedef ct_weight hw;
static const ct_weight_values k_values = {1.0f, 17, 0.01f, 0.05f};
static hw make_weight(int f, int64_t rows, int64_t cols) { return ct_make_weight(&g_rng, f, rows, cols, &k_values); }
static void free_weight(hw *h) { ct_free_weight(h); }

static const char *fmt_name(int f) {
    static const char *n[] = {"F32", "BF16", "F16", "FP8", "INT4"};
    return n[f];
}

static ddt_cpu_pool *g_pool;

/* A device workspace of exactly the bytes a tensor-path product of n tokens over
 * g's groups needs (so the sanitizer sees any access past it), NaN-poisoned
 * (0xFF bytes: NaN as fp32 and as bf16), or NULL in FP32 mode. */
static void *mm_workspace(const ddt_qweight *dw, ddt_cuda_mm_mode mode, const ddt_row_groups *g, int n,
                          size_t *bytes) {
    *bytes = 0;
    if (mode != DDT_CUDA_MM_TENSOR) return NULL;
    *bytes = ddt_cuda_matmul_workspace_bytes(dw->cols, g->count, n);
    void *ws;
    CU(cudaMalloc(&ws, *bytes));
    CU(cudaMemset(ws, 0xFF, *bytes));
    return ws;
}

/* kind 0: plain x W^T; 1: grouped x W^T; 2: grouped x W (FP32 only); 3: grouped
 * x W^T whose groups do not start on 16-row tiles (tensor mode: the FP32 path).
 * mode: DDT_CUDA_MM_FP32 or DDT_CUDA_MM_TENSOR for kinds 0, 1 and 3. */
static void mm_call(const ddt_qweight *dw, ddt_cuda_mm_mode mode, int kind, const ddt_row_groups *g, const float *x,
                    int64_t ldx, int n, float *y, int64_t ldy) {
    size_t wsb;
    void *ws = kind == 2 ? NULL : mm_workspace(dw, mode, kind == 0 ? &(ddt_row_groups){1, 0, 0, dw->rows, 0, 0} : g,
                                               n, &wsb);
    if (kind == 0) OK(ddt_cuda_matmul_mode(dw, mode, x, ldx, n, y, ldy, ws, wsb, NULL, &err_));
    else if (kind == 1 || kind == 3) OK(ddt_cuda_matmul_grouped_mode(dw, mode, g, x, ldx, n, y, ldy, ws, wsb, NULL, &err_));
    else OK(ddt_cuda_matmul_t_grouped(dw, g, x, ldx, n, y, ldy, NULL, &err_));
    if (ws) {
        CU(cudaDeviceSynchronize());
        CU(cudaFree(ws));
    }
}

static void run_case_mode(int f, int kind, int64_t rows, int64_t cols, int n, int xpad, ddt_cuda_mm_mode mode) {
    /* bf16 with columns a multiple of 8 takes wgmma (any groups); FP8 / INT4 and
       other bf16 the packed stream, groups on its 16-row tiles */
    const int tc = mode == DDT_CUDA_MM_TENSOR && ((f == 1 && cols % 8 == 0) || ((f == 1 || f == 3 || f == 4) && kind != 3));
    const double tol = tc ? 5e-5 : 1e-5;
    ddt_row_groups g = {1, 0, 0, rows, 0, 0};
    int64_t wrows = rows, xw, yw;
    if (kind == 3 || (kind == 1 && mode == DDT_CUDA_MM_FP32)) {
        /* 3 groups of `rows` rows at offset 5 inside blocks of rows+7 */
        g = (ddt_row_groups){3, rows + 7, 5, rows, cols + 1, rows + 2};
        wrows = 3 * (rows + 7);
    } else if (kind == 1) { /* tensor mode: groups on 16-row tiles (at row 16 of blocks of >= rows+23) */
        const int64_t st = (rows + 23 + 15) / 16 * 16;
        g = (ddt_row_groups){3, st, 16, rows, cols + 1, rows + 2};
        wrows = 3 * st;
    } else if (kind == 2) { /* x W over 3 groups of `rows` rows: output width cols */
        g = (ddt_row_groups){3, rows + 4, 3, rows, rows + 1, cols};
        wrows = 3 * (rows + 4);
    }
    if (kind == 0) xw = cols, yw = rows;
    else if (kind == 1 || kind == 3) xw = 2 * g.x_stride + cols, yw = 2 * g.y_stride + rows;
    else xw = 2 * g.x_stride + rows, yw = 2 * g.y_stride + cols;
    const int64_t ldx = xw + xpad, ldy = yw + 3;
    hw h = make_weight(f, wrows, cols);
    float *x = malloc(sizeof(float) * (size_t)(n * ldx));
    float *yref = malloc(sizeof(float) * (size_t)(n * ldy)), *ygot = malloc(sizeof(float) * (size_t)(n * ldy));
    float *yone = malloc(sizeof(float) * (size_t)ldy);
    for (int64_t i = 0; i < n * ldx; i++) x[i] = frand();
    ct_poison(yref, (size_t)(n * ldy));
    ddt_row_groups cg = {g.count, g.w_row_stride, g.w_row_offset, g.rows, g.x_stride, g.y_stride};
    if (kind == 0) ddt_cpu_matmul(g_pool, &h.w, x, ldx, n, yref, ldy);
    else if (kind == 1 || kind == 3) ddt_cpu_matmul_grouped(g_pool, &h.w, &cg, x, ldx, n, yref, ldy);
    else ddt_cpu_matmul_t_grouped(g_pool, &h.w, &cg, x, ldx, n, yref, ldy);

    ddt_qweight dw;
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    if (mode == DDT_CUDA_MM_TENSOR) {
        OK(ddt_cuda_qweight_pack(&dw, &err_));
        /* a packed copy for the mma.sync stream's weights only: not for F32 / F16 (FP32
           path) nor for bf16 the wgmma path takes from its row-major data */
        const int want = f == 3 || f == 4 || (f == 1 && !ddt_cuda_wg_eligible(&dw));
        CHECK((dw.mma != NULL) == want, "%s [%lld x %lld]: packed copy %s", fmt_name(f), (long long)wrows,
              (long long)cols, dw.mma ? "made where no path reads it" : "missing");
    }
    float *dx, *dy, *dx1, *dy1;
    CU(cudaMalloc((void **)&dx, sizeof(float) * (size_t)(n * ldx)));
    CU(cudaMalloc((void **)&dy, sizeof(float) * (size_t)(n * ldy)));
    CU(cudaMalloc((void **)&dx1, sizeof(float) * (size_t)(ldx + 4)));
    CU(cudaMalloc((void **)&dy1, sizeof(float) * (size_t)ldy));
    CU(cudaMemcpy(dx, x, sizeof(float) * (size_t)(n * ldx), cudaMemcpyHostToDevice));
    ct_poison(ygot, (size_t)(n * ldy));
    CU(cudaMemcpy(dy, ygot, sizeof(float) * (size_t)(n * ldy), cudaMemcpyHostToDevice));
    mm_call(&dw, mode, kind, &g, dx, ldx, n, dy, ldy);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(ygot, dy, sizeof(float) * (size_t)(n * ldy), cudaMemcpyDeviceToHost));

    /* written exactly where the CPU writes (the CPU leaves poison elsewhere too) */
    int64_t bad_pad = 0, exact = 0, total = 0;
    for (int64_t i = 0; i < n * ldy; i++) {
        if (ct_is_poison(&yref[i]) != ct_is_poison(&ygot[i])) bad_pad++;
        if (!ct_is_poison(&yref[i])) {
            total++;
            exact += memcmp(&yref[i], &ygot[i], 4) == 0;
        }
    }
    /* error over the written columns only (poison in both elsewhere) */
    double num = 0, den = 0;
    for (int64_t i = 0; i < n * ldy; i++) {
        if (ct_is_poison(&yref[i])) continue;
        double d = (double)ygot[i] - yref[i];
        num += d * d;
        den += (double)yref[i] * yref[i];
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num);
    CHECK(bad_pad == 0, "%s kind %d [%lld x %lld] n=%d: %lld outputs written outside / missing", fmt_name(f), kind,
          (long long)rows, (long long)cols, n, (long long)bad_pad);
    CHECK(e < tol, "%s kind %d%s [%lld x %lld] n=%d: normalised error %.3g", fmt_name(f), kind, tc ? " tensor" : "",
          (long long)rows, (long long)cols, n, e);
    if (kind == 2) /* x W performs the CPU's operations in the CPU's order */
        CHECK(exact == total, "%s x W [%lld x %lld] n=%d: %lld of %lld not bit-identical to the CPU", fmt_name(f),
              (long long)rows, (long long)cols, n, (long long)(total - exact), (long long)total);

    /* determinism: each token alone, from a buffer shifted by one float (other alignment) */
    int64_t mism = 0;
    for (int t = 0; t < n; t++) {
        if (n >= 64 && t % 7 != 0 && t != n - 1) continue;
        const int shift = (t & 1) ? 1 : 0;
        CU(cudaMemcpy(dx1 + shift, x + t * ldx, sizeof(float) * (size_t)ldx, cudaMemcpyHostToDevice));
        float *pz = malloc(sizeof(float) * (size_t)ldy);
        ct_poison(pz, (size_t)ldy);
        CU(cudaMemcpy(dy1, pz, sizeof(float) * (size_t)ldy, cudaMemcpyHostToDevice));
        free(pz);
        mm_call(&dw, mode, kind, &g, dx1 + shift, ldx, 1, dy1, ldy);
        CU(cudaMemcpy(yone, dy1, sizeof(float) * (size_t)ldy, cudaMemcpyDeviceToHost));
        if (memcmp(yone, ygot + t * ldy, sizeof(float) * (size_t)ldy) != 0) mism++;
    }
    CHECK(mism == 0, "%s kind %d%s [%lld x %lld] n=%d: %lld tokens differ alone vs in the batch", fmt_name(f), kind,
          tc ? " tensor" : "", (long long)rows, (long long)cols, n, (long long)mism);
    /* a weight the tensor path does not take runs the FP32 path, bit for bit */
    int64_t fallback_diff = 0;
    if (mode == DDT_CUDA_MM_TENSOR && !tc) {
        float *yf = malloc(sizeof(float) * (size_t)(n * ldy));
        ct_poison(yf, (size_t)(n * ldy));
        CU(cudaMemcpy(dy, yf, sizeof(float) * (size_t)(n * ldy), cudaMemcpyHostToDevice));
        mm_call(&dw, DDT_CUDA_MM_FP32, kind, &g, dx, ldx, n, dy, ldy);
        CU(cudaMemcpy(yf, dy, sizeof(float) * (size_t)(n * ldy), cudaMemcpyDeviceToHost));
        fallback_diff = memcmp(yf, ygot, sizeof(float) * (size_t)(n * ldy)) != 0;
        free(yf);
        CHECK(fallback_diff == 0, "%s kind %d: tensor mode fallback differs from the FP32 path", fmt_name(f), kind);
    }
    printf("%-4s %s%s [%4lld x %4lld] n=%2d ldx+%d: err %.2e, exact %lld/%lld, alone==batch %s\n", fmt_name(f),
           kind == 0 ? "xW^T " : kind == 1 ? "grpWT" : kind == 3 ? "grpUA" : "grpXW", tc ? " TC" : "", (long long)rows, (long long)cols, n,
           xpad, e, (long long)exact, (long long)total, mism == 0 ? "yes" : "NO");
    ddt_cuda_qweight_free(&dw);
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    CU(cudaFree(dx1));
    CU(cudaFree(dy1));
    free(x);
    free(yref);
    free(ygot);
    free(yone);
    free_weight(&h);
}

/* x W against the kernel it replaced (test_cuda_qmatmul_ref.cu, kept verbatim)
 * and the CPU: count groups of `rows` weight rows at offset 2 in blocks of rows
 * + 3, x groups at stride rows + 1, y groups at stride cols + 2 (+ 5 padding
 * floats per token), y poisoned; the whole y buffer (padding included) must be
 * the old kernel's bit for bit, and the written part the CPU's. */
static void mt_old_case(int f, int64_t rows, int64_t cols, int32_t count, int n) {
    const ddt_row_groups g = {count, rows + 3, 2, rows, rows + 1, cols + 2};
    const int64_t ldx = count * g.x_stride + 1, ldy = count * g.y_stride + 5;
    const size_t xn = (size_t)(n * ldx), yn = (size_t)(n * ldy);
    hw h = make_weight(f, count * g.w_row_stride, cols);
    float *x = malloc(sizeof(float) * xn), *yref = malloc(sizeof(float) * yn);
    float *ynew = malloc(sizeof(float) * yn), *yold = malloc(sizeof(float) * yn);
    for (size_t i = 0; i < xn; i++) x[i] = frand();
    ct_poison(yref, yn);
    ddt_row_groups cg = g;
    ddt_cpu_matmul_t_grouped(g_pool, &h.w, &cg, x, ldx, n, yref, ldy);
    ddt_qweight dw;
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    float *dx, *dy[2];
    CU(cudaMalloc((void **)&dx, sizeof(float) * xn));
    CU(cudaMemcpy(dx, x, sizeof(float) * xn, cudaMemcpyHostToDevice));
    ct_poison(ynew, yn);
    for (int k = 0; k < 2; k++) {
        CU(cudaMalloc((void **)&dy[k], sizeof(float) * yn));
        CU(cudaMemcpy(dy[k], ynew, sizeof(float) * yn, cudaMemcpyHostToDevice));
    }
    OK(ddt_cuda_matmul_t_grouped(&dw, &g, dx, ldx, n, dy[0], ldy, NULL, &err_));
    CU((cudaError_t)ref_old_matmul_t_grouped(&dw, &g, dx, ldx, n, dy[1], ldy));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(ynew, dy[0], sizeof(float) * yn, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(yold, dy[1], sizeof(float) * yn, cudaMemcpyDeviceToHost));
    int64_t vs_old = 0, vs_cpu = 0;
    for (size_t i = 0; i < yn; i++) {
        vs_old += memcmp(&ynew[i], &yold[i], 4) != 0;
        vs_cpu += memcmp(&ynew[i], &yref[i], 4) != 0; /* poison where the CPU did not write */
    }
    CHECK(vs_old == 0 && vs_cpu == 0, "%s x W %d x [%lld x %lld] n=%d: %lld floats differ from the old kernel, %lld from the CPU",
          fmt_name(f), count, (long long)rows, (long long)cols, n, (long long)vs_old, (long long)vs_cpu);
    ddt_cuda_qweight_free(&dw);
    CU(cudaFree(dx));
    CU(cudaFree(dy[0]));
    CU(cudaFree(dy[1]));
    free(x), free(yref), free(ynew), free(yold);
    free_weight(&h);
}

/* ddt_cuda_qweight_transpose_groups: the transposed copy holds exactly w's group
 * rows transposed (bytes, and FP8 scale blocks), and the tensor-core x W^T over it
 * computes the x W of the CPU (ddt_cpu_matmul_t_grouped) to the tensor path's
 * bound, writing nothing outside the groups.  count groups of R rows at offset off
 * in blocks of stride rows; C columns. */
static void transpose_case(int f, int count, int64_t stride, int64_t off, int64_t R, int64_t C, int n) {
    const int64_t wrows = (count - 1) * stride + off + R + 3;
    hw h = make_weight(f, wrows, C);
    ddt_qweight dw, dt;
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    const ddt_row_groups g = {count, stride, off, R, R + 3, C + 1};
    CHECK(ddt_cuda_qweight_transpose_ok(&dw, &g), "%s transpose of %d x [%lld x %lld]: refused", fmt_name(f), count,
          (long long)R, (long long)C);
    OK(ddt_cuda_qweight_transpose_groups(&dw, &g, &dt, &err_));
    CHECK(dt.rows == count * C && dt.cols == R && dt.format == dw.format && dt.dtype == dw.dtype,
          "%s transpose: shape [%lld x %lld]", fmt_name(f), (long long)dt.rows, (long long)dt.cols);
    const int es = f == 3 ? 1 : f == 0 ? 4 : 2;
    uint8_t *got = malloc((size_t)(count * C * R) * (size_t)es);
    CU(cudaMemcpy(got, dt.data, (size_t)(count * C * R) * (size_t)es, cudaMemcpyDeviceToHost));
    int64_t wrong = 0;
    for (int64_t k = 0; k < count; k++)
        for (int64_t j = 0; j < C; j++)
            for (int64_t i = 0; i < R; i++)
                wrong += memcmp(got + ((k * C + j) * R + i) * es,
                                (const uint8_t *)h.data + ((k * stride + off + i) * C + j) * es, (size_t)es) != 0;
    if (f == 3) { /* the scale grid, block for block */
        const int64_t B = DDT_FP8_BLOCK, sc = (C + B - 1) / B;
        float *gs = malloc(sizeof(float) * (size_t)(count * (C / B) * (R / B)));
        CU(cudaMemcpy(gs, dt.scale_inv, sizeof(float) * (size_t)(count * (C / B) * (R / B)), cudaMemcpyDeviceToHost));
        for (int64_t k = 0; k < count; k++)
            for (int64_t jb = 0; jb < C / B; jb++)
                for (int64_t ib = 0; ib < R / B; ib++)
                    wrong += gs[(k * (C / B) + jb) * (R / B) + ib] !=
                             ((const float *)h.scale)[((k * stride + off) / B + ib) * sc + jb];
        free(gs);
    }
    CHECK(wrong == 0, "%s transpose %d x [%lld x %lld]: %lld elements misplaced", fmt_name(f), count, (long long)R,
          (long long)C, (long long)wrong);
    OK(ddt_cuda_qweight_pack(&dt, &err_));
    /* y = x W per group on the CPU; the same by the transposed weight on the tensor path */
    const int64_t ldx = count * (R + 3) + 1, ldy = count * (C + 1) + 2;
    float *x = malloc(sizeof(float) * (size_t)(n * ldx)), *yref = malloc(sizeof(float) * (size_t)(n * ldy));
    float *ygot = malloc(sizeof(float) * (size_t)(n * ldy));
    for (int64_t i = 0; i < n * ldx; i++) x[i] = frand();
    ct_poison(yref, (size_t)(n * ldy));
    ct_poison(ygot, (size_t)(n * ldy));
    ddt_cpu_matmul_t_grouped(g_pool, &h.w, &g, x, ldx, n, yref, ldy);
    float *dx, *dy;
    CU(cudaMalloc((void **)&dx, sizeof(float) * (size_t)(n * ldx)));
    CU(cudaMalloc((void **)&dy, sizeof(float) * (size_t)(n * ldy)));
    CU(cudaMemcpy(dx, x, sizeof(float) * (size_t)(n * ldx), cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dy, ygot, sizeof(float) * (size_t)(n * ldy), cudaMemcpyHostToDevice));
    const ddt_row_groups gt = {count, C, 0, C, R + 3, C + 1};
    size_t wsb;
    void *ws = mm_workspace(&dt, DDT_CUDA_MM_TENSOR, &gt, n, &wsb);
    OK(ddt_cuda_matmul_grouped_mode(&dt, DDT_CUDA_MM_TENSOR, &gt, dx, ldx, n, dy, ldy, ws, wsb, NULL, &err_));
    CU(cudaDeviceSynchronize());
    CU(cudaFree(ws));
    CU(cudaMemcpy(ygot, dy, sizeof(float) * (size_t)(n * ldy), cudaMemcpyDeviceToHost));
    int64_t bad_pad = 0;
    double num = 0, den = 0;
    for (int64_t i = 0; i < n * ldy; i++) {
        if (ct_is_poison(&yref[i]) != ct_is_poison(&ygot[i])) bad_pad++;
        if (ct_is_poison(&yref[i])) continue;
        const double d = (double)ygot[i] - yref[i];
        num += d * d;
        den += (double)yref[i] * yref[i];
    }
    const double e = den > 0 ? sqrt(num / den) : sqrt(num);
    CHECK(bad_pad == 0 && e < 5e-5, "%s transposed x W^T %d x [%lld x %lld] n=%d: error %.3g, %lld outputs misplaced",
          fmt_name(f), count, (long long)R, (long long)C, n, e, (long long)bad_pad);
    printf("%-4s transpose %d x [%4lld x %4lld] -> TC x W^T n=%2d: err %.2e\n", fmt_name(f), count, (long long)R,
           (long long)C, n, e);
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    free(x), free(yref), free(ygot), free(got);
    ddt_cuda_qweight_free(&dt);
    ddt_cuda_qweight_free(&dw);
    free_weight(&h);
}

/* The tensor path against the kernel it replaced (test_cuda_qmatmul_ref.cu), whole
 * output buffers bit for bit: x W^T of n tokens, plain (through
 * ddt_cuda_matmul_mode) or grouped (3 groups of `rows` rows starting on 16-row
 * tiles, x groups at stride cols + 1), x's row stride cols + xpad and its base
 * shifted by xshift floats (unaligned: the split's scalar loads, the old
 * kernel's 4-byte copies).  Everything in x, y and the workspace that no value
 * comes from is NaN poison.  Then each token alone (n = 1, from a buffer of its
 * own, shifted by t % 2) against its row of the batch. */
static void tc_old_case(int f, int grouped, int64_t rows, int64_t cols, int n, int xpad, int xshift) {
    ddt_row_groups g = {1, 0, 0, rows, 0, 0};
    int64_t wrows = rows;
    if (grouped) {
        const int64_t st = (rows + 23 + 15) / 16 * 16;
        g = (ddt_row_groups){3, st, 16, rows, cols + 1, rows + 2};
        wrows = 3 * st;
    }
    const int64_t ldx = (g.count - 1) * g.x_stride + cols + xpad, ldy = (g.count - 1) * g.y_stride + rows + 3;
    const size_t xn = (size_t)(n * ldx + 2), yn = (size_t)(n * ldy);
    hw h = make_weight(f, wrows, cols);
    float *x = malloc(sizeof(float) * xn), *ynew = malloc(sizeof(float) * yn), *yold = malloc(sizeof(float) * yn);
    float *yone = malloc(sizeof(float) * (size_t)ldy);
    ct_poison(x, xn);
    for (int t = 0; t < n; t++)
        for (int32_t k = 0; k < g.count; k++)
            for (int64_t j = 0; j < cols; j++) x[xshift + t * ldx + k * g.x_stride + j] = frand();
    ddt_qweight dw;
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    OK(ddt_cuda_qweight_pack_stream(&dw, &err_)); /* the old kernel reads the packed copy */
    float *dx, *dy[2], *dx1, *dy1;
    CU(cudaMalloc((void **)&dx, sizeof(float) * xn));
    CU(cudaMalloc((void **)&dx1, sizeof(float) * (size_t)(ldx + 2)));
    CU(cudaMalloc((void **)&dy1, sizeof(float) * (size_t)ldy));
    CU(cudaMemcpy(dx, x, sizeof(float) * xn, cudaMemcpyHostToDevice));
    ct_poison(ynew, yn);
    for (int k = 0; k < 2; k++) {
        CU(cudaMalloc((void **)&dy[k], sizeof(float) * yn));
        CU(cudaMemcpy(dy[k], ynew, sizeof(float) * yn, cudaMemcpyHostToDevice));
    }
    size_t wsb;
    void *ws = mm_workspace(&dw, DDT_CUDA_MM_TENSOR, &g, n, &wsb);
    if (grouped) OK(ddt_cuda_matmul_grouped_mode(&dw, DDT_CUDA_MM_TENSOR, &g, dx + xshift, ldx, n, dy[0], ldy, ws, wsb,
                                                 NULL, &err_));
    else OK(ddt_cuda_matmul_mode(&dw, DDT_CUDA_MM_TENSOR, dx + xshift, ldx, n, dy[0], ldy, ws, wsb, NULL, &err_));
    CU((cudaError_t)ref_old_tc_matmul_grouped(&dw, &g, dx + xshift, ldx, n, dy[1], ldy));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(ynew, dy[0], sizeof(float) * yn, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(yold, dy[1], sizeof(float) * yn, cudaMemcpyDeviceToHost));
    /* bf16 with columns a multiple of 8 now runs wgmma (test_cuda_wgmma_gemm): a
       different summation, so within the split activations' error of the old
       kernel (normalised), not bitwise */
    const int wg = f == 1 && cols % 8 == 0;
    int64_t vs_old = 0, written = 0, nonfinite = 0;
    double num = 0, den = 0;
    for (size_t i = 0; i < yn; i++) {
        if (!wg) vs_old += memcmp(&ynew[i], &yold[i], 4) != 0;
        if (!ct_is_poison(&ynew[i])) written++, nonfinite += !isfinite(ynew[i]);
        if (wg && !ct_is_poison(&yold[i])) {
            const double d = (double)ynew[i] - yold[i];
            num += d * d, den += (double)yold[i] * yold[i];
        }
    }
    if (wg && !(sqrt(num / (den > 0 ? den : 1)) < 5e-5)) vs_old = 1;
    CHECK(vs_old == 0 && written == (int64_t)n * g.count * rows && nonfinite == 0,
          "%s TC %s [%lld x %lld] n=%d ldx+%d shift %d: %lld floats differ from the old kernel, %lld written "
          "(of %lld), %lld not finite",
          fmt_name(f), grouped ? "grouped" : "x W^T", (long long)rows, (long long)cols, n, xpad, xshift,
          (long long)vs_old, (long long)written, (long long)n * g.count * rows, (long long)nonfinite);
    /* batch invariance: token t alone is its row of the batch */
    int64_t mism = 0;
    for (int t = 0; t < n; t++) {
        if (n > 17 && t % 5 != 0 && t != n - 1) continue;
        const int sh = t % 2;
        float *xr = malloc(sizeof(float) * (size_t)(ldx + 2));
        ct_poison(xr, (size_t)(ldx + 2));
        memcpy(xr + sh, x + xshift + t * ldx, sizeof(float) * (size_t)ldx);
        CU(cudaMemcpy(dx1, xr, sizeof(float) * (size_t)(ldx + 2), cudaMemcpyHostToDevice));
        ct_poison(yone, (size_t)ldy);
        CU(cudaMemcpy(dy1, yone, sizeof(float) * (size_t)ldy, cudaMemcpyHostToDevice));
        free(xr);
        size_t wsb1;
        void *ws1 = mm_workspace(&dw, DDT_CUDA_MM_TENSOR, &g, 1, &wsb1);
        OK(ddt_cuda_matmul_grouped_mode(&dw, DDT_CUDA_MM_TENSOR, &g, dx1 + sh, ldx, 1, dy1, ldy, ws1, wsb1, NULL,
                                        &err_));
        CU(cudaMemcpy(yone, dy1, sizeof(float) * (size_t)ldy, cudaMemcpyDeviceToHost));
        CU(cudaFree(ws1));
        if (memcmp(yone, ynew + t * ldy, sizeof(float) * (size_t)ldy) != 0) mism++;
    }
    CHECK(mism == 0, "%s TC %s [%lld x %lld] n=%d: %lld tokens differ alone vs in the batch", fmt_name(f),
          grouped ? "grouped" : "x W^T", (long long)rows, (long long)cols, n, (long long)mism);
    printf("%-4s TC %s [%4lld x %4lld] n=%2d ldx+%d shift %d: == old kernel %s, alone == batch %s\n", fmt_name(f),
           grouped ? "grpWT" : "xW^T ", (long long)rows, (long long)cols, n, xpad, xshift, vs_old ? "NO" : "yes",
           mism ? "NO" : "yes");
    ddt_cuda_qweight_free(&dw);
    CU(cudaFree(ws));
    CU(cudaFree(dx));
    CU(cudaFree(dx1));
    CU(cudaFree(dy[0]));
    CU(cudaFree(dy[1]));
    CU(cudaFree(dy1));
    free(x), free(ynew), free(yold), free(yone);
    free_weight(&h);
}

static void run_case(int f, int kind, int64_t rows, int64_t cols, int n, int xpad) {
    run_case_mode(f, kind, rows, cols, n, xpad, DDT_CUDA_MM_FP32);
}

static void embed_case(int f, int64_t rows, int64_t cols) {
    hw h = make_weight(f, rows, cols);
    const int n = 7;
    int32_t ids[7] = {0, (int32_t)rows - 1, 3, (int32_t)rows, -1, 5, 3};
    const int64_t ldo = cols + 2;
    float *ref = malloc(sizeof(float) * (size_t)(n * ldo)), *got = malloc(sizeof(float) * (size_t)(n * ldo));
    ct_poison(got, (size_t)(n * ldo));
    ddt_qweight dw;
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    int32_t *did;
    float *dout;
    CU(cudaMalloc((void **)&did, sizeof ids));
    CU(cudaMalloc((void **)&dout, sizeof(float) * (size_t)(n * ldo)));
    CU(cudaMemcpy(did, ids, sizeof ids, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dout, got, sizeof(float) * (size_t)(n * ldo), cudaMemcpyHostToDevice));
    OK(ddt_cuda_embed(&dw, did, n, dout, ldo, NULL, &err_));
    CU(cudaMemcpy(got, dout, sizeof(float) * (size_t)(n * ldo), cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (int t = 0; t < n; t++) {
        const int inr = ids[t] >= 0 && ids[t] < rows;
        if (inr) ddt_cpu_dequant(&h.w, ids[t], 0, cols, ref + t * ldo);
        for (int64_t c = 0; c < cols; c++)
            if (inr ? memcmp(&ref[t * ldo + c], &got[t * ldo + c], 4) != 0 : !isnan(got[t * ldo + c])) bad++;
        for (int64_t c = cols; c < ldo; c++) bad += !ct_is_poison(&got[t * ldo + c]);
    }
    CHECK(bad == 0, "embed %s [%lld x %lld]: %lld wrong values", fmt_name(f), (long long)rows, (long long)cols,
          (long long)bad);
    printf("%-4s embed [%4lld x %4lld]: %s\n", fmt_name(f), (long long)rows, (long long)cols, bad ? "FAIL" : "exact");
    ddt_cuda_qweight_free(&dw);
    CU(cudaFree(did));
    CU(cudaFree(dout));
    free(ref);
    free(got);
    free_weight(&h);
}

/* The FP32 path's warp shape (rows x tokens a warp) changes which warp computes
 * an output, never its arithmetic: every shape gives the library's choice bit
 * for bit, grouped (3 groups) with NaN-poisoned padding; a shape outside 1/2/4
 * is refused. */
static void shape_case(int f, int64_t rows, int64_t cols, int n) {
    const ddt_row_groups g = {3, rows + 5, 2, rows, cols + 3, rows + 1};
    const int64_t ldx = 2 * g.x_stride + cols + 1, ldy = 2 * g.y_stride + rows + 2;
    hw h = make_weight(f, 3 * (rows + 5), cols);
    ddt_qweight dw;
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    float *x = malloc(sizeof(float) * (size_t)(n * ldx));
    float *want = malloc(sizeof(float) * (size_t)(n * ldy)), *got = malloc(sizeof(float) * (size_t)(n * ldy));
    for (int64_t i = 0; i < n * ldx; i++) x[i] = frand();
    float *dx, *dy;
    CU(cudaMalloc((void **)&dx, sizeof(float) * (size_t)(n * ldx)));
    CU(cudaMalloc((void **)&dy, sizeof(float) * (size_t)(n * ldy)));
    CU(cudaMemcpy(dx, x, sizeof(float) * (size_t)(n * ldx), cudaMemcpyHostToDevice));
    ct_poison(want, (size_t)(n * ldy));
    CU(cudaMemcpy(dy, want, sizeof(float) * (size_t)(n * ldy), cudaMemcpyHostToDevice));
    OK(ddt_cuda_matmul_grouped(&dw, &g, dx, ldx, n, dy, ldy, NULL, &err_));
    CU(cudaMemcpy(want, dy, sizeof(float) * (size_t)(n * ldy), cudaMemcpyDeviceToHost));
    int64_t written = 0;
    for (int64_t i = 0; i < n * ldy; i++) written += !ct_is_poison(&want[i]);
    CHECK(written == (int64_t)n * 3 * rows, "%s shape case: %lld outputs written, want %lld", fmt_name(f),
          (long long)written, (long long)n * 3 * rows);
    static const int sh[] = {1, 2, 4};
    int diff = 0;
    for (int ri = 0; ri < 3; ri++)
        for (int ti = 0; ti < 3; ti++) {
            ct_poison(got, (size_t)(n * ldy));
            CU(cudaMemcpy(dy, got, sizeof(float) * (size_t)(n * ldy), cudaMemcpyHostToDevice));
            OK(ddt_cuda_matmul_grouped_shape(&dw, DDT_CUDA_MM_FP32, &g, dx, ldx, n, dy, ldy, sh[ri], sh[ti], NULL, 0,
                                             NULL, &err_));
            CU(cudaMemcpy(got, dy, sizeof(float) * (size_t)(n * ldy), cudaMemcpyDeviceToHost));
            if (memcmp(got, want, sizeof(float) * (size_t)(n * ldy)) != 0) {
                diff++;
                CHECK(0, "%s [%lld x %lld] n=%d: warp shape %d x %d differs from the default", fmt_name(f),
                      (long long)rows, (long long)cols, n, sh[ri], sh[ti]);
            }
        }
    ddt_error e2;
    CHECK(ddt_cuda_matmul_grouped_shape(&dw, DDT_CUDA_MM_FP32, &g, dx, ldx, n, dy, ldy, 3, 1, NULL, 0, NULL, &e2) ==
              DDT_ERR_INVALID,
          "warp shape 3 x 1 not refused");
    printf("%-4s warp shapes [%4lld x %4lld] x3 groups n=%2d: all 9 bitwise the default: %s\n", fmt_name(f),
           (long long)rows, (long long)cols, n, diff ? "NO" : "yes");
    ddt_cuda_qweight_free(&dw);
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    free(x);
    free(want);
    free(got);
    free_weight(&h);
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    OK(ddt_cpu_pool_create(4, &g_pool, &err_));
    /* dense / FP8 shapes include odd widths (unaligned rows, partial 128-blocks) */
    static const int64_t dshape[][2] = {{96, 160}, {257, 96}, {129, 224}, {131, 257}, {67, 1031}};
    static const int64_t ishape[][2] = {{96, 160}, {257, 96}, {129, 224}, {35, 1056}};
    static const int ns[] = {1, 3, 17, 64};
    const int nn = quick ? 2 : 4;
    for (int f = 0; f < 5; f++) {
        const int64_t(*sh)[2] = f == 4 ? ishape : dshape;
        const int nsh = f == 4 ? 4 : 5;
        for (int s = 0; s < (quick ? 2 : nsh); s++)
            for (int i = 0; i < nn; i++) {
                run_case(f, 0, sh[s][0], sh[s][1], ns[i], (s + i) % 2 ? 3 : 0);
                if (s < 3) {
                    run_case(f, 1, sh[s][0] / 3 + 1, sh[s][1], ns[i], i % 2);
                    run_case(f, 2, sh[s][0] / 3 + 1, sh[s][1], ns[i], (i + 1) % 2);
                }
            }
        embed_case(f, 37, f == 4 ? 160 : 131);
    }
    /* every FP32 warp shape, bitwise the default: odd rows and columns, token
       counts that leave every remainder of 2 and 4 */
    {
        static const int sns[] = {1, 3, 5, 17, 66};
        for (int f = 0; f < 5; f++)
            for (int i = 0; i < 5; i++) {
                if (quick && i % 2) continue;
                shape_case(f, f == 4 ? 37 : 39, f == 4 ? 96 : 133, sns[i]);
            }
    }
    /* the tensor-core path: BF16, FP8, INT4 (and F32 / F16 falling back) */
    {
        static const int tns[] = {1, 3, 9, 17, 64, 70};
        static const int tfmt[] = {1, 3, 4, 0, 2};
        for (int fi = 0; fi < 5; fi++) {
            const int f = tfmt[fi];
            const int64_t(*sh)[2] = f == 4 ? ishape : dshape;
            const int nsh = fi >= 3 ? 1 : quick ? 2 : (f == 4 ? 4 : 5);
            for (int s = 0; s < nsh; s++)
                for (int i = 0; i < 6; i++) {
                    if (quick && i % 2 == 1) continue; /* n = 1, 9, 64 */
                    if (fi >= 3 && i != 2) continue;
                    run_case_mode(f, 0, sh[s][0], sh[s][1], tns[i], (s + i) % 2 ? 3 : 0, DDT_CUDA_MM_TENSOR);
                    if (s < 3 && i < 5)
                        run_case_mode(f, 1, sh[s][0] / 3 + 1, sh[s][1], tns[i], i % 2, DDT_CUDA_MM_TENSOR);
                    if (s == 0 && (i == 0 || i == 4))
                        run_case_mode(f, 3, sh[s][0] / 3 + 1, sh[s][1], tns[i], i % 2, DDT_CUDA_MM_TENSOR);
                }
        }
    }
    /* long rows at few tokens: every pipeline buffer is reused many times, and the
       last one's n-tile reads past the launch's token rows (run under the sanitizer) */
    {
        static const int lf[] = {1, 3, 4};
        for (int fi = 0; fi < 3; fi++)
            for (int n = 1; n <= 3; n += 2) run_case_mode(lf[fi], 0, 40, 2080, n, 0, DDT_CUDA_MM_TENSOR);
    }
    /* the tensor path (activations split once per product) against the kernel
       that split them in every block: rows off 16; BF16 / FP8 columns off 32 and
       off 4; [40 x 2080] runs k-split clusters of 8 (3 row blocks: [131 x 4100]
       too); n over every n-tile count, odd remainders and two token blocks */
    {
        static const int64_t dsh[][2] = {{37, 200}, {131, 257}, {300, 96}, {40, 2080}, {67, 1031}, {131, 4100}};
        static const int64_t ish[][2] = {{37, 224}, {131, 256}, {300, 96}, {40, 2080}, {35, 1056}, {131, 4096}};
        static const int tns[] = {1, 2, 5, 16, 17, 33, 64, 70};
        static const int tf[] = {1, 3, 4};
        for (int fi = 0; fi < 3; fi++) {
            const int f = tf[fi];
            const int64_t(*sh)[2] = f == 4 ? ish : dsh;
            for (int s = 0; s < (quick ? 2 : 6); s++)
                for (int i = 0; i < 8; i++) {
                    if (quick && i != 0 && i != 4 && i != 6) continue; /* n = 1, 17, 64 */
                    if (s == 5 && i != 0 && i != 6) continue;          /* the big shape at n = 1, 64 */
                    tc_old_case(f, 0, sh[s][0], sh[s][1], tns[i], (s + i) % 2 ? 3 : 0, i % 3 == 1);
                    if (s < 2 && (!quick || s == 0))
                        tc_old_case(f, 1, sh[s][0] / 3 + 1, sh[s][1], tns[i], i % 2 ? 0 : 3, i % 3 == 2);
                }
        }
        printf("tensor path: == the per-block split kernel (bitwise; bf16 on wgmma within 5e-5) on %s\n",
               g_failures ? "NOT all shapes" : "all shapes");
    }
    /* x W against the old kernel: the MLA shapes (rank x nope and back), odd
       rows and columns, rows past one staged x pass (256), 1 .. 16 groups, every
       token-block remainder */
    {
        static const int64_t msh[][2] = {{32, 64}, {64, 32}, {128, 512}, {33, 70}, {300, 64}, {7, 5}};
        static const int mgr[] = {1, 4, 16, 3, 2, 5};
        static const int mns[] = {1, 2, 3, 5, 17, 65, 70};
        for (int f = 0; f < 5; f++)
            for (int s = 0; s < 6; s++)
                for (int i = 0; i < 7; i++) {
                    if (quick && (i % 3 != 0 || s == 2)) continue;
                    if (f == 4 && msh[s][1] % 8 != 0 && i > 0) continue; /* INT4: one partial-word case */
                    mt_old_case(f, msh[s][0], msh[s][1], mgr[(s + i) % 6], mns[i]);
                }
        printf("x W: bitwise == the old kernel and the CPU on %s\n", g_failures ? "NOT all shapes" : "all shapes");
    }
    /* the per-group transpose that puts MLA's x W_UK on the tensor cores: BF16 at
       odd sizes, the K2.6 shape's rank x nope, FP8 on whole 128-blocks; then what
       it refuses */
    transpose_case(1, 3, 45, 7, 38, 96, 3);
    transpose_case(1, 2, 256, 0, 128, 512, quick ? 1 : 17);
    transpose_case(3, 2, 256, 0, 128, 512, 5);
    if (!quick) transpose_case(0, 3, 40, 5, 33, 70, 2); /* F32: copied; the tensor mode then takes the FP32 path */
    {
        hw h = make_weight(3, 300, 256);
        ddt_qweight dw, dt;
        OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
        const ddt_row_groups g = {2, 100, 0, 64, 64, 256}; /* FP8 groups across 128-blocks */
        ddt_error e2;
        CHECK(!ddt_cuda_qweight_transpose_ok(&dw, &g) &&
                  ddt_cuda_qweight_transpose_groups(&dw, &g, &dt, &e2) == DDT_ERR_UNSUPPORTED && dt.data == NULL,
              "FP8 transpose across blocks: not refused");
        ddt_cuda_qweight_free(&dw);
        free_weight(&h);
    }
    /* a format the GPU kernels cannot take is refused with a message, not run */
    {
        hw h = make_weight(4, 8, 40); /* INT4 with 40 columns: not a multiple of 32 */
        ddt_qweight dw;
        OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
        float *dx, *dy;
        CU(cudaMalloc((void **)&dx, 64 * 4));
        CU(cudaMalloc((void **)&dy, 64 * 4));
        CU(cudaMemset(dx, 0, 64 * 4));
        ddt_error e2;
        ddt_status st = ddt_cuda_matmul(&dw, dx, 40, 1, dy, 8, NULL, &e2);
        CHECK(st == DDT_ERR_UNSUPPORTED, "INT4 with 40 columns: status %d", (int)st);
        ddt_cuda_qweight_free(&dw);
        /* tensor mode on a packed-stream weight that was never packed: an error, not a
           silent slow path (bf16 of 60 columns: not the wgmma path's, which reads the
           row-major data and needs no packed copy) */
        hw hb = make_weight(1, 16, 60);
        OK(ddt_cuda_qweight_upload(&hb.w, &dw, &err_));
        st = ddt_cuda_matmul_mode(&dw, DDT_CUDA_MM_TENSOR, dx, 64, 1, dy, 16, NULL, 0, NULL, &e2);
        CHECK(st == DDT_ERR_INVALID && strstr(e2.msg, "packed"), "unpacked bf16 in tensor mode: status %d (%s)",
              (int)st, e2.msg);
        /* packed: the tensor path needs its workspace (the FP32 path none) */
        OK(ddt_cuda_qweight_pack(&dw, &err_));
        const size_t need = ddt_cuda_matmul_workspace_bytes(64, 1, 1);
        CHECK(need == 256, "workspace of one token of 64 columns: %zu bytes, not 2 units of 128", need);
        uint8_t *ws;
        CU(cudaMalloc((void **)&ws, need + 16));
        st = ddt_cuda_matmul_mode(&dw, DDT_CUDA_MM_TENSOR, dx, 64, 1, dy, 16, NULL, 0, NULL, &e2);
        CHECK(st == DDT_ERR_RANGE, "tensor mode without a workspace: status %d", (int)st);
        st = ddt_cuda_matmul_mode(&dw, DDT_CUDA_MM_TENSOR, dx, 64, 1, dy, 16, ws, need - 16, NULL, &e2);
        CHECK(st == DDT_ERR_RANGE, "tensor mode with a short workspace: status %d", (int)st);
        st = ddt_cuda_matmul_mode(&dw, DDT_CUDA_MM_TENSOR, dx, 64, 1, dy, 16, ws + 4, need, NULL, &e2);
        CHECK(st == DDT_ERR_INVALID, "tensor mode with a misaligned workspace: status %d", (int)st);
        OK(ddt_cuda_matmul_mode(&dw, DDT_CUDA_MM_FP32, dx, 64, 1, dy, 16, NULL, 0, NULL, &err_));
        CU(cudaDeviceSynchronize());
        CU(cudaFree(ws));
        ddt_cuda_qweight_free(&dw);
        free_weight(&hb);
        CU(cudaFree(dx));
        CU(cudaFree(dy));
        free_weight(&h);
    }
    ddt_cpu_pool_destroy(g_pool);
    return ct_report("test_cuda_qmatmul");
}
