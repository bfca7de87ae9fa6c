/*
 * test_target_errors.c — loading a damaged model folder fails with a message
 * naming the culprit.  Each case copies the fp32 fixture's config.json into a
 * temporary folder and writes a rebuilt model.safetensors with one tensor
 * dropped, reshaped (same byte count) or retyped, or the file cut short.
 * The same machinery checks tie_word_embeddings (lm_head absent, embedding used).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "io/safetensors.h"
#include "model/target.h"
#include "test_files.h"

static char g_src[1024];

typedef struct damage {
    const char *drop;        /* tensor to leave out, or NULL */
    const char *reshape;     /* tensor whose shape becomes new_shape, or NULL */
    int64_t new_shape[2];
    int32_t new_ndim;
    const char *retype;      /* tensor whose dtype becomes new_dtype, or NULL */
    const char *new_dtype;
    size_t truncate_by;      /* bytes cut from the end of the file */
    const char *cfg_from;    /* config.json edit: replace this text ... */
    const char *cfg_to;      /* ... with this one */
} damage;

/* Rebuild the fixture's safetensors with `d` applied into folder `dir`. */
static void make_damaged(const char *dir, const damage *d) {
    char path[1200];
    size_t len;
    snprintf(path, sizeof path, "%s/model.safetensors", g_src);
    uint8_t *src = read_all(path, &len);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)src[i] << (8 * i);
    json_error_t jerr;
    json_t *hdr = json_loadb((const char *)src + 8, (size_t)hlen, 0, &jerr);
    assert_non_null(hdr);
    const uint8_t *data = src + 8 + hlen;
    json_t *out = json_object();
    uint8_t *body = malloc(len);
    size_t off = 0;
    const char *name;
    json_t *info;
    json_object_foreach(hdr, name, info) {
        if (!strcmp(name, "__metadata__")) {
            json_object_set(out, name, info);
            continue;
        }
        if (d->drop && !strcmp(name, d->drop)) continue;
        json_t *offs = json_object_get(info, "data_offsets");
        size_t b = (size_t)json_integer_value(json_array_get(offs, 0));
        size_t e = (size_t)json_integer_value(json_array_get(offs, 1));
        memcpy(body + off, data + b, e - b);
        json_t *ni = json_deep_copy(info);
        json_object_set_new(ni, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + e - b)));
        if (d->reshape && !strcmp(name, d->reshape)) {
            json_t *shape = json_array();
            for (int32_t k = 0; k < d->new_ndim; k++) json_array_append_new(shape, json_integer(d->new_shape[k]));
            json_object_set_new(ni, "shape", shape);
        }
        if (d->retype && !strcmp(name, d->retype)) json_object_set_new(ni, "dtype", json_string(d->new_dtype));
        json_object_set_new(out, name, ni);
        off += e - b;
    }
    char *dumped = json_dumps(out, JSON_COMPACT);
    /* pad the header with spaces to a multiple of 8, as safetensors writers do, so
     * that tensor data stays aligned */
    size_t hl = (strlen(dumped) + 7) / 8 * 8;
    char *htext = malloc(hl + 1);
    memset(htext, ' ', hl);
    memcpy(htext, dumped, strlen(dumped));
    htext[hl] = '\0';
    free(dumped);
    size_t total = 8 + hl + off - (d->truncate_by < off ? d->truncate_by : off);
    uint8_t *file = malloc(8 + hl + off);
    for (int i = 0; i < 8; i++) file[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(file + 8, htext, hl);
    memcpy(file + 8 + hl, body, off);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_all(path, file, total);
    /* the config, unchanged */
    size_t clen;
    char cpath[1200];
    snprintf(cpath, sizeof cpath, "%s/config.json", g_src);
    uint8_t *cfg = read_all(cpath, &clen);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (d->cfg_from) {
        char *text = malloc(clen + 1);
        memcpy(text, cfg, clen);
        text[clen] = '\0';
        char *at = strstr(text, d->cfg_from);
        if (!at) fail_msg("config.json has no '%s'", d->cfg_from);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        fwrite(text, 1, (size_t)(at - text), f);
        fputs(d->cfg_to, f);
        fputs(at + strlen(d->cfg_from), f);
        fclose(f);
        free(text);
    } else {
        write_all(path, cfg, clen);
    }
    free(cfg);
    free(file);
    free(htext);
    free(body);
    json_decref(out);
    json_decref(hdr);
    free(src);
}

