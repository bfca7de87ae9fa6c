/*
 * test_job.c — a job's intake of emitted tokens (ddt_job_take_tokens), the
 * glue between the engine and a chat response: stop ids end the text and are
 * not text, a stop string ends it, and a chat job's ids are routed into
 * content, reasoning_content and tool calls with the finish reason that
 * follows ("tool_calls" when a turn that stopped by itself made calls); a forced
 * call's end (one_call) ends the answer, an "auto" one's does not; and what an
 * answer with constrained calls does after each of its engine generations
 * (ddt_job_call_next) and which grammar a call's arguments get (ddt_job_tool_schema).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/job.h"
#include "text/json_schema.h"
#include "../support/marker_tok.h"

static ddt_job *chat_job(ddt_tokenizer *tok, const char *stop, bool in_reasoning) {
    const char *stops[1] = {stop};
    size_t lens[1] = {stop ? strlen(stop) : 0};
    ddt_job *j = ddt_job_new(stops, lens, stop ? 1 : 0);
    assert_non_null(j);
    j->tok = tok;
    j->chat = true;
    j->stop_ids[j->n_stop_ids++] = MT_END;
    ddt_chat_router_init(&j->router, tok, in_reasoning);
    return j;
}

static char *take_all(ddt_textstream *ts, size_t *len) {
    char *out = NULL;
    ddt_error err;
    assert_int_equal(ddt_textstream_take(ts, true, &out, len, &err), DDT_OK);
    return out;
}

/* Thinking, an answer, a tool call, then <|im_end|>: each part in its place. */
static void test_chat_routing(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok(true);
    int32_t ids[512];
    size_t n = 0;
    marker_put_text(tok, "plan", ids, &n);
    ids[n++] = MT_THINK_END;
    marker_put_text(tok, "Calling.", ids, &n);
    ids[n++] = MT_SEC;
    ids[n++] = MT_CALL;
    marker_put_text(tok, "functions.f:0", ids, &n);
    ids[n++] = MT_ARG;
    marker_put_text(tok, "{\"a\": 1}", ids, &n);
    ids[n++] = MT_CALL_END;
    ids[n++] = MT_SEC_END;
    ids[n++] = MT_END;
    size_t stop_at = n;
    marker_put_text(tok, "after the end", ids, &n);
    ddt_job *j = chat_job(tok, NULL, true);
    /* in two rounds, split inside the call */
    assert_true(ddt_job_take_tokens(j, ids, 7));
    assert_false(ddt_job_take_tokens(j, ids + 7, (int32_t)(n - 7)));
    assert_int_equal(j->n_counted, (int32_t)stop_at);
    assert_true(j->stop_hit);
    size_t cl, rl;
    char *content = take_all(&j->text, &cl), *reasoning = take_all(&j->reasoning, &rl);
    assert_string_equal(content, "Calling.");
    assert_string_equal(reasoning, "plan");
    free(content);
    free(reasoning);
    assert_int_equal(j->router.n_calls, 1);
    assert_string_equal(j->router.calls[0].name, "f");
    assert_string_equal(j->router.calls[0].arguments, "{\"a\": 1}");
    j->stats.stop_reason = DDT_STOP_TOKEN;
    assert_string_equal(ddt_job_finish_reason(j), "tool_calls");
    j->stats.stop_reason = DDT_STOP_MAX_TOKENS;
    assert_string_equal(ddt_job_finish_reason(j), "length");
    ddt_job_release(j);
    ddt_tokenizer_free(tok);
}

/* A stop string in the content ends the text; the finish reason is then "stop", calls or not. */
static void test_stop_string_and_plain(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok(true);
    int32_t ids[512];
    size_t n = 0;
    marker_put_text(tok, "abc STOP def", ids, &n);
    ddt_job *j = chat_job(tok, "STOP", false);
    assert_false(ddt_job_take_tokens(j, ids, (int32_t)n));
    size_t cl;
    char *content = take_all(&j->text, &cl);
    assert_string_equal(content, "abc ");
    free(content);
    assert_string_equal(ddt_job_finish_reason(j), "stop");
    ddt_job_release(j);

    /* not a chat job: everything ordinary is text, markers are not */
    j = chat_job(tok, NULL, false);
    j->chat = false;
    n = 0;
    ids[n++] = MT_THINK;
    marker_put_text(tok, "x", ids, &n);
    ids[n++] = MT_THINK_END;
    assert_true(ddt_job_take_tokens(j, ids, (int32_t)n));
    content = take_all(&j->text, &cl);
    assert_string_equal(content, "x");
    free(content);
    ddt_job_release(j);
    ddt_tokenizer_free(tok);
}

/* A forced call (job.h one_call): its <|tool_call_end|> completes the call, then
 * ends the answer like a stop id, so nothing after it is taken; the same id
 * outside a call stops nothing. */
