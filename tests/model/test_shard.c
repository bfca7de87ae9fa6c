/*
 * test_shard.c — the multi-GPU split (model/shard.h) without a GPU: which heads
 * and experts each rank owns on the shipped model, Kimi K2.6 and a dense model,
 * that the ranks' parts cover the model exactly once, the errors for invalid GPU
 * counts and ranks, and that row / column slices of bf16, FP8-block and INT4
 * weights dequantise to the same values as the same elements of the whole weight.
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
        assert_int_equal(s.dense, r == 0);
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
    assert_false(s.dense);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_shipped),     cmocka_unit_test(test_plan_k26_and_dense),
        cmocka_unit_test(test_plan_errors),      cmocka_unit_test(test_slice_bf16),
        cmocka_unit_test(test_slice_fp8),        cmocka_unit_test(test_slice_int4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
