/*
 * test_tokenizer.c — unit tests of the tokenizer and the chat template on
 * hand-made vocabularies: the BPE merge order, special tokens, buffers, invalid
 * UTF-8, every loader error (tiktoken.model, tokenizer_config.json, pattern),
 * Kimi's built-in special table, and the fixture folder tests/fixtures/tokenizer.
 * The comparison with tiktoken itself is in tests/python/test_tokenizer.py.
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

#include "text/chat.h"
#include "text/tokenizer.h"

/* ------------------------------------------------------------------ helpers */

static void b64_encode(const uint8_t *in, size_t n, char *out) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < n) v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n) v |= in[i + 2];
        out[o++] = tab[v >> 18 & 63];
        out[o++] = tab[v >> 12 & 63];
        out[o++] = i + 1 < n ? tab[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? tab[v & 63] : '=';
    }
    out[o] = '\0';
}

/* A growing text buffer for building tiktoken.model files. */
typedef struct text_buf {
    char *p;
    size_t len, cap;
} text_buf;

static void buf_add(text_buf *b, const char *s) {
    size_t n = strlen(s);
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->len, s, n + 1);
    b->len += n;
}

static void buf_add_token(text_buf *b, const void *bytes, size_t n, int32_t rank) {
    char line[256];
    b64_encode(bytes, n, line);
    snprintf(line + strlen(line), sizeof line - strlen(line), " %d\n", rank);
    buf_add(b, line);
}

/* Build from model text (+ optional config JSON / pattern); asserts success. */
static ddt_tokenizer *make_tok(const char *model, const char *config, const char *pattern) {
    ddt_tokenizer_source src = {"test.model", (const uint8_t *)model, strlen(model),
                                config ? "test_config.json" : NULL, config, config ? strlen(config) : 0,
                                pattern ? "test_pattern.txt" : NULL, pattern, pattern ? strlen(pattern) : 0};
    ddt_tokenizer *tok = NULL;
    ddt_error err;
    ddt_status st = ddt_tokenizer_create(&src, &tok, &err);
    if (st != DDT_OK) fail_msg("create failed: %s", err.msg);
    return tok;
}

/* Expect creation to fail with status and a message containing want. */
static void expect_fail(const char *model, size_t model_len, const char *config, const char *pattern,
                        ddt_status status, const char *want) {
    ddt_tokenizer_source src = {"test.model", (const uint8_t *)model, model_len,
                                config ? "test_config.json" : NULL, config, config ? strlen(config) : 0,
                                pattern ? "test_pattern.txt" : NULL, pattern, pattern ? strlen(pattern) : 0};
    ddt_tokenizer *tok = (ddt_tokenizer *)1;
    ddt_error err = {0};
    ddt_status st = ddt_tokenizer_create(&src, &tok, &err);
    assert_null(tok);
    if (st != status || !strstr(err.msg, want))
        fail_msg("want status %d with \"%s\", got %d: \"%s\"", (int)status, want, (int)st, err.msg);
}

static void expect_fail_model(const char *model, ddt_status status, const char *want) {
    expect_fail(model, strlen(model), NULL, NULL, status, want);
}

/* Encode a NUL-terminated string; returns the count, ids in out[cap]. */
static size_t enc(ddt_tokenizer *tok, const char *s, uint32_t flags, int32_t *out, size_t cap) {
    size_t n = 0;
    ddt_error err;
    ddt_status st = ddt_tokenizer_encode(tok, s, strlen(s), flags, out, cap, &n, &err);
    if (st != DDT_OK) fail_msg("encode \"%s\": %s", s, err.msg);
    return n;
}

/* a=0 b=1 c=2 space=3 ab=4 bc=5 abc=6 aa=7 xyz=8 x=9 y=10 z=11, as a tiktoken.model */
static const char small_model[] =
    "YQ== 0\nYg== 1\nYw== 2\nIA== 3\nYWI= 4\nYmM= 5\nYWJj 6\nYWE= 7\neHl6 8\neA== 9\neQ== 10\neg== 11\n";

/* ------------------------------------------------------------------ BPE */

