/*
 * test_cuda_matmul_silu.c — ddt_cuda_matmul_silu(_mode) (qmatmul_cuda.h), a gated
 * MLP's SiLU and down projection in one launch, against the two launches it
 * replaces and the CPU, for every weight format (F32, BF16, F16, FP8 block 128,
 * INT4 group 32):
 *   - bitwise: y (the whole buffer, padding included) equals ddt_cuda_silu_mul on
 *     a copy of the input then ddt_cuda_matmul_mode, for n = 1, 2, 3, 5, 16, 17,
 *     65 (every token-block shape of both kernels: the fused one takes other
 *     blocks at n = 2), odd row counts (spare rows of a 4-row warp), K not a
 *     multiple of 8 where the format allows (INT4 needs multiples of 32), with
 *     gate | up side by side in one buffer (the drafter's and the target's
 *     layout), apart with 16-byte aligned rows (float4 loads) and apart off by
 *     one float (element loads).  Each gate / up row's padding past K is NaN, and
 *     y's padding must stay poisoned;
 *   - the CPU (ddt_cpu_silu_mul then ddt_cpu_matmul): normalised error < 1e-5
 *     (5e-5 on the tensor-core path, the bound of test_cuda_qmatmul.c), and no
 *     NaN, so a load past K (NaN in both GPU paths alike) cannot pass;
 *   - the FP32 path leaves the gate rows as they were; in tensor mode an eligible
 *     weight (BF16, FP8, INT4; packed) takes the two launches, the gate rows
 *     overwritten bitwise as ddt_cuda_silu_mul writes them, while F32 / F16 keep
 *     the fused FP32 path;
 *   - refusals: INT4 with 40 columns, no up rows, n = 0, an eligible weight in
 *     tensor mode that was never packed, or packed with a missing, short or
 *     misaligned workspace (the gate rows left as they were).
 * Gate values span silu's range: uniform in [-4, 4) plus -100 (exp overflows to
 * inf: -0 out), 100 and -0.
 * --quick: fewer shapes, token counts and layouts (for compute-sanitizer).
 * Needs the CPU backend: link with src/core, src/io, src/backend/cpu.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/nn.h"
#include "backend/cpu/qmatmul.h"
#include "backend/cuda/nn_cuda.h"
#include "backend/cuda/qmatmul_cuda.h"
#include "cuda_test.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) { return ct_xorshift(&g_rng, 16); }
static float frand(void) { return ct_frand(&g_rng); }

static ddt_cpu_pool *g_pool;

static const char *fmt_name(int f) {
    static const char *n[] = {"F32", "BF16", "F16", "FP8", "INT4"};
    return n[f];
}

/* the tensor-core path takes it (ddt_cuda_qweight_tc_eligible for these shapes) */
static int tc_format(int f) { return f == 1 || f == 3 || f == 4; }

/* A host weight of format f with small random values (cuda_test.h). */
typedef ct_weight hw;
static const ct_weight_values k_values = {0.1f, 15, 0.005f, 0.02f};
static hw make_weight(int f, int64_t rows, int64_t cols) { return ct_make_weight(&g_rng, f, rows, cols, &k_values); }

static int64_t up4(int64_t v) { return (v + 3) / 4 * 4; }

/* A gate value: mostly uniform in [-4, 4), now and then -100, 100 or -0. */
static float gate_value(void) {
    const uint32_t r = rnd() % 64;
    if (r == 0) return -100.0f;
    if (r == 1) return 100.0f;
    if (r == 2) return -0.0f;
    return 4.0f * frand();
}

static const char *layout_name(int layout) {
    static const char *n[] = {"gate|up", "apart", "apart+1"};
    return n[layout];
}

/*
 * One case.  layout 0: gate | up side by side in rows of ld = up4(2K + 3) (up at
 * column K: float4 loads when K % 4 == 0); 1: gate and up apart, rows of
 * up4(K + 1) and up4(K + 6) floats (float4 loads); 2: apart, both one float off
 * 16 bytes with rows of K + 1 and K + 2 (element loads).  Everything of the input
 * buffer outside the gate and up values is NaN.
 */