/* Load the damaged folder; expect failure with every string of `needles` in the message. */
static void expect_failure(const damage *d, const char *needle1, const char *needle2) {
    char dir[] = "/tmp/ddt_target_err_XXXXXX";
    assert_non_null(mkdtemp(dir));
    make_damaged(dir, d);
    ddt_target_options o = {.max_ctx = 8, .max_tokens = 4, .n_threads = 1};
    ddt_target *t = NULL;
    ddt_error err = {0};
    ddt_status st = ddt_target_load(dir, &o, &t, &err);
    remove_checkpoint_dir(dir);
    if (st == DDT_OK) {
        ddt_target_free(t);
        fail_msg("damaged checkpoint loaded without error");
    }
    assert_null(t);
    printf("  error: %s\n", err.msg);
    if (needle1 && !strstr(err.msg, needle1)) fail_msg("message does not name '%s': %s", needle1, err.msg);
    if (needle2 && !strstr(err.msg, needle2)) fail_msg("message does not name '%s': %s", needle2, err.msg);
}

static void test_intact_copy_loads(void **state) {
    (void)state;
    /* the rebuild itself is faithful: an undamaged copy loads */
    char dir[] = "/tmp/ddt_target_ok_XXXXXX";
    assert_non_null(mkdtemp(dir));
    damage d = {0};
    make_damaged(dir, &d);
    ddt_target_options o = {.max_ctx = 8, .max_tokens = 4, .n_threads = 1};
    ddt_target *t = NULL;
    ddt_error err = {0};
    ddt_status st = ddt_target_load(dir, &o, &t, &err);
    remove_checkpoint_dir(dir);
    if (st != DDT_OK) fail_msg("intact copy failed to load: %s", err.msg);
    ddt_target_free(t);
}

static void test_missing_tensors(void **state) {
    (void)state;
    damage a = {.drop = "model.layers.1.self_attn.kv_b_proj.weight"};
    expect_failure(&a, "model.layers.1.self_attn.kv_b_proj", NULL);
    damage b = {.drop = "lm_head.weight"};
    expect_failure(&b, "lm_head", NULL);
    /* the last routed expert of the last layer (the count comes from the fixture's config) */
    char cpath[1200], expert[128];
    snprintf(cpath, sizeof cpath, "%s/config.json", g_src);
    json_error_t jerr;
    json_t *cfg = json_load_file(cpath, 0, &jerr);
    assert_non_null(cfg);
    int64_t ne = json_integer_value(json_object_get(cfg, "n_routed_experts"));
    int64_t nl = json_integer_value(json_object_get(cfg, "num_hidden_layers"));
    json_decref(cfg);
    assert_true(ne > 0 && nl > 1);
    snprintf(expert, sizeof expert, "model.layers.%lld.mlp.experts.%lld.up_proj", (long long)nl - 1, (long long)ne - 1);
    char expert_w[160];
    snprintf(expert_w, sizeof expert_w, "%s.weight", expert);
    damage c = {.drop = expert_w};
    expect_failure(&c, expert, NULL);
    damage e = {.drop = "model.layers.0.self_attn.kv_a_layernorm.weight"};
    expect_failure(&e, "model.layers.0.self_attn.kv_a_layernorm.weight", NULL);
    damage f = {.drop = "model.layers.1.mlp.gate.e_score_correction_bias"};
    expect_failure(&f, "e_score_correction_bias", NULL);
}