static void test_bpe_merge_order(void **state) {
    (void)state;
    ddt_tokenizer *tok = make_tok(small_model, NULL, NULL);
    int32_t ids[32];
    assert_int_equal(ddt_tokenizer_vocab_size(tok), 12);
    assert_int_equal(ddt_tokenizer_n_ranks(tok), 12);
    assert_int_equal(ddt_tokenizer_n_special(tok), 0);
    /* A whole piece that is a token is that token. */
    assert_int_equal(enc(tok, "abc", 0, ids, 32), 1);
    assert_int_equal(ids[0], 6);
    /* xyz is a token even though no pair of its bytes is: tiktoken looks the piece up first. */
    assert_int_equal(enc(tok, "xyz", 0, ids, 32), 1);
    assert_int_equal(ids[0], 8);
    /* "xyzx": no pair merges, so single bytes. */
    assert_int_equal(enc(tok, "xyzx", 0, ids, 32), 4);
    assert_int_equal(ids[0], 9);
    assert_int_equal(ids[3], 9);
    /* "aaa": aa (7) merges at the leftmost pair first. */
    assert_int_equal(enc(tok, "aaa", 0, ids, 32), 2);
    assert_int_equal(ids[0], 7);
    assert_int_equal(ids[1], 0);
    /* "bcab": pairs bc(5) ca(-) ab(4): ab first -> b,c,ab; then bc(5) -> bc,ab; "cab" is no token. */
    assert_int_equal(enc(tok, "bcab", 0, ids, 32), 2);
    assert_int_equal(ids[0], 5);
    assert_int_equal(ids[1], 4);
    /* "abcab": ab at 0 and 3 (rank 4, leftmost first), then ab+c = abc (6): abc, ab. */
    assert_int_equal(enc(tok, "abcab", 0, ids, 32), 2);
    assert_int_equal(ids[0], 6);
    assert_int_equal(ids[1], 4);
    /* "cabc": pairs ca(-) ab(4) bc(5): ab first -> c,ab,c; then abc(6) -> c,abc. */
    assert_int_equal(enc(tok, "cabc", 0, ids, 32), 2);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 6);
    /* Pre-tokenisation: " abc abc" is two pieces " abc"; " abc" is no token -> space, abc. */
    assert_int_equal(enc(tok, "abc abc", 0, ids, 32), 3);
    assert_int_equal(ids[0], 6);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 6);
    ddt_tokenizer_free(tok);
}

static void test_missing_bytes_and_buffers(void **state) {
    (void)state;
    ddt_tokenizer *tok = make_tok(small_model, NULL, NULL);
    int32_t ids[4];
    size_t n = 99;
    ddt_error err;
    /* 'd' has no token. */
    assert_int_equal(ddt_tokenizer_encode(tok, "ab d", 4, 0, ids, 4, &n, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "offset 3"));
    /* Count only. */
    assert_int_equal(ddt_tokenizer_encode(tok, "a b c a", 7, 0, NULL, 0, &n, &err), DDT_ERR_RANGE);
    assert_int_equal(n, 7);
    /* Partial fill: the first ids are written, the count is complete. */
    assert_int_equal(ddt_tokenizer_encode(tok, "a b c a", 7, 0, ids, 2, &n, &err), DDT_ERR_RANGE);
    assert_int_equal(n, 7);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ddt_tokenizer_encode(tok, "", 0, 0, NULL, 0, &n, &err), DDT_OK);
    assert_int_equal(n, 0);
    assert_int_equal(ddt_tokenizer_encode(tok, "a", 1, 1u << 7, ids, 4, &n, &err), DDT_ERR_INVALID);

    /* Decode: sizes, range, unknown ids. */
    int32_t seq[3] = {6, 3, 8};
    char out[16];
    size_t len = 0;
    assert_int_equal(ddt_tokenizer_decode(tok, seq, 3, out, sizeof out, &len, &err), DDT_OK);
    assert_int_equal(len, 7);
    assert_memory_equal(out, "abc xyz", 7);
    assert_int_equal(ddt_tokenizer_decode(tok, seq, 3, out, 5, &len, &err), DDT_ERR_RANGE);
    assert_int_equal(len, 7);
    assert_memory_equal(out, "abc x", 5);
    int32_t bad[2] = {1, 12};
    assert_int_equal(ddt_tokenizer_decode(tok, bad, 2, out, sizeof out, &len, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "id 12 at position 1"));
    bad[1] = -5;
    assert_int_equal(ddt_tokenizer_decode(tok, bad, 2, out, sizeof out, &len, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "id -5"));
    const uint8_t *bytes;
    assert_int_equal(ddt_tokenizer_token_bytes(tok, 7, &bytes, &len, &err), DDT_OK);
    assert_int_equal(len, 2);
    assert_memory_equal(bytes, "aa", 2);
    assert_int_equal(ddt_tokenizer_token_bytes(tok, 100, &bytes, &len, &err), DDT_ERR_INVALID);
    assert_int_equal(ddt_tokenizer_token_id(tok, "abc"), 6);
    assert_int_equal(ddt_tokenizer_token_id(tok, "abcd"), -1);
    ddt_tokenizer_free(tok);
}

