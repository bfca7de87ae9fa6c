/*
 * cuda_bench_k26.c — a Kimi K2.6 slice at the real shapes on one GPU: MoE
 * decoder layers (hidden 7168, 64 heads, MLA 1536/512/64, 384 INT4 routed
 * experts of 2048, top-8, one bf16 shared expert, bf16 attention) and the
 * dense first layer, with random weights made on the device and a random
 * latent cache standing for the context.  Times one tree-verify forward per
 * layer against tree size n and context N (the table the cost-aware budget
 * takes as C_verify), the LM head, and projects a 61-layer round (twice: as
 * before, where each MoE layer carries its share of the embedding gather + first
 * norm of the forward it was timed in, and with that share taken out, timed
 * alone, so the round counts the gather once).
 *
 * Roofline per MoE layer: bytes it must read (attention + shared expert + router
 * weights, the routed experts the n tokens touch, the latent cache) over the
 * device copy bandwidth measured in the same run.  The routed experts touched
 * are counted from the router's actual choices (host readback after the timing).
 * Everything is measured twice: with the target's tensor_cores option off (fp32
 * CUDA-core matmuls) and on (the weight-streaming mma.sync kernels, wstream.cuh).
 *
 *   cuda_bench_k26 [--quick | --tc | --profile n [graph]] [--fork M]   (markdown on stdout)
 * --quick: n <= 8, N <= 4096, both settings; --tc: tensor_cores on only, every n,
 * N <= 4096 (what one device call affords); --profile n: one MoE layer's verify of
 * n tokens at N = 4096 (tensor cores) between cudaProfilerStart and Stop, for
 * `ncu --profile-from-start off` (the time of every kernel of a layer); with
 * `graph`, captured as a graph with programmatic edges and replayed once in that
 * range (for a timeline: `nsys --cuda-graph-trace=node`); --fork M: the targets'
 * shared_fork option (target_cuda.h; default 0).
 */
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/cuda/cuda_test.h"
#include "io/config.h"
#include "backend/cuda/graph_cuda.h"
#include "backend/cuda/qmatmul_cuda.h"
#include "model/target_cuda.h"
#include "cuda_bench_k26.h"

static int32_t g_fork; /* --fork: ddt_cuda_target_options.shared_fork */

/* How a verify forward is timed: launched into the stream kernel by kernel (each
 * kernel starts after the previous one ended), or captured once into a CUDA graph
 * and replayed, with plain edges or with every kernel-to-kernel edge programmatic
 * (PDL), as the engine runs its rounds (engine_cuda.c): the wgmma products then
 * stream their first weight tiles while the kernel before them runs. */
enum { RUN_STREAM = 0, RUN_GRAPH = 1, RUN_GRAPH_PDL = 2 };
static const char *const run_name[] = {"stream", "graph", "graph + PDL"};

/* median ms of reps verify forwards of the tree already on the device; -1 when
 * the forward cannot be captured (printed) */
