/*
 * test_chat_output.c — the router that splits generated ids into content,
 * reasoning and tool calls in Kimi's and DeepSeek's markups
 * (text/chat_output.h), on the shipped model's tiktoken.model with the chat
 * markers at Kimi's offsets from the first special id
 * (tests/support/marker_tok.h), and on a small byte-level vocabulary whose
 * ordinary tokens spell DeepSeek's markers (a tokenizer.json whose vocabulary
 * holds its non-special added tokens).
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

/* ------------------------------------------------------------------ DeepSeek */

enum { DS_EOS = MT_END };

static void test_ds_markers_found(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok_ds();
    ddt_chat_markers m;
    ddt_chat_markers_find(tok, &m);
    assert_int_equal(m.format, DDT_CHAT_FORMAT_DEEPSEEK);
    assert_int_equal(m.section_begin, SEC);
    assert_int_equal(m.section_end, SEC_END);
    assert_int_equal(m.call_begin, CALL);
    assert_int_equal(m.arg_begin, ARG);
    assert_int_equal(m.call_end, CALL_END);
    assert_int_equal(m.think, THINK);
    assert_int_equal(m.think_end, THINK_END);
    ddt_tokenizer_free(tok);
    tok = marker_tok(true);
    ddt_chat_markers_find(tok, &m);
    assert_int_equal(m.format, DDT_CHAT_FORMAT_KIMI);
    ddt_tokenizer_free(tok);
    tok = marker_tok(false);
    ddt_chat_markers_find(tok, &m);
    assert_int_equal(m.format, DDT_CHAT_FORMAT_NONE);
    ddt_tokenizer_free(tok);
}

/* What one generation routed to: content, reasoning, the calls' JSON text
 * (ddt_chat_tool_calls_json, for comparing whole against streamed). */
typedef struct ds_out {
    char content[2048], reasoning[2048];
    size_t nc, nr;
    int done;
} ds_out;

static void ds_route(ddt_chat_router *r, const ddt_tokenizer *tok, const int32_t *ids, size_t from, size_t to,
                     ds_out *o) {
    for (size_t i = from; i < to; i++) {
        ddt_chat_channel ch;
        bool done;
        ddt_error err;
        assert_int_equal(ddt_chat_route(r, ids[i], &ch, &done, &err), DDT_OK);
        o->done += done;
        if (done) assert_int_equal(ids[i], r->m.call_end); /* a call completes at its end marker, no sooner */
        const uint8_t *b;
        size_t len;
        if (!ddt_tokenizer_text_bytes(tok, ids[i], &b, &len)) continue;
        if (ch == DDT_CHAT_CH_CONTENT) {
            assert_true(o->nc + len <= sizeof o->content);
            memcpy(o->content + o->nc, b, len), o->nc += len;
        }
        if (ch == DDT_CHAT_CH_REASONING) {
            assert_true(o->nr + len <= sizeof o->reasoning);
            memcpy(o->reasoning + o->nr, b, len), o->nr += len;
        }
    }
}

static char *calls_text(const ddt_chat_router *r) {
    json_t *a = ddt_chat_tool_calls_json(r->calls, r->n_calls, -1);
    assert_non_null(a);
    char *t = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    assert_non_null(t);
    return t;
}

/* The ids of a DeepSeek answer: reasoning, content, then two calls in the
 * given layout (V3: "function" head, name and fenced JSON; V3.1: name head). */