/* All 256 bytes as ranks 0..255 plus a few merges. */
static char *byte_model(void) {
    text_buf b = {0};
    for (int i = 0; i < 256; i++) {
        uint8_t c = (uint8_t)i;
        buf_add_token(&b, &c, 1, i);
    }
    buf_add_token(&b, "\xe4\xb8", 2, 256);
    buf_add_token(&b, "\xe4\xb8\xad", 3, 257);
    buf_add_token(&b, "he", 2, 258);
    return b.p;
}

static void test_invalid_utf8_round_trip(void **state) {
    (void)state;
    char *model = byte_model();
    ddt_tokenizer *tok = make_tok(model, NULL, NULL);
    free(model);
    const char *cases[] = {"\xff", "he\xffhe", "\xe4\xb8", "\xe4\xb8\xad\xe4\xb8", "\xc0\xaf\xed\xa0\x80",
                           "  \xfe  he", "'\xff's", "\xe4\xb8\xad"};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int32_t ids[64];
        char out[64];
        size_t n = enc(tok, cases[k], 0, ids, 64), len;
        ddt_error err;
        assert_int_equal(ddt_tokenizer_decode(tok, ids, n, out, sizeof out, &len, &err), DDT_OK);
        assert_int_equal(len, strlen(cases[k]));
        assert_memory_equal(out, cases[k], len);
    }
    /* A cut UTF-8 sequence is a gap of its own, BPE-merged: e4 b8 -> 256. */
    int32_t ids[8];
    assert_int_equal(enc(tok, "he\xe4\xb8he", 0, ids, 8), 3);
    assert_int_equal(ids[0], 258);
    assert_int_equal(ids[1], 256);
    assert_int_equal(ids[2], 258);
    /* Every byte alone. */
    char all[256];
    for (int i = 0; i < 256; i++) all[i] = (char)(255 - i);
    int32_t many[600];
    size_t n;
    ddt_error err;
    assert_int_equal(ddt_tokenizer_encode(tok, all, 256, 0, many, 600, &n, &err), DDT_OK);
    char back[256];
    size_t len;
    assert_int_equal(ddt_tokenizer_decode(tok, many, n, back, sizeof back, &len, &err), DDT_OK);
    assert_int_equal(len, 256);
    assert_memory_equal(back, all, 256);
    ddt_tokenizer_free(tok);
}

/* ------------------------------------------------------------------ special tokens and chat */

