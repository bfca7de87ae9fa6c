/*
 * test_shard.c — the multi-GPU split (model/shard.h) without a GPU: which heads
 * and experts each rank owns on the shipped model, Kimi K2.6 and a dense model,
 * that the ranks' parts cover the model exactly once, the errors for invalid GPU
 * counts and ranks, and that row / column slices of bf16, FP8-block and INT4
 * weights dequantise to the same values as the same elements of the whole weight;
 * and what a rank must hold (ddt_shard_weight_bytes, ddt_shard_memory_check) on
 * every fixture format: the whole model's bytes are the checkpoint's, the ranks'
 * parts add up to the whole, and the memory check's verdict and advice at the
 * edges (tests/python/test_inspect.py checks the bytes against the safetensors
 * headers, independently).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/qmatmul.h"
#include "io/config.h"
#include "model/shard.h"

static void load_cfg(const char *rel, ddt_model_config *cfg) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", DDT_SOURCE_DIR, rel);
    ddt_error err;
    if (ddt_config_load(path, cfg, &err) != DDT_OK) fail_msg("%s: %s", path, err.msg);
}

/* Every rank's plan for `world`: heads split or replicated as documented, and the
 * routed experts covered once, in rank order, with no rank empty. */
static void check_cover(const ddt_model_config *cfg, int32_t world) {
    const int32_t H = cfg->num_attention_heads, E = cfg->n_routed_experts;
    int32_t next_head = 0, next_expert = 0;
    for (int32_t r = 0; r < world; r++) {
        ddt_shard s;
        ddt_error err;
        assert_int_equal(ddt_shard_plan(cfg, r, world, &s, &err), DDT_OK);
        assert_int_equal(s.rank, r);
        assert_int_equal(s.world, world);
        assert_int_equal(s.split_heads, H % world == 0);
        if (s.split_heads) {
            assert_int_equal(s.head0, next_head);
            assert_int_equal(s.n_heads, H / world);
            next_head += s.n_heads;
        } else {
            assert_int_equal(s.head0, 0);
            assert_int_equal(s.n_heads, H);
        }
        assert_int_equal(s.expert0, next_expert);
        assert_true(s.n_experts >= 1);
        assert_int_equal(s.expert0, (int32_t)((int64_t)r * E / world));
        next_expert += s.n_experts;
    }
    if (H % world == 0) assert_int_equal(next_head, H);
    assert_int_equal(next_expert, E);
}

static void test_plan_shipped(void **state) {
    (void)state;
    ddt_model_config cfg;
    load_cfg("models/pystdlib-target", &cfg); /* 4 heads, 8 experts */
    for (int32_t w = 1; w <= 8; w++) check_cover(&cfg, w);
    ddt_shard s;
    ddt_error err;
    assert_int_equal(ddt_shard_plan(&cfg, 1, 2, &s, &err), DDT_OK);
    assert_int_equal(s.head0, 2);
    assert_int_equal(s.n_heads, 2);
    assert_int_equal(s.expert0, 4);
    assert_int_equal(s.n_experts, 4);
    /* 3 does not divide 4 heads: attention replicated; experts 2 / 3 / 3 */
    assert_int_equal(ddt_shard_plan(&cfg, 2, 3, &s, &err), DDT_OK);
    assert_false(s.split_heads);
    assert_int_equal(s.n_heads, 4);
    assert_int_equal(s.expert0, 5);
    assert_int_equal(s.n_experts, 3);
    /* more GPUs than experts: a rank would hold none */
    assert_int_equal(ddt_shard_plan(&cfg, 0, 9, &s, &err), DDT_ERR_RANGE);
    assert_non_null(strstr(err.msg, "--gpus 9"));
    assert_non_null(strstr(err.msg, "8 routed experts"));
    ddt_config_free(&cfg);
}