static void test_forced_call_end(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok(true);
    int32_t ids[256];
    size_t n = 0;
    ids[n++] = MT_CALL_END; /* stray: the router drops it, the answer goes on */
    ids[n++] = MT_CALL;
    marker_put_text(tok, "functions.f:0", ids, &n);
    ids[n++] = MT_ARG;
    marker_put_text(tok, "{\"a\": 1}", ids, &n);
    ids[n++] = MT_CALL_END;
    const size_t end = n;
    marker_put_text(tok, "after", ids, &n);
    ddt_job *j = chat_job(tok, NULL, false);
    j->call_end = MT_CALL_END;
    j->one_call = true;
    assert_true(ddt_job_take_tokens(j, ids, 1));
    assert_false(j->stop_hit);
    assert_false(ddt_job_take_tokens(j, ids + 1, (int32_t)(n - 1)));
    assert_true(j->stop_hit);
    assert_int_equal(j->n_counted, (int32_t)end);
    assert_int_equal(j->router.n_calls, 1);
    assert_string_equal(j->router.calls[0].arguments, "{\"a\": 1}");
    size_t cl;
    char *content = take_all(&j->text, &cl);
    assert_int_equal(cl, 0); /* "after" never reached the text */
    free(content);
    j->stats.stop_reason = DDT_STOP_TOKEN;
    assert_string_equal(ddt_job_finish_reason(j), "tool_calls");
    ddt_job_release(j);

    /* tool_choice auto, constrained (call_end set) or not: the call's end does not stop the answer:
       every id is taken (the text after it, still inside the unclosed section, belongs to no field) */
    for (int constrained = 0; constrained < 2; constrained++) {
        j = chat_job(tok, NULL, false);
        if (constrained) j->call_end = MT_CALL_END, j->arg_begin = MT_ARG;
        assert_true(ddt_job_take_tokens(j, ids, (int32_t)n));
        assert_false(j->stop_hit);
        assert_int_equal(j->n_counted, (int32_t)n);
        assert_int_equal(j->router.n_calls, 1);
        ddt_job_release(j);
    }
    ddt_tokenizer_free(tok);
}

/* "auto" (arg_begin set, not one_call): two calls in one section, then content after it and the
 * turn's end, fed as the generations of generate_call would (split at <|tool_call_argument_begin|>
 * and <|tool_call_end|>): both calls routed, with the names the arguments' grammar is looked up
 * by, the content kept, and "tool_calls" for the answer. */
static void test_auto_calls(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok(true);
    int32_t ids[512];
    size_t n = 0, cuts[8], n_cuts = 0;
    marker_put_text(tok, "Let me look.", ids, &n);
    ids[n++] = MT_SEC;
    ids[n++] = MT_CALL;
    marker_put_text(tok, "functions.f:0", ids, &n);
    ids[n++] = MT_ARG;
    cuts[n_cuts++] = n;
    marker_put_text(tok, "{\"a\": 1}", ids, &n);
    ids[n++] = MT_CALL_END;
    cuts[n_cuts++] = n;
    ids[n++] = MT_CALL;
    marker_put_text(tok, "functions.g:1", ids, &n);
    ids[n++] = MT_ARG;
    cuts[n_cuts++] = n;
    marker_put_text(tok, "{}", ids, &n);
    ids[n++] = MT_CALL_END;
    cuts[n_cuts++] = n;
    ids[n++] = MT_SEC_END;
    ids[n++] = MT_END;
    cuts[n_cuts++] = n;
    ddt_job *j = chat_job(tok, NULL, false);
    j->call_end = MT_CALL_END;
    j->arg_begin = MT_ARG;
    const char *want[2] = {"f", "g"};
    size_t at = 0;
    for (size_t c = 0; c < n_cuts; c++) {
        bool go_on = ddt_job_take_tokens(j, ids + at, (int32_t)(cuts[c] - at));
        at = cuts[c];
        char *name = NULL;
        ddt_error err;
        assert_int_equal(ddt_chat_router_args_name(&j->router, &name, &err), DDT_OK);
        if (c % 2 == 0 && c < 4) { /* at a call's arguments: the function it named */
            assert_true(go_on);
            assert_non_null(name);
            assert_string_equal(name, want[c / 2]);
        } else {
            assert_null(name);
            assert_int_equal(go_on, c < 4); /* only the turn's end stops the answer */
        }
        free(name);
    }
    assert_int_equal(j->router.n_calls, 2);
    assert_string_equal(j->router.calls[0].arguments, "{\"a\": 1}");
    assert_string_equal(j->router.calls[1].name, "g");
    size_t cl;
    char *content = take_all(&j->text, &cl);
    assert_string_equal(content, "Let me look.");
    free(content);
    j->stats.stop_reason = DDT_STOP_TOKEN;
    assert_string_equal(ddt_job_finish_reason(j), "tool_calls");
    ddt_job_release(j);
    ddt_tokenizer_free(tok);
}

