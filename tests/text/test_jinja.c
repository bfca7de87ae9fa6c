/*
 * test_jinja.c — unit tests of the Jinja2 subset (src/text/jinja.c): whitespace
 * control, statements, expressions, filters and methods, undefined values,
 * errors with their line and column, the bounds (steps, ranges, nesting,
 * output), and the data mask.  The byte-for-byte comparison with Python's
 * jinja2 is in tests/python/test_jinja.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "text/jinja.h"

/* ------------------------------------------------------------------ helpers */

static json_t *js(const char *text) {
    if (!text) return NULL;
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j) fail_msg("bad test JSON: %s", e.text);
    return j;
}

/* Renders src with the two contexts (JSON text or NULL); returns the status,
 * fills out (caller frees) and err. */
static ddt_status render(const char *src, const char *data, const char *trusted, ddt_jinja_text *out, ddt_error *err) {
    ddt_jinja *t = NULL;
    ddt_status st = ddt_jinja_parse(src, strlen(src), &t, err);
    memset(out, 0, sizeof *out);
    if (st != DDT_OK) {
        assert_null(t);
        return st;
    }
    json_t *d = js(data), *tr = js(trusted);
    st = ddt_jinja_render(t, d, tr, out, err);
    if (st != DDT_OK) {
        assert_null(out->bytes);
        assert_int_equal(out->len, 0);
    }
    json_decref(d);
    json_decref(tr);
    ddt_jinja_free(t);
    return st;
}

static void expect(const char *src, const char *data, const char *want) {
    ddt_jinja_text out;
    ddt_error err;
    ddt_status st = render(src, data, NULL, &out, &err);
    if (st != DDT_OK) fail_msg("render of %s failed: %s", src, err.msg);
    if (out.len != strlen(want) || memcmp(out.bytes, want, out.len) != 0)
        fail_msg("template %s\n  got  [%.*s]\n  want [%s]", src, (int)out.len, out.bytes, want);
    assert_int_equal(out.bytes[out.len], '\0');
    ddt_jinja_text_free(&out);
}

/* Expects failure with status and a message containing `want`. */
static void expect_fail(const char *src, const char *data, ddt_status status, const char *want) {
    ddt_jinja_text out;
    ddt_error err;
    ddt_status st = render(src, data, NULL, &out, &err);
    if (st == DDT_OK) fail_msg("template %s rendered [%.*s], expected failure", src, (int)out.len, out.bytes);
    assert_int_equal(st, status);
    assert_int_equal(err.status, status);
    if (!strstr(err.msg, want)) fail_msg("template %s: message [%s] lacks [%s]", src, err.msg, want);
}

/* ------------------------------------------------------------------ whitespace */

static void test_whitespace_control(void **state) {
    (void)state;
    expect("a  {{- 'b' -}}  c", NULL, "abc");
    expect("a {% if true %}b{% endif %}\nc", NULL, "a bc");          /* trim_blocks: newline after %} */
    expect("x\n    {% if true %}\ny\n    {% endif %}\nz", NULL, "x\ny\nz"); /* lstrip_blocks */
    expect("x\n  {%+ if true %}y{% endif %}", NULL, "x\n  y");        /* {%+ keeps the indent */
    expect("a\n{# note #}\nb", NULL, "a\nb");
    expect("a {#- note -#} b", NULL, "ab");
    expect("{{ 1 }}\n{{ 2 }}", NULL, "1\n2");                      /* no trim after }} */
    expect("{% raw %}{{ x }}{% endraw %}", NULL, "{{ x }}");
    expect("a\r\nb\n", NULL, "a\nb");                                /* newlines normalised, last one dropped */
    expect("{% if true %}x{% endif +%}\ny", NULL, "x\ny");
}

/* ------------------------------------------------------------------ statements */

