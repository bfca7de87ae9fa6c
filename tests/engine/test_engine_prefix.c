/*
 * test_engine_prefix.c — the CPU engine's prefix cache (options.prefix_cache),
 * as a server uses it for a multi-turn conversation: each request re-sends the
 * conversation so far plus a new turn.  Checked, over a sequence of requests that
 * extend, repeat, shorten and replace the previous context, switching between
 * ar, chain, tree and auto, greedy and T = 1:
 *  - every request's tokens equal those of an engine without the cache (a fresh
 *    context each time), token for token;
 *  - stats.cached_tokens is exactly the reusable prefix: the longest common
 *    prefix of the new prompt with the previous prompt + its output, less the
 *    prompt's last token, bounded by the drafter's context (which an ar
 *    generation does not extend past its prompt);
 *  - the first switch to the auto budget forgets the context (its cost table's
 *    timing forwards run in the target); a request refused before it starts
 *    (a token id outside the vocabulary) does not;
 *  - without the option nothing is reused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "engine/engine.h"

#define N_GEN 20
#define MAX_PROMPT 256

static char g_target[1024], g_draft[1024];

static void paths(void) {
    snprintf(g_target, sizeof g_target, "%s/tests/fixtures/target/fp32", DDT_SOURCE_DIR);
    snprintf(g_draft, sizeof g_draft, "%s/tests/fixtures/drafter/fp32", DDT_SOURCE_DIR);
}

static ddt_engine *make(bool cache) {
    ddt_engine_options o;
    memset(&o, 0, sizeof o);
    o.mode = DDT_MODE_AR;
    o.budget = 16;
    o.reserve_budget = 16;
    o.draft_dir = g_draft;
    o.sampling.top_p = 1.0f;
    o.n_threads = 2;
    o.prefix_cache = cache;
    ddt_engine *e;
    ddt_error err = {0};
    if (ddt_engine_create(g_target, &o, &e, &err) != DDT_OK) fail_msg("create: %s", err.msg);
    return e;
}

typedef struct step {
    ddt_mode mode;
    int32_t budget;
    bool autob;
    float temperature;
} step;

static void set_step(ddt_engine *e, const step *st) {
    ddt_error err = {0};
    if (ddt_engine_set_speculation(e, st->mode, st->budget, st->autob, &err) != DDT_OK)
        fail_msg("set_speculation: %s", err.msg);
    ddt_sampling sm = {.temperature = st->temperature, .top_k = 0, .top_p = 1.0f, .seed = 11};
    if (ddt_engine_set_sampling(e, &sm, &err) != DDT_OK) fail_msg("set_sampling: %s", err.msg);
}

static int32_t gen(ddt_engine *e, const int32_t *prompt, int32_t n, int32_t *out, ddt_gen_stats *s) {
    int32_t n_out = 0;
    ddt_error err = {0};
    if (ddt_engine_generate(e, prompt, n, N_GEN, NULL, 0, out, &n_out, NULL, NULL, s, &err) != DDT_OK)
        fail_msg("generate: %s", err.msg);
    return n_out;
}

static int32_t lcp(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    int32_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* How the next prompt is made from the previous prompt p and its output o. */
typedef enum { EXTEND, EXTEND_ALL, REPEAT_FIRST, FRESH, SHORT } turn;

