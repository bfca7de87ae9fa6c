/*
 * test_job.c — a job's intake of emitted tokens (ddt_job_take_tokens), the
 * glue between the engine and a chat response: stop ids end the text and are
 * not text, a stop string ends it, and a chat job's ids are routed into
 * content, reasoning_content and tool calls with the finish reason that
 * follows ("tool_calls" when a turn that stopped by itself made calls); a forced
 * call's end (call_end) ends the answer.
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

/* A forced call (job.h call_end): its <|tool_call_end|> completes the call, then
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

    /* without call_end set (tool_choice auto), the call's end does not stop the answer: every id is
       taken (the text after it, still inside the unclosed section, belongs to no field) */
    j = chat_job(tok, NULL, false);
    assert_true(ddt_job_take_tokens(j, ids, (int32_t)n));
    assert_false(j->stop_hit);
    assert_int_equal(j->n_counted, (int32_t)n);
    assert_int_equal(j->router.n_calls, 1);
    ddt_job_release(j);
    ddt_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_routing),
        cmocka_unit_test(test_stop_string_and_plain),
        cmocka_unit_test(test_forced_call_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