static void test_statements(void **state) {
    (void)state;
    expect("{% for x in [1, 2, 3] %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}", NULL,
           "11,22,33");
    expect("{% for x in 'ab' %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.length }}{{ loop.first }}{% endfor %}",
           NULL, "0212True1102False");
    expect("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{\"d\": {\"b\": 1, \"a\": [2]}}", "b=1;a=[2];");
    expect("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    expect("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% endfor %}", NULL, "2/2 4/2 ");
    expect("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}",
           NULL, "013");
    expect("{% for x in [1, 2] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", NULL, "-2;1-;");
    expect("{% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}", NULL, "c");
    expect("{% set x = 3 %}{% set a, b = 1, 2 %}{{ x }}{{ a }}{{ b }}", NULL, "312");
    expect("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", NULL, "1"); /* loop scope */
    expect("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}", NULL, "4");
    expect("{% set c %}a{{ 1 + 1 }}b{% endset %}[{{ c }}]", NULL, "[a2b]");
    expect("{% set c | upper %}ab{% endset %}{{ c }}", NULL, "AB");
    expect("{% macro m(a, b='d') %}{{ a }}:{{ b }}{% endmacro %}{{ m(1) }} {{ m(1, 2) }} {{ m(b=3, a=4) }}", NULL,
           "1:d 1:2 4:3");
    expect("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}", NULL, "321");
    expect("{% generation %}gen{{ 1 }}{% endgeneration %}", NULL, "gen1");
    expect("{% filter upper %}ab{{ 'c' }}{% endfilter %}", NULL, "ABC");
}

/* ------------------------------------------------------------------ expressions */

static void test_expressions(void **state) {
    (void)state;
    expect("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 10 / 4 }} {{ 2**3**2 }}", NULL,
           "7 3 -4 2 1024 2.5 64");
    expect("{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ 'x' + 'y' }}", NULL, "a1NoneTrue abab [1, 2] xy");
    expect("{{ 0.1 + 0.2 }} {{ 1.0 }} {{ 1e16 }} {{ 1e-5 }} {{ 0.0001 }} {{ 3.14 }}", NULL,
           "0.30000000000000004 1.0 1e+16 1e-05 0.0001 3.14");
    expect("{{ [1, 'a', none, true, 2.5] }} {{ {'k': 'v'} }} {{ (1,) }} {{ (1, 2) }}", NULL,
           "[1, 'a', None, True, 2.5] {'k': 'v'} (1,) (1, 2)");
    expect("{{ \"it's\" }} {{ [\"it's\"] }} {{ ['a\\nb'] }}", NULL, "it's [\"it's\"] ['a\\nb']");
    expect("{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' in 'cat' }} {{ 3 not in [1] }} {{ 'k' in {'k': 1} }}", NULL,
           "True True True True True");
    expect("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ not 0 }} {{ 'a' if 0 else 'b' }} [{{ 'a' if 0 }}]", NULL, "x y True b []");
    expect("{{ s[1:] }} {{ s[::-1] }} {{ s[-1] }} {{ l[1:3] }} {{ l[-2:] }} {{ l[::2] }}",
           "{\"s\": \"h\u00e9llo\", \"l\": [1, 2, 3, 4]}", "\xc3\xa9llo oll\xc3\xa9h o [2, 3] [3, 4] [1, 3]");
    expect("{{ d.a }}{{ d['b'] }}{{ d.missing }}{{ l[9] }}{{ none.x }}", "{\"d\": {\"a\": 1, \"b\": 2}, \"l\": [1]}", "12");
    expect("{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 1 is number }} {{ 1 is integer }} "
           "{{ 1.5 is float }} {{ 's' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ true is boolean }} "
           "{{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 1 is not none }}",
           NULL, "False True True True True True True True True True True True True");
    expect("{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ dict(a=1) }}", NULL, "[0, 1, 2] [1, 3, 5] {'a': 1}");
}

/* ------------------------------------------------------------------ filters and methods */

