/*
 * test_chat_output.c — the router that splits generated ids into content,
 * reasoning and Kimi-format tool calls (text/chat_output.h), on the shipped
 * model's tiktoken.model with the chat markers at Kimi's offsets from the
 * first special id (tests/support/marker_tok.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "text/chat_output.h"
#include "text/tokenizer.h"
#include "../support/marker_tok.h"

enum { END = MT_END, SEC = MT_SEC, SEC_END = MT_SEC_END, CALL = MT_CALL, ARG = MT_ARG, CALL_END = MT_CALL_END,
       THINK = MT_THINK, THINK_END = MT_THINK_END };

typedef struct routed {
    char content[1024], reasoning[1024];
    size_t nc, nr;
    int done_calls;
} routed;

static void route_all(ddt_chat_router *r, const ddt_tokenizer *tok, const int32_t *ids, size_t n, routed *out) {
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < n; i++) {
        ddt_chat_channel ch;
        bool done;
        ddt_error err;
        assert_int_equal(ddt_chat_route(r, ids[i], &ch, &done, &err), DDT_OK);
        out->done_calls += done;
        const uint8_t *b;
        size_t len;
        if (!ddt_tokenizer_text_bytes(tok, ids[i], &b, &len)) continue;
        if (ch == DDT_CHAT_CH_CONTENT) memcpy(out->content + out->nc, b, len), out->nc += len;
        if (ch == DDT_CHAT_CH_REASONING) memcpy(out->reasoning + out->nr, b, len), out->nr += len;
    }
}

static void test_markers_found(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok(true);
    ddt_chat_markers m;
    ddt_chat_markers_find(tok, &m);
    assert_int_equal(m.section_begin, SEC);
    assert_int_equal(m.section_end, SEC_END);
    assert_int_equal(m.call_begin, CALL);
    assert_int_equal(m.arg_begin, ARG);
    assert_int_equal(m.call_end, CALL_END);
    assert_int_equal(m.think, THINK);
    assert_int_equal(m.think_end, THINK_END);
    ddt_tokenizer_free(tok);
    tok = marker_tok(false);
    ddt_chat_markers_find(tok, &m);
    assert_int_equal(m.think, -1);
    assert_int_equal(m.call_begin, -1);
    ddt_tokenizer_free(tok);
}

/* Reasoning, content, then two calls: names from "functions.NAME:IDX", text trimmed. */
static void test_reasoning_content_and_calls(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok(true);
    int32_t ids[512];
    size_t n = 0;
    ids[n++] = THINK;
    marker_put_text(tok, "let me see", ids, &n);
    ids[n++] = THINK_END;
    marker_put_text(tok, "I will call it.", ids, &n);
    ids[n++] = SEC;
    marker_put_text(tok, "\n", ids, &n);
    ids[n++] = CALL;
    marker_put_text(tok, " functions.get_weather:0 ", ids, &n);
    ids[n++] = ARG;
    marker_put_text(tok, " {\"city\": \"Paris\"} ", ids, &n);
    ids[n++] = CALL_END;
    ids[n++] = CALL;
    marker_put_text(tok, "functions.lookup:1", ids, &n);
    ids[n++] = ARG;
    marker_put_text(tok, "{}", ids, &n);
    ids[n++] = CALL_END;
    ids[n++] = SEC_END;
    ids[n++] = END;
    ddt_chat_router r;
    ddt_chat_router_init(&r, tok, false);
    routed out;
    route_all(&r, tok, ids, n, &out);
    assert_int_equal(out.nr, strlen("let me see"));
    assert_memory_equal(out.reasoning, "let me see", out.nr);
    assert_int_equal(out.nc, strlen("I will call it."));
    assert_memory_equal(out.content, "I will call it.", out.nc);
    assert_int_equal(out.done_calls, 2);
    assert_int_equal(r.n_calls, 2);
    assert_string_equal(r.calls[0].id, "functions.get_weather:0");
    assert_string_equal(r.calls[0].name, "get_weather");
    assert_string_equal(r.calls[0].arguments, "{\"city\": \"Paris\"}");
    assert_string_equal(r.calls[1].name, "lookup");
    assert_string_equal(r.calls[1].arguments, "{}");
    ddt_chat_router_free(&r);

    /* A prompt that ends in <think>: the text starts as reasoning. */
    ddt_chat_router_init(&r, tok, true);
    route_all(&r, tok, ids + 1, n - 1, &out);
    assert_int_equal(out.nr, strlen("let me see"));
    assert_int_equal(r.n_calls, 2);
    ddt_chat_router_free(&r);
    ddt_tokenizer_free(tok);
}

