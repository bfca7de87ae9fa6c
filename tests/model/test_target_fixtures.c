/*
 * test_target_fixtures.c — the CPU target against transformers on every fixture
 * variant in tests/fixtures/target/<variant>/ (made by make_target_fixtures.py):
 * prompt logits (normalised error ||a-b||/||b|| within 1e-4 for every storage
 * format, since the reference is fp32 compute on the decoded weights), greedy
 * continuation token for token (stopping, with a message, at the first step
 * whose reference top-2 margin is below 1e-4), and the hidden states of every
 * layer (HF output_hidden_states[1..L]).  A missing variant folder fails.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "model/target.h"

#define GREEDY_MARGIN_MIN 1e-4

static double norm_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num) / (sqrt(den) + 1e-30);
}

/* rows x cols JSON array of arrays -> floats; fails the test on a shape mismatch. */
static float *json_matrix(const json_t *m, size_t rows, size_t cols, const char *what) {
    if (!json_is_array(m) || json_array_size(m) != rows) fail_msg("%s: expected %zu rows", what, rows);
    float *out = malloc(sizeof(float) * rows * cols);
    for (size_t r = 0; r < rows; r++) {
        const json_t *row = json_array_get(m, r);
        if (!json_is_array(row) || json_array_size(row) != cols) fail_msg("%s: row %zu: expected %zu values", what, r, cols);
        for (size_t c = 0; c < cols; c++) out[r * cols + c] = (float)json_number_value(json_array_get(row, c));
    }
    return out;
}

