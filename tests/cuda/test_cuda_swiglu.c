/*
 * test_cuda_swiglu.c — ddt_cuda_matmul_swiglu (qmatmul_cuda.h): a gated MLP's
 * gate and up, their rows interleaved (ddt_cuda_qweight_interleave_rows), as one
 * product that writes silu(gate) * up, optionally after plain rows (a router's),
 * against what it replaces: ddt_cuda_matmul over the rows stacked as they are
 * ([plain; gate; up], ddt_cuda_qweight_concat_rows) then ddt_cuda_silu_mul.
 *   - bitwise, for F32, BF16, F16 and INT4 group 32, odd pair counts, K not a
 *     multiple of 8 where the format allows, 0 / 6 / 8 plain rows, n = 1, 2, 3,
 *     16, 17, 65, the chosen warp shape and every forced one (2 or 4 rows x 1, 2
 *     or 4 tokens): the plain columns equal the product's, column pair_from + i
 *     equals silu_mul of pair i; y's padding columns stay NaN-poisoned;
 *   - the CPU (ddt_cpu_matmul, ddt_cpu_silu_mul): normalised error < 1e-5, no NaN;
 *   - the interleaved weight's rows are a's and b's in turn (read back bytes);
 *   - refusals: FP8 does not interleave (ddt_cuda_qweight_interleave_ok false,
 *     DDT_ERR_UNSUPPORTED), nor do weights of other shapes or formats; an odd
 *     pair_from, an odd number of rows after it, a 1-row warp, a row stride too
 *     short for the output columns.
 * Gate values span silu's range (weights * inputs of both signs; large ones come
 * from F16's exponents).
 * --quick: fewer shapes and token counts (for compute-sanitizer).
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

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { return ct_frand(&g_rng); }

static ddt_cpu_pool *g_pool;

static const char *fmt_name(int f) {
    static const char *n[] = {"F32", "BF16", "F16", "FP8", "INT4"};
    return n[f];
}

static const ct_weight_values k_values = {0.3f, 17, 0.005f, 0.05f};

/* The host rows [a; b] of two weights of one shape and format (the stacking the
 * CPU reference multiplies by): row-major data, per-row INT4 scales. */
static ct_weight host_stack(int f, const ct_weight *a, const ct_weight *b) {
    ct_weight h;
    memset(&h, 0, sizeof h);
    h.w = a->w;
    h.w.rows = a->w.rows + b->w.rows;
    const int64_t cols = a->w.cols;
    const size_t rb = f == 0 ? (size_t)cols * 4 : f == 4 ? (size_t)((cols + 7) / 8) * 4 : (size_t)cols * 2;
    h.data = malloc(rb * (size_t)h.w.rows);
    memcpy(h.data, a->data, rb * (size_t)a->w.rows);
    memcpy((uint8_t *)h.data + rb * (size_t)a->w.rows, b->data, rb * (size_t)b->w.rows);
    h.w.data = h.data;
    if (f == 4) {
        const size_t sr = (size_t)((cols + 31) / 32) * 2;
        h.scale = malloc(sr * (size_t)h.w.rows);
        memcpy(h.scale, a->scale, sr * (size_t)a->w.rows);
        memcpy((uint8_t *)h.scale + sr * (size_t)a->w.rows, b->scale, sr * (size_t)b->w.rows);
        h.w.scale = h.scale;
    }
    return h;
}

/* One case: P plain rows, I (gate, up) pairs, K columns, n tokens, warp shape
 * (wr, wt) forced or (0, 0). */
