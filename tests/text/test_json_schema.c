/*
 * test_json_schema.c — the schema subset of response_format json_schema: the
 * compiler (text/json_schema.h) on schemas it accepts and on ones it refuses,
 * each refusal's message checked for the keyword and its path; and the
 * recogniser (text/json_grammar.h) stepping with a schema, on instances it must
 * accept and on documents it must refuse (wrong type, missing, extra or
 * out-of-order property, enum mismatch, a fraction in an integer), plus the
 * mask cache keeping states of two schema positions apart.  The extended subset:
 * optional properties (names sharing prefixes), type lists, enum / const of
 * scalars in canonical text, anyOf / oneOf by first byte, $ref / $defs with
 * recursion held to the nesting limit exactly where a container would no longer
 * fit, minItems / maxItems, minLength / maxLength in characters; each with the
 * refusals of its malformed or unsupported forms, and random walks through each
 * schema's documents checking that no prefix is a dead end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "text/json_grammar.h"
#include "text/json_schema.h"
#include "text/json_vocab.h"

/* Compile schema text; on failure *msg holds the error (the schema is NULL). */
static ddt_json_schema *compile(const char *text, ddt_status *st, ddt_error *err) {
    json_error_t je;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!j) fail_msg("test schema is not JSON: %s: %s", je.text, text);
    ddt_json_schema *s = NULL;
    *st = ddt_json_schema_compile(j, &s, err);
    json_decref(j);
    return s;
}

static void test_compile_accepts(void **state) {
    (void)state;
    static const char *const ok[] = {
        "{\"type\": \"object\", \"properties\": {}}",
        "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}}, \"required\": [\"a\"], "
        "\"additionalProperties\": false, \"title\": \"t\", \"description\": \"d\"}",
        "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"number\"}, "
        "\"c\": {\"type\": \"boolean\"}, \"d\": {\"type\": \"null\"}, \"e\": {\"enum\": [\"x\", \"y\"]}, "
        "\"f\": {\"type\": \"string\", \"enum\": [\"q\"]}, \"g\": {\"type\": \"array\", \"items\": {\"type\": \"integer\"}}, "
        "\"h\": {\"type\": \"object\", \"properties\": {\"i\": {\"type\": \"string\"}}}}, \"required\": [\"b\"]}",
        "{\"type\": \"object\", \"properties\": {\"caf\xc3\xa9\": {\"type\": \"string\"}}, \"additionalProperties\": true}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        ddt_error err = {0};
        ddt_status st;
        ddt_json_schema *s = compile(ok[i], &st, &err);
        if (st != DDT_OK) fail_msg("schema %zu refused: %s", i, err.msg);
        assert_non_null(s);
        assert_int_equal(s->nodes[s->root].kinds, 1u << DDT_JK_OBJECT);
        ddt_json_schema *c = NULL;
        assert_int_equal(ddt_json_schema_copy(s, &c, &err), DDT_OK);
        assert_int_equal(c->n_nodes, s->n_nodes);
        ddt_json_schema_free(c);
        ddt_json_schema_free(s);
    }
}

static void test_compile_refuses(void **state) {
    (void)state;
    static const struct {
        const char *schema;
        ddt_status st;
        const char *words;
    } bad[] = {
        {"{\"type\": \"string\"}", DDT_ERR_UNSUPPORTED, "root schema must have \"type\": \"object\""},
        {"{\"properties\": {}}", DDT_ERR_UNSUPPORTED, "schema at $ has no 'type'"},
        {"{\"type\": \"object\"}", DDT_ERR_UNSUPPORTED, "object at $ has no 'properties'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\", \"minimum\": 1}}}", DDT_ERR_UNSUPPORTED,
         "unsupported keyword 'minimum' at $.properties.a"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"$ref\": \"#/x\"}}}", DDT_ERR_INVALID,
         "'$ref' at $.properties.a: \"#/x\" points to nothing in the schema"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"$ref\": \"#/x\"}}}",
         DDT_ERR_UNSUPPORTED, "'type' beside '$ref' at $.properties.a"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"anyOf\": []}}}", DDT_ERR_UNSUPPORTED,
         "'type' beside 'anyOf' at $.properties.a"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"x\"}}}",
         DDT_ERR_UNSUPPORTED, "unsupported keyword 'pattern' at $.properties.a"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\", \"items\": {\"type\": \"string\", "
         "\"format\": \"date\"}}}}", DDT_ERR_UNSUPPORTED, "unsupported keyword 'format' at $.properties.a.items"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\"}}}", DDT_ERR_UNSUPPORTED,
         "array at $.properties.a has no 'items'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"items\": {\"type\": \"string\"}}}}",
         DDT_ERR_UNSUPPORTED, "unsupported keyword 'items' at $.properties.a"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"str\"}}}", DDT_ERR_INVALID,
         "'type' at $.properties.a is \"str\""},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"enum\": []}}}", DDT_ERR_INVALID,
         "'enum' at $.properties.a must be a non-empty array"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\", \"enum\": [\"1\"]}}}",
         DDT_ERR_INVALID, "'enum' at $.properties.a: no value fits the schema's 'type'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"enum\": [\"x\\\"y\"]}}}", DDT_ERR_UNSUPPORTED,
         "'enum' at $.properties.a: item 0 contains a '\"'"},
        {"{\"type\": \"object\", \"properties\": {\"a\\\\b\": {\"type\": \"string\"}}}", DDT_ERR_UNSUPPORTED,
         "property name at $.properties.a\\b contains a '\\'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}}, \"required\": [\"b\"]}",
         DDT_ERR_UNSUPPORTED, "'required' at $ names \"b\", which is not in 'properties'"},
        {"{\"type\": \"object\", \"properties\": {}, \"additionalProperties\": {\"type\": \"string\"}}",
         DDT_ERR_UNSUPPORTED, "'additionalProperties' at $ must be false or true"},
        {"{\"type\": \"object\", \"properties\": {\"a\": 3}}", DDT_ERR_INVALID, "the schema at $.properties.a must be an object"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"object\", \"properties\": {\"b\": {\"type\": "
         "\"object\", \"properties\": {\"c\": {\"type\": \"object\", \"properties\": {\"d\": {\"type\": \"object\", "
         "\"properties\": {\"e\": {\"type\": \"object\", \"properties\": {\"f\": {\"type\": \"object\", \"properties\": "
         "{\"g\": {\"type\": \"object\", \"properties\": {\"h\": {\"type\": \"array\", \"items\": {\"type\": "
         "\"string\"}}}}}}}}}}}}}}}}}}", DDT_ERR_RANGE, "deeper than 8 (at $.properties.a.properties.b"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ddt_error err = {0};
        ddt_status st;
        ddt_json_schema *s = compile(bad[i].schema, &st, &err);
        if (st != bad[i].st || !strstr(err.msg, bad[i].words))
            fail_msg("schema %zu: status %d, message \"%s\" (want %d and \"%s\")", i, st, err.msg, bad[i].st,
                     bad[i].words);
        assert_null(s);
    }
}