static int32_t argmax_row(const float *v, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

static void run_variant(const char *variant) {
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/target/%s", DDT_SOURCE_DIR, variant);
    snprintf(path, sizeof path, "%s/reference.json", dir);
    json_error_t jerr;
    json_t *ref = json_load_file(path, 0, &jerr);
    if (!ref) fail_msg("%s: cannot read reference: %s (line %d)", path, jerr.text, jerr.line);
    const char *compute = json_string_value(json_object_get(json_object_get(ref, "model"), "compute_dtype"));
    if (!compute || strcmp(compute, "float32") != 0) fail_msg("%s: reference compute_dtype is not float32", variant);
    /* The reference is transformers in fp32 on the decoded stored values, so every storage
     * format, quantised or not, must agree to fp32 rounding: 1e-4 for all (the brief allows
     * 1e-2 for bf16/fp8/int4; the tighter bound catches more). */
    double tol = 1e-4;
    json_t *prompts = json_object_get(ref, "prompts");
    assert_true(json_is_array(prompts) && json_array_size(prompts) > 0);

    int32_t max_prompt = 1, max_gen = 0;
    for (size_t p = 0; p < json_array_size(prompts); p++) {
        json_t *pr = json_array_get(prompts, p);
        int32_t np = (int32_t)json_array_size(json_object_get(pr, "ids"));
        int32_t ng = (int32_t)json_array_size(json_object_get(pr, "greedy_tokens"));
        if (np > max_prompt) max_prompt = np;
        if (ng > max_gen) max_gen = ng;
    }
    /* capture every layer */
    json_t *hsj = json_object_get(ref, "hidden_states");
    json_t *layers_j = json_object_get(hsj, "layers");
    int32_t n_layers = (int32_t)json_array_size(layers_j);
    assert_true(n_layers > 0 && n_layers <= DDT_TARGET_MAX_CAPTURE);
    int32_t cap[DDT_TARGET_MAX_CAPTURE];
    for (int32_t l = 0; l < n_layers; l++) cap[l] = l;
    ddt_target_options opts = {.max_ctx = max_prompt + max_gen + 1, .max_tokens = max_prompt, .n_threads = 2,
                               .capture_layers = cap, .n_capture = n_layers};
    ddt_target *t = NULL;
    ddt_error err = {0};
    ddt_status st = ddt_target_load(dir, &opts, &t, &err);
    if (st != DDT_OK) fail_msg("%s: load failed: %s", variant, err.msg);
    const int32_t V = ddt_target_vocab(t), H = ddt_target_config(t)->hidden_size;
    assert_int_equal(ddt_target_config(t)->num_hidden_layers, n_layers);
    float *logits = malloc(sizeof(float) * (size_t)max_prompt * V);

    for (size_t p = 0; p < json_array_size(prompts); p++) {
        json_t *pr = json_array_get(prompts, p);
        json_t *ids_j = json_object_get(pr, "ids");
        int32_t n = (int32_t)json_array_size(ids_j);
        int32_t ids[4096];
        assert_true(n <= 4096);
        for (int32_t i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(ids_j, i));
        assert_int_equal(ddt_target_rollback(t, 0, &err), DDT_OK);
        if (ddt_target_prefill(t, ids, n, logits, true, &err) != DDT_OK) fail_msg("%s: prefill: %s", variant, err.msg);
        char what[128];
        snprintf(what, sizeof what, "%s prompt %zu logits", variant, p);
        float *want = json_matrix(json_object_get(pr, "logits"), n, V, what);
        double e = norm_err(logits, want, (size_t)n * V);
        printf("  %-10s prompt %zu (%2d tokens): logits normalised error %.3g (bound %g)\n", variant, p, n, e, tol);
        if (!(e <= tol)) fail_msg("%s: prompt %zu: logits normalised error %g > %g", variant, p, e, tol);
        free(want);

        if (p == (size_t)json_integer_value(json_object_get(hsj, "prompt_index"))) {
            for (int32_t l = 0; l < n_layers; l++) {
                int32_t nt = 0;
                const float *hs = ddt_target_hidden(t, l, &nt);
                assert_non_null(hs);
                assert_int_equal(nt, n);
                snprintf(what, sizeof what, "%s hidden layer %d", variant, l);
                float *hw = json_matrix(json_array_get(layers_j, l), n, H, what);
                double he = norm_err(hs, hw, (size_t)n * H);
                if (!(he <= tol)) fail_msg("%s: hidden_states[%d]: normalised error %g > %g", variant, l + 1, he, tol);
                free(hw);
            }
        }

        /* greedy continuation, one AR step (prefill of 1) at a time */
        json_t *gt = json_object_get(pr, "greedy_tokens"), *gm = json_object_get(pr, "greedy_top2_margins");
        int32_t steps = (int32_t)json_array_size(gt);
        assert_int_equal((int32_t)json_array_size(gm), steps);
        const float *last = logits + (size_t)(n - 1) * V;
        float *step = malloc(sizeof(float) * V);
        int32_t checked = 0;
        for (int32_t s = 0; s < steps; s++) {
            if (json_number_value(json_array_get(gm, s)) < GREEDY_MARGIN_MIN) {
                printf("  %-10s prompt %zu: stopped comparing at step %d: reference top-2 margin %.3g < %g\n",
                       variant, p, s, json_number_value(json_array_get(gm, s)), GREEDY_MARGIN_MIN);
                break;
            }
            int32_t tok = argmax_row(last, V);
            int32_t want_tok = (int32_t)json_integer_value(json_array_get(gt, s));
            if (tok != want_tok) fail_msg("%s: prompt %zu: greedy step %d: token %d, transformers %d", variant, p, s, tok, want_tok);
            checked++;
            if (s + 1 < steps) {
                if (ddt_target_prefill(t, &tok, 1, step, false, &err) != DDT_OK)
                    fail_msg("%s: decode step %d: %s", variant, s, err.msg);
                last = step;
            }
        }
        printf("  %-10s prompt %zu: %d/%d greedy tokens match\n", variant, p, checked, steps);
        free(step);
    }
    free(logits);
    ddt_target_free(t);
    json_decref(ref);
}

#define VARIANT_TEST(name)                                                                                   \
    static void test_variant_##name(void **state) {                                                          \
        (void)state;                                                                                         \
        run_variant(#name);                                                                                  \
    }
VARIANT_TEST(fp32)
VARIANT_TEST(bf16)
VARIANT_TEST(fp8)
VARIANT_TEST(int4)
VARIANT_TEST(ngroup)
VARIANT_TEST(qlora_null)
VARIANT_TEST(yarn)
VARIANT_TEST(dense3)
VARIANT_TEST(sharded)
VARIANT_TEST(kimi)

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_variant_fp32),
        cmocka_unit_test(test_variant_bf16),  cmocka_unit_test(test_variant_fp8),
        cmocka_unit_test(test_variant_int4),  cmocka_unit_test(test_variant_ngroup),
        cmocka_unit_test(test_variant_qlora_null), cmocka_unit_test(test_variant_yarn),
        cmocka_unit_test(test_variant_dense3), cmocka_unit_test(test_variant_sharded),
        cmocka_unit_test(test_variant_kimi),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
