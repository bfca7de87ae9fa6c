/*
 * test_cuda_rope_fold.c — MLA's rope_write folded into its neighbours (mla_cuda.h):
 * ddt_cuda_mla_norm_write (the q_a / kv_a latent norms and the cache row in one
 * launch) then ddt_cuda_matmul_rope (q_b with the queries' rope in its epilogue),
 * against what they replace: ddt_cuda_rmsnorm_pair, ddt_cuda_matmul of q_b, then
 * ddt_cuda_mla_rope_write.  Bitwise, everywhere:
 *   - the queries (rope parts rotated and de-interleaved, nope parts plain), the
 *     normed q_a latent (in place), the normed kv latent and the whole cache layer
 *     (rows never written stay NaN-poisoned), fp32 and bf16 caches;
 *   - odd sizes where pairs allow (3 heads of 6 + 4, rank 12, q_lora 14; 5 heads
 *     of 32 + 16, rank 64, q_lora 96, the shipped target's head shape), F32 and
 *     BF16 weights, n = 1, 3, 17, 40, the committed length on the device, random
 *     tree depths, a token whose position is past the table (NaN rotations) and one
 *     whose row is past the cache (nothing written, queries left as they are),
 *     every warp shape of the product (2 or 4 rows x 1, 2 or 4 tokens);
 *   - the tensor-core fold (run_case's tc): the norms' launch also writing q_b's split
 *     planes, q_b on the wgmma kernel with the rope in its epilogue and the fast
 *     attention's bf16 query (q16), against the split norm pair, the presplit
 *     product and rope_write with q16 (K2.6's head shape among them);
 *   - the norms' register path (vec: q_a / kv_a rows 16-byte aligned, a row stride of
 *     whole float4): rope 6, so a cache row of rank + 6 values leaves every other
 *     row's 4-value stores unaligned (fp32 and bf16), and K2.6's head shape; the
 *     other cases' rows (stride + 3) take the strided path;
 *   - refusals: rope pairs not interleaved, an odd nope, rows that are not heads x
 *     (nope + rope), a kv norm that does not write kvn.
 * --quick: fewer cases (for compute-sanitizer).
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/mla_cuda.h"
#include "backend/cuda/nn_cuda.h"
#include "backend/cuda/qmatmul_cuda.h"
#include "cuda_test.h"

static uint64_t g_rng = 0xD1B54A32D192ED03ull;
static float frand(void) { return ct_frand(&g_rng); }
static const ct_weight_values k_values = {0.2f, 15, 0.005f, 0.02f};

static int same(const void *dev_a, const void *dev_b, size_t bytes) {
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    CU(cudaMemcpy(a, dev_a, bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(b, dev_b, bytes, cudaMemcpyDeviceToHost));
    const int r = memcmp(a, b, bytes) == 0;
    free(a);
    free(b);
    return r;
}

/* One case: f the q_b weight's format (0 F32, 1 BF16), heads x (nope + rope),
 * kv rank, q_lora, n tokens, bf16 cache or fp32, warp shape (wr, wt) or (0, 0);
 * vec: the qkv_a rows' stride a multiple of 4 (q_lora and rank too: the norms'
 * register path), else 3 past a multiple (their strided path).
 * tc: the tensor-core fold instead (BF16, q_lora a multiple of 8: the wgmma
 * path's): ddt_cuda_mla_norm_write with q_b's split planes, then q_b on the wgmma
 * kernel with the rope in its epilogue (ddt_cuda_next_planes.rope) and the fast
 * attention's bf16 query rope part (q16), against rmsnorm_pair_split, the
 * presplit wgmma q_b and rope_write with q16; the planes and q16 compared too
 * (q16's latent part is never written: it stays poisoned in both). */
