/*
 * test_cpu_ops.c — every CPU backend op against a naive double-precision
 * reference written independently here, on random odd sizes: the quantised
 * matmuls in all formats (plain, grouped, transposed), RMSNorm, SiLU gate, RoPE
 * and YaRN (plus golden inv_freq values from transformers), absorbed MLA
 * attention with causal and tree masks, the DFlash drafter's block attention
 * and per-head norm + RoPE, the attention's exp (against double exp), the MoE
 * router and routed experts, the residual add and row gather, and the thread
 * pool.  The exp and both attentions are also checked SIMD == portable
 * bitwise, and a query row's attention output bitwise the same alone, in a
 * batch, under a chain or tree mask (against a prefill of its path) and on any
 * thread count.
 * Results must also be identical for any thread count and any batch size (the
 * matmul: bitwise per row for every batch size and position, and between its
 * SIMD and portable kernels).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "backend/cpu/attn.h"
#include "backend/cpu/dflash.h"
#include "backend/cpu/mla.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/nn.h"
#include "backend/cpu/pool.h"
#include "backend/cpu/qmatmul.h"
#include "backend/cpu/rope.h"

/* ------------------------------------------------------------------ helpers */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd_u32(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}
static float rnd_f(void) { return (float)((rnd_u32() & 0xFFFFFF) / 16777216.0 * 2.0 - 1.0); }
static void fill(float *v, size_t n) {
    for (size_t i = 0; i < n; i++) v[i] = rnd_f();
}
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
/* Independent decoders written from reference.md section 3 / IEEE formats. */
static double ref_bf16(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static double ref_f16(uint16_t v) {
    int s = v >> 15, e = (v >> 10) & 31, m = v & 1023;
    double mag = e == 0 ? m * pow(2, -24) : (1.0 + m / 1024.0) * pow(2, e - 15);
    return s ? -mag : mag;
}
static double ref_fp8(uint8_t v) {
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    double mag = e == 0 ? m / 8.0 * pow(2, -6) : (1.0 + m / 8.0) * pow(2, e - 7);
    return s ? -mag : mag;
}
static double norm_err(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num) / (sqrt(den) + 1e-30);
}

/* A test weight in one format, with its dense double copy. */
typedef struct test_weight {
    ddt_qweight q;
    void *data;
    void *scale;
    double *dense; /* [rows][cols] */
} test_weight;

static void make_weight(test_weight *tw, ddt_qformat fmt, ddt_dtype dt, int64_t rows, int64_t cols,
                        int32_t block) {
    memset(tw, 0, sizeof *tw);
    tw->q.format = fmt;
    tw->q.dtype = dt;
    tw->q.rows = rows;
    tw->q.cols = cols;
    tw->dense = malloc(sizeof(double) * rows * cols);
    if (fmt == DDT_Q_DENSE && dt == DDT_DTYPE_F32) {
        float *d = malloc(sizeof(float) * rows * cols);
        fill(d, rows * cols);
        for (int64_t i = 0; i < rows * cols; i++) tw->dense[i] = d[i];
        tw->data = d;
    } else if (fmt == DDT_Q_DENSE) {
        uint16_t *d = malloc(2 * rows * cols);
        for (int64_t i = 0; i < rows * cols; i++) {
            if (dt == DDT_DTYPE_BF16) {
                d[i] = to_bf16(rnd_f());
                tw->dense[i] = ref_bf16(d[i]);
            } else {
                /* finite f16: exponent field 0..29 */
                d[i] = (uint16_t)((rnd_u32() & 0x83FF) | ((rnd_u32() % 17 + 5) << 10));
                tw->dense[i] = ref_f16(d[i]);
            }
        }
        tw->data = d;
    } else if (fmt == DDT_Q_FP8_BLOCK) {
        uint8_t *d = malloc(rows * cols);
        int64_t sr = (rows + block - 1) / block, sc = (cols + block - 1) / block;
        float *s = malloc(sizeof(float) * sr * sc);
        for (int64_t i = 0; i < sr * sc; i++) s[i] = 0.001f + (rnd_f() + 1.0f) * 0.01f;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                uint8_t v;
                do v = (uint8_t)rnd_u32();
                while ((v & 0x7F) == 0x7F);
                d[r * cols + c] = v;
                tw->dense[r * cols + c] = ref_fp8(v) * s[(r / block) * sc + c / block];
            }
        tw->data = d;
        tw->scale = s;
        tw->q.scale_inv = s;
        tw->q.block = block;
    } else {
        int32_t group = block;
        /* a partial last word and group when cols is not a multiple of 8 / group */
        int64_t words = (cols + 7) / 8, groups = (cols + group - 1) / group;
        uint32_t *d = malloc(4 * rows * words);
        uint16_t *s = malloc(2 * rows * groups);
        for (int64_t i = 0; i < rows * words; i++) d[i] = rnd_u32() ^ (rnd_u32() << 16);
        for (int64_t i = 0; i < rows * groups; i++) s[i] = to_bf16(0.01f + (rnd_f() + 1.0f) * 0.05f);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) {
                int nib = (int)((d[r * words + c / 8] >> (4 * (c % 8))) & 15);
                tw->dense[r * cols + c] = (nib - 8) * ref_bf16(s[r * groups + c / group]);
            }
        tw->data = d;
        tw->scale = s;
        tw->q.scale = s;
        tw->q.group = group;
    }
    tw->q.data = tw->data;
}

static void free_weight(test_weight *tw) {
    free(tw->data);
    free(tw->scale);
    free(tw->dense);
}

/* ------------------------------------------------------------------ scalars */

