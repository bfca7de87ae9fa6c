/*
 * fuzz_tokenizer.c — libFuzzer target for the tokenizer.  The first byte picks
 * a mode:
 *   even: encode the rest as text (any bytes, invalid UTF-8 included) with a
 *         fixed byte-level vocabulary, with and without special tokens and
 *         Kimi's chunking, and require decode(encode(x)) == x;
 *   odd:  the rest is "tiktoken.model NUL tokenizer_config.json NUL pattern"
 *         (later parts optional) for the loader; when it loads, its own text is
 *         encoded and, when every byte has a token, must round-trip.
 * Any crash, hang, leak, overrun or UB is a bug, as is a failed round trip.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

static ddt_tokenizer *g_tok;
static int32_t g_ids[1 << 16];
static char g_out[1 << 18];

/* 256 byte ranks, a few merges (English, CJK, emoji, whitespace) and Kimi-like specials. */
static ddt_tokenizer *fixed_tokenizer(void) {
    static const char *merges[] = {"he", "ll", "llo", "hello", " w", "or", "orld", " world", "th", " the",
                                   "in", "ing", "  ", "    ", "\n\n", "\xe4\xb8", "\xe4\xb8\xad",
                                   "\xf0\x9f", "\xf0\x9f\x98", "'s", "12", "123", "\r\n"};
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    static char model[16384];
    size_t len = 0;
    int rank = 0;
    for (int i = 0; i < 256 + (int)(sizeof merges / sizeof merges[0]); i++, rank++) {
        uint8_t tok[8];
        size_t n;
        if (i < 256) {
            tok[0] = (uint8_t)i;
            n = 1;
        } else {
            n = strlen(merges[i - 256]);
            memcpy(tok, merges[i - 256], n);
        }
        for (size_t k = 0; k < n; k += 3) {
            uint32_t v = (uint32_t)tok[k] << 16 | (k + 1 < n ? (uint32_t)tok[k + 1] << 8 : 0) |
                         (k + 2 < n ? tok[k + 2] : 0);
            model[len++] = tab[v >> 18 & 63];
            model[len++] = tab[v >> 12 & 63];
            model[len++] = k + 1 < n ? tab[v >> 6 & 63] : '=';
            model[len++] = k + 2 < n ? tab[v & 63] : '=';
        }
        len += (size_t)snprintf(model + len, sizeof model - len, " %d\n", rank);
    }
    char config[256];
    snprintf(config, sizeof config,
             "{\"added_tokens_decoder\": {\"%d\": {\"content\": \"<|im_end|>\"}, \"%d\": {\"content\": \"[BOS]\"}}}",
             rank + 2, rank);
    ddt_tokenizer_source src = {"fixed.model", (const uint8_t *)model, len, "fixed.json", config, strlen(config),
                                NULL, NULL, 0};
    ddt_tokenizer *tok = NULL;
    if (ddt_tokenizer_create(&src, &tok, NULL) != DDT_OK) abort();
    return tok;
}

static void check_round_trip(ddt_tokenizer *tok, const uint8_t *text, size_t n, uint32_t flags, int must_encode) {
    size_t n_ids = 0, len = 0;
    ddt_status st = ddt_tokenizer_encode(tok, (const char *)text, n, flags, g_ids, sizeof g_ids / sizeof g_ids[0],
                                         &n_ids, NULL);
    if (st != DDT_OK) {
        if (must_encode) abort();
        return;
    }
    st = ddt_tokenizer_decode(tok, g_ids, n_ids, g_out, sizeof g_out, &len, NULL);
    if (st != DDT_OK || len != n || (n && memcmp(g_out, text, n) != 0)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok) g_tok = fixed_tokenizer();
    if (size == 0 || size > 60000) return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    if ((data[0] & 1) == 0) {
        check_round_trip(g_tok, p, n, 0, 1);
        check_round_trip(g_tok, p, n, DDT_TOKENIZE_SPECIAL, 1);
        check_round_trip(g_tok, p, n, DDT_TOKENIZE_SPECIAL | DDT_TOKENIZE_KIMI_CHUNKS, 1);
        return 0;
    }
    /* Split at NULs: model, config, pattern. */
    const uint8_t *parts[3] = {p, NULL, NULL};
    size_t lens[3] = {n, 0, 0};
    for (int k = 0; k < 2; k++) {
        const uint8_t *z = memchr(parts[k], 0, lens[k]);
        if (!z) break;
        parts[k + 1] = z + 1;
        lens[k + 1] = lens[k] - (size_t)(z + 1 - parts[k]);
        lens[k] = (size_t)(z - parts[k]);
    }
    ddt_tokenizer_source src = {"fuzz.model", parts[0], lens[0],
                                parts[1] ? "fuzz.json" : NULL, (const char *)parts[1], lens[1],
                                parts[2] ? "fuzz_pattern.txt" : NULL, (const char *)parts[2], lens[2]};
    ddt_tokenizer *tok = NULL;
    ddt_error err;
    if (ddt_tokenizer_create(&src, &tok, &err) != DDT_OK) {
        if (tok || err.status == DDT_OK || err.msg[0] == '\0') abort();
        return 0;
    }
    check_round_trip(tok, data, size, 0, 0);
    check_round_trip(tok, data, size, DDT_TOKENIZE_SPECIAL, 0);
    ddt_tokenizer_free(tok);
    return 0;
}
