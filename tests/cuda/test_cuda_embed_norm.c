/*
 * test_cuda_embed_norm.c — the embedding gather fused with the first layer's input
 * norm (ddt_cuda_embed_rmsnorm, qmatmul_cuda.h), against what it replaces in the
 * target's forward and the drafter's draft: ddt_cuda_embed then ddt_cuda_rmsnorm
 * (and, with first_id, the drafter's copy of the bonus into ids[0] before them).
 * Bitwise, whole buffers (padding included):
 *   - every weight format the gather reads (F32, BF16, F16, FP8 128-blocks, INT4
 *     group 32), hidden sizes off every multiple (7, 33, 259, 1029, 8196: the
 *     norm's strided path), sizes whose rows take the norm's register path (256,
 *     1024, 4096: 1 to 4 float4 a thread), and a size of the register path pushed
 *     onto the strided one by a row stride that is not a multiple of 4 or by a
 *     base pointer off 16 bytes;
 *   - n = 1, 3, 17, 65 tokens; NaN-poisoned x and xn with padded rows (ldx, ldxn >
 *     H, different from each other) that must stay poisoned; ids out of range
 *     (-1, vocab: NaN rows, a NaN norm) among the good ones;
 *   - with first_id (row 0 reads it, ids[0] holds a different token, which must not
 *     show) and without; a first_id out of range; xn equal to x (in place).
 *   - refusals: NULL weight / ids / x / norm weight / xn, n < 1, n > 65535, row
 *     strides below the hidden size, a weight format the gather refuses.
 * --quick: fewer cases (for compute-sanitizer).
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/qmatmul.h"
#include "backend/cuda/nn_cuda.h"
#include "backend/cuda/qmatmul_cuda.h"
#include "cuda_test.h"

static uint64_t g_rng = 0x6A09E667F3BCC909ull;
static float frand(void) { return ct_frand(&g_rng); }
/* F16: biased exponents 0..14 (values below 1, some subnormal), finite */
static const ct_weight_values k_values = {0.5f, 15, 0.01f, 0.02f};
static const char *const k_fmt[5] = {"F32", "BF16", "F16", "FP8", "INT4"};
#define VOCAB 61

static void *dev_alloc_copy(const void *h, size_t bytes) {
    void *d;
    CU(cudaMalloc(&d, bytes));
    CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* Whether two device buffers hold the same bytes; *first_diff: the first float
 * index that differs (-1 if none). */
static int same_floats(const float *dev_a, const float *dev_b, size_t n, int64_t *first_diff) {
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    CU(cudaMemcpy(a, dev_a, sizeof(float) * n, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(b, dev_b, sizeof(float) * n, cudaMemcpyDeviceToHost));
    *first_diff = -1;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) != 0) {
            *first_diff = (int64_t)i;
            break;
        }
    free(a);
    free(b);
    return *first_diff < 0;
}

/*
 * One case: weight format f, hidden size H, n tokens, row strides H + xpad and
 * H + npad, base pointers shifted by `shift` floats (1: off 16 bytes), first: 0 no
 * first_id, 1 an in-range first_id, 2 one out of range; in_place: xn = x.
 */
