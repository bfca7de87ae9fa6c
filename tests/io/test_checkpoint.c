/*
 * test_checkpoint.c — multi-file checkpoints (index.json + shards) and the checked
 * lookups: plain tensors and the dense / FP8-block / INT4 pack-quantized weight
 * views, with every failure checked for its status and for a message naming the
 * file or checkpoint and the tensor.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"

static char g_dir[256];

static int setup_dir(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/ddt_test_ck_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown_dir(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- a tiny safetensors writer ------------------------------------------- */

typedef struct tw_tensor {
    const char *name;
    const char *dtype;
    int ndim;
    int64_t shape[8];
    const void *data;
    size_t nbytes;
} tw_tensor;

/* Write tensors to path, each at an 8-byte-aligned offset; data NULL = zeros. */
static void write_st(const char *path, const tw_tensor *ts, int n) {
    size_t cap = 1 << 20;
    char *header = malloc(65536);
    uint8_t *data = calloc(1, cap);
    assert_non_null(header);
    assert_non_null(data);
    size_t used = (size_t)snprintf(header, 65536, "{");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        off = (off + 7) / 8 * 8;
        used += (size_t)snprintf(header + used, 65536 - used, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                 i ? "," : "", ts[i].name, ts[i].dtype);
        for (int d = 0; d < ts[i].ndim; d++)
            used += (size_t)snprintf(header + used, 65536 - used, "%s%lld", d ? "," : "",
                                     (long long)ts[i].shape[d]);
        used += (size_t)snprintf(header + used, 65536 - used, "],\"data_offsets\":[%zu,%zu]}", off,
                                 off + ts[i].nbytes);
        assert_true(off + ts[i].nbytes <= cap);
        if (ts[i].data && ts[i].nbytes) memcpy(data + off, ts[i].data, ts[i].nbytes);
        off += ts[i].nbytes;
    }
    used += (size_t)snprintf(header + used, 65536 - used, "}");
    assert_true(used < 65536);
    size_t padded = (used + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(header, 1, used, f);
    for (size_t i = used; i < padded; i++) fputc(' ', f);
    fwrite(data, 1, off, f);
    fclose(f);
    free(header);
    free(data);
}