static size_t ds_answer(ddt_tokenizer *tok, bool v3, int32_t *ids) {
    size_t n = 0;
    ids[n++] = THINK;
    marker_put_text(tok, "The user wants weather.", ids, &n);
    ids[n++] = THINK_END;
    marker_put_text(tok, "Checking.", ids, &n);
    ids[n++] = SEC;
    ids[n++] = CALL;
    if (v3) {
        marker_put_text(tok, "function", ids, &n);
        ids[n++] = ARG;
        marker_put_text(tok, "get_weather\n```json\n{\"city\": \"Paris\"}\n```", ids, &n);
    } else {
        marker_put_text(tok, "get_weather", ids, &n);
        ids[n++] = ARG;
        marker_put_text(tok, "{\"city\": \"Paris\"}", ids, &n);
    }
    ids[n++] = CALL_END;
    marker_put_text(tok, "\n", ids, &n);
    ids[n++] = CALL;
    if (v3) {
        marker_put_text(tok, "function", ids, &n);
        ids[n++] = ARG;
        marker_put_text(tok, "lookup\n```json\n{\"q\": [1, 2]}\n```", ids, &n);
    } else {
        marker_put_text(tok, "lookup", ids, &n);
        ids[n++] = ARG;
        marker_put_text(tok, "{\"q\": [1, 2]}", ids, &n);
    }
    ids[n++] = CALL_END;
    ids[n++] = SEC_END;
    ids[n++] = DS_EOS;
    return n;
}

static void check_ds_whole(const ds_out *o, const ddt_chat_router *r, int32_t first) {
    assert_int_equal(o->nr, strlen("The user wants weather."));
    assert_memory_equal(o->reasoning, "The user wants weather.", o->nr);
    assert_int_equal(o->nc, strlen("Checking."));
    assert_memory_equal(o->content, "Checking.", o->nc);
    assert_int_equal(o->done, 2);
    assert_int_equal(r->n_calls, 2);
    char id0[16], id1[16];
    snprintf(id0, sizeof id0, "call_%d", first);
    snprintf(id1, sizeof id1, "call_%d", first + 1);
    assert_string_equal(r->calls[0].id, id0);
    assert_string_equal(r->calls[0].name, "get_weather");
    assert_string_equal(r->calls[0].arguments, "{\"city\": \"Paris\"}");
    assert_string_equal(r->calls[1].id, id1);
    assert_string_equal(r->calls[1].name, "lookup");
    assert_string_equal(r->calls[1].arguments, "{\"q\": [1, 2]}");
}

/* Both layouts whole; the ids go on from first_call_index. */
static void test_ds_layouts(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok_ds();
    int32_t ids[512];
    for (int v3 = 0; v3 < 2; v3++) {
        size_t n = ds_answer(tok, v3, ids);
        ddt_chat_router r;
        ddt_chat_router_init(&r, tok, false);
        ds_out o = {0};
        ds_route(&r, tok, ids, 0, n, &o);
        check_ds_whole(&o, &r, 0);
        ddt_chat_router_free(&r);
        /* a prompt that opened <think> (R1's): starts as reasoning; ids from 3 */
        ddt_chat_router_init(&r, tok, true);
        r.first_call_index = 3;
        memset(&o, 0, sizeof o);
        ds_route(&r, tok, ids, 1, n, &o);
        check_ds_whole(&o, &r, 3);
        ddt_chat_router_free(&r);
    }
    ddt_tokenizer_free(tok);
}

/* Streaming: the answer in two pieces split after every id (a server's rounds
 * end anywhere), each piece's routing appended, gives the whole answer's
 * result; after the first piece what was routed is a prefix of the whole
 * (content, reasoning, and the calls finished so far, which a stream sends as
 * deltas).  Then one id at a time with the calls checked at each. */