static void test_scalar_decoders(void **state) {
    (void)state;
    assert_true(ddt_fp8_e4m3_to_f32(0x38) == 1.0f);
    assert_true(ddt_fp8_e4m3_to_f32(0x7E) == 448.0f);
    assert_true(ddt_fp8_e4m3_to_f32(0xFE) == -448.0f);
    assert_true(ddt_fp8_e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
    assert_true(isnan(ddt_fp8_e4m3_to_f32(0x7F)));
    assert_true(isnan(ddt_fp8_e4m3_to_f32(0xFF)));
    for (int v = 0; v < 256; v++)
        if ((v & 0x7F) != 0x7F) assert_true(ddt_fp8_e4m3_to_f32((uint8_t)v) == (float)ref_fp8((uint8_t)v));
    assert_true(ddt_bf16_to_f32(0x3F80) == 1.0f);
    assert_true(ddt_bf16_to_f32(0xC040) == -3.0f);
    assert_true(ddt_f16_to_f32(0x3C00) == 1.0f);
    assert_true(ddt_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    assert_true(ddt_f16_to_f32(0xC000) == -2.0f);
    assert_true(isinf(ddt_f16_to_f32(0x7C00)));
    for (int v = 0; v < 0x7C00; v += 7) assert_true(ddt_f16_to_f32((uint16_t)v) == (float)ref_f16((uint16_t)v));
}

/* ------------------------------------------------------------------ matmul */

typedef struct fmt_case {
    ddt_qformat fmt;
    ddt_dtype dt;
    int32_t block;
    int64_t rows, cols;
} fmt_case;

static const fmt_case k_cases[] = {
    {DDT_Q_DENSE, DDT_DTYPE_F32, 0, 37, 83},      {DDT_Q_DENSE, DDT_DTYPE_F32, 0, 5, 517},
    {DDT_Q_DENSE, DDT_DTYPE_BF16, 0, 29, 301},    {DDT_Q_DENSE, DDT_DTYPE_F16, 0, 13, 77},
    {DDT_Q_FP8_BLOCK, DDT_DTYPE_F8_E4M3, 128, 131, 300}, {DDT_Q_FP8_BLOCK, DDT_DTYPE_F8_E4M3, 16, 33, 71},
    {DDT_Q_INT4_GROUP, DDT_DTYPE_I32, 32, 19, 288}, {DDT_Q_INT4_GROUP, DDT_DTYPE_I32, 32, 7, 96},
};

static void test_matmul_formats(void **state) {
    (void)state;
    ddt_cpu_pool *pool = NULL;
    ddt_error err;
    assert_int_equal(ddt_cpu_pool_create(3, &pool, &err), DDT_OK);
    const int64_t ns[] = {1, 5, 13};
    for (size_t c = 0; c < sizeof k_cases / sizeof k_cases[0]; c++) {
        const fmt_case *fc = &k_cases[c];
        test_weight tw;
        make_weight(&tw, fc->fmt, fc->dt, fc->rows, fc->cols, fc->block);
        /* dequant of a row segment */
        float *row = malloc(sizeof(float) * fc->cols);
        for (int64_t r = 0; r < fc->rows; r += 3) {
            ddt_cpu_dequant(&tw.q, r, 0, fc->cols, row);
            for (int64_t j = 0; j < fc->cols; j++) assert_true(row[j] == (float)tw.dense[r * fc->cols + j]);
        }
        free(row);
        for (size_t k = 0; k < 3; k++) {
            int64_t n = ns[k], ldx = fc->cols + 3, ldy = fc->rows + 2;
            float *x = malloc(sizeof(float) * n * ldx);
            float *y = malloc(sizeof(float) * n * ldy), *y1 = malloc(sizeof(float) * n * ldy);
            double *ref = malloc(sizeof(double) * n * fc->rows);
            float *yc = malloc(sizeof(float) * n * fc->rows);
            fill(x, n * ldx);
            ddt_cpu_matmul(pool, &tw.q, x, ldx, n, y, ldy);
            ddt_cpu_matmul(NULL, &tw.q, x, ldx, n, y1, ldy);
            for (int64_t t = 0; t < n; t++)
                for (int64_t o = 0; o < fc->rows; o++) {
                    double s = 0;
                    for (int64_t j = 0; j < fc->cols; j++) s += (double)x[t * ldx + j] * tw.dense[o * fc->cols + j];
                    ref[t * fc->rows + o] = s;
                    yc[t * fc->rows + o] = y[t * ldy + o];
                    /* thread count never changes a result */
                    assert_true(y[t * ldy + o] == y1[t * ldy + o]);
                }
            double e = norm_err(yc, ref, n * fc->rows);
            if (e > 1e-6) fail_msg("matmul case %zu n %lld: normalised error %g", c, (long long)n, e);
            /* a row alone gives the same bits as inside the batch */
            float *ylast = malloc(sizeof(float) * fc->rows);
            ddt_cpu_matmul(pool, &tw.q, x + (n - 1) * ldx, ldx, 1, ylast, fc->rows);
            for (int64_t o = 0; o < fc->rows; o++) assert_true(ylast[o] == y[(n - 1) * ldy + o]);
            free(ylast);
            free(x);
            free(y);
            free(y1);
            free(ref);
            free(yc);
        }
        free_weight(&tw);
    }
    ddt_cpu_pool_destroy(pool);
}

/* Odd shapes for the invariance tests: rows not a multiple of the 4-row block,
 * columns not a multiple of the 16 lanes; FP8 and INT4 with a partial last
 * block / group (and INT4 word); the second shape of each dense dtype spans
 * several column chunks (the SIMD kernels read 1024 in place, the buffer 256). */
static const fmt_case k_odd_cases[] = {
    {DDT_Q_DENSE, DDT_DTYPE_F32, 0, 37, 203},        {DDT_Q_DENSE, DDT_DTYPE_BF16, 0, 37, 203},
    {DDT_Q_DENSE, DDT_DTYPE_F16, 0, 37, 203},        {DDT_Q_FP8_BLOCK, DDT_DTYPE_F8_E4M3, 128, 37, 203},
    {DDT_Q_FP8_BLOCK, DDT_DTYPE_F8_E4M3, 16, 19, 83}, {DDT_Q_INT4_GROUP, DDT_DTYPE_I32, 32, 37, 203},
    {DDT_Q_DENSE, DDT_DTYPE_BF16, 0, 9, 1043},       {DDT_Q_DENSE, DDT_DTYPE_F32, 0, 6, 1043},
    {DDT_Q_DENSE, DDT_DTYPE_F16, 0, 5, 1031},
};

#define INV_MAXN 70

/* y [n + 1][ldy] filled with NaN, so that a write outside [n][rows] shows. */
static float *nan_rows(int64_t n, int64_t ldy) {
    float *y = malloc(sizeof(float) * (n + 1) * ldy);
    for (int64_t i = 0; i < (n + 1) * ldy; i++) y[i] = NAN;
    return y;
}

static void check_nan_outside(const float *y, int64_t n, int64_t rows, int64_t ldy, const char *what) {
    for (int64_t t = 0; t <= n; t++)
        for (int64_t o = t < n ? rows : 0; o < ldy; o++)
            if (!isnan(y[t * ldy + o]))
                fail_msg("%s: n %lld wrote y[%lld][%lld] outside the output", what, (long long)n, (long long)t,
                         (long long)o);
}

/* Row t of y = x W^T is bitwise the same whatever the batch around it: computed
 * alone (n = 1), inside batches of every odd n up to past the 64-row tile, at
 * two positions in the batch, on 1 or 3 threads.  Also close to a double
 * reference, and nothing is written past the rows or columns of y. */
static void test_matmul_batch_invariance(void **state) {
    (void)state;
    ddt_cpu_pool *pool = NULL;
    ddt_error err;
    assert_int_equal(ddt_cpu_pool_create(3, &pool, &err), DDT_OK);
    g_rng = 0xD1B54A32D192ED03ull; /* fresh inputs, independent of the tests before */
    for (size_t c = 0; c < sizeof k_odd_cases / sizeof k_odd_cases[0]; c++) {
        const fmt_case *fc = &k_odd_cases[c];
        const int64_t rows = fc->rows, cols = fc->cols, ldx = cols + 5, ldy = rows + 3;
        test_weight tw;
        make_weight(&tw, fc->fmt, fc->dt, rows, cols, fc->block);
        float *x = malloc(sizeof(float) * INV_MAXN * ldx);
        fill(x, INV_MAXN * ldx);
        /* every row alone, and its distance to the double reference */
        float *alone = malloc(sizeof(float) * INV_MAXN * rows);
        double *ref = malloc(sizeof(double) * INV_MAXN * rows);
        for (int64_t t = 0; t < INV_MAXN; t++) {
            float *y1 = nan_rows(1, ldy);
            ddt_cpu_matmul(t % 2 ? pool : NULL, &tw.q, x + t * ldx, ldx, 1, y1, ldy);
            check_nan_outside(y1, 1, rows, ldy, "alone");
            memcpy(alone + t * rows, y1, sizeof(float) * rows);
            free(y1);
            for (int64_t o = 0; o < rows; o++) {
                double s = 0;
                for (int64_t j = 0; j < cols; j++) s += (double)x[t * ldx + j] * tw.dense[o * cols + j];
                ref[t * rows + o] = s;
            }
        }
        double e = norm_err(alone, ref, INV_MAXN * rows);
        if (e > 1e-6) fail_msg("odd case %zu: normalised error %g", c, e);
        for (int64_t n = 1; n <= INV_MAXN; n += 2) {
            /* the batch at the start of x, then the one ending at its last row: a
             * row of x sits at position t, then at t - (INV_MAXN - n) */
            for (int pass = 0; pass < 2; pass++) {
                int64_t off = pass == 0 ? 0 : INV_MAXN - n;
                float *y = nan_rows(n, ldy);
                ddt_cpu_matmul(pass ? pool : NULL, &tw.q, x + off * ldx, ldx, n, y, ldy);
                check_nan_outside(y, n, rows, ldy, "batch");
                for (int64_t t = 0; t < n; t++)
                    for (int64_t o = 0; o < rows; o++)
                        if (memcmp(&y[t * ldy + o], &alone[(off + t) * rows + o], sizeof(float)) != 0)
                            fail_msg("odd case %zu n %lld: row %lld at position %lld output %lld differs from "
                                     "the row alone (%.9g vs %.9g)",
                                     c, (long long)n, (long long)(off + t), (long long)t, (long long)o,
                                     y[t * ldy + o], alone[(off + t) * rows + o]);
                free(y);
            }
        }
        free(x);
        free(alone);
        free(ref);
        free_weight(&tw);
    }
    ddt_cpu_pool_destroy(pool);
}

/* The SIMD kernels (where this build has them) and the portable C kernel follow
 * the same arithmetic order: bitwise the same products, for every format and
 * batch sizes around the register blocks and the tile. */
static void test_matmul_simd_vs_portable(void **state) {
    (void)state;
    ddt_cpu_pool *pool = NULL;
    ddt_error err;
    assert_int_equal(ddt_cpu_pool_create(2, &pool, &err), DDT_OK);
    g_rng = 0x94D049BB133111EBull;
    const int64_t ns[] = {1, 2, 3, 5, 6, 7, 12, 13, 33, 64, 65, 70};
    for (size_t c = 0; c < sizeof k_odd_cases / sizeof k_odd_cases[0]; c++) {
        const fmt_case *fc = &k_odd_cases[c];
        const int64_t rows = fc->rows, cols = fc->cols, ldx = cols + 1, ldy = rows + 2;
        test_weight tw;
        make_weight(&tw, fc->fmt, fc->dt, rows, cols, fc->block);
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            int64_t n = ns[k];
            float *x = malloc(sizeof(float) * n * ldx);
            fill(x, n * ldx);
            float *ys = nan_rows(n, ldy), *yp = nan_rows(n, ldy);
            ddt_cpu_matmul(pool, &tw.q, x, ldx, n, ys, ldy);
            ddt_cpu_matmul_portable(pool, &tw.q, x, ldx, n, yp, ldy);
            check_nan_outside(yp, n, rows, ldy, "portable");
            for (int64_t t = 0; t < n; t++)
                for (int64_t o = 0; o < rows; o++)
                    if (memcmp(&ys[t * ldy + o], &yp[t * ldy + o], sizeof(float)) != 0)
                        fail_msg("odd case %zu n %lld: y[%lld][%lld] SIMD %.9g portable %.9g", c, (long long)n,
                                 (long long)t, (long long)o, ys[t * ldy + o], yp[t * ldy + o]);
            free(x);
            free(ys);
            free(yp);
        }
        free_weight(&tw);
    }
    /* no columns: both kernels write the empty sum, +0 */
    float dummy = 1.0f, xz = 1.0f;
    ddt_qweight wz = {.format = DDT_Q_DENSE, .dtype = DDT_DTYPE_BF16, .rows = 6, .cols = 0, .data = &dummy};
    for (int k = 0; k < 2; k++) {
        float *yz = nan_rows(3, 8);
        if (k) ddt_cpu_matmul_portable(pool, &wz, &xz, 0, 3, yz, 8);
        else ddt_cpu_matmul(pool, &wz, &xz, 0, 3, yz, 8);
        for (int t = 0; t < 3; t++)
            for (int o = 0; o < 6; o++) assert_true(yz[t * 8 + o] == 0.0f && !signbit(yz[t * 8 + o]));
        check_nan_outside(yz, 3, 6, 8, "no columns");
        free(yz);
    }
    ddt_cpu_pool_destroy(pool);
}

static void test_matmul_grouped_and_transposed(void **state) {
    (void)state;
    ddt_cpu_pool *pool = NULL;
    ddt_error err;
    assert_int_equal(ddt_cpu_pool_create(2, &pool, &err), DDT_OK);
    /* kv_b-like weight: 3 heads x (nope 5 + v 7) rows, 150 columns (rank) */
    const int32_t H = 3, nope = 5, vd = 7, rank = 150;
    for (size_t c = 0; c < 3; c++) {
        test_weight tw;
        ddt_qformat fmt = c == 0 ? DDT_Q_DENSE : c == 1 ? DDT_Q_FP8_BLOCK : DDT_Q_DENSE;
        ddt_dtype dt = c == 0 ? DDT_DTYPE_F32 : c == 1 ? DDT_DTYPE_F8_E4M3 : DDT_DTYPE_BF16;
        make_weight(&tw, fmt, dt, H * (nope + vd), rank, 16);
        const int64_t n = 4;
        /* W_UV: y[t][h*vd + o] = sum_j x[t][h*rank + j] W[h*(nope+vd) + nope + o][j] */
        float *x = malloc(sizeof(float) * n * H * rank), *y = malloc(sizeof(float) * n * H * vd);
        double *ref = malloc(sizeof(double) * n * H * rank);
        fill(x, n * H * rank);
        ddt_row_groups g = {.count = H, .w_row_stride = nope + vd, .w_row_offset = nope, .rows = vd,
                            .x_stride = rank, .y_stride = vd};
        ddt_cpu_matmul_grouped(pool, &tw.q, &g, x, H * rank, n, y, H * vd);
        for (int64_t t = 0; t < n; t++)
            for (int32_t h = 0; h < H; h++)
                for (int32_t o = 0; o < vd; o++) {
                    double s = 0;
                    for (int32_t j = 0; j < rank; j++)
                        s += (double)x[t * H * rank + h * rank + j] * tw.dense[(h * (nope + vd) + nope + o) * rank + j];
                    ref[t * H * vd + h * vd + o] = s;
                }
        assert_true(norm_err(y, ref, n * H * vd) < 1e-6);
        /* W_UK absorbed: q_lat[t][h*rank + j] = sum_i q[t][h*nope + i] W[h*(nope+vd) + i][j] */
        float *q = malloc(sizeof(float) * n * H * nope), *ql = malloc(sizeof(float) * n * H * rank);
        fill(q, n * H * nope);
        ddt_row_groups gk = {.count = H, .w_row_stride = nope + vd, .w_row_offset = 0, .rows = nope,
                             .x_stride = nope, .y_stride = rank};
        ddt_cpu_matmul_t_grouped(pool, &tw.q, &gk, q, H * nope, n, ql, H * rank);
        for (int64_t t = 0; t < n; t++)
            for (int32_t h = 0; h < H; h++)
                for (int32_t j = 0; j < rank; j++) {
                    double s = 0;
                    for (int32_t i = 0; i < nope; i++)
                        s += (double)q[t * H * nope + h * nope + i] * tw.dense[(h * (nope + vd) + i) * rank + j];
                    ref[t * H * rank + h * rank + j] = s;
                }
        assert_true(norm_err(ql, ref, n * H * rank) < 1e-6);
        free(q);
        free(ql);
        free(x);
        free(y);
        free(ref);
        free_weight(&tw);
    }
    ddt_cpu_pool_destroy(pool);
}

/* ------------------------------------------------------------------ norm, silu */

static void test_rmsnorm_and_silu(void **state) {
    (void)state;
    ddt_cpu_pool *pool = NULL;
    ddt_error err;
    assert_int_equal(ddt_cpu_pool_create(2, &pool, &err), DDT_OK);
    const int64_t n = 7, dim = 301, ld = 310;
    float *x = malloc(sizeof(float) * n * ld), *y = malloc(sizeof(float) * n * ld);
    uint16_t *wb = malloc(2 * dim);
    double *ref = malloc(sizeof(double) * n * dim);
    float *yc = malloc(sizeof(float) * n * dim);
    fill(x, n * ld);
    for (int64_t j = 0; j < dim; j++) wb[j] = to_bf16(1.0f + rnd_f());
    ddt_cpu_vec w = {.data = wb, .dtype = DDT_DTYPE_BF16, .n = dim};
    ddt_cpu_rmsnorm(pool, x, ld, n, dim, &w, 1e-6f, y, ld);
    for (int64_t t = 0; t < n; t++) {
        double ss = 0;
        for (int64_t j = 0; j < dim; j++) ss += (double)x[t * ld + j] * x[t * ld + j];
        double inv = 1.0 / sqrt(ss / dim + 1e-6);
        for (int64_t j = 0; j < dim; j++) {
            ref[t * dim + j] = ref_bf16(wb[j]) * x[t * ld + j] * inv;
            yc[t * dim + j] = y[t * ld + j];
        }
    }
    assert_true(norm_err(yc, ref, n * dim) < 1e-6);
    /* in place gives the same */
    ddt_cpu_rmsnorm(pool, x, ld, n, dim, &w, 1e-6f, x, ld);
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < dim; j++) assert_true(x[t * ld + j] == y[t * ld + j]);

    float *g = malloc(sizeof(float) * n * dim), *u = malloc(sizeof(float) * n * dim);
    fill(g, n * dim);
    fill(u, n * dim);
    for (int64_t i = 0; i < n * dim; i++) {
        double gv = g[i] * 8.0;
        g[i] = (float)gv;
        ref[i] = gv / (1.0 + exp(-gv)) * u[i];
    }
    ddt_cpu_silu_mul(pool, g, dim, u, dim, n, dim);
    assert_true(norm_err(g, ref, n * dim) < 1e-6);
    free(g);
    free(u);
    free(x);
    free(y);
    free(wb);
    free(ref);
    free(yc);
    ddt_cpu_pool_destroy(pool);
}