static void make_dir(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", g_dir, name);
    assert_int_equal(mkdir(out, 0700), 0);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void assert_msg_has(const ddt_error *err, const char *s) {
    if (!strstr(err->msg, s)) fprintf(stderr, "message lacks \"%s\": %s\n", s, err->msg);
    assert_non_null(strstr(err->msg, s));
}

/* ---- shards ------------------------------------------------------------------ */

/* Two shards plus an index; returns the folder in dir. */
static void make_sharded(const char *name, char *dir, size_t cap, const char *index_text) {
    make_dir(name, dir, cap);
    char p[600];
    float a[4] = {1, 2, 3, 4};
    uint16_t b[2] = {0x3F80, 0x4000};
    int32_t c[3] = {7, 8, 9};
    tw_tensor s1[] = {{"model.embed_tokens.weight", "F32", 2, {2, 2}, a, sizeof a},
                      {"model.norm.weight", "BF16", 1, {2}, b, sizeof b}};
    tw_tensor s2[] = {{"lm_head.weight", "I32", 1, {3}, c, sizeof c}};
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    write_st(p, s1, 2);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_st(p, s2, 1);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    write_text(p, index_text);
}

static const char *k_index =
    "{\"metadata\": {\"total_size\": 28},\n \"weight_map\": {\n"
    "  \"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\",\n"
    "  \"model.norm.weight\": \"model-00001-of-00002.safetensors\",\n"
    "  \"lm_head.weight\": \"model-00002-of-00002.safetensors\"}}";

static void test_sharded_index(void **state) {
    (void)state;
    char dir[512], idx[600];
    make_sharded("sharded", dir, sizeof dir, k_index);
    for (int via_file = 0; via_file < 2; via_file++) {
        snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
        ddt_checkpoint *ck = NULL;
        ddt_error err = {0};
        assert_int_equal(ddt_checkpoint_open(via_file ? idx : dir, &ck, &err), DDT_OK);
        assert_int_equal(ddt_checkpoint_count(ck), 3);
        const ddt_st_tensor *t = ddt_checkpoint_find(ck, "lm_head.weight");
        assert_non_null(t);
        assert_int_equal(((const int32_t *)t->data)[2], 9);
        assert_non_null(strstr(ddt_checkpoint_file_name(ck, t->file_index), "model-00002-of-00002"));
        t = ddt_checkpoint_find(ck, "model.embed_tokens.weight");
        assert_non_null(t);
        assert_true(((const float *)t->data)[3] == 4.0f);
        assert_non_null(strstr(ddt_checkpoint_file_name(ck, t->file_index), "model-00001-of-00002"));
        t = ddt_checkpoint_find(ck, "model.norm.weight");
        assert_true(ddt_bf16_to_f32(((const uint16_t *)t->data)[1]) == 2.0f);
        assert_string_equal(ddt_checkpoint_file_name(ck, 99), "?");
        ddt_checkpoint_close(ck);
    }
}

static void test_duplicate_tensor_across_shards(void **state) {
    (void)state;
    char dir[512], p[600];
    make_sharded("dup", dir, sizeof dir, k_index);
    /* Shard 2 now also holds model.norm.weight. */
    uint16_t b[2] = {0, 0};
    int32_t c[3] = {0};
    tw_tensor s2[] = {{"lm_head.weight", "I32", 1, {3}, c, sizeof c},
                      {"model.norm.weight", "BF16", 1, {2}, b, sizeof b}};
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_st(p, s2, 2);
    ddt_checkpoint *ck = NULL;
    ddt_error err = {0};
    assert_int_equal(ddt_checkpoint_open(dir, &ck, &err), DDT_ERR_FORMAT);
    assert_null(ck);
    assert_msg_has(&err, "model.norm.weight");
    assert_msg_has(&err, "model-00001-of-00002.safetensors");
    assert_msg_has(&err, "model-00002-of-00002.safetensors");
}

static void test_index_names_missing_shard(void **state) {
    (void)state;
    char dir[512], p[600];
    make_sharded("missing_shard", dir, sizeof dir, k_index);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(unlink(p), 0);
    ddt_checkpoint *ck = NULL;
    ddt_error err = {0};
    assert_int_equal(ddt_checkpoint_open(dir, &ck, &err), DDT_ERR_IO);
    assert_null(ck);
    assert_msg_has(&err, p);
    assert_msg_has(&err, "model.safetensors.index.json");
}

static void test_index_maps_tensor_to_wrong_shard(void **state) {
    (void)state;
    char dir[512];
    make_sharded("wrong_shard", dir, sizeof dir,
                 "{\"weight_map\": {\"model.norm.weight\": \"model-00002-of-00002.safetensors\","
                 "\"lm_head.weight\": \"model-00002-of-00002.safetensors\","
                 "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\"}}");
    ddt_checkpoint *ck = NULL;
    ddt_error err = {0};
    assert_int_equal(ddt_checkpoint_open(dir, &ck, &err), DDT_ERR_FORMAT);
    assert_msg_has(&err, "model.norm.weight");
    assert_msg_has(&err, "model-00002-of-00002.safetensors");
}

static void test_bad_index(void **state) {
    (void)state;
    const struct {
        const char *name, *text, *want;
        ddt_status st;
    } cases[] = {
        {"idx_json", "{\"weight_map\": {", "not valid JSON", DDT_ERR_FORMAT},
        {"idx_nomap", "{\"metadata\": {}}", "weight_map", DDT_ERR_FORMAT},
        {"idx_path", "{\"weight_map\": {\"lm_head.weight\": \"../evil.safetensors\"}}", "lm_head.weight",
         DDT_ERR_FORMAT},
        {"idx_type", "{\"weight_map\": {\"lm_head.weight\": 3}}", "lm_head.weight", DDT_ERR_FORMAT},
        {"idx_empty", "{\"weight_map\": {}}", "no tensors", DDT_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[512];
        make_sharded(cases[i].name, dir, sizeof dir, cases[i].text);
        ddt_checkpoint *ck = NULL;
        ddt_error err = {0};
        assert_int_equal(ddt_checkpoint_open(dir, &ck, &err), cases[i].st);
        assert_null(ck);
        assert_msg_has(&err, "model.safetensors.index.json");
        assert_msg_has(&err, cases[i].want);
    }
}

static void test_damaged_shard_is_named(void **state) {
    (void)state;
    char dir[512], p[600];
    make_sharded("bad_shard", dir, sizeof dir, k_index);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_text(p, "garbage!garbage!");
    ddt_checkpoint *ck = NULL;
    ddt_error err = {0};
    assert_int_equal(ddt_checkpoint_open(dir, &ck, &err), DDT_ERR_FORMAT);
    assert_msg_has(&err, p);
}

/* ---- checked lookups ----------------------------------------------------------- */

static ddt_checkpoint *g_ck;
static char g_ck_path[512];

/* FP8: 130 x 300 -> scale [2, 3].  INT4: 4 x 64 -> packed [4, 8], scale [4, 2]. */
enum { FR = 130, FC = 300, IR = 4, IC = 64 };
static uint8_t g_fp8[FR * FC];
static float g_fp8_scale[2 * 3];
static int32_t g_packed[IR * IC / 8];
static uint16_t g_i4_scale[IR * IC / 32];
static int8_t g_i4_q[IR * IC]; /* the signed values packed, -8..7 */

static int setup_weights(void **state) {
    if (setup_dir(state) != 0) return -1;
    for (int i = 0; i < FR * FC; i++) g_fp8[i] = (uint8_t)((i * 37 + 11) % 256);
    for (int i = 0; i < 6; i++) g_fp8_scale[i] = 0.5f + (float)i;
    for (int r = 0; r < IR; r++)
        for (int j = 0; j < IC; j++) g_i4_q[r * IC + j] = (int8_t)(((r * 7 + j * 3) % 16) - 8);
    for (int r = 0; r < IR; r++)
        for (int w = 0; w < IC / 8; w++) {
            uint32_t word = 0;
            for (int k = 0; k < 8; k++)
                word |= (uint32_t)(g_i4_q[r * IC + w * 8 + k] + 8) << (4 * k);
            g_packed[r * (IC / 8) + w] = (int32_t)word;
        }
    for (int i = 0; i < IR * IC / 32; i++) g_i4_scale[i] = ddt_f32_to_bf16(0.25f * (float)(i + 1));

    static uint16_t dense[3 * 5];
    for (int i = 0; i < 15; i++) dense[i] = ddt_f32_to_bf16((float)i);
    static const int64_t i4_shape[2] = {IR, IC};
    static const int64_t bad_shape[2] = {IR, 32};
    tw_tensor ts[] = {
        {"dense.weight", "BF16", 2, {3, 5}, dense, sizeof dense},
        {"fp8.weight", "F8_E4M3", 2, {FR, FC}, g_fp8, sizeof g_fp8},
        {"fp8.weight_scale_inv", "F32", 2, {2, 3}, g_fp8_scale, sizeof g_fp8_scale},
        {"fp8_noscale.weight", "F8_E4M3", 2, {2, 2}, NULL, 4},
        {"fp8_badscale.weight", "F8_E4M3", 2, {FR, FC}, NULL, FR * FC},
        {"fp8_badscale.weight_scale_inv", "F32", 2, {1, 3}, NULL, 12},
        {"i4.weight_packed", "I32", 2, {IR, IC / 8}, g_packed, sizeof g_packed},
        {"i4.weight_scale", "BF16", 2, {IR, IC / 32}, g_i4_scale, sizeof g_i4_scale},
        {"i4.weight_shape", "I64", 1, {2}, i4_shape, sizeof i4_shape},
        {"i4_badshape.weight_packed", "I32", 2, {IR, IC / 8}, NULL, sizeof g_packed},
        {"i4_badshape.weight_scale", "BF16", 2, {IR, IC / 32}, NULL, sizeof g_i4_scale},
        {"i4_badshape.weight_shape", "I64", 1, {2}, bad_shape, sizeof bad_shape},
        {"i4_badpack.weight_packed", "I32", 2, {IR, IC / 4}, NULL, 2 * sizeof g_packed},
        {"i4_badpack.weight_scale", "BF16", 2, {IR, IC / 32}, NULL, sizeof g_i4_scale},
        {"i4_badpack.weight_shape", "I64", 1, {2}, i4_shape, sizeof i4_shape},
        {"i4_f32scale.weight_packed", "I32", 2, {IR, IC / 8}, NULL, sizeof g_packed},
        {"i4_f32scale.weight_scale", "F32", 2, {IR, IC / 32}, NULL, 2 * sizeof g_i4_scale},
        {"i4_f32scale.weight_shape", "I64", 1, {2}, i4_shape, sizeof i4_shape},
        {"i4_noshape.weight_packed", "I32", 2, {IR, IC / 8}, NULL, sizeof g_packed},
        {"i4_noshape.weight_scale", "BF16", 2, {IR, IC / 32}, NULL, sizeof g_i4_scale},
        {"int.weight", "I32", 2, {2, 2}, NULL, 16},
        {"vec.weight", "BF16", 1, {6}, NULL, 12},
    };
    snprintf(g_ck_path, sizeof g_ck_path, "%s/weights.safetensors", g_dir);
    write_st(g_ck_path, ts, (int)(sizeof ts / sizeof ts[0]));
    ddt_error err = {0};
    return ddt_checkpoint_open(g_ck_path, &g_ck, &err) == DDT_OK ? 0 : -1;
}

static int teardown_weights(void **state) {
    ddt_checkpoint_close(g_ck);
    g_ck = NULL;
    return teardown_dir(state);
}

static void test_dense_view(void **state) {
    (void)state;
    ddt_qweight w;
    ddt_error err = {0};
    assert_int_equal(ddt_checkpoint_weight(g_ck, "dense", 3, 5, &w, &err), DDT_OK);
    assert_int_equal(w.format, DDT_Q_DENSE);
    assert_int_equal(w.dtype, DDT_DTYPE_BF16);
    assert_int_equal(w.rows, 3);
    assert_int_equal(w.cols, 5);
    assert_true(ddt_bf16_to_f32(((const uint16_t *)w.data)[14]) == 14.0f);
    assert_null(w.scale_inv);
    assert_null(w.scale);
    /* rows/cols <= 0: take the shape from the file. */
    assert_int_equal(ddt_checkpoint_weight(g_ck, "dense", 0, -1, &w, &err), DDT_OK);
    assert_int_equal(w.rows, 3);
    assert_int_equal(w.cols, 5);

    assert_int_equal(ddt_checkpoint_weight(g_ck, "dense", 5, 3, &w, &err), DDT_ERR_FORMAT);
    assert_msg_has(&err, "dense.weight");
    assert_msg_has(&err, g_ck_path);
    assert_msg_has(&err, "[5, 3]");
    assert_msg_has(&err, "[3, 5]");
    assert_int_equal(ddt_checkpoint_weight(g_ck, "vec", 0, 0, &w, &err), DDT_ERR_FORMAT);
    assert_msg_has(&err, "vec.weight");
    assert_msg_has(&err, "[6]");
    assert_int_equal(ddt_checkpoint_weight(g_ck, "int", 2, 2, &w, &err), DDT_ERR_FORMAT);
    assert_msg_has(&err, "int.weight");
    assert_msg_has(&err, "found I32");
}

static void test_fp8_view(void **state) {
    (void)state;
    ddt_qweight w;
    ddt_error err = {0};
    assert_int_equal(ddt_checkpoint_weight(g_ck, "fp8", FR, FC, &w, &err), DDT_OK);
    assert_int_equal(w.format, DDT_Q_FP8_BLOCK);
    assert_int_equal(w.dtype, DDT_DTYPE_F8_E4M3);
    assert_int_equal(w.block, 128);
    assert_int_equal(w.rows, FR);
    assert_int_equal(w.cols, FC);
    /* Dequantise a few elements the way a backend does: q * s[i/128][j/128]. */
    const int pts[][2] = {{0, 0}, {127, 127}, {128, 0}, {129, 299}, {5, 256}, {100, 200}};
    for (size_t k = 0; k < sizeof pts / sizeof pts[0]; k++) {
        int i = pts[k][0], j = pts[k][1];
        uint8_t q = ((const uint8_t *)w.data)[i * FC + j];
        assert_int_equal(q, g_fp8[i * FC + j]);
        float s = w.scale_inv[(i / 128) * 3 + (j / 128)];
        assert_true(s == g_fp8_scale[(i / 128) * 3 + (j / 128)]);
    }
    assert_int_equal(ddt_checkpoint_weight(g_ck, "fp8_noscale", 2, 2, &w, &err), DDT_ERR_FORMAT);
    assert_msg_has(&err, "fp8_noscale.weight_scale_inv");
    assert_msg_has(&err, "missing");
    assert_int_equal(ddt_checkpoint_weight(g_ck, "fp8_badscale", FR, FC, &w, &err), DDT_ERR_FORMAT);
    assert_msg_has(&err, "fp8_badscale.weight_scale_inv");
    assert_msg_has(&err, "[2, 3]");
    assert_msg_has(&err, "[1, 3]");
    assert_int_equal(ddt_checkpoint_weight(g_ck, "fp8", FR, FC + 1, &w, &err), DDT_ERR_FORMAT);
    assert_msg_has(&err, "fp8.weight");
}

static void test_int4_view(void **state) {
    (void)state;
    ddt_qweight w;
    ddt_error err = {0};
    assert_int_equal(ddt_checkpoint_weight(g_ck, "i4", IR, IC, &w, &err), DDT_OK);
    assert_int_equal(w.format, DDT_Q_INT4_GROUP);
    assert_int_equal(w.dtype, DDT_DTYPE_I32);
    assert_int_equal(w.rows, IR);
    assert_int_equal(w.cols, IC);
    assert_int_equal(w.group, 32);
    /* Unpack every element through the view with the documented formula and
     * compare with the values that were packed. */
    const int32_t *pk = w.data;
    for (int r = 0; r < IR; r++)
        for (int j = 0; j < IC; j++) {
            uint32_t word = (uint32_t)pk[r * (IC / 8) + j / 8];
            int q = (int)((word >> (4 * (j % 8))) & 0xFu) - 8;
            assert_int_equal(q, g_i4_q[r * IC + j]);
            float scale = ddt_bf16_to_f32(w.scale[r * (IC / w.group) + j / w.group]);
            float want = (float)g_i4_q[r * IC + j] * 0.25f * (float)(r * (IC / 32) + j / 32 + 1);
            assert_true((float)q * scale == want);
        }
    assert_int_equal(ddt_checkpoint_weight(g_ck, "i4", 0, 0, &w, &err), DDT_OK);
    assert_int_equal(w.cols, IC);

    assert_int_equal(ddt_checkpoint_weight(g_ck, "i4", IR, IC * 2, &w, &err), DDT_ERR_FORMAT);
    assert_msg_has(&err, "i4.weight_shape");
    assert_msg_has(&err, "[4, 64]");
    assert_msg_has(&err, "[4, 128]");
    assert_int_equal(ddt_checkpoint_weight(g_ck, "i4_badshape", IR, IC, &w, &err), DDT_ERR_FORMAT);
    assert_msg_has(&err, "i4_badshape.weight_shape");
    assert_int_equal(ddt_checkpoint_weight(g_ck, "i4_badpack", IR, IC, &w, &err), DDT_ERR_FORMAT);
    assert_msg_has(&err, "i4_badpack.weight_packed");
    assert_msg_has(&err, "[4, 8]");
    assert_msg_has(&err, "[4, 16]");
    assert_int_equal(ddt_checkpoint_weight(g_ck, "i4_f32scale", IR, IC, &w, &err), DDT_ERR_FORMAT);
    assert_msg_has(&err, "i4_f32scale.weight_scale");
    assert_msg_has(&err, "expected BF16");
    assert_msg_has(&err, "found F32");
    assert_int_equal(ddt_checkpoint_weight(g_ck, "i4_noshape", IR, IC, &w, &err), DDT_ERR_FORMAT);
    assert_msg_has(&err, "i4_noshape.weight_shape");
}

static void test_missing_weight(void **state) {
    (void)state;
    ddt_qweight w;
    ddt_error err = {0};
    assert_int_equal(ddt_checkpoint_weight(g_ck, "model.layers.0.mlp.up_proj", 4, 4, &w, &err),
                     DDT_ERR_FORMAT);
    assert_msg_has(&err, "model.layers.0.mlp.up_proj");
    assert_msg_has(&err, g_ck_path);
    assert_msg_has(&err, "missing");
}

static void test_plain_tensor_lookup(void **state) {
    (void)state;
    const ddt_st_tensor *t = NULL;
    ddt_error err = {0};
    const int64_t shp[2] = {3, 5}, any_rows[2] = {-1, 5}, wrong[2] = {3, 4};
    assert_int_equal(ddt_checkpoint_tensor(g_ck, "dense.weight", DDT_DTYPE_BF16, 2, shp, &t, &err), DDT_OK);
    assert_non_null(t);
    assert_int_equal(ddt_checkpoint_tensor(g_ck, "dense.weight", DDT_DTYPE_BF16, 2, any_rows, &t, &err),
                     DDT_OK);
    assert_int_equal(ddt_checkpoint_tensor(g_ck, "dense.weight", DDT_DTYPE_COUNT, -1, NULL, &t, &err),
                     DDT_OK);
    assert_int_equal(ddt_checkpoint_tensor(g_ck, "dense.weight", DDT_DTYPE_BF16, 2, wrong, &t, &err),
                     DDT_ERR_FORMAT);
    assert_null(t);
    assert_msg_has(&err, "dense.weight");
    assert_msg_has(&err, g_ck_path);
    assert_msg_has(&err, "expected BF16 [3, 4]");
    assert_msg_has(&err, "found BF16 [3, 5]");
    assert_int_equal(ddt_checkpoint_tensor(g_ck, "dense.weight", DDT_DTYPE_F32, 2, shp, &t, &err),
                     DDT_ERR_FORMAT);
    assert_msg_has(&err, "expected F32");
    assert_msg_has(&err, "found BF16");
    assert_int_equal(ddt_checkpoint_tensor(g_ck, "dense.weight", DDT_DTYPE_BF16, 1, shp, &t, &err),
                     DDT_ERR_FORMAT);
    assert_int_equal(ddt_checkpoint_tensor(g_ck, "no.such", DDT_DTYPE_BF16, 1, shp, &t, &err),
                     DDT_ERR_FORMAT);
    assert_msg_has(&err, "no.such");
    assert_msg_has(&err, g_ck_path);
}

int main(void) {
    const struct CMUnitTest shards[] = {
        cmocka_unit_test(test_sharded_index),
        cmocka_unit_test(test_duplicate_tensor_across_shards),
        cmocka_unit_test(test_index_names_missing_shard),
        cmocka_unit_test(test_index_maps_tensor_to_wrong_shard),
        cmocka_unit_test(test_bad_index),
        cmocka_unit_test(test_damaged_shard_is_named),
    };
    const struct CMUnitTest views[] = {
        cmocka_unit_test(test_dense_view),
        cmocka_unit_test(test_fp8_view),
        cmocka_unit_test(test_int4_view),
        cmocka_unit_test(test_missing_weight),
        cmocka_unit_test(test_plain_tensor_lookup),
    };
    int fails = cmocka_run_group_tests_name("shards", shards, setup_dir, teardown_dir);
    fails += cmocka_run_group_tests_name("weight views", views, setup_weights, teardown_weights);
    return fails;
}
