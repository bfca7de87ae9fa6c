/*
 * cuda_bench_multi.c — what the multi-GPU split costs and saves, measured on
 * one GPU (the 8-GPU run it stands in for needs a machine of 8 H200s).  Two
 * Kimi K2.6 MoE layers at the real shapes (hidden 7168, 64 heads, MLA
 * 1536/512/64, 384 INT4 routed experts of 2048, top-8, one bf16 shared expert,
 * bf16 attention, fast attention), random weights made on the device, a random
 * latent cache of 4096 rows standing for the context.  One forward per layer
 * (n = 1 is the AR step; n > 1 a tree verify of a random tree of n nodes):
 *
 *   whole      the unsharded target (the single-GPU path)
 *   nccl 1     rank 0 of 1 over NCCL: the same work plus the two all-reduces
 *              a layer makes (at one rank NCCL only copies): the path's overhead
 *   rank 0/8   rank 0 of 8 (8 heads, 48 experts, the shared expert) with the
 *              all-reduce left out: one rank's compute share at 8 GPUs.  Its
 *              outputs are not the model's (nothing is summed); the router
 *              still picks from all 384 experts, so the rank reads the experts
 *              it really would.  The all-reduce of 8 x n x 7168 fp32 over NVLink
 *              is not measured here.
 *
 *   cuda_bench_multi [--quick]        (markdown on stdout)
 */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/cuda/cuda_test.h"
#include "io/config.h"
#include "model/target_cuda.h"
#include "cuda_bench_k26.h"

#define LAYERS 2
#define CTX 4096

static ddt_status nccl_reduce(void *ctx, float *buf, int64_t count, void *stream, ddt_error *err) {
    if (!buf) return DDT_OK; /* the target's reservation (target_cuda.h): nothing to reserve here */
    ncclResult_t r = ncclAllReduce(buf, buf, (size_t)count, ncclFloat32, ncclSum, *(ncclComm_t *)ctx,
                                   (cudaStream_t)stream);
    if (r == ncclSuccess) return DDT_OK;
    snprintf(err->msg, sizeof err->msg, "ncclAllReduce: %s", ncclGetErrorString(r));
    return DDT_ERR_INTERNAL;
}

/* rank 0/8: the compute alone */
static ddt_status no_reduce(void *ctx, float *buf, int64_t count, void *stream, ddt_error *err) {
    (void)ctx, (void)buf, (void)count, (void)stream, (void)err;
    return DDT_OK;
}

/* median ms per layer of reps verify forwards of n nodes */
static float time_layer(ddt_cuda_target *t, int n, int reps) {
    int32_t tok[64], depth[64], *dtok, *ddep;
    uint64_t vis[64], *dvis;
    bench_random_tree(n, tok, depth, vis);
    CU(cudaMalloc((void **)&dtok, sizeof tok));
    CU(cudaMalloc((void **)&ddep, sizeof depth));
    CU(cudaMalloc((void **)&dvis, sizeof vis));
    CU(cudaMemcpy(dtok, tok, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(ddep, depth, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dvis, vis, sizeof(uint64_t) * (size_t)n, cudaMemcpyHostToDevice));
    cudaStream_t s = (cudaStream_t)ddt_cuda_target_stream(t);
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    float v[32];
    for (int r = -2; r < reps; r++) {
        CU(cudaEventRecord(e0, s));
        OK(ddt_cuda_target_verify(t, dtok, ddep, dvis, 1, n, NULL, &err_));
        CU(cudaEventRecord(e1, s));
        CU(cudaEventSynchronize(e1));
        if (r >= 0) CU(cudaEventElapsedTime(&v[r], e0, e1));
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(dtok), cudaFree(ddep), cudaFree(dvis);
    qsort(v, (size_t)reps, sizeof v[0], bench_cmp_float);
    return v[reps / 2] / LAYERS;
}

int main(int argc, char **argv) {
    const bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    const int ns[] = {1, 4, 8, 16, 32, 64};
    const int n_n = quick ? 3 : 6, reps = quick ? 3 : 9;
    enum { N_VARIANTS = 3 };
    const char *names[N_VARIANTS] = {"whole", "nccl 1", "rank 0/8"};
    float ms[N_VARIANTS][6];
    double gb[N_VARIANTS];
    ncclComm_t comm;
    int dev0 = 0;
    if (ncclCommInitAll(&comm, 1, &dev0) != ncclSuccess) {
        fprintf(stderr, "ncclCommInitAll over 1 GPU failed\n");
        return 1;
    }
    ddt_model_config c = bench_k26_config(LAYERS, 0);
    ddt_cuda_synth_options so = {.dense_format = DDT_Q_DENSE, .expert_format = DDT_Q_INT4_GROUP, .lm_head = false,
                                 .seed = 1};
    for (int v = 0; v < N_VARIANTS; v++) {
        ddt_cuda_target_options o = {.max_ctx = CTX + 128, .max_tokens = 64, .fast_attention = true};
        if (v == 1) o.shard_rank = 0, o.shard_world = 1, o.allreduce = nccl_reduce, o.allreduce_ctx = &comm;
        if (v == 2) o.shard_rank = 0, o.shard_world = 8, o.allreduce = no_reduce;
        ddt_cuda_target *t;
        OK(ddt_cuda_target_synthetic(&c, &o, &so, &t, &err_));
        gb[v] = (double)ddt_cuda_target_weight_bytes(t) * 1e-9;
        OK(ddt_cuda_target_fake_context(t, CTX, 7, &err_));
        for (int i = 0; i < n_n; i++) ms[v][i] = time_layer(t, ns[i], reps);
        ddt_cuda_target_free(t);
    }
    ncclCommDestroy(comm);
    printf("# Multi-GPU split of a Kimi K2.6 MoE layer, measured on one GPU\n\n"
           "%d MoE layers, context %d, fast attention; ms per layer (median of %d), weights on the device "
           "for the %d layers (embedding included):\n\n| variant | weights GB |", LAYERS, CTX, reps, LAYERS);
    for (int i = 0; i < n_n; i++) printf(" n=%d |", ns[i]);
    printf("\n|---|---|");
    for (int i = 0; i < n_n; i++) printf("---|");
    printf("\n");
    for (int v = 0; v < N_VARIANTS; v++) {
        printf("| %s | %.1f |", names[v], gb[v]);
        for (int i = 0; i < n_n; i++) printf(" %.3f |", ms[v][i]);
        printf("\n");
    }
    printf("\nNCCL path overhead at one rank (nccl 1 / whole):");
    for (int i = 0; i < n_n; i++) printf(" n=%d %.2fx", ns[i], ms[1][i] / ms[0][i]);
    printf("\nrank 0 of 8 compute share (rank 0/8 / whole):");
    for (int i = 0; i < n_n; i++) printf(" n=%d %.2fx", ns[i], ms[2][i] / ms[0][i]);
    printf("\n\nn = 1 is the AR step's forward; a real 8-GPU layer adds two all-reduces of n x 7168 fp32.\n");
    return g_failures ? 1 : 0;
}
