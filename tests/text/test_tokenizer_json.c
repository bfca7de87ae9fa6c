/*
 * test_tokenizer_json.c — unit tests of the tokenizer.json format on hand-made
 * files: HF's merge order (merge-list rank, not token id), leftmost ties, added
 * tokens with and without DDT_TOKENIZE_SPECIAL and in marked data, unk_token,
 * Split behaviours, and every loader error (each must name the JSON path).
 * The comparison with the `tokenizers` library itself is in
 * tests/python/test_tokenizer_json.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "text/tokenizer.h"

/* a b c, their merges, the byte character of space (U+0120) and of 0xff (ÿ itself) */
#define VOCAB "{\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"bc\":4,\"abc\":5,\"\\u0120\":6,\"\\u00ff\":7,\"aa\":8}"
#define BYTE_LEVEL "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}"
#define NO_ADDED "[]"
#define NO_EXTRA ""

static char g_doc[8192];

/* A tokenizer.json from its parts (model_extra: more members of "model", starting with a comma). */
static const char *doc(const char *vocab, const char *merges, const char *added, const char *pre,
                       const char *model_extra) {
    snprintf(g_doc, sizeof g_doc,
             "{\"version\":\"1.0\",\"added_tokens\":%s,\"normalizer\":null,\"pre_tokenizer\":%s,"
             "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
             "\"model\":{\"type\":\"BPE\",\"vocab\":%s,\"merges\":%s%s}}",
             added, pre, vocab, merges, model_extra);
    return g_doc;
}

static ddt_tokenizer *load(const char *json) {
    ddt_tokenizer *tok = NULL;
    ddt_error err;
    ddt_status st = ddt_tokenizer_create_json("t.json", json, strlen(json), &tok, &err);
    if (st != DDT_OK) fail_msg("load failed: %s", err.msg);
    return tok;
}

/* Loading must fail with this status and a message holding "t.json: " + want. */
static void expect_fail(const char *json, ddt_status status, const char *want) {
    ddt_tokenizer *tok = NULL;
    ddt_error err;
    ddt_status st = ddt_tokenizer_create_json("t.json", json, strlen(json), &tok, &err);
    assert_null(tok);
    if (st != status || !strstr(err.msg, want) || strncmp(err.msg, "t.json", 6) != 0)
        fail_msg("want status %d and \"%s\", got %d: %s", status, want, st, err.msg);
}

static size_t enc(ddt_tokenizer *tok, const char *text, uint32_t flags, int32_t *ids, size_t cap) {
    size_t n = 0;
    ddt_error err;
    ddt_status st = ddt_tokenizer_encode(tok, text, strlen(text), flags, ids, cap, &n, &err);
    if (st != DDT_OK) fail_msg("encode \"%s\": %s", text, err.msg);
    return n;
}

static void expect_ids(ddt_tokenizer *tok, const char *text, uint32_t flags, int n, ...) {
    int32_t ids[64];
    size_t got = enc(tok, text, flags, ids, 64);
    va_list ap;
    va_start(ap, n);
    assert_int_equal(got, (size_t)n);
    for (int i = 0; i < n; i++) assert_int_equal(ids[i], va_arg(ap, int));
    va_end(ap);
}

/* ------------------------------------------------------------------ encoding */