static void test_filters_and_methods(void **state) {
    (void)state;
    expect("{{ [3, 1, 2]|sort }} {{ [1, 2]|reverse|list }} {{ 'abc'|length }} {{ [1, 2]|first }} {{ [1, 2]|last }}", NULL,
           "[1, 2, 3] [2, 1] 3 1 2");
    expect("{{ ['a', 'b']|join(', ') }} {{ ' x '|trim }} {{ 'ab'|upper }} {{ 'AB'|lower }} {{ 'hello world'|title }} "
           "{{ 'hELLO'|capitalize }}",
           NULL, "a, b x AB ab Hello World Hello");
    expect("{{ '3'|int + 1 }} {{ '2.5'|float }} {{ 'x'|int }} {{ 4|string ~ '!' }} {{ -3|abs }} {{ 2.567|round(2) }}", NULL,
           "4 2.5 0 4! 3 2.57");
    expect("{{ x|default('d') }} {{ ''|default('e', true) }} {{ 'v'|d('z') }}", NULL, "d e v");
    expect("{{ {'a': 'é', 'b': [1, 2.0, none, true]}|tojson }}", NULL, "{\"a\": \"é\", \"b\": [1, 2.0, null, true]}");
    expect("{{ {'a': [1]}|tojson(indent=2) }}", NULL, "{\n  \"a\": [\n    1\n  ]\n}");
    expect("{{ {'a': 1, 'b': 2}|tojson(separators=(',', ':')) }} {{ '<&>'|tojson }}", NULL, "{\"a\":1,\"b\":2} \"<&>\"");
    expect("{{ '<a href=\"x\">'|e }}", NULL, "&lt;a href=&#34;x&#34;&gt;");
    expect("{{ ms|map(attribute='r')|join }} {{ ms|selectattr('r', 'equalto', 'u')|list|length }} "
           "{{ [1, 2, 3]|select('odd')|list }} {{ [1, none]|reject('none')|list }} {{ ['a']|map('upper')|list }}",
           "{\"ms\": [{\"r\": \"u\"}, {\"r\": \"a\"}]}", "ua 1 [1, 3] [1] ['A']");
    expect("{{ 'a-b'|replace('-', '+') }} {{ [1, 1, 2]|unique|list }} {{ [1, 5]|max }} {{ d|items|list }}",
           "{\"d\": {\"k\": 1}}", "a+b [1, 2] 5 [('k', 1)]");
    expect("{{ ' a b '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a b  c'.split() }}|{{ 'a,b,c'.split(',', 1) }}|"
           "{{ 'a b c'.rsplit(None, 1) }}",
           NULL, "a b|a|['a', 'b', 'c']|['a', 'b,c']|['a b', 'c']");
    expect("{{ 'abc'.startswith('a') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'abc'.upper() }} {{ 'a-a'.replace('a', 'b', 1) }} "
           "{{ 'hello'.find('l') }} {{ '-'.join(['a', 'b']) }} {{ 'ab cd'.title() }}",
           NULL, "True True ABC b-a 2 a-b Ab Cd");
    expect("{{ d.get('a') }} {{ d.get('z', 0) }} {{ d.keys()|list }} {{ d.values()|list }} {{ [1, 2].index(2) }}",
           "{\"d\": {\"a\": 1}}", "1 0 ['a'] [1] 1");
}

/* ------------------------------------------------------------------ undefined */

static void test_undefined(void **state) {
    (void)state;
    expect("[{{ nope }}]{% for x in nope %}x{% endfor %}{{ nope|length }}{{ nope is defined }}{{ nope ~ 'a' }}", NULL,
           "[]0Falsea");
    expect("{% if nope %}y{% else %}n{% endif %}{{ not nope }}", NULL, "nTrue");
    expect_fail("{{ nope.attr }}", NULL, DDT_ERR_INVALID, "'nope' is undefined");
    expect_fail("{{ nope + 1 }}", NULL, DDT_ERR_INVALID, "'nope' is undefined");
    expect_fail("{{ nope() }}", NULL, DDT_ERR_INVALID, "'nope' is undefined");
    expect_fail("{{ [1].append(2) }}", NULL, DDT_ERR_INVALID, "list.append");
}

/* ------------------------------------------------------------------ errors */

