/*
 * test_json_grammar.c — the JSON recogniser (text/json_grammar.h) on tables of
 * valid and invalid documents, its two limits, and the token masks of the
 * vocabulary trie (text/json_vocab.h) against stepping every token by hand.
 * tests/python/test_json_grammar.py compares the recogniser with Python's json
 * module on random documents and their mutations.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "text/json_grammar.h"
#include "text/json_vocab.h"

/* 1: every byte steps and the end is complete; 0: a byte is refused or the end is not complete. */
static int accepts(const char *text, size_t n, bool object_only) {
    ddt_json_state s;
    ddt_json_init(&s, object_only);
    if (!ddt_json_feed(&s, (const uint8_t *)text, n)) return 0;
    return ddt_json_complete(&s);
}

static const char *const valid_any[] = {
    "{}", "[]", "0", "-0", "1", "-12", "0.5", "1e5", "1E+5", "-1.25e-10", "123456789012345678901234567890",
    "\"\"", "\"a\"", "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\u00e9\\uD83D\\uDE00\"", "\"\\ud800\"",
    "\"caf\xc3\xa9\"", "\"\xe2\x82\xac\"", "\"\xf0\x9f\x98\x80\"", "\"\xf4\x8f\xbf\xbf\"", "\"\xed\x9f\xbf\"",
    "true", "false", "null", "{} ", "[ 1 , 2 ]\n", "{\"a\":1}", "{\"a\" : [1, {\"b\": null}], \"c\": \"d\"}",
    "[[[[[]]]]]", "[true,false,null,0,\"x\",{},[]]", "{\"\":\"\"}", "[1.0e0]", "{\"k\":-0.0}",
};
static const char *const invalid_any[] = {
    "", " ", " {}", "\t[]", "{", "[", "]", "}", "{]", "[}", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "[1,]", "[,1]", "{,}", "{1:2}",
    "{'a':1}", "[01]", "-", "1.", ".5", "1e", "1e+", "+1", "0x10", "--1", "1.e5", "NaN", "Infinity", "-Infinity",
    "tru", "True", "nul", "nulll", "\"", "\"abc", "\"\\x\"", "\"\\u12\"", "\"\\u12G4\"", "\"a\nb\"", "\"\t\"",
    "\"\xc3\"", "\"\xc0\xaf\"", "\"\xe0\x80\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xff\"",
    "\"\x80\"", "\xef\xbb\xbf{}", "{} {}", "[1] 2", "1 2", "{\"a\":1 \"b\":2}", "[1 2]", "/*c*/{}", "{}x",
};

static void test_tables(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof valid_any / sizeof *valid_any; i++) {
        if (!accepts(valid_any[i], strlen(valid_any[i]), false)) fail_msg("refused valid JSON: %s", valid_any[i]);
        /* every prefix of a valid document can still grow into one */
        ddt_json_state s;
        ddt_json_init(&s, false);
        for (size_t k = 0; valid_any[i][k]; k++) assert_true(ddt_json_step(&s, (uint8_t)valid_any[i][k]));
    }
    for (size_t i = 0; i < sizeof invalid_any / sizeof *invalid_any; i++)
        if (accepts(invalid_any[i], strlen(invalid_any[i]), false)) fail_msg("accepted invalid JSON: %s", invalid_any[i]);
    /* a NUL inside a string is a control character */
    assert_int_equal(accepts("\"a\0b\"", 5, false), 0);
}

static void test_object_only(void **state) {
    (void)state;
    assert_int_equal(accepts("{\"a\": [1]}", 10, true), 1);
    assert_int_equal(accepts("  {}", 4, true), 0);
    static const char *const not_objects[] = {"[]", "1", "\"a\"", "true", "null"};
    for (size_t i = 0; i < 5; i++) {
        ddt_json_state s;
        ddt_json_init(&s, true);
        /* refused at the first byte, not only at the end */
        assert_false(ddt_json_step(&s, (uint8_t)not_objects[i][0]));
    }
}