/* Cut short or malformed calls are never reported; the text after a section is content again. */
static void test_malformed_and_cut_calls(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok(true);
    int32_t ids[512];
    size_t n = 0;
    ids[n++] = SEC;
    ids[n++] = CALL;
    marker_put_text(tok, "functions.a:0", ids, &n);
    ids[n++] = CALL; /* a call begun inside another: the first is dropped */
    marker_put_text(tok, "functions.b:1", ids, &n);
    ids[n++] = ARG;
    marker_put_text(tok, "{\"x\": 1}", ids, &n);
    ids[n++] = CALL_END;
    ids[n++] = CALL;
    marker_put_text(tok, "functions.c:2", ids, &n);
    ids[n++] = SEC_END; /* closed inside a call: dropped */
    marker_put_text(tok, "after", ids, &n);
    ids[n++] = CALL;    /* generation ends inside a call */
    marker_put_text(tok, "functions.d:3", ids, &n);
    ids[n++] = ARG;
    marker_put_text(tok, "{\"y\"", ids, &n);
    ddt_chat_router r;
    ddt_chat_router_init(&r, tok, false);
    routed out;
    route_all(&r, tok, ids, n, &out);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.calls[0].name, "b");
    assert_string_equal(r.calls[0].arguments, "{\"x\": 1}");
    assert_int_equal(out.nc, 5);
    assert_memory_equal(out.content, "after", 5);
    ddt_chat_router_free(&r);
    ddt_tokenizer_free(tok);
}

/* Without the markers in the vocabulary everything ordinary is content; specials are not text. */
/* The name of the call at its arguments, which a server constrains them by: none
 * before <|tool_call_argument_begin|> or after the call's end. */
static void test_args_name(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok(true);
    int32_t ids[128];
    size_t n = 0;
    ids[n++] = SEC;
    ids[n++] = CALL;
    marker_put_text(tok, " functions.get_weather:3 ", ids, &n);
    const size_t at_arg = n;
    ids[n++] = ARG;
    marker_put_text(tok, "{}", ids, &n);
    const size_t at_end = n;
    ids[n++] = CALL_END;
    ddt_chat_router r;
    ddt_chat_router_init(&r, tok, false);
    ddt_error err = {0};
    char *name = (char *)1;
    for (size_t i = 0; i < n; i++) {
        if (i == at_arg || i == at_end + 1) {
            assert_int_equal(ddt_chat_router_args_name(&r, &name, &err), DDT_OK);
            assert_null(name); /* the id is still being read / the call is over */
        }
        ddt_chat_channel ch;
        bool done;
        assert_int_equal(ddt_chat_route(&r, ids[i], &ch, &done, &err), DDT_OK);
        if (i == at_arg || i == at_end - 1) {
            assert_int_equal(ddt_chat_router_args_name(&r, &name, &err), DDT_OK);
            assert_non_null(name);
            assert_string_equal(name, "get_weather");
            free(name);
        }
    }
    assert_int_equal(ddt_chat_router_args_name(&r, &name, &err), DDT_OK);
    assert_null(name);
    assert_int_equal(r.n_calls, 1);
    ddt_chat_router_free(&r);
    ddt_tokenizer_free(tok);
}

static void test_no_markers(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok(false);
    int32_t ids[512];
    size_t n = 0;
    marker_put_text(tok, "<think>plain</think>", ids, &n);
    ids[n++] = END;
    ddt_chat_router r;
    ddt_chat_router_init(&r, tok, true); /* no </think> in the vocabulary: never reasoning */
    routed out;
    route_all(&r, tok, ids, n, &out);
    assert_int_equal(out.nc, strlen("<think>plain</think>"));
    assert_int_equal(out.nr, 0);
    assert_int_equal(r.n_calls, 0);
    ddt_chat_router_free(&r);
    ddt_tokenizer_free(tok);
}

/* Past DDT_CHAT_MAX_TOOL_CALLS calls the rest are dropped, not written out of bounds. */
static void test_call_count_bound(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok(true);
    int32_t one[64];
    size_t n1 = 0;
    one[n1++] = CALL;
    marker_put_text(tok, "functions.f:0", one, &n1);
    one[n1++] = ARG;
    marker_put_text(tok, "{}", one, &n1);
    one[n1++] = CALL_END;
    ddt_chat_router r;
    ddt_chat_router_init(&r, tok, false);
    int done = 0;
    for (int k = 0; k < DDT_CHAT_MAX_TOOL_CALLS + 5; k++)
        for (size_t i = 0; i < n1; i++) {
            ddt_chat_channel ch;
            bool d;
            assert_int_equal(ddt_chat_route(&r, one[i], &ch, &d, NULL), DDT_OK);
            done += d;
        }
    assert_int_equal(r.n_calls, DDT_CHAT_MAX_TOOL_CALLS);
    assert_int_equal(done, DDT_CHAT_MAX_TOOL_CALLS);
    ddt_chat_router_free(&r);
    ddt_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_markers_found),
        cmocka_unit_test(test_reasoning_content_and_calls),
        cmocka_unit_test(test_malformed_and_cut_calls),
        cmocka_unit_test(test_args_name),
        cmocka_unit_test(test_no_markers),
        cmocka_unit_test(test_call_count_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