static void test_errors_name_line_and_column(void **state) {
    (void)state;
    expect_fail("ab\n  {% if %}", NULL, DDT_ERR_INVALID, "line 2, column 9:");
    expect_fail("{% for x in y %}", NULL, DDT_ERR_INVALID, "expected 'endfor' or 'else'");
    expect_fail("{{ 1 +* 2 }}", NULL, DDT_ERR_INVALID, "line 1, column 7:");
    expect_fail("{% endif %}", NULL, DDT_ERR_INVALID, "unexpected 'endif'");
    expect_fail("{% frobnicate %}", NULL, DDT_ERR_INVALID, "unknown statement 'frobnicate'");
    expect_fail("{% include 'x' %}", NULL, DDT_ERR_UNSUPPORTED, "'include' statement is not supported");
    expect_fail("{{ 'abc }}", NULL, DDT_ERR_INVALID, "unterminated string");
    expect_fail("{# open", NULL, DDT_ERR_INVALID, "missing end of comment");
    expect_fail("{{ x|nosuchfilter }}", NULL, DDT_ERR_INVALID, "no filter named 'nosuchfilter'");
    expect_fail("{% break %}", NULL, DDT_ERR_INVALID, "outside a for loop");
    expect_fail("{{ (1 }}", NULL, DDT_ERR_INVALID, "unexpected '}'");
    expect_fail("x\n{{ 1 / 0 }}", NULL, DDT_ERR_INVALID, "line 2, column 6: division by zero");
    expect_fail("{{ 1 < 'a' }}", NULL, DDT_ERR_INVALID, "cannot order int and str");
    expect_fail("{{ raise_exception('no tools here') }}", NULL, DDT_ERR_INVALID, "template raised: no tools here");
    expect_fail("{{ strftime_now('%Y') }}", NULL, DDT_ERR_UNSUPPORTED, "strftime_now");
    expect_fail("{% set x.y = 1 %}", NULL, DDT_ERR_INVALID, "not a namespace");
    expect_fail("{{ '\xff' }}", NULL, DDT_ERR_INVALID, "not valid UTF-8");
    expect_fail("{{ 99999999999999999999 }}", NULL, DDT_ERR_RANGE, "64-bit");
    expect_fail("{{ 9223372036854775807 + 1 }}", NULL, DDT_ERR_RANGE, "64-bit");
    /* bad contexts */
    ddt_jinja *t = NULL;
    ddt_error err;
    assert_int_equal(ddt_jinja_parse("x", 1, &t, &err), DDT_OK);
    ddt_jinja_text out;
    json_t *arr = json_array();
    assert_int_equal(ddt_jinja_render(t, arr, NULL, &out, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "must be a JSON object"));
    json_decref(arr);
    ddt_jinja_free(t);
    assert_int_equal(ddt_jinja_parse(NULL, 3, &t, &err), DDT_ERR_INVALID);
}

/* ------------------------------------------------------------------ bounds */

