/*
 * cuda_bench_mm.c — the FP32 x W^T kernel (qmatmul_cuda.cu, the exact path every
 * product of the shipped pair takes) at the shipped pair's shapes and token counts
 * (1: an ar step, 16: a draft block, 65: a 64-node tree verify), for every warp
 * shape (rows x tokens a warp computes; ddt_cuda_matmul_grouped_shape) and the
 * library's own choice.  These products are tiny (0.1-2 MB of bf16), so they are
 * bound by latency, not bandwidth: the time that counts is one launch inside a
 * CUDA graph, as the engine replays its rounds, measured here as the mean of 64
 * launches captured back to back in one graph, replayed 20 times (CUDA events).
 * Each row also gives the floor (weight bytes over the device-to-device copy
 * bandwidth measured in the same run, ct_copy_bandwidth) to show how far from the roofline a
 * latency-bound product sits.  Prints a markdown table.
 *   cuda_bench_mm [replays]
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/qmatmul_cuda.h"
#include "../tests/cuda/cuda_test.h"

typedef struct {
    const char *name;
    int64_t rows, cols;
    int n;
} shape;

/* rows x cols of the shipped pair's products (models/pystdlib-*: hidden 256) */
static const shape k_shapes[] = {
    {"target q_a|kv_a", 208, 256, 0},       {"target q_b", 192, 128, 0},
    {"target o_proj", 256, 128, 0},         {"target router|shared gate|up", 392, 256, 0},
    {"target shared down", 256, 192, 0},    {"target layer-0 gate|up", 1536, 256, 0},
    {"target layer-0 down", 256, 768, 0},   {"LM head", 4352, 256, 0},
    {"drafter k|v|q", 512, 256, 0},         {"drafter o_proj", 256, 256, 0},
    {"drafter gate|up", 2048, 256, 0},      {"drafter down", 256, 1024, 0},
    {"drafter fc", 256, 1024, 0},
};

static float time_graph(const ddt_qweight *w, const float *x, int n, float *y, int R, int TB, int replays) {
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const ddt_row_groups g = {1, 0, 0, w->rows, 0, 0};
    OK(ddt_cuda_matmul_grouped_shape(w, DDT_CUDA_MM_FP32, &g, x, w->cols, n, y, w->rows, R, TB, NULL, 0, s, &err_));
    CU(cudaStreamSynchronize(s));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 64; i++)
        OK(ddt_cuda_matmul_grouped_shape(w, DDT_CUDA_MM_FP32, &g, x, w->cols, n, y, w->rows, R, TB, NULL, 0, s,
                                         &err_));
    CU(cudaStreamEndCapture(s, &graph));
    CU(cudaGraphInstantiate(&exec, graph, 0));
    CU(cudaGraphLaunch(exec, s));
    CU(cudaStreamSynchronize(s));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    CU(cudaEventRecord(e0, s));
    for (int r = 0; r < replays; r++) CU(cudaGraphLaunch(exec, s));
    CU(cudaEventRecord(e1, s));
    CU(cudaEventSynchronize(e1));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, e0, e1));
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));
    CU(cudaStreamDestroy(s));
    return ms * 1000.0f / (64.0f * (float)replays);
}

int main(int argc, char **argv) {
    const int replays = argc > 1 ? atoi(argv[1]) : 20;
    if (replays < 1) {
        fprintf(stderr, "usage: cuda_bench_mm [replays >= 1]\n");
        return 2;
    }
    (void)g_failures; /* cuda_test.h's counter: a benchmark checks nothing */
    const double bw = ct_copy_bandwidth();
    printf("FP32 x W^T at the shipped pair's shapes, bf16 weights; us per launch inside a CUDA graph "
           "(64 launches, %d replays); copy bandwidth %.0f GB/s\n\n",
           replays, bw / 1e9);
    printf("| product | rows x cols | n | floor us | default us | best shape | best us | 4x1 | 4x2 | 4x4 | 2x1 | 2x2 | 2x4 | 1x1 | 1x2 | 1x4 |\n");
    printf("|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    static const int ns[] = {1, 16, 65};
    uint64_t rng = 0x51ED2701F00Dull;
    for (size_t si = 0; si < sizeof k_shapes / sizeof k_shapes[0]; si++) {
        const shape *sh = &k_shapes[si];
        uint16_t *hwt = malloc(sizeof(uint16_t) * (size_t)(sh->rows * sh->cols));
        for (int64_t i = 0; i < sh->rows * sh->cols; i++) hwt[i] = (uint16_t)(0x3C00u + (ct_xorshift(&rng, 16) & 0x3FFu) - 0x200u);
        ddt_qweight hw = {.format = DDT_Q_DENSE, .dtype = DDT_DTYPE_BF16, .rows = sh->rows, .cols = sh->cols, .data = hwt};
        ddt_qweight w;
        OK(ddt_cuda_qweight_upload(&hw, &w, &err_));
        float *x, *y;
        CU(cudaMalloc((void **)&x, sizeof(float) * (size_t)(65 * sh->cols)));
        CU(cudaMalloc((void **)&y, sizeof(float) * (size_t)(65 * sh->rows)));
        CU(cudaMemset(x, 0, sizeof(float) * (size_t)(65 * sh->cols)));
        for (int ni = 0; ni < 3; ni++) {
            const int n = ns[ni];
            const float def = time_graph(&w, x, n, y, 0, 0, replays);
            float t[9], best = 1e30f;
            int bi = 0;
            static const int rs[] = {4, 2, 1}, tbs[] = {1, 2, 4};
            for (int i = 0; i < 9; i++) {
                t[i] = time_graph(&w, x, n, y, rs[i / 3], tbs[i % 3], replays);
                if (t[i] < best) best = t[i], bi = i;
            }
            const double floor_us = (double)(sh->rows * sh->cols * 2) / bw * 1e6;
            printf("| %s | %lld x %lld | %d | %.2f | %.2f | %dx%d | %.2f |", sh->name, (long long)sh->rows,
                   (long long)sh->cols, n, floor_us, def, rs[bi / 3], tbs[bi % 3], best);
            for (int i = 0; i < 9; i++) printf(" %.2f |", t[i]);
            printf("\n");
        }
        ddt_cuda_qweight_free(&w);
        CU(cudaFree(x));
        CU(cudaFree(y));
        free(hwt);
    }
    return 0;
}