static void test_ds_streamed_splits(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok_ds();
    int32_t ids[512];
    for (int v3 = 0; v3 < 2; v3++) {
        size_t n = ds_answer(tok, v3, ids);
        ddt_chat_router whole;
        ddt_chat_router_init(&whole, tok, false);
        ds_out wo = {0};
        ds_route(&whole, tok, ids, 0, n, &wo);
        char *wcalls = calls_text(&whole);
        for (size_t k = 0; k <= n; k++) {
            ddt_chat_router r;
            ddt_chat_router_init(&r, tok, false);
            ds_out o = {0};
            ds_route(&r, tok, ids, 0, k, &o);
            assert_true(o.nc <= wo.nc && !memcmp(o.content, wo.content, o.nc));
            assert_true(o.nr <= wo.nr && !memcmp(o.reasoning, wo.reasoning, o.nr));
            assert_true(r.n_calls <= whole.n_calls);
            for (int c = 0; c < r.n_calls; c++) {
                assert_string_equal(r.calls[c].id, whole.calls[c].id);
                assert_string_equal(r.calls[c].name, whole.calls[c].name);
                assert_string_equal(r.calls[c].arguments, whole.calls[c].arguments);
            }
            ds_route(&r, tok, ids, k, n, &o);
            assert_int_equal(o.nc, wo.nc);
            assert_memory_equal(o.content, wo.content, o.nc);
            assert_int_equal(o.nr, wo.nr);
            assert_memory_equal(o.reasoning, wo.reasoning, o.nr);
            assert_int_equal(o.done, 2);
            char *t = calls_text(&r);
            assert_string_equal(t, wcalls);
            free(t);
            ddt_chat_router_free(&r);
        }
        free(wcalls);
        ddt_chat_router_free(&whole);
    }
    ddt_tokenizer_free(tok);
}

/* The name a forced "required" call's arguments are constrained by (V3.1: the head). */
static void test_ds_args_name(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok_ds();
    int32_t ids[64];
    size_t n = 0;
    ids[n++] = SEC;
    ids[n++] = CALL;
    marker_put_text(tok, " get_weather ", ids, &n);
    ids[n++] = ARG;
    ddt_chat_router r;
    ddt_chat_router_init(&r, tok, false);
    ds_out o = {0};
    ds_route(&r, tok, ids, 0, n, &o);
    char *name = NULL;
    ddt_error err;
    assert_int_equal(ddt_chat_router_args_name(&r, &name, &err), DDT_OK);
    assert_non_null(name);
    assert_string_equal(name, "get_weather");
    free(name);
    ddt_chat_router_free(&r);
    ddt_tokenizer_free(tok);
}

/* Odd shapes: a V3 call without its closing fence (what a forced call under the
 * grammar writes), a "function" head whose body is plain JSON (V3.1's function
 * named "function"), a fence with no info string, stray markers outside calls,
 * a call begun inside another, a section closed inside a call, and a call cut
 * short at the end.  Text outside calls stays content, markers never leak. */
static void test_ds_malformed(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok_ds();
    int32_t ids[512];
    size_t n = 0;
    ids[n++] = ARG;      /* stray separator and end: dropped, not text */
    ids[n++] = CALL_END;
    marker_put_text(tok, "a", ids, &n);
    ids[n++] = SEC;
    ids[n++] = CALL;
    marker_put_text(tok, "function", ids, &n);
    ids[n++] = ARG;
    marker_put_text(tok, "f1\n```json\n{\"x\": 1}", ids, &n);   /* no closing fence */
    ids[n++] = CALL_END;
    ids[n++] = CALL;
    marker_put_text(tok, "function", ids, &n);
    ids[n++] = ARG;
    marker_put_text(tok, "{\"y\": 2}", ids, &n);                /* V3.1 layout, name "function" */
    ids[n++] = CALL_END;
    ids[n++] = CALL;
    marker_put_text(tok, " function ", ids, &n);
    ids[n++] = ARG;
    marker_put_text(tok, "\nf3\n```\n[]\n```\n", ids, &n);      /* fence without "json" */
    ids[n++] = CALL_END;
    ids[n++] = CALL;
    marker_put_text(tok, "lost", ids, &n);
    ids[n++] = CALL;     /* begun inside another: "lost" is dropped */
    marker_put_text(tok, "f5", ids, &n);
    ids[n++] = ARG;
    marker_put_text(tok, "{}", ids, &n);
    ids[n++] = CALL_END;
    ids[n++] = CALL;
    marker_put_text(tok, "f6", ids, &n);
    ids[n++] = SEC_END;  /* closed inside a call: dropped */
    marker_put_text(tok, "b", ids, &n);
    ids[n++] = THINK_END; /* stray */
    ids[n++] = CALL;     /* cut short */
    marker_put_text(tok, "f7", ids, &n);
    ids[n++] = ARG;
    marker_put_text(tok, "{\"z\"", ids, &n);
    ddt_chat_router r;
    ddt_chat_router_init(&r, tok, false);
    ds_out o = {0};
    ds_route(&r, tok, ids, 0, n, &o);
    assert_int_equal(o.nc, 2);
    assert_memory_equal(o.content, "ab", 2);
    assert_int_equal(o.nr, 0);
    assert_int_equal(r.n_calls, 4);
    assert_string_equal(r.calls[0].name, "f1");
    assert_string_equal(r.calls[0].arguments, "{\"x\": 1}");
    assert_string_equal(r.calls[1].name, "function");
    assert_string_equal(r.calls[1].arguments, "{\"y\": 2}");
    assert_string_equal(r.calls[2].name, "f3");
    assert_string_equal(r.calls[2].arguments, "[]");
    assert_string_equal(r.calls[3].name, "f5");
    assert_string_equal(r.calls[3].id, "call_3");
    ddt_chat_router_free(&r);

    /* Every truncation of a well-formed answer: no crash, a prefix of the whole. */
    n = ds_answer(tok, true, ids);
    for (size_t k = 0; k < n; k++) {
        ddt_chat_router_init(&r, tok, false);
        memset(&o, 0, sizeof o);
        ds_route(&r, tok, ids, 0, k, &o);
        assert_true(r.n_calls <= 2);
        assert_true(o.nc <= strlen("Checking."));
        ddt_chat_router_free(&r);
    }
    ddt_tokenizer_free(tok);
}