static void test_bounds(void **state) {
    (void)state;
    clock_t t0 = clock();
    expect_fail("{% for i in range(10**9) %}x{% endfor %}", NULL, DDT_ERR_RANGE, "range");
    /* work that stays inside the range bound still hits the step (or memory) bound */
    expect_fail("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL, DDT_ERR_RANGE,
                "line 1, column ");
    expect_fail("{% set l = range(100000)|list %}{% for i in l %}{% for j in l %}{% endfor %}{% endfor %}", NULL,
                DDT_ERR_RANGE, "evaluation steps");
    assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 30.0);
    expect_fail("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL, DDT_ERR_RANGE, "nested deeper");
    /* recursion through loops and conditions (a dozen frames a macro level) ends with the same
       clean error; the input with which fuzz_jinja overflowed an 8 MB stack under AddressSanitizer
       before the macro bound (now the render's stack use is bounded too) is replayed from
       fuzz/corpus/fuzz_jinja/regress-macro-recursion-stack by every fuzz run */
    expect_fail("{% macro f(m) %}{% for i in [1] %}{% if m is mapping or true %}{% set c = m %}{{ f(c) }}"
                "{% endif %}{% endfor %}{% endmacro %}{% for k in [0] %}{{ f({}) }}{% endfor %}",
                NULL, DDT_ERR_RANGE, "nested deeper");
    /* deep syntax nesting: a clean error, not a crash */
    size_t n = 5000;
    char *deep = malloc(2 * n + 16);
    assert_non_null(deep);
    strcpy(deep, "{{ ");
    for (size_t i = 0; i < n; i++) strcat(deep + i + 2, "(");
    size_t o = strlen(deep);
    deep[o++] = '1';
    for (size_t i = 0; i < n; i++) deep[o++] = ')';
    strcpy(deep + o, " }}");
    expect_fail(deep, NULL, DDT_ERR_RANGE, "nested deeper");
    free(deep);
    char *chain = malloc(4 * n + 16);
    assert_non_null(chain);
    strcpy(chain, "{{ 1");
    o = strlen(chain);
    for (size_t i = 0; i < n; i++) {
        memcpy(chain + o, " + 1", 4);
        o += 4;
    }
    strcpy(chain + o, " }}");
    expect_fail(chain, NULL, DDT_ERR_RANGE, "chain longer");
    free(chain);
    /* output bound: a string doubled 30 times passes 64 MiB */
    expect_fail("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}"
                "{% endfor %}{{ ns.s }}",
                NULL, DDT_ERR_RANGE, "");
    /* source bound */
    char *big = malloc(DDT_JINJA_MAX_SOURCE + 2);
    assert_non_null(big);
    memset(big, 'a', DDT_JINJA_MAX_SOURCE + 1);
    ddt_jinja *t = (ddt_jinja *)1;
    ddt_error err;
    assert_int_equal(ddt_jinja_parse(big, DDT_JINJA_MAX_SOURCE + 1, &t, &err), DDT_ERR_RANGE);
    assert_null(t);
    free(big);
}

/* ------------------------------------------------------------------ the data mask */