static void run_case(int f, int H, int n, int xpad, int npad, int shift, int first, int in_place) {
    ct_weight hw = ct_make_weight(&g_rng, f, VOCAB, H, &k_values);
    ddt_qweight dw;
    OK(ddt_cuda_qweight_upload(&hw.w, &dw, &err_));
    const int64_t ldx = H + xpad, ldxn = in_place ? ldx : H + npad;
    const size_t nx = (size_t)shift + (size_t)n * (size_t)ldx, nxn = (size_t)shift + (size_t)n * (size_t)ldxn;

    /* the fused call's ids: token 0 is a mask-like id that must not show when
     * first_id is given; out-of-range ids in the middle of larger batches */
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n), *ids_ref = malloc(sizeof(int32_t) * (size_t)n);
    for (int t = 0; t < n; t++) ids[t] = (int32_t)(ct_xorshift(&g_rng, 16) % VOCAB);
    if (n >= 3) ids[n / 2] = -1, ids[n - 1] = VOCAB;
    ids[0] = VOCAB - 1;
    const int32_t first_id = first == 2 ? VOCAB + 7 : (int32_t)(ct_xorshift(&g_rng, 16) % (VOCAB - 1));
    memcpy(ids_ref, ids, sizeof(int32_t) * (size_t)n);
    if (first) ids_ref[0] = first_id; /* what the drafter's copy used to put there */

    float *nw = malloc(sizeof(float) * (size_t)H);
    for (int i = 0; i < H; i++) nw[i] = 1.0f + 0.3f * frand();
    float *poison = malloc(sizeof(float) * (nx > nxn ? nx : nxn));
    ct_poison(poison, nx > nxn ? nx : nxn);

    int32_t *d_ids = dev_alloc_copy(ids, sizeof(int32_t) * (size_t)n);
    int32_t *d_ids_ref = dev_alloc_copy(ids_ref, sizeof(int32_t) * (size_t)n);
    int32_t *d_first = dev_alloc_copy(&first_id, sizeof(int32_t));
    float *d_nw = dev_alloc_copy(nw, sizeof(float) * (size_t)H);
    float *d_x[2], *d_xn[2];
    for (int k = 0; k < 2; k++) {
        d_x[k] = dev_alloc_copy(poison, sizeof(float) * nx);
        d_xn[k] = in_place ? d_x[k] : dev_alloc_copy(poison, sizeof(float) * nxn);
    }
    float *x0 = d_x[0] + shift, *xn0 = d_xn[0] + shift, *x1 = d_x[1] + shift, *xn1 = d_xn[1] + shift;

    /* k = 0: the two launches the engine ran (ids already holding the first token) */
    OK(ddt_cuda_embed(&dw, d_ids_ref, n, x0, ldx, NULL, &err_));
    OK(ddt_cuda_rmsnorm(x0, ldx, n, H, d_nw, 1e-6f, xn0, ldxn, NULL, &err_));
    /* k = 1: fused */
    OK(ddt_cuda_embed_rmsnorm(&dw, d_ids, first ? d_first : NULL, n, x1, ldx, d_nw, 1e-6f, xn1, ldxn, NULL, &err_));
    CU(cudaDeviceSynchronize());

    int64_t dx = -1, dxn = -1;
    const int sx = same_floats(d_x[0], d_x[1], nx, &dx);
    const int sxn = in_place ? 1 : same_floats(d_xn[0], d_xn[1], nxn, &dxn);
    CHECK(sx && sxn, "%s H %d n %d ldx %lld ldxn %lld shift %d first %d%s: x %s (first diff %lld), xn %s (%lld)",
          k_fmt[f], H, n, (long long)ldx, (long long)ldxn, shift, first, in_place ? " in place" : "",
          sx ? "ok" : "DIFFER", (long long)dx, sxn ? "ok" : "DIFFER", (long long)dxn);

    /* the case tests something: the reference wrote every row's H values (finite
     * for a good id, NaN for a bad one), left the padding poisoned, and row 0 came
     * from the first token, not ids[0] */
    float *hx = malloc(sizeof(float) * nxn), *hrow = malloc(sizeof(float) * (size_t)H);
    CU(cudaMemcpy(hx, d_xn[0], sizeof(float) * nxn, cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (int t = 0; t < n; t++) {
        const int good = ids_ref[t] >= 0 && ids_ref[t] < VOCAB;
        const float *r = hx + shift + (size_t)t * (size_t)ldxn;
        for (int i = 0; i < H; i++) bad += ct_is_poison(&r[i]) || (good ? !isfinite(r[i]) : !isnan(r[i]));
        for (int64_t i = H; i < ldxn; i++) bad += !ct_is_poison(&r[i]);
    }
    for (int i = 0; i < shift; i++) bad += !ct_is_poison(&hx[i]);
    CHECK(bad == 0, "%s H %d n %d: the reference norm wrote %lld unexpected values", k_fmt[f], H, n, (long long)bad);
    if (first == 1 && !in_place) { /* row 0 of x: the first token's embedding, not ids[0]'s */
        CU(cudaMemcpy(hx, d_x[1], sizeof(float) * nx, cudaMemcpyDeviceToHost));
        ddt_cpu_dequant(&hw.w, first_id, 0, H, hrow);
        CHECK(memcmp(hx + shift, hrow, sizeof(float) * (size_t)H) == 0, "%s H %d: row 0 is not the first token's",
              k_fmt[f], H);
    }
    printf("%-4s H %4d n %2d ldx %4lld ldxn %4lld shift %d first %d%s: %s\n", k_fmt[f], H, n, (long long)ldx,
           (long long)ldxn, shift, first, in_place ? " in place" : "", sx && sxn && bad == 0 ? "bitwise" : "DIFFERENT");

    free(hx), free(hrow), free(ids), free(ids_ref), free(nw), free(poison);
    for (int k = 0; k < 2; k++) {
        CU(cudaFree(d_x[k]));
        if (!in_place) CU(cudaFree(d_xn[k]));
    }
    CU(cudaFree(d_ids));
    CU(cudaFree(d_ids_ref));
    CU(cudaFree(d_first));
    CU(cudaFree(d_nw));
    ddt_cuda_qweight_free(&dw);
    ct_free_weight(&hw);
}

static void refusals(void) {
    ct_weight hw = ct_make_weight(&g_rng, 0, VOCAB, 8, &k_values);
    ddt_qweight dw;
    OK(ddt_cuda_qweight_upload(&hw.w, &dw, &err_));
    float *buf;
    int32_t *ib;
    CU(cudaMalloc((void **)&buf, sizeof(float) * 1024));
    CU(cudaMalloc((void **)&ib, sizeof(int32_t) * 8));
    CU(cudaMemset(ib, 0, sizeof(int32_t) * 8));
    float *x = buf, *xn = buf + 256, *nw = buf + 512;
    ddt_error e;
#define REFUSED(call, what) CHECK((call) == DDT_ERR_INVALID, "not refused: %s", what)
    REFUSED(ddt_cuda_embed_rmsnorm(NULL, ib, NULL, 2, x, 8, nw, 1e-6f, xn, 8, NULL, &e), "NULL weight");
    REFUSED(ddt_cuda_embed_rmsnorm(&dw, NULL, NULL, 2, x, 8, nw, 1e-6f, xn, 8, NULL, &e), "NULL ids");
    REFUSED(ddt_cuda_embed_rmsnorm(&dw, ib, NULL, 2, NULL, 8, nw, 1e-6f, xn, 8, NULL, &e), "NULL x");
    REFUSED(ddt_cuda_embed_rmsnorm(&dw, ib, NULL, 2, x, 8, NULL, 1e-6f, xn, 8, NULL, &e), "NULL norm weight");
    REFUSED(ddt_cuda_embed_rmsnorm(&dw, ib, NULL, 2, x, 8, nw, 1e-6f, NULL, 8, NULL, &e), "NULL xn");
    REFUSED(ddt_cuda_embed_rmsnorm(&dw, ib, ib, 0, x, 8, nw, 1e-6f, xn, 8, NULL, &e), "n = 0");
    REFUSED(ddt_cuda_embed_rmsnorm(&dw, ib, NULL, -3, x, 8, nw, 1e-6f, xn, 8, NULL, &e), "n = -3");
    REFUSED(ddt_cuda_embed_rmsnorm(&dw, ib, NULL, 65536, x, 8, nw, 1e-6f, xn, 8, NULL, &e), "n = 65536");
    REFUSED(ddt_cuda_embed_rmsnorm(&dw, ib, NULL, 2, x, 7, nw, 1e-6f, xn, 8, NULL, &e), "ldx below the hidden size");
    REFUSED(ddt_cuda_embed_rmsnorm(&dw, ib, NULL, 2, x, 8, nw, 1e-6f, xn, 7, NULL, &e), "ldxn below the hidden size");
    ddt_qweight nodata = dw;
    nodata.data = NULL;
    REFUSED(ddt_cuda_embed_rmsnorm(&nodata, ib, NULL, 2, x, 8, nw, 1e-6f, xn, 8, NULL, &e), "a weight without data");
    ddt_qweight noscale = dw;
    noscale.format = DDT_Q_INT4_GROUP;
    noscale.scale = NULL;
    REFUSED(ddt_cuda_embed_rmsnorm(&noscale, ib, NULL, 2, x, 8, nw, 1e-6f, xn, 8, NULL, &e), "INT4 without scales");
    ddt_qweight bad_dtype = dw;
    bad_dtype.dtype = DDT_DTYPE_I32;
    CHECK(ddt_cuda_embed_rmsnorm(&bad_dtype, ib, NULL, 2, x, 8, nw, 1e-6f, xn, 8, NULL, &e) != DDT_OK,
          "not refused: a dense weight of dtype I32");
#undef REFUSED
    /* a good call after the refusals still works (nothing was left half-launched) */
    OK(ddt_cuda_embed_rmsnorm(&dw, ib, ib + 1, 2, x, 8, nw, 1e-6f, xn, 8, NULL, &err_));
    CU(cudaDeviceSynchronize());
    CU(cudaFree(buf));
    CU(cudaFree(ib));
    ddt_cuda_qweight_free(&dw);
    ct_free_weight(&hw);
    printf("refusals: checked\n");
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    /* hidden sizes: off every multiple of 4 (the strided path), the register path at
     * 1, 1 and 4 float4 a thread, and 8196 (a multiple of 4 past the register path) */
    static const int hs[] = {7, 33, 259, 1029, 256, 1024, 4096, 8196};
    static const int ns[] = {1, 3, 17, 65};
    for (int f = 0; f < 5; f++)
        for (int hi = 0; hi < 8; hi++)
            for (int ni = 0; ni < 4; ni++) {
                if (quick && (ni % 2 == 1 || hs[hi] > 1100)) continue;
                const int H = hs[hi], n = ns[ni];
                run_case(f, H, n, 4, 8, 0, ni % 2, 0);      /* padded rows, strides multiples of 4 */
                run_case(f, H, n, 0, 0, 0, 1 - ni % 2, 0); /* packed rows, the engine's layout */
                if (quick) continue;
                if (H % 4 == 0) {
                    run_case(f, H, n, 2, 4, 0, 1, 0); /* ldx not a multiple of 4: the strided path */
                    run_case(f, H, n, 4, 4, 1, 0, 0); /* bases off 16 bytes: the strided path */
                }
                if (n >= 3) run_case(f, H, n, 4, 12, 0, 2, 0); /* first_id out of range */
                if (f == 0 || f == 3) run_case(f, H, n, 4, 0, 0, 1, 1); /* xn = x */
            }
    refusals();
    return ct_report("test_cuda_embed_norm");
}