static void test_refused_byte_leaves_state(void **state) {
    (void)state;
    ddt_json_state s, before;
    ddt_json_init(&s, false);
    assert_true(ddt_json_feed(&s, (const uint8_t *)"[1", 2));
    before = s;
    assert_false(ddt_json_step(&s, 'x'));
    assert_memory_equal(&s, &before, sizeof s);
    assert_true(ddt_json_step(&s, ']'));
    assert_true(ddt_json_complete(&s));
    /* a top-level number is complete yet may go on */
    ddt_json_init(&s, false);
    assert_true(ddt_json_feed(&s, (const uint8_t *)"12", 2));
    assert_true(ddt_json_complete(&s));
    assert_true(ddt_json_step(&s, '3'));
}

static void test_depth_limit(void **state) {
    (void)state;
    char buf[2 * DDT_JSON_MAX_DEPTH + 4];
    for (int i = 0; i < DDT_JSON_MAX_DEPTH; i++) buf[i] = '[', buf[2 * DDT_JSON_MAX_DEPTH - 1 - i] = ']';
    assert_int_equal(accepts(buf, 2 * DDT_JSON_MAX_DEPTH, false), 1);
    ddt_json_state s;
    ddt_json_init(&s, false);
    assert_true(ddt_json_feed(&s, (const uint8_t *)buf, DDT_JSON_MAX_DEPTH));
    assert_false(ddt_json_step(&s, '['));
    assert_false(ddt_json_step(&s, '{'));
    assert_true(ddt_json_step(&s, '1')); /* a scalar still fits */
}

static void test_whitespace_cap(void **state) {
    (void)state;
    char buf[DDT_JSON_MAX_WS + 8];
    buf[0] = '[';
    memset(buf + 1, ' ', DDT_JSON_MAX_WS);
    ddt_json_state s;
    ddt_json_init(&s, false);
    assert_true(ddt_json_feed(&s, (const uint8_t *)buf, DDT_JSON_MAX_WS + 1));
    assert_false(ddt_json_step(&s, ' '));
    assert_false(ddt_json_step(&s, '\n'));
    assert_true(ddt_json_step(&s, '1')); /* another byte ends the run */
    for (int i = 0; i < DDT_JSON_MAX_WS; i++) assert_true(ddt_json_step(&s, '\t'));
    assert_false(ddt_json_step(&s, '\t'));
    /* spaces inside a string are text, not a run */
    ddt_json_init(&s, false);
    assert_true(ddt_json_step(&s, '"'));
    for (int i = 0; i < 4 * DDT_JSON_MAX_WS; i++) assert_true(ddt_json_step(&s, ' '));
}

/* A vocabulary: the 128 ASCII bytes, a few multi-byte tokens, two without bytes (stops). */
static const char *const multi[] = {"{\"", "\":", "\",", "\"}", "{}", "[]", "true", "null", "  ", "\n  ",
                                    "12", "abc", "\xc3\xa9", "\xc3", "\xa9", "}\n", "{\"a\": 1}"};
#define N_MULTI (sizeof multi / sizeof *multi)
#define V (128 + N_MULTI + 2)
enum { STOP_A = V - 2, STOP_B = V - 1 };

static ddt_json_vocab *small_vocab(const uint8_t *bytes[V], size_t len[V], uint8_t *ascii) {
    for (int i = 0; i < 128; i++) ascii[i] = (uint8_t)i, bytes[i] = ascii + i, len[i] = 1;
    for (size_t i = 0; i < N_MULTI; i++) bytes[128 + i] = (const uint8_t *)multi[i], len[128 + i] = strlen(multi[i]);
    bytes[STOP_A] = bytes[STOP_B] = NULL;
    len[STOP_A] = len[STOP_B] = 0;
    ddt_json_vocab *v = NULL;
    assert_int_equal(ddt_json_vocab_create_bytes(bytes, len, V, &v, NULL), DDT_OK);
    return v;
}

