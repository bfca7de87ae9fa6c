/*
 * cuda_bench_tree.c — GPU time of the DDTree round's tree work on the H200:
 * best-first build alone and build + walk per round for budgets 16..1024, on a
 * flat and a peaked table, captured in a CUDA graph and replayed (the way the
 * engine runs a round), and the drafter's
 * per-depth top-K (D = 15 rows of the K2.6 vocabulary, 163840) at K = B, with
 * the floor of one read of the logits at the measured copy bandwidth.
 * The CPU build + walk is timed in the same run as the baseline.  Each GPU
 * timing follows a 200 ms warm-up (the clock of an idle GPU is low) and is the
 * best of three batches.
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
#define WARM_US 200000.0 /* GPU warm-up before each timing */

static int cmp_fdesc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Fills the [D][K] table: log-softmax of K logits per row, sorted.  Flat: the
 * original benchmark's rows (one boosted head, the rest within 2 nats, so the
 * tree is wide and shallow); peaked: logits ~ N(0, 4^2), so each row has a few
 * likely tokens and the tree goes deep (about one best-first step per node). */
static void fill_table(float *logq, int32_t *tok, int K, int peaked) {
    for (int d = 0; d < D; d++) {
        double lse = 0.0;
        for (int r = 0; r < K; r++) {
            float z;
            if (peaked) { /* Box-Muller */
                double u1 = ((double)rand() + 1.0) / ((double)RAND_MAX + 2.0);
                double u2 = (double)rand() / (double)RAND_MAX;
                z = (float)(4.0 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
            } else {
                z = (r == 0 ? 3.0f : 0.0f) + 2.0f * (float)rand() / (float)RAND_MAX;
            }
            logq[d * K + r] = z;
            lse += exp((double)z);
            tok[d * K + r] = r * 7 + d;
        }
        for (int r = 0; r < K; r++) logq[d * K + r] -= (float)log(lse);
        qsort(logq + d * K, (size_t)K, sizeof(float), cmp_fdesc);
    }
}

typedef struct bench_ctx {
    int reps;
    float *dq;
    int32_t *dtok, *dnext;
    cudaStream_t s;
    cudaEvent_t e0, e1;
    ddt_cuda_tree dt;
    ddt_builder *b;
    ddt_tree ct;
} bench_ctx;

/* Replays a graph of 10 rounds (build, or build + accept; the build under the auto
 * rule a when a is not NULL); microseconds per round. */
static int time_graph_auto(bench_ctx *c, int D_, int K, int B, int with_accept, const ddt_cuda_tree_auto *a,
                           double *us) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CU(cudaStreamBeginCapture(c->s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 10; i++) {
        if (a) OK(ddt_cuda_tree_build_auto(&c->dt, c->dq, c->dtok, D_, K, B, 0, a, (ddt_cuda_stream)c->s, &err_));
        else OK(ddt_cuda_tree_build(&c->dt, c->dq, c->dtok, D_, K, B, 0, (ddt_cuda_stream)c->s, &err_));
        if (with_accept) OK(ddt_cuda_tree_accept(&c->dt, c->dnext, 0, (ddt_cuda_stream)c->s, &err_));
    }
    CU(cudaStreamEndCapture(c->s, &g));
    CU(cudaGraphInstantiate(&ge, g, 0));
    /* warm up for WARM_US first: between the CPU baseline's loops the GPU idles
     * and drops to its lowest clock (345 MHz on the H200 against 1980 boost),
     * and a short burst would be timed before the clock comes back up; in the
     * engine the tree kernels run between forward passes, on a busy GPU */
    double t0 = now_us();
    while (now_us() - t0 < WARM_US) {
        CU(cudaGraphLaunch(ge, c->s));
        CU(cudaStreamSynchronize(c->s));
    }
    int greps = c->reps / 10 > 5 ? c->reps / 10 : 5;
    *us = 1e30;
    for (int batch = 0; batch < 3; batch++) { /* best of three */
        CU(cudaEventRecord(c->e0, c->s));
        for (int i = 0; i < greps; i++) CU(cudaGraphLaunch(ge, c->s));
        CU(cudaEventRecord(c->e1, c->s));
        CU(cudaEventSynchronize(c->e1));
        float ms;
        CU(cudaEventElapsedTime(&ms, c->e0, c->e1));
        if (ms * 1000.0 / (greps * 10) < *us) *us = ms * 1000.0 / (greps * 10);
    }
    int32_t status;
    CU(cudaMemcpy(&status, c->dt.status, 4, cudaMemcpyDeviceToHost));
    if (status) {
        fprintf(stderr, "device status %d\n", status);
        return 1;
    }
    CU(cudaGraphExecDestroy(ge));
    CU(cudaGraphDestroy(g));
    return 0;
}

static int time_graph(bench_ctx *c, int D_, int K, int B, int with_accept, double *us) {
    return time_graph_auto(c, D_, K, B, with_accept, NULL, us);
}

/*
 * The auto budget's build against the fixed budget's, at the engine's settings
 * (cap 32, K = 32; the fixed default 20, K = 20) on a peaked table, under the verify
 * costs measured on an H100 for the shipped pair (us: 0 nodes 286, 1-4 307, 8-20 314,
 * 24 347, 32 379; draft + top-K + build 137) and the engine's buckets (0 1 2 4 8 10 12
 * 16 20 24 32).  Rows: the fixed builds at 20 and 32 (what 12 more pops cost), auto
 * with one bucket (no early stop, a trivial cut: the auto instance's fixed costs),
 * auto with the buckets (the stop and the cut), and as the engine's graphs run it
 * (capped at the bucket of 20).  Nodes: built before the stop / kept.
 */
static int bench_auto(bench_ctx *c, float *logq, int32_t *tok) {
    enum { CAP = 32 };
    static const int32_t buckets[] = {0, 1, 2, 4, 8, 10, 12, 16, 20, 24, 32};
    const int nb = (int)(sizeof buckets / sizeof buckets[0]);
    float vcost[CAP + 1];
    for (int n = 0; n <= CAP; n++)
        vcost[n] = n == 0 ? 286.0f : n <= 4 ? 307.0f : n <= 20 ? 314.0f : n <= 24 ? 347.0f : 379.0f;
    float *dv;
    int32_t *dbuilt;
    CU(cudaMalloc((void **)&dv, sizeof vcost));
    CU(cudaMalloc((void **)&dbuilt, 4));
    CU(cudaMemcpy(dv, vcost, sizeof vcost, cudaMemcpyHostToDevice));
    ddt_cuda_tree_auto one = {0}, all = {0}, capped;
    one.vcost = all.vcost = dv;
    one.draft_cost = all.draft_cost = 137.0f;
    one.n_buckets = 1;
    one.bucket[0] = CAP;
    all.n_buckets = nb;
    for (int j = 0; j < nb; j++) all.bucket[j] = buckets[j];
    all.built = dbuilt;
    capped = all;
    capped.capped = true;
    capped.cap = 8; /* bucket[8] = 20 */
    printf("\nThe auto budget's build (cap %d, K = %d) against the fixed budget's, peaked rows, D = %d, graph:\n\n",
           CAP, CAP, D);
    printf("| build | K | GPU build (us) | nodes built / kept |\n|---|---:|---:|---:|\n");
    for (int row = 0; row < 5; row++) {
        const int K = row == 0 ? 20 : CAP, B = row == 0 ? 20 : CAP;
        srand(7); /* the same table in every row: K = 20 takes each row's first 20 ranks */
        fill_table(logq, tok, CAP, 1);
        for (int d = 0; d < D; d++)
            for (int r = 0; r < K; r++) {
                logq[d * K + r] = logq[d * CAP + r];
                tok[d * K + r] = tok[d * CAP + r];
            }
        CU(cudaMemcpy(c->dq, logq, (size_t)D * K * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(c->dtok, tok, (size_t)D * K * 4, cudaMemcpyHostToDevice));
        const ddt_cuda_tree_auto *a = row <= 1 ? NULL : row == 2 ? &one : row == 3 ? &all : &capped;
        static const char *names[] = {"fixed 20", "fixed 32", "auto, one bucket (no stop)", "auto, the engine's buckets",
                                      "auto, capped at 20 (the engine's graph)"};
        CU(cudaMemset(dbuilt, 0, 4));
        double us;
        if (time_graph_auto(c, D, K, B, 0, a, &us)) return 1;
        int32_t built = 0, kept = 0;
        CU(cudaMemcpy(&kept, c->dt.n_nodes, 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(&built, dbuilt, 4, cudaMemcpyDeviceToHost));
        if (a != &all && a != &capped) built = kept;
        printf("| %s | %d | %.2f | %d / %d |\n", names[row], K, us, built, kept);
    }
    CU(cudaFree(dv));
    CU(cudaFree(dbuilt));
    return 0;
}

/* One budget: CPU build + walk, GPU build alone and build + walk, on one table. */
static int bench_budget(bench_ctx *c, float *logq, int32_t *tok, int32_t *next, int B, int peaked,
                        double *cpu_us, double *gpu_build_us, double *gpu_round_us, int *nodes,
                        int *max_depth) {
    int K = B;
    fill_table(logq, tok, K, peaked);
    ddt_draft_table tb = {D, K, logq, tok};
    OK(ddt_tree_build(c->b, &tb, 1, B, NULL, 0, &c->ct, &err_));
    for (int n = 0; n < c->ct.n_nodes; n++)
        next[n] = c->ct.first_child[n] >= 0 ? c->ct.token[c->ct.first_child[n]] : 0;
    *nodes = c->ct.n_nodes;
    *max_depth = c->ct.max_depth;
    double c0 = now_us();
    for (int i = 0; i < c->reps; i++) {
        ddt_walk_result w;
        OK(ddt_tree_build(c->b, &tb, 1, B, NULL, 0, &c->ct, &err_));
        OK(ddt_tree_walk(&c->ct, next, 0, &w, &err_));
    }
    *cpu_us = (now_us() - c0) / c->reps;
    CU(cudaMemcpy(c->dq, logq, (size_t)D * K * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(c->dtok, tok, (size_t)D * K * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(c->dnext, next, (size_t)c->ct.n_nodes * 4, cudaMemcpyHostToDevice));
    /* the accept writes the next root = bonus; the target's next tokens keep the
     * path the same every round */
    if (time_graph(c, D, K, B, 0, gpu_build_us)) return 1;
    if (time_graph(c, D, K, B, 1, gpu_round_us)) return 1;
    return 0;
}

int main(int argc, char **argv) {
    static bench_ctx c;
    c.reps = argc > 1 ? atoi(argv[1]) : 1000;
    const double copy_gbs = 4239.0; /* measured d2d copy, GB/s read + written (reference.md 5) */
    static float logq[D * DDT_MAX_TOPK];
    static int32_t tok[D * DDT_MAX_TOPK], next[DDT_MAX_NODES];
    float *dz;
    CU(cudaMalloc((void **)&c.dq, sizeof logq));
    CU(cudaMalloc((void **)&c.dtok, sizeof tok));
    CU(cudaMalloc((void **)&c.dnext, sizeof next));
    CU(cudaMalloc((void **)&dz, (size_t)D * V * sizeof(float)));
    float *z = malloc((size_t)D * V * sizeof(float));
    srand(1);
    for (size_t i = 0; i < (size_t)D * V; i++) z[i] = 4.0f * (float)rand() / (float)RAND_MAX;
    CU(cudaMemcpy(dz, z, (size_t)D * V * sizeof(float), cudaMemcpyHostToDevice));
    size_t wsb = ddt_cuda_topk_workspace_bytes(D, V, DDT_MAX_TOPK);
    void *ws;
    CU(cudaMalloc(&ws, wsb));
    CU(cudaStreamCreate(&c.s));
    CU(cudaEventCreate(&c.e0));
    CU(cudaEventCreate(&c.e1));
    OK(ddt_cuda_tree_alloc(DDT_MAX_BUDGET, &c.dt, &err_));
    OK(ddt_builder_create(DDT_MAX_BUDGET, &c.b, &err_));
    OK(ddt_tree_alloc(DDT_MAX_NODES, &c.ct, &err_));
    printf("Flat rows (one boosted head; wide, shallow tree), D = 15, K = B:\n\n");
    printf("| budget B | max depth | GPU build, graph (us) | GPU build+walk, graph (us) | CPU build+walk, 1 core (us) | GPU top-K D=15 x 163840 (us) | top-K floor: one read at copy bw (us) | ratio |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int B = 16; B <= 1024; B *= 2) {
        double cpu_us, build_us, gpu_us;
        int nodes, maxd;
        if (bench_budget(&c, logq, tok, next, B, 0, &cpu_us, &build_us, &gpu_us, &nodes, &maxd))
            return 1;
        /* top-K of the drafter's logits at K = B */
        int kk = B > DDT_MAX_TOPK ? DDT_MAX_TOPK : B;
        double t0 = now_us();
        while (now_us() - t0 < WARM_US) { /* warm up, as in time_graph */
            OK(ddt_cuda_topk_logsoftmax(dz, D, V, kk, c.dq, c.dtok, ws, wsb, (ddt_cuda_stream)c.s, &err_));
            CU(cudaStreamSynchronize(c.s));
        }
        CU(cudaEventRecord(c.e0, c.s));
        for (int i = 0; i < 50; i++) OK(ddt_cuda_topk_logsoftmax(dz, D, V, kk, c.dq, c.dtok, ws, wsb, (ddt_cuda_stream)c.s, &err_));
        CU(cudaEventRecord(c.e1, c.s));
        CU(cudaEventSynchronize(c.e1));
        float ms;
        CU(cudaEventElapsedTime(&ms, c.e0, c.e1));
        double topk_us = ms * 1000.0 / 50;
        double floor_us = (double)D * V * 4 / (copy_gbs * 1e9 / 2.0) * 1e6;
        printf("| %d | %d | %.2f | %.2f | %.2f | %.1f | %.2f | %.1fx |\n", B, maxd, build_us, gpu_us,
               cpu_us, topk_us, floor_us, topk_us / floor_us);
    }
    printf("\nPeaked rows (logits ~ N(0, 4^2); deep tree, about one best-first step per node), D = 15, K = B:\n\n");
    printf("| budget B | max depth | GPU build, graph (us) | GPU build+walk, graph (us) | CPU build+walk, 1 core (us) |\n");
    printf("|---:|---:|---:|---:|---:|\n");
    for (int B = 16; B <= 1024; B *= 2) {
        double cpu_us, build_us, gpu_us;
        int nodes, maxd;
        if (bench_budget(&c, logq, tok, next, B, 1, &cpu_us, &build_us, &gpu_us, &nodes, &maxd))
            return 1;
        printf("| %d | %d | %.2f | %.2f | %.2f |\n", B, maxd, build_us, gpu_us, cpu_us);
    }
    if (bench_auto(&c, logq, tok)) return 1;
    ddt_cuda_tree_free(&c.dt);
    ddt_tree_free(&c.ct);
    ddt_builder_destroy(c.b);
    free(z);
    return 0;
}
