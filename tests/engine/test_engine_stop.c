/*
 * test_engine_stop.c — the engine says why a generation ended
 * (ddt_gen_stats.stop_reason), in ar and in tree mode with the DFlash fixture
 * drafter: max tokens (also max_new = 0), a stop token (also when it is the
 * last token max_new allows: the stop token wins), a full context, and an emit
 * callback that returned false (unless the same round emitted a stop token).
 * And the lockstep rule of the multi-GPU engine (emitter.h:
 * ddt_emitter_next_round), on simulated ranks: rank 0 alone has the callback,
 * yet every rank runs the same rounds and ends after the same one, and rank 0
 * emits what one engine alone would.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "engine/emitter.h"
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

/* ------------------------------------------------------------------ lockstep ranks */

#define RANKS 3
#define SIM_MAX 64

/* The tokens simulated round r emits: 1 + r % 3 of them, ids 1000 + running index
 * (so a stop id can be placed anywhere), the first token (round 0) is 999. */
static int32_t sim_round(int32_t r, int32_t *next_id, int32_t *ids) {
    if (r == 0) {
        ids[0] = 999;
        return 1;
    }
    const int32_t m = 1 + r % 3;
    for (int32_t i = 0; i < m; i++) ids[i] = (*next_id)++;
    return m;
}

typedef struct sim_result {
    int32_t n, out[SIM_MAX], rounds;
    ddt_stop_reason reason;
} sim_result;

/* The loop of engine_cuda.c on `ranks` simulated ranks (1: one engine alone, not in
 * lockstep): next_round, the context check, the flag sum, the round, the drop. */
static void sim_run(int ranks, int32_t max_new, int32_t stop_id, int cancel_call, int32_t ctx_rounds,
                    sim_result *res) {
    static int32_t outs[RANKS][SIM_MAX];
    ddt_emitter em[RANKS];
    cb c = {0, cancel_call};
    for (int r = 0; r < ranks; r++)
        em[r] = ddt_emitter_start(outs[r], max_new, &stop_id, stop_id >= 0 ? 1 : 0, r == 0 ? on_emit : NULL,
                                  r == 0 ? &c : NULL);
    int32_t ids[4], next_id = 1000, m = sim_round(0, &next_id, ids);
    for (int r = 0; r < ranks; r++) ddt_emitter_push(&em[r], ids, m);
    int32_t rounds = 0;
    for (int32_t round = 1;; round++) {
        bool run[RANKS];
        float sum = 0.0f;
        for (int r = 0; r < ranks; r++) {
            float flag;
            run[r] = ddt_emitter_next_round(&em[r], ranks > 1, &flag);
            assert_true(flag == 0.0f || flag == 1.0f);
            assert_true(r == 0 || flag == 0.0f); /* only rank 0 has a callback to cancel */
            sum += flag;
        }
        /* a rank that runs a round while another does not would wait in its collectives */
        for (int r = 1; r < ranks; r++) assert_int_equal(run[r], run[0]);
        if (!run[0]) break;
        if (round > ctx_rounds) break; /* the context is full: the same on every rank */
        rounds++;
        m = sim_round(round, &next_id, ids);
        if (sum > 0.0f) break; /* every rank drops this round's tokens */
        for (int r = 0; r < ranks; r++) ddt_emitter_push(&em[r], ids, m);
    }
    for (int r = 1; r < ranks; r++) {
        assert_true(em[r].n >= em[0].n); /* the others emitted (and dropped) at least rank 0's tokens */
        assert_memory_equal(outs[r], outs[0], sizeof(int32_t) * (size_t)em[0].n);
    }
    res->n = em[0].n;
    memcpy(res->out, outs[0], sizeof(int32_t) * (size_t)em[0].n);
    res->rounds = rounds;
    res->reason = em[0].reason;
}

static void test_lockstep_cancel(void **state) {
    (void)state;
    static const struct {
        int32_t max_new, stop_id;
        int cancel_call;
        int32_t ctx_rounds;
    } cases[] = {
        {30, -1, 0, 100},   /* no cancel: max tokens */
        {30, -1, 1, 100},   /* cancel on the first token (before any round) */
        {30, -1, 3, 100},   /* cancel in round 2 */
        {30, 1003, 3, 100}, /* ... whose tokens hold a stop id: the stop id is the reason, no extra round */
        {4, -1, 3, 100},    /* ... in the round that reaches max_new: max tokens, no extra round */
        {30, -1, 3, 2},     /* ... with the context full after it: no round can follow */
        {30, -1, 5, 100},
        {30, 1012, 0, 100}, /* a stop id, no cancel */
        {30, -1, 0, 5},     /* the context, no cancel */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sim_result one, many;
        sim_run(1, cases[i].max_new, cases[i].stop_id, cases[i].cancel_call, cases[i].ctx_rounds, &one);
        sim_run(RANKS, cases[i].max_new, cases[i].stop_id, cases[i].cancel_call, cases[i].ctx_rounds, &many);
        /* rank 0 emits what one engine alone emits, for the same reason */
        assert_int_equal(many.n, one.n);
        assert_memory_equal(many.out, one.out, sizeof(int32_t) * (size_t)one.n);
        assert_int_equal(many.reason, one.reason);
        /* one round more only to carry a cancel, and only when a round could run */
        const bool extra = one.reason == DDT_STOP_CANCELLED && one.rounds < cases[i].ctx_rounds;
        if (many.rounds != one.rounds + (extra ? 1 : 0))
            fail_msg("case %zu: %d rounds in lockstep, %d alone", i, many.rounds, one.rounds);
    }
    /* one engine alone never runs a round after a cancel */
    ddt_emitter em = ddt_emitter_start(NULL, 0, NULL, 0, NULL, NULL);
    em.done = true;
    em.reason = DDT_STOP_CANCELLED;
    float flag = -1.0f;
    assert_false(ddt_emitter_next_round(&em, false, &flag));
    assert_true(flag == 0.0f);
    assert_true(ddt_emitter_next_round(&em, true, &flag));
    assert_true(flag == 1.0f);
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
        cmocka_unit_test(test_lockstep_cancel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