static void test_merge_rank_is_list_order(void **state) {
    (void)state;
    /* "b c" is listed first: HF merges it first although "ab" has the lower id, so
     * "abc" is [a, bc], where tiktoken's rule (lowest id) would give [ab, c]. */
    ddt_tokenizer *tok = load(doc(VOCAB, "[[\"b\",\"c\"],[\"a\",\"b\"]]", NO_ADDED, BYTE_LEVEL, NO_EXTRA));
    expect_ids(tok, "abc", 0, 2, 0, 4);
    expect_ids(tok, "ab", 0, 1, 3);
    ddt_tokenizer_free(tok);
    /* with "a bc" listed the word goes on to abc */
    tok = load(doc(VOCAB, "[\"b c\",\"a b\",\"a bc\"]", NO_ADDED, BYTE_LEVEL, NO_EXTRA));
    expect_ids(tok, "abc", 0, 1, 5);
    ddt_tokenizer_free(tok);
    /* a pair listed twice keeps its later rank (HF's map is built in list order) */
    tok = load(doc(VOCAB, "[\"a b\",\"b c\",\"a b\"]", NO_ADDED, BYTE_LEVEL, NO_EXTRA));
    expect_ids(tok, "abc", 0, 2, 0, 4);
    ddt_tokenizer_free(tok);
    /* equal ranks: leftmost first */
    tok = load(doc(VOCAB, "[\"a a\"]", NO_ADDED, BYTE_LEVEL, NO_EXTRA));
    expect_ids(tok, "aaa", 0, 2, 8, 0);
    expect_ids(tok, "aaaa", 0, 2, 8, 8);
    /* the space is the vocabulary's "Ġ"; decoding maps it back */
    expect_ids(tok, "a b", 0, 3, 0, 6, 1);
    char out[16];
    size_t len;
    int32_t ids[3] = {0, 6, 1};
    assert_int_equal(ddt_tokenizer_decode(tok, ids, 3, out, sizeof out, &len, NULL), DDT_OK);
    assert_int_equal(len, 3);
    assert_memory_equal(out, "a b", 3);
    /* "ÿ" is byte 0xff's own character */
    expect_ids(tok, "\xff", 0, 1, 7);
    ddt_tokenizer_free(tok);
}

static void test_missing_byte_and_unk(void **state) {
    (void)state;
    ddt_tokenizer *tok = load(doc(VOCAB, "[]", NO_ADDED, BYTE_LEVEL, NO_EXTRA));
    int32_t ids[8];
    size_t n;
    ddt_error err;
    assert_int_equal(ddt_tokenizer_encode(tok, "abz", 3, 0, ids, 8, &n, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "byte 0x7a at offset 2"));
    ddt_tokenizer_free(tok);
    /* with an unk_token the byte becomes it; fuse_unk joins a run of them */
    const char *v = "{\"a\":0,\"b\":1,\"<unk>\":2,\"ab\":3}";
    tok = load(doc(v, "[\"a b\"]", NO_ADDED, BYTE_LEVEL, ",\"dropout\":null,\"unk_token\":\"<unk>\""));
    expect_ids(tok, "abzzab", 0, 4, 3, 2, 2, 3);
    ddt_tokenizer_free(tok);
    tok = load(doc(v, "[\"a b\"]", NO_ADDED, BYTE_LEVEL, ",\"unk_token\":\"<unk>\",\"fuse_unk\":true"));
    expect_ids(tok, "abzzab", 0, 3, 3, 2, 3);
    expect_ids(tok, "zaz", 0, 3, 2, 0, 2);
    ddt_tokenizer_free(tok);
    expect_fail(doc(v, "[]", NO_ADDED, BYTE_LEVEL, ",\"unk_token\":\"<nope>\""), DDT_ERR_FORMAT,
                "model.unk_token: \"<nope>\" is not in model.vocab");
}

