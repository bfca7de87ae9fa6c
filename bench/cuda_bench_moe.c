/*
 * cuda_bench_moe.c — speed of the routed experts of one Kimi K2.6 MoE layer on the
 * GPU (hidden 7168, moe_intermediate 2048, 384 INT4 group-32 experts, top-8), and of
 * the dense projections (q_a, q_b, kv_a, o_proj, the LM head; bf16, plus q_b in FP8
 * and an INT4 shape) through ddt_cuda_matmul_mode, each against its floor (bytes
 * over the copy bandwidth measured here) and against cuBLAS bf16 (cublasGemmEx,
 * bf16 weights and activations, fp32 accumulation) at the same shapes in the same
 * run: for the experts, one gate/up and one down GEMM per touched expert with its
 * token count, the way a plain implementation runs them.
 *
 * Both are memory-bound at decode sizes, so the roofline is the device's copy
 * bandwidth, measured in the same run (cudaMemcpy device to device of 2 GiB,
 * bytes read + written per second).  For the experts the bytes are those of the
 * experts the routing touched (gate + up + down + scales, each read once).
 * Weights are generated on the device (no 8.4 GB host copy).  Times are medians of
 * 25 single calls after warm-up, by CUDA events, the mean of 25 calls queued
 * back to back, and for the experts the per-call time of 20 calls in one graph
 * with programmatic edges (the engine's round graph: graph_pdl_ms).  Every table
 * is printed for both computations of qmatmul_cuda.h: FP32 (CUDA cores, the
 * reference) and TENSOR (mma.sync bf16 -> fp32).  Prints markdown tables.
 *   cuda_bench_moe [iterations [dense-name-substring [tokens]]]
 * (a name skips the experts and runs only the matching dense shapes, in tensor
 * mode at the given token count: for profiling one kernel with ncu; "experts-nt"
 * runs only the tensor-core experts, "experts-fp8" the same over FP8 block-128
 * experts, DeepSeek-V3's format)
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/graph_cuda.h"
#include "backend/cuda/moe_cuda.h"
#include "../tests/cuda/cuda_test.h"

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#define CB(call)                                                                          \
    do {                                                                                  \
        cublasStatus_t s_ = (call);                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
            fprintf(stderr, "%s:%d: cuBLAS status %d: %s\n", __FILE__, __LINE__, (int)s_, #call); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

/* C[m][n] (column-major, ldc = m) = A^T B with A [k][m] (the weight's rows of k
 * bf16) and B [k][n] (n activation rows of k bf16), fp32 out and accumulation. */
