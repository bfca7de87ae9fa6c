/*
 * cuda_bench_mla.c — GPU time of the tree-verify MLA-absorb attention at K2.6
 * shapes (64 heads, keys 576 wide, values 512) for T in {1, 16, 32, 64} tree
 * tokens x N in {1024, 4096, 16384, 65536} prefix rows, against the roofline
 * floor max(bytes / copy bandwidth, flops / bf16 matmul rate), both ceilings
 * measured in this run: a 2 GiB device-to-device cudaMemcpy (bandwidth counts
 * bytes read + written) and a cuBLAS 8192^3 bf16 GEMM on random data.
 * bytes = N*576*2 (cache) + T*64*576*2 (q) + T*64*512*2 (bf16 out);
 * flops = 2*T*64*N*(576+512).
 * Each timing is a CUDA graph of G calls (the way the engine runs a round), each
 * call on its own region of the cache so that L2 does not keep the cache between
 * calls (the engine's 60 layers never reuse it either), replayed 15 times: the
 * median replay / G.  The grid is sized for a 64K context (max_prefix = 65536)
 * and the kernel reads N from device memory, as in a captured round.
 * Each graph is timed twice: with plain edges, and with its kernel-to-kernel
 * edges programmatic (ddt_cuda_graph_programmatic), as the engine runs a round.
 * PyTorch's plain implementation (bench/mla_torch.py) is the baseline; run it
 * in the same session.  Markdown to stdout.
 * Usage: cuda_bench_mla [--quick | --shape T N]
 *   --quick    T in {1, 16, 64} x N in {4096, 65536}
 *   --shape    one T (1..64) and N (1..65536): what a profiler (ncu) is pointed at
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/graph_cuda.h"
#include "backend/cuda/mla_verify_cuda.h"

#define CU(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", #call, __FILE__, __LINE__,    \
                    cudaGetErrorString(e_));                                              \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)
#define CB(call)                                                                          \
    do {                                                                                  \
        cublasStatus_t s_ = (call);                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
            fprintf(stderr, "cuBLAS error %d at %s:%d\n", (int)s_, __FILE__, __LINE__);   \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

enum { H = 64, DK = 576, DV = 512, MAXN = 65536, REGIONS = 8, REPLAYS = 15 };

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint16_t rbf16(void) { /* a random bf16 in about [-1, 1] */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    uint32_t m = (uint32_t)(g_rng >> 40) & 0x7F, sgn = (uint32_t)(g_rng >> 20) & 1, ex = 120 + (uint32_t)(g_rng >> 50) % 7;
    return (uint16_t)((sgn << 15) | (ex << 7) | m);
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median of REPLAYS timed launches of a graph, in ms. */
static int time_graph(cudaGraphExec_t ge, cudaStream_t st, float *ms) {
    cudaEvent_t e0, e1;
    float t[REPLAYS];
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    CU(cudaGraphLaunch(ge, st)); /* warm */
    CU(cudaStreamSynchronize(st));
    for (int r = 0; r < REPLAYS; r++) {
        CU(cudaEventRecord(e0, st));
        CU(cudaGraphLaunch(ge, st));
        CU(cudaEventRecord(e1, st));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&t[r], e0, e1));
    }
    qsort(t, REPLAYS, sizeof(float), cmp_f);
    *ms = t[REPLAYS / 2];
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    return 0;
}

/* a whole decimal number in [lo, hi], else -1 */
static long parse_in(const char *s, long lo, long hi) {
    char *end;
    const long v = strtol(s, &end, 10);
    return (*s && !*end && v >= lo && v <= hi) ? v : -1;
}

