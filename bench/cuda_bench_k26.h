/*
 * cuda_bench_k26.h — what the K2.6-shaped GPU benchmarks share (cuda_bench_k26.c,
 * cuda_bench_multi.c): Kimi K2.6's decoder config, a random draft tree of up to 64
 * nodes as a 16-block drafter builds them, and the comparator for medians.  Each
 * benchmark is one translation unit, so these are static.
 */
#ifndef DDT_BENCH_CUDA_BENCH_K26_H
#define DDT_BENCH_CUDA_BENCH_K26_H

#include <stdint.h>
#include <string.h>

#include "io/config.h"

static uint64_t g_bench_rng = 0x5DEECE66Dull;
static uint32_t bench_rnd(void) {
    g_bench_rng ^= g_bench_rng << 13;
    g_bench_rng ^= g_bench_rng >> 7;
    g_bench_rng ^= g_bench_rng << 17;
    return (uint32_t)(g_bench_rng >> 16);
}

/* Kimi K2.6's decoder shapes: `layers` layers, the first `dense_first` dense. */
static ddt_model_config bench_k26_config(int layers, int dense_first) {
    ddt_model_config c;
    memset(&c, 0, sizeof c);
    strcpy(c.architecture, "DeepseekV3ForCausalLM");
    c.hidden_size = 7168;
    c.num_hidden_layers = layers;
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
    c.first_k_dense_replace = dense_first;
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
    c.has_yarn = true;
    c.yarn_factor = 64.0f;
    c.yarn_original_max_position = 4096.0f;
    c.yarn_beta_fast = 1.0f;
    c.yarn_beta_slow = 1.0f;
    c.yarn_mscale = 1.0f;
    c.yarn_mscale_all_dim = 1.0f;
    c.bos_token_id = c.eos_token_id = -1;
    return c;
}

/* A random tree of n <= 64 nodes, depth <= 15 (what a 16-block drafter builds). */
static void bench_random_tree(int n, int32_t *tok, int32_t *depth, uint64_t *vis) {
    int32_t par[64];
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)(bench_rnd() % 163840u);
        vis[i] = 0;
        par[i] = -1;
        depth[i] = 0;
        if (i > 0) {
            int p;
            do p = (int)(bench_rnd() % (uint32_t)i); while (depth[p] >= 15);
            par[i] = p;
            depth[i] = depth[p] + 1;
        }
        for (int j = i; j >= 0; j = par[j]) vis[i] |= 1ull << j;
    }
}

static int bench_cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#endif