static void test_prefix_cache_equals_fresh(void **state) {
    (void)state;
    paths();
    ddt_engine *cached = make(true), *plain = make(false);
    static const step steps[] = {
        {DDT_MODE_TREE, 16, false, 0.0f}, {DDT_MODE_TREE, 8, false, 0.0f},  {DDT_MODE_AR, 0, false, 0.0f},
        {DDT_MODE_CHAIN, 0, false, 0.0f}, {DDT_MODE_TREE, 16, true, 0.0f},  {DDT_MODE_TREE, 12, false, 1.0f},
        {DDT_MODE_AR, 0, false, 1.0f},    {DDT_MODE_TREE, 16, false, 1.0f}, {DDT_MODE_CHAIN, 0, false, 0.0f},
        {DDT_MODE_TREE, 4, false, 0.0f},  {DDT_MODE_TREE, 16, false, 0.0f},
    };
    static const turn turns[] = {FRESH, EXTEND, EXTEND, EXTEND_ALL, REPEAT_FIRST, EXTEND,
                                 EXTEND, SHORT, FRESH, EXTEND, EXTEND};
    static const int32_t first[] = {100, 3, 250, 17, 42, 9, 1, 77, 5, 280, 12};
    int32_t prev[MAX_PROMPT + N_GEN], n_prev = 0, prev_prompt_n = 0, prev_last = 0;
    int32_t prompt[MAX_PROMPT], n = 0;
    bool prev_ar = false, auto_seen = false;
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        /* the next prompt from the previous one (prev = its prompt + output) */
        switch (turns[i]) {
        case FRESH: /* a new conversation: nothing in common */
            n = 11;
            for (int32_t j = 0; j < n; j++) prompt[j] = first[j] + (int32_t)i;
            break;
        case EXTEND: /* the previous prompt, part of its answer, then a new turn */
        case EXTEND_ALL: /* ... the whole answer */
        {
            int32_t k = turns[i] == EXTEND_ALL ? n_prev : prev_prompt_n + (n_prev - prev_prompt_n) / 2;
            memcpy(prompt, prev, sizeof(int32_t) * (size_t)k);
            n = k;
            /* a token the model did not say there, so the common prefix ends at k (past
               n_prev the context may hold the last output token and more of its round) */
            int32_t diverge = ((k < n_prev ? prev[k] : prev_last) + 1) % 200;
            prompt[n++] = diverge;
            prompt[n++] = 33;
            prompt[n++] = (int32_t)i;
            break;
        }
        case REPEAT_FIRST: /* the same prompt again: all but its last token reused */
            n = prev_prompt_n;
            memcpy(prompt, prev, sizeof(int32_t) * (size_t)n);
            break;
        case SHORT: /* an edit early in the conversation */
            n = prev_prompt_n / 3;
            memcpy(prompt, prev, sizeof(int32_t) * (size_t)n);
            prompt[n++] = 9;
            break;
        }
        assert_true(n <= MAX_PROMPT);
        set_step(cached, &steps[i]);
        set_step(plain, &steps[i]);
        int32_t got[N_GEN], want[N_GEN];
        ddt_gen_stats sg, sw;
        int32_t ng = gen(cached, prompt, n, got, &sg), nw = gen(plain, prompt, n, want, &sw);
        assert_int_equal(ng, nw);
        if (memcmp(got, want, sizeof(int32_t) * (size_t)ng))
            fail_msg("request %zu (mode %s, T %g): the cached context changed the tokens", i,
                     ddt_mode_name(steps[i].mode), steps[i].temperature);
        assert_int_equal(sw.cached_tokens, 0);
        /* what the cache holds: the previous prompt and output; the drafter only the
           prompt after an ar generation */
        int32_t expect = i == 0 ? 0 : lcp(prompt, n, prev, n_prev);
        if (expect > n - 1) expect = n - 1;
        if (prev_ar && expect > prev_prompt_n) expect = prev_prompt_n;
        /* the first auto budget measures its cost table with forwards of its own,
           which replace the context */
        if (steps[i].autob && !auto_seen) expect = 0, auto_seen = true;
        if (sg.cached_tokens != expect)
            fail_msg("request %zu: %d cached tokens, expected %d (prompt %d tokens)", i, sg.cached_tokens, expect, n);
        assert_int_equal(sg.prompt_tokens, n);
        memcpy(prev, prompt, sizeof(int32_t) * (size_t)n);
        memcpy(prev + n, got, sizeof(int32_t) * (size_t)ng);
        /* the last output token's row is not in the context yet */
        n_prev = n + ng - 1;
        prev_last = got[ng - 1];
        prev_prompt_n = n;
        prev_ar = steps[i].mode == DDT_MODE_AR;
    }
    /* a request refused before it starts (a token id outside the vocabulary) leaves
       the context as it was */
    set_step(cached, &steps[0]);
    int32_t out[N_GEN], n_out = 0, bad[3] = {prev[0], prev[1], 1 << 30};
    ddt_error err = {0};
    assert_int_not_equal(ddt_engine_generate(cached, bad, 3, N_GEN, NULL, 0, out, &n_out, NULL, NULL, NULL, &err),
                         DDT_OK);
    ddt_gen_stats s;
    gen(cached, prev, prev_prompt_n, out, &s);
    assert_int_equal(s.cached_tokens, prev_prompt_n - 1);
    /* without the option, nothing is reused even for the same prompt */
    gen(plain, prev, prev_prompt_n, out, &s);
    gen(plain, prev, prev_prompt_n, out, &s);
    assert_int_equal(s.cached_tokens, 0);
    ddt_engine_free(cached);
    ddt_engine_free(plain);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_cache_equals_fresh),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
