/*
 * cuda_bench_multi.c — what the multi-GPU split costs and saves.  Two Kimi K2.6
 * MoE layers at the real shapes (hidden 7168, 64 heads, MLA 1536/512/64, 384
 * INT4 routed experts of 2048, top-8, one bf16 shared expert, bf16 attention,
 * fast attention, the tensor cores as the engine runs K2.6), random weights made
 * on the device, a random latent cache of
 * 4096 rows standing for the context.  One forward per layer (n = 1 is the AR
 * step; n > 1 a tree verify of a random tree of n nodes).
 *
 * On one GPU (always):
 *   whole      the unsharded target (the single-GPU path)
 *   sums 1     rank 0 of 1 with the engine's sums (engine/rank_sum_cuda.h: an
 *              all-gather, then the partials added in rank order; at one rank a
 *              copy), two a layer: the multi-GPU path's overhead
 *   rank 0/8   rank 0 of 8 (8 heads, 48 experts, 256 of the shared expert's 2048
 *              rows, its router stacked with them as every rank's is) with the
 *              sums left out: one rank's compute share at 8 GPUs.  Its outputs
 *              are not the model's (nothing is summed); the router still picks
 *              from all 384 experts, so the rank reads the experts it really would.
 * With W GPUs visible, for every world 2, 4, 8 up to W (real ranks, one host
 * thread a GPU, the layer's time the slowest rank's):
 *   ranks w          the engine's path: the rank-order sums
 *   ranks w, nccl    the same with ncclAllReduce (what the engine does not use:
 *                    its sums' order depends on the token count from 3 ranks
 *                    on; here for the cost of the rank order)
 *
 *   cuda_bench_multi [--quick] [--world W]   (markdown on stdout; --world caps the
 *                                             real worlds, 1 = none)
 */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/cuda/cuda_test.h"
#include "io/config.h"
#include "engine/rank_sum_cuda.h"
#include "model/target_cuda.h"
#include "cuda_bench_k26.h"

#define LAYERS 2
#define CTX 4096

/* ranks w, nccl: ncclAllReduce in place */
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

/* median ms per layer of reps verify forwards of n nodes; bar (or NULL) lines the
 * ranks of a real world up before every forward */
static float time_layer(ddt_cuda_target *t, int n, int reps, pthread_barrier_t *bar) {
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
        if (bar) pthread_barrier_wait(bar);
        CU(cudaEventRecord(e0, s));
        OK(ddt_cuda_target_verify(t, dtok, ddep, dvis, 1, n, NULL, &err_));
        CU(cudaEventRecord(e1, s));
        CU(cudaEventSynchronize(e1));
        if (r >= 0) CU(cudaEventElapsedTime(&v[r], e0, e1));
    }
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    CU(cudaFree(dtok));
    CU(cudaFree(ddep));
    CU(cudaFree(dvis));
    qsort(v, (size_t)reps, sizeof v[0], bench_cmp_float);
    return v[reps / 2] / LAYERS;
}

#define N_MAX 6
static const int NS[N_MAX] = {1, 4, 8, 16, 32, 64};

/* One row of the table: its name, weights (one rank's, GB) and ms per layer by n. */
typedef struct row {
    char name[32];
    double gb;
    float ms[N_MAX];
} row;

static ddt_cuda_target *make_target(const ddt_model_config *c, ddt_cuda_target_options o) {
    o.max_ctx = CTX + 128, o.max_tokens = 64, o.fast_attention = true, o.tensor_cores = true;
    const ddt_cuda_synth_options so = {
        .dense_format = DDT_Q_DENSE, .expert_format = DDT_Q_INT4_GROUP, .lm_head = false, .seed = 1};
    ddt_cuda_target *t;
    OK(ddt_cuda_target_synthetic(c, &o, &so, &t, &err_));
    OK(ddt_cuda_target_fake_context(t, CTX, 7, &err_));
    return t;
}

/* ------------------------------------------------------------------ real worlds */

typedef struct rank_arg {
    int r, world, n_n, reps;
    bool plain; /* ncclAllReduce instead of the rank-order sums */
    ncclComm_t comm;
    const ddt_model_config *c;
    pthread_barrier_t *bar;
    double gb;
    float ms[N_MAX];
} rank_arg;

static void *rank_main(void *p) {
    rank_arg *a = p;
    CU(cudaSetDevice(a->r));
    ddt_rank_sum rs = ddt_rank_sum_make(a->comm, a->world);
    ddt_cuda_target_options o = {.shard_rank = a->r, .shard_world = a->world};
    if (a->plain) o.allreduce = nccl_reduce, o.allreduce_ctx = &a->comm;
    else o.allreduce = ddt_rank_sum_allreduce, o.allreduce_ctx = &rs;
    ddt_cuda_target *t = make_target(a->c, o);
    a->gb = (double)ddt_cuda_target_weight_bytes(t) * 1e-9;
    for (int i = 0; i < a->n_n; i++) a->ms[i] = time_layer(t, NS[i], a->reps, a->bar);
    ddt_cuda_target_free(t);
    ddt_rank_sum_release(&rs);
    return NULL;
}

