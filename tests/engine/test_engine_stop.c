/*
 * test_engine_stop.c — the engine says why a generation ended
 * (ddt_gen_stats.stop_reason), in ar and in tree mode with the DFlash fixture
 * drafter: max tokens (also max_new = 0), a stop token (also when it is the
 * last token max_new allows: the stop token wins), a full context, and an emit
 * callback that returned false (unless the same round emitted a stop token).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "engine/engine.h"

#define N_GEN 12

static char g_target[1024], g_draft[1024];
static const int32_t k_prompt[] = {100, 3, 250, 17, 42, 9, 1, 77, 5, 12};

static ddt_engine *make(ddt_mode mode, int32_t max_ctx) {
    snprintf(g_target, sizeof g_target, "%s/tests/fixtures/target/fp32", DDT_SOURCE_DIR);
    snprintf(g_draft, sizeof g_draft, "%s/tests/fixtures/drafter/fp32", DDT_SOURCE_DIR);
    ddt_engine_options o;
    memset(&o, 0, sizeof o);
    o.mode = mode;
    o.budget = mode == DDT_MODE_TREE ? 8 : 0;
    o.draft_dir = mode == DDT_MODE_AR ? NULL : g_draft;
    o.sampling.top_p = 1.0f;
    o.n_threads = 2;
    o.max_ctx = max_ctx;
    ddt_engine *e;
    ddt_error err = {0};
    if (ddt_engine_create(g_target, &o, &e, &err) != DDT_OK) fail_msg("create: %s", err.msg);
    return e;
}

typedef struct cb {
    int calls, stop_after; /* return false on call stop_after (1-based) */
} cb;

static bool on_emit(void *ctx, const int32_t *ids, int32_t n) {
    (void)ids;
    (void)n;
    cb *c = ctx;
    return ++c->calls != c->stop_after;
}

static ddt_stop_reason gen(ddt_engine *e, int32_t n_prompt, int32_t max_new, const int32_t *stop, int32_t n_stop,
                           int32_t *out, int32_t *n, cb *c) {
    ddt_gen_stats st;
    memset(&st, 0xff, sizeof st);
    ddt_error err = {0};
    if (ddt_engine_generate(e, k_prompt, n_prompt, max_new, stop, n_stop, out, n, c ? on_emit : NULL, c, &st, &err))
        fail_msg("generate: %s", err.msg);
    assert_int_equal(st.tokens, *n);
    return st.stop_reason;
}

static void check_mode(ddt_mode mode) {
    ddt_engine *e = make(mode, 0);
    int32_t ref[N_GEN], out[N_GEN], n;
    /* max tokens */
    assert_int_equal(gen(e, 8, N_GEN, NULL, 0, ref, &n, NULL), DDT_STOP_MAX_TOKENS);
    assert_int_equal(n, N_GEN);
    assert_int_equal(gen(e, 8, 0, NULL, 0, out, &n, NULL), DDT_STOP_MAX_TOKENS);
    assert_int_equal(n, 0);
    /* a stop token: emitted, then the end */
    int32_t first = 0;
    while (ref[first] != ref[5]) first++;
    assert_int_equal(gen(e, 8, N_GEN, &ref[5], 1, out, &n, NULL), DDT_STOP_TOKEN);
    assert_int_equal(n, first + 1);
    assert_memory_equal(out, ref, (size_t)n * sizeof(int32_t));
    /* the stop token as the last token max_new allows: the stop token is the reason */
    assert_int_equal(gen(e, 8, first + 1, &ref[5], 1, out, &n, NULL), DDT_STOP_TOKEN);
    assert_int_equal(n, first + 1);
    /* a stop list whose ids never come: max tokens */
    const int32_t never[2] = {-1, -2};
    assert_int_equal(gen(e, 8, N_GEN, never, 2, out, &n, NULL), DDT_STOP_MAX_TOKENS);
    assert_int_equal(n, N_GEN);
    /* the callback stops it after its first round (the first token alone) */
    cb c = {0, 1};
    assert_int_equal(gen(e, 8, N_GEN, NULL, 0, out, &n, &c), DDT_STOP_CANCELLED);
    assert_int_equal(n, 1);
    /* ... but a stop token in the round the callback refused is the reason */
    c = (cb){0, 1};
    assert_int_equal(gen(e, 8, N_GEN, &ref[0], 1, out, &n, &c), DDT_STOP_TOKEN);
    assert_int_equal(n, 1);
    /* a callback that goes on changes nothing */
    c = (cb){0, 0};
    assert_int_equal(gen(e, 8, N_GEN, NULL, 0, out, &n, &c), DDT_STOP_MAX_TOKENS);
    assert_int_equal(n, N_GEN);
    assert_memory_equal(out, ref, sizeof ref);
    ddt_engine_free(e);
    /* a full context: 10 prompt tokens in 16, 6 committed + the last sampled token */
    e = make(mode, 16);
    assert_int_equal(gen(e, 10, N_GEN, NULL, 0, out, &n, NULL), DDT_STOP_CONTEXT);
    assert_int_equal(n, 7);
    /* max_new reached exactly as the context fills: max tokens */
    assert_int_equal(gen(e, 10, 7, NULL, 0, out, &n, NULL), DDT_STOP_MAX_TOKENS);
    assert_int_equal(n, 7);
    ddt_engine_free(e);
}

static void test_stop_reason_ar(void **state) {
    (void)state;
    check_mode(DDT_MODE_AR);
}

static void test_stop_reason_tree(void **state) {
    (void)state;
    check_mode(DDT_MODE_TREE);
}

static void test_stop_reason_names(void **state) {
    (void)state;
    assert_string_equal(ddt_stop_reason_name(DDT_STOP_MAX_TOKENS), "max tokens");
    assert_string_equal(ddt_stop_reason_name(DDT_STOP_TOKEN), "stop token");
    assert_string_equal(ddt_stop_reason_name(DDT_STOP_CONTEXT), "context full");
    assert_string_equal(ddt_stop_reason_name(DDT_STOP_CANCELLED), "cancelled");
    assert_string_equal(ddt_stop_reason_name(DDT_STOP_NONE), "none");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_reason_names),
        cmocka_unit_test(test_stop_reason_ar),
        cmocka_unit_test(test_stop_reason_tree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