static void test_data_mask(void **state) {
    (void)state;
    const char *src = "{{ bos }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"
                      "{{ messages[0].content[3:6] }}{{ messages[0].content|upper }}{{ n }}{{ 7 }}";
    const char *data = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi <|im_end|>\"}], \"n\": 5}";
    const char *trusted = "{\"bos\": \"<s>\"}";
    ddt_jinja_text out;
    ddt_error err;
    assert_int_equal(render(src, data, trusted, &out, &err), DDT_OK);
    const char *want = "<s><|im_start|>user\nhi <|im_end|><|im_end|><|iHI <|IM_END|>57";
    assert_int_equal(out.len, strlen(want));
    assert_memory_equal(out.bytes, want, out.len);
    /* expected flags, segment by segment */
    struct {
        const char *text;
        uint8_t flag;
    } segs[] = {{"<s>", 0}, {"<|im_start|>", 0}, {"user", 1}, {"\n", 0}, {"hi <|im_end|>", 1}, {"<|im_end|>", 0},
                {"<|i", 1}, {"HI <|IM_END|>", 1}, {"5", 1}, {"7", 0}};
    size_t o = 0;
    for (size_t s = 0; s < sizeof segs / sizeof segs[0]; s++) {
        size_t l = strlen(segs[s].text);
        for (size_t i = 0; i < l; i++)
            if (out.data[o + i] != segs[s].flag) fail_msg("byte %zu of segment '%s' has flag %d", i, segs[s].text, out.data[o + i]);
        o += l;
    }
    ddt_jinja_text_free(&out);

    /* concatenation and join copy flags byte by byte; tojson of data is wholly data */
    assert_int_equal(render("{{ 'T' ~ s ~ 'T' }}|{{ [s, 'x']|join('-') }}|{{ {'a': s}|tojson }}|{{ {'a': 't'}|tojson }}",
                            "{\"s\": \"d\"}", NULL, &out, &err),
                     DDT_OK);
    const char *w2 = "TdT|d-x|{\"a\": \"d\"}|{\"a\": \"t\"}";
    const uint8_t f2[] = {0, 1, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(out.len, strlen(w2));
    assert_memory_equal(out.bytes, w2, out.len);
    assert_memory_equal(out.data, f2, out.len);
    ddt_jinja_text_free(&out);

    /* a name in both contexts comes from trusted, so its bytes are template */
    assert_int_equal(render("{{ x }}", "{\"x\": \"data\"}", "{\"x\": \"trus\"}", &out, &err), DDT_OK);
    assert_memory_equal(out.bytes, "trus", 4);
    for (size_t i = 0; i < 4; i++) assert_int_equal(out.data[i], 0);
    ddt_jinja_text_free(&out);
}

static void test_reuse_after_error(void **state) {
    (void)state;
    /* one parsed template renders many times, failing or not, without state carried over */
    ddt_jinja *t = NULL;
    ddt_error err;
    const char *src = "{% set ns = namespace(n=0) %}{% for m in ms %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}{{ ms[0].x.y }}";
    assert_int_equal(ddt_jinja_parse(src, strlen(src), &t, &err), DDT_OK);
    for (int k = 0; k < 3; k++) {
        json_t *good = js("{\"ms\": [{\"x\": {\"y\": \"!\"}}, {}]}");
        json_t *bad = js("{\"ms\": [{}]}");
        ddt_jinja_text out;
        assert_int_equal(ddt_jinja_render(t, good, NULL, &out, &err), DDT_OK);
        assert_int_equal(out.len, 2);
        assert_memory_equal(out.bytes, "2!", 2);
        ddt_jinja_text_free(&out);
        assert_int_equal(ddt_jinja_render(t, bad, NULL, &out, &err), DDT_ERR_INVALID);
        assert_non_null(strstr(err.msg, "line 1, column "));
        json_decref(good);
        json_decref(bad);
    }
    ddt_jinja_free(t);
    ddt_jinja_free(NULL);
    ddt_jinja_text_free(NULL);
}

/* One parsed template rendered from several threads at once (the server's HTTP threads may):
 * the tree is read-only during a render, so every thread gets the single-threaded output.
 * `make tsan` runs this test under ThreadSanitizer. */
typedef struct thread_job {
    const ddt_jinja *t;
    json_t *data;
    const ddt_jinja_text *want;
    int bad;
} thread_job;

static void *render_many(void *p) {
    thread_job *j = p;
    for (int k = 0; k < 50; k++) {
        ddt_jinja_text out;
        ddt_error err;
        if (ddt_jinja_render(j->t, j->data, NULL, &out, &err) != DDT_OK || out.len != j->want->len ||
            memcmp(out.bytes, j->want->bytes, out.len) || memcmp(out.data, j->want->data, out.len))
            j->bad++;
        ddt_jinja_text_free(&out);
    }
    return NULL;
}

static void test_threads_share_a_template(void **state) {
    (void)state;
    const char *src = "{%- set ns = namespace(n=0) -%}{%- for m in messages -%}{%- set ns.n = ns.n + 1 -%}"
                      "<{{ m.role }}>{{ m.content | trim }}{{ loop.index }}|{%- endfor -%}{{ ns.n }}"
                      "{{ messages | tojson }}";
    ddt_jinja *t = NULL;
    ddt_error err;
    assert_int_equal(ddt_jinja_parse(src, strlen(src), &t, &err), DDT_OK);
    json_t *data = js("{\"messages\": [{\"role\": \"user\", \"content\": \" a \"}, {\"role\": \"assistant\","
                      " \"content\": \"b\"}]}");
    ddt_jinja_text want;
    assert_int_equal(ddt_jinja_render(t, data, NULL, &want, &err), DDT_OK);
    pthread_t th[4];
    thread_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){t, data, &want, 0};
        assert_int_equal(pthread_create(&th[i], NULL, render_many, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].bad, 0);
    }
    ddt_jinja_text_free(&want);
    json_decref(data);
    ddt_jinja_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whitespace_control),
        cmocka_unit_test(test_statements),
        cmocka_unit_test(test_expressions),
        cmocka_unit_test(test_filters_and_methods),
        cmocka_unit_test(test_undefined),
        cmocka_unit_test(test_errors_name_line_and_column),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_data_mask),
        cmocka_unit_test(test_reuse_after_error),
        cmocka_unit_test(test_threads_share_a_template),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