/* 1: every byte steps with the schema and the end is complete. */
static int instance(const ddt_json_schema *sc, const char *text) {
    ddt_json_state s;
    ddt_json_init_schema(&s, sc);
    if (!ddt_json_feed(&s, (const uint8_t *)text, strlen(text))) return 0;
    return ddt_json_complete(&s);
}

static const char *const person =
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"}, "
    "\"score\": {\"type\": \"number\"}, \"ok\": {\"type\": \"boolean\"}, \"none\": {\"type\": \"null\"}, "
    "\"color\": {\"enum\": [\"red\", \"green\", \"gr\", \"blue\"]}, "
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}, "
    "\"pos\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}, \"y\": {\"type\": \"integer\"}}, "
    "\"required\": [\"x\", \"y\"]}, "
    "\"grid\": {\"type\": \"array\", \"items\": {\"type\": \"array\", \"items\": {\"type\": \"boolean\"}}}, "
    "\"empty\": {\"type\": \"object\", \"properties\": {}}}, "
    "\"required\": [\"name\", \"age\", \"score\", \"ok\", \"none\", \"color\", \"tags\", \"pos\", \"grid\", \"empty\"]}";

#define TAIL ", \"pos\": {\"x\": 1, \"y\": -2}, \"grid\": [[true], []], \"empty\": {}}"