/* A deterministic storm of markers and text bytes (the fuzz target's idea, run
 * in every ctest): the router never fails, calls stay bounded and their JSON
 * is always made. */
static void test_ds_random_sequences(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok_ds();
    const int32_t markers[] = {SEC, SEC_END, CALL, ARG, CALL_END, THINK, THINK_END, DS_EOS};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int round = 0; round < 300; round++) {
        ddt_chat_router r;
        ddt_chat_router_init(&r, tok, round & 1);
        int done = 0;
        for (int i = 0; i < 200; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            int32_t id = (x & 3) == 0 ? markers[(x >> 8) % 8] : (int32_t)((x >> 16) % 4096);
            ddt_chat_channel ch;
            bool d;
            assert_int_equal(ddt_chat_route(&r, id, &ch, &d, NULL), DDT_OK);
            done += d;
            char *name = NULL;
            assert_int_equal(ddt_chat_router_args_name(&r, &name, NULL), DDT_OK);
            free(name);
        }
        assert_int_equal(done, r.n_calls);
        json_t *a = ddt_chat_tool_calls_json(r.calls, r.n_calls, 0);
        assert_non_null(a);
        json_decref(a);
        ddt_chat_router_free(&r);
    }
    ddt_tokenizer_free(tok);
}

/* A prompt opens thinking when it ends in <think>, or <think> and whitespace
 * tokens (R1's "<think>\n"); text or another marker after it does not. */
static void test_prompt_opens_thinking(void **state) {
    (void)state;
    ddt_tokenizer *tok = marker_tok_ds();
    int32_t ids[64];
    size_t n = 0;
    marker_put_text(tok, "hi", ids, &n);
    ids[n++] = THINK;
    assert_true(ddt_chat_prompt_opens_thinking(tok, ids, n));
    marker_put_text(tok, "\n \n", ids, &n);
    assert_true(ddt_chat_prompt_opens_thinking(tok, ids, n));
    marker_put_text(tok, "x", ids, &n);
    assert_false(ddt_chat_prompt_opens_thinking(tok, ids, n));
    n = 0;
    ids[n++] = THINK;
    ids[n++] = THINK_END;
    assert_false(ddt_chat_prompt_opens_thinking(tok, ids, n));
    marker_put_text(tok, "\n", ids, &n);
    assert_false(ddt_chat_prompt_opens_thinking(tok, ids, n));
    assert_false(ddt_chat_prompt_opens_thinking(tok, ids, 0));
    ddt_tokenizer_free(tok);
    tok = marker_tok(false); /* no <think> in the vocabulary: never */
    n = 0;
    marker_put_text(tok, "<think>\n", ids, &n);
    assert_false(ddt_chat_prompt_opens_thinking(tok, ids, n));
    ddt_tokenizer_free(tok);
}

