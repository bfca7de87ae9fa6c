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

#define LAYERS 2
#define CTX 4096

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

/* Kimi K2.6's decoder shapes, every layer MoE. */
static ddt_model_config k26_moe(void) {
    ddt_model_config c;
    memset(&c, 0, sizeof c);
    strcpy(c.architecture, "DeepseekV3ForCausalLM");
    c.hidden_size = 7168;
    c.num_hidden_layers = LAYERS;
    c.num_attention_heads = 64;
    c.q_lora_rank = 1536;
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.v_head_dim = 128;
    c.vocab_size = 163840;
    c.intermediate_size = 18432;
    c.moe_intermediate_size = 2048;
    c.n_routed_experts = 384;
    c.num_experts_per_tok = 8;
    c.n_shared_experts = 1;
    c.first_k_dense_replace = 0;
    c.moe_layer_freq = 1;
    c.n_group = 1;
    c.topk_group = 1;
    c.norm_topk_prob = true;
    c.routed_scaling_factor = 2.827f;
    strcpy(c.scoring_func, "sigmoid");
    strcpy(c.topk_method, "noaux_tc");
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 50000.0f;
    c.max_position_embeddings = 262144;
    c.rope_interleave = true;
    c.bos_token_id = c.eos_token_id = -1;
    return c;
}

static ddt_status nccl_reduce(void *ctx, float *buf, int64_t count, void *stream, ddt_error *err) {
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

/* a random tree of n <= 64 nodes, depth <= 15 */
static void random_tree(int n, int32_t *tok, int32_t *depth, uint64_t *vis) {
    int32_t par[64];
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)(rnd() % 163840u);
        vis[i] = 0;
        par[i] = -1;
        depth[i] = 0;
        if (i > 0) {
            int p;
            do p = (int)(rnd() % (uint32_t)i); while (depth[p] >= 15);
            par[i] = p;
            depth[i] = depth[p] + 1;
        }
        for (int j = i; j >= 0; j = par[j]) vis[i] |= 1ull << j;
    }
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* median ms per layer of reps verify forwards of n nodes */
static float time_layer(ddt_cuda_target *t, int n, int reps) {
    int32_t tok[64], depth[64], *dtok, *ddep;
    uint64_t vis[64], *dvis;
    random_tree(n, tok, depth, vis);
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
    qsort(v, (size_t)reps, sizeof v[0], cmp_f);
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
    ddt_model_config c = k26_moe();
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