static void run_case(int f, int heads, int nope, int rope, int rank, int q_lora, int n, int bf16, int wr, int wt,
                     int tc, int vec) {
    const int qd = nope + rope, half = rope / 2, max_pos = 48, capacity = 45, len = 7, w = rank + rope;
    /* q_a | kv_a side by side, as the target's qkv_a */
    const int64_t qa_ld = q_lora + rank + rope + (vec ? 4 + (4 - (q_lora + rank + rope) % 4) % 4 : 3);
    CHECK(!vec || (q_lora % 4 == 0 && rank % 4 == 0), "vec case with q_lora %d, rank %d", q_lora, rank);
    const int64_t ldq = (int64_t)heads * qd; /* packed query rows: rope_write has no row stride */
    ct_weight wq = ct_make_weight(&g_rng, tc ? 1 : f, (int64_t)heads * qd, q_lora, &k_values);
    const size_t nqa = (size_t)n * qa_ld, nq = (size_t)n * ldq, nkvn = (size_t)n * rank, n16 = (size_t)n * heads * w;
    float *qa = malloc(sizeof(float) * nqa), *q = malloc(sizeof(float) * nq), *kvn = malloc(sizeof(float) * nkvn);
    ct_poison(qa, nqa);
    for (int t = 0; t < n; t++)
        for (int64_t j = 0; j < q_lora + rank + rope; j++) qa[(size_t)t * qa_ld + j] = 3.0f * frand();
    ct_poison(q, nq);
    ct_poison(kvn, nkvn);
    uint16_t *q16 = malloc(sizeof(uint16_t) * n16);
    for (size_t i = 0; i < n16; i++) q16[i] = 0xFFFF;
    float *wn_q = malloc(sizeof(float) * q_lora), *wn_kv = malloc(sizeof(float) * rank);
    for (int i = 0; i < q_lora; i++) wn_q[i] = 1.0f + 0.3f * frand();
    for (int i = 0; i < rank; i++) wn_kv[i] = 1.0f + 0.3f * frand();
    float *cs = malloc(sizeof(float) * max_pos * half), *sn = malloc(sizeof(float) * max_pos * half);
    for (int i = 0; i < max_pos * half; i++) cs[i] = frand(), sn[i] = frand();
    int32_t *depth = malloc(sizeof(int32_t) * n);
    for (int t = 0; t < n; t++) depth[t] = (int32_t)(ct_xorshift(&g_rng, 16) % 5);
    if (n >= 3) depth[1] = max_pos; /* a position past the table: NaN rotations */
    /* n = 40: tokens 38, 39 (rows len + 38..) fall past the cache (capacity 45): no row, queries as they are */
    const size_t row_bytes = (size_t)w * (bf16 ? 2 : 4), cache_bytes = row_bytes * capacity;
    uint8_t *cache = malloc(cache_bytes);
    for (size_t i = 0; i + 4 <= cache_bytes; i += 4) ct_poison((float *)(cache + i), 1);

    ddt_qweight dw;
    OK(ddt_cuda_qweight_upload(&wq.w, &dw, &err_));
    const size_t wsb = tc ? ddt_cuda_matmul_workspace_bytes(q_lora, 1, n) : 16;
    float *d_qa[2], *d_q[2], *d_kvn[2];
    void *d_cache[2], *d_ws[2];
    uint16_t *d_q16[2];
    for (int k = 0; k < 2; k++) {
        d_qa[k] = ct_dev_copy(qa, sizeof(float) * nqa);
        d_q[k] = ct_dev_copy(q, sizeof(float) * nq);
        d_kvn[k] = ct_dev_copy(kvn, sizeof(float) * nkvn);
        d_cache[k] = ct_dev_copy(cache, cache_bytes);
        d_q16[k] = ct_dev_copy(q16, sizeof(uint16_t) * n16);
        CU(cudaMalloc(&d_ws[k], wsb));
        CU(cudaMemset(d_ws[k], 0xFF, wsb));
    }
    float *d_wq = ct_dev_copy(wn_q, sizeof(float) * (size_t)q_lora);
    float *d_wkv = ct_dev_copy(wn_kv, sizeof(float) * (size_t)rank);
    float *d_cs = ct_dev_copy(cs, sizeof(float) * (size_t)max_pos * half);
    float *d_sn = ct_dev_copy(sn, sizeof(float) * (size_t)max_pos * half);
    int32_t *d_depth = ct_dev_copy(depth, sizeof(int32_t) * n), *d_len = ct_dev_copy(&len, sizeof(int32_t));

    for (int k = 0; k < 2; k++) {
        const ddt_cuda_norm_job jobs[2] = {{d_qa[k], qa_ld, q_lora, d_wq, d_qa[k], qa_ld},
                                           {d_qa[k] + q_lora, qa_ld, rank, d_wkv, d_kvn[k], rank}};
        const ddt_cuda_mla_rope_args ra = {.n = n, .heads = heads, .nope = nope, .rope = rope, .rank = rank,
                                           .qdim = qd, .interleave = true, .len = d_len, .depth = d_depth,
                                           .cos_t = d_cs, .sin_t = d_sn, .max_pos = max_pos, .q = d_q[k],
                                           .kvn = d_kvn[k], .kva = d_qa[k] + q_lora, .kva_ld = (int32_t)qa_ld,
                                           .cache = d_cache[k], .capacity = capacity, .bf16_cache = bf16 != 0,
                                           .q16 = tc ? d_q16[k] : NULL};
        if (tc) {
            ddt_cuda_split_planes sp;
            CHECK(ddt_cuda_matmul_split_planes(&dw, DDT_CUDA_MM_TENSOR, n, d_ws[k], wsb, &sp),
                  "q_b [%d x %d] is not on the wgmma path", (int)dw.rows, (int)dw.cols);
            if (k == 0) { /* the three launches */
                OK(ddt_cuda_rmsnorm_pair_split(jobs, n, 1e-6f, &sp, NULL, &err_));
                OK(ddt_cuda_matmul_presplit(&dw, DDT_CUDA_MM_TENSOR, n, d_q[k], ldq, d_ws[k], wsb, NULL, &err_));
                OK(ddt_cuda_mla_rope_write(&ra, NULL, &err_));
            } else { /* folded */
                OK(ddt_cuda_mla_norm_write(jobs, 1e-6f, &ra, &sp, NULL, &err_));
                ddt_cuda_next_planes nx;
                memset(&nx, 0, sizeof nx);
                nx.rope = &ra;
                const ddt_row_groups g = {1, 0, 0, dw.rows, 0, 0};
                OK(ddt_cuda_matmul_grouped_next(&dw, DDT_CUDA_MM_TENSOR, &g, NULL, 0, n, d_q[k], ldq, d_ws[k], wsb,
                                                &nx, NULL, &err_));
            }
        } else if (k == 0) { /* the three launches */
            OK(ddt_cuda_rmsnorm_pair(jobs, n, 1e-6f, NULL, &err_));
            OK(ddt_cuda_matmul_grouped_shape(&dw, DDT_CUDA_MM_FP32, &(ddt_row_groups){1, 0, 0, dw.rows, 0, 0}, d_qa[k],
                                             qa_ld, n, d_q[k], ldq, 0, 0, NULL, 0, NULL, &err_));
            OK(ddt_cuda_mla_rope_write(&ra, NULL, &err_));
        } else { /* folded */
            OK(ddt_cuda_mla_norm_write(jobs, 1e-6f, &ra, NULL, NULL, &err_));
            OK(ddt_cuda_matmul_rope(&dw, d_qa[k], qa_ld, d_q[k], ldq, &ra, wr, wt, NULL, &err_));
        }
    }
    CU(cudaDeviceSynchronize());
    const int sq = same(d_q[0], d_q[1], sizeof(float) * nq), sqa = same(d_qa[0], d_qa[1], sizeof(float) * nqa);
    const int skv = same(d_kvn[0], d_kvn[1], sizeof(float) * nkvn), sc = same(d_cache[0], d_cache[1], cache_bytes);
    const int s16 = same(d_q16[0], d_q16[1], sizeof(uint16_t) * n16), sws = same(d_ws[0], d_ws[1], wsb);
    const int all = sq && sqa && skv && sc && s16 && sws;
    CHECK(all,
          "%s heads %d x (%d + %d) rank %d q_lora %d n=%d %s cache, shape %dx%d: queries %s, q_a %s, kvn %s, cache %s, "
          "q16 %s, planes %s",
          tc ? "wgmma" : f ? "BF16" : "F32", heads, nope, rope, rank, q_lora, n, bf16 ? "bf16" : "fp32", wr, wt,
          sq ? "ok" : "DIFFER", sqa ? "ok" : "DIFFER", skv ? "ok" : "DIFFER", sc ? "ok" : "DIFFER",
          s16 ? "ok" : "DIFFER", sws ? "ok" : "DIFFER");
    /* the case tests something: the reference wrote cache rows and rotated queries (and their bf16) */
    float *qh = malloc(sizeof(float) * nq);
    CU(cudaMemcpy(qh, d_q[0], sizeof(float) * nq, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(cache, d_cache[0], cache_bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(q16, d_q16[0], sizeof(uint16_t) * n16, cudaMemcpyDeviceToHost));
    int written = 0;
    for (size_t i = 0; i + 4 <= row_bytes; i += 4) written += !ct_is_poison((const float *)(cache + len * row_bytes + i));
    CHECK(written > 0 && !ct_is_poison(&qh[nope]) && (!tc || (q16[rank] != 0xFFFF && q16[0] == 0xFFFF)),
          "n=%d: the reference wrote nothing", n);
    if (wr == 0)
        printf("%-5s heads %d x (%3d + %2d) rank %3d q_lora %3d n=%2d %s cache%s: %s\n", tc ? "wgmma" : f ? "BF16" : "F32",
               heads, nope, rope, rank, q_lora, n, bf16 ? "bf16" : "fp32", vec ? ", register norms" : "",
               all ? "bitwise" : "DIFFERENT");
    free(qh);
    ddt_cuda_qweight_free(&dw);
    for (int k = 0; k < 2; k++) {
        void *dk[] = {d_qa[k], d_q[k], d_kvn[k], d_cache[k], d_q16[k], d_ws[k]};
        for (size_t i = 0; i < sizeof dk / sizeof dk[0]; i++) CU(cudaFree(dk[i]));
    }
    void *dv[] = {d_wq, d_wkv, d_cs, d_sn, d_depth, d_len};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++) CU(cudaFree(dv[i]));
    free(qa), free(q), free(kvn), free(q16), free(wn_q), free(wn_kv), free(cs), free(sn), free(depth), free(cache);
    ct_free_weight(&wq);
}

static void refusals(void) {
    ct_weight wq = ct_make_weight(&g_rng, 1, 30, 14, &k_values);
    ddt_qweight dw;
    OK(ddt_cuda_qweight_upload(&wq.w, &dw, &err_));
    float *buf;
    int32_t *ibuf;
    CU(cudaMalloc((void **)&buf, sizeof(float) * 4096));
    CU(cudaMalloc((void **)&ibuf, sizeof(int32_t) * 64));
    CU(cudaMemset(ibuf, 0, sizeof(int32_t) * 64));
    CU(cudaMemset(buf, 0, sizeof(float) * 4096));
    const ddt_cuda_mla_rope_args good = {.n = 2, .heads = 3, .nope = 6, .rope = 4, .rank = 12, .qdim = 10,
                                         .interleave = true, .len = ibuf, .depth = ibuf + 1, .cos_t = buf,
                                         .sin_t = buf, .max_pos = 8, .q = buf, .kvn = buf + 1024, .kva = buf,
                                         .kva_ld = 20, .cache = buf + 2048, .capacity = 8, .bf16_cache = false};
    ddt_error e;
    ddt_cuda_mla_rope_args r = good;
    r.interleave = false;
    CHECK(ddt_cuda_matmul_rope(&dw, buf, 14, buf + 3000, 32, &r, 0, 0, NULL, &e) == DDT_ERR_INVALID,
          "rope pairs not interleaved");
    r = good;
    r.nope = 5, r.rope = 5;
    CHECK(ddt_cuda_matmul_rope(&dw, buf, 14, buf + 3000, 32, &r, 0, 0, NULL, &e) == DDT_ERR_INVALID, "odd nope");
    r = good;
    r.heads = 2;
    CHECK(ddt_cuda_matmul_rope(&dw, buf, 14, buf + 3000, 32, &r, 0, 0, NULL, &e) == DDT_ERR_INVALID,
          "30 rows for 2 heads of 10");
    CHECK(ddt_cuda_matmul_rope(&dw, buf, 14, buf + 3000, 32, &good, 1, 1, NULL, &e) == DDT_ERR_INVALID,
          "a 1-row warp");
    const ddt_cuda_norm_job jobs[2] = {{buf, 20, 6, buf, buf, 20}, {buf + 6, 20, 12, buf, buf + 512, 12}};
    CHECK(ddt_cuda_mla_norm_write(jobs, 1e-6f, &good, NULL, NULL, &e) == DDT_ERR_INVALID, "a kv norm that is not kvn's");
    /* the wgmma epilogue's rope: the same shape rules */
    ct_weight wt = ct_make_weight(&g_rng, 1, 30, 16, &k_values);
    ddt_qweight dt;
    OK(ddt_cuda_qweight_upload(&wt.w, &dt, &err_));
    const size_t wsb = ddt_cuda_matmul_workspace_bytes(16, 1, 2);
    void *ws;
    CU(cudaMalloc(&ws, wsb));
    const ddt_row_groups g30 = {1, 0, 0, 30, 0, 0};
    ddt_cuda_next_planes nx;
    memset(&nx, 0, sizeof nx);
    nx.rope = &r;
    r = good;
    OK(ddt_cuda_matmul_grouped_next(&dt, DDT_CUDA_MM_TENSOR, &g30, buf, 16, 2, buf + 3000, 32, ws, wsb, &nx, NULL,
                                    &err_));
    r.interleave = false;
    CHECK(ddt_cuda_matmul_grouped_next(&dt, DDT_CUDA_MM_TENSOR, &g30, buf, 16, 2, buf + 3000, 32, ws, wsb, &nx, NULL,
                                       &e) == DDT_ERR_INVALID && strstr(e.msg, "rope") != NULL,
          "wgmma: rope pairs not interleaved (%s)", e.msg);
    r = good;
    r.heads = 2;
    CHECK(ddt_cuda_matmul_grouped_next(&dt, DDT_CUDA_MM_TENSOR, &g30, buf, 16, 2, buf + 3000, 32, ws, wsb, &nx, NULL,
                                       &e) == DDT_ERR_INVALID,
          "wgmma: 30 rows for 2 heads of 10");
    CU(cudaDeviceSynchronize());
    CU(cudaFree(ws));
    ddt_cuda_qweight_free(&dt);
    ct_free_weight(&wt);
    CU(cudaFree(buf));
    CU(cudaFree(ibuf));
    ddt_cuda_qweight_free(&dw);
    ct_free_weight(&wq);
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    static const int ns[] = {1, 3, 17, 40};
    static const int shapes[][2] = {{2, 1}, {2, 2}, {2, 4}, {4, 1}, {4, 2}, {4, 4}};
    for (int f = 0; f < 2; f++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int ni = 0; ni < 4; ni++) {
                if (quick && ni % 2 == 1) continue;
                run_case(f, 3, 6, 4, 12, 14, ns[ni], bf16, 0, 0, 0, 0);
                run_case(f, 3, 6, 6, 12, 16, ns[ni], bf16, 0, 0, 0, 1);
                if (!quick) run_case(f, 5, 32, 16, 64, 96, ns[ni], bf16, 0, 0, 0, 0);
                for (int s = 0; s < 6 && !quick && bf16 == 0; s++)
                    run_case(f, 3, 6, 4, 12, 14, ns[ni], bf16, shapes[s][0], shapes[s][1], 0, 0);
            }
    OK(ddt_cuda_ws_prepare(&err_));
    for (int ni = 0; ni < 4; ni++) {
        if (quick && ni % 2 == 1) continue;
        run_case(1, 5, 32, 16, 64, 96, ns[ni], 1, 0, 0, 1, 0);
        run_case(1, 5, 32, 16, 64, 96, ns[ni], ni % 2, 0, 0, 1, 1);
        if (!quick) run_case(1, 7, 128, 64, 512, 160, ns[ni], ni % 2, 0, 0, 1, ni < 2);
    }
    refusals();
    return ct_report("test_cuda_rope_fold");
}