/* base64 of n bytes into o (NUL-terminated). */
static void b64(const uint8_t *b, size_t n, char *o) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t k = 0; k < n; k += 3) {
        uint32_t v = (uint32_t)b[k] << 16 | (k + 1 < n ? (uint32_t)b[k + 1] << 8 : 0) | (k + 2 < n ? b[k + 2] : 0);
        *o++ = tab[v >> 18 & 63];
        *o++ = tab[v >> 12 & 63];
        *o++ = k + 1 < n ? tab[v >> 6 & 63] : '=';
        *o++ = k + 2 < n ? tab[v & 63] : '=';
    }
    *o = '\0';
}

/* DeepSeek's markers as ordinary tokens (ranks 256..262 after the 256 bytes):
 * found all the same, routed as markers, their bytes never text. */
static void test_ds_ordinary_markers(void **state) {
    (void)state;
    const char *words[] = {DDT_DS_CALLS_BEGIN, DDT_DS_CALLS_END, DDT_DS_CALL_BEGIN, DDT_DS_SEP, DDT_DS_CALL_END,
                           "<think>", "</think>"};
    static char model[16384];
    size_t len = 0;
    for (int i = 0; i < 256 + 7; i++) {
        uint8_t one = (uint8_t)i;
        const uint8_t *b = i < 256 ? &one : (const uint8_t *)words[i - 256];
        size_t n = i < 256 ? 1 : strlen(words[i - 256]);
        char enc[64];
        b64(b, n, enc);
        len += (size_t)snprintf(model + len, sizeof model - len, "%s %d\n", enc, i);
    }
    ddt_tokenizer_source src = {"ordinary.model", (const uint8_t *)model, len, NULL, NULL, 0, NULL, NULL, 0};
    ddt_tokenizer *tok = NULL;
    ddt_error err;
    if (ddt_tokenizer_create(&src, &tok, &err) != DDT_OK) fail_msg("tokenizer: %s", err.msg);
    ddt_chat_markers m;
    ddt_chat_markers_find(tok, &m);
    assert_int_equal(m.format, DDT_CHAT_FORMAT_DEEPSEEK);
    assert_int_equal(m.section_begin, 256);
    assert_int_equal(m.arg_begin, 259);
    assert_int_equal(m.think, 261);
    assert_int_equal(m.think_end, 262);
    int32_t ids[512];
    size_t n = 0;
    ids[n++] = 261;
    marker_put_text(tok, "hm", ids, &n);
    ids[n++] = 262;
    marker_put_text(tok, "ok", ids, &n);
    ids[n++] = 256;
    ids[n++] = 258;
    marker_put_text(tok, "f", ids, &n);
    ids[n++] = 256; /* a marker inside a call: not its text */
    ids[n++] = 259;
    marker_put_text(tok, "{}", ids, &n);
    ids[n++] = 260;
    ids[n++] = 257;
    ids[n++] = 259; /* stray */
    ddt_chat_router r;
    ddt_chat_router_init(&r, tok, false);
    ds_out o = {0};
    ds_route(&r, tok, ids, 0, n, &o);
    assert_int_equal(o.nr, 2);
    assert_memory_equal(o.reasoning, "hm", 2);
    assert_int_equal(o.nc, 2);
    assert_memory_equal(o.content, "ok", 2);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.calls[0].name, "f");
    assert_string_equal(r.calls[0].arguments, "{}");
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
        cmocka_unit_test(test_ds_markers_found),
        cmocka_unit_test(test_ds_layouts),
        cmocka_unit_test(test_ds_streamed_splits),
        cmocka_unit_test(test_ds_args_name),
        cmocka_unit_test(test_ds_malformed),
        cmocka_unit_test(test_ds_random_sequences),
        cmocka_unit_test(test_ds_ordinary_markers),
        cmocka_unit_test(test_prompt_opens_thinking),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