static void test_special_tokens_from_config(void **state) {
    (void)state;
    const char *config = "{\"added_tokens_decoder\": {\"12\": {\"content\": \"<|im_end|>\"},"
                         " \"14\": {\"content\": \"[X]\", \"special\": true}}, \"other\": [1, 2]}";
    ddt_tokenizer *tok = make_tok(small_model, config, NULL);
    assert_int_equal(ddt_tokenizer_n_special(tok), 256);
    assert_int_equal(ddt_tokenizer_vocab_size(tok), 12 + 256);
    assert_int_equal(ddt_tokenizer_token_id(tok, "<|im_end|>"), 12);
    assert_int_equal(ddt_tokenizer_token_id(tok, "[X]"), 14);
    assert_int_equal(ddt_tokenizer_token_id(tok, "<|reserved_token_13|>"), 13);
    assert_int_equal(ddt_tokenizer_token_id(tok, "<|reserved_token_267|>"), 267);
    assert_int_equal(ddt_tokenizer_token_id(tok, "<|reserved_token_268|>"), -1);
    assert_true(ddt_tokenizer_is_special(tok, 12));
    assert_false(ddt_tokenizer_is_special(tok, 11));
    /* a generation's text: an ordinary token's bytes; none for a special, an unknown id, no tokenizer */
    const uint8_t *tb;
    size_t tl, ol;
    const uint8_t *ob;
    assert_int_equal(ddt_tokenizer_token_bytes(tok, 4, &ob, &ol, NULL), DDT_OK);
    assert_true(ddt_tokenizer_text_bytes(tok, 4, &tb, &tl));
    assert_true(tb == ob && tl == ol && tl > 0);
    assert_false(ddt_tokenizer_text_bytes(tok, 12, &tb, &tl));
    assert_true(tb == NULL && tl == 0);
    assert_false(ddt_tokenizer_text_bytes(tok, 12 + 256, &tb, &tl));
    assert_false(ddt_tokenizer_text_bytes(tok, -1, &tb, &tl));
    assert_false(ddt_tokenizer_text_bytes(NULL, 4, &tb, &tl));
    int32_t ids[32];
    /* With the flag, special text is its id; without, it would need bytes the vocabulary lacks. */
    size_t n = enc(tok, "ab<|im_end|>[X]abc", DDT_TOKENIZE_SPECIAL, ids, 32);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 4);
    assert_int_equal(ids[1], 12);
    assert_int_equal(ids[2], 14);
    assert_int_equal(ids[3], 6);
    size_t cnt;
    ddt_error err;
    assert_int_equal(ddt_tokenizer_encode(tok, "a[X]", 4, 0, ids, 32, &cnt, &err), DDT_ERR_INVALID);
    /* Special text splits pieces: "a" and "b" are not merged across it. */
    n = enc(tok, "a[X]b", DDT_TOKENIZE_SPECIAL, ids, 32);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[2], 1);
    char out[64];
    size_t len;
    int32_t seq[3] = {4, 12, 13};
    assert_int_equal(ddt_tokenizer_decode(tok, seq, 3, out, sizeof out, &len, &err), DDT_OK);
    assert_int_equal(len, strlen("ab<|im_end|><|reserved_token_13|>"));
    assert_memory_equal(out, "ab<|im_end|><|reserved_token_13|>", len);
    ddt_tokenizer_free(tok);
}

/* Special text counts only where the template wrote it: bytes marked as data stay ordinary text,
 * and the text around them is one piece (merged across the mark boundary). */
static void test_encode_marked(void **state) {
    (void)state;
    char *model = byte_model(); /* every byte, and "he" = 258 */
    ddt_tokenizer *tok = make_tok(model, "{\"added_tokens_decoder\": {\"259\": {\"content\": \"<|e|>\"}}}", NULL);
    free(model);
    const char *text = "h<|e|>he<|e|>e";
    const uint8_t data[14] = {0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1}; /* "e<|e|>e" after "h": data */
    int32_t ids[32];
    size_t n = 0;
    ddt_error err;
    assert_int_equal(ddt_tokenizer_encode_marked(tok, text, data, 14, 0, ids, 32, &n, &err), DDT_OK);
    /* h, <|e|>, then "he<|e|>e" as ordinary text: "he" merges across the template/data boundary */
    const int32_t want[] = {'h', 259, 258, '<', '|', 'e', '|', '>', 'e'};
    assert_int_equal(n, sizeof want / sizeof want[0]);
    assert_memory_equal(ids, want, sizeof want);
    /* Unmarked (NULL, or all zero): the same as encoding with DDT_TOKENIZE_SPECIAL. */
    int32_t plain[32];
    size_t pn = enc(tok, text, DDT_TOKENIZE_SPECIAL, plain, 32);
    assert_int_equal(ddt_tokenizer_encode_marked(tok, text, NULL, 14, 0, ids, 32, &n, &err), DDT_OK);
    assert_int_equal(n, pn);
    assert_memory_equal(ids, plain, n * sizeof ids[0]);
    /* A special token straddling a mark boundary is text too. */
    const uint8_t half[14] = {0, 0, 0, 0, 1};
    assert_int_equal(ddt_tokenizer_encode_marked(tok, text, half, 14, 0, ids, 32, &n, &err), DDT_OK);
    assert_int_equal(ids[1], '<');
    assert_int_equal(ids[n - 2], 259); /* the second marker is template text */
    /* The count is exact when the buffer is short; bad flags refused. */
    assert_int_equal(ddt_tokenizer_encode_marked(tok, text, data, 14, 0, ids, 2, &n, &err), DDT_ERR_RANGE);
    assert_int_equal(n, sizeof want / sizeof want[0]);
    assert_int_equal(ddt_tokenizer_encode_marked(tok, text, data, 14, 1u << 7, ids, 32, &n, &err), DDT_ERR_INVALID);
    ddt_tokenizer_free(tok);
}