int main(int argc, char **argv) {
    int quick = 0, only_t = 0, only_n = 0;
    if (argc == 2 && strcmp(argv[1], "--quick") == 0) {
        quick = 1;
    } else if (argc == 4 && strcmp(argv[1], "--shape") == 0) {
        const long t = parse_in(argv[2], 1, 64), n = parse_in(argv[3], 1, MAXN);
        if (t < 0 || n < 0) {
            fprintf(stderr, "cuda_bench_mla: --shape wants T in 1..64 and N in 1..%d, got '%s' '%s'\n", MAXN, argv[2],
                    argv[3]);
            return 2;
        }
        only_t = (int)t, only_n = (int)n;
    } else if (argc != 1) {
        fprintf(stderr, "usage: cuda_bench_mla [--quick | --shape T N]\n");
        return 2;
    }
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));

    /* ---- ceiling 1: device-to-device copy of 2 GiB ---- */
    const size_t cbytes = (size_t)2 << 30;
    void *ca, *cb;
    CU(cudaMalloc(&ca, cbytes));
    CU(cudaMalloc(&cb, cbytes));
    CU(cudaMemset(ca, 1, cbytes));
    float ct[5];
    for (int r = -1; r < 5; r++) {
        CU(cudaEventRecord(e0, st));
        CU(cudaMemcpyAsync(cb, ca, cbytes, cudaMemcpyDeviceToDevice, st));
        CU(cudaEventRecord(e1, st));
        CU(cudaEventSynchronize(e1));
        if (r >= 0) CU(cudaEventElapsedTime(&ct[r], e0, e1));
    }
    qsort(ct, 5, sizeof(float), cmp_f);
    const double bw = 2.0 * (double)cbytes / (ct[2] * 1e-3); /* bytes read + written per second */
    CU(cudaFree(ca));
    CU(cudaFree(cb));

    /* ---- ceiling 2: cuBLAS bf16 GEMM 8192^3 on random data ---- */
    const int M = 8192;
    const size_t mel = (size_t)M * M;
    uint16_t *hm = malloc(mel * 2);
    for (size_t i = 0; i < mel; i++) hm[i] = rbf16();
    void *ga, *gb, *gc;
    CU(cudaMalloc(&ga, mel * 2));
    CU(cudaMalloc(&gb, mel * 2));
    CU(cudaMalloc(&gc, mel * 2));
    CU(cudaMemcpy(ga, hm, mel * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(gb, hm, mel * 2, cudaMemcpyHostToDevice));
    cublasHandle_t hb;
    CB(cublasCreate(&hb));
    CB(cublasSetStream(hb, st));
    const float one = 1.0f, zero = 0.0f;
    float gt[10];
    for (int r = -3; r < 10; r++) {
        CU(cudaEventRecord(e0, st));
        CB(cublasGemmEx(hb, CUBLAS_OP_N, CUBLAS_OP_N, M, M, M, &one, ga, CUDA_R_16BF, M, gb, CUDA_R_16BF, M, &zero, gc,
                        CUDA_R_16BF, M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        CU(cudaEventRecord(e1, st));
        CU(cudaEventSynchronize(e1));
        if (r >= 0) CU(cudaEventElapsedTime(&gt[r], e0, e1));
    }
    qsort(gt, 10, sizeof(float), cmp_f);
    const double mm_rate = 2.0 * M * (double)M * M / (gt[5] * 1e-3);
    CB(cublasDestroy(hb));
    CU(cudaFree(ga));
    CU(cudaFree(gb));
    CU(cudaFree(gc));

    printf("## MLA tree-verify attention (K2.6: H=%d, dk=%d, dv=%d), %s, %d SMs\n\n", H, DK, DV, prop.name,
           prop.multiProcessorCount);
    printf("Ceilings measured in this run: d2d copy %.0f GB/s (read+write), cuBLAS bf16 8192^3 %.0f TFLOP/s.\n\n",
           bw * 1e-9, mm_rate * 1e-12);

    /* ---- inputs: REGIONS cache regions of MAXN + 128 rows, q and out for T = 64 ---- */
    const long long reg_rows = MAXN + 128, kv_rows = reg_rows * REGIONS;
    const size_t kv_el = (size_t)kv_rows * DK;
    uint16_t *hkv = malloc(kv_el * 2);
    for (size_t i = 0; i < kv_el; i++) hkv[i] = rbf16();
    const size_t q_el = (size_t)64 * H * DK;
    uint16_t *hq = malloc(q_el * 2);
    for (size_t i = 0; i < q_el; i++) hq[i] = rbf16();
    void *dkv, *dq, *dout, *dws;
    int32_t *dnp;
    uint64_t *dvis;
    float *dlse;
    CU(cudaMalloc(&dkv, kv_el * 2));
    CU(cudaMalloc(&dq, q_el * 2));
    CU(cudaMalloc(&dout, (size_t)64 * H * DV * 2));
    CU(cudaMalloc((void **)&dlse, (size_t)64 * H * 4));
    size_t ws_max = 0;
    for (int t = 1; t <= 64; t++)
        if (ddt_cuda_mla_verify_workspace(t, H, MAXN) > ws_max) ws_max = ddt_cuda_mla_verify_workspace(t, H, MAXN);
    CU(cudaMalloc(&dws, ws_max));
    CU(cudaMalloc((void **)&dnp, 4));
    CU(cudaMalloc((void **)&dvis, 64 * 8));
    CU(cudaMemcpy(dkv, hkv, kv_el * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dq, hq, q_el * 2, cudaMemcpyHostToDevice));
    uint64_t vis[64];
    for (int j = 0; j < 64; j++) vis[j] = (j == 63 ? ~0ull : ((1ull << (j + 1)) - 1)); /* a chain */
    CU(cudaMemcpy(dvis, vis, sizeof vis, cudaMemcpyHostToDevice));
    free(hkv);
    free(hq);
    free(hm);

    const int Ts[] = {1, 16, 32, 64};
    const int Ns[] = {1024, 4096, 16384, 65536};
    printf("| T | N | merge | splits | time (us) | with PDL (us) | floor (us) | ratio | TFLOP/s | GB/s |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int ti = 0; ti < 4; ti++)
        for (int ni = 0; ni < 4; ni++) {
            const int T = only_t ? only_t : Ts[ti], N = only_n ? only_n : Ns[ni];
            if (only_t && (ti > 0 || ni > 0)) break;
            if (quick && !((T == 1 || T == 16 || T == 64) && (N == 4096 || N == 65536))) continue;
            CU(cudaMemcpy(dnp, &N, 4, cudaMemcpyHostToDevice));
            /* G calls per graph: enough cache regions to exceed L2 (about 150 MB), within the buffer */
            int G = (int)(150e6 / ((double)N * DK * 2));
            if (G < 4) G = 4;
            if (G > 64) G = 64;
            const long long stride_rows = ((long long)N + 128 + 7) & ~7ll;
            const long long regions = kv_rows / stride_rows;
            ddt_cuda_mla_verify a;
            memset(&a, 0, sizeof a);
            a.n_tokens = T;
            a.n_heads = H;
            a.q = dq;
            a.kv_ld = DK;
            a.n_prefix = dnp;
            a.max_prefix = MAXN;
            a.vis = dvis;
            a.scale = 0.14468f;
            a.out = dout;
            a.out_ld = DV;
            a.lse = dlse;
            a.workspace = dws;
            ddt_error err;
            /* one eager call first: kernel attributes and the cluster occupancy query run outside capture */
            a.kv = dkv;
            a.kv_rows = stride_rows;
            if (ddt_cuda_mla_verify_run(&a, st, &err) != DDT_OK) {
                fprintf(stderr, "mla: %s\n", err.msg);
                return 1;
            }
            CU(cudaStreamSynchronize(st));
            cudaGraph_t graph;
            cudaGraphExec_t ge;
            CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (int g = 0; g < G; g++) {
                a.kv = (const uint16_t *)dkv + (size_t)((g % regions) * stride_rows) * DK;
                if (ddt_cuda_mla_verify_run(&a, st, &err) != DDT_OK) {
                    fprintf(stderr, "mla: %s\n", err.msg);
                    return 1;
                }
            }
            CU(cudaStreamEndCapture(st, &graph));
            CU(cudaGraphInstantiate(&ge, graph, 0));
            float ms, ms_pdl;
            if (time_graph(ge, st, &ms)) return 1;
            CU(cudaGraphExecDestroy(ge));
            /* the same graph with its kernel-to-kernel edges programmatic, as the engine runs a round */
            if (ddt_cuda_graph_programmatic(graph, false, NULL, &err) != DDT_OK) {
                fprintf(stderr, "mla: %s\n", err.msg);
                return 1;
            }
            CU(cudaGraphInstantiate(&ge, graph, 0));
            if (time_graph(ge, st, &ms_pdl)) return 1;
            CU(cudaGraphExecDestroy(ge));
            CU(cudaGraphDestroy(graph));
            const double sec = ms * 1e-3 / G, sec_pdl = ms_pdl * 1e-3 / G;
            const double bytes = (double)N * DK * 2 + (double)T * H * DK * 2 + (double)T * H * DV * 2;
            const double flops = 2.0 * T * H * (double)N * (DK + DV);
            const double fb = bytes / bw, ff = flops / mm_rate, floor_s = fb > ff ? fb : ff;
            int32_t S, bps;
            ddt_cuda_mla_verify_plan(T, H, N, &S, &bps);
            const int path = ddt_cuda_mla_verify_auto_path(T, H, MAXN);
            printf("| %d | %d | %s | %d x %d blk | %.1f | %.1f | %.1f | %.2f | %.0f | %.0f |\n", T, N,
                   path == DDT_MLA_PATH_CLUSTER ? "cluster" : "global", S, bps, sec * 1e6, sec_pdl * 1e6, floor_s * 1e6,
                   sec / floor_s, flops / sec * 1e-12, bytes / sec * 1e-9);
            fflush(stdout);
        }
    printf("\nmerge: splits merged through distributed shared memory (cluster) or a combine kernel (global).\n"
           "time: a graph of plain edges; with PDL: the same graph, its kernel-to-kernel edges programmatic (the\n"
           "engine's rounds); ratio, TFLOP/s and GB/s are of the plain time.\n");
    CU(cudaFree(dkv));
    CU(cudaFree(dq));
    CU(cudaFree(dout));
    CU(cudaFree(dws));
    CU(cudaFree(dnp));
    CU(cudaFree(dvis));
    CU(cudaFree(dlse));
    return 0;
}