static void run_case(int f, int64_t rows, int64_t K, int n, int layout, ddt_cuda_mm_mode mode) {
    int64_t og, ou, ldg, ldu;
    if (layout == 0) {
        ldg = ldu = up4(2 * K + 3);
        og = 0, ou = K;
    } else if (layout == 1) {
        ldg = up4(K + 1), ldu = up4(K + 6);
        og = 0, ou = up4((int64_t)n * ldg);
    } else {
        ldg = K + 1, ldu = K + 2;
        og = 1, ou = 1 + up4((int64_t)n * ldg) + 4;
    }
    const size_t nb = (size_t)(ou + (int64_t)n * ldu + 4);
    const int64_t ldy = rows + 3;
    const size_t ny = (size_t)(n * ldy);
    const int tc = mode == DDT_CUDA_MM_TENSOR && tc_format(f);
    const double tol = tc ? 5e-5 : 1e-5;

    hw h = make_weight(f, rows, K);
    float *in = malloc(sizeof(float) * nb), *cpu_in = malloc(sizeof(float) * nb);
    ct_poison(in, nb);
    for (int t = 0; t < n; t++)
        for (int64_t j = 0; j < K; j++) {
            in[og + t * ldg + j] = gate_value();
            in[ou + t * ldu + j] = frand();
        }
    memcpy(cpu_in, in, sizeof(float) * nb);
    float *ycpu = malloc(sizeof(float) * ny), *yf = malloc(sizeof(float) * ny), *yr = malloc(sizeof(float) * ny);
    ct_poison(ycpu, ny);
    ct_poison(yf, ny);
    ddt_cpu_silu_mul(g_pool, cpu_in + og, ldg, cpu_in + ou, ldu, n, K);
    ddt_cpu_matmul(g_pool, &h.w, cpu_in + og, ldg, n, ycpu, ldy);

    ddt_qweight dw;
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    if (mode == DDT_CUDA_MM_TENSOR) OK(ddt_cuda_qweight_pack(&dw, &err_));
    float *db[2], *dy[2];
    for (int k = 0; k < 2; k++) {
        CU(cudaMalloc((void **)&db[k], sizeof(float) * nb));
        CU(cudaMalloc((void **)&dy[k], sizeof(float) * ny));
        CU(cudaMemcpy(db[k], in, sizeof(float) * nb, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dy[k], yf, sizeof(float) * ny, cudaMemcpyHostToDevice));
    }
    /* tensor mode: the split activations' workspace, exactly the bytes n tokens
       need (so the sanitizer sees any access past it), NaN-poisoned; F32 / F16
       take the FP32 path and never read it.  Both products below share it. */
    void *ws = NULL;
    size_t wsb = 0;
    if (mode == DDT_CUDA_MM_TENSOR) {
        wsb = ddt_cuda_matmul_workspace_bytes(K, 1, n);
        CU(cudaMalloc(&ws, wsb));
        CU(cudaMemset(ws, 0xFF, wsb));
    }
    /* fused into dy[0] from db[0]; the two launches into dy[1] from db[1] */
    if (mode == DDT_CUDA_MM_FP32 && layout != 1)
        OK(ddt_cuda_matmul_silu(&dw, db[0] + og, ldg, db[0] + ou, ldu, n, dy[0], ldy, NULL, &err_));
    else
        OK(ddt_cuda_matmul_silu_mode(&dw, mode, db[0] + og, ldg, db[0] + ou, ldu, n, dy[0], ldy, ws, wsb, NULL,
                                     &err_));
    OK(ddt_cuda_silu_mul(db[1] + og, ldg, db[1] + ou, ldu, n, (int32_t)K, NULL, &err_));
    OK(ddt_cuda_matmul_mode(&dw, mode, db[1] + og, ldg, n, dy[1], ldy, ws, wsb, NULL, &err_));
    CU(cudaDeviceSynchronize());
    if (ws) CU(cudaFree(ws));
    CU(cudaMemcpy(yf, dy[0], sizeof(float) * ny, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(yr, dy[1], sizeof(float) * ny, cudaMemcpyDeviceToHost));
    float *bf = malloc(sizeof(float) * nb), *br = malloc(sizeof(float) * nb);
    CU(cudaMemcpy(bf, db[0], sizeof(float) * nb, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(br, db[1], sizeof(float) * nb, cudaMemcpyDeviceToHost));

    const int bitwise = memcmp(yf, yr, sizeof(float) * ny) == 0;
    /* the fused launch (FP32 path, n <= DDT_CUDA_SILU_FUSE_MAX_N) writes nothing
       into its input; the two launches leave silu_mul's in place result */
    const int two = tc || n > DDT_CUDA_SILU_FUSE_MAX_N;
    const int input_ok = memcmp(bf, two ? br : in, sizeof(float) * nb) == 0;
    int64_t bad_pad = 0, nan_out = 0;
    double num = 0, den = 0;
    for (int t = 0; t < n; t++)
        for (int64_t o = 0; o < ldy; o++) {
            const float *g = &yf[t * ldy + o];
            if (o >= rows) {
                bad_pad += !ct_is_poison(g);
                continue;
            }
            if (isnan(*g)) {
                nan_out++;
                continue;
            }
            const double c = ycpu[t * ldy + o], d = (double)*g - c;
            num += d * d;
            den += c * c;
        }
    const double e = den > 0 ? sqrt(num / den) : sqrt(num);
    CHECK(bitwise, "%s %s [%lld x %lld] n=%d %s: not bitwise silu_mul + matmul", fmt_name(f), tc ? "TC" : "fp32",
          (long long)rows, (long long)K, n, layout_name(layout));
    CHECK(input_ok, "%s %s [%lld x %lld] n=%d %s: the input buffer %s", fmt_name(f), tc ? "TC" : "fp32",
          (long long)rows, (long long)K, n, layout_name(layout),
          two ? "differs from silu_mul's in place result" : "was written");
    CHECK(bad_pad == 0 && nan_out == 0 && e < tol,
          "%s %s [%lld x %lld] n=%d %s: %lld padding written, %lld NaN, normalised error %.3g vs the CPU", fmt_name(f),
          tc ? "TC" : "fp32", (long long)rows, (long long)K, n, layout_name(layout), (long long)bad_pad,
          (long long)nan_out, e);
    printf("%-4s %s [%4lld x %4lld] n=%2d %-7s: %s, err %.2e\n", fmt_name(f), tc ? "TC  " : "fp32", (long long)rows,
           (long long)K, n, layout_name(layout), bitwise ? "bitwise" : "DIFFERENT", e);

    ddt_cuda_qweight_free(&dw);
    for (int k = 0; k < 2; k++) {
        CU(cudaFree(db[k]));
        CU(cudaFree(dy[k]));
    }
    free(in), free(cpu_in), free(ycpu), free(yf), free(yr), free(bf), free(br);
    ct_free_weight(&h);
}

/* What the launcher refuses: a status, no launch. */
static void refusals(void) {
    float *dx, *dy;
    CU(cudaMalloc((void **)&dx, 256 * sizeof(float)));
    CU(cudaMalloc((void **)&dy, 256 * sizeof(float)));
    ddt_error e;
    hw h = make_weight(4, 8, 40); /* INT4 with 40 columns: not a multiple of 32 */
    ddt_qweight dw;
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    ddt_status st = ddt_cuda_matmul_silu(&dw, dx, 80, dx + 40, 80, 1, dy, 8, NULL, &e);
    CHECK(st == DDT_ERR_UNSUPPORTED, "INT4 with 40 columns: status %d", (int)st);
    ddt_cuda_qweight_free(&dw);
    ct_free_weight(&h);
    h = make_weight(1, 16, 64);
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    st = ddt_cuda_matmul_silu(&dw, dx, 128, NULL, 128, 1, dy, 16, NULL, &e);
    CHECK(st == DDT_ERR_INVALID, "no up rows: status %d", (int)st);
    st = ddt_cuda_matmul_silu(&dw, dx, 128, dx + 64, 128, 0, dy, 16, NULL, &e);
    CHECK(st == DDT_ERR_INVALID, "n = 0: status %d", (int)st);
    ddt_cuda_qweight_free(&dw);
    ct_free_weight(&h);
    h = make_weight(1, 16, 60); /* 60 columns: the packed stream's (wgmma needs a multiple of 8, no packing) */
    OK(ddt_cuda_qweight_upload(&h.w, &dw, &err_));
    st = ddt_cuda_matmul_silu_mode(&dw, DDT_CUDA_MM_TENSOR, dx, 128, dx + 64, 128, 1, dy, 16, NULL, 0, NULL, &e);
    CHECK(st == DDT_ERR_INVALID && strstr(e.msg, "packed"), "unpacked bf16 in tensor mode: status %d (%s)", (int)st,
          e.msg);
    /* packed: the tensor path needs its workspace, refused before the gate rows
       are overwritten */
    OK(ddt_cuda_qweight_pack(&dw, &err_));
    {
        float gate0[64], gate1[64];
        for (int j = 0; j < 64; j++) gate0[j] = (float)j - 31.5f;
        CU(cudaMemcpy(dx, gate0, sizeof gate0, cudaMemcpyHostToDevice));
        const size_t need = ddt_cuda_matmul_workspace_bytes(60, 1, 1);
        uint8_t *ws;
        CU(cudaMalloc((void **)&ws, need + 16));
        st = ddt_cuda_matmul_silu_mode(&dw, DDT_CUDA_MM_TENSOR, dx, 128, dx + 64, 128, 1, dy, 16, NULL, 0, NULL, &e);
        CHECK(st == DDT_ERR_RANGE, "tensor mode without a workspace: status %d", (int)st);
        st = ddt_cuda_matmul_silu_mode(&dw, DDT_CUDA_MM_TENSOR, dx, 128, dx + 64, 128, 1, dy, 16, ws, need - 16, NULL,
                                       &e);
        CHECK(st == DDT_ERR_RANGE, "tensor mode with a short workspace: status %d", (int)st);
        st = ddt_cuda_matmul_silu_mode(&dw, DDT_CUDA_MM_TENSOR, dx, 128, dx + 64, 128, 1, dy, 16, ws + 4, need, NULL,
                                       &e);
        CHECK(st == DDT_ERR_INVALID, "tensor mode with a misaligned workspace: status %d", (int)st);
        CU(cudaDeviceSynchronize());
        CU(cudaMemcpy(gate1, dx, sizeof gate1, cudaMemcpyDeviceToHost));
        CHECK(memcmp(gate0, gate1, sizeof gate0) == 0, "a refused tensor-mode call overwrote the gate rows");
        CU(cudaFree(ws));
    }
    ddt_cuda_qweight_free(&dw);
    ct_free_weight(&h);
    CU(cudaFree(dx));
    CU(cudaFree(dy));
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    OK(ddt_cpu_pool_create(4, &g_pool, &err_));
    /* rows odd (spare rows in the last 4-row warp); K not a multiple of 8 for the
       dense formats and FP8 (partial chunks, partial 128-blocks), multiples of 32
       for INT4; one K % 4 == 0 shape per format so gate | up takes float4 loads */
    static const int64_t dshape[][2] = {{37, 77}, {131, 1031}, {5, 13}, {33, 100}};
    static const int64_t fshape[][2] = {{37, 77}, {131, 300}, {5, 13}, {33, 100}};
    static const int64_t ishape[][2] = {{37, 96}, {131, 1056}, {5, 32}, {33, 160}};
    static const int ns[] = {1, 2, 3, 5, 16, 17, 65};
    for (int f = 0; f < 5; f++) {
        const int64_t(*sh)[2] = f == 4 ? ishape : f == 3 ? fshape : dshape;
        for (int s = 0; s < 4; s++)
            for (int i = 0; i < 7; i++)
                for (int layout = 0; layout < 3; layout++) {
                    if (quick && (s == 1 || (i != 0 && i != 1 && i != 5) || layout == 1)) continue;
                    run_case(f, sh[s][0], sh[s][1], ns[i], layout, DDT_CUDA_MM_FP32);
                }
        /* tensor mode: the two launches for BF16 / FP8 / INT4, the fused FP32 path for F32 / F16 */
        for (int s = 0; s < 4; s++)
            for (int i = 0; i < 7; i += 3) {
                if (quick && s != 3) continue;
                run_case(f, sh[s][0], sh[s][1], ns[i], (s + i) % 3, DDT_CUDA_MM_TENSOR);
            }
    }
    refusals();
    ddt_cpu_pool_destroy(g_pool);
    return ct_report("test_cuda_matmul_silu");
}
