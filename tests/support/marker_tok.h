/*
 * marker_tok.h — for the chat-output tests: the shipped model's tiktoken.model
 * with the chat markers named at Kimi's offsets from the first special id
 * (tool markers +11..+15, <think> +22, </think> +23, <|im_end|> +2), or with
 * only <|im_end|>; or (marker_tok_ds) DeepSeek's tool markers at the same
 * offsets (<｜tool▁calls▁begin｜> +11, <｜tool▁calls▁end｜> +12,
 * <｜tool▁call▁begin｜> +13, <｜tool▁sep｜> +14, <｜tool▁call▁end｜> +15),
 * <think> / </think> as before and <｜end▁of▁sentence｜> +2.  Header-only (each test is one executable); include after
 * cmocka.h.
 */
#ifndef DDT_TESTS_MARKER_TOK_H
#define DDT_TESTS_MARKER_TOK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

enum { MT_B = 4096, MT_END = MT_B + 2, MT_SEC = MT_B + 11, MT_SEC_END = MT_B + 12, MT_CALL = MT_B + 13,
       MT_ARG = MT_B + 14, MT_CALL_END = MT_B + 15, MT_THINK = MT_B + 22, MT_THINK_END = MT_B + 23 };

static ddt_tokenizer *marker_tok_config(const char *config) {
    char path[1024];
    snprintf(path, sizeof path, "%s/models/pystdlib-target/tiktoken.model", DDT_SOURCE_DIR);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *model = malloc((size_t)n);
    assert_non_null(model);
    assert_int_equal(fread(model, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    ddt_tokenizer_source src = {path, model, (size_t)n, "test_config.json", config, strlen(config), NULL, NULL, 0};
    ddt_tokenizer *tok = NULL;
    ddt_error err;
    if (ddt_tokenizer_create(&src, &tok, &err) != DDT_OK) fail_msg("tokenizer: %s", err.msg);
    free(model);
    return tok;
}

static ddt_tokenizer *marker_tok(bool markers) {
    return marker_tok_config(
        markers
            ? "{\"added_tokens_decoder\": {\"4098\": {\"content\": \"<|im_end|>\"},"
              " \"4107\": {\"content\": \"<|tool_calls_section_begin|>\"}, \"4108\": {\"content\": \"<|tool_calls_section_end|>\"},"
              " \"4109\": {\"content\": \"<|tool_call_begin|>\"}, \"4110\": {\"content\": \"<|tool_call_argument_begin|>\"},"
              " \"4111\": {\"content\": \"<|tool_call_end|>\"}, \"4118\": {\"content\": \"<think>\"},"
              " \"4119\": {\"content\": \"</think>\"}}}"
            : "{\"added_tokens_decoder\": {\"4098\": {\"content\": \"<|im_end|>\"}}}");
}

/* DeepSeek's markers (the UTF-8 of ｜ U+FF5C and ▁ U+2581 spelled out, as JSON escapes). */
static inline ddt_tokenizer *marker_tok_ds(void) {
    return marker_tok_config(
        "{\"added_tokens_decoder\": {\"4098\": {\"content\": \"<\\uff5cend\\u2581of\\u2581sentence\\uff5c>\"},"
        " \"4107\": {\"content\": \"<\\uff5ctool\\u2581calls\\u2581begin\\uff5c>\"},"
        " \"4108\": {\"content\": \"<\\uff5ctool\\u2581calls\\u2581end\\uff5c>\"},"
        " \"4109\": {\"content\": \"<\\uff5ctool\\u2581call\\u2581begin\\uff5c>\"},"
        " \"4110\": {\"content\": \"<\\uff5ctool\\u2581sep\\uff5c>\"},"
        " \"4111\": {\"content\": \"<\\uff5ctool\\u2581call\\u2581end\\uff5c>\"},"
        " \"4118\": {\"content\": \"<think>\"}, \"4119\": {\"content\": \"</think>\"}}}");
}

/* Appends the ids of text to ids[*n] (of 512). */
static void marker_put_text(ddt_tokenizer *tok, const char *text, int32_t *ids, size_t *n) {
    size_t k = 0;
    ddt_error err;
    if (ddt_tokenizer_encode(tok, text, strlen(text), 0, ids + *n, 512 - *n, &k, &err) != DDT_OK)
        fail_msg("encode: %s", err.msg);
    *n += k;
}

#endif