/* The mask at s must be exactly the tokens whose bytes all step s (incomplete), or the stops (complete). */
static void check_mask(const ddt_json_vocab *v, const uint8_t *const *bytes, const size_t *len, const ddt_json_state *s) {
    const int32_t stop[2] = {STOP_A, STOP_B};
    uint8_t allow[V];
    int32_t n = ddt_json_vocab_mask(v, s, stop, 2, allow), count = 0;
    for (int32_t id = 0; id < (int32_t)V; id++) {
        bool want;
        if (ddt_json_complete(s)) {
            want = id == STOP_A || id == STOP_B;
        } else {
            ddt_json_state t = *s;
            want = len[id] > 0 && ddt_json_feed(&t, bytes[id], len[id]);
        }
        if (want != (allow[id] != 0)) fail_msg("token %d: mask %d, grammar %d", id, allow[id], want);
        count += want;
        /* advance takes exactly the tokens whose bytes step (complete or not) */
        ddt_json_state t = *s, u = *s;
        assert_int_equal(ddt_json_vocab_advance(v, &t, id), len[id] > 0 && ddt_json_feed(&u, bytes[id], len[id]));
    }
    assert_int_equal(n, count);
}

static void test_masks(void **state) {
    (void)state;
    const uint8_t *bytes[V];
    size_t len[V];
    uint8_t ascii[128];
    ddt_json_vocab *v = small_vocab(bytes, len, ascii);
    assert_int_equal(ddt_json_vocab_size(v), (int32_t)V);
    /* the mask along a document, byte by byte (every prefix state) */
    static const char doc[] = "{\"a\": [1, 2.5e3, true, null, \"x\\u00e9\xc3\xa9\"], \"b\": {}}";
    ddt_json_state s;
    ddt_json_init(&s, true);
    check_mask(v, bytes, len, &s);
    for (size_t i = 0; i < sizeof doc - 1; i++) {
        assert_true(ddt_json_step(&s, (uint8_t)doc[i]));
        check_mask(v, bytes, len, &s);
    }
    assert_true(ddt_json_complete(&s));
    /* at the start of json_object mode only '{' and tokens that open an object */
    const int32_t stop[1] = {STOP_A};
    uint8_t allow[V];
    ddt_json_init(&s, true);
    ddt_json_vocab_mask(v, &s, stop, 1, allow);
    assert_true(allow['{'] && allow[128] && allow[128 + 4] && allow[128 + 16]);
    assert_false(allow[' '] || allow['['] || allow['"'] || allow[STOP_A] || allow[128 + 5]);
    ddt_json_vocab_free(v);
}

static void test_bad_vocab(void **state) {
    (void)state;
    ddt_json_vocab *v = (ddt_json_vocab *)1;
    ddt_error err = {0};
    assert_int_equal(ddt_json_vocab_create_bytes(NULL, NULL, 4, &v, &err), DDT_ERR_INVALID);
    assert_null(v);
    assert_non_null(strstr(err.msg, "JSON vocabulary"));
    /* a vocabulary with no bytes at all: every mask of an incomplete document is empty */
    const uint8_t *bytes[2] = {NULL, NULL};
    size_t len[2] = {0, 0};
    assert_int_equal(ddt_json_vocab_create_bytes(bytes, len, 2, &v, &err), DDT_OK);
    ddt_json_state s;
    ddt_json_init(&s, true);
    uint8_t allow[2];
    const int32_t stop = 1;
    assert_int_equal(ddt_json_vocab_mask(v, &s, &stop, 1, allow), 0);
    ddt_json_vocab_free(v);
}

/* The mask cache answers every lookup with the mask ddt_json_vocab_mask gives, through
 * hits, misses and evictions (3 entries over random documents' states), clear forgets,
 * and a lookup with another stop list gets that list's mask. */