/* What follows each engine generation of an answer with constrained calls. */
static void test_call_next(void **state) {
    (void)state;
    ddt_job *j = ddt_job_new(NULL, NULL, 0);
    assert_non_null(j);
    j->max_new = 100;
    j->call_end = MT_CALL_END;
    j->arg_begin = MT_ARG;
    /* auto: free text stopped at arg_begin inside a call: its arguments; outside one: free text on */
    assert_int_equal(ddt_job_call_next(j, false, 5, MT_ARG, 20, true, true), DDT_CALL_ARGS);
    assert_int_equal(ddt_job_call_next(j, false, 5, MT_ARG, 20, true, false), DDT_CALL_FREE);
    /* arguments closed by call_end: the model goes on, free */
    assert_int_equal(ddt_job_call_next(j, true, 5, MT_CALL_END, 30, true, false), DDT_CALL_FREE);
    /* arguments that ran out (max_tokens or the context): over, for the engine's reason */
    assert_int_equal(ddt_job_call_next(j, true, 5, '"', 30, true, false), DDT_CALL_END);
    /* free text ended by a stop id, a stop string or a cancel (go_on false), by running out, or empty */
    assert_int_equal(ddt_job_call_next(j, false, 5, MT_END, 30, false, false), DDT_CALL_END);
    assert_int_equal(ddt_job_call_next(j, false, 5, MT_ARG, 30, false, true), DDT_CALL_END);
    assert_int_equal(ddt_job_call_next(j, false, 70, 'x', 100, true, false), DDT_CALL_END);
    assert_int_equal(ddt_job_call_next(j, false, 0, -1, 30, true, false), DDT_CALL_END);
    assert_int_equal(ddt_job_call_next(j, true, 5, MT_CALL_END, 30, false, false), DDT_CALL_END);
    /* max_tokens spent exactly on an opening or an end, where one generation would have run on: a cut */
    assert_int_equal(ddt_job_call_next(j, false, 5, MT_ARG, 100, true, true), DDT_CALL_CUT);
    assert_int_equal(ddt_job_call_next(j, false, 5, MT_ARG, 100, true, false), DDT_CALL_CUT);
    assert_int_equal(ddt_job_call_next(j, true, 5, MT_CALL_END, 100, true, false), DDT_CALL_CUT);
    /* a forced call: its end is the answer's */
    j->one_call = true;
    assert_int_equal(ddt_job_call_next(j, true, 5, MT_CALL_END, 30, true, false), DDT_CALL_END);
    assert_int_equal(ddt_job_call_next(j, false, 5, MT_ARG, 20, true, true), DDT_CALL_ARGS);
    /* forced by name (no arg_begin): free text never happens, and an arg_begin id is just an id */
    j->arg_begin = -1;
    assert_int_equal(ddt_job_call_next(j, false, 5, MT_ARG, 20, true, true), DDT_CALL_END);
    ddt_job_release(j);
}

/* A call's grammar by the name it gives: the declared function's schema (the first of a name
 * declared twice), NULL for one outside the subset or a name declared nowhere. */
static void test_tool_schema(void **state) {
    (void)state;
    ddt_job *j = ddt_job_new(NULL, NULL, 0);
    assert_non_null(j);
    const char *names[3] = {"f", "g", "f"};
    j->tool_names = calloc(3, sizeof *j->tool_names);
    j->tool_schemas = calloc(3, sizeof *j->tool_schemas);
    assert_true(j->tool_names && j->tool_schemas);
    j->n_tools = 3;
    json_t *doc = json_loads("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}", 0, NULL);
    assert_non_null(doc);
    ddt_error err;
    for (int k = 0; k < 3; k++) {
        j->tool_names[k] = strdup(names[k]);
        if (k != 1) assert_int_equal(ddt_json_schema_compile(doc, &j->tool_schemas[k], &err), DDT_OK);
    }
    json_decref(doc);
    bool declared;
    assert_ptr_equal(ddt_job_tool_schema(j, "f", &declared), j->tool_schemas[0]);
    assert_true(declared);
    assert_null(ddt_job_tool_schema(j, "g", &declared));
    assert_true(declared);
    assert_null(ddt_job_tool_schema(j, "h", &declared));
    assert_false(declared);
    assert_null(ddt_job_tool_schema(j, NULL, &declared));
    assert_false(declared);
    ddt_job_release(j); /* frees the names and schemas */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_routing),
        cmocka_unit_test(test_stop_string_and_plain),
        cmocka_unit_test(test_forced_call_end),
        cmocka_unit_test(test_auto_calls),
        cmocka_unit_test(test_call_next),
        cmocka_unit_test(test_tool_schema),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
