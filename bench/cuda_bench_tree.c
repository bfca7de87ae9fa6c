/*
 * cuda_bench_tree.c — GPU time of the DDTree round's tree work on the H200:
 * best-first build + walk per round for budgets 16..1024, captured in a CUDA
 * graph and replayed (the way the engine runs a round), and the drafter's
 * per-depth top-K (D = 15 rows of the K2.6 vocabulary, 163840) at K = B, with
 * the floor of one read of the logits at the measured copy bandwidth.
 * The CPU build + walk is timed in the same run as the baseline.
 * Usage: cuda_bench_tree [reps]   (run by scripts/gpu-test.sh)
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/tree_cuda.h"
#include "ddtree.h"

#define CU(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", #call, __FILE__, __LINE__,    \
                    cudaGetErrorString(e_));                                              \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)
#define OK(call)                                                                          \
    do {                                                                                  \
        ddt_error err_;                                                                   \
        if ((call) != DDT_OK) {                                                           \
            fprintf(stderr, "error at %s:%d: %s\n", __FILE__, __LINE__, err_.msg);       \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

enum { D = 15, V = 163840 };

static int cmp_fdesc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 1000;
    const double copy_gbs = 4239.0; /* measured d2d copy, GB/s read + written (reference.md 5) */
    static float logq[D * DDT_MAX_TOPK];
    static int32_t tok[D * DDT_MAX_TOPK], next[DDT_MAX_NODES];
    float *dq, *dz;
    int32_t *dtok, *dnext;
    CU(cudaMalloc((void **)&dq, sizeof logq));
    CU(cudaMalloc((void **)&dtok, sizeof tok));
    CU(cudaMalloc((void **)&dnext, sizeof next));
    CU(cudaMalloc((void **)&dz, (size_t)D * V * sizeof(float)));
    float *z = malloc((size_t)D * V * sizeof(float));
    srand(1);
    for (size_t i = 0; i < (size_t)D * V; i++) z[i] = 4.0f * (float)rand() / (float)RAND_MAX;
    CU(cudaMemcpy(dz, z, (size_t)D * V * sizeof(float), cudaMemcpyHostToDevice));
    size_t wsb = ddt_cuda_topk_workspace_bytes(D, V, DDT_MAX_TOPK);
    void *ws;
    CU(cudaMalloc(&ws, wsb));
    cudaStream_t s;
    CU(cudaStreamCreate(&s));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    ddt_cuda_tree dt;
    OK(ddt_cuda_tree_alloc(DDT_MAX_BUDGET, &dt, &err_));
    ddt_builder *b;
    ddt_tree ct;
    OK(ddt_builder_create(DDT_MAX_BUDGET, &b, &err_));
    OK(ddt_tree_alloc(DDT_MAX_NODES, &ct, &err_));
    printf("| budget B | GPU build+walk, graph (us) | CPU build+walk, 1 core (us) | GPU top-K D=15 x 163840 (us) | top-K floor: one read at copy bw (us) | ratio |\n");
    printf("|---:|---:|---:|---:|---:|---:|\n");
    for (int B = 16; B <= 1024; B *= 2) {
        int K = B;
        for (int d = 0; d < D; d++) {
            double lse = 0.0;
            for (int r = 0; r < K; r++) {
                logq[d * K + r] = (r == 0 ? 3.0f : 0.0f) + 2.0f * (float)rand() / (float)RAND_MAX;
                lse += exp((double)logq[d * K + r]);
                tok[d * K + r] = r * 7 + d;
            }
            for (int r = 0; r < K; r++) logq[d * K + r] -= (float)log(lse);
            qsort(logq + d * K, (size_t)K, sizeof(float), cmp_fdesc);
        }
        ddt_draft_table tb = {D, K, logq, tok};
        OK(ddt_tree_build(b, &tb, 1, B, NULL, 0, &ct, &err_));
        for (int n = 0; n < ct.n_nodes; n++)
            next[n] = ct.first_child[n] >= 0 ? ct.token[ct.first_child[n]] : 0;
        /* CPU baseline */
        double c0 = now_us();
        for (int i = 0; i < reps; i++) {
            ddt_walk_result w;
            OK(ddt_tree_build(b, &tb, 1, B, NULL, 0, &ct, &err_));
            OK(ddt_tree_walk(&ct, next, 0, &w, &err_));
        }
        double cpu_us = (now_us() - c0) / reps;
        CU(cudaMemcpy(dq, logq, (size_t)D * K * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dtok, tok, (size_t)D * K * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dnext, next, (size_t)ct.n_nodes * 4, cudaMemcpyHostToDevice));
        /* one round = build + accept; the accept writes the next root = bonus, and the
         * target's next tokens keep the path the same every round */
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < 10; i++) {
            OK(ddt_cuda_tree_build(&dt, dq, dtok, D, K, B, 0, (ddt_stream)s, &err_));
            OK(ddt_cuda_tree_accept(&dt, dnext, 0, (ddt_stream)s, &err_));
        }
        CU(cudaStreamEndCapture(s, &g));
        CU(cudaGraphInstantiate(&ge, g, 0));
        CU(cudaGraphLaunch(ge, s));
        CU(cudaStreamSynchronize(s));
        int greps = reps / 10 > 5 ? reps / 10 : 5;
        CU(cudaEventRecord(e0, s));
        for (int i = 0; i < greps; i++) CU(cudaGraphLaunch(ge, s));
        CU(cudaEventRecord(e1, s));
        CU(cudaEventSynchronize(e1));
        float ms;
        CU(cudaEventElapsedTime(&ms, e0, e1));
        double gpu_us = ms * 1000.0 / (greps * 10);
        int32_t status;
        CU(cudaMemcpy(&status, dt.status, 4, cudaMemcpyDeviceToHost));
        if (status) {
            fprintf(stderr, "device status %d\n", status);
            return 1;
        }
        /* top-K of the drafter's logits at K = B */
        int kk = B > DDT_MAX_TOPK ? DDT_MAX_TOPK : B;
        OK(ddt_cuda_topk_logsoftmax(dz, D, V, kk, dq, dtok, ws, wsb, (ddt_stream)s, &err_));
        CU(cudaEventRecord(e0, s));
        for (int i = 0; i < 50; i++) OK(ddt_cuda_topk_logsoftmax(dz, D, V, kk, dq, dtok, ws, wsb, (ddt_stream)s, &err_));
        CU(cudaEventRecord(e1, s));
        CU(cudaEventSynchronize(e1));
        CU(cudaEventElapsedTime(&ms, e0, e1));
        double topk_us = ms * 1000.0 / 50;
        double floor_us = (double)D * V * 4 / (copy_gbs * 1e9 / 2.0) * 1e6;
        printf("| %d | %.2f | %.2f | %.1f | %.2f | %.1fx |\n", B, gpu_us, cpu_us, topk_us, floor_us,
               topk_us / floor_us);
        CU(cudaGraphExecDestroy(ge));
        CU(cudaGraphDestroy(g));
    }
    ddt_cuda_tree_free(&dt);
    ddt_tree_free(&ct);
    ddt_builder_destroy(b);
    free(z);
    return 0;
}
