/*
 * test_drafter_config.c — the DFlash drafter's config.json reader
 * (io/drafter_config.h): transformers 5 and Kimi layouts, dflash_config
 * precedence, the legacy YaRN flag, refused variants, malformed JSON, and
 * loading a folder or a file.  The RoPE the configs give is tested with the
 * model (tests/model/test_drafter.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "io/drafter_config.h"

static void test_config_parse(void **state) {
    (void)state;
    ddt_drafter_config c;
    ddt_error err = {0};
    /* transformers 5 layout: rope_parameters, ids at the top level, explicit attention_factor */
    const char *v5 = "{\"architectures\":[\"DFlashDraftModel\"],\"hidden_size\":64,\"num_hidden_layers\":1,"
                     "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":8,\"intermediate_size\":16,"
                     "\"rms_norm_eps\":1e-5,\"block_size\":16,\"mask_token_id\":5,\"target_layer_ids\":[1,2,3],"
                     "\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":50000,\"factor\":64,"
                     "\"original_max_position_embeddings\":4096,\"attention_factor\":1.25}}";
    assert_int_equal(ddt_drafter_config_parse(v5, strlen(v5), "v5.json", &c, &err), DDT_OK);
    assert_int_equal(c.block_size, 16);
    assert_int_equal(c.n_target_layers, 3);
    assert_int_equal(c.target_layer_ids[2], 3);
    assert_int_equal(c.num_target_layers, -1);
    assert_true(c.has_yarn && c.rope_theta == 50000.0f && c.yarn_factor == 64.0f);
    assert_true(c.yarn_attention_factor == 1.25f);
    /* Kimi style: rope_scaling, ids and mask in dflash_config */
    const char *kimi = "{\"architectures\":[\"DFlashDraftModel\"],\"hidden_size\":64,\"num_hidden_layers\":1,"
                       "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":8,\"intermediate_size\":16,"
                       "\"rms_norm_eps\":1e-5,\"block_size\":8,\"rope_theta\":50000,"
                       "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":64,\"original_max_position_embeddings\":4096,"
                       "\"beta_fast\":1,\"beta_slow\":1,\"mscale\":1,\"mscale_all_dim\":1},"
                       "\"dflash_config\":{\"mask_token_id\":7,\"target_layer_ids\":[1],\"block_size\":16%s}}";
    char buf[2048];
    snprintf(buf, sizeof buf, kimi, "");
    assert_int_equal(ddt_drafter_config_parse(buf, strlen(buf), "k.json", &c, &err), DDT_OK);
    assert_int_equal(c.block_size, 16); /* dflash_config wins */
    assert_int_equal(c.mask_token_id, 7);
    assert_false(c.legacy_yarn_attention_factor);
    snprintf(buf, sizeof buf, kimi, ",\"legacy_yarn_attention_factor\":true");
    assert_int_equal(ddt_drafter_config_parse(buf, strlen(buf), "k.json", &c, &err), DDT_OK);
    assert_true(c.legacy_yarn_attention_factor);
    snprintf(buf, sizeof buf, kimi, ",\"legacy_yarn_attention_factor\":1");
    assert_int_equal(ddt_drafter_config_parse(buf, strlen(buf), "k.json", &c, &err), DDT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "legacy_yarn_attention_factor"));
    snprintf(buf, sizeof buf, kimi, ",\"output_multiplier\":2");
    assert_int_equal(ddt_drafter_config_parse(buf, strlen(buf), "k.json", &c, &err), DDT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "dflash_config.output_multiplier"));
    assert_int_equal(ddt_drafter_config_parse("[1]", 3, "x.json", &c, &err), DDT_ERR_FORMAT);
    assert_int_equal(ddt_drafter_config_parse("{", 1, "x.json", &c, &err), DDT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "x.json"));
}

/* A folder or its config.json gives the same config; a missing file names itself. */
static void test_config_load(void **state) {
    (void)state;
    char dir[1024], file[1100];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/drafter/yarn_legacy", DDT_SOURCE_DIR);
    snprintf(file, sizeof file, "%s/config.json", dir);
    ddt_drafter_config a, b;
    ddt_error err = {0};
    assert_int_equal(ddt_drafter_config_load(dir, &a, &err), DDT_OK);
    assert_int_equal(ddt_drafter_config_load(file, &b, &err), DDT_OK);
    assert_memory_equal(&a, &b, sizeof a);
    assert_true(a.legacy_yarn_attention_factor && a.has_yarn);
    assert_int_equal(ddt_drafter_config_load("/nonexistent/ddt_drafter", &a, &err), DDT_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/ddt_drafter/config.json"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_parse),
        cmocka_unit_test(test_config_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