static void test_added_tokens(void **state) {
    (void)state;
    /* <s> special (in the vocab, as DeepSeek's BOS is), <x> special, "ab" non-special and
     * normalized (so found in what the specials left), <t> non-special outside the vocab */
    const char *v = "{\"<s>\":9,\"a\":0,\"b\":1,\"c\":2,\"ab\":3,\"bc\":4,\"abc\":5,\"<\":10,\"s\":11,\">\":12,\"x\":13}";
    const char *added = "[{\"id\":9,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
                        "{\"id\":20,\"content\":\"<x>\",\"special\":true,\"normalized\":false},"
                        "{\"id\":3,\"content\":\"ab\",\"special\":false,\"normalized\":true},"
                        "{\"id\":21,\"content\":\"<t>\",\"special\":false,\"normalized\":true}]";
    ddt_tokenizer *tok = load(doc(v, "[\"b c\",\"a b\"]", added, BYTE_LEVEL, NO_EXTRA));
    assert_int_equal(ddt_tokenizer_vocab_size(tok), 22);
    assert_int_equal(ddt_tokenizer_token_id(tok, "<s>"), 9);
    assert_int_equal(ddt_tokenizer_token_id(tok, "<t>"), 21);
    assert_int_equal(ddt_tokenizer_token_id(tok, "bc"), 4);
    assert_true(ddt_tokenizer_is_special(tok, 9));
    assert_true(ddt_tokenizer_is_special(tok, 20));
    assert_true(ddt_tokenizer_is_special(tok, 21)); /* a marker the vocab lacks: control */
    assert_false(ddt_tokenizer_is_special(tok, 3)); /* "ab" is a vocab token: text */
    assert_int_equal(ddt_tokenizer_n_special(tok), 3);
    /* the added "ab" splits "abc" before BPE, so it is [ab, c], not [a, bc] */
    expect_ids(tok, "abc", DDT_TOKENIZE_SPECIAL, 2, 3, 2);
    expect_ids(tok, "<s>abc<x>", DDT_TOKENIZE_SPECIAL, 4, 9, 3, 2, 20);
    /* without the flag the specials are text, the non-special added tokens still match */
    expect_ids(tok, "<s><t>", 0, 4, 10, 11, 12, 21);
    /* a special match skipped without the flag is still consumed: "<x>" hides nothing */
    expect_ids(tok, "<x>", 0, 3, 10, 13, 12);
    /* marked data: no added token at all in the user's bytes */
    int32_t ids[16];
    size_t n;
    const char *text = "<s>ab<s>";
    const uint8_t marks[8] = {0, 0, 0, 1, 1, 1, 1, 1};
    assert_int_equal(ddt_tokenizer_encode_marked(tok, text, marks, 8, 0, ids, 16, &n, NULL), DDT_OK);
    assert_int_equal(n, 5);
    int32_t want[5] = {9, 3, 10, 11, 12};
    assert_memory_equal(ids, want, sizeof want);
    char out[32];
    size_t len;
    assert_int_equal(ddt_tokenizer_decode(tok, ids, n, out, sizeof out, &len, NULL), DDT_OK);
    assert_int_equal(len, 8);
    assert_memory_equal(out, text, 8);
    /* decoding: an added token's text; a special gives no text bytes to a generation */
    const uint8_t *bytes;
    assert_false(ddt_tokenizer_text_bytes(tok, 20, &bytes, &len));
    assert_true(ddt_tokenizer_text_bytes(tok, 3, &bytes, &len));
    assert_int_equal(len, 2);
    ddt_tokenizer_free(tok);
}

