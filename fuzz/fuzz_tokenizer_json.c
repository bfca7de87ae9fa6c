/*
 * fuzz_tokenizer_json.c — libFuzzer target for the tokenizer.json format.  The
 * first byte picks a mode:
 *   even: encode the rest as text (any bytes, invalid UTF-8 included) with a
 *         fixed DeepSeek-V3-style tokenizer.json (its three Split regexes,
 *         byte-level vocabulary, a few merges and added tokens), with and
 *         without special tokens and as marked chat text, and require
 *         decode(encode(x)) == x;
 *   odd:  the rest is a tokenizer.json for the loader; when it loads, the input
 *         itself is encoded both ways and the ids decoded (a round trip is not
 *         required: an added token's text may decode to other bytes, as in HF).
 * Any crash, hang, leak, overrun or UB is a bug, as is a failed round trip or a
 * failure without a message.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

static ddt_tokenizer *g_tok;
static int32_t g_ids[1 << 16];
static char g_out[1 << 18];
static uint8_t g_marks[1 << 16];

/* Appends the JSON string of code point cp (as \uXXXX, surrogate pairs above U+FFFF). */
static size_t put_cp(char *out, uint32_t cp) {
    if (cp >= 0x10000) {
        cp -= 0x10000;
        return (size_t)sprintf(out, "\\u%04X\\u%04X", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    }
    return (size_t)sprintf(out, "\\u%04X", cp);
}

/* GPT-2's bytes_to_unicode character of byte b. */
static uint32_t byte_char(int b) {
    int extra = 0;
    for (int k = 0; k < b; k++)
        if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE && k <= 0xFF))) extra++;
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    return printable ? (uint32_t)b : 256u + (uint32_t)extra;
}

static ddt_tokenizer *fixed_tokenizer(void) {
    /* merges as byte strings; each merge's parts are all but its last byte, and that byte (both tokens) */
    static const char *merged[] = {"he", "hel", "hell", "hello", "th", "the", "12", "123", "  ", "\n\n",
                                   "\xe4\xb8", "\xe4\xb8\xad", "\xf0\x9f", "\xf0\x9f\x98", "in", "ing"};
    static char json[65536];
    size_t o = 0;
    o += (size_t)sprintf(json + o,
                         "{\"added_tokens\":["
                         "{\"id\":300,\"content\":\"<\\uFF5Cbegin\\u2581of\\u2581sentence\\uFF5C>\",\"special\":true,"
                         "\"normalized\":false},"
                         "{\"id\":301,\"content\":\"<think>\",\"special\":false,\"normalized\":true},"
                         "{\"id\":302,\"content\":\"<|EOT|>\",\"special\":true,\"normalized\":true}],"
                         "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
                         "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}{1,3}\"},\"behavior\":\"Isolated\"},"
                         "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[\\u4E00-\\u9FA5\\u3040-\\u309F\\u30A0-\\u30FF]+\"},"
                         "\"behavior\":\"Isolated\"},"
                         "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[!\\\"#$%%&'()*+,\\\\-./:;<=>?@\\\\[\\\\\\\\\\\\]^_`{|}~]"
                         "[A-Za-z]+|[^\\r\\n\\\\p{L}\\\\p{P}\\\\p{S}]?[\\\\p{L}\\\\p{M}]+| ?[\\\\p{P}\\\\p{S}]+[\\r\\n]*"
                         "|\\\\s*[\\r\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\"},"
                         "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
                         "\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int b = 0; b < 256; b++) {
        json[o++] = '"';
        o += put_cp(json + o, byte_char(b));
        o += (size_t)sprintf(json + o, "\":%d,", b);
    }
    size_t n_merged = sizeof merged / sizeof merged[0];
    for (size_t k = 0; k < n_merged; k++) {
        json[o++] = '"';
        for (const char *p = merged[k]; *p; p++) o += put_cp(json + o, byte_char((uint8_t)*p));
        o += (size_t)sprintf(json + o, "\":%zu%s", 256 + k, k + 1 < n_merged ? "," : "},\"merges\":[");
    }
    for (size_t k = 0; k < n_merged; k++) {
        size_t len = strlen(merged[k]);
        o += (size_t)sprintf(json + o, "%s[\"", k ? "," : "");
        for (size_t i = 0; i + 1 < len; i++) o += put_cp(json + o, byte_char((uint8_t)merged[k][i]));
        o += (size_t)sprintf(json + o, "\",\"");
        o += put_cp(json + o, byte_char((uint8_t)merged[k][len - 1]));
        o += (size_t)sprintf(json + o, "\"]");
    }
    o += (size_t)sprintf(json + o, "]}}");
    ddt_tokenizer *tok = NULL;
    ddt_error err;
    if (ddt_tokenizer_create_json("fixed.json", json, o, &tok, &err) != DDT_OK) {
        fprintf(stderr, "fixed tokenizer: %s\n", err.msg);
        abort();
    }
    return tok;
}

static void check_round_trip(ddt_tokenizer *tok, const uint8_t *text, size_t n, uint32_t flags, const uint8_t *marks) {
    size_t n_ids = 0, len = 0;
    ddt_error err;
    ddt_status st = marks ? ddt_tokenizer_encode_marked(tok, (const char *)text, marks, n, 0, g_ids,
                                                        sizeof g_ids / sizeof g_ids[0], &n_ids, &err)
                          : ddt_tokenizer_encode(tok, (const char *)text, n, flags, g_ids,
                                                 sizeof g_ids / sizeof g_ids[0], &n_ids, &err);
    if (st != DDT_OK) abort(); /* every byte has a token */
    st = ddt_tokenizer_decode(tok, g_ids, n_ids, g_out, sizeof g_out, &len, NULL);
    if (st != DDT_OK || len != n || (n && memcmp(g_out, text, n) != 0)) abort();
}

static void encode_any(ddt_tokenizer *tok, const uint8_t *text, size_t n, uint32_t flags) {
    size_t n_ids = 0, len = 0;
    ddt_error err;
    ddt_status st = ddt_tokenizer_encode(tok, (const char *)text, n, flags, g_ids, sizeof g_ids / sizeof g_ids[0],
                                         &n_ids, &err);
    if (st != DDT_OK) {
        if (err.msg[0] == '\0') abort();
        return;
    }
    if (ddt_tokenizer_decode(tok, g_ids, n_ids, g_out, sizeof g_out, &len, NULL) != DDT_OK && len <= sizeof g_out)
        abort(); /* every id encode gives is in the vocabulary */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok) g_tok = fixed_tokenizer();
    if (size == 0 || size > 60000) return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    if ((data[0] & 1) == 0) {
        check_round_trip(g_tok, p, n, 0, NULL);
        check_round_trip(g_tok, p, n, DDT_TOKENIZE_SPECIAL, NULL);
        for (size_t i = 0; i < n; i++) g_marks[i] = (uint8_t)((i / 7 + data[0] / 2) & 1); /* data / template runs */
        check_round_trip(g_tok, p, n, 0, g_marks);
        return 0;
    }
    ddt_tokenizer *tok = NULL;
    ddt_error err;
    if (ddt_tokenizer_create_json("fuzz.json", (const char *)p, n, &tok, &err) != DDT_OK) {
        if (tok || err.status == DDT_OK || err.msg[0] == '\0') abort();
        return 0;
    }
    encode_any(tok, data, size, 0);
    encode_any(tok, data, size, DDT_TOKENIZE_SPECIAL);
    ddt_tokenizer_free(tok);
    return 0;
}
