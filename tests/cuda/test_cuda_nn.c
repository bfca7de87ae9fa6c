/*
 * test_cuda_nn.c — the GPU norm ops (nn_cuda.h) against their CPU twins
 * (backend/cpu/nn.h), on fresh random rows of odd and real widths:
 *   - ddt_cuda_rmsnorm vs ddt_cpu_rmsnorm: normalised error < 1e-6 (fp32 sums in
 *     another order), on the vector path (K2.6's 7168, 1536, a 512-wide slice of
 *     576-float rows) and the strided one (130 floats, 8200 > the register rows,
 *     a row start off 16 bytes); in place too; the padding of the output rows
 *     (NaN poison) never written;
 *   - ddt_cuda_add_rmsnorm: the stored sum bitwise the CPU's ddt_cpu_add, the norm
 *     within the same bound, and both bitwise ddt_cuda_add then ddt_cuda_rmsnorm;
 *   - every row alone bitwise the same row inside a batch;
 *   - ddt_cuda_rmsnorm_pair bitwise two ddt_cuda_rmsnorm launches, padding kept;
 *   - ddt_cuda_sum_parts (the multi-GPU all-reduce's rank-order sum): bitwise the
 *     host's ((p0 + p1) + p2) + ... for 1..8 parts of odd lengths, the output past
 *     count (NaN poison) never written; bad arguments refused.
 *   - ddt_cuda_unshard_cols (the multi-GPU logits' gather): every float where the
 *     host puts it for 1..8 parts of odd shapes, the row padding (NaN poison)
 *     untouched; bad arguments refused.
 * Needs the CPU backend: link with src/core, src/io, src/backend/cpu.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/nn.h"
#include "backend/cpu/pool.h"
#include "backend/cuda/nn_cuda.h"
#include "backend_ops.h"
#include "cuda_test.h"

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) & 0xFFFFFF) / 16777216.0f * 4.0f - 2.0f;
}

static ddt_cpu_pool *g_pool;

/* n rows of dim values at row stride ld (ld - dim padding floats), the x rows
 * starting `shift` floats into their buffer (shift 1: not 16-byte aligned). */