static void test_split_behaviours(void **state) {
    (void)state;
    /* digits in groups of up to three, Isolated, as DeepSeek-V3's first Split */
    const char *v = "{\"1\":0,\"2\":1,\"3\":2,\"4\":3,\"12\":4,\"123\":5,\"34\":6,\"\\u0120\":7,\"a\":8}";
    const char *merges = "[\"1 2\",\"12 3\",\"3 4\"]";
    char pre[512];
    snprintf(pre, sizeof pre, "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                              "{\"Regex\":\"\\\\p{N}{1,3}\"},\"behavior\":\"Isolated\",\"invert\":false},%s]}",
             BYTE_LEVEL);
    ddt_tokenizer *tok = load(doc(v, merges, NO_ADDED, pre, NO_EXTRA));
    expect_ids(tok, "1234", 0, 2, 5, 3); /* [123][4]: the 3 4 merge cannot cross pieces */
    ddt_tokenizer_free(tok);
    /* Removed drops the spaces; MergedWithPrevious glues a space to the piece before */
    snprintf(pre, sizeof pre, "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                              "{\"String\":\" \"},\"behavior\":\"Removed\"},%s]}", BYTE_LEVEL);
    tok = load(doc(v, merges, NO_ADDED, pre, NO_EXTRA));
    expect_ids(tok, "12 34 a", 0, 3, 4, 6, 8);
    ddt_tokenizer_free(tok);
    snprintf(pre, sizeof pre, "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                              "{\"Regex\":\"3\"},\"behavior\":\"MergedWithNext\"},%s]}", BYTE_LEVEL);
    tok = load(doc(v, merges, NO_ADDED, pre, NO_EXTRA));
    expect_ids(tok, "1234", 0, 2, 4, 6); /* [12][34] */
    ddt_tokenizer_free(tok);
    /* one-character classes, a ']' first in a class, Removed with invert (keeps the matches) */
    snprintf(pre, sizeof pre, "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                              "{\"Regex\":\"[2]|[]a]\"},\"behavior\":\"Removed\",\"invert\":true},%s]}", BYTE_LEVEL);
    tok = load(doc(v, merges, NO_ADDED, pre, NO_EXTRA));
    expect_ids(tok, "1234a", 0, 2, 1, 8);
    ddt_tokenizer_free(tok);
}

/* ------------------------------------------------------------------ loader errors */

static void test_json_errors(void **state) {
    (void)state;
    expect_fail("{\"model\": ", DDT_ERR_FORMAT, "t.json line 1 column");
    expect_fail("[]", DDT_ERR_FORMAT, "the top level is not a JSON object");
    expect_fail("{\"pre_tokenizer\":null}", DDT_ERR_FORMAT, "model: expected an object, found nothing");
    expect_fail("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1,\"a\":2}}}", DDT_ERR_FORMAT, "duplicate object key");
    char json[8192];
    snprintf(json, sizeof json, "%s", doc(VOCAB, "[]", NO_ADDED, BYTE_LEVEL, NO_EXTRA));
    char *p = strstr(json, "\"BPE\"");
    memcpy(p, "\"WPC\"", 5);
    expect_fail(json, DDT_ERR_FORMAT, "model.type: unsupported model WPC (only BPE)");
    expect_fail(doc("[]", "[]", NO_ADDED, BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT, "model.vocab: expected an object");
    expect_fail(doc("{}", "[]", NO_ADDED, BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT, "model.vocab: no tokens");
    expect_fail(doc("{\"a\":0,\"b\":0}", "[]", NO_ADDED, BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT,
                "model.vocab[\"b\"]: id 0 is also the id of \"a\"");
    expect_fail(doc("{\"a\":-1}", "[]", NO_ADDED, BYTE_LEVEL, NO_EXTRA), DDT_ERR_RANGE,
                "model.vocab[\"a\"]: id -1 is out of range");
    expect_fail(doc("{\"a\":16777216}", "[]", NO_ADDED, BYTE_LEVEL, NO_EXTRA), DDT_ERR_RANGE,
                "model.vocab[\"a\"]: id 16777216 is out of range");
    expect_fail(doc("{\"a\":1.5}", "[]", NO_ADDED, BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT,
                "model.vocab[\"a\"]: the id must be an integer, found a number");
    expect_fail(doc("{\"\":0}", "[]", NO_ADDED, BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT, "model.vocab[\"\"]: empty token");
    expect_fail(doc(VOCAB, "{}", NO_ADDED, BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT, "model.merges: expected a list");
    expect_fail(doc(VOCAB, "[\"a q\"]", NO_ADDED, BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT,
                "model.merges[0]: the right token \"q\" is not in model.vocab");
    expect_fail(doc(VOCAB, "[\"a b\",[\"q\",\"a\"]]", NO_ADDED, BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT,
                "model.merges[1]: expected a string like the first merge");
    expect_fail(doc(VOCAB, "[[\"q\",\"a\"]]", NO_ADDED, BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT,
                "model.merges[0]: the left token \"q\" is not in model.vocab");
    expect_fail(doc(VOCAB, "[\"c a\"]", NO_ADDED, BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT,
                "model.merges[0]: the merged token \"ca\" is not in model.vocab");
    expect_fail(doc(VOCAB, "[\"a b c\"]", NO_ADDED, BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT,
                "model.merges[0]: expected \"a b\" with exactly one space");
    expect_fail(doc(VOCAB, "[[\"a\"]]", NO_ADDED, BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT,
                "model.merges[0]: expected a pair of strings");
    expect_fail(doc(VOCAB, "[]", NO_ADDED, BYTE_LEVEL, ",\"dropout\":0.1"), DDT_ERR_FORMAT,
                "model.dropout: BPE dropout (random merges) is not supported");
    expect_fail(doc(VOCAB, "[]", NO_ADDED, BYTE_LEVEL, ",\"byte_fallback\":true"), DDT_ERR_FORMAT,
                "model.byte_fallback: true is not supported");
    expect_fail(doc(VOCAB, "[]", NO_ADDED, BYTE_LEVEL, ",\"continuing_subword_prefix\":\"##\""), DDT_ERR_FORMAT,
                "model.continuing_subword_prefix: not supported");
    expect_fail(doc(VOCAB, "[]", NO_ADDED, BYTE_LEVEL, ",\"fuse_unk\":1"), DDT_ERR_FORMAT,
                "model.fuse_unk: expected a boolean, found an integer");
}

static void test_added_token_errors(void **state) {
    (void)state;
    expect_fail(doc(VOCAB, "[]", "{}", BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT, "added_tokens: expected a list");
    expect_fail(doc(VOCAB, "[]", "[{\"id\":30}]", BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT,
                "added_tokens[0].content: expected a non-empty string");
    expect_fail(doc(VOCAB, "[]", "[{\"id\":\"30\",\"content\":\"<x>\"}]", BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT,
                "added_tokens[0].id: the id must be an integer, found a string");
    expect_fail(doc(VOCAB, "[]", "[{\"id\":99999999,\"content\":\"<x>\"}]", BYTE_LEVEL, NO_EXTRA), DDT_ERR_RANGE,
                "added_tokens[0].id: id 99999999 is out of range");
    expect_fail(doc(VOCAB, "[]", "[{\"id\":1,\"content\":\"<x>\"}]", BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT,
                "added_tokens[0]: id 1 of \"<x>\" is already the id of \"b\" in model.vocab");
    expect_fail(doc(VOCAB, "[]", "[{\"id\":30,\"content\":\"ab\"}]", BYTE_LEVEL, NO_EXTRA), DDT_ERR_FORMAT,
                "added_tokens[0]: \"ab\" has id 30 here but 3 in model.vocab");
    expect_fail(doc(VOCAB, "[]", "[{\"id\":30,\"content\":\"<x>\"},{\"id\":30,\"content\":\"<y>\"}]", BYTE_LEVEL,
                    NO_EXTRA), DDT_ERR_FORMAT, "added_tokens[1]: id 30 is given to two added tokens");
    expect_fail(doc(VOCAB, "[]", "[{\"id\":30,\"content\":\"<x>\"},{\"id\":31,\"content\":\"<x>\"}]", BYTE_LEVEL,
                    NO_EXTRA), DDT_ERR_FORMAT, "added_tokens[1]: \"<x>\" is also the content of added token id 30");
    expect_fail(doc(VOCAB, "[]", "[{\"id\":30,\"content\":\"<x>\",\"lstrip\":true}]", BYTE_LEVEL, NO_EXTRA),
                DDT_ERR_FORMAT, "added_tokens[0].lstrip: true is not supported");
    expect_fail(doc(VOCAB, "[]", "[{\"id\":30,\"content\":\"<x>\",\"special\":\"yes\"}]", BYTE_LEVEL, NO_EXTRA),
                DDT_ERR_FORMAT, "added_tokens[0].special: expected a boolean, found a string");
}

static void pre_fail(const char *pre, ddt_status status, const char *want) {
    expect_fail(doc(VOCAB, "[]", NO_ADDED, pre, NO_EXTRA), status, want);
}

#define SPLIT(re) "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"" re "\"},\"behavior\":\"Isolated\",\"invert\":false}"
#define SEQ(...) "{\"type\":\"Sequence\",\"pretokenizers\":[" __VA_ARGS__ "]}"

static void test_pre_tokenizer_errors(void **state) {
    (void)state;
    pre_fail("null", DDT_ERR_FORMAT, "pre_tokenizer: missing; a ByteLevel pre-tokenizer");
    pre_fail("{\"type\":\"Whitespace\"}", DDT_ERR_FORMAT, "pre_tokenizer.type: unsupported pre-tokenizer \"Whitespace\"");
    pre_fail(SEQ("{\"type\":\"Digits\",\"individual_digits\":true}," BYTE_LEVEL), DDT_ERR_FORMAT,
             "pre_tokenizer.pretokenizers[0].type: unsupported pre-tokenizer \"Digits\"");
    pre_fail(SEQ(), DDT_ERR_FORMAT, "pre_tokenizer.pretokenizers: expected a non-empty list");
    pre_fail(SEQ(SPLIT("a")), DDT_ERR_FORMAT, "pre_tokenizer.pretokenizers[0]: the last pre-tokenizer must be ByteLevel");
    pre_fail(SEQ(BYTE_LEVEL "," SPLIT("a")), DDT_ERR_FORMAT,
             "pre_tokenizer.pretokenizers[0]: ByteLevel must be the last pre-tokenizer");
    pre_fail("{\"type\":\"ByteLevel\",\"add_prefix_space\":true}", DDT_ERR_FORMAT,
             "pre_tokenizer.add_prefix_space: true is not supported");
    pre_fail(SEQ(SPLIT("\\\\bx") "," BYTE_LEVEL), DDT_ERR_FORMAT,
             "pre_tokenizer.pretokenizers[0].pattern.Regex: unsupported regex: an escape with no PCRE2 equivalent");
    pre_fail(SEQ(SPLIT("[a[b]]") "," BYTE_LEVEL), DDT_ERR_FORMAT, "unsupported regex: a nested character class at offset 2");
    pre_fail(SEQ(SPLIT("[a&&b]") "," BYTE_LEVEL), DDT_ERR_FORMAT, "a class intersection");
    pre_fail(SEQ(SPLIT("^a") "," BYTE_LEVEL), DDT_ERR_FORMAT, "an anchor ^ or $");
    pre_fail(SEQ(SPLIT("(?m)a") "," BYTE_LEVEL), DDT_ERR_FORMAT, "an inline option other than i");
    pre_fail(SEQ(SPLIT("[\\\\S]") "," BYTE_LEVEL), DDT_ERR_FORMAT, "an escape with no PCRE2 equivalent");
    pre_fail(SEQ(SPLIT("(a") "," BYTE_LEVEL), DDT_ERR_FORMAT,
             "pre_tokenizer.pretokenizers[0].pattern.Regex: the regex does not compile");
    pre_fail(SEQ(SPLIT("") "," BYTE_LEVEL), DDT_ERR_FORMAT, "pre_tokenizer.pretokenizers[0].pattern.Regex: empty pattern");
    pre_fail(SEQ("{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\"}," BYTE_LEVEL),
             DDT_ERR_FORMAT, "pre_tokenizer.pretokenizers[0].behavior: expected Removed, Isolated");
    pre_fail(SEQ("{\"type\":\"Split\",\"pattern\":\"a\",\"behavior\":\"Isolated\"}," BYTE_LEVEL), DDT_ERR_FORMAT,
             "pre_tokenizer.pretokenizers[0].pattern: expected {\"Regex\"");
    pre_fail(SEQ(SPLIT("a") "," SPLIT("a") "," SPLIT("a") "," SPLIT("a") "," SPLIT("a") "," SPLIT("a") "," SPLIT("a") ","
                 SPLIT("a") "," SPLIT("a") "," BYTE_LEVEL),
             DDT_ERR_RANGE, "more than 8 Split pre-tokenizers");
    /* normalizer and decoder */
    char json[8192];
    snprintf(json, sizeof json, "%s", doc(VOCAB, "[]", NO_ADDED, BYTE_LEVEL, NO_EXTRA));
    char *p = strstr(json, "\"normalizer\":null");
    memcpy(p, "\"normalizer\":7   ", 17);
    expect_fail(json, DDT_ERR_FORMAT, "normalizer: unsupported normalizer an integer (only null)");
    snprintf(json, sizeof json, "%s", doc(VOCAB, "[]", NO_ADDED, BYTE_LEVEL, NO_EXTRA));
    p = strstr(json, "\"ByteLevel\"}");
    memcpy(p, "\"Metaspace\"}", 12);
    expect_fail(json, DDT_ERR_FORMAT, "decoder: unsupported decoder Metaspace (only ByteLevel)");
}

static void test_load_paths(void **state) {
    (void)state;
    ddt_tokenizer *tok = NULL;
    ddt_error err;
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/text", DDT_SOURCE_DIR); /* a folder with neither file */
    assert_int_equal(ddt_tokenizer_load(path, &tok, &err), DDT_ERR_IO);
    assert_non_null(strstr(err.msg, "neither tiktoken.model nor tokenizer.json"));
    snprintf(path, sizeof path, "%s/no/such.json", DDT_SOURCE_DIR);
    assert_int_equal(ddt_tokenizer_load(path, &tok, &err), DDT_ERR_IO);
    assert_null(tok);
    assert_int_equal(ddt_tokenizer_create_json("x", NULL, 5, &tok, &err), DDT_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_rank_is_list_order),
        cmocka_unit_test(test_missing_byte_and_unk),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_split_behaviours),
        cmocka_unit_test(test_json_errors),
        cmocka_unit_test(test_added_token_errors),
        cmocka_unit_test(test_pre_tokenizer_errors),
        cmocka_unit_test(test_load_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