static void test_plan_k26_and_dense(void **state) {
    (void)state;
    ddt_model_config cfg;
    load_cfg("tests/fixtures/configs/kimi_k2_6.json", &cfg); /* 64 heads, 384 experts */
    for (int32_t w = 1; w <= 8; w++) check_cover(&cfg, w);
    ddt_shard s;
    ddt_error err;
    assert_int_equal(ddt_shard_plan(&cfg, 7, 8, &s, &err), DDT_OK);
    assert_int_equal(s.head0, 56);
    assert_int_equal(s.n_heads, 8);
    assert_int_equal(s.expert0, 336);
    assert_int_equal(s.n_experts, 48);
    ddt_config_free(&cfg);
    /* a model without MoE layers (dense3 with every layer dense): no experts to
       split, any GPU count works; with its two MoE layers, 6 experts cap it at 6 */
    load_cfg("tests/fixtures/target/dense3", &cfg);
    assert_int_equal(ddt_shard_plan(&cfg, 3, 7, &s, &err), DDT_ERR_RANGE);
    assert_int_equal(ddt_shard_plan(&cfg, 5, 6, &s, &err), DDT_OK);
    assert_int_equal(s.expert0, 5);
    ddt_model_config all_dense = cfg; /* shallow: only cfg is freed */
    all_dense.first_k_dense_replace = all_dense.num_hidden_layers;
    assert_int_equal(ddt_shard_plan(&all_dense, 3, 64, &s, &err), DDT_OK);
    assert_int_equal(s.n_experts, 0);
    assert_false(s.split_heads); /* 4 heads over 64 GPUs: replicated */
    ddt_config_free(&cfg);
}

/* Every rank's slice of an intermediate dimension: together they cover it exactly
 * once, in rank order, either as world equal slices of whole units or as the whole
 * on rank 0. */
static void check_slices(int64_t inter, int64_t unit, int32_t world, bool want_split) {
    int64_t next = 0;
    bool split = true;
    for (int32_t r = 0; r < world; r++) {
        const ddt_shard s = {.rank = r, .world = world};
        int64_t i0, n;
        ddt_shard_mlp_slice(&s, inter, unit, &i0, &n);
        if (n == 0) {
            split = false;
            assert_true(r > 0);
            continue;
        }
        assert_int_equal(i0, next);
        if (world > 1 && n != inter) {
            assert_int_equal(n, inter / world);
            assert_int_equal(n % unit, 0);
        } else if (world > 1) {
            split = false;
            assert_int_equal(r, 0);
        }
        next += n;
    }
    assert_int_equal(next, inter);
    if (world > 1) assert_int_equal(split, want_split);
}

static void test_mlp_slices(void **state) {
    (void)state;
    int64_t i0 = -1, n = -1;
    ddt_shard_mlp_slice(NULL, 2048, 32, &i0, &n); /* unsharded: all of it */
    assert_int_equal(i0, 0);
    assert_int_equal(n, 2048);
    /* Kimi K2.6 at 8 GPUs: the shared expert (2048) and layer 0's MLP (18432), bf16 */
    check_slices(2048, 32, 8, true);
    check_slices(18432, 32, 8, true);
    const ddt_shard k7 = {.rank = 7, .world = 8};
    ddt_shard_mlp_slice(&k7, 2048, 32, &i0, &n);
    assert_int_equal(i0, 1792);
    assert_int_equal(n, 256);
    /* the shipped pair's shared expert (192): 2 and 3 GPUs split it, 4 (48 rows) do not */
    check_slices(192, 32, 2, true);
    check_slices(192, 32, 3, true);
    check_slices(192, 32, 4, false);
    check_slices(768, 32, 4, true);
    /* FP8 blocks of 128: 2304 or 1536 rows split 8 ways (288, 192) are not whole blocks */
    check_slices(2304, 128, 8, false);
    check_slices(1536, 128, 8, false);
    check_slices(2048, 128, 8, true);
    for (int64_t inter = 1; inter <= 600; inter += 7)
        for (int32_t w = 1; w <= 9; w++)
            for (int64_t u = 32; u <= 128; u *= 2)
                check_slices(inter, u, w, inter % w == 0 && (inter / w) % u == 0);
    /* units: 32 rows, with the formats' blocks and groups */
    assert_int_equal(ddt_shard_mlp_unit_of(DDT_Q_DENSE, 0), 32);
    assert_int_equal(ddt_shard_mlp_unit_of(DDT_Q_FP8_BLOCK, 128), 128);
    assert_int_equal(ddt_shard_mlp_unit_of(DDT_Q_FP8_BLOCK, 96), 96);
    assert_int_equal(ddt_shard_mlp_unit_of(DDT_Q_INT4_GROUP, 32), 32);
    assert_int_equal(ddt_shard_mlp_unit_of(DDT_Q_INT4_GROUP, 48), 96);
    ddt_cpu_mlp m = {.gate = {.format = DDT_Q_DENSE}, .up = {.format = DDT_Q_DENSE}, .down = {.format = DDT_Q_DENSE}};
    assert_int_equal(ddt_shard_mlp_unit(&m), 32);
    m.down = (ddt_qweight){.format = DDT_Q_INT4_GROUP, .group = 64};
    assert_int_equal(ddt_shard_mlp_unit(&m), 64); /* down's columns cut at its groups */
    m.gate = (ddt_qweight){.format = DDT_Q_FP8_BLOCK, .block = 128};
    assert_int_equal(ddt_shard_mlp_unit(&m), 128); /* gate's rows cut at its blocks */
    m.gate = (ddt_qweight){.format = DDT_Q_INT4_GROUP, .group = 128};
    assert_int_equal(ddt_shard_mlp_unit(&m), 64); /* INT4 groups run along a row: rows cut anywhere */
}