static cublasStatus_t gemm_bf16(cublasHandle_t h, int m, int n, int k, const void *A, const void *B, float *C,
                                cudaStream_t s) {
    const float one = 1.0f, zero = 0.0f;
    cublasSetStream(h, s);
    return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_16BF, k, B, CUDA_R_16BF, k, &zero, C,
                        CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static float median(float *v, int n) {
    qsort(v, (size_t)n, sizeof(float), cmp_float);
    return v[n / 2];
}

/* Median of iters single calls between two events (ms), then the mean of iters
 * calls queued back to back (ms): the first includes any launch gap the host
 * leaves, the second is what a CUDA graph or a busy stream sees. */
#define TIME_CALLS(call, med_ms, queued_ms) TIME_WITH(OK(call), med_ms, queued_ms)
#define TIME_WITH(stmt, med_ms, queued_ms)                                    \
    do {                                                                      \
        for (int w_ = 0; w_ < 3; w_++) stmt;                                  \
        for (int i_ = 0; i_ < iters; i_++) {                                  \
            CU(cudaEventRecord(ev0, 0));                                      \
            stmt;                                                             \
            CU(cudaEventRecord(ev1, 0));                                      \
            CU(cudaEventSynchronize(ev1));                                    \
            CU(cudaEventElapsedTime(&times[i_], ev0, ev1));                   \
        }                                                                     \
        med_ms = median(times, iters);                                        \
        CU(cudaEventRecord(ev0, 0));                                          \
        for (int i_ = 0; i_ < iters; i_++) stmt;                              \
        CU(cudaEventRecord(ev1, 0));                                          \
        CU(cudaEventSynchronize(ev1));                                        \
        float tot_;                                                           \
        CU(cudaEventElapsedTime(&tot_, ev0, ev1));                            \
        queued_ms = tot_ / iters;                                             \
    } while (0)

/* The experts as the engine's round graph runs them: G calls captured on stream gs into one
 * graph whose kernel edges are all programmatic (ddt_cuda_graph_programmatic), so a launch's
 * blocks are resident while the one before it runs (the wgmma down launch then starts by its
 * flags); the median over 7 launches of the graph, per call (ms). */
static float graph_pdl_ms(const ddt_cuda_moe_layer *layer, const float *x, int H, int n, const int32_t *idx,
                          const float *w, int K, float *out, void *ws, size_t wsb, cudaStream_t gs, cudaEvent_t ev0,
                          cudaEvent_t ev1) {
    enum { G = 20, R = 7 };
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CU(cudaStreamBeginCapture(gs, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < G; i++) OK(ddt_cuda_moe_experts(layer, x, H, n, idx, w, K, out, H, ws, wsb, gs, &err_));
    CU(cudaStreamEndCapture(gs, &g));
    OK(ddt_cuda_graph_programmatic(g, false, NULL, &err_));
    CU(cudaGraphInstantiate(&ge, g, 0));
    float t[R];
    for (int r = -2; r < R; r++) {
        CU(cudaEventRecord(ev0, gs));
        CU(cudaGraphLaunch(ge, gs));
        CU(cudaEventRecord(ev1, gs));
        CU(cudaEventSynchronize(ev1));
        if (r >= 0) CU(cudaEventElapsedTime(&t[r], ev0, ev1));
    }
    CU(cudaGraphExecDestroy(ge));
    CU(cudaGraphDestroy(g));
    return median(t, R) / G;
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 25;
    const char *only = argc > 2 ? argv[2] : NULL;
    const int only_n = argc > 3 ? atoi(argv[3]) : 0;
    if (iters < 20) iters = 20;
    const int E = 384, H = 7168, I = 2048, K = 8, MAXN = 128;
    cudaEvent_t ev0, ev1;
    CU(cudaEventCreate(&ev0));
    CU(cudaEventCreate(&ev1));
    float *times = malloc(sizeof(float) * (size_t)iters);
    cudaStream_t gs; /* graph_pdl_ms's capture stream */
    CU(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));

    /* roofline: device-to-device copy of 2 GiB */
    const size_t cb = (size_t)2 << 30;
    void *ca, *cbuf;
    CU(cudaMalloc(&ca, cb));
    CU(cudaMalloc(&cbuf, cb));
    CU(cudaMemset(ca, 1, cb));
    for (int i = 0; i < 3; i++) CU(cudaMemcpy(cbuf, ca, cb, cudaMemcpyDeviceToDevice));
    for (int i = 0; i < iters; i++) {
        CU(cudaEventRecord(ev0, 0));
        CU(cudaMemcpyAsync(cbuf, ca, cb, cudaMemcpyDeviceToDevice, 0));
        CU(cudaEventRecord(ev1, 0));
        CU(cudaEventSynchronize(ev1));
        CU(cudaEventElapsedTime(&times[i], ev0, ev1));
    }
    const double copy_gbs = 2.0 * (double)cb / (median(times, iters) * 1e-3) / 1e9;
    CU(cudaFree(ca));
    CU(cudaFree(cbuf));

    /* "experts-fp8": the same sweep over FP8 block-128 experts (DeepSeek-V3's format) */
    const bool fp8 = only && !strcmp(only, "experts-fp8");
    ddt_cuda_moe_layer layer;
    OK(ddt_cuda_moe_layer_random(E, H, I, fp8 ? DDT_Q_FP8_BLOCK : DDT_Q_INT4_GROUP,
                                 fp8 ? DDT_DTYPE_F8_E4M3 : DDT_DTYPE_I32, 0.01f, 12345, &layer, &err_));
    const double expert_bytes = 2.0 * (double)ddt_cuda_qweight_bytes(&layer.host_copy[0]) +
                                (double)ddt_cuda_qweight_bytes(&layer.host_copy[2 * E]);
    size_t wsb = ddt_cuda_moe_workspace_bytes(&layer, MAXN, K);
    void *ws;
    float *x, *logits, *bias, *w, *out;
    int32_t *idx;
    CU(cudaMalloc(&ws, wsb));
    CU(cudaMalloc((void **)&x, sizeof(float) * (size_t)MAXN * H));
    CU(cudaMalloc((void **)&out, sizeof(float) * (size_t)MAXN * H));
    CU(cudaMalloc((void **)&logits, sizeof(float) * (size_t)MAXN * E));
    CU(cudaMalloc((void **)&bias, sizeof(float) * (size_t)E));
    CU(cudaMalloc((void **)&w, sizeof(float) * (size_t)MAXN * K));
    CU(cudaMalloc((void **)&idx, sizeof(int32_t) * (size_t)MAXN * K));
    OK(ddt_cuda_fill_uniform(x, (int64_t)MAXN * H, -1.0f, 1.0f, 1, NULL, &err_));
    OK(ddt_cuda_fill_uniform(logits, (int64_t)MAXN * E, -4.0f, 4.0f, 2, NULL, &err_));
    OK(ddt_cuda_fill_uniform(bias, E, -0.1f, 0.1f, 3, NULL, &err_));
    ddt_cuda_route_params rp = {E, K, 1, 1, true, 2.827f, bias};
    int32_t *hidx = malloc(sizeof(int32_t) * (size_t)MAXN * K);

    printf("# MoE experts, K2.6 layer shape (%s)\n\n", prop.name);
    printf("device copy bandwidth (d2d, read+write): %.0f GB/s\n\n", copy_gbs);
    printf("experts: %d x %s [%d, %d] gate/up + [%d, %d] down, top-%d, %.1f MB per expert\n\n", E, fp8 ? "FP8" : "INT4", I, H, H, I, K,
           expert_bytes / 1e6);
    /* cuBLAS bf16 baseline: bf16 copies of as many experts as the largest batch touches */
    cublasHandle_t cub;
    CB(cublasCreate(&cub));
    const int NB = 112; /* distinct bf16 experts held (touched experts cycle over them) */
    ddt_qweight *bgu = malloc(sizeof(ddt_qweight) * NB), *bdn = malloc(sizeof(ddt_qweight) * NB);
    for (int e = 0; e < NB; e++) {
        OK(ddt_cuda_qweight_random(DDT_Q_DENSE, DDT_DTYPE_BF16, 2 * I, H, 0.01f, 777 + e, &bgu[e], &err_));
        OK(ddt_cuda_qweight_random(DDT_Q_DENSE, DDT_DTYPE_BF16, H, I, 0.01f, 999 + e, &bdn[e], &err_));
    }
    ddt_qweight xb, hb;
    OK(ddt_cuda_qweight_random(DDT_Q_DENSE, DDT_DTYPE_BF16, MAXN, H, 1.0f, 55, &xb, &err_));
    OK(ddt_cuda_qweight_random(DDT_Q_DENSE, DDT_DTYPE_BF16, MAXN, 2 * I, 1.0f, 56, &hb, &err_));
    float *gu32;
    CU(cudaMalloc((void **)&gu32, sizeof(float) * (size_t)MAXN * 2 * I));
    static const int ns[] = {1, 4, 16, 32, 64, 128};
    double ex_us[2][6];
    /* "experts-nt": the tensor-core experts only, once per work-item cap (8*NT tokens) */
    const bool nt_sweep = only && (!strcmp(only, "experts-nt") || fp8);
    static const int nt_caps[] = {0, 4, 1}; /* 0: the default (two item classes) */
    if (nt_sweep) OK(ddt_cuda_moe_layer_pack(&layer, &err_));
    for (int mi = nt_sweep ? 1 : 0; mi < (nt_sweep ? (fp8 ? 2 : 4) : only ? 0 : 3); mi++) {
        if (nt_sweep) {
            ddt_cuda_moe_set_item_ntiles(nt_caps[mi - 1]);
            if (nt_caps[mi - 1]) printf("\n## one class of work items, at most %d tokens\n", 8 * nt_caps[mi - 1]);
            else printf("\n## the default: items of at most 8 tokens, experts with more in items of 32 on the 4-tile kernel\n");
        }
        if (mi == 1 && !nt_sweep) OK(ddt_cuda_moe_layer_pack(&layer, &err_)); /* the tensor cores stream the packed copy */
        layer.mode = mi == 1 || nt_sweep ? DDT_CUDA_MM_TENSOR : DDT_CUDA_MM_FP32;
        if (mi == 2 && !nt_sweep) {
            printf("\n## cuBLAS bf16 (cublasGemmEx per touched expert: gate/up [%d, %d] and down [%d, %d], bf16 "
                   "weights = 4x the INT4 bytes)\n\n", 2 * I, H, H, I);
            printf("| tokens | touched experts | bf16 MB read | us (median) | of copy bw | ours (tensor) us | ours / cuBLAS |\n");
            printf("|---:|---:|---:|---:|---:|---:|---:|\n");
        } else {
            printf("\n## experts on %s\n\n", mi ? "tensor cores (DDT_CUDA_MM_TENSOR, packed)" : "CUDA cores (DDT_CUDA_MM_FP32)");
            printf("| tokens | touched experts | MB read | floor us | route us (median / queued) | experts us (median) | GB/s | of copy bw | "
                   "experts us (queued) | of copy bw (queued) | experts us (graph + PDL) | of copy bw (graph) | vs n=1 |\n");
            printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        }
        for (int ni = 0; ni < 6; ni++) {
            const int n = ns[ni];
            float route_ms, route_q, ms, q;
            TIME_CALLS(ddt_cuda_moe_route(logits, E, n, &rp, idx, w, NULL, &err_), route_ms, route_q);
            CU(cudaMemcpy(hidx, idx, sizeof(int32_t) * (size_t)n * K, cudaMemcpyDeviceToHost));
            int cnt[384] = {0};
            int touched = 0;
            for (int i = 0; i < n * K; i++)
                if (cnt[hidx[i]]++ == 0) touched++;
            if (mi == 2 && !nt_sweep) {
                TIME_WITH(
                    {
                        int j = 0;
                        for (int e = 0; e < E; e++) {
                            if (!cnt[e]) continue;
                            CB(gemm_bf16(cub, 2 * I, cnt[e], H, bgu[j % NB].data, xb.data, gu32, 0));
                            CB(gemm_bf16(cub, H, cnt[e], I, bdn[j % NB].data, hb.data, out, 0));
                            j++;
                        }
                    },
                    ms, q);
                const double bytes = touched * (3.0 * H * I * 2.0), gbs = bytes / (ms * 1e-3) / 1e9;
                printf("| %d | %d | %.0f | %.1f | %.0f%% | %.1f | %.2fx |\n", n, touched, bytes / 1e6, ms * 1e3,
                       100.0 * gbs / copy_gbs, ex_us[1][ni], ex_us[1][ni] / (ms * 1e3));
                continue;
            }
            TIME_CALLS(ddt_cuda_moe_experts(&layer, x, H, n, idx, w, K, out, H, ws, wsb, NULL, &err_), ms, q);
            const float gms = graph_pdl_ms(&layer, x, H, n, idx, w, K, out, ws, wsb, gs, ev0, ev1);
            const int slot = mi > 1 ? 1 : mi;
            ex_us[slot][ni] = ms * 1e3;
            const double bytes = touched * expert_bytes, gbs = bytes / (ms * 1e-3) / 1e9, gq = bytes / (q * 1e-3) / 1e9,
                         gg = bytes / (gms * 1e-3) / 1e9;
            printf("| %d | %d | %.0f | %.1f | %.1f / %.1f | %.1f | %.0f | %.0f%% | %.1f | %.0f%% | %.1f | %.0f%% | %.2fx |\n", n,
                   touched, bytes / 1e6, bytes / copy_gbs / 1e3, route_ms * 1e3, route_q * 1e3, ms * 1e3, gbs,
                   100.0 * gbs / copy_gbs, q * 1e3, 100.0 * gq / copy_gbs, gms * 1e3, 100.0 * gg / copy_gbs,
                   ex_us[slot][ni] / ex_us[slot][0]);
        }
    }
    for (int e = 0; e < NB; e++) ddt_cuda_qweight_free(&bgu[e]), ddt_cuda_qweight_free(&bdn[e]);
    free(bgu);
    free(bdn);
    CU(cudaFree(gu32));
    ddt_cuda_moe_layer_free(&layer);

    /* dense projections: q_b_proj (bf16), the same shape in FP8 blocks and INT4,
       and the LM head (bf16 [163840, 7168]) */
    static const struct {
        const char *name;
        ddt_qformat f;
        ddt_dtype dt;
        int R, C;
    } dense[] = {{"bf16 q_a_proj", DDT_Q_DENSE, DDT_DTYPE_BF16, 1536, 7168},
                 {"bf16 q_b_proj", DDT_Q_DENSE, DDT_DTYPE_BF16, 24576, 1536},
                 {"bf16 kv_a_proj_with_mqa", DDT_Q_DENSE, DDT_DTYPE_BF16, 576, 7168},
                 {"bf16 o_proj", DDT_Q_DENSE, DDT_DTYPE_BF16, 7168, 8192},
                 {"FP8 q_b_proj", DDT_Q_FP8_BLOCK, DDT_DTYPE_F8_E4M3, 24576, 1536},
                 {"INT4 shared-expert-like", DDT_Q_INT4_GROUP, DDT_DTYPE_I32, 4096, 7168},
                 {"bf16 LM head", DDT_Q_DENSE, DDT_DTYPE_BF16, 163840, 7168}};
    float *y;
    void *mws; /* the tensor path's split activations: 64 tokens of the widest input (8192) */
    const size_t mws_bytes = ddt_cuda_matmul_workspace_bytes(8192, 1, 64);
    CU(cudaMalloc((void **)&y, sizeof(float) * (size_t)64 * 163840));
    CU(cudaMalloc(&mws, mws_bytes));
    ddt_qweight xd;
    OK(ddt_cuda_qweight_random(DDT_Q_DENSE, DDT_DTYPE_BF16, 64, 8192, 1.0f, 57, &xd, &err_));
    for (int di = 0; di < 7; di++) {
        const int R = dense[di].R, C = dense[di].C;
        if (only && !strstr(dense[di].name, only)) continue;
        ddt_qweight qb, wb;
        OK(ddt_cuda_qweight_random(dense[di].f, dense[di].dt, R, C, 0.05f, 7, &qb, &err_));
        OK(ddt_cuda_qweight_pack(&qb, &err_));
        OK(ddt_cuda_qweight_random(DDT_Q_DENSE, DDT_DTYPE_BF16, R, C, 0.05f, 8, &wb, &err_));
        const double wbytes = (double)ddt_cuda_qweight_bytes(&qb), bbytes = 2.0 * R * C;
        printf("\n# dense %s [%d, %d] (%.1f MB; floor %.1f us) through ddt_cuda_matmul_mode, and cuBLAS bf16 "
               "(%.1f MB)\n\n", dense[di].name, R, C, wbytes / 1e6, wbytes / copy_gbs / 1e3, bbytes / 1e6);
        printf("| mode | tokens | us (median) | weight GB/s | of copy bw | vs floor | vs n=1 | GFLOP/s | us (queued) | "
               "of copy bw (queued) | cuBLAS bf16 us | ours / cuBLAS | presplit us (median / queued) | "
               "of copy bw (presplit, queued) |\n");
        printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        static const int dn[] = {1, 4, 8, 16, 32, 64};
        for (int mi = 0; mi < 2; mi++) {
            double t1 = 0;
            for (int ni = 0; ni < 6; ni++) {
                const int n = dn[ni];
                if (only && (mi == 0 || (only_n && n != only_n))) continue;
                const ddt_cuda_mm_mode mode = mi ? DDT_CUDA_MM_TENSOR : DDT_CUDA_MM_FP32;
                float ms, q, cms, cq;
                TIME_CALLS(ddt_cuda_matmul_mode(&qb, mode, x, C, n, y, R, mws, mws_bytes, NULL, &err_), ms, q);
                TIME_WITH(CB(gemm_bf16(cub, R, n, C, wb.data, xd.data, y, 0)), cms, cq);
                if (t1 == 0) t1 = ms;
                /* the product as a layer runs it: its activations split by their producer
                   (a norm, the merge, another product's epilogue) into the planes it reads,
                   so one launch; the planes here from the call above, which wrote them */
                char pre[64] = "- | -";
                ddt_cuda_split_planes planes;
                if (mode == DDT_CUDA_MM_TENSOR && ddt_cuda_matmul_split_planes(&qb, mode, n, mws, mws_bytes, &planes)) {
                    float pms, pq;
                    TIME_CALLS(ddt_cuda_matmul_presplit(&qb, mode, n, y, R, mws, mws_bytes, NULL, &err_), pms, pq);
                    snprintf(pre, sizeof pre, "%.1f / %.1f | %.0f%%", pms * 1e3, pq * 1e3,
                             100.0 * wbytes / (pq * 1e-3) / 1e9 / copy_gbs);
                }
                const double gbs = wbytes / (ms * 1e-3) / 1e9, gq = wbytes / (q * 1e-3) / 1e9;
                printf("| %s | %d | %.1f | %.0f | %.0f%% | %.2fx | %.2fx | %.0f | %.1f | %.0f%% | %.1f | %.2fx | %s |\n",
                       mi ? "tensor" : "fp32", n, ms * 1e3, gbs, 100.0 * gbs / copy_gbs,
                       ms * 1e-3 / (wbytes / (copy_gbs * 1e9)), ms / t1, 2.0 * R * C * n / (ms * 1e-3) / 1e9, q * 1e3,
                       100.0 * gq / copy_gbs, cms * 1e3, ms / cms, pre);
                (void)cq;
            }
        }
        ddt_cuda_qweight_free(&qb);
        ddt_cuda_qweight_free(&wb);
    }
    ddt_cuda_qweight_free(&xd);
    ddt_cuda_qweight_free(&xb);
    ddt_cuda_qweight_free(&hb);
    CB(cublasDestroy(cub));
    CU(cudaFree(y));
    CU(cudaFree(mws));
    CU(cudaFree(ws));
    CU(cudaFree(x));
    CU(cudaFree(out));
    CU(cudaFree(logits));
    CU(cudaFree(bias));
    CU(cudaFree(w));
    CU(cudaFree(idx));
    CU(cudaStreamDestroy(gs));
    free(times);
    free(hidx);
    return g_failures != 0;
}