/* The residual add (x + y, element by element, exactly) and the row gather
 * (rows in the given order, repeats allowed, padding of dst untouched). */
static void test_add_and_gather(void **state) {
    (void)state;
    enum { N = 1000, ROWS = 7, COLS = 13, LDS = 16, LDD = 15, M = 5 };
    float x[N], y[N], x0[N];
    fill(x, N);
    fill(y, N);
    memcpy(x0, x, sizeof x);
    ddt_cpu_add(x, y, N - 1);
    for (int i = 0; i < N - 1; i++) assert_true(x[i] == x0[i] + y[i]);
    assert_true(x[N - 1] == x0[N - 1]);
    float src[ROWS * LDS], dst[M * LDD];
    fill(src, ROWS * LDS);
    for (int i = 0; i < M * LDD; i++) dst[i] = -3.0f;
    const int32_t rows[M] = {6, 0, 3, 3, 1};
    ddt_cpu_gather_rows(dst, LDD, src, LDS, rows, M, COLS);
    for (int k = 0; k < M; k++) {
        assert_memory_equal(dst + k * LDD, src + rows[k] * LDS, sizeof(float) * COLS);
        for (int c = COLS; c < LDD; c++) assert_true(dst[k * LDD + c] == -3.0f);
    }
}

/* ------------------------------------------------------------------ rope */

