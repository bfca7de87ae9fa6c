/*
 * test_no_alloc.c — "nothing allocates inside a decoding round", checked: this
 * test is linked with --wrap for malloc, calloc, realloc and free, counts every
 * call, and requires that generating 40 tokens makes exactly as many
 * allocations as generating 1 (the prompt pass), in every mode and at T > 0,
 * and with what the server turns on: the prefix cache, log-probabilities, the
 * auto budget's fallback to ar steps (a cost table that makes the draft dear),
 * and a JSON constraint (the token mask at every chosen position).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/engine.h"

static long g_allocs;
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n) {
    g_allocs++;
    return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t m) {
    g_allocs++;
    return __real_calloc(n, m);
}
void *__wrap_realloc(void *p, size_t n) {
    g_allocs++;
    return __real_realloc(p, n);
}

static int32_t g_stop = -1; /* a stop id for the generations, -1: none */

static long allocs_for(ddt_engine *e, int32_t max_new) {
    int32_t prompt[5] = {5, 6, 7, 100, 3}, out[64], n;
    ddt_error err;
    long before = g_allocs;
    if (ddt_engine_generate(e, prompt, 5, max_new, &g_stop, g_stop >= 0, out, &n, NULL, NULL, NULL, &err))
        fail_msg("generate: %s", err.msg);
    assert_int_equal(n, max_new);
    return g_allocs - before;
}

static void check_mode_with(ddt_mode mode, int32_t budget, bool autob, float temperature, bool serving,
                            const ddt_cost_model *cost, bool json) {
    char model[1024], draft[1024];
    snprintf(model, sizeof model, "%s/tests/fixtures/target/fp32", DDT_SOURCE_DIR);
    snprintf(draft, sizeof draft, "%s/tests/fixtures/drafter/fp32", DDT_SOURCE_DIR);
    ddt_engine_options o = {0};
    o.mode = mode;
    o.draft_dir = draft;
    o.budget = budget;
    o.budget_auto = autob;
    o.sampling = (ddt_sampling){temperature, temperature > 0 ? 20 : 0, temperature > 0 ? 0.9f : 1.0f, 3};
    o.n_threads = 2;
    o.prefix_cache = serving;
    o.cost = cost;
    ddt_engine *e;
    ddt_error err;
    if (ddt_engine_create(model, &o, &e, &err)) fail_msg("create: %s", err.msg);
    static ddt_token_logprobs lp[64];
    if (serving && ddt_engine_set_logprobs(e, lp, 64, 5, &err)) fail_msg("logprobs: %s", err.msg);
    /* JSON mode over a vocabulary whose ids below 128 are the ASCII bytes but '}': the object never
     * completes, so every generation runs its max_new tokens (the random fixture could close one) */
    ddt_json_vocab *jv = NULL;
    g_stop = -1;
    if (json) {
        static uint8_t ascii[128];
        const int32_t vocab = ddt_engine_vocab(e);
        const uint8_t **bytes = calloc((size_t)vocab, sizeof *bytes);
        size_t *len = calloc((size_t)vocab, sizeof *len);
        for (int32_t i = 0; i < 128 && i < vocab; i++) {
            ascii[i] = (uint8_t)i;
            bytes[i] = ascii + i;
            len[i] = i != '}';
        }
        if (ddt_json_vocab_create_bytes(bytes, len, vocab, &jv, &err)) fail_msg("vocab: %s", err.msg);
        free(bytes);
        free(len);
        ddt_json_constraint c = {jv, true, NULL};
        if (ddt_engine_set_constraint(e, &c, &err)) fail_msg("constraint: %s", err.msg);
        g_stop = vocab - 1;
    }
    long one = allocs_for(e, 1), many = allocs_for(e, 40);
    printf("  %s budget %d%s T=%g%s%s%s: %ld allocations for 1 token, %ld for 40\n", ddt_mode_name(mode), budget,
           autob ? " auto" : "", (double)temperature, serving ? " (prefix cache, logprobs)" : "",
           cost ? " (dear draft)" : "", json ? " (JSON)" : "", one, many);
    assert_int_equal(many, one);
    ddt_engine_free(e);
    ddt_json_vocab_free(jv);
    g_stop = -1;
}

static void check_mode(ddt_mode mode, int32_t budget, bool autob, float temperature) {
    check_mode_with(mode, budget, autob, temperature, false, NULL, false);
}

static void test_rounds_do_not_allocate(void **state) {
    (void)state;
    check_mode(DDT_MODE_AR, 0, false, 0.0f);
    check_mode(DDT_MODE_CHAIN, 0, false, 0.0f);
    check_mode(DDT_MODE_TREE, 32, false, 0.0f);
    check_mode(DDT_MODE_TREE, 32, true, 0.0f);
    check_mode(DDT_MODE_TREE, 16, false, 1.0f);
    check_mode_with(DDT_MODE_TREE, 16, false, 0.0f, true, NULL, false);
    check_mode_with(DDT_MODE_AR, 0, false, 1.0f, true, NULL, false);
    check_mode_with(DDT_MODE_AR, 0, false, 0.0f, false, NULL, true);
    check_mode_with(DDT_MODE_TREE, 16, false, 1.0f, true, NULL, true);
    static const float nodes[2] = {0.0f, 8.0f}, verify[2] = {1e-3f, 2e-3f};
    static const ddt_cost_model dear = {0.1f, 2, nodes, 1, NULL, verify, 0.0f};
    check_mode_with(DDT_MODE_TREE, 8, true, 0.0f, true, &dear, false);
}

/* The counter is live: the engine's setup does allocate. */
static void test_counter_counts(void **state) {
    (void)state;
    long before = g_allocs;
    void *(*volatile alloc)(size_t) = malloc; /* through a pointer: the compiler may not elide it */
    void *p = alloc(16);
    free(p);
    assert_int_equal(g_allocs, before + 1);
    /* and the engine's setup, outside any round, is seen allocating */
    char model[1024];
    snprintf(model, sizeof model, "%s/tests/fixtures/target/fp32", DDT_SOURCE_DIR);
    ddt_engine_options o = {0};
    o.mode = DDT_MODE_AR;
    o.sampling = (ddt_sampling){0.0f, 0, 1.0f, 0};
    o.n_threads = 1;
    ddt_engine *e;
    ddt_error err;
    before = g_allocs;
    if (ddt_engine_create(model, &o, &e, &err)) fail_msg("create: %s", err.msg);
    assert_true(g_allocs > before);
    ddt_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counter_counts),
        cmocka_unit_test(test_rounds_do_not_allocate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