static void test_kimi_builtin_specials_and_chat(void **state) {
    (void)state;
    /* 163584 ranks: the 256 bytes, then distinct 3-byte strings. */
    text_buf b = {0};
    char *bytes = byte_model(); /* ranks 0..258 */
    buf_add(&b, bytes);
    free(bytes);
    for (int32_t r = 259; r < DDT_TOKENIZER_KIMI_RANKS; r++) {
        uint8_t t[3] = {(uint8_t)(0x80 | (r >> 14)), (uint8_t)(r >> 7 & 0x7F), (uint8_t)(r & 0x7F)};
        buf_add_token(&b, t, 3, r);
    }
    ddt_tokenizer *tok = make_tok(b.p, NULL, NULL);
    free(b.p);
    assert_int_equal(ddt_tokenizer_n_ranks(tok), 163584);
    assert_int_equal(ddt_tokenizer_vocab_size(tok), 163840);
    assert_int_equal(ddt_tokenizer_n_special(tok), 256);
    assert_int_equal(ddt_tokenizer_token_id(tok, "[BOS]"), 163584);
    assert_int_equal(ddt_tokenizer_token_id(tok, "[EOS]"), 163585);
    assert_int_equal(ddt_tokenizer_token_id(tok, "<|im_end|>"), 163586);
    assert_int_equal(ddt_tokenizer_token_id(tok, "<|im_user|>"), 163587);
    assert_int_equal(ddt_tokenizer_token_id(tok, "<|im_assistant|>"), 163588);
    assert_int_equal(ddt_tokenizer_token_id(tok, "<|im_system|>"), 163594);
    assert_int_equal(ddt_tokenizer_token_id(tok, "<|im_middle|>"), 163601);
    assert_int_equal(ddt_tokenizer_token_id(tok, "[UNK]"), 163838);
    assert_int_equal(ddt_tokenizer_token_id(tok, "[PAD]"), 163839);
    assert_int_equal(ddt_tokenizer_token_id(tok, "<|reserved_token_163590|>"), 163590);

    int32_t ids[512];
    size_t n = 0;
    ddt_error err;
    assert_int_equal(ddt_chat_encode_prompt(NULL, tok, NULL, "hi", ids, 512, &n, &err), DDT_OK);
    const char *rendered = "<|im_system|>system<|im_middle|>" DDT_CHAT_KIMI_DEFAULT_SYSTEM
                           "<|im_end|><|im_user|>user<|im_middle|>hi<|im_end|>"
                           "<|im_assistant|>assistant<|im_middle|>";
    int32_t want[512];
    size_t wn = enc(tok, rendered, DDT_TOKENIZE_SPECIAL, want, 512);
    assert_int_equal(n, wn);
    assert_memory_equal(ids, want, n * sizeof ids[0]);
    assert_int_equal(ids[0], 163594);
    assert_int_equal(ids[n - 1], 163601);

    /* Multi-turn with an explicit system message, no generation prompt (the built-in template). */
    ddt_chat_template *t = NULL;
    assert_int_equal(ddt_chat_template_create(NULL, 0, NULL, NULL, 0, &t, &err), DDT_OK);
    assert_string_equal(ddt_chat_template_origin(t), "built-in Kimi K2");
    json_t *msgs = json_loads("[{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"q\"},"
                              " {\"role\": \"assistant\", \"content\": \"a\"}]", 0, NULL);
    assert_non_null(msgs);
    ddt_chat_input in = {.messages = msgs, .add_generation_prompt = false};
    int32_t *all = NULL;
    assert_int_equal(ddt_chat_encode(t, tok, &in, &all, &n, &err), DDT_OK);
    wn = enc(tok,
             "<|im_system|>system<|im_middle|>sys<|im_end|><|im_user|>user<|im_middle|>q<|im_end|>"
             "<|im_assistant|>assistant<|im_middle|>a<|im_end|>",
             DDT_TOKENIZE_SPECIAL, want, 512);
    assert_int_equal(n, wn);
    assert_memory_equal(all, want, n * sizeof all[0]);
    free(all);
    json_decref(msgs);
    /* Too small a buffer: the count is still right. */
    assert_int_equal(ddt_chat_encode_prompt(t, tok, "sys", "q", ids, 5, &n, &err), DDT_ERR_RANGE);
    assert_true(n > 5);
    /* A message that is not an object with a role is refused. */
    msgs = json_loads("[{\"content\": \"x\"}]", 0, NULL);
    in.messages = msgs;
    assert_int_equal(ddt_chat_encode(t, tok, &in, &all, &n, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "messages[0]"));
    json_decref(msgs);
    ddt_chat_template_free(t);
    ddt_tokenizer_free(tok);

    /* Without the markers the built-in chat template refuses. */
    tok = make_tok(small_model, NULL, NULL);
    assert_int_equal(ddt_chat_encode_prompt(NULL, tok, NULL, "hi", ids, 512, &n, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "<|im_system|>"));
    ddt_tokenizer_free(tok);
}

