/*
 * test_json_schema.c — the schema subset of response_format json_schema: the
 * compiler (text/json_schema.h) on schemas it accepts and on ones it refuses,
 * each refusal's message checked for the keyword and its path; and the
 * recogniser (text/json_grammar.h) stepping with a schema, on instances it must
 * accept and on documents it must refuse (wrong type, missing, extra or
 * out-of-order property, enum mismatch, a fraction in an integer), plus the
 * mask cache keeping states of two schema positions apart.
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
        assert_int_equal(s->nodes[0].type, DDT_JS_OBJECT);
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
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"$ref\": \"#/x\"}}}", DDT_ERR_UNSUPPORTED,
         "schema at $.properties.a has no 'type'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"$ref\": \"#/x\"}}}",
         DDT_ERR_UNSUPPORTED, "unsupported keyword '$ref' at $.properties.a"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"anyOf\": []}}}", DDT_ERR_UNSUPPORTED,
         "unsupported keyword 'anyOf' at $.properties.a"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"x\"}}}",
         DDT_ERR_UNSUPPORTED, "unsupported keyword 'pattern' at $.properties.a"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\", \"items\": {\"type\": \"string\", "
         "\"format\": \"date\"}}}}", DDT_ERR_UNSUPPORTED, "unsupported keyword 'format' at $.properties.a.items"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\"}}}", DDT_ERR_UNSUPPORTED,
         "array at $.properties.a has no 'items'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"items\": {\"type\": \"string\"}}}}",
         DDT_ERR_UNSUPPORTED, "unsupported keyword 'items' at $.properties.a"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": [\"string\", \"null\"]}}}", DDT_ERR_UNSUPPORTED,
         "'type' at $.properties.a is a list"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"str\"}}}", DDT_ERR_INVALID,
         "'type' at $.properties.a is \"str\""},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"enum\": [1, 2]}}}", DDT_ERR_UNSUPPORTED,
         "'enum' at $.properties.a: item 0 is not a string"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"enum\": []}}}", DDT_ERR_INVALID,
         "'enum' at $.properties.a must be a non-empty array"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\", \"enum\": [\"1\"]}}}",
         DDT_ERR_UNSUPPORTED, "'enum' at $.properties.a with type \"integer\""},
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
    "\"pos\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}, \"y\": {\"type\": \"integer\"}}}, "
    "\"grid\": {\"type\": \"array\", \"items\": {\"type\": \"array\", \"items\": {\"type\": \"boolean\"}}}, "
    "\"empty\": {\"type\": \"object\", \"properties\": {}}}}";

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
                                  "\"b\": {\"type\": \"boolean\"}}}", &st, &err);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compile_accepts),
        cmocka_unit_test(test_compile_refuses),
        cmocka_unit_test(test_stepping),
        cmocka_unit_test(test_mask_cache_schema),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