static void test_rope_plain_and_rotation(void **state) {
    (void)state;
    ddt_rope_params p = {.dim = 10, .theta = 10000.0f};
    float inv[5], af;
    ddt_cpu_rope_freqs(&p, inv, &af);
    assert_true(af == 1.0f);
    for (int i = 0; i < 5; i++) assert_true(fabs(inv[i] - pow(10000.0, -2.0 * i / 10)) < 1e-6 * pow(10000.0, -2.0 * i / 10));
    /* rotation: norm preserved, interleaved == rotate_half of the de-interleaved vector,
     * and q.k depends only on the position difference */
    float c1[5], s1[5], c2[5], s2[5];
    ddt_cpu_rope_cos_sin(inv, 5, 7, 1.0f, c1, s1);
    ddt_cpu_rope_cos_sin(inv, 5, 3, 1.0f, c2, s2);
    float v[10], w[10], d[10];
    fill(v, 10);
    for (int i = 0; i < 5; i++) {
        d[i] = v[2 * i];
        d[i + 5] = v[2 * i + 1];
    }
    memcpy(w, v, sizeof v);
    ddt_cpu_rope_rotate(w, 10, true, c1, s1);
    ddt_cpu_rope_rotate(d, 10, false, c1, s1);
    double n0 = 0, n1 = 0;
    for (int i = 0; i < 10; i++) {
        assert_true(w[i] == d[i]);
        n0 += (double)v[i] * v[i];
        n1 += (double)w[i] * w[i];
    }
    assert_true(fabs(n0 - n1) < 1e-5 * n0);
    /* reference rotation in double: pair i at angle pos*inv[i] */
    for (int i = 0; i < 5; i++) {
        double a = 7.0 * inv[i];
        double e0 = v[2 * i] * cos(a) - v[2 * i + 1] * sin(a), e1 = v[2 * i + 1] * cos(a) + v[2 * i] * sin(a);
        assert_true(fabs(w[i] - e0) < 1e-5 && fabs(w[i + 5] - e1) < 1e-5);
    }
    float q[10], k[10], q2[10], k2[10];
    fill(q, 10);
    fill(k, 10);
    memcpy(q2, q, sizeof q);
    memcpy(k2, k, sizeof k);
    ddt_cpu_rope_rotate(q, 10, false, c1, s1); /* q at 7, k at 3 */
    ddt_cpu_rope_rotate(k, 10, false, c2, s2);
    float c3[5], s3[5], c4[5], s4[5];
    ddt_cpu_rope_cos_sin(inv, 5, 14, 1.0f, c3, s3); /* q at 14, k at 10 */
    ddt_cpu_rope_cos_sin(inv, 5, 10, 1.0f, c4, s4);
    ddt_cpu_rope_rotate(q2, 10, false, c3, s3);
    ddt_cpu_rope_rotate(k2, 10, false, c4, s4);
    double d1 = 0, d2 = 0;
    for (int i = 0; i < 10; i++) {
        d1 += (double)q[i] * k[i];
        d2 += (double)q2[i] * k2[i];
    }
    assert_true(fabs(d1 - d2) < 1e-5);
    /* the attention factor scales cos and sin */
    float c5[5], s5[5];
    ddt_cpu_rope_cos_sin(inv, 5, 7, 1.5f, c5, s5);
    for (int i = 0; i < 5; i++) assert_true(c5[i] == c1[i] * 1.5f && s5[i] == s1[i] * 1.5f);
}

/* The drafter's per-head norm + RoPE (ddt_cpu_dflash_norm_rope) against a double
 * reference on strided rows (padding untouched), and in place == out of place. */
static void test_dflash_norm_rope(void **state) {
    (void)state;
    ddt_cpu_pool *pool = NULL;
    ddt_error err;
    assert_int_equal(ddt_cpu_pool_create(2, &pool, &err), DDT_OK);
    enum { N = 5, NH = 3, HD = 14, HALF = HD / 2, LD = NH * HD + 3 };
    float x[N * LD], y[N * LD], wv[HD], cs[N * HALF], sn[N * HALF], yc[N * NH * HD];
    double ref[N * NH * HD];
    fill(x, N * LD);
    for (int i = 0; i < HD; i++) wv[i] = 1.0f + 0.5f * rnd_f();
    for (int i = 0; i < N * HALF; i++) cs[i] = rnd_f(), sn[i] = rnd_f();
    for (int i = 0; i < N * LD; i++) y[i] = -7.0f;
    const ddt_cpu_vec w = {.data = wv, .dtype = DDT_DTYPE_F32, .n = HD};
    ddt_cpu_dflash_norm_rope(pool, x, LD, N, NH, HD, &w, 1e-6f, cs, sn, y, LD);
    for (int t = 0; t < N; t++)
        for (int h = 0; h < NH; h++) {
            const float *v = x + t * LD + h * HD;
            double ss = 0;
            for (int j = 0; j < HD; j++) ss += (double)v[j] * v[j];
            const double inv = 1.0 / sqrt(ss / HD + 1e-6);
            for (int i = 0; i < HALF; i++) {
                const double a = wv[i] * v[i] * inv, b = wv[i + HALF] * v[i + HALF] * inv;
                const double c = cs[t * HALF + i], s = sn[t * HALF + i];
                ref[(t * NH + h) * HD + i] = a * c - b * s;
                ref[(t * NH + h) * HD + i + HALF] = b * c + a * s;
            }
            memcpy(yc + (t * NH + h) * HD, y + t * LD + h * HD, sizeof(float) * HD);
        }
    assert_true(norm_err(yc, ref, N * NH * HD) < 1e-6);
    for (int t = 0; t < N; t++)
        for (int c = NH * HD; c < LD; c++) assert_true(y[t * LD + c] == -7.0f);
    ddt_cpu_dflash_norm_rope(pool, x, LD, N, NH, HD, &w, 1e-6f, cs, sn, x, LD);
    for (int t = 0; t < N; t++) assert_memory_equal(x + t * LD, y + t * LD, sizeof(float) * NH * HD);
    ddt_cpu_pool_destroy(pool);
}

/* Golden values: transformers 5.x ROPE_INIT_FUNCTIONS["yarn"] on a DeepseekV3Config
 * with qk_rope_head_dim 16, rope_theta 10000 (printed with float.hex()). */
static void test_rope_yarn_golden(void **state) {
    (void)state;
    static const struct {
        float factor, orig, beta_fast, beta_slow, mscale, mscale_all;
        double af;
        double inv[8];
    } g[] = {
        {64, 4096, 1, 1, 1, 1, 1.0,
         {0x1.0000000000000p+0, 0x1.43d1360000000p-2, 0x1.99999a0000000p-4, 0x1.030dc60000000p-5,
          0x1.47ae140000000p-7, 0x1.9e7c700000000p-9, 0x1.0624de0000000p-16, 0x1.4b96c00000000p-18}},
        {40, 4096, 32, 1, 1, 0, 1.3688879454113936,
         {0x1.0000000000000p+0, 0x1.43d1360000000p-2, 0x1.99999a0000000p-4, 0x1.87d1a00000000p-6,
          0x1.4fdf3a0000000p-8, 0x1.bd92920000000p-11, 0x1.a36e2e0000000p-16, 0x1.0945660000000p-17}},
        {4, 64, 32, 1, 0.707f, 1, 0.964326914892074,
         {0x1.0000000000000p+0, 0x1.e5b9d00000000p-3, 0x1.9999980000000p-5, 0x1.030dc60000000p-7,
          0x1.47ae140000000p-9, 0x1.9e7c700000000p-11, 0x1.0624de0000000p-12, 0x1.4b96c00000000p-14}},
    };
    for (size_t c = 0; c < sizeof g / sizeof g[0]; c++) {
        ddt_rope_params p = {.dim = 16, .theta = 10000.0f, .yarn = true, .factor = g[c].factor,
                             .original_max_position = g[c].orig, .beta_fast = g[c].beta_fast,
                             .beta_slow = g[c].beta_slow, .mscale = g[c].mscale,
                             .mscale_all_dim = g[c].mscale_all};
        float inv[8], af;
        ddt_cpu_rope_freqs(&p, inv, &af);
        if (fabs(af - g[c].af) > 1e-6) fail_msg("case %zu: attention factor %.9g, transformers %.9g", c, af, g[c].af);
        for (int i = 0; i < 8; i++)
            if (fabs(inv[i] - g[c].inv[i]) > 2e-6 * g[c].inv[i])
                fail_msg("case %zu: inv_freq[%d] = %.9g, transformers %.9g", c, i, inv[i], g[c].inv[i]);
    }
}

/* ------------------------------------------------------------------ attention */