/* ------------------------------------------------------------------ loader errors */

static void test_model_errors(void **state) {
    (void)state;
    expect_fail_model("", DDT_ERR_FORMAT, "test.model: no tokens");
    expect_fail_model("\n\n\r\n", DDT_ERR_FORMAT, "no tokens");
    expect_fail_model("YQ== 0\nY!== 1\n", DDT_ERR_FORMAT, "test.model line 2: bad base64: character 0x21");
    expect_fail_model("YQ= 0\n", DDT_ERR_FORMAT, "line 1: bad base64: length 3");
    expect_fail_model("Y=Q= 0\n", DDT_ERR_FORMAT, "line 1: bad base64");
    expect_fail_model("YQ=a 0\n", DDT_ERR_FORMAT, "line 1: bad base64: character 0x3d at column 3");
    expect_fail_model("==== 0\n", DDT_ERR_FORMAT, "line 1: bad base64");
    expect_fail_model("YQ== 0\nYg== 0\n", DDT_ERR_FORMAT, "line 2: rank 0 repeats line 1");
    expect_fail_model("YQ== 0\nYg== 1\nYQ== 2\n", DDT_ERR_FORMAT, "line 3: token bytes repeat rank 0 of line 1");
    expect_fail_model("YQ== 16777216\n", DDT_ERR_RANGE, "line 1: rank over the limit");
    expect_fail_model("YQ== 99999999999999999999999\n", DDT_ERR_RANGE, "rank over the limit");
    expect_fail_model("YQ== -1\n", DDT_ERR_FORMAT, "line 1: rank is not a decimal number");
    expect_fail_model("YQ== 1x\n", DDT_ERR_FORMAT, "line 1: unexpected byte 0x78 after the rank");
    expect_fail_model("YQ== 1 2\n", DDT_ERR_FORMAT, "line 1: unexpected byte");
    expect_fail_model("YQ==\n", DDT_ERR_FORMAT, "line 1: expected 'base64 rank', found no rank");
    expect_fail_model("YQ==   \n", DDT_ERR_FORMAT, "found no rank");
    expect_fail_model(" YQ== 0\n", DDT_ERR_FORMAT, "line 1: expected 'base64 rank'");
    expect_fail("YQ== 0\n\0", 8, NULL, NULL, DDT_ERR_FORMAT, "line 2: expected 'base64 rank'");

    /* Accepted: no final newline, CRLF, tabs, blank lines, trailing spaces, sparse ranks. */
    ddt_tokenizer *tok = make_tok("YQ==\t0\r\n\r\nYg==  5  \nYWI= 100", NULL, NULL);
    assert_int_equal(ddt_tokenizer_vocab_size(tok), 101);
    assert_int_equal(ddt_tokenizer_n_ranks(tok), 3);
    int32_t ids[4];
    assert_int_equal(enc(tok, "ab", 0, ids, 4), 1);
    assert_int_equal(ids[0], 100);
    assert_int_equal(enc(tok, "ba", 0, ids, 4), 2);
    assert_int_equal(ids[0], 5);
    assert_int_equal(ids[1], 0);
    ddt_tokenizer_free(tok);
}