static void norm_case(int32_t dim, int64_t ld, int32_t n, int shift) {
    const size_t tot = (size_t)n * (size_t)ld + (size_t)shift;
    float *x = malloc(sizeof(float) * tot), *r = malloc(sizeof(float) * tot), *w = malloc(sizeof(float) * dim);
    float *ref = malloc(sizeof(float) * tot), *got = malloc(sizeof(float) * tot), *sum = malloc(sizeof(float) * tot);
    float *got2 = malloc(sizeof(float) * tot), *xs = malloc(sizeof(float) * tot);
    for (size_t i = 0; i < tot; i++) x[i] = frand(), r[i] = frand();
    for (int32_t i = 0; i < dim; i++) w[i] = 1.0f + 0.5f * frand();
    const float eps = 1e-6f;
    const ddt_cpu_vec wv = {w, DDT_DTYPE_F32, dim};
    float *dx, *dr, *dw, *dout, *dx2, *dout2;
    CU(cudaMalloc((void **)&dx, sizeof(float) * tot));
    CU(cudaMalloc((void **)&dr, sizeof(float) * tot));
    CU(cudaMalloc((void **)&dw, sizeof(float) * dim));
    CU(cudaMalloc((void **)&dout, sizeof(float) * tot));
    CU(cudaMalloc((void **)&dx2, sizeof(float) * tot));
    CU(cudaMalloc((void **)&dout2, sizeof(float) * tot));
    CU(cudaMemcpy(dx, x, sizeof(float) * tot, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dr, r, sizeof(float) * tot, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dw, w, sizeof(float) * dim, cudaMemcpyHostToDevice));
    char what[128];

    /* plain norm; the CPU reference leaves the padding as NaN too */
    memset(ref, 0xFF, sizeof(float) * tot);
    ddt_cpu_rmsnorm(g_pool, x + shift, ld, n, dim, &wv, eps, ref + shift, ld);
    bo_poison(dout, sizeof(float) * tot);
    OK(ddt_cuda_rmsnorm(dx + shift, ld, n, dim, dw, eps, dout + shift, ld, NULL, &err_));
    CU(cudaMemcpy(got, dout, sizeof(float) * tot, cudaMemcpyDeviceToHost));
    snprintf(what, sizeof what, "rmsnorm dim %d ld %lld n %d shift %d", dim, (long long)ld, n, shift);
    const double e1 = bo_compare(what, got, ref, tot, (bo_cmp){1e-6, false});
    int64_t pad = 0;
    for (size_t i = 0; i < tot; i++) pad += isnan(ref[i]) && !isnan(got[i]);
    CHECK(pad == 0, "%s: %lld padding values written", what, (long long)pad);

    /* in place */
    CU(cudaMemcpy(dx2, dx, sizeof(float) * tot, cudaMemcpyDeviceToDevice));
    OK(ddt_cuda_rmsnorm(dx2 + shift, ld, n, dim, dw, eps, dx2 + shift, ld, NULL, &err_));
    CU(cudaMemcpy(got2, dx2, sizeof(float) * tot, cudaMemcpyDeviceToHost));
    int64_t inplace = 0;
    for (int32_t t = 0; t < n; t++)
        inplace += memcmp(got2 + shift + (size_t)t * ld, got + shift + (size_t)t * ld, sizeof(float) * dim) != 0;
    CHECK(inplace == 0, "%s: in place differs in %lld rows", what, (long long)inplace);

    /* every row alone */
    int64_t alone = 0;
    for (int32_t t = 0; t < n; t++) {
        bo_poison(dout2, sizeof(float) * tot);
        OK(ddt_cuda_rmsnorm(dx + shift + (size_t)t * ld, ld, 1, dim, dw, eps, dout2, ld, NULL, &err_));
        CU(cudaMemcpy(got2, dout2, sizeof(float) * dim, cudaMemcpyDeviceToHost));
        alone += memcmp(got2, got + shift + (size_t)t * ld, sizeof(float) * dim) != 0;
    }
    CHECK(alone == 0, "%s: %lld rows differ alone vs in the batch", what, (long long)alone);

    /* the fused residual add + norm */
    memcpy(sum, x, sizeof(float) * tot);
    for (int32_t t = 0; t < n; t++) ddt_cpu_add(sum + shift + (size_t)t * ld, r + shift + (size_t)t * ld, dim);
    memset(ref, 0xFF, sizeof(float) * tot);
    ddt_cpu_rmsnorm(g_pool, sum + shift, ld, n, dim, &wv, eps, ref + shift, ld);
    CU(cudaMemcpy(dx2, dx, sizeof(float) * tot, cudaMemcpyDeviceToDevice));
    bo_poison(dout, sizeof(float) * tot);
    OK(ddt_cuda_add_rmsnorm(dx2 + shift, ld, dr + shift, ld, n, dim, dw, eps, dout + shift, ld, NULL, &err_));
    CU(cudaMemcpy(got, dout, sizeof(float) * tot, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(xs, dx2, sizeof(float) * tot, cudaMemcpyDeviceToHost));
    snprintf(what, sizeof what, "add_rmsnorm sum dim %d ld %lld n %d shift %d", dim, (long long)ld, n, shift);
    bo_compare(what, xs, sum, tot, (bo_cmp){0, true});
    snprintf(what, sizeof what, "add_rmsnorm norm dim %d ld %lld n %d shift %d", dim, (long long)ld, n, shift);
    const double e2 = bo_compare(what, got, ref, tot, (bo_cmp){1e-6, false});
    /* == the two launches it replaces (x rows contiguous for ddt_cuda_add: ld == dim only) */
    if (ld == dim) {
        CU(cudaMemcpy(dx2, dx, sizeof(float) * tot, cudaMemcpyDeviceToDevice));
        OK(ddt_cuda_add(dx2 + shift, dr + shift, (int64_t)n * ld, NULL, &err_));
        bo_poison(dout2, sizeof(float) * tot);
        OK(ddt_cuda_rmsnorm(dx2 + shift, ld, n, dim, dw, eps, dout2 + shift, ld, NULL, &err_));
        CU(cudaMemcpy(got2, dout2, sizeof(float) * tot, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "add_rmsnorm vs add + rmsnorm dim %d n %d shift %d", dim, n, shift);
        bo_compare(what, got2, got, tot, (bo_cmp){0, true});
    }
    printf("rmsnorm dim %5d ld %5lld n %2d shift %d: err %.2e, fused add err %.2e\n", dim, (long long)ld, n, shift, e1,
           e2);
    cudaFree(dx), cudaFree(dr), cudaFree(dw), cudaFree(dout), cudaFree(dx2), cudaFree(dout2);
    free(x), free(r), free(w), free(ref), free(got), free(sum), free(got2), free(xs);
}

/* ddt_cuda_rmsnorm_pair bitwise two ddt_cuda_rmsnorm calls: job 0 in place
 * (as the q_a latent), job 1 out of place from a slice of wider rows (as kv_a's
 * latent); the padding of every output row (NaN poison) never written. */
static void norm_pair_case(int32_t dim0, int64_t ld0, int32_t dim1, int64_t ld1, int32_t n) {
    const size_t t0 = (size_t)n * (size_t)ld0, t1 = (size_t)n * (size_t)ld1, to = (size_t)n * (size_t)dim1 + 3;
    float *x0 = malloc(sizeof(float) * t0), *x1 = malloc(sizeof(float) * t1), *w0 = malloc(sizeof(float) * dim0),
          *w1 = malloc(sizeof(float) * dim1);
    float *a0 = malloc(sizeof(float) * t0), *b0 = malloc(sizeof(float) * t0), *a1 = malloc(sizeof(float) * to),
          *b1 = malloc(sizeof(float) * to);
    for (size_t i = 0; i < t0; i++) x0[i] = frand();
    for (size_t i = 0; i < t1; i++) x1[i] = frand();
    for (int32_t i = 0; i < dim0; i++) w0[i] = 1.0f + 0.5f * frand();
    for (int32_t i = 0; i < dim1; i++) w1[i] = 1.0f + 0.5f * frand();
    float *dx0, *dy0, *dx1, *dw0, *dw1, *do1, *dp1;
    CU(cudaMalloc((void **)&dx0, sizeof(float) * t0));
    CU(cudaMalloc((void **)&dy0, sizeof(float) * t0));
    CU(cudaMalloc((void **)&dx1, sizeof(float) * t1));
    CU(cudaMalloc((void **)&dw0, sizeof(float) * dim0));
    CU(cudaMalloc((void **)&dw1, sizeof(float) * dim1));
    CU(cudaMalloc((void **)&do1, sizeof(float) * to));
    CU(cudaMalloc((void **)&dp1, sizeof(float) * to));
    CU(cudaMemcpy(dx0, x0, sizeof(float) * t0, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dy0, x0, sizeof(float) * t0, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dx1, x1, sizeof(float) * t1, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dw0, w0, sizeof(float) * dim0, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dw1, w1, sizeof(float) * dim1, cudaMemcpyHostToDevice));
    CU(cudaMemset(do1, 0xFF, sizeof(float) * to)); /* NaN */
    CU(cudaMemset(dp1, 0xFF, sizeof(float) * to));
    const float eps = 1e-6f;
    /* the reference: two launches */
    OK(ddt_cuda_rmsnorm(dx0, ld0, n, dim0, dw0, eps, dx0, ld0, NULL, &err_));
    OK(ddt_cuda_rmsnorm(dx1, ld1, n, dim1, dw1, eps, do1 + 3, dim1, NULL, &err_));
    const ddt_cuda_norm_job jobs[2] = {{dy0, ld0, dim0, dw0, dy0, ld0}, {dx1, ld1, dim1, dw1, dp1 + 3, dim1}};
    OK(ddt_cuda_rmsnorm_pair(jobs, n, eps, NULL, &err_));
    CU(cudaMemcpy(a0, dx0, sizeof(float) * t0, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(b0, dy0, sizeof(float) * t0, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(a1, do1, sizeof(float) * to, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(b1, dp1, sizeof(float) * to, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(a0, b0, sizeof(float) * t0), "rmsnorm_pair job 0 (in place, dim %d ld %lld n %d) != rmsnorm", dim0,
          (long long)ld0, n);
    CHECK(!memcmp(a1, b1, sizeof(float) * to), "rmsnorm_pair job 1 (dim %d of ld %lld, n %d) != rmsnorm", dim1,
          (long long)ld1, n);
    int poisoned = 0;
    for (int i = 0; i < 3; i++) poisoned += isnan(b1[i]) ? 1 : 0;
    CHECK(poisoned == 3, "rmsnorm_pair wrote before its output rows");
    /* job 0's padding columns are its input's: untouched */
    int kept = 1;
    for (int32_t t = 0; t < n; t++)
        for (int64_t i = dim0; i < ld0; i++) kept &= !memcmp(&b0[t * ld0 + i], &x0[t * ld0 + i], sizeof(float));
    CHECK(kept, "rmsnorm_pair wrote job 0's padding");
    printf("rmsnorm_pair dims %d/%lld + %d/%lld, n %d: bitwise the two launches\n", dim0, (long long)ld0, dim1,
           (long long)ld1, n);
    cudaFree(dx0), cudaFree(dy0), cudaFree(dx1), cudaFree(dw0), cudaFree(dw1), cudaFree(do1), cudaFree(dp1);
    free(x0), free(x1), free(w0), free(w1), free(a0), free(b0), free(a1), free(b1);
}

/* ddt_cuda_sum_parts against the host's sum in part order, bitwise. */
static void sum_parts_case(int32_t n_parts, int64_t count) {
    const size_t pn = (size_t)n_parts * (size_t)count, pad = 37;
    float *hp = malloc(pn * sizeof(float)), *want = malloc((size_t)count * sizeof(float));
    float *got = malloc(((size_t)count + pad) * sizeof(float));
    for (size_t i = 0; i < pn; i++) hp[i] = frand() * (float)(1 + (i % 7) * 1000); /* mixed magnitudes: order shows */
    for (int64_t i = 0; i < count; i++) {
        float s = hp[i];
        for (int32_t k = 1; k < n_parts; k++) s = s + hp[(size_t)k * (size_t)count + (size_t)i];
        want[i] = s;
    }
    float *dp, *dout;
    CU(cudaMalloc((void **)&dp, pn * sizeof(float)));
    CU(cudaMalloc((void **)&dout, ((size_t)count + pad) * sizeof(float)));
    CU(cudaMemcpy(dp, hp, pn * sizeof(float), cudaMemcpyHostToDevice));
    CU(cudaMemset(dout, 0xFF, ((size_t)count + pad) * sizeof(float))); /* NaN */
    OK(ddt_cuda_sum_parts(dp, n_parts, count, dout, NULL, &err_));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(got, dout, ((size_t)count + pad) * sizeof(float), cudaMemcpyDeviceToHost));
    int64_t bad = 0, stray = 0;
    for (int64_t i = 0; i < count; i++) bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    for (size_t i = 0; i < pad; i++) stray += !isnan(got[(size_t)count + i]);
    CHECK(bad == 0 && stray == 0, "sum_parts %d x %lld: %lld values not the host's rank-order sum, %lld written past",
          n_parts, (long long)count, (long long)bad, (long long)stray);
    printf("sum_parts %d parts x %lld floats: bitwise the host's rank-order sum\n", n_parts, (long long)count);
    CU(cudaFree(dp));
    CU(cudaFree(dout));
    free(hp), free(want), free(got);
}

static void sum_parts_errors(void) {
    ddt_error e;
    CHECK(ddt_cuda_sum_parts(NULL, 0, 10, NULL, NULL, &e) == DDT_ERR_INVALID && strstr(e.msg, "0 parts"),
          "sum_parts of 0 parts accepted");
    CHECK(ddt_cuda_sum_parts(NULL, 2, -1, NULL, NULL, &e) == DDT_ERR_INVALID, "sum_parts of -1 floats accepted");
    CHECK(ddt_cuda_sum_parts(NULL, 3, 0, NULL, NULL, &e) == DDT_OK, "sum_parts of 0 floats refused");
}

/* ddt_cuda_unshard_cols against the host's placement, bitwise, padding untouched. */
static void unshard_case(int32_t n_parts, int64_t rows, int64_t cols, int64_t pad) {
    const int64_t ldo = n_parts * cols + pad;
    const size_t pn = (size_t)n_parts * (size_t)rows * (size_t)cols, on = (size_t)rows * (size_t)ldo;
    float *hp = malloc((pn ? pn : 1) * sizeof(float)), *got = malloc((on ? on : 1) * sizeof(float));
    for (size_t i = 0; i < pn; i++) hp[i] = frand();
    float *dp, *dout;
    CU(cudaMalloc((void **)&dp, (pn ? pn : 1) * sizeof(float)));
    CU(cudaMalloc((void **)&dout, (on ? on : 1) * sizeof(float)));
    CU(cudaMemcpy(dp, hp, pn * sizeof(float), cudaMemcpyHostToDevice));
    CU(cudaMemset(dout, 0xFF, (on ? on : 1) * sizeof(float))); /* NaN */
    OK(ddt_cuda_unshard_cols(dp, n_parts, rows, cols, dout, ldo, NULL, &err_));
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(got, dout, on * sizeof(float), cudaMemcpyDeviceToHost));
    int64_t bad = 0, stray = 0;
    for (int64_t t = 0; t < rows; t++) {
        for (int32_t k = 0; k < n_parts; k++)
            for (int64_t j = 0; j < cols; j++)
                bad += memcmp(&got[t * ldo + k * cols + j], &hp[((size_t)k * (size_t)rows + (size_t)t) * (size_t)cols + (size_t)j],
                              sizeof(float)) != 0;
        for (int64_t j = n_parts * cols; j < ldo; j++) stray += !isnan(got[t * ldo + j]);
    }
    CHECK(bad == 0 && stray == 0, "unshard_cols %d x [%lld, %lld] pad %lld: %lld floats misplaced, %lld padding written",
          n_parts, (long long)rows, (long long)cols, (long long)pad, (long long)bad, (long long)stray);
    printf("unshard_cols %d parts of [%lld, %lld], row padding %lld: every float in place\n", n_parts, (long long)rows,
           (long long)cols, (long long)pad);
    CU(cudaFree(dp));
    CU(cudaFree(dout));
    free(hp), free(got);
}

static void unshard_errors(void) {
    ddt_error e;
    CHECK(ddt_cuda_unshard_cols(NULL, 0, 2, 3, NULL, 10, NULL, &e) == DDT_ERR_INVALID, "unshard of 0 parts accepted");
    CHECK(ddt_cuda_unshard_cols(NULL, 2, 2, 3, NULL, 5, NULL, &e) == DDT_ERR_INVALID && strstr(e.msg, "rows of 5"),
          "unshard into rows narrower than the parts accepted");
    CHECK(ddt_cuda_unshard_cols(NULL, 2, -1, 3, NULL, 6, NULL, &e) == DDT_ERR_INVALID, "unshard of -1 rows accepted");
    CHECK(ddt_cuda_unshard_cols(NULL, 4, 0, 3, NULL, 12, NULL, &e) == DDT_OK, "unshard of 0 rows refused");
}

int main(int argc, char **argv) {
    const bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    OK(ddt_cpu_pool_create(2, &g_pool, &err_));
    norm_case(7168, 7168, 3, 0);   /* K2.6 hidden: vector path */
    norm_case(1536, 1536, 17, 0);  /* q_lora */
    norm_case(512, 576, 5, 0);     /* the latent slice of kv_a's rows */
    norm_case(130, 130, 4, 0);     /* not a multiple of 4: strided path */
    norm_case(256, 256, 2, 1);     /* rows off 16 bytes: strided path */
    norm_pair_case(128, 208, 64, 80, 65);      /* the shipped target: q_lora 128 | kv_a 80 side by side */
    norm_pair_case(1536, 2112, 512, 576, 3);   /* K2.6 */
    norm_pair_case(37, 101, 130, 131, 7);      /* odd: strided paths */
    sum_parts_case(1, 1001);                   /* one rank: a copy */
    sum_parts_case(2, 7168);                   /* K2.6's hidden row */
    sum_parts_case(3, 4099);
    sum_parts_case(8, 17 * 7168 + 5);          /* eight ranks, a tree's rows and a tail */
    sum_parts_case(5, 1);
    sum_parts_errors();
    unshard_case(1, 3, 4352, 0);               /* one rank: a copy */
    unshard_case(2, 17, 2176, 0);              /* the shipped pair's logits over 2 GPUs, a tree of 17 */
    unshard_case(8, 1, 20480, 0);              /* K2.6's over 8, an ar step */
    unshard_case(3, 5, 37, 11);                /* odd, padded rows */
    unshard_case(5, 64, 33, 1);
    unshard_errors();
    if (!quick) {
        norm_case(8200, 8200, 2, 0); /* wider than the register rows: strided path */
        norm_case(7168, 7168, 64, 0);
        norm_case(31, 37, 9, 0);
    }
    ddt_cpu_pool_destroy(g_pool);
    return ct_report("test_cuda_nn");
}