/* The logits' vocabulary rows: K2.6's 163840 over 8 GPUs (20480 each), DeepSeek-V3's
 * 129280 (16160), the shipped pair's 4352 over 2, 4 and 8 (2176, 1088, 544); not
 * where a rank's share is no whole number of 32-row units (the fixtures' 300 over 2:
 * 150), or the world does not divide the vocabulary (4352 over 3). */
static void test_vocab_slices(void **state) {
    (void)state;
    const struct {
        int64_t vocab;
        int32_t world;
        bool split;
    } cases[] = {{163840, 8, true}, {4352, 2, true}, {4352, 4, true}, {4352, 8, true}, {300, 2, false},
                 {4352, 3, false},  {129280, 8, true}, {129280, 16, false}, {64, 2, true}, {96, 2, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t next = 0;
        for (int32_t r = 0; r < cases[i].world; r++) {
            const ddt_shard s = {.rank = r, .world = cases[i].world};
            int64_t v0, n;
            bool split;
            ddt_shard_vocab_slice(&s, cases[i].vocab, &v0, &n, &split);
            assert_int_equal(split, cases[i].split);
            if (!split) {
                assert_int_equal(v0, 0);
                assert_int_equal(n, cases[i].vocab);
                continue;
            }
            assert_int_equal(v0, next);
            assert_int_equal(n, cases[i].vocab / cases[i].world);
            assert_int_equal(n % DDT_SHARD_VOCAB_UNIT, 0);
            next += n;
        }
        if (cases[i].split) assert_int_equal(next, cases[i].vocab);
    }
    int64_t v0, n;
    bool split;
    ddt_shard_vocab_slice(NULL, 4352, &v0, &n, &split);
    assert_false(split);
    assert_int_equal(n, 4352);
    const ddt_shard one = {.rank = 0, .world = 1};
    ddt_shard_vocab_slice(&one, 4352, &v0, &n, &split);
    assert_false(split);
}

static void test_plan_errors(void **state) {
    (void)state;
    ddt_model_config cfg;
    load_cfg("models/pystdlib-target", &cfg);
    ddt_shard s;
    ddt_error err;
    assert_int_equal(ddt_shard_plan(&cfg, 0, 0, &s, &err), DDT_ERR_RANGE);
    assert_non_null(strstr(err.msg, "--gpus 0"));
    assert_int_equal(ddt_shard_plan(&cfg, 0, -2, &s, &err), DDT_ERR_RANGE);
    assert_int_equal(ddt_shard_plan(&cfg, 0, DDT_SHARD_MAX_WORLD + 1, &s, &err), DDT_ERR_RANGE);
    assert_int_equal(ddt_shard_plan(&cfg, 2, 2, &s, &err), DDT_ERR_RANGE);
    assert_non_null(strstr(err.msg, "rank 2"));
    assert_int_equal(ddt_shard_plan(&cfg, -1, 2, &s, &err), DDT_ERR_RANGE);
    assert_int_equal(ddt_shard_plan(NULL, 0, 1, &s, &err), DDT_ERR_INVALID);
    ddt_config_free(&cfg);
}

/* ------------------------------------------------------------------ slices */

static uint32_t g_rng = 2463534242u;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 17;
    g_rng ^= g_rng << 5;
    return g_rng;
}

/* The slice's element (r, c) equals the whole weight's (r0 + r, c0 + c), bit for bit. */
static void check_same(const ddt_qweight *whole, const ddt_qweight *part, int64_t r0, int64_t c0) {
    float *a = malloc(sizeof(float) * (size_t)part->cols), *b = malloc(sizeof(float) * (size_t)part->cols);
    for (int64_t r = 0; r < part->rows; r++) {
        ddt_cpu_dequant(whole, r0 + r, c0, part->cols, a);
        ddt_cpu_dequant(part, r, 0, part->cols, b);
        assert_memory_equal(a, b, sizeof(float) * (size_t)part->cols);
    }
    free(a);
    free(b);
}