static void test_config_errors(void **state) {
    (void)state;
    const char *m = small_model;
    size_t ml = strlen(m);
    expect_fail(m, ml, "{\"added_tokens_decoder\": ", NULL, DDT_ERR_FORMAT, "test_config.json line 1");
    expect_fail(m, ml, "[1, 2]", NULL, DDT_ERR_FORMAT, "test_config.json: top level is not a JSON object");
    expect_fail(m, ml, "{\"added_tokens_decoder\": []}", NULL, DDT_ERR_FORMAT, "added_tokens_decoder is not an object");
    expect_fail(m, ml, "{\"added_tokens_decoder\": {\"x1\": {\"content\": \"a\"}}}", NULL, DDT_ERR_FORMAT,
                "added_tokens_decoder[\"x1\"]: the key is not a decimal id");
    expect_fail(m, ml, "{\"added_tokens_decoder\": {\"\": {\"content\": \"a\"}}}", NULL, DDT_ERR_FORMAT,
                "not a decimal id");
    expect_fail(m, ml, "{\"added_tokens_decoder\": {\"99999999999\": {\"content\": \"a\"}}}", NULL, DDT_ERR_RANGE,
                "id over the limit");
    expect_fail(m, ml, "{\"added_tokens_decoder\": {\"20\": {\"special\": true}}}", NULL, DDT_ERR_FORMAT,
                "added_tokens_decoder[\"20\"]: no non-empty string \"content\"");
    expect_fail(m, ml, "{\"added_tokens_decoder\": {\"20\": {\"content\": \"\"}}}", NULL, DDT_ERR_FORMAT,
                "no non-empty string");
    expect_fail(m, ml, "{\"added_tokens_decoder\": {\"3\": {\"content\": \"<s>\"}}}", NULL, DDT_ERR_FORMAT,
                "special token id 3 is also an ordinary rank");
    expect_fail(m, ml, "{\"added_tokens_decoder\": {\"20\": {\"content\": \"<s>\"}, \"020\": {\"content\": \"<t>\"}}}",
                NULL, DDT_ERR_FORMAT, "special token id 20 given twice");
    expect_fail(m, ml, "{\"added_tokens_decoder\": {\"20\": {\"content\": \"<s>\"}, \"21\": {\"content\": \"<s>\"}}}",
                NULL, DDT_ERR_FORMAT, "have the same text");
    expect_fail(m, ml, "{\"added_tokens_decoder\": {\"20\": {\"content\": \"<|reserved_token_12|>\"}}}", NULL,
                DDT_ERR_FORMAT, "have the same text");
    expect_fail(m, ml, "{\"a\": 1, \"a\": 2}", NULL, DDT_ERR_FORMAT, "test_config.json line");
    /* A config without added_tokens_decoder: no specials for a non-Kimi size. */
    ddt_tokenizer *tok = make_tok(m, "{\"model_max_length\": 1000}", NULL);
    assert_int_equal(ddt_tokenizer_n_special(tok), 0);
    ddt_tokenizer_free(tok);
}

static void test_pattern_file(void **state) {
    (void)state;
    /* A custom pattern: whole runs of non-space, so "abc abc" keeps " " apart. */
    ddt_tokenizer *tok = make_tok(small_model, NULL, "[a-z]|\\s+\n");
    int32_t ids[8];
    assert_int_equal(enc(tok, "abc", 0, ids, 8), 3); /* one letter per piece: no merges */
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[2], 2);
    ddt_tokenizer_free(tok);
    /* A pattern that can match empty text must still make progress. */
    tok = make_tok(small_model, NULL, "a*");
    assert_int_equal(enc(tok, "baab", 0, ids, 8), 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 7);
    assert_int_equal(ids[2], 1);
    ddt_tokenizer_free(tok);
    expect_fail(small_model, strlen(small_model), NULL, "(unclosed", DDT_ERR_FORMAT, "test_pattern.txt: offset");
    expect_fail(small_model, strlen(small_model), NULL, "\n", DDT_ERR_FORMAT, "test_pattern.txt: empty pattern");
    expect_fail(small_model, strlen(small_model), NULL, "\xff", DDT_ERR_FORMAT, "test_pattern.txt: offset 0");
}