static void test_stepping(void **state) {
    (void)state;
    ddt_error err = {0};
    ddt_status st;
    ddt_json_schema *sc = compile(person, &st, &err);
    if (st) fail_msg("%s", err.msg);
    static const char *const good[] = {
        "{\"name\": \"Ann \\\"A\\\" \\u00e9\", \"age\": 42, \"score\": -1.5e3, \"ok\": true, \"none\": null, "
        "\"color\": \"red\", \"tags\": [\"a\", \"b\"]" TAIL,
        "{\"name\":\"\",\"age\":-0,\"score\":7,\"ok\":false,\"none\":null,\"color\":\"gr\",\"tags\":[],"
        "\"pos\":{\"x\":0,\"y\":0},\"grid\":[],\"empty\":{}}",
        "{\n  \"name\": \"x\",\n  \"age\": 1,\n  \"score\": 0.5,\n  \"ok\": true,\n  \"none\": null,\n  \"color\": "
        "\"green\",\n  \"tags\": [ ]" TAIL,
        "{\"name\": \"x\", \"age\": 1, \"score\": 0.5, \"ok\": true, \"none\": null, \"color\": \"blue\", \"tags\": []" TAIL,
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (!instance(sc, good[i])) fail_msg("instance %zu refused: %s", i, good[i]);
    static const char *const bad[] = {
        /* wrong types */
        "{\"name\": 1, \"age\": 42, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": []" TAIL,
        "{\"name\": \"x\", \"age\": 4.5, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": []" TAIL,
        "{\"name\": \"x\", \"age\": 4e1, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": []" TAIL,
        "{\"name\": \"x\", \"age\": \"4\", \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": []" TAIL,
        "{\"name\": \"x\", \"age\": 4, \"score\": 1, \"ok\": null, \"none\": null, \"color\": \"red\", \"tags\": []" TAIL,
        "{\"name\": \"x\", \"age\": 4, \"score\": 1, \"ok\": true, \"none\": false, \"color\": \"red\", \"tags\": []" TAIL,
        "{\"name\": \"x\", \"age\": 4, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": [1]" TAIL,
        "{\"name\": \"x\", \"age\": 4, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": {}" TAIL,
        /* enum mismatches: another string, a prefix of one, one too long, an escape */
        "{\"name\": \"x\", \"age\": 4, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"pink\", \"tags\": []" TAIL,
        "{\"name\": \"x\", \"age\": 4, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"re\", \"tags\": []" TAIL,
        "{\"name\": \"x\", \"age\": 4, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"reds\", \"tags\": []" TAIL,
        "{\"name\": \"x\", \"age\": 4, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"\\u0072ed\", \"tags\": []" TAIL,
        /* a missing property (age), then one out of order, an extra one, a misspelt key, an early close */
        "{\"name\": \"x\", \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": []" TAIL,
        "{\"age\": 4, \"name\": \"x\", \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": []" TAIL,
        "{\"name\": \"x\", \"age\": 4, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": [], "
        "\"pos\": {\"x\": 1, \"y\": -2}, \"grid\": [[true], []], \"empty\": {}, \"more\": 1}",
        "{\"name\": \"x\", \"age\": 4, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": [], "
        "\"pos\": {\"x\": 1, \"y\": -2}, \"grid\": [[true], []], \"empty\": {\"z\": 1}}",
        "{\"nam\": \"x\", \"age\": 4, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": []" TAIL,
        "{\"names\": \"x\", \"age\": 4, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": []" TAIL,
        "{\"n\\u0061me\": \"x\", \"age\": 4, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": []" TAIL,
        "{\"name\": \"x\", \"age\": 4, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": [], "
        "\"pos\": {\"x\": 1}, \"grid\": [[true], []], \"empty\": {}}",
        "{}",
        "[]",
        /* and plain JSON errors still */
        "{\"name\": \"x\", \"age\": 4,, \"score\": 1, \"ok\": true, \"none\": null, \"color\": \"red\", \"tags\": []" TAIL,
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (instance(sc, bad[i])) fail_msg("non-instance %zu accepted: %s", i, bad[i]);
    /* a refused byte leaves the state as it was */
    ddt_json_state s, before;
    ddt_json_init_schema(&s, sc);
    assert_true(ddt_json_feed(&s, (const uint8_t *)"{\"name\": \"x\", \"age\": 4", 22));
    before = s;
    assert_false(ddt_json_step(&s, '.'));
    assert_false(ddt_json_step(&s, '}'));
    assert_memory_equal(&s, &before, sizeof s);
    assert_true(ddt_json_step(&s, ','));
    ddt_json_schema_free(sc);
}

/* The mask cache tells schema positions apart: after the first and the second
 * property's colon the plain grammar states are equal, the masks are not. */
static void test_mask_cache_schema(void **state) {
    (void)state;
    static const char *const toks[] = {"{", "}", "\"", "\"a\"", "\"b\"", ":", ",", "1", "1.5", "true", "x", "\"x\""};
    enum { NT = sizeof toks / sizeof *toks, V = NT + 1 };
    const uint8_t *bytes[V];
    size_t len[V];
    for (int i = 0; i < NT; i++) bytes[i] = (const uint8_t *)toks[i], len[i] = strlen(toks[i]);
    bytes[NT] = NULL, len[NT] = 0; /* the stop id */
    ddt_error err = {0};
    ddt_json_vocab *v = NULL;
    assert_int_equal(ddt_json_vocab_create_bytes(bytes, len, V, &v, &err), DDT_OK);
    ddt_status st;
    ddt_json_schema *sc = compile("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, "
                                  "\"b\": {\"type\": \"boolean\"}}, \"required\": [\"a\", \"b\"]}", &st, &err);
    assert_int_equal(st, DDT_OK);
    ddt_json_mask_cache *c = NULL;
    assert_int_equal(ddt_json_mask_cache_create(V, 8, &c, &err), DDT_OK);
    const int32_t stop = NT;
    ddt_json_state a, b;
    ddt_json_init_schema(&a, sc);
    assert_true(ddt_json_feed(&a, (const uint8_t *)"{\"a\":", 5));
    b = a;
    assert_true(ddt_json_feed(&b, (const uint8_t *)"1,\"b\":", 6));
    int32_t n = 0;
    const uint8_t *m = ddt_json_mask_cache_get(c, v, &a, &stop, 1, &n);
    assert_true(m[7] && !m[9] && !m[8]); /* "1" yes; "true" and "1.5" no */
    m = ddt_json_mask_cache_get(c, v, &b, &stop, 1, &n);
    assert_true(!m[7] && m[9] && !m[8]);
    /* the first key: only the property's name, not another string */
    ddt_json_init_schema(&a, sc);
    assert_true(ddt_json_feed(&a, (const uint8_t *)"{", 1));
    m = ddt_json_mask_cache_get(c, v, &a, &stop, 1, &n);
    assert_true(m[3] && !m[4] && !m[11] && m[2] && !m[1]);
    uint8_t want[V];
    assert_int_equal(ddt_json_vocab_mask(v, &a, &stop, 1, want), n);
    assert_memory_equal(m, want, V);
    ddt_json_mask_cache_free(c);
    ddt_json_schema_free(sc);
    ddt_json_vocab_free(v);
}

/* ---- the extended subset: schemas and documents below are written with ' for "
 * (none of them needs a '), so that they read as JSON. */

static char *unquote(const char *text) {
    char *b = strdup(text);
    assert_non_null(b);
    for (char *p = b; *p; p++)
        if (*p == '\'') *p = '"';
    return b;
}

static ddt_json_schema *compile_q(const char *text) {
    char *b = unquote(text);
    ddt_error err = {0};
    ddt_status st;
    ddt_json_schema *s = compile(b, &st, &err);
    if (st) fail_msg("schema refused: %s: %s", err.msg, b);
    free(b);
    return s;
}

static void refuses_q(const char *text, ddt_status want, const char *words) {
    char *b = unquote(text), *w = strdup(words);
    assert_non_null(w);
    for (char *p = w; *p; p++)
        if (*p == '`') *p = '"'; /* messages quote keywords with ', values with " */
    ddt_error err = {0};
    ddt_status st;
    ddt_json_schema *s = compile(b, &st, &err);
    if (st != want || !strstr(err.msg, w))
        fail_msg("schema %s: status %d, message \"%s\" (want %d and \"%s\")", b, st, err.msg, want, w);
    assert_null(s);
    free(b);
    free(w);
}

static int instance_q(const ddt_json_schema *sc, const char *text) {
    char *b = unquote(text);
    int r = instance(sc, b);
    free(b);
    return r;
}

static void want_instances(const ddt_json_schema *sc, const char *const *docs, size_t n, int want) {
    for (size_t i = 0; i < n; i++)
        if (instance_q(sc, docs[i]) != want) fail_msg("%s %zu %s: %s", want ? "instance" : "non-instance", i,
                                                      want ? "refused" : "accepted", docs[i]);
}

#define WANT(sc, docs, want) want_instances(sc, docs, sizeof docs / sizeof *docs, want)

/* A prefix of an instance never leads to a dead end: some byte steps, or the
 * document is complete (the engine would otherwise find no token to choose). */
static void assert_live(const ddt_json_state *s, const char *after) {
    if (ddt_json_complete(s)) return;
    for (int c = 0; c < 256; c++) {
        ddt_json_state t = *s;
        if (ddt_json_step(&t, (uint8_t)c)) return;
    }
    fail_msg("dead end after %s", after);
}

static uint32_t rng_next(uint32_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return *x;
}

/* Random walks through the schema's documents: each step takes a random byte of
 * those that step, and after a while the first of a few that close things, so
 * that most walks finish; every state on the way must be live.  Returns the
 * walks that ended complete. */
static int random_walks(const ddt_json_schema *sc, int walks, uint32_t seed) {
    static const uint8_t closing[] = "\"}]0,";
    int done = 0;
    for (int w = 0; w < walks; w++) {
        ddt_json_state s;
        ddt_json_init_schema(&s, sc);
        char text[4096];
        size_t len = 0;
        for (int steps = 0; steps < 3000 && len + 1 < sizeof text; steps++) {
            text[len] = '\0';
            assert_live(&s, text);
            if (ddt_json_complete(&s)) break;
            uint8_t ok[256];
            int n = 0;
            for (int c = 0; c < 256; c++) {
                ddt_json_state t = s;
                if (ddt_json_step(&t, (uint8_t)c)) ok[n++] = (uint8_t)c;
            }
            uint8_t pick = ok[rng_next(&seed) % (uint32_t)n];
            if (steps > 40 + w % 80)
                for (const uint8_t *p = closing; *p; p++) {
                    ddt_json_state t = s;
                    if (ddt_json_step(&t, *p)) {
                        pick = *p;
                        break;
                    }
                }
            assert_true(ddt_json_step(&s, pick));
            text[len++] = (char)pick;
        }
        done += ddt_json_complete(&s);
    }
    return done;
}

static void test_optional_properties(void **state) {
    (void)state;
    /* names that share prefixes, optional before and after a required one */
    ddt_json_schema *sc = compile_q("{'type': 'object', 'properties': {'id': {'type': 'integer'}, 'idx': {'type': "
                                    "'integer'}, 'i': {'type': 'integer'}, 'tail': {'type': 'string'}}, "
                                    "'required': ['i']}");
    static const char *const good[] = {
        "{'i': 1}", "{'id': 1, 'i': 2}", "{'idx': 1, 'i': 2}", "{'id': 1, 'idx': 2, 'i': 3}", "{'i': 1, 'tail': 'x'}",
        "{'id':0,'i':1,'tail':''}", "{ 'i' : 1 }",
    };
    static const char *const bad[] = {
        "{}", "{'idx': 1, 'id': 2, 'i': 3}", "{'i': 1, 'id': 2}", "{'tail': 'x', 'i': 1}", "{'i': 1, 'i': 2}",
        "{'id': 1}", "{'i': 1, 'tail': 'x', 'tail': 'y'}", "{'ix': 1, 'i': 2}", "{'i': 1,}", "{'id': 1, 'id': 1, 'i': 1}",
        "{'i': 1, 'other': 2}", "{'': 1, 'i': 1}",
    };
    WANT(sc, good, 1);
    WANT(sc, bad, 0);
    ddt_json_state s;
    ddt_json_init_schema(&s, sc);
    assert_true(ddt_json_feed(&s, (const uint8_t *)"{", 1));
    ddt_json_state t = s;
    assert_false(ddt_json_step(&t, '}')); /* "i" is due */
    assert_true(ddt_json_feed(&s, (const uint8_t *)"\"i\": 1", 6));
    t = s;
    assert_true(ddt_json_step(&t, '}'));
    t = s;
    assert_true(ddt_json_feed(&t, (const uint8_t *)", \"tail\": \"\"", 12));
    assert_false(ddt_json_step(&t, ',')); /* nothing left to write */
    assert_true(random_walks(sc, 200, 7) > 150);
    ddt_json_schema_free(sc);

    /* no "required": every property may be left out (JSON Schema), still in order */
    sc = compile_q("{'type': 'object', 'properties': {'a': {'type': 'integer'}, 'b': {'type': 'integer'}}}");
    static const char *const good2[] = {"{}", "{'a': 1}", "{'b': 2}", "{'a': 1, 'b': 2}"};
    static const char *const bad2[] = {"{'b': 1, 'a': 2}", "{'a': 1,}", "{,}", "{'c': 1}"};
    WANT(sc, good2, 1);
    WANT(sc, bad2, 0);
    ddt_json_schema_free(sc);

    /* every property required (OpenAI's strict mode): none may be missing */
    sc = compile_q("{'type': 'object', 'properties': {'a': {'type': 'integer'}, 'b': {'type': 'integer'}}, "
                   "'required': ['b', 'a']}");
    static const char *const good3[] = {"{'a': 1, 'b': 2}"};
    static const char *const bad3[] = {"{}", "{'a': 1}", "{'b': 2}", "{'b': 1, 'a': 2}"};
    WANT(sc, good3, 1);
    WANT(sc, bad3, 0);
    ddt_json_schema_free(sc);
}

static void test_types_and_enums(void **state) {
    (void)state;
    ddt_json_schema *sc = compile_q(
        "{'type': 'object', 'properties': {"
        "'n': {'type': ['string', 'null']}, 'v': {'type': ['integer', 'boolean']}, "
        "'e': {'enum': [1, 2.5, -3, 1e20, 2.0, 0.1, true, null, 'x', 'xy']}, 'c': {'const': 'fixed'}, "
        "'ci': {'type': 'integer', 'enum': [1, 1.5, 'a', 4.0]}, 'f': {'const': false}, "
        "'cs': {'type': 'string', 'maxLength': 2, 'enum': ['a', 'abc', 'xy']}, "
        "'any': {'type': ['object', 'array', 'number'], 'properties': {'p': {'type': 'null'}}, 'items': {'type': 'null'}}}, "
        "'required': ['n', 'v', 'e', 'c', 'ci', 'f', 'cs', 'any']}");
    /* one document per value, the others at a default */
#define DOC(n, v, e, c, ci, f, cs, any) \
    "{'n': " n ", 'v': " v ", 'e': " e ", 'c': " c ", 'ci': " ci ", 'f': " f ", 'cs': " cs ", 'any': " any "}"
    static const char *const good[] = {
        DOC("null", "5", "1", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("'s'", "true", "2.5", "'fixed'", "4", "false", "'xy'", "[]"),
        DOC("''", "false", "-3", "'fixed'", "1", "false", "'a'", "{'p': null}"),
        DOC("null", "-0", "1e+20", "'fixed'", "1", "false", "'a'", "[null, null]"),
        DOC("null", "5", "2", "'fixed'", "1", "false", "'a'", "-1.5e3"),
        DOC("null", "5", "0.1", "'fixed'", "1", "false", "'a'", "0"),
        DOC("null", "5", "true", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "null", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "'x'", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "'xy'", "'fixed'", "1", "false", "'a'", "{}"),
    };
    static const char *const bad[] = {
        DOC("1", "5", "1", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "1.5", "1", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "'5'", "1", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "null", "1", "'fixed'", "1", "false", "'a'", "{}"),
        /* enum numbers are matched in their canonical text only */
        DOC("null", "5", "1.0", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "2.50", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "2.0", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "10", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "3", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "-", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "1e20", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "false", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "'y'", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "'x '", "'fixed'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "1", "'fixe'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "1", "'fixed2'", "1", "false", "'a'", "{}"),
        DOC("null", "5", "1", "null", "1", "false", "'a'", "{}"),
        /* beside "type": "integer", 1.5 and "a" are dropped, 4.0 kept as 4 */
        DOC("null", "5", "1", "'fixed'", "1.5", "false", "'a'", "{}"),
        DOC("null", "5", "1", "'fixed'", "'a'", "false", "'a'", "{}"),
        DOC("null", "5", "1", "'fixed'", "4.0", "false", "'a'", "{}"),
        DOC("null", "5", "1", "'fixed'", "1", "true", "'a'", "{}"),
        /* beside maxLength 2, "abc" is dropped */
        DOC("null", "5", "1", "'fixed'", "1", "false", "'abc'", "{}"),
        DOC("null", "5", "1", "'fixed'", "1", "false", "'a'", "'s'"),
        DOC("null", "5", "1", "'fixed'", "1", "false", "'a'", "[1]"),
        DOC("null", "5", "1", "'fixed'", "1", "false", "'a'", "{'p': 1}"),
        DOC("null", "5", "1", "'fixed'", "1", "false", "'a'", "true"),
    };
#undef DOC
    WANT(sc, good, 1);
    WANT(sc, bad, 0);
    assert_true(random_walks(sc, 200, 11) > 150);
    ddt_json_schema_free(sc);
}

static void test_any_of(void **state) {
    (void)state;
    ddt_json_schema *sc = compile_q(
        "{'type': 'object', 'properties': {"
        "'a': {'anyOf': [{'type': 'string', 'maxLength': 3}, {'type': 'object', 'properties': {'k': {'type': "
        "'integer'}}, 'required': ['k']}, {'type': 'null'}, {'type': 'number', 'description': 'd'}], 'title': 't'}, "
        "'b': {'oneOf': [{'const': true}, {'type': 'array', 'items': {'type': 'integer'}, 'maxItems': 2}]}, "
        "'c': {'anyOf': [{'anyOf': [{'type': 'integer'}, {'type': 'null'}]}, {'type': 'string', 'enum': ['p', 'q']}]}}, "
        "'required': ['a', 'b', 'c']}");
    static const char *const good[] = {
        "{'a': 'abc', 'b': true, 'c': 3}", "{'a': {'k': 1}, 'b': [], 'c': null}", "{'a': null, 'b': [1, 2], 'c': 'p'}",
        "{'a': 1.5, 'b': [7], 'c': 'q'}", "{'a': -2, 'b': true, 'c': -0}", "{'a': '', 'b': true, 'c': 1}",
    };
    static const char *const bad[] = {
        "{'a': 'abcd', 'b': true, 'c': 3}", "{'a': {}, 'b': true, 'c': 3}", "{'a': {'k': '1'}, 'b': true, 'c': 3}",
        "{'a': true, 'b': true, 'c': 3}", "{'a': [1], 'b': true, 'c': 3}", "{'a': null, 'b': false, 'c': 3}",
        "{'a': null, 'b': [1, 2, 3], 'c': 3}", "{'a': null, 'b': ['x'], 'c': 3}", "{'a': null, 'b': null, 'c': 3}",
        "{'a': null, 'b': true, 'c': 1.5}", "{'a': null, 'b': true, 'c': 'r'}", "{'a': null, 'b': true, 'c': false}",
    };
    WANT(sc, good, 1);
    WANT(sc, bad, 0);
    assert_true(random_walks(sc, 200, 13) > 150);
    ddt_json_schema_free(sc);
    /* pydantic's Optional[str]: anyOf beside default and title */
    sc = compile_q("{'type': 'object', 'properties': {'x': {'anyOf': [{'type': 'string'}, {'type': 'null'}], "
                   "'default': null, 'title': 'X'}}, 'required': ['x'], 'title': 'M'}");
    static const char *const good2[] = {"{'x': null}", "{'x': 'y'}"};
    static const char *const bad2[] = {"{}", "{'x': 1}"};
    WANT(sc, good2, 1);
    WANT(sc, bad2, 0);
    ddt_json_schema_free(sc);
}

static void test_refs_and_recursion(void **state) {
    (void)state;
    /* a linked list through $defs, the root itself a $ref */
    ddt_json_schema *sc = compile_q(
        "{'$defs': {'node': {'type': 'object', 'properties': {'v': {'type': 'integer'}, 'next': {'anyOf': "
        "[{'$ref': '#/$defs/node'}, {'type': 'null'}]}}, 'required': ['v', 'next']}}, '$ref': '#/$defs/node'}");
    static const char *const good[] = {
        "{'v': 1, 'next': null}", "{'v': 1, 'next': {'v': 2, 'next': null}}",
        /* eight objects: the nesting limit */
        ("{'v':1,'next':{'v':2,'next':{'v':3,'next':{'v':4,'next':{'v':5,'next':{'v':6,'next':{'v':7,'next':"
         "{'v':8,'next':null}}}}}}}}"),
    };
    static const char *const bad[] = {
        "{'v': 1}", "{'v': 1, 'next': {'v': 2}}", "{'v': 1, 'next': 1}",
        ("{'v':1,'next':{'v':2,'next':{'v':3,'next':{'v':4,'next':{'v':5,'next':{'v':6,'next':{'v':7,'next':"
         "{'v':8,'next':{'v':9,'next':null}}}}}}}}}"),
    };
    WANT(sc, good, 1);
    WANT(sc, bad, 0);
    assert_true(random_walks(sc, 100, 17) > 70);
    ddt_json_schema_free(sc);

    /* a node that needs two containers (itself and its "v"): at depth 7 the anyOf's
     * object branch no longer fits, though the anyOf does (its null branch) */
    sc = compile_q("{'$defs': {'n': {'type': 'object', 'properties': {'v': {'type': 'object', 'properties': {}}, "
                   "'next': {'anyOf': [{'$ref': '#/$defs/n'}, {'type': 'null'}]}}, 'required': ['v', 'next']}}, "
                   "'$ref': '#/$defs/n'}");
    {
        ddt_json_state a, b;
        ddt_json_init_schema(&a, sc);
        for (int i = 0; i < 6; i++) assert_true(ddt_json_feed(&a, (const uint8_t *)"{\"v\":{},\"next\":", 15));
        b = a;
        assert_true(ddt_json_feed(&b, (const uint8_t *)"{\"v\":{},\"next\":", 15));
        assert_int_equal(b.depth, 7);
        a = b;
        assert_false(ddt_json_step(&b, '{'));
        assert_true(ddt_json_feed(&b, (const uint8_t *)"null}}}}}}}", 11));
        assert_true(ddt_json_complete(&b));
        assert_true(random_walks(sc, 100, 31) > 70);
    }
    ddt_json_schema_free(sc);
    /* the same through an array's first item: R needs itself and its "o", so an
     * array at depth 7 takes no R (at depth 5 it does) but closes */
    sc = compile_q("{'type': 'object', 'properties': {'x': {'type': 'object', 'properties': {'l': {'type': 'array', "
                   "'items': {'$ref': '#/$defs/R'}}}}}, '$defs': {'R': {'type': 'object', 'properties': {'l': {'type': "
                   "'array', 'items': {'$ref': '#/$defs/R'}}, 'o': {'type': 'object', 'properties': {}}}, "
                   "'required': ['o']}}}");
    {
        ddt_json_state a;
        ddt_json_init_schema(&a, sc);
        assert_true(ddt_json_feed(&a, (const uint8_t *)"{\"x\":{\"l\":[{\"l\":[", 17));
        assert_int_equal(a.depth, 5);
        ddt_json_state b = a;
        assert_true(ddt_json_step(&b, '{'));
        assert_true(ddt_json_feed(&a, (const uint8_t *)"{\"l\":[", 6));
        assert_int_equal(a.depth, 7);
        b = a;
        assert_false(ddt_json_step(&b, '{'));
        static const char close[] = "],\"o\":{}}],\"o\":{}}]}}";
        assert_true(ddt_json_feed(&a, (const uint8_t *)close, strlen(close)));
        assert_true(ddt_json_complete(&a));
        assert_true(random_walks(sc, 100, 37) > 70);
    }
    ddt_json_schema_free(sc);

    /* a tree through "#": at depth 8 (an array) no object fits any more, ']' does */
    sc = compile_q("{'type': 'object', 'properties': {'name': {'type': 'string'}, 'kids': {'type': 'array', "
                   "'items': {'$ref': '#'}}}, 'required': ['name', 'kids']}");
    static const char *const good2[] = {
        "{'name': 'a', 'kids': []}", "{'name': 'a', 'kids': [{'name': 'b', 'kids': []}, {'name': 'c', 'kids': []}]}",
    };
    WANT(sc, good2, 1);
    static const char deep[] = "{\"name\":\"\",\"kids\":[{\"name\":\"\",\"kids\":[{\"name\":\"\",\"kids\":"
                               "[{\"name\":\"\",\"kids\":[";
    ddt_json_state s;
    ddt_json_init_schema(&s, sc);
    assert_true(ddt_json_feed(&s, (const uint8_t *)deep, strlen(deep)));
    assert_int_equal(s.depth, 8);
    ddt_json_state t = s;
    assert_false(ddt_json_step(&t, '{'));
    assert_true(ddt_json_step(&t, ']'));
    /* one level up (depth 6, an array) an object still fits: it needs its kids array, depth 8 */
    ddt_json_init_schema(&s, sc);
    assert_true(ddt_json_feed(&s, (const uint8_t *)deep, strlen(deep) - 19));
    assert_int_equal(s.depth, 6);
    assert_true(ddt_json_step(&s, '{'));
    assert_true(random_walks(sc, 100, 19) > 70);
    ddt_json_schema_free(sc);

    /* an optional self: at depth 8 the property no longer fits, the object closes */
    sc = compile_q("{'type': 'object', 'properties': {'self': {'$ref': '#'}, 'x': {'type': 'integer'}}}");
    ddt_json_init_schema(&s, sc);
    for (int i = 0; i < 7; i++) assert_true(ddt_json_feed(&s, (const uint8_t *)"{\"self\":", 8));
    assert_true(ddt_json_step(&s, '{'));
    assert_int_equal(s.depth, 8);
    t = s;
    assert_true(ddt_json_feed(&t, (const uint8_t *)"\"x\"", 3)); /* x fits, self does not */
    t = s;
    assert_false(ddt_json_feed(&t, (const uint8_t *)"\"s", 2));
    t = s;
    assert_true(ddt_json_feed(&t, (const uint8_t *)"}}}}}}}}", 8));
    assert_true(ddt_json_complete(&t));
    assert_true(random_walks(sc, 100, 23) > 70);
    ddt_json_schema_free(sc);

    /* "definitions", a pointer escape (~1 for '/'), a chain of $refs back to "#",
     * and a $ref to an inline schema */
    sc = compile_q("{'$ref': '#/definitions/a~1b', 'definitions': {'a/b': {'$ref': '#/definitions/c'}, 'c': {'type': "
                   "'object', 'properties': {'again': {'$ref': '#'}, 'y': {'$ref': '#/definitions/c/properties/z'}, "
                   "'z': {'type': 'boolean'}}}}}");
    static const char *const good3[] = {"{}", "{'again': {'again': {}}, 'y': true}", "{'y': false, 'z': true}"};
    static const char *const bad3[] = {"{'again': 1}", "{'y': 1}", "{'z': true, 'y': false}"};
    WANT(sc, good3, 1);
    WANT(sc, bad3, 0);
    ddt_json_schema_free(sc);
}

static void test_bounds(void **state) {
    (void)state;
    ddt_json_schema *sc = compile_q(
        "{'type': 'object', 'properties': {"
        "'a': {'type': 'array', 'items': {'type': 'integer'}, 'minItems': 2, 'maxItems': 3}, "
        "'s': {'type': 'string', 'minLength': 2, 'maxLength': 3}, "
        "'z': {'type': 'array', 'items': {'type': 'string'}, 'maxItems': 0}, "
        "'m': {'type': 'string', 'minLength': 1.0}, 'l': {'type': 'array', 'items': {'type': 'null'}, 'minItems': 1}}, "
        "'required': ['a', 's', 'z', 'm', 'l']}");
    static const char *const good[] = {
        "{'a': [1, 2], 's': 'ab', 'z': [], 'm': 'x', 'l': [null]}",
        "{'a': [1, 2, 3], 's': 'abc', 'z': [ ], 'm': 'xyz', 'l': [null, null, null, null, null]}",
        /* characters, not bytes: two of 2, 3 and 4 bytes; escapes count once */
        "{'a': [1, 2], 's': '\xc3\xa9\xe4\xb8\xad', 'z': [], 'm': '\\n', 'l': [null]}",
        "{'a': [1, 2], 's': 'a\xf0\x9f\x98\x80', 'z': [], 'm': '\\u00e9', 'l': [null]}",
        "{'a': [1, 2], 's': '\\n\\u00e9\\'', 'z': [], 'm': 'x', 'l': [null]}",
    };
    static const char *const bad[] = {
        "{'a': [], 's': 'ab', 'z': [], 'm': 'x', 'l': [null]}",
        "{'a': [1], 's': 'ab', 'z': [], 'm': 'x', 'l': [null]}",
        "{'a': [1, 2, 3, 4], 's': 'ab', 'z': [], 'm': 'x', 'l': [null]}",
        "{'a': [1, 2], 's': 'a', 'z': [], 'm': 'x', 'l': [null]}",
        "{'a': [1, 2], 's': 'abcd', 'z': [], 'm': 'x', 'l': [null]}",
        "{'a': [1, 2], 's': '\xc3\xa9', 'z': [], 'm': 'x', 'l': [null]}",
        "{'a': [1, 2], 's': '\\n\\n\\n\\n', 'z': [], 'm': 'x', 'l': [null]}",
        "{'a': [1, 2], 's': 'ab', 'z': [''], 'm': 'x', 'l': [null]}",
        "{'a': [1, 2], 's': 'ab', 'z': [], 'm': '', 'l': [null]}",
        "{'a': [1, 2], 's': 'ab', 'z': [], 'm': 'x', 'l': []}",
        /* a surrogate escape in a bounded string (a pair would be one character to Python, two here) */
        "{'a': [1, 2], 's': '\\ud83d\\ude00', 'z': [], 'm': 'x', 'l': [null]}",
        "{'a': [1, 2], 's': 'ab', 'z': [], 'm': '\\uDC00', 'l': [null]}",
    };
    WANT(sc, good, 1);
    WANT(sc, bad, 0);
    assert_true(random_walks(sc, 200, 29) > 150);
    /* the item count is kept only as far as the bounds need it: unbounded arrays keep one state */
    ddt_json_schema_free(sc);
    sc = compile_q("{'type': 'object', 'properties': {'a': {'type': 'array', 'items': {'type': 'integer'}}}, "
                   "'required': ['a']}");
    ddt_json_state s, t;
    ddt_json_init_schema(&s, sc);
    assert_true(ddt_json_feed(&s, (const uint8_t *)"{\"a\": [1", 8));
    t = s;
    assert_true(ddt_json_feed(&t, (const uint8_t *)", 1, 1", 6));
    assert_memory_equal(&s, &t, sizeof s);
    /* and a surrogate escape is fine in a string without bounds */
    ddt_json_schema_free(sc);
    sc = compile_q("{'type': 'object', 'properties': {'s': {'type': 'string'}}}");
    assert_true(instance_q(sc, "{'s': '\\ud83d\\ude00'}"));
    ddt_json_schema_free(sc);
}

static void test_compile_refuses_extended(void **state) {
    (void)state;
    static const struct {
        const char *schema;
        ddt_status st;
        const char *words;
    } bad[] = {
        /* type lists */
        {"{'type': 'object', 'properties': {'a': {'type': []}}}", DDT_ERR_INVALID, "'type' at $.properties.a is an empty list"},
        {"{'type': 'object', 'properties': {'a': {'type': ['null', 'null']}}}", DDT_ERR_INVALID,
         "'type' at $.properties.a lists `null` twice"},
        {"{'type': 'object', 'properties': {'a': {'type': ['null', 'nul']}}}", DDT_ERR_INVALID,
         "'type' at $.properties.a: item 1 is `nul`"},
        {"{'type': 'object', 'properties': {'a': {'type': ['null', 3]}}}", DDT_ERR_INVALID,
         "'type' at $.properties.a: item 1 is not a string"},
        {"{'type': ['object', 'null'], 'properties': {}}", DDT_ERR_UNSUPPORTED,
         "the root schema must have `type`: `object` (an object and no other type)"},
        {"{'type': 'object', 'properties': {'a': {'type': ['string', 'array']}}}", DDT_ERR_UNSUPPORTED,
         "array at $.properties.a has no 'items'"},
        /* enum and const */
        {"{'type': 'object', 'properties': {'a': {'enum': [1, [2]]}}}", DDT_ERR_UNSUPPORTED,
         "'enum' at $.properties.a: item 1 is an array (only strings, numbers, true, false and null"},
        {"{'type': 'object', 'properties': {'a': {'const': {}}}}", DDT_ERR_UNSUPPORTED,
         "'const' at $.properties.a: item 0 is an object"},
        {"{'type': 'object', 'properties': {'a': {'const': 1, 'enum': [1]}}}", DDT_ERR_UNSUPPORTED,
         "'enum' and 'const' together at $.properties.a"},
        {"{'type': 'object', 'properties': {'a': {'type': 'boolean', 'const': null}}}", DDT_ERR_INVALID,
         "'const' at $.properties.a: no value fits"},
        {"{'type': 'object', 'properties': {'a': {'type': 'integer', 'enum': [1.5, 2.25]}}}", DDT_ERR_INVALID,
         "'enum' at $.properties.a: no value fits"},
        {"{'type': 'object', 'properties': {'a': {'type': 'string', 'minLength': 4, 'enum': ['abc']}}}",
         DDT_ERR_INVALID, "'enum' at $.properties.a: no value fits the schema's 'type', 'minLength' and 'maxLength'"},
        {"{'type': 'object', 'properties': {'a': {'enum': 'x'}}}", DDT_ERR_INVALID,
         "'enum' at $.properties.a must be a non-empty array"},
        /* anyOf / oneOf */
        {"{'type': 'object', 'properties': {'a': {'anyOf': [{'type': 'string'}, {'enum': ['x', 1]}]}}}",
         DDT_ERR_UNSUPPORTED, "'anyOf' at $.properties.a: branches 0 and 1 can both start with a string"},
        {"{'type': 'object', 'properties': {'a': {'anyOf': [{'type': 'integer'}, {'type': 'number'}]}}}",
         DDT_ERR_UNSUPPORTED, "'anyOf' at $.properties.a: branches 0 and 1 can both start with a number"},
        {"{'type': 'object', 'properties': {'a': {'oneOf': [{'type': 'null'}, {'type': 'boolean'}, {'const': false}]}}}",
         DDT_ERR_UNSUPPORTED, "'oneOf' at $.properties.a: branches 1 and 2 can both start with false"},
        {"{'type': 'object', 'properties': {'a': {'oneOf': [{'type': 'object', 'properties': {}}, {'type': 'object', "
         "'properties': {'b': {'type': 'null'}}}]}}}",
         DDT_ERR_UNSUPPORTED, "'oneOf' at $.properties.a: branches 0 and 1 can both start with an object"},
        {"{'type': 'object', 'properties': {'a': {'anyOf': []}}}", DDT_ERR_INVALID,
         "'anyOf' at $.properties.a must be a non-empty array of schemas"},
        {"{'type': 'object', 'properties': {'a': {'anyOf': [{'type': 'null'}], 'oneOf': [{'type': 'null'}]}}}",
         DDT_ERR_UNSUPPORTED, "'oneOf' beside 'anyOf' at $.properties.a"},
        {"{'type': 'object', 'properties': {'a': {'anyOf': [{'type': 'null'}, {'type': 'string', 'pattern': 'x'}]}}}",
         DDT_ERR_UNSUPPORTED, "unsupported keyword 'pattern' at $.properties.a.anyOf[1]"},
        {"{'type': 'object', 'properties': {'a': {'allOf': [{'type': 'null'}]}}}", DDT_ERR_UNSUPPORTED,
         "the schema at $.properties.a has no 'type'"},
        {"{'type': 'object', 'properties': {'a': {'type': 'null', 'not': {'type': 'null'}}}}", DDT_ERR_UNSUPPORTED,
         "unsupported keyword 'not' at $.properties.a"},
        /* $ref and $defs */
        {"{'type': 'object', 'properties': {'a': {'$ref': 'other.json#/x'}}}", DDT_ERR_UNSUPPORTED,
         "'$ref' at $.properties.a is `other.json#/x` (only references inside the schema"},
        {"{'type': 'object', 'properties': {'a': {'$ref': '#/$defs/b'}}, '$defs': {}}", DDT_ERR_INVALID,
         "'$ref' at $.properties.a: `#/$defs/b` points to nothing in the schema"},
        {"{'type': 'object', 'properties': {'a': {'$ref': '#/$defs/b'}}, '$defs': {'b': 3}}", DDT_ERR_INVALID,
         "'$ref' at $.properties.a: `#/$defs/b` points to something that is not a schema"},
        {"{'type': 'object', 'properties': {'a': {'$ref': '#/$defs/b%20c'}}}", DDT_ERR_UNSUPPORTED,
         "'$ref' at $.properties.a: `#/$defs/b%20c` is percent-encoded"},
        {"{'type': 'object', 'properties': {'a': {'$ref': '#/$defs/b~2'}}, '$defs': {}}", DDT_ERR_INVALID,
         "has a '~' that is not ~0 or ~1"},
        {"{'type': 'object', 'properties': {'a': {'$ref': 7}}}", DDT_ERR_INVALID, "'$ref' at $.properties.a must be a string"},
        {"{'type': 'object', 'properties': {'a': {'$ref': '#/$defs/b'}}, '$defs': {'b': {'$ref': '#/$defs/c'}, "
         "'c': {'$ref': '#/$defs/b'}}}", DDT_ERR_UNSUPPORTED,
         "'$ref' at $.$defs.c: `#/$defs/b` comes back to itself through $ref alone"},
        {"{'type': 'object', 'properties': {'a': {'$ref': '#/$defs/b'}}, '$defs': {'b': {'anyOf': [{'type': 'null'}, "
         "{'$ref': '#/$defs/b'}]}}}", DDT_ERR_UNSUPPORTED,
         "'anyOf' at $.$defs.b: branch 1 comes back to this anyOf through $ref with no container in between"},
        {"{'type': 'object', 'properties': {'a': {'$ref': '#/$defs/b'}}, '$defs': {'b': {'type': 'string', "
         "'format': 'date'}}}", DDT_ERR_UNSUPPORTED, "unsupported keyword 'format' at $.$defs.b"},
        {"{'type': 'object', 'properties': {}, '$defs': []}", DDT_ERR_INVALID, "'$defs' at $ must be an object of schemas"},
        {"{'type': 'object', 'properties': {'a': {'$ref': '#', 'type': 'object'}}}", DDT_ERR_UNSUPPORTED,
         "'type' beside '$ref' at $.properties.a"},
        {"{'$ref': '#/$defs/s', '$defs': {'s': {'type': 'string'}}}", DDT_ERR_UNSUPPORTED,
         "the root schema must have `type`: `object`"},
        /* recursion that every instance must follow past the nesting limit */
        {"{'type': 'object', 'properties': {'self': {'$ref': '#'}}, 'required': ['self']}", DDT_ERR_RANGE,
         "every instance of the schema nests containers deeper than 8"},
        {"{'type': 'object', 'properties': {'a': {'type': 'array', 'items': {'$ref': '#'}, 'minItems': 1}}, "
         "'required': ['a']}", DDT_ERR_RANGE, "every instance of the schema nests containers deeper than 8"},
        /* bounds */
        {"{'type': 'object', 'properties': {'a': {'type': 'array', 'items': {'type': 'null'}, 'minItems': 1.5}}}",
         DDT_ERR_INVALID, "'minItems' at $.properties.a must be a non-negative integer"},
        {"{'type': 'object', 'properties': {'a': {'type': 'array', 'items': {'type': 'null'}, 'maxItems': -1}}}",
         DDT_ERR_INVALID, "'maxItems' at $.properties.a must be a non-negative integer"},
        {"{'type': 'object', 'properties': {'a': {'type': 'array', 'items': {'type': 'null'}, 'maxItems': 70000}}}",
         DDT_ERR_RANGE, "'maxItems' at $.properties.a is past 65534"},
        {"{'type': 'object', 'properties': {'a': {'type': 'array', 'items': {'type': 'null'}, 'minItems': 3, "
         "'maxItems': 2}}}", DDT_ERR_INVALID, "'minItems' at $.properties.a is more than 'maxItems'"},
        {"{'type': 'object', 'properties': {'a': {'type': 'string', 'minLength': 3, 'maxLength': 2}}}",
         DDT_ERR_INVALID, "'minLength' at $.properties.a is more than 'maxLength'"},
        {"{'type': 'object', 'properties': {'a': {'type': 'string', 'maxLength': '3'}}}", DDT_ERR_INVALID,
         "'maxLength' at $.properties.a must be a non-negative integer"},
        {"{'type': 'object', 'properties': {'a': {'type': 'integer', 'minLength': 3}}}", DDT_ERR_UNSUPPORTED,
         "unsupported keyword 'minLength' at $.properties.a"},
        {"{'type': 'object', 'properties': {'a': {'type': 'string', 'minItems': 3}}}", DDT_ERR_UNSUPPORTED,
         "unsupported keyword 'minItems' at $.properties.a"},
        /* annotations are typed where JSON Schema types them */
        {"{'type': 'object', 'properties': {}, '$comment': 3}", DDT_ERR_INVALID, "'$comment' at $ must be a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) refuses_q(bad[i].schema, bad[i].st, bad[i].words);
    /* anyOf nests sub-schemas without containers: the compiler's recursion is bounded too */
    char deep[8192];
    size_t n = (size_t)snprintf(deep, sizeof deep, "{'type': 'object', 'properties': {'a': ");
    for (int i = 0; i < 200; i++) n += (size_t)snprintf(deep + n, sizeof deep - n, "{'anyOf': [");
    n += (size_t)snprintf(deep + n, sizeof deep - n, "{'type': 'null'}");
    for (int i = 0; i < 200; i++) n += (size_t)snprintf(deep + n, sizeof deep - n, "]}");
    snprintf(deep + n, sizeof deep - n, "}}");
    refuses_q(deep, DDT_ERR_RANGE, "the schema nests sub-schemas (properties, items, anyOf, $ref) deeper than 128");
}

/* The mask cache keeps apart the states the new forms add: an array's item count
 * (only up to its bounds) and the position among optional properties. */
static void test_mask_cache_bounds(void **state) {
    (void)state;
    static const char *const toks[] = {"[", "]", ",", "1", "{", "}", "\"a\"", "\"b\"", ":", "\"a\":1"};
    enum { NT = sizeof toks / sizeof *toks, V = NT + 1 };
    const uint8_t *bytes[V];
    size_t len[V];
    for (int i = 0; i < NT; i++) bytes[i] = (const uint8_t *)toks[i], len[i] = strlen(toks[i]);
    bytes[NT] = NULL, len[NT] = 0;
    ddt_error err = {0};
    ddt_json_vocab *v = NULL;
    assert_int_equal(ddt_json_vocab_create_bytes(bytes, len, V, &v, &err), DDT_OK);
    ddt_json_schema *sc = compile_q("{'type': 'object', 'properties': {'a': {'type': 'array', 'items': {'type': "
                                    "'integer'}, 'minItems': 2, 'maxItems': 3}, 'b': {'type': 'integer'}}, "
                                    "'required': ['a']}");
    ddt_json_mask_cache *c = NULL;
    assert_int_equal(ddt_json_mask_cache_create(V, 8, &c, &err), DDT_OK);
    const int32_t stop = NT;
    ddt_json_state s1, s2, s3;
    ddt_json_init_schema(&s1, sc);
    assert_true(ddt_json_feed(&s1, (const uint8_t *)"{\"a\":[1", 7));
    s2 = s1;
    assert_true(ddt_json_feed(&s2, (const uint8_t *)",1", 2));
    s3 = s2;
    assert_true(ddt_json_feed(&s3, (const uint8_t *)",1", 2));
    int32_t n = 0;
    const uint8_t *m = ddt_json_mask_cache_get(c, v, &s1, &stop, 1, &n);
    assert_true(m[2] && !m[1]); /* one item: ',' yes, ']' no */
    m = ddt_json_mask_cache_get(c, v, &s2, &stop, 1, &n);
    assert_true(m[2] && m[1]);
    m = ddt_json_mask_cache_get(c, v, &s3, &stop, 1, &n);
    assert_true(!m[2] && m[1]); /* three: ']' only */
    /* after the array: '}' (b optional) or ','; after {"a":[1,1],"b":1 only '}' */
    assert_true(ddt_json_feed(&s2, (const uint8_t *)"]", 1));
    m = ddt_json_mask_cache_get(c, v, &s2, &stop, 1, &n);
    assert_true(m[5] && m[2]);
    assert_true(ddt_json_feed(&s2, (const uint8_t *)",\"b\":1", 6));
    m = ddt_json_mask_cache_get(c, v, &s2, &stop, 1, &n);
    assert_true(m[5] && !m[2]);
    uint8_t want[V];
    assert_int_equal(ddt_json_vocab_mask(v, &s2, &stop, 1, want), n);
    assert_memory_equal(m, want, V);
    ddt_json_mask_cache_free(c);
    ddt_json_schema_free(sc);
    ddt_json_vocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compile_accepts),
        cmocka_unit_test(test_compile_refuses),
        cmocka_unit_test(test_stepping),
        cmocka_unit_test(test_mask_cache_schema),
        cmocka_unit_test(test_optional_properties),
        cmocka_unit_test(test_types_and_enums),
        cmocka_unit_test(test_any_of),
        cmocka_unit_test(test_refs_and_recursion),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_compile_refuses_extended),
        cmocka_unit_test(test_mask_cache_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