static void test_mask_cache(void **state) {
    (void)state;
    const uint8_t *bytes[V];
    size_t len[V];
    uint8_t ascii[128];
    ddt_json_vocab *v = small_vocab(bytes, len, ascii);
    ddt_json_mask_cache *c = NULL;
    ddt_error err = {0};
    assert_int_equal(ddt_json_mask_cache_create(V, 0, &c, &err), DDT_ERR_INVALID);
    assert_null(c);
    assert_int_equal(ddt_json_mask_cache_create(V, 3, &c, &err), DDT_OK);
    const int32_t stop[2] = {STOP_A, STOP_B};
    uint8_t want[V];
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int doc = 0; doc < 200; doc++) {
        ddt_json_state s;
        ddt_json_init(&s, doc & 1);
        for (int step = 0; step < 40; step++) {
            int32_t n = 0;
            const uint8_t *got = ddt_json_mask_cache_get(c, v, &s, stop, 2, &n);
            const int32_t nw = ddt_json_vocab_mask(v, &s, stop, 2, want);
            assert_int_equal(n, nw);
            assert_memory_equal(got, want, V);
            if (nw == 0 || ddt_json_complete(&s)) break;
            /* a random allowed token, by the mask just checked */
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            int32_t k = (int32_t)(rng % (uint64_t)nw), id = 0;
            for (; id < (int32_t)V; id++)
                if (want[id] && k-- == 0) break;
            assert_true(ddt_json_vocab_advance(v, &s, id));
        }
    }
    int64_t hits = 0, misses = 0;
    ddt_json_mask_cache_stats(c, &hits, &misses);
    assert_true(hits > 0 && misses > 3); /* reuse, and evictions past 3 entries */
    /* a cached mask holds the stop ids it was made with: clear, then another stop list */
    ddt_json_state s;
    ddt_json_init(&s, false);
    assert_true(ddt_json_feed(&s, (const uint8_t *)"1", 1));
    int32_t n = 0;
    const uint8_t *m = ddt_json_mask_cache_get(c, v, &s, stop, 2, &n);
    assert_true(m[STOP_A] && m[STOP_B]);
    ddt_json_mask_cache_clear(c);
    m = ddt_json_mask_cache_get(c, v, &s, stop, 1, &n);
    assert_true(m[STOP_A] && !m[STOP_B]);
    /* another stop list is honoured without a clear: the cache keeps the list its masks hold */
    m = ddt_json_mask_cache_get(c, v, &s, stop + 1, 1, &n);
    assert_true(!m[STOP_A] && m[STOP_B]);
    m = ddt_json_mask_cache_get(c, v, &s, stop, 2, &n);
    assert_true(m[STOP_A] && m[STOP_B]);
    /* stale stack bits above the depth do not make another entry */
    ddt_json_state a, b;
    ddt_json_init(&a, false);
    assert_true(ddt_json_feed(&a, (const uint8_t *)"[{\"k\": 1}, ", 11));
    b = a;
    b.stack |= UINT64_C(1) << 40;
    ddt_json_mask_cache_clear(c);
    ddt_json_mask_cache_stats(c, &hits, &misses);
    const int64_t m0 = misses;
    ddt_json_mask_cache_get(c, v, &a, stop, 2, &n);
    ddt_json_mask_cache_get(c, v, &b, stop, 2, &n);
    ddt_json_mask_cache_stats(c, &hits, &misses);
    assert_int_equal(misses, m0 + 1);
    ddt_json_mask_cache_free(c);
    ddt_json_vocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables),
        cmocka_unit_test(test_object_only),
        cmocka_unit_test(test_refused_byte_leaves_state),
        cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_whitespace_cap),
        cmocka_unit_test(test_masks),
        cmocka_unit_test(test_bad_vocab),
        cmocka_unit_test(test_mask_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