static void test_slice_bf16(void **state) {
    (void)state;
    enum { R = 12, C = 20 };
    uint16_t data[R * C];
    for (int i = 0; i < R * C; i++) data[i] = (uint16_t)(0x3C00 + (rnd() & 0x3FF)); /* finite bf16 */
    ddt_qweight w = {.format = DDT_Q_DENSE, .dtype = DDT_DTYPE_BF16, .rows = R, .cols = C, .data = data};
    ddt_qweight p;
    ddt_error err;
    assert_int_equal(ddt_shard_rows(&w, 3, 6, &p, &err), DDT_OK);
    assert_int_equal(p.rows, 6);
    assert_int_equal(p.cols, C);
    check_same(&w, &p, 3, 0);
    void *buf;
    assert_int_equal(ddt_shard_cols(&w, 5, 9, &p, &buf, &err), DDT_OK);
    assert_int_equal(p.cols, 9);
    check_same(&w, &p, 0, 5);
    free(buf);
    assert_int_equal(ddt_shard_rows(&w, 8, 5, &p, &err), DDT_ERR_RANGE);
    assert_int_equal(ddt_shard_rows(&w, 0, 0, &p, &err), DDT_ERR_RANGE);
    assert_int_equal(ddt_shard_cols(&w, -1, 4, &p, &buf, &err), DDT_ERR_RANGE);
    assert_null(buf);
    assert_int_equal(ddt_shard_cols(&w, 16, 5, &p, &buf, &err), DDT_ERR_RANGE);
}

static void test_slice_fp8(void **state) {
    (void)state;
    enum { B = 128, R = 300, C = 320 }; /* partial last blocks in both directions */
    const int sr = (R + B - 1) / B, sc = (C + B - 1) / B;
    uint8_t *data = malloc((size_t)R * C);
    float scale[3 * 3];
    for (int i = 0; i < R * C; i++) {
        uint8_t v = (uint8_t)rnd();
        data[i] = (v & 0x7F) == 0x7F ? 0 : v; /* no NaN encodings */
    }
    for (int i = 0; i < sr * sc; i++) scale[i] = 0.5f + (float)i;
    ddt_qweight w = {.format = DDT_Q_FP8_BLOCK, .dtype = DDT_DTYPE_F8_E4M3, .rows = R, .cols = C, .data = data,
                     .scale_inv = scale, .block = B};
    ddt_qweight p;
    ddt_error err;
    assert_int_equal(ddt_shard_rows(&w, 128, 172, &p, &err), DDT_OK); /* to the end */
    check_same(&w, &p, 128, 0);
    assert_int_equal(ddt_shard_rows(&w, 128, 128, &p, &err), DDT_OK);
    check_same(&w, &p, 128, 0);
    assert_int_equal(ddt_shard_rows(&w, 64, 128, &p, &err), DDT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "128"));
    void *buf;
    assert_int_equal(ddt_shard_cols(&w, 128, 192, &p, &buf, &err), DDT_OK);
    check_same(&w, &p, 0, 128);
    free(buf);
    assert_int_equal(ddt_shard_cols(&w, 0, 128, &p, &buf, &err), DDT_OK);
    check_same(&w, &p, 0, 0);
    free(buf);
    assert_int_equal(ddt_shard_cols(&w, 0, 100, &p, &buf, &err), DDT_ERR_UNSUPPORTED);
    assert_null(buf);
    free(data);
}

static void test_slice_int4(void **state) {
    (void)state;
    enum { G = 32, R = 5, C = 96 };
    int32_t data[R * C / 8];
    uint16_t scale[R * C / G];
    for (int i = 0; i < R * C / 8; i++) data[i] = (int32_t)rnd();
    for (int i = 0; i < R * C / G; i++) scale[i] = (uint16_t)(0x3C00 + (rnd() & 0xFF));
    ddt_qweight w = {.format = DDT_Q_INT4_GROUP, .dtype = DDT_DTYPE_I32, .rows = R, .cols = C, .data = data,
                     .scale = scale, .group = G};
    ddt_qweight p;
    ddt_error err;
    assert_int_equal(ddt_shard_rows(&w, 1, 3, &p, &err), DDT_OK);
    check_same(&w, &p, 1, 0);
    void *buf;
    assert_int_equal(ddt_shard_cols(&w, 32, 64, &p, &buf, &err), DDT_OK);
    check_same(&w, &p, 0, 32);
    free(buf);
    assert_int_equal(ddt_shard_cols(&w, 32, 32, &p, &buf, &err), DDT_OK);
    check_same(&w, &p, 0, 32);
    free(buf);
    assert_int_equal(ddt_shard_cols(&w, 8, 32, &p, &buf, &err), DDT_ERR_UNSUPPORTED);
}

