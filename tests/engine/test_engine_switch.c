/*
 * test_engine_switch.c — what the server needs from the engine beyond
 * generate: one engine created with a reserve (ddt_engine_set_speculation)
 * switched between ar, chain, tree and auto gives, greedy, exactly the ids of
 * an engine made for that mode, and a switch beyond the reserve or without a
 * drafter is refused; an emit callback that returns false stops the
 * generation after that round, with the tokens so far.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "engine/engine.h"

#define N_GEN 24

static char g_target[1024], g_draft[1024];

static void paths(void) {
    snprintf(g_target, sizeof g_target, "%s/tests/fixtures/target/fp32", DDT_SOURCE_DIR);
    snprintf(g_draft, sizeof g_draft, "%s/tests/fixtures/drafter/fp32", DDT_SOURCE_DIR);
}

static const int32_t k_prompt[] = {100, 3, 250, 17, 42, 9, 1, 77};

static ddt_engine *make(ddt_mode mode, int32_t budget, bool autob, int32_t reserve, bool draft) {
    ddt_engine_options o;
    memset(&o, 0, sizeof o);
    o.mode = mode;
    o.budget = budget;
    o.budget_auto = autob;
    o.reserve_budget = reserve;
    o.draft_dir = draft ? g_draft : NULL;
    o.sampling.top_p = 1.0f;
    o.n_threads = 2;
    ddt_engine *e;
    ddt_error err = {0};
    if (ddt_engine_create(g_target, &o, &e, &err) != DDT_OK) fail_msg("create: %s", err.msg);
    return e;
}

static int32_t gen(ddt_engine *e, int32_t *out, ddt_emit_fn fn, void *ctx) {
    int32_t n = 0;
    ddt_error err = {0};
    if (ddt_engine_generate(e, k_prompt, 8, N_GEN, NULL, 0, out, &n, fn, ctx, NULL, &err) != DDT_OK)
        fail_msg("generate: %s", err.msg);
    return n;
}

static void test_switched_equals_fresh(void **state) {
    (void)state;
    paths();
    int32_t ar[N_GEN], got[N_GEN], fresh[N_GEN];
    ddt_engine *base = make(DDT_MODE_AR, 0, false, 0, false);
    assert_int_equal(gen(base, ar, NULL, NULL), N_GEN);
    ddt_engine_free(base);

    ddt_engine *e = make(DDT_MODE_AR, 32, false, 24, true);
    ddt_error err = {0};
    static const struct {
        ddt_mode mode;
        int32_t budget;
        bool autob;
    } steps[] = {{DDT_MODE_TREE, 8, false}, {DDT_MODE_CHAIN, 0, false}, {DDT_MODE_TREE, 24, false},
                 {DDT_MODE_AR, 0, false}, {DDT_MODE_TREE, 16, true}, {DDT_MODE_TREE, 3, false}};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        assert_int_equal(ddt_engine_set_speculation(e, steps[i].mode, steps[i].budget, steps[i].autob, &err), DDT_OK);
        ddt_mode m;
        int32_t b;
        bool a;
        ddt_engine_speculation(e, &m, &b, &a);
        assert_int_equal(m, steps[i].mode);
        assert_int_equal(a, steps[i].autob);
        assert_int_equal(gen(e, got, NULL, NULL), N_GEN);
        assert_memory_equal(got, ar, sizeof ar); /* greedy: every mode gives ar's ids */
        if (steps[i].mode == DDT_MODE_TREE && !steps[i].autob) {
            ddt_engine *f = make(DDT_MODE_TREE, steps[i].budget, false, 0, true);
            assert_int_equal(gen(f, fresh, NULL, NULL), N_GEN);
            ddt_engine_free(f);
            assert_memory_equal(got, fresh, sizeof fresh);
        }
    }
    /* beyond the reserve, or nonsense */
    assert_int_equal(ddt_engine_set_speculation(e, DDT_MODE_TREE, 25, false, &err), DDT_ERR_RANGE);
    assert_non_null(strstr(err.msg, "24"));
    assert_int_equal(ddt_engine_set_speculation(e, DDT_MODE_TREE, 0, false, &err), DDT_ERR_RANGE);
    assert_int_equal(ddt_engine_set_speculation(e, (ddt_mode)7, 4, false, &err), DDT_ERR_INVALID);
    ddt_engine_free(e);

    ddt_engine *nod = make(DDT_MODE_AR, 0, false, 16, false); /* a reserve without a drafter */
    assert_int_equal(ddt_engine_set_speculation(nod, DDT_MODE_TREE, 4, false, &err), DDT_ERR_UNSUPPORTED);
    assert_int_equal(ddt_engine_set_speculation(nod, DDT_MODE_AR, 0, false, &err), DDT_OK);
    ddt_engine_free(nod);
    ddt_engine *fixed = make(DDT_MODE_TREE, 4, false, 0, true); /* no reserve: only up to its budget */
    assert_int_equal(ddt_engine_set_speculation(fixed, DDT_MODE_TREE, 2, false, &err), DDT_OK);
    assert_int_equal(ddt_engine_set_speculation(fixed, DDT_MODE_TREE, 5, false, &err), DDT_ERR_RANGE);
    ddt_engine_free(fixed);
}

typedef struct counter {
    int calls, stop_after;
    int32_t seen;
} counter;

static bool stop_early(void *ctx, const int32_t *ids, int32_t n) {
    (void)ids;
    counter *c = ctx;
    c->calls++;
    c->seen += n;
    return c->calls < c->stop_after;
}

static void test_emit_false_stops(void **state) {
    (void)state;
    paths();
    int32_t out[N_GEN];
    for (int mode = 0; mode < 2; mode++) {
        ddt_engine *e = mode ? make(DDT_MODE_TREE, 8, false, 0, true) : make(DDT_MODE_AR, 0, false, 0, false);
        counter c = {0, 3, 0};
        int32_t n = gen(e, out, stop_early, &c);
        assert_int_equal(c.calls, 3); /* no round after the callback said stop */
        assert_int_equal(n, c.seen);
        assert_true(n < N_GEN);
        ddt_engine_free(e);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_switched_equals_fresh),
        cmocka_unit_test(test_emit_false_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