static void check_attention(int32_t n, int64_t n_prefix, int32_t H, int32_t rank, int32_t rd, bool tree,
                            ddt_cpu_pool *pool) {
    int64_t kvw = rank + rd, rows = n_prefix + n;
    float *kv = malloc(sizeof(float) * rows * kvw);
    float *ql = malloc(sizeof(float) * n * H * rank), *qr = malloc(sizeof(float) * n * H * rd);
    float *out = malloc(sizeof(float) * n * H * rank);
    double *ref = malloc(sizeof(double) * n * H * rank);
    double *sc = malloc(sizeof(double) * rows);
    int32_t words = (n + 63) / 64;
    uint64_t *vis = calloc((size_t)n * words, 8);
    fill(kv, rows * kvw);
    fill(ql, n * H * rank);
    fill(qr, n * H * rd);
    if (tree) {
        /* random tree: parent[i] < i; visibility = ancestors and self */
        for (int32_t i = 0; i < n; i++) {
            if (i > 0) {
                int32_t par = (int32_t)(rnd_u32() % i);
                memcpy(vis + i * words, vis + par * words, 8 * words);
            }
            vis[i * words + i / 64] |= 1ull << (i % 64);
        }
    }
    float scale = 0.37f;
    ddt_mla_attn a = {.n = n, .n_heads = H, .rank = rank, .rope_dim = rd, .q_lat = ql,
                      .q_lat_ld_t = H * rank, .q_lat_ld_h = rank, .q_rope = qr, .q_rope_ld_t = H * rd,
                      .q_rope_ld_h = rd, .kv = kv, .kv_ld = kvw, .n_prefix = n_prefix,
                      .vis = tree ? vis : NULL, .vis_words = words, .scale = scale, .out = out,
                      .out_ld_t = H * rank, .out_ld_h = rank};
    ddt_cpu_mla_attention(pool, &a);
    for (int32_t t = 0; t < n; t++)
        for (int32_t h = 0; h < H; h++) {
            double mx = -INFINITY;
            for (int64_t j = 0; j < rows; j++) {
                bool visible = j < n_prefix ||
                               (tree ? (vis[t * words + (j - n_prefix) / 64] >> ((j - n_prefix) % 64)) & 1
                                     : j - n_prefix <= t);
                if (!visible) {
                    sc[j] = NAN;
                    continue;
                }
                double s = 0;
                for (int32_t k = 0; k < rank; k++) s += (double)ql[(t * H + h) * rank + k] * kv[j * kvw + k];
                for (int32_t k = 0; k < rd; k++) s += (double)qr[(t * H + h) * rd + k] * kv[j * kvw + rank + k];
                sc[j] = s * scale;
                if (sc[j] > mx) mx = sc[j];
            }
            double z = 0;
            for (int64_t j = 0; j < rows; j++)
                if (!isnan(sc[j])) z += exp(sc[j] - mx);
            for (int32_t k = 0; k < rank; k++) {
                double o = 0;
                for (int64_t j = 0; j < rows; j++)
                    if (!isnan(sc[j])) o += exp(sc[j] - mx) / z * kv[j * kvw + k];
                ref[(t * H + h) * rank + k] = o;
            }
        }
    double e = norm_err(out, ref, (size_t)n * H * rank);
    if (e > 1e-5) fail_msg("attention n %d prefix %lld tree %d: error %g", n, (long long)n_prefix, tree, e);
    free(kv);
    free(ql);
    free(qr);
    free(out);
    free(ref);
    free(sc);
    free(vis);
}

static void test_mla_attention(void **state) {
    (void)state;
    ddt_cpu_pool *pool = NULL;
    ddt_error err;
    assert_int_equal(ddt_cpu_pool_create(3, &pool, &err), DDT_OK);
    check_attention(1, 0, 3, 19, 6, false, pool);
    check_attention(7, 5, 3, 19, 6, false, pool);
    check_attention(9, 0, 2, 33, 4, false, NULL);
    check_attention(9, 11, 2, 33, 4, true, pool);
    check_attention(70, 3, 1, 17, 8, true, pool); /* two bitset words */
    check_attention(130, 0, 2, 9, 2, true, pool); /* three words, no prefix */
    ddt_cpu_pool_destroy(pool);
}

/* ------------------------------------------------------------------ attention exp */

/* Error of y in units of the last place of the float nearest to e (2^-149 for
 * subnormal results). */
static double ulp_err(float y, double e) {
    double ae = fabs(e);
    int ex;
    frexp(ae, &ex); /* ae = f 2^ex, f in [0.5, 1) */
    double ulp = ae < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ex - 24);
    return fabs((double)y - e) / ulp;
}

static void test_attn_exp(void **state) {
    (void)state;
    g_rng = 0xD1B54A32D192ED03ull;
    const float edge[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-30f, -1e-30f, 0x1p-149f, -0x1p-149f,
                          0x1.62e430p-2f, -0x1.62e430p-2f, 0.34657359f, -0.34657359f, 1.0f, -1.0f, 0.5f,
                          -87.33654f, -87.3366f, -88.0f, -100.0f, -103.27893f, -103.97208f, -103.9721f, -104.0f,
                          -104.5f, -200.0f, -3.4028235e38f, 88.0f, 88.37626f, 88.7f, 88.72283f, 88.722839f,
                          88.72284f, 88.8f, 89.0f, 100.0f, 3.4028235e38f};
    const int64_t n_edge = (int64_t)(sizeof edge / sizeof edge[0]);
    /* an odd count, so the SIMD tail is exercised too */
    const int64_t n = n_edge + 3 * 400001;
    float *x = malloc(sizeof(float) * n), *ys = malloc(sizeof(float) * n), *yp = malloc(sizeof(float) * n);
    memcpy(x, edge, sizeof edge);
    int64_t i = n_edge;
    for (int64_t k = 0; k < 400001; k++) x[i++] = (float)(-104.0 + 192.72 * ((rnd_u32() & 0xFFFFFF) / 16777216.0));
    for (int64_t k = 0; k < 400001; k++) x[i++] = (float)(-20.0 * ((rnd_u32() & 0xFFFFFF) / 16777216.0));
    for (int64_t k = 0; k < 400001; k++) { /* any bit pattern: NaNs, infinities, subnormals */
        uint32_t u = rnd_u32() ^ (rnd_u32() << 21);
        memcpy(&x[i++], &u, 4);
    }
    ddt_cpu_exp_n(x, ys, n, false);
    ddt_cpu_exp_n(x, yp, n, true);
    double worst = 0, worst_x = 0;
    for (i = 0; i < n; i++) {
        float y1 = ddt_cpu_expf(x[i]);
        if (isnan(x[i])) {
            if (!isnan(ys[i]) || !isnan(yp[i]) || !isnan(y1)) fail_msg("exp(NaN) at %lld not NaN", (long long)i);
            continue;
        }
        if (memcmp(&ys[i], &yp[i], 4) != 0 || memcmp(&y1, &yp[i], 4) != 0)
            fail_msg("exp(%a): SIMD %a, portable %a, scalar %a", x[i], ys[i], yp[i], y1);
        double e = exp((double)x[i]);
        if (isinf((float)e)) { /* past FLT_MAX once rounded */
            if (!(isinf(yp[i]) && yp[i] > 0)) fail_msg("exp(%a) = %a, want +inf", x[i], yp[i]);
        } else if (x[i] < -104.0f) {
            if (!(yp[i] == 0.0f && !signbit(yp[i]))) fail_msg("exp(%a) = %a, want +0", x[i], yp[i]);
        } else {
            double u = ulp_err(yp[i], e);
            if (u > worst) {
                worst = u;
                worst_x = x[i];
            }
        }
    }
    printf("  attention exp: max error %.3f ulp (at x = %a) over [-104, ln FLT_MAX]\n", worst, worst_x);
    if (worst > 2.0) fail_msg("exp: %.3f ulp at %a", worst, worst_x);
    assert_true(ddt_cpu_expf(0.0f) == 1.0f && ddt_cpu_expf(-0.0f) == 1.0f);
    assert_true(ddt_cpu_expf(-INFINITY) == 0.0f && !signbit(ddt_cpu_expf(-INFINITY)));
    assert_true(isinf(ddt_cpu_expf(INFINITY)));
    free(x);
    free(ys);
    free(yp);
}

/* ------------------------------------------------------------------ attention invariance */

static bool same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* A poisoned output: [n][H][ld] with ld > rank, every float NaN. */
static float *nan_out(size_t count) {
    float *o = malloc(sizeof(float) * count);
    for (size_t i = 0; i < count; i++) o[i] = NAN;
    return o;
}

/* Every written float finite, every padding float of [n][H][ld] still NaN. */
static void check_written(const float *o, int32_t n, int32_t H, int32_t w, int32_t ld, const char *what) {
    for (int32_t t = 0; t < n; t++)
        for (int32_t h = 0; h < H; h++)
            for (int32_t k = 0; k < ld; k++) {
                float v = o[((size_t)t * H + h) * ld + k];
                if (k < w ? !isfinite(v) : !isnan(v))
                    fail_msg("%s: out[%d][%d][%d] = %g", what, t, h, k, v);
            }
}

typedef struct mla_case {
    int32_t n, H, rank, rd;
    int64_t n_prefix;
    float scale;
} mla_case;

/* Run the MLA attention of queries [n] (rows ql / qr with the given strides)
 * over kv with the given prefix and mask into a fresh poisoned [n][H][ld]. */