/* ------------------------------------------------------------------ memory */

static void load_desc(const char *rel, ddt_target_desc *d) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", DDT_SOURCE_DIR, rel);
    ddt_error err;
    if (ddt_target_desc_load(path, NULL, 0, d, &err) != DDT_OK) fail_msg("%s: %s", path, err.msg);
}

static int32_t count_int4(const ddt_qweight *w) { return w->format == DDT_Q_INT4_GROUP; }
static int32_t count_int4_mlp(const ddt_cpu_mlp *m) {
    return count_int4(&m->gate) + count_int4(&m->up) + count_int4(&m->down);
}

/* The whole model's bytes are what the description counted (which adds each INT4
 * weight's 16-byte shape tensor, never uploaded); ranks of every valid split add
 * up to it: routed experts once, dense parts' slices once, the embedding and
 * routers on every rank, attention split by heads or replicated. */
static void check_bytes(const char *rel) {
    ddt_target_desc d;
    load_desc(rel, &d);
    ddt_shard_bytes whole;
    ddt_shard_weight_bytes(&d, NULL, &whole);
    int32_t n_int4 = count_int4(&d.embed) + (d.cfg.tie_word_embeddings ? 0 : count_int4(&d.lm_head));
    for (int32_t l = 0; l < d.dims.n_layers; l++) {
        const ddt_target_layer *L = &d.layers[l];
        n_int4 += count_int4(&L->q_a) + count_int4(&L->q_b) + count_int4(&L->q_proj) + count_int4(&L->kv_a) +
                  count_int4(&L->kv_b) + count_int4(&L->o_proj);
        if (!L->moe) {
            n_int4 += count_int4_mlp(&L->mlp);
            continue;
        }
        n_int4 += count_int4(&L->router);
        for (int32_t e = 0; e < d.dims.n_experts; e++) n_int4 += count_int4_mlp(&L->experts[e]);
        if (L->has_shared) n_int4 += count_int4_mlp(&L->shared);
    }
    assert_int_equal(whole.total + 16u * (uint64_t)n_int4, d.weight_bytes);
    assert_int_equal(whole.embed + whole.attention + whole.router + whole.dense + whole.routed, whole.total);
    for (int32_t w = 1; w <= 8; w++) {
        uint64_t routed = 0, dense = 0, attention = 0;
        bool ok = true;
        for (int32_t r = 0; r < w && ok; r++) {
            ddt_shard s;
            ddt_error err;
            if (ddt_shard_plan(&d.cfg, r, w, &s, &err) != DDT_OK) {
                ok = false;
                break;
            }
            ddt_shard_bytes b;
            ddt_shard_weight_bytes(&d, &s, &b);
            assert_int_equal(b.embed, whole.embed);
            assert_int_equal(b.router, whole.router);
            assert_int_equal(b.total, b.embed + b.attention + b.router + b.dense + b.routed);
            if (!s.split_heads) assert_int_equal(b.attention, whole.attention);
            assert_true(b.attention <= whole.attention);
            assert_true(b.dense <= whole.dense);
            routed += b.routed, dense += b.dense, attention += b.attention;
        }
        if (!ok) break;
        assert_int_equal(routed, whole.routed);
        assert_int_equal(dense, whole.dense);
        /* split heads: the replicated parts (norms, q_a, kv_a) w times, the sliced ones once */
        assert_true(attention >= whole.attention);
        if (w == 1) assert_int_equal(attention, whole.attention);
    }
    ddt_target_desc_free(&d);
}

static void test_bytes_fixtures(void **state) {
    (void)state;
    static const char *const dirs[] = {"models/pystdlib-target",     "tests/fixtures/target/fp32",
                                       "tests/fixtures/target/bf16", "tests/fixtures/target/fp8",
                                       "tests/fixtures/target/int4", "tests/fixtures/target/kimi",
                                       "tests/fixtures/target/dense3", "tests/fixtures/target/qlora_null",
                                       "tests/fixtures/fused/fp8_fused"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) check_bytes(dirs[i]);
}