static void run_case(int f, int64_t P, int64_t I, int64_t K, int n, int wr, int wt) {
    ct_weight hp = ct_make_weight(&g_rng, f, P > 0 ? P : 1, K, &k_values);
    ct_weight hg = ct_make_weight(&g_rng, f, I, K, &k_values);
    ct_weight hu = ct_make_weight(&g_rng, f, I, K, &k_values);
    /* device: paired = [plain; interleave(gate, up)], stacked = [plain; gate; up] */
    ddt_qweight dp, dg, du, dpair, dpaired, dstack;
    memset(&dp, 0, sizeof dp);
    OK(ddt_cuda_qweight_upload(&hg.w, &dg, &err_));
    OK(ddt_cuda_qweight_upload(&hu.w, &du, &err_));
    CHECK(ddt_cuda_qweight_interleave_ok(&dg, &du), "%s: gate and up do not interleave", fmt_name(f));
    OK(ddt_cuda_qweight_interleave_rows(&dg, &du, &dpair, &err_));
    if (P > 0) {
        OK(ddt_cuda_qweight_upload(&hp.w, &dp, &err_));
        const ddt_qweight *pp[2] = {&dp, &dpair}, *ps[3] = {&dp, &dg, &du};
        OK(ddt_cuda_qweight_concat_rows(pp, 2, &dpaired, &err_));
        OK(ddt_cuda_qweight_concat_rows(ps, 3, &dstack, &err_));
    } else {
        const ddt_qweight *pp[1] = {&dpair}, *ps[2] = {&dg, &du};
        OK(ddt_cuda_qweight_concat_rows(pp, 1, &dpaired, &err_));
        OK(ddt_cuda_qweight_concat_rows(ps, 2, &dstack, &err_));
    }
    /* the interleaving itself: row 2i of the pair weight is gate row i, 2i + 1 up row i */
    if (n == 1 && wr == 0) {
        const size_t rb = f == 0 ? (size_t)K * 4 : f == 4 ? (size_t)((K + 7) / 8) * 4 : (size_t)K * 2;
        uint8_t *back = malloc(rb * 2 * (size_t)I);
        CU(cudaMemcpy(back, dpair.data, rb * 2 * (size_t)I, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int64_t i = 0; i < I; i++) {
            bad += memcmp(back + rb * (size_t)(2 * i), (const uint8_t *)hg.data + rb * (size_t)i, rb) != 0;
            bad += memcmp(back + rb * (size_t)(2 * i + 1), (const uint8_t *)hu.data + rb * (size_t)i, rb) != 0;
        }
        CHECK(bad == 0, "%s [%lld pairs x %lld]: %d interleaved rows are not gate / up rows", fmt_name(f),
              (long long)I, (long long)K, bad);
        free(back);
    }

    const int64_t ldx = K + 3, out_cols = P + I, ldy = out_cols + 5, ldz = P + 2 * I + 2;
    const size_t nx = (size_t)n * (size_t)ldx, ny = (size_t)n * (size_t)ldy, nz = (size_t)n * (size_t)ldz;
    float *x = malloc(sizeof(float) * nx), *y = malloc(sizeof(float) * ny), *z = malloc(sizeof(float) * nz);
    ct_poison(x, nx); /* padding past K: a load past it shows as NaN */
    for (int t = 0; t < n; t++)
        for (int64_t j = 0; j < K; j++) x[(size_t)t * ldx + j] = 2.0f * frand();
    ct_poison(y, ny);
    ct_poison(z, nz);
    float *dx = ct_dev_copy(x, sizeof(float) * nx), *dy = ct_dev_copy(y, sizeof(float) * ny);
    float *dz = ct_dev_copy(z, sizeof(float) * nz);
    OK(ddt_cuda_matmul_swiglu_shape(&dpaired, P, dx, ldx, n, dy, ldy, wr, wt, NULL, &err_));
    OK(ddt_cuda_matmul(&dstack, dx, ldx, n, dz, ldz, NULL, &err_));
    OK(ddt_cuda_silu_mul(dz + P, ldz, dz + P + I, ldz, n, (int32_t)I, NULL, &err_));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(y, dy, sizeof(float) * ny, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(z, dz, sizeof(float) * nz, cudaMemcpyDeviceToHost));

    /* CPU: [plain; gate; up] then silu_mul */
    ct_weight hs = P > 0 ? host_stack(f, &hp, &hg) : hg;
    ct_weight hall = host_stack(f, &hs, &hu);
    float *c = malloc(sizeof(float) * nz);
    ddt_cpu_matmul(g_pool, &hall.w, x, ldx, n, c, ldz);
    ddt_cpu_silu_mul(g_pool, c + P, ldz, c + P + I, ldz, n, I);

    int64_t differ = 0, bad_pad = 0, nan_out = 0;
    double num = 0, den = 0;
    for (int t = 0; t < n; t++)
        for (int64_t o = 0; o < ldy; o++) {
            const float *g = &y[(size_t)t * ldy + o];
            if (o >= out_cols) {
                bad_pad += !ct_is_poison(g);
                continue;
            }
            const size_t zi = (size_t)t * ldz + o; /* plain: the same column; pair i: gate column P + i */
            differ += memcmp(g, &z[zi], sizeof(float)) != 0;
            if (isnan(*g)) {
                nan_out++;
                continue;
            }
            const double d = (double)*g - c[zi];
            num += d * d;
            den += (double)c[zi] * c[zi];
        }
    const double e = den > 0 ? sqrt(num / den) : sqrt(num);
    CHECK(differ == 0, "%s P=%lld pairs=%lld K=%lld n=%d shape %dx%d: %lld outputs not bitwise matmul + silu_mul",
          fmt_name(f), (long long)P, (long long)I, (long long)K, n, wr, wt, (long long)differ);
    CHECK(bad_pad == 0 && nan_out == 0 && e < 1e-5,
          "%s P=%lld pairs=%lld K=%lld n=%d shape %dx%d: %lld padding written, %lld NaN, normalised error %.3g",
          fmt_name(f), (long long)P, (long long)I, (long long)K, n, wr, wt, (long long)bad_pad, (long long)nan_out, e);
    if (wr == 0)
        printf("%-4s plain %lld pairs %4lld K %4lld n=%2d: %s, err vs CPU %.2e\n", fmt_name(f), (long long)P,
               (long long)I, (long long)K, n, differ ? "DIFFERENT" : "bitwise", e);

    ct_free_weight(&hall);
    if (P > 0) ct_free_weight(&hs);
    free(x), free(y), free(z), free(c);
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    CU(cudaFree(dz));
    ddt_qweight *dw[] = {&dp, &dg, &du, &dpair, &dpaired, &dstack};
    for (size_t i = 0; i < sizeof dw / sizeof dw[0]; i++)
        if (dw[i]->data) ddt_cuda_qweight_free(dw[i]);
    ct_free_weight(&hp);
    ct_free_weight(&hg);
    ct_free_weight(&hu);
}

/* What the loader and the launcher refuse: a status, nothing written. */
static void refusals(void) {
    ct_weight a = ct_make_weight(&g_rng, 1, 10, 64, &k_values), b = ct_make_weight(&g_rng, 1, 10, 64, &k_values);
    ct_weight b9 = ct_make_weight(&g_rng, 1, 9, 64, &k_values), i4 = ct_make_weight(&g_rng, 4, 10, 64, &k_values);
    ct_weight f8a = ct_make_weight(&g_rng, 3, 10, 64, &k_values), f8b = ct_make_weight(&g_rng, 3, 10, 64, &k_values);
    ddt_qweight da, db, db9, di4, df8a, df8b, out;
    OK(ddt_cuda_qweight_upload(&a.w, &da, &err_));
    OK(ddt_cuda_qweight_upload(&b.w, &db, &err_));
    OK(ddt_cuda_qweight_upload(&b9.w, &db9, &err_));
    OK(ddt_cuda_qweight_upload(&i4.w, &di4, &err_));
    OK(ddt_cuda_qweight_upload(&f8a.w, &df8a, &err_));
    OK(ddt_cuda_qweight_upload(&f8b.w, &df8b, &err_));
    ddt_error e;
    CHECK(!ddt_cuda_qweight_interleave_ok(&df8a, &df8b) &&
              ddt_cuda_qweight_interleave_rows(&df8a, &df8b, &out, &e) == DDT_ERR_UNSUPPORTED && !out.data,
          "FP8 interleaved");
    CHECK(!ddt_cuda_qweight_interleave_ok(&da, &db9) &&
              ddt_cuda_qweight_interleave_rows(&da, &db9, &out, &e) == DDT_ERR_UNSUPPORTED,
          "10 and 9 rows interleaved");
    CHECK(!ddt_cuda_qweight_interleave_ok(&da, &di4), "BF16 and INT4 interleaved");
    CHECK(ddt_cuda_qweight_interleave_rows(&da, &db, NULL, &e) == DDT_ERR_INVALID, "NULL output accepted");
    OK(ddt_cuda_qweight_interleave_rows(&da, &db, &out, &err_)); /* 20 rows */
    float *dx, *dy;
    CU(cudaMalloc((void **)&dx, sizeof(float) * 64 * 2));
    CU(cudaMalloc((void **)&dy, sizeof(float) * 64 * 2));
    float yb[128];
    ct_poison(yb, 128);
    CU(cudaMemcpy(dy, yb, sizeof yb, cudaMemcpyHostToDevice));
    struct {
        int64_t pf, ldy;
        int wr, wt;
        ddt_status want;
        const char *what;
    } bad[] = {{1, 32, 0, 0, DDT_ERR_INVALID, "an odd pair_from"},
               {-2, 32, 0, 0, DDT_ERR_INVALID, "a negative pair_from"},
               {20, 32, 0, 0, DDT_ERR_INVALID, "no pairs"},
               {0, 9, 0, 0, DDT_ERR_INVALID, "a row stride of 9 for 10 columns"},
               {0, 32, 1, 1, DDT_ERR_INVALID, "a 1-row warp"},
               {0, 32, 4, 3, DDT_ERR_INVALID, "3 tokens a warp"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const ddt_status st =
            ddt_cuda_matmul_swiglu_shape(&out, bad[i].pf, dx, 64, 2, dy, bad[i].ldy, bad[i].wr, bad[i].wt, NULL, &e);
        CHECK(st == bad[i].want, "%s: status %d, want %d", bad[i].what, (int)st, (int)bad[i].want);
    }
    /* 19 rows: an odd number after pair_from 0 */
    const ddt_qweight *parts[2] = {&da, &db9};
    ddt_qweight odd;
    OK(ddt_cuda_qweight_concat_rows(parts, 2, &odd, &err_));
    CHECK(ddt_cuda_matmul_swiglu(&odd, 0, dx, 64, 2, dy, 32, NULL, &e) == DDT_ERR_INVALID, "19 rows in pairs");
    CHECK(ddt_cuda_matmul_swiglu(NULL, 0, dx, 64, 2, dy, 32, NULL, &e) == DDT_ERR_INVALID, "no weight");
    CU(cudaMemcpy(yb, dy, sizeof yb, cudaMemcpyDeviceToHost));
    int written = 0;
    for (int i = 0; i < 128; i++) written += !ct_is_poison(&yb[i]);
    CHECK(written == 0, "refused products wrote %d outputs", written);
    CU(cudaFree(dx));
    CU(cudaFree(dy));
    ddt_qweight *dw[] = {&da, &db, &db9, &di4, &df8a, &df8b, &out, &odd};
    for (size_t i = 0; i < sizeof dw / sizeof dw[0]; i++) ddt_cuda_qweight_free(dw[i]);
    ct_weight *hw[] = {&a, &b, &b9, &i4, &f8a, &f8b};
    for (size_t i = 0; i < sizeof hw / sizeof hw[0]; i++) ct_free_weight(hw[i]);
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    OK(ddt_cpu_pool_create(4, &g_pool, &err_));
    static const int formats[] = {0, 1, 2, 4};
    static const int ns[] = {1, 2, 3, 16, 17, 65};
    static const int shapes[][2] = {{2, 1}, {2, 2}, {2, 4}, {4, 1}, {4, 2}, {4, 4}};
    for (int fi = 0; fi < 4; fi++) {
        const int f = formats[fi];
        const int64_t K = f == 4 ? 96 : 77; /* INT4: columns a multiple of 32 */
        for (int ni = 0; ni < 6; ni++) {
            if (quick && ni % 2 == 1) continue;
            run_case(f, 8, 37, K, ns[ni], 0, 0);  /* the shipped target's router (8) + an odd pair count */
            run_case(f, 0, 21, K, ns[ni], 0, 0);  /* a dense MLP: pairs only */
            if (!quick) run_case(f, 6, 64, K + (f == 4 ? 32 : 3), ns[ni], 0, 0);
            for (int s = 0; s < 6 && !(quick && ni > 0); s++)
                run_case(f, 6, 13, K, ns[ni], shapes[s][0], shapes[s][1]);
        }
    }
    refusals();
    ddt_cpu_pool_destroy(g_pool);
    return ct_report("test_cuda_swiglu");
}