static float *run_mla(ddt_cpu_pool *pool, bool portable, int32_t n, int32_t H, int32_t rank, int32_t rd,
                      const float *ql, const float *qr, const float *kv, int64_t n_prefix, const uint64_t *vis,
                      int32_t words, float scale, int32_t ld) {
    float *out = nan_out((size_t)n * H * ld);
    ddt_mla_attn a = {.n = n, .n_heads = H, .rank = rank, .rope_dim = rd, .q_lat = ql,
                      .q_lat_ld_t = (int64_t)H * rank, .q_lat_ld_h = rank, .q_rope = qr,
                      .q_rope_ld_t = (int64_t)H * rd, .q_rope_ld_h = rd, .kv = kv, .kv_ld = rank + rd,
                      .n_prefix = n_prefix, .vis = vis, .vis_words = words, .scale = scale, .out = out,
                      .out_ld_t = (int64_t)H * ld, .out_ld_h = ld};
    if (portable) ddt_cpu_mla_attention_portable(pool, &a);
    else ddt_cpu_mla_attention(pool, &a);
    return out;
}

static void check_mla_invariance(const mla_case *mc, ddt_cpu_pool *const *pools, int n_pools) {
    const int32_t n = mc->n, H = mc->H, rank = mc->rank, rd = mc->rd, ld = rank + 3;
    const int64_t kvw = rank + rd, rows = mc->n_prefix + n;
    const int32_t words = (n + 63) / 64;
    float *kv = malloc(sizeof(float) * rows * kvw), *ql = malloc(sizeof(float) * n * H * rank),
          *qr = malloc(sizeof(float) * n * H * rd);
    fill(kv, (size_t)(rows * kvw));
    fill(ql, (size_t)n * H * rank);
    fill(qr, (size_t)n * H * rd);
    /* the causal batch on each pool, SIMD and portable: all the same bits */
    float *ref = run_mla(pools[0], false, n, H, rank, rd, ql, qr, kv, mc->n_prefix, NULL, words, mc->scale, ld);
    check_written(ref, n, H, rank, ld, "causal batch");
    for (int pi = 0; pi < n_pools; pi++)
        for (int port = 0; port < 2; port++) {
            float *o = run_mla(pools[pi], port, n, H, rank, rd, ql, qr, kv, mc->n_prefix, NULL, words, mc->scale, ld);
            check_written(o, n, H, rank, ld, "causal batch");
            for (int32_t t = 0; t < n; t++)
                for (int32_t h = 0; h < H; h++)
                    if (!same_bits(o + ((size_t)t * H + h) * ld, ref + ((size_t)t * H + h) * ld, (size_t)rank))
                        fail_msg("MLA n %d rank %d: token %d head %d differs on pool %d portable %d", n, rank, t, h, pi,
                                 port);
            free(o);
        }
    /* each query alone (a decode step over the prefix and the tokens before it) */
    for (int32_t t = 0; t < n; t++) {
        float *o = run_mla(pools[t % n_pools], false, 1, H, rank, rd, ql + (size_t)t * H * rank,
                           qr + (size_t)t * H * rd, kv, mc->n_prefix + t, NULL, 1, mc->scale, ld);
        check_written(o, 1, H, rank, ld, "alone");
        if (!same_bits(o, ref + (size_t)t * H * ld, (size_t)H * ld - 3))
            fail_msg("MLA n %d rank %d: token %d alone differs from the batch", n, rank, t);
        free(o);
    }
    /* a causal mask given as a tree mask (a chain): the same bits */
    uint64_t *vis = calloc((size_t)n * words, 8);
    for (int32_t t = 0; t < n; t++)
        for (int32_t j = 0; j <= t; j++) vis[t * words + j / 64] |= 1ull << (j % 64);
    float *o = run_mla(pools[n_pools - 1], false, n, H, rank, rd, ql, qr, kv, mc->n_prefix, vis, words, mc->scale, ld);
    if (!same_bits(o, ref, (size_t)n * H * ld - 3)) fail_msg("MLA n %d rank %d: chain mask differs", n, rank);
    free(o);
    /* a random tree: node t's output == a prefill of its path (prefix, then its
     * ancestors' rows and its own, compacted, causal) */
    memset(vis, 0, (size_t)n * words * 8);
    int32_t *parent = malloc(sizeof(int32_t) * n);
    for (int32_t i = 0; i < n; i++) {
        parent[i] = i > 0 ? (int32_t)(rnd_u32() % i) : -1;
        if (i > 0) memcpy(vis + i * words, vis + parent[i] * words, 8 * words);
        vis[i * words + i / 64] |= 1ull << (i % 64);
    }
    float *tree = run_mla(pools[0], false, n, H, rank, rd, ql, qr, kv, mc->n_prefix, vis, words, mc->scale, ld);
    check_written(tree, n, H, rank, ld, "tree");
    float *path = malloc(sizeof(float) * rows * kvw);
    for (int32_t t = 0; t < n; t++) {
        memcpy(path, kv, sizeof(float) * mc->n_prefix * kvw);
        int64_t len = mc->n_prefix;
        for (int32_t j = 0; j < n; j++)
            if ((vis[t * words + j / 64] >> (j % 64)) & 1)
                memcpy(path + len++ * kvw, kv + (mc->n_prefix + j) * kvw, sizeof(float) * kvw);
        /* the path's last row is t's own: a one-token prefill after len - 1 rows */
        for (int port = 0; port < 2; port++) {
            float *p1 = run_mla(pools[(t + port) % n_pools], port, 1, H, rank, rd, ql + (size_t)t * H * rank,
                                qr + (size_t)t * H * rd, path, len - 1, NULL, 1, mc->scale, ld);
            if (!same_bits(p1, tree + (size_t)t * H * ld, (size_t)H * ld - 3))
                fail_msg("MLA n %d rank %d: tree node %d differs from a prefill of its path (portable %d)", n, rank,
                         t, port);
            free(p1);
        }
    }
    /* and the whole path as a causal prefill gives node t's output as its last token */
    for (int32_t t = n - 1; t >= 0 && t >= n - 3; t--) {
        int32_t depth = 0;
        for (int32_t j = t; j >= 0; j = parent[j]) depth++;
        int32_t *ids = malloc(sizeof(int32_t) * depth);
        for (int32_t j = t, d = depth - 1; j >= 0; j = parent[j]) ids[d--] = j;
        float *pl = malloc(sizeof(float) * depth * H * rank), *pr = malloc(sizeof(float) * depth * H * rd);
        memcpy(path, kv, sizeof(float) * mc->n_prefix * kvw);
        for (int32_t d = 0; d < depth; d++) {
            memcpy(path + (mc->n_prefix + d) * kvw, kv + (mc->n_prefix + ids[d]) * kvw, sizeof(float) * kvw);
            memcpy(pl + (size_t)d * H * rank, ql + (size_t)ids[d] * H * rank, sizeof(float) * H * rank);
            memcpy(pr + (size_t)d * H * rd, qr + (size_t)ids[d] * H * rd, sizeof(float) * H * rd);
        }
        float *pf = run_mla(pools[1 % n_pools], false, depth, H, rank, rd, pl, pr, path, mc->n_prefix, NULL,
                            (depth + 63) / 64, mc->scale, ld);
        for (int32_t d = 0; d < depth; d++)
            if (!same_bits(pf + (size_t)d * H * ld, tree + (size_t)ids[d] * H * ld, (size_t)H * ld - 3))
                fail_msg("MLA n %d rank %d: prefill of node %d's path differs at depth %d", n, rank, t, d);
        free(ids);
        free(pl);
        free(pr);
        free(pf);
    }
    free(path);
    free(parent);
    free(tree);
    free(vis);
    free(ref);
    free(kv);
    free(ql);
    free(qr);
}