/* Details of the built-in pattern where PCRE2's defaults differ from Rust's regex. */
static void test_kimi_pattern_details(void **state) {
    (void)state;
    text_buf b = {0};
    char *bytes = byte_model(); /* ranks 0..258 */
    buf_add(&b, bytes);
    free(bytes);
    buf_add_token(&b, "\xe3\x80\x86\xe5\x88\x87", 6, 259); /* 〆切 */
    buf_add_token(&b, "\xe4\xb8\xad\xe6\x96\x87", 6, 260); /* 中文 */
    buf_add_token(&b, "!\xe1\xa0\x8e", 4, 261);               /* ! U+180E */
    buf_add_token(&b, "IT'S", 4, 262);
    buf_add_token(&b, "it'\xc5\xbf", 5, 263);                  /* it'ſ */
    ddt_tokenizer *tok = make_tok(b.p, NULL, NULL);
    free(b.p);
    int32_t ids[16];
    /* 中文 is one Han run. */
    assert_int_equal(enc(tok, "\xe4\xb8\xad\xe6\x96\x87", 0, ids, 16), 1);
    assert_int_equal(ids[0], 260);
    /* 〆 is Script=Common (only Script_Extensions has Han): it does not join the Han run. */
    assert_int_equal(enc(tok, "\xe3\x80\x86\xe5\x88\x87", 0, ids, 16), 6);
    /* U+180E is not White_Space: it joins the punctuation run. */
    assert_int_equal(enc(tok, "!\xe1\xa0\x8e", 0, ids, 16), 1);
    assert_int_equal(ids[0], 261);
    /* Contractions are case-insensitive, down to the long s. */
    assert_int_equal(enc(tok, "IT'S", 0, ids, 16), 1);
    assert_int_equal(ids[0], 262);
    assert_int_equal(enc(tok, "it'\xc5\xbf", 0, ids, 16), 1);
    assert_int_equal(ids[0], 263);
    ddt_tokenizer_free(tok);
}

static void test_load_fixture_folder(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer", DDT_SOURCE_DIR);
    ddt_tokenizer *tok = NULL;
    ddt_error err;
    if (ddt_tokenizer_load(path, &tok, &err) != DDT_OK) fail_msg("%s", err.msg);
    assert_int_equal(ddt_tokenizer_n_ranks(tok), 266);
    assert_int_equal(ddt_tokenizer_vocab_size(tok), 266 + 256);
    assert_int_equal(ddt_tokenizer_token_id(tok, "<|im_end|>"), 268);
    int32_t ids[16];
    size_t n = enc(tok, "hello world\xe4\xb8\xad<|im_end|>", DDT_TOKENIZE_SPECIAL, ids, 16);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 259); /* hello */
    assert_int_equal(ids[1], 263); /* " world" */
    assert_int_equal(ids[2], 265); /* 中 */
    assert_int_equal(ids[3], 268);
    ddt_tokenizer_free(tok);

    /* The model file alone: no side files, so no specials. */
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer/tiktoken.model", DDT_SOURCE_DIR);
    assert_int_equal(ddt_tokenizer_load(path, &tok, &err), DDT_OK);
    assert_int_equal(ddt_tokenizer_n_special(tok), 0);
    ddt_tokenizer_free(tok);

    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer/no_such_file", DDT_SOURCE_DIR);
    assert_int_equal(ddt_tokenizer_load(path, &tok, &err), DDT_ERR_IO);
    assert_non_null(strstr(err.msg, "no_such_file"));
    assert_null(tok);
    /* A folder without tiktoken.model. */
    snprintf(path, sizeof path, "%s/tests", DDT_SOURCE_DIR);
    assert_int_equal(ddt_tokenizer_load(path, &tok, &err), DDT_ERR_IO);
    assert_non_null(strstr(err.msg, "tiktoken.model"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_merge_order),
        cmocka_unit_test(test_missing_bytes_and_buffers),
        cmocka_unit_test(test_invalid_utf8_round_trip),
        cmocka_unit_test(test_special_tokens_from_config),
        cmocka_unit_test(test_kimi_builtin_specials_and_chat),
        cmocka_unit_test(test_encode_marked),
        cmocka_unit_test(test_model_errors),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_pattern_file),
        cmocka_unit_test(test_kimi_pattern_details),
        cmocka_unit_test(test_load_fixture_folder),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