static float time_verify(ddt_cuda_target *t, const int32_t *dtok, const int32_t *ddep, const uint64_t *dvis, int n,
                         int reps, int how) {
    cudaStream_t s = (cudaStream_t)ddt_cuda_target_stream(t);
    cudaGraphExec_t ge = NULL;
    if (how != RUN_STREAM) {
        cudaGraph_t g = NULL;
        CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        ddt_error cerr;
        const ddt_status st = ddt_cuda_target_verify(t, dtok, ddep, dvis, 1, n, NULL, &cerr);
        const cudaError_t ce = cudaStreamEndCapture(s, &g);
        if (st != DDT_OK || ce != cudaSuccess) {
            printf("(n = %d: the verify forward could not be captured: %s)\n", n,
                   st != DDT_OK ? cerr.msg : cudaGetErrorString(ce));
            if (g) cudaGraphDestroy(g);
            cudaGetLastError();
            return -1.0f;
        }
        if (how == RUN_GRAPH_PDL) OK(ddt_cuda_graph_programmatic(g, false, NULL, &err_));
        CU(cudaGraphInstantiate(&ge, g, 0));
        CU(cudaGraphDestroy(g));
        CU(cudaGraphUpload(ge, s));
    }
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    float v[32];
    for (int r = -2; r < reps; r++) {
        CU(cudaEventRecord(e0, s));
        if (ge) CU(cudaGraphLaunch(ge, s));
        else OK(ddt_cuda_target_verify(t, dtok, ddep, dvis, 1, n, NULL, &err_));
        CU(cudaEventRecord(e1, s));
        CU(cudaEventSynchronize(e1));
        if (r >= 0) CU(cudaEventElapsedTime(&v[r], e0, e1));
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    if (ge) CU(cudaGraphExecDestroy(ge));
    qsort(v, (size_t)reps, sizeof v[0], bench_cmp_float);
    return v[reps / 2];
}

/* Every table for one setting of the target's tensor_cores option. */
static void run_all(bool quick, bool short_ctx, bool tc, double bw) {
    const int ns[] = {1, 2, 4, 8, 16, 32, 48, 64};
    const int Ns[] = {1024, 4096, 16384, 65536};
    const int n_n = quick ? 4 : 8, n_N = quick || short_ctx ? 2 : 4, reps = quick ? 3 : 9;
    const int MOE_LAYERS = 2;
    printf("\n# tensor_cores %s (projections, routed experts, LM head on %s)\n\n", tc ? "on" : "off",
           tc ? "mma.sync bf16 -> fp32" : "fp32 CUDA cores");

    /* MoE layers */
    ddt_model_config c = bench_k26_config(MOE_LAYERS, 0);
    ddt_cuda_target_options o = {.max_ctx = 65536 + 128, .max_tokens = 64, .fast_attention = true,
                                 .tensor_cores = tc, .shared_fork = g_fork};
    ddt_cuda_synth_options so = {.dense_format = DDT_Q_DENSE, .expert_format = DDT_Q_INT4_GROUP, .lm_head = false,
                                 .seed = 1};
    ddt_cuda_target *t;
    OK(ddt_cuda_target_synthetic(&c, &o, &so, &t, &err_));
    printf("%d MoE layers built: %.1f GB of weights on the device\n\n", MOE_LAYERS,
           (double)ddt_cuda_target_weight_bytes(t) * 1e-9);
    int32_t tok[64], depth[64], *dtok, *ddep;
    uint64_t vis[64], *dvis;
    CU(cudaMalloc((void **)&dtok, sizeof tok));
    CU(cudaMalloc((void **)&ddep, sizeof depth));
    CU(cudaMalloc((void **)&dvis, sizeof vis));
    /* per-layer bytes that do not depend on n: attention + shared expert + router, bf16 */
    const double attn_b = 2.0 * (7168.0 * 1536 + 1536.0 * 64 * 192 + 7168.0 * 576 + 512.0 * 64 * 256 + 7168.0 * 64 * 128);
    const double shared_b = 2.0 * 3 * 7168.0 * 2048, router_b = 2.0 * 384 * 7168;
    const double expert_b = 3 * (7168.0 * 2048 / 2 + 7168.0 * 2048 / 32 * 2); /* INT4 + bf16 scales */
    float table[4][8], gtab[2][8]; /* gtab: N = Ns[1] as a graph, plain edges / PDL */
    const int jg = n_N > 1 ? 1 : 0;
    printf("## One MoE layer: tree-verify forward time (ms) by tree size n and context N\n\n"
           "Stream: launched kernel by kernel; graph: the forward captured once and replayed; graph + PDL: "
           "every kernel-to-kernel edge programmatic, as the engine runs its rounds.\n\n| n |");
    for (int j = 0; j < n_N; j++) printf(" N=%d |", Ns[j]);
    printf(" N=%d %s | N=%d %s | floor at N=%d (ms) | ratio | floor at N=%d (ms) | ratio (%s) |\n|---:|", Ns[jg],
           run_name[RUN_GRAPH], Ns[jg], run_name[RUN_GRAPH_PDL], Ns[0], Ns[jg], run_name[RUN_GRAPH_PDL]);
    for (int j = 0; j <= n_N + 5; j++) printf("---:|");
    printf("\n");
    for (int j = 0; j < n_N; j++) {
        OK(ddt_cuda_target_fake_context(t, Ns[j], 7 + (uint64_t)j, &err_));
        for (int i = 0; i < n_n; i++) {
            bench_random_tree(ns[i], tok, depth, vis);
            CU(cudaMemcpy(dtok, tok, sizeof tok, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(ddep, depth, sizeof depth, cudaMemcpyHostToDevice));
            CU(cudaMemcpy(dvis, vis, sizeof vis, cudaMemcpyHostToDevice));
            table[j][i] = time_verify(t, dtok, ddep, dvis, ns[i], reps, RUN_STREAM) / MOE_LAYERS;
            if (j == jg)
                for (int h = 0; h < 2; h++) {
                    const float ms = time_verify(t, dtok, ddep, dvis, ns[i], reps, RUN_GRAPH + h);
                    gtab[h][i] = ms < 0 ? ms : ms / MOE_LAYERS;
                }
        }
    }
    for (int i = 0; i < n_n; i++) {
        printf("| %d |", ns[i]);
        for (int j = 0; j < n_N; j++) printf(" %.3f |", table[j][i]);
        printf(" %.3f | %.3f |", gtab[0][i], gtab[1][i]);
        /* expected distinct experts of n tokens with top-8 of 384 (random routing) */
        double touched = 384.0 * (1.0 - pow(1.0 - 8.0 / 384.0, ns[i]));
        double bytes = attn_b + shared_b + router_b + touched * expert_b;
        double floor0 = (bytes + (double)Ns[0] * 1152.0) / bw * 1e3, floorg = (bytes + (double)Ns[jg] * 1152.0) / bw * 1e3;
        printf(" %.3f | %.2f | %.3f | %.2f |\n", floor0, table[0][i] / floor0, floorg, gtab[1][i] / floorg);
    }
    /* LM head (vocab 163840 x 7168 bf16): the embedding has that shape */
    printf("\n## LM head (163840 x 7168 bf16) by n\n\n| n | ms |\n|---:|---:|\n");
    float lm[8];
    {
        float *x, *y;
        void *mws; /* the tensor path's split activations */
        const size_t mws_bytes = ddt_cuda_matmul_workspace_bytes(7168, 1, 64);
        CU(cudaMalloc((void **)&x, sizeof(float) * 64 * 7168));
        CU(cudaMalloc((void **)&y, sizeof(float) * 64 * (size_t)163840));
        CU(cudaMalloc(&mws, mws_bytes));
        OK(ddt_cuda_fill_uniform(x, 64 * 7168, -1.0f, 1.0f, 99, NULL, &err_)); /* never time on zeros */
        cudaStream_t s = (cudaStream_t)ddt_cuda_target_stream(t);
        cudaEvent_t e0, e1;
        CU(cudaEventCreate(&e0));
        CU(cudaEventCreate(&e1));
        for (int i = 0; i < n_n; i++) {
            float v[16];
            for (int r = -1; r < reps; r++) {
                CU(cudaEventRecord(e0, s));
                OK(ddt_cuda_matmul_mode(ddt_cuda_target_embed(t), tc ? DDT_CUDA_MM_TENSOR : DDT_CUDA_MM_FP32, x,
                                        7168, ns[i], y, 163840, mws, mws_bytes, s, &err_));
                CU(cudaEventRecord(e1, s));
                CU(cudaEventSynchronize(e1));
                if (r >= 0) CU(cudaEventElapsedTime(&v[r], e0, e1));
            }
            qsort(v, (size_t)reps, sizeof v[0], bench_cmp_float);
            lm[i] = v[reps / 2];
            printf("| %d | %.3f |\n", ns[i], lm[i]);
        }
        cudaFree(x), cudaFree(y), cudaFree(mws);
    }
    /* The embedding gather + first norm, once a forward: the MoE layer's time above is a
       forward of MOE_LAYERS layers over MOE_LAYERS, so each layer carries 1 / MOE_LAYERS of
       it; the second projection below takes that share out (it is in the dense layer's
       forward once) */
    printf("\n## Embedding gather + first norm (once a forward) by n\n\n| n | ms |\n|---:|---:|\n");
    float emb[8];
    {
        float *x, *xn, *nw;
        CU(cudaMalloc((void **)&x, sizeof(float) * 64 * 7168));
        CU(cudaMalloc((void **)&xn, sizeof(float) * 64 * 7168));
        CU(cudaMalloc((void **)&nw, sizeof(float) * 7168));
        OK(ddt_cuda_fill_uniform(nw, 7168, 1.0f, 1.0f, 0, NULL, &err_));
        cudaStream_t s = (cudaStream_t)ddt_cuda_target_stream(t);
        cudaEvent_t e0, e1;
        CU(cudaEventCreate(&e0));
        CU(cudaEventCreate(&e1));
        for (int i = 0; i < n_n; i++) {
            bench_random_tree(ns[i], tok, depth, vis);
            CU(cudaMemcpy(dtok, tok, sizeof tok, cudaMemcpyHostToDevice));
            float v[16];
            for (int r = -1; r < reps; r++) {
                CU(cudaEventRecord(e0, s));
                OK(ddt_cuda_embed_rmsnorm(ddt_cuda_target_embed(t), dtok, NULL, ns[i], x, 7168, nw, 1e-6f, xn, 7168, s,
                                          &err_));
                CU(cudaEventRecord(e1, s));
                CU(cudaEventSynchronize(e1));
                if (r >= 0) CU(cudaEventElapsedTime(&v[r], e0, e1));
            }
            qsort(v, (size_t)reps, sizeof v[0], bench_cmp_float);
            emb[i] = v[reps / 2];
            printf("| %d | %.4f |\n", ns[i], emb[i]);
        }
        cudaEventDestroy(e0), cudaEventDestroy(e1);
        cudaFree(x), cudaFree(xn), cudaFree(nw);
    }
    ddt_cuda_target_free(t);

    /* the dense first layer (MLP 18432) */
    c = bench_k26_config(1, 1);
    so.seed = 2;
    OK(ddt_cuda_target_synthetic(&c, &o, &so, &t, &err_));
    OK(ddt_cuda_target_fake_context(t, 4096, 3, &err_));
    float dense[8], dense_s[8];
    printf("\n## Dense layer 0 at N=4096 by n\n\n| n | ms (stream) | ms (graph + PDL) |\n|---:|---:|---:|\n");
    for (int i = 0; i < n_n; i++) {
        bench_random_tree(ns[i], tok, depth, vis);
        CU(cudaMemcpy(dtok, tok, sizeof tok, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(ddep, depth, sizeof depth, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dvis, vis, sizeof vis, cudaMemcpyHostToDevice));
        dense_s[i] = time_verify(t, dtok, ddep, dvis, ns[i], reps, RUN_STREAM);
        dense[i] = time_verify(t, dtok, ddep, dvis, ns[i], reps, RUN_GRAPH_PDL);
        printf("| %d | %.3f | %.3f |\n", ns[i], dense_s[i], dense[i]);
    }
    ddt_cuda_target_free(t);

    /* projection: 1 dense + 60 MoE layers + LM head, at N = 4096, each layer as the
       engine runs it (graph + PDL) where it could be captured, else the stream's time */
    bool as_graph = true;
    for (int i = 0; i < n_n; i++) as_graph = as_graph && gtab[1][i] > 0 && dense[i] > 0;
    const float *moe = as_graph ? gtab[1] : table[jg], *dn = as_graph ? dense : dense_s;
    printf("\n## Projected 61-layer verify round at N=%d (one GPU's compute, no communication; layers timed as %s)\n\n"
           "| n | round ms | tokens/s at tau=1 | tau=2.5 | tau=3.5 | tau=4.5 |\n|---:|---:|---:|---:|---:|---:|\n",
           Ns[jg], as_graph ? run_name[RUN_GRAPH_PDL] : run_name[RUN_STREAM]);
    for (int i = 0; i < n_n; i++) {
        double ms = dn[i] + 60.0 * moe[i] + lm[i];
        printf("| %d | %.2f | %.1f | %.1f | %.1f | %.1f |\n", ns[i], ms, 1e3 / ms, 2.5e3 / ms, 3.5e3 / ms,
               4.5e3 / ms);
    }
    printf("\n## The same with the embedding counted once (in the dense layer's forward): each MoE layer "
           "less its 1/%d share of the gather + norm\n\n"
           "| n | round ms | tokens/s at tau=1 | tau=2.5 | tau=3.5 | tau=4.5 |\n|---:|---:|---:|---:|---:|---:|\n",
           MOE_LAYERS);
    for (int i = 0; i < n_n; i++) {
        double ms = dn[i] + 60.0 * (moe[i] - emb[i] / MOE_LAYERS) + lm[i];
        printf("| %d | %.2f | %.1f | %.1f | %.1f | %.1f |\n", ns[i], ms, 1e3 / ms, 2.5e3 / ms, 3.5e3 / ms,
               4.5e3 / ms);
    }
    cudaFree(dtok), cudaFree(ddep), cudaFree(dvis);
}

static void profile_layer(int n, bool graph) {
    ddt_model_config c = bench_k26_config(1, 0);
    ddt_cuda_target_options o = {.max_ctx = 4096 + 128, .max_tokens = 64, .fast_attention = true, .tensor_cores = true,
                                 .shared_fork = g_fork};
    ddt_cuda_synth_options so = {.dense_format = DDT_Q_DENSE, .expert_format = DDT_Q_INT4_GROUP, .lm_head = false,
                                 .seed = 1};
    ddt_cuda_target *t;
    OK(ddt_cuda_target_synthetic(&c, &o, &so, &t, &err_));
    OK(ddt_cuda_target_fake_context(t, 4096, 7, &err_));
    int32_t tok[64], depth[64], *dtok, *ddep;
    uint64_t vis[64], *dvis;
    CU(cudaMalloc((void **)&dtok, sizeof tok));
    CU(cudaMalloc((void **)&ddep, sizeof depth));
    CU(cudaMalloc((void **)&dvis, sizeof vis));
    bench_random_tree(n, tok, depth, vis);
    CU(cudaMemcpy(dtok, tok, sizeof tok, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(ddep, depth, sizeof depth, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dvis, vis, sizeof vis, cudaMemcpyHostToDevice));
    for (int r = 0; r < 3; r++) OK(ddt_cuda_target_verify(t, dtok, ddep, dvis, 1, n, NULL, &err_));
    CU(cudaDeviceSynchronize());
    cudaGraphExec_t ge = NULL;
    cudaStream_t s = (cudaStream_t)ddt_cuda_target_stream(t);
    if (graph) {
        cudaGraph_t g;
        CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        OK(ddt_cuda_target_verify(t, dtok, ddep, dvis, 1, n, NULL, &err_));
        CU(cudaStreamEndCapture(s, &g));
        OK(ddt_cuda_graph_programmatic(g, false, NULL, &err_));
        CU(cudaGraphInstantiate(&ge, g, 0));
        CU(cudaGraphDestroy(g));
        for (int r = 0; r < 3; r++) CU(cudaGraphLaunch(ge, s));
        CU(cudaDeviceSynchronize());
    }
    CU(cudaProfilerStart());
    if (graph) CU(cudaGraphLaunch(ge, s));
    else OK(ddt_cuda_target_verify(t, dtok, ddep, dvis, 1, n, NULL, &err_));
    CU(cudaDeviceSynchronize());
    CU(cudaProfilerStop());
    if (ge) CU(cudaGraphExecDestroy(ge));
    printf("profiled one MoE layer's verify of %d tokens at N = 4096 (%s, %d layers on the side branch)\n", n,
           graph ? "graph + PDL" : "stream", ddt_cuda_target_forked_layers(t));
    cudaFree(dtok), cudaFree(ddep), cudaFree(dvis);
    ddt_cuda_target_free(t);
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--fork")) g_fork = atoi(argv[i + 1]);
    if (argc > 2 && !strcmp(argv[1], "--profile")) {
        profile_layer(atoi(argv[2]), argc > 3 && !strcmp(argv[3], "graph"));
        return g_failures ? 1 : 0;
    }
    const bool quick = argc > 1 && !strcmp(argv[1], "--quick"), tc_only = argc > 1 && !strcmp(argv[1], "--tc");
    const double bw = ct_copy_bandwidth();
    printf("# Kimi K2.6 slice on one GPU\n\ndevice copy bandwidth (d2d, read + write): %.0f GB/s\n", bw * 1e-9);
    if (!tc_only) run_all(quick, false, false, bw);
    run_all(quick, tc_only, true, bw);
    return g_failures ? 1 : 0;
}