static void test_wrong_shapes_and_types(void **state) {
    (void)state;
    /* kv_a_proj_with_mqa is [kv_lora_rank + rope = 40][hidden = 64] */
    damage a = {.reshape = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", .new_shape = {64, 40}, .new_ndim = 2};
    expect_failure(&a, "model.layers.0.self_attn.kv_a_proj_with_mqa", "40");
    damage b = {.reshape = "model.layers.2.post_attention_layernorm.weight", .new_shape = {32, 2}, .new_ndim = 2};
    expect_failure(&b, "model.layers.2.post_attention_layernorm.weight", NULL);
    damage c = {.reshape = "model.embed_tokens.weight", .new_shape = {64, 300}, .new_ndim = 2};
    expect_failure(&c, "model.embed_tokens", NULL);
    damage d = {.retype = "model.layers.1.self_attn.o_proj.weight", .new_dtype = "I32"};
    expect_failure(&d, "model.layers.1.self_attn.o_proj", "I32");
    damage e = {.retype = "model.norm.weight", .new_dtype = "I32"};
    expect_failure(&e, "model.norm.weight", NULL);
}

static void test_unsupported_routing(void **state) {
    (void)state;
    /* HF would silently route with noaux_tc; the engine refuses instead */
    damage a = {.cfg_from = "\"topk_method\": \"noaux_tc\"", .cfg_to = "\"topk_method\": \"greedy\""};
    expect_failure(&a, "topk_method", "greedy");
}

static void test_truncated_and_missing(void **state) {
    (void)state;
    damage a = {.truncate_by = 1000};
    expect_failure(&a, "model.safetensors", NULL);
    ddt_target_options o = {.max_ctx = 8, .max_tokens = 4, .n_threads = 1};
    ddt_target *t = NULL;
    ddt_error err = {0};
    assert_int_not_equal(ddt_target_load("/nonexistent/ddt_model_dir", &o, &t, &err), DDT_OK);
    assert_null(t);
    assert_non_null(strstr(err.msg, "/nonexistent/ddt_model_dir"));
}

/* tie_word_embeddings: lm_head.weight absent, logits = final hidden state x embed^T. */
static void test_tied_embeddings(void **state) {
    (void)state;
    char dir[] = "/tmp/ddt_target_tied_XXXXXX";
    assert_non_null(mkdtemp(dir));
    damage d = {.drop = "lm_head.weight", .cfg_from = "\"tie_word_embeddings\": false",
                .cfg_to = "\"tie_word_embeddings\": true"};
    make_damaged(dir, &d);
    int32_t last_layer = -1;
    {
        char cpath[1200];
        snprintf(cpath, sizeof cpath, "%s/config.json", dir);
        json_error_t jerr;
        json_t *cfg = json_load_file(cpath, 0, &jerr);
        assert_non_null(cfg);
        last_layer = (int32_t)json_integer_value(json_object_get(cfg, "num_hidden_layers")) - 1;
        json_decref(cfg);
    }
    ddt_target_options o = {.max_ctx = 8, .max_tokens = 4, .n_threads = 2, .capture_layers = &last_layer,
                            .n_capture = 1};
    ddt_target *t = NULL;
    ddt_error err = {0};
    if (ddt_target_load(dir, &o, &t, &err) != DDT_OK) fail_msg("tied model: %s", err.msg);
    const int32_t V = ddt_target_vocab(t), H = ddt_target_config(t)->hidden_size;
    float *lg = malloc(sizeof(float) * 4 * (size_t)V);
    int32_t ids[4] = {7, 8, 9, 10};
    assert_int_equal(ddt_target_prefill(t, ids, 4, lg, true, &err), DDT_OK);
    int32_t nt = 0;
    const float *hs = ddt_target_hidden(t, 0, &nt); /* the final-normed state */
    assert_int_equal(nt, 4);
    ddt_checkpoint *ck = NULL;
    assert_int_equal(ddt_checkpoint_open(dir, &ck, &err), DDT_OK);
    const ddt_st_tensor *emb = ddt_checkpoint_find(ck, "model.embed_tokens.weight");
    assert_non_null(emb);
    assert_int_equal(emb->dtype, DDT_DTYPE_F32);
    const float *E = emb->data;
    double num = 0, den = 0;
    for (int32_t i = 0; i < 4; i++)
        for (int32_t v = 0; v < V; v++) {
            double s = 0;
            for (int32_t k = 0; k < H; k++) s += (double)hs[i * H + k] * E[(size_t)v * H + k];
            num += (lg[(size_t)i * V + v] - s) * (lg[(size_t)i * V + v] - s);
            den += s * s;
        }
    assert_true(sqrt(num) <= 1e-5 * sqrt(den));
    ddt_checkpoint_close(ck);
    free(lg);
    ddt_target_free(t);
    remove_checkpoint_dir(dir);
}

int main(void) {
    snprintf(g_src, sizeof g_src, "%s/tests/fixtures/target/fp32", DDT_SOURCE_DIR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_intact_copy_loads),
        cmocka_unit_test(test_missing_tensors),
        cmocka_unit_test(test_wrong_shapes_and_types),
        cmocka_unit_test(test_truncated_and_missing),
        cmocka_unit_test(test_tied_embeddings),
        cmocka_unit_test(test_unsupported_routing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