/* world ranks on GPUs 0..world-1: the slowest rank's ms per layer */
static row real_world(const ddt_model_config *c, int world, bool plain, int n_n, int reps) {
    ncclComm_t comm[8];
    int devs[8];
    for (int r = 0; r < world; r++) devs[r] = r;
    if (ncclCommInitAll(comm, world, devs) != ncclSuccess) {
        fprintf(stderr, "ncclCommInitAll over %d GPUs failed\n", world);
        exit(1);
    }
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)world);
    rank_arg a[8];
    pthread_t th[8];
    for (int r = 0; r < world; r++) {
        a[r] = (rank_arg){.r = r, .world = world, .n_n = n_n, .reps = reps, .plain = plain, .comm = comm[r], .c = c,
                          .bar = &bar};
        if (pthread_create(&th[r], NULL, rank_main, &a[r])) {
            fprintf(stderr, "pthread_create failed\n");
            exit(1);
        }
    }
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&bar);
    for (int r = 0; r < world; r++) ncclCommDestroy(comm[r]);
    row w = {.gb = a[0].gb};
    snprintf(w.name, sizeof w.name, plain ? "ranks %d, nccl" : "ranks %d", world);
    for (int i = 0; i < n_n; i++)
        for (int r = 0; r < world; r++) w.ms[i] = r == 0 || a[r].ms[i] > w.ms[i] ? a[r].ms[i] : w.ms[i];
    CU(cudaSetDevice(0));
    return w;
}

int main(int argc, char **argv) {
    bool quick = false;
    int max_world = 8;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--world") && i + 1 < argc) {
            char *end;
            long w = strtol(argv[++i], &end, 10);
            if (*end || w < 1 || w > 8) {
                fprintf(stderr, "--world %s: a number of GPUs in 1..8\n", argv[i]);
                return 2;
            }
            max_world = (int)w;
        } else {
            fprintf(stderr, "usage: cuda_bench_multi [--quick] [--world W]  (unknown argument '%s')\n", argv[i]);
            return 2;
        }
    }
    const int n_n = quick ? 3 : N_MAX, reps = quick ? 3 : 9;
    int n_dev = 0;
    CU(cudaGetDeviceCount(&n_dev));
    if (n_dev < max_world) max_world = n_dev;
    row rows[3 + 6];
    int n_rows = 0;
    ncclComm_t comm;
    int dev0 = 0;
    if (ncclCommInitAll(&comm, 1, &dev0) != ncclSuccess) {
        fprintf(stderr, "ncclCommInitAll over 1 GPU failed\n");
        return 1;
    }
    ddt_model_config c = bench_k26_config(LAYERS, 0);
    const char *names[3] = {"whole", "sums 1", "rank 0/8"};
    for (int v = 0; v < 3; v++) {
        ddt_rank_sum rs = ddt_rank_sum_make(comm, 1);
        ddt_cuda_target_options o = {0};
        if (v == 1) o.shard_rank = 0, o.shard_world = 1, o.allreduce = ddt_rank_sum_allreduce, o.allreduce_ctx = &rs;
        if (v == 2) o.shard_rank = 0, o.shard_world = 8, o.allreduce = no_reduce;
        ddt_cuda_target *t = make_target(&c, o);
        row *w = &rows[n_rows++];
        snprintf(w->name, sizeof w->name, "%s", names[v]);
        w->gb = (double)ddt_cuda_target_weight_bytes(t) * 1e-9;
        for (int i = 0; i < n_n; i++) w->ms[i] = time_layer(t, NS[i], reps, NULL);
        ddt_cuda_target_free(t);
        ddt_rank_sum_release(&rs);
    }
    ncclCommDestroy(comm);
    for (int world = 2; world <= max_world; world *= 2)
        for (int plain = 0; plain < 2; plain++) rows[n_rows++] = real_world(&c, world, plain, n_n, reps);
    printf("# Multi-GPU split of a Kimi K2.6 MoE layer\n\n"
           "%d MoE layers, context %d, fast attention, tensor cores; ms per layer (median of %d; a real world's slowest rank), "
           "weights on one GPU for the %d layers (embedding included); %d GPU%s visible:\n\n| variant | weights GB |",
           LAYERS, CTX, reps, LAYERS, n_dev, n_dev == 1 ? "" : "s");
    for (int i = 0; i < n_n; i++) printf(" n=%d |", NS[i]);
    printf("\n|---|---|");
    for (int i = 0; i < n_n; i++) printf("---|");
    printf("\n");
    for (int v = 0; v < n_rows; v++) {
        printf("| %s | %.1f |", rows[v].name, rows[v].gb);
        for (int i = 0; i < n_n; i++) printf(" %.3f |", rows[v].ms[i]);
        printf("\n");
    }
    printf("\nSums path overhead at one rank (sums 1 / whole):");
    for (int i = 0; i < n_n; i++) printf(" n=%d %.2fx", NS[i], rows[1].ms[i] / rows[0].ms[i]);
    printf("\nrank 0 of 8 compute share (rank 0/8 / whole):");
    for (int i = 0; i < n_n; i++) printf(" n=%d %.2fx", NS[i], rows[2].ms[i] / rows[0].ms[i]);
    for (int v = 3; v + 1 < n_rows; v += 2) {
        printf("\n%s: speed-up over whole", rows[v].name);
        for (int i = 0; i < n_n; i++) printf(" n=%d %.2fx", NS[i], rows[0].ms[i] / rows[v].ms[i]);
        printf("; the rank order's cost over ncclAllReduce");
        for (int i = 0; i < n_n; i++) printf(" n=%d %+.3f ms", NS[i], rows[v].ms[i] - rows[v + 1].ms[i]);
    }
    if (max_world < 2) printf("\n\nOne GPU: no real world ran (a real 8-GPU layer adds two sums of n x 7168 fp32).");
    printf("\n");
    return g_failures ? 1 : 0;
}