static void test_mla_attention_invariance(void **state) {
    (void)state;
    g_rng = 0xA0761D6478BD642Full;
    ddt_cpu_pool *p2 = NULL, *p3 = NULL;
    ddt_error err;
    assert_int_equal(ddt_cpu_pool_create(2, &p2, &err), DDT_OK);
    assert_int_equal(ddt_cpu_pool_create(3, &p3, &err), DDT_OK);
    ddt_cpu_pool *pools[] = {NULL, p2, p3};
    const mla_case cases[] = {
        {.n = 21, .H = 3, .rank = 37, .rd = 7, .n_prefix = 45, .scale = 0.41f},
        {.n = 1, .H = 5, .rank = 64, .rd = 16, .n_prefix = 33, .scale = 0.125f},
        {.n = 33, .H = 4, .rank = 64, .rd = 16, .n_prefix = 70, .scale = 0.125f},
        {.n = 17, .H = 9, .rank = 19, .rd = 6, .n_prefix = 0, .scale = 0.9f},
        {.n = 70, .H = 2, .rank = 131, .rd = 5, .n_prefix = 16, .scale = 3.0f}, /* big scores: underflowing p */
        {.n = 5, .H = 1, .rank = 16, .rd = 0, .n_prefix = 11, .scale = 0.3f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) check_mla_invariance(&cases[c], pools, 3);
    ddt_cpu_pool_destroy(p2);
    ddt_cpu_pool_destroy(p3);
}

/* DFlash block attention: against a double reference, SIMD == portable, every
 * query row bitwise the same alone as in the block, on any pool. */
static void check_dflash(int32_t nb, int32_t heads, int32_t kvh, int32_t hd, int64_t n_rows, float scale,
                         ddt_cpu_pool *const *pools, int n_pools) {
    const int64_t qd = (int64_t)heads * hd, kvd = (int64_t)kvh * hd;
    float *q = malloc(sizeof(float) * nb * qd), *k = malloc(sizeof(float) * n_rows * kvd),
          *v = malloc(sizeof(float) * n_rows * kvd);
    fill(q, (size_t)(nb * qd));
    fill(k, (size_t)(n_rows * kvd));
    fill(v, (size_t)(n_rows * kvd));
    float *ref = NULL;
    for (int pi = 0; pi < n_pools; pi++)
        for (int port = 0; port < 2; port++) {
            float *o = nan_out((size_t)(nb * qd));
            ddt_cpu_dflash_attn a = {.n_block = nb, .heads = heads, .kv_heads = kvh, .hd = hd, .scale = scale,
                                     .q = q, .k = k, .v = v, .n_rows = n_rows, .o = o};
            if (port) ddt_cpu_dflash_attention_portable(pools[pi], &a);
            else ddt_cpu_dflash_attention(pools[pi], &a);
            check_written(o, nb, heads, hd, hd, "dflash");
            if (!ref) {
                ref = o;
                continue;
            }
            if (!same_bits(o, ref, (size_t)(nb * qd)))
                fail_msg("dflash nb %d hd %d: pool %d portable %d differs", nb, hd, pi, port);
            free(o);
        }
    for (int32_t t = 0; t < nb; t++) {
        float *o = nan_out((size_t)qd);
        ddt_cpu_dflash_attn a = {.n_block = 1, .heads = heads, .kv_heads = kvh, .hd = hd, .scale = scale,
                                 .q = q + t * qd, .k = k, .v = v, .n_rows = n_rows, .o = o};
        ddt_cpu_dflash_attention(pools[t % n_pools], &a);
        if (!same_bits(o, ref + t * qd, (size_t)qd)) fail_msg("dflash nb %d hd %d: row %d alone differs", nb, hd, t);
        free(o);
    }
    double *dr = malloc(sizeof(double) * nb * qd), *sc = malloc(sizeof(double) * n_rows);
    for (int32_t t = 0; t < nb; t++)
        for (int32_t h = 0; h < heads; h++) {
            int32_t g = h / (heads / kvh);
            double mx = -INFINITY, z = 0;
            for (int64_t r = 0; r < n_rows; r++) {
                double s = 0;
                for (int32_t j = 0; j < hd; j++) s += (double)q[t * qd + h * hd + j] * k[r * kvd + g * hd + j];
                sc[r] = s * scale;
                if (sc[r] > mx) mx = sc[r];
            }
            for (int64_t r = 0; r < n_rows; r++) z += exp(sc[r] - mx);
            for (int32_t j = 0; j < hd; j++) {
                double o = 0;
                for (int64_t r = 0; r < n_rows; r++) o += exp(sc[r] - mx) / z * v[r * kvd + g * hd + j];
                dr[t * qd + h * hd + j] = o;
            }
        }
    double e = norm_err(ref, dr, (size_t)(nb * qd));
    if (e > 1e-5) fail_msg("dflash nb %d hd %d rows %lld: error %g", nb, hd, (long long)n_rows, e);
    free(dr);
    free(sc);
    free(ref);
    free(q);
    free(k);
    free(v);
}

static void test_dflash_attention(void **state) {
    (void)state;
    g_rng = 0xE7037ED1A0B428DBull;
    ddt_cpu_pool *p2 = NULL, *p3 = NULL;
    ddt_error err;
    assert_int_equal(ddt_cpu_pool_create(2, &p2, &err), DDT_OK);
    assert_int_equal(ddt_cpu_pool_create(3, &p3, &err), DDT_OK);
    ddt_cpu_pool *pools[] = {NULL, p2, p3};
    check_dflash(16, 4, 2, 64, 53, 0.125f, pools, 3);
    check_dflash(7, 6, 3, 37, 40, 0.3f, pools, 3);
    check_dflash(3, 9, 1, 130, 17, 0.09f, pools, 3); /* 9 heads on one kv head: two groups of heads */
    check_dflash(5, 2, 2, 5, 1, 1.0f, pools, 3);
    ddt_cpu_pool_destroy(p2);
    ddt_cpu_pool_destroy(p3);
}

/* ------------------------------------------------------------------ router */

static int cmp_desc(const void *a, const void *b) {
    const double *x = a, *y = b; /* [value, index] pairs: value desc, index asc */
    if (x[0] != y[0]) return x[0] < y[0] ? 1 : -1;
    return x[1] < y[1] ? -1 : 1;
}

/* Naive router: sort-based, as a second implementation of HF's algorithm. */
static void ref_route(const float *lg, const ddt_moe_route_params *p, const float *bias, int32_t *idx, double *w) {
    int32_t E = p->n_experts, G = p->n_group, per = E / G;
    double s[64], ch[64], pairs[128], gp[128];
    for (int e = 0; e < E; e++) {
        s[e] = 1.0 / (1.0 + exp(-(double)lg[e]));
        ch[e] = s[e] + (bias ? bias[e] : 0.0);
    }
    for (int g = 0; g < G; g++) {
        for (int i = 0; i < per; i++) {
            pairs[2 * i] = ch[g * per + i];
            pairs[2 * i + 1] = i;
        }
        qsort(pairs, per, 2 * sizeof(double), cmp_desc);
        gp[2 * g] = pairs[0] + (per > 1 ? pairs[2] : 0);
        gp[2 * g + 1] = g;
    }
    qsort(gp, G, 2 * sizeof(double), cmp_desc);
    int keep[64] = {0};
    for (int k = 0; k < p->topk_group; k++) keep[(int)gp[2 * k + 1]] = 1;
    int m = 0;
    for (int e = 0; e < E; e++)
        if (keep[e / per]) {
            pairs[2 * m] = ch[e];
            pairs[2 * m + 1] = e;
            m++;
        }
    qsort(pairs, m, 2 * sizeof(double), cmp_desc);
    double sum = 0;
    for (int k = 0; k < p->top_k; k++) {
        idx[k] = (int32_t)pairs[2 * k + 1];
        w[k] = s[idx[k]];
        sum += w[k];
    }
    for (int k = 0; k < p->top_k; k++) w[k] = (p->norm_topk_prob ? w[k] / sum : w[k]) * p->routed_scaling_factor;
}

static void test_moe_route(void **state) {
    (void)state;
    const struct {
        int32_t E, k, G, kg;
        bool norm, bias;
    } cases[] = {{16, 3, 4, 2, true, true}, {16, 4, 1, 1, true, false}, {12, 2, 3, 1, false, true},
                 {9, 9, 1, 1, true, true}, {10, 2, 10, 3, true, true}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t n = 11;
        int32_t E = cases[c].E, K = cases[c].k;
        float lg[11 * 16], bias[16];
        fill(lg, n * E);
        for (int e = 0; e < E; e++) bias[e] = rnd_f() * 0.3f;
        ddt_moe_route_params p = {.n_experts = E, .top_k = K, .n_group = cases[c].G, .topk_group = cases[c].kg,
                                  .norm_topk_prob = cases[c].norm, .routed_scaling_factor = 2.5f,
                                  .bias = cases[c].bias ? bias : NULL};
        int32_t idx[11 * 16];
        float w[11 * 16];
        ddt_cpu_moe_route(lg, E, n, &p, idx, w);
        for (int64_t t = 0; t < n; t++) {
            int32_t ridx[16];
            double rw[16];
            ref_route(lg + t * E, &p, cases[c].bias ? bias : NULL, ridx, rw);
            for (int k = 0; k < K; k++) {
                if (idx[t * K + k] != ridx[k]) fail_msg("case %zu token %lld slot %d: expert %d, expected %d", c, (long long)t, k, idx[t * K + k], ridx[k]);
                assert_true(fabs(w[t * K + k] - rw[k]) < 1e-6 * (1 + fabs(rw[k])));
            }
        }
    }
}

/* The routed experts: against a double reference per token (experts in
 * increasing index, w * down(silu(gate x) * up x)), each token alone == in the
 * batch bit for bit, row padding untouched, a bad index giving a NaN row. */
static void test_moe_experts(void **state) {
    (void)state;
    enum { E = 6, H = 37, I = 23, K = 3, N = 9, LDX = 41, LDO = 40 };
    ddt_cpu_pool *pool = NULL;
    ddt_error err;
    assert_int_equal(ddt_cpu_pool_create(3, &pool, &err), DDT_OK);
    test_weight tw[E][3];
    ddt_cpu_mlp ex[E];
    for (int e = 0; e < E; e++) {
        make_weight(&tw[e][0], DDT_Q_DENSE, DDT_DTYPE_BF16, I, H, 0);
        make_weight(&tw[e][1], DDT_Q_DENSE, DDT_DTYPE_BF16, I, H, 0);
        make_weight(&tw[e][2], DDT_Q_DENSE, DDT_DTYPE_BF16, H, I, 0);
        ex[e] = (ddt_cpu_mlp){.gate = tw[e][0].q, .up = tw[e][1].q, .down = tw[e][2].q};
    }
    const ddt_cpu_moe_layer m = {.n_experts = E, .hidden = H, .inter = I, .experts = ex};
    float x[N * LDX], w[N * K], out[N * LDO], one[LDO];
    int32_t idx[N * K];
    fill(x, N * LDX);
    for (int t = 0; t < N; t++)
        for (int k = 0; k < K; k++) {
            /* distinct experts in a scrambled order; token 0's first expert shared by all */
            idx[t * K + k] = k == 0 ? (t == 0 ? 4 : idx[0]) : (idx[t * K] + 2 * k + t) % E;
            if (k == 2 && idx[t * K + 2] == idx[t * K + 1]) idx[t * K + 2] = (idx[t * K + 2] + 1) % E;
            if (k > 0 && idx[t * K + k] == idx[t * K]) idx[t * K + k] = (idx[t * K + k] + 3) % E;
            w[t * K + k] = 0.5f + 0.5f * rnd_f();
        }
    void *ws = malloc(ddt_cpu_moe_workspace_bytes(&m, N, K));
    assert_non_null(ws);
    assert_true(ddt_cpu_moe_workspace_bytes(&m, 1, K) <= ddt_cpu_moe_workspace_bytes(&m, N, K));
    for (int i = 0; i < N * LDO; i++) out[i] = -7.0f;
    ddt_cpu_moe_experts(pool, &m, x, LDX, N, idx, w, K, out, LDO, ws);
    double ref[N * H];
    float got[N * H];
    for (int t = 0; t < N; t++) {
        for (int d = 0; d < H; d++) ref[t * H + d] = 0.0;
        for (int e = 0; e < E; e++)
            for (int k = 0; k < K; k++) {
                if (idx[t * K + k] != e) continue;
                double h[I];
                for (int i = 0; i < I; i++) {
                    double gv = 0, uv = 0;
                    for (int j = 0; j < H; j++) {
                        gv += tw[e][0].dense[i * H + j] * x[t * LDX + j];
                        uv += tw[e][1].dense[i * H + j] * x[t * LDX + j];
                    }
                    h[i] = gv / (1.0 + exp(-gv)) * uv;
                }
                for (int d = 0; d < H; d++) {
                    double o = 0;
                    for (int i = 0; i < I; i++) o += tw[e][2].dense[d * I + i] * h[i];
                    ref[t * H + d] += w[t * K + k] * o;
                }
            }
        for (int d = 0; d < H; d++) got[t * H + d] = out[t * LDO + d];
        for (int d = H; d < LDO; d++) assert_true(out[t * LDO + d] == -7.0f);
    }
    assert_true(norm_err(got, ref, N * H) < 1e-5);
    for (int t = 0; t < N; t++) {
        ddt_cpu_moe_experts(pool, &m, x + t * LDX, LDX, 1, idx + t * K, w + t * K, K, one, LDO, ws);
        assert_memory_equal(one, out + t * LDO, sizeof(float) * H);
    }
    /* token 1 routed outside the layer: its row NaN, the others as before */
    float bad[N * LDO];
    idx[K + 1] = E;
    ddt_cpu_moe_experts(pool, &m, x, LDX, N, idx, w, K, bad, LDO, ws);
    for (int d = 0; d < H; d++) assert_true(isnan(bad[LDO + d]));
    for (int t = 0; t < N; t++)
        if (t != 1) assert_memory_equal(bad + t * LDO, out + t * LDO, sizeof(float) * H);
    free(ws);
    for (int e = 0; e < E; e++)
        for (int j = 0; j < 3; j++) free_weight(&tw[e][j]);
    ddt_cpu_pool_destroy(pool);
}

/* ------------------------------------------------------------------ pool */

typedef struct mark_ctx {
    int *count;
} mark_ctx;

/* Slices are disjoint, so each item is written by exactly one thread. */
static void mark_task(void *p, int64_t b, int64_t e, int32_t thread) {
    (void)thread;
    mark_ctx *m = p;
    for (int64_t i = b; i < e; i++) m->count[i] += 1;
}

static void test_pool(void **state) {
    (void)state;
    for (int32_t threads = 1; threads <= 5; threads++) {
        ddt_cpu_pool *pool = NULL;
        ddt_error err;
        assert_int_equal(ddt_cpu_pool_create(threads, &pool, &err), DDT_OK);
        assert_int_equal(ddt_cpu_pool_threads(pool), threads);
        for (int64_t n = 0; n < 40; n += 3) {
            int count[40] = {0};
            for (int rep = 0; rep < 3; rep++) {
                mark_ctx m = {.count = count};
                ddt_cpu_pool_run(pool, mark_task, &m, n);
            }
            for (int64_t i = 0; i < 40; i++) assert_int_equal(count[i], i < n ? 3 : 0);
        }
        ddt_cpu_pool_destroy(pool);
    }
    ddt_cpu_pool *pool = NULL;
    ddt_error err;
    assert_int_equal(ddt_cpu_pool_create(DDT_CPU_MAX_THREADS + 1, &pool, &err), DDT_ERR_RANGE);
    assert_null(pool);
    assert_int_equal(ddt_cpu_pool_create(0, &pool, &err), DDT_OK);
    assert_int_equal(ddt_cpu_pool_threads(pool), ddt_cpu_default_threads());
    ddt_cpu_pool_destroy(pool);
}

/* Both sleeping hand-offs: a job posted after the workers gave up polling and
 * slept, and a job whose worker slices outlast the caller's polling, so that the
 * caller sleeps and the last worker must wake it.  Then a burst of short jobs
 * (the polling path) in which no item may run twice or be lost. */
static void sleep_us(long us) {
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

typedef struct slow_ctx {
    atomic_int *count;
    int32_t slow_thread; /* this thread's slice sleeps past the spin */
} slow_ctx;

static void slow_task(void *p, int64_t b, int64_t e, int32_t thread) {
    slow_ctx *c = p;
    if (thread == c->slow_thread) sleep_us(3 * DDT_CPU_SPIN_US);
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&c->count[i], 1);
}

static void test_pool_hand_offs(void **state) {
    (void)state;
    for (int32_t threads = 2; threads <= 4; threads++) {
        ddt_cpu_pool *pool = NULL;
        ddt_error err;
        assert_int_equal(ddt_cpu_pool_create(threads, &pool, &err), DDT_OK);
        atomic_int count[64];
        for (int rep = 0; rep < 4; rep++) {
            for (int i = 0; i < 64; i++) atomic_init(&count[i], 0);
            /* the workers are asleep by now (or never polled: the first job) */
            sleep_us(4 * DDT_CPU_SPIN_US);
            slow_ctx c = {.count = count, .slow_thread = rep % threads == 0 ? 1 : rep % threads};
            ddt_cpu_pool_run(pool, slow_task, &c, 64);
            for (int i = 0; i < 64; i++) assert_int_equal(atomic_load(&count[i]), 1);
            /* the caller's own slice slow: the workers finish first, and poll */
            c.slow_thread = 0;
            ddt_cpu_pool_run(pool, slow_task, &c, 64);
            for (int i = 0; i < 64; i++) assert_int_equal(atomic_load(&count[i]), 2);
        }
        int plain[64] = {0};
        for (int job = 0; job < 20000; job++) {
            mark_ctx m = {.count = plain};
            ddt_cpu_pool_run(pool, mark_task, &m, 1 + job % 64);
        }
        for (int i = 0; i < 64; i++) {
            int expect = 0; /* jobs of n > i items */
            for (int job = 0; job < 20000; job++) expect += 1 + job % 64 > i;
            assert_int_equal(plain[i], expect);
        }
        ddt_cpu_pool_destroy(pool);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalar_decoders),
        cmocka_unit_test(test_matmul_formats),
        cmocka_unit_test(test_matmul_batch_invariance),
        cmocka_unit_test(test_matmul_simd_vs_portable),
        cmocka_unit_test(test_matmul_grouped_and_transposed),
        cmocka_unit_test(test_rmsnorm_and_silu),
        cmocka_unit_test(test_add_and_gather),
        cmocka_unit_test(test_rope_plain_and_rotation),
        cmocka_unit_test(test_rope_yarn_golden),
        cmocka_unit_test(test_dflash_norm_rope),
        cmocka_unit_test(test_mla_attention),
        cmocka_unit_test(test_attn_exp),
        cmocka_unit_test(test_mla_attention_invariance),
        cmocka_unit_test(test_dflash_attention),
        cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_moe_experts),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_pool_hand_offs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