/* The verdict at the edge and the advice: more GPUs where the weights do not fit,
 * a shorter context where only the cache does not, neither where nothing fits. */
static void test_memory_check(void **state) {
    (void)state;
    ddt_target_desc d;
    load_desc("models/pystdlib-target", &d);
    ddt_shard_bytes whole, r0;
    ddt_shard_weight_bytes(&d, NULL, &whole);
    ddt_shard s;
    ddt_error err;
    assert_int_equal(ddt_shard_plan(&d.cfg, 0, 2, &s, &err), DDT_OK);
    ddt_shard_weight_bytes(&d, &s, &r0); /* rank 0 of 2 holds the most of that split */
    const int64_t ctx = 1024;
    const uint64_t kv = ddt_shard_kv_bytes(&d.dims, ctx, 4), per_pos = ddt_shard_kv_bytes(&d.dims, 1, 4);
    assert_int_equal(per_pos, (uint64_t)d.dims.n_layers * (uint64_t)(d.dims.rank + d.dims.rope) * 4u);
    assert_int_equal(kv, per_pos * (uint64_t)ctx);
    assert_int_equal(ddt_shard_kv_bytes(&d.dims, ctx, 2) * 2, kv);
    const uint64_t need = whole.total + kv;
    assert_int_equal(ddt_shard_memory_check(&d, NULL, ctx, 4, 0, need, 0, &err), DDT_OK);
    /* one byte short, two GPUs hold it: advice --gpus 2 with rank 0's need; the weights
       fit one GPU, so a shorter context is advised too */
    assert_int_equal(ddt_shard_memory_check(&d, NULL, ctx, 4, 0, need - 1, 3, &err), DDT_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "GPU 3 has"));
    assert_non_null(strstr(err.msg, "KV cache"));
    assert_non_null(strstr(err.msg, "--gpus 2 would need"));
    char want[64];
    snprintf(want, sizeof want, "--ctx %llu would fit", (unsigned long long)((need - 1 - whole.total) / per_pos));
    assert_non_null(strstr(err.msg, want));
    /* what the GPU holds beside the target (the drafter) counts in the need and the message */
    assert_int_equal(ddt_shard_memory_check(&d, NULL, ctx, 4, 4096, need + 4096, 0, &err), DDT_OK);
    assert_int_equal(ddt_shard_memory_check(&d, NULL, ctx, 4, 4096, need + 4095, 0, &err), DDT_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "the drafter's 4.0 KiB"));
    /* the weights alone do not fit one GPU: no --ctx advice, two GPUs do */
    assert_int_equal(ddt_shard_memory_check(&d, NULL, ctx, 4, 0, r0.total + kv, 0, &err), DDT_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "--gpus 2 would need"));
    assert_null(strstr(err.msg, "--ctx"));
    /* rank 0 of 2 one byte short: the advice starts past 2 */
    assert_int_equal(ddt_shard_memory_check(&d, &s, ctx, 4, 0, r0.total + kv, 0, &err), DDT_OK);
    assert_int_equal(ddt_shard_memory_check(&d, &s, ctx, 4, 0, r0.total + kv - 1, 0, &err), DDT_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "rank 0 of 2"));
    assert_null(strstr(err.msg, "--gpus 2 "));
    /* nothing fits: not the embedding alone on 8 GPUs (8 experts: the most it splits over) */
    assert_int_equal(ddt_shard_memory_check(&d, NULL, ctx, 4, 0, whole.embed, 0, &err), DDT_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "no split over up to 8 GPUs"));
    /* a context too long for any GPU count, weights that fit: the --ctx advice alone */
    assert_int_equal(ddt_shard_memory_check(&d, NULL, 1 << 30, 4, 0, whole.total + 10 * per_pos, 0, &err),
                     DDT_ERR_NOMEM);
    assert_non_null(strstr(err.msg, "; --ctx 10 would fit"));
    assert_non_null(strstr(err.msg, "1073741824 positions"));
    ddt_target_desc_free(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_shipped),     cmocka_unit_test(test_plan_k26_and_dense),
        cmocka_unit_test(test_mlp_slices),       cmocka_unit_test(test_vocab_slices),
        cmocka_unit_test(test_plan_errors),      cmocka_unit_test(test_slice_bf16),
        cmocka_unit_test(test_slice_fp8),        cmocka_unit_test(test_slice_int4),
        cmocka_unit_test(test_bytes_fixtures),   cmocka_unit_test(test_memory_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
