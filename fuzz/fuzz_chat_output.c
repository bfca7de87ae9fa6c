/*
 * fuzz_chat_output.c — libFuzzer target for the chat-output router
 * (text/chat_output.h).  The first byte picks the vocabulary and the start:
 *   bit 0: Kimi's markers as special tokens, or DeepSeek's;
 *   bit 1: DeepSeek's markers and <think> as ordinary tokens (ranks whose bytes
 *          are the marker: a tokenizer.json vocabulary holding them) instead;
 *   bit 2: the prompt opened a thinking block (start as reasoning).
 * Every later byte is one id: 0xF0..0xF7 the markers (calls begin / end, call
 * begin, separator, call end, <think>, </think>, end of text), anything else
 * that byte's own token.  Each id is routed, the name of a call at its
 * arguments is asked after every id, and at the end the calls become their
 * JSON; the same ids, taken as a prompt, go through
 * ddt_chat_prompt_opens_thinking, whose answer is checked against its rule.
 * Besides crashes, leaks and UB: a call reported done when no call
 * completed, a count past DDT_CHAT_MAX_TOOL_CALLS, a NULL field or JSON that
 * cannot be made is a bug, as is a marker routed to content or reasoning.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_output.h"
#include "text/tokenizer.h"

static ddt_tokenizer *g_tok[3];
static int32_t g_marker[3][8];

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

/* kind 0: Kimi specials, 1: DeepSeek specials, 2: DeepSeek ordinary ranks. */
static ddt_tokenizer *make(int kind) {
    static const char *kimi[] = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                                 "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>",
                                 "<|im_end|>"};
    static const char *ds[] = {DDT_DS_CALLS_BEGIN, DDT_DS_CALLS_END, DDT_DS_CALL_BEGIN, DDT_DS_SEP, DDT_DS_CALL_END,
                               "<think>", "</think>", ("<" DDT_DS_FW "end" DDT_DS_LB "of" DDT_DS_LB "sentence" DDT_DS_FW ">")};
    const char **words = kind == 0 ? kimi : ds;
    static char model[16384], config[2048];
    size_t len = 0, cl = 0;
    int n_ranks = kind == 2 ? 256 + 7 : 256;
    for (int i = 0; i < n_ranks; i++) {
        uint8_t one = (uint8_t)i;
        const uint8_t *b = i < 256 ? &one : (const uint8_t *)words[i - 256];
        char enc[128];
        b64(b, i < 256 ? 1 : strlen(words[i - 256]), enc);
        len += (size_t)snprintf(model + len, sizeof model - len, "%s %d\n", enc, i);
    }
    /* specials follow the ranks; the JSON strings carry the markers' raw UTF-8 */
    cl += (size_t)snprintf(config + cl, sizeof config - cl, "{\"added_tokens_decoder\": {");
    int first = kind == 2 ? 7 : 0;
    for (int k = first; k < 8; k++)
        cl += (size_t)snprintf(config + cl, sizeof config - cl, "%s\"%d\": {\"content\": \"%s\"}", k > first ? ", " : "",
                               n_ranks + k, words[k]);
    snprintf(config + cl, sizeof config - cl, "}}");
    ddt_tokenizer_source src = {"fixed.model", (const uint8_t *)model, len, "fixed.json", config, strlen(config),
                                NULL, NULL, 0};
    ddt_tokenizer *tok = NULL;
    if (ddt_tokenizer_create(&src, &tok, NULL) != DDT_OK) abort();
    for (int k = 0; k < 8; k++) g_marker[kind][k] = ddt_tokenizer_token_id(tok, words[k]);
    return tok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_tok[0])
        for (int k = 0; k < 3; k++) g_tok[k] = make(k);
    if (size == 0 || size > 20000) return 0;
    const int kind = (data[0] & 2) ? 2 : (data[0] & 1);
    const ddt_tokenizer *tok = g_tok[kind];
    ddt_chat_router r;
    ddt_chat_router_init(&r, tok, (data[0] & 4) != 0);
    if (r.m.format != (kind == 0 ? DDT_CHAT_FORMAT_KIMI : DDT_CHAT_FORMAT_DEEPSEEK)) abort();
    r.first_call_index = data[0] >> 3;
    int done = 0;
    for (size_t i = 1; i < size; i++) {
        const bool is_m = data[i] >= 0xF0 && data[i] <= 0xF7;
        int32_t id = is_m ? g_marker[kind][data[i] - 0xF0] : data[i];
        ddt_chat_channel ch;
        bool d;
        if (ddt_chat_route(&r, id, &ch, &d, NULL) != DDT_OK) abort(); /* only out of memory fails */
        if (d && (id != r.m.call_end || r.n_calls == 0)) abort();
        if (is_m && data[i] != 0xF7 && (ch == DDT_CHAT_CH_CONTENT || ch == DDT_CHAT_CH_REASONING)) abort();
        done += d;
        char *name = NULL;
        if (ddt_chat_router_args_name(&r, &name, NULL) != DDT_OK) abort();
        free(name);
    }
    if (done != r.n_calls || r.n_calls > DDT_CHAT_MAX_TOOL_CALLS) abort();
    /* as a prompt: opens thinking iff <think> is followed by whitespace bytes only */
    int32_t ids[256];
    size_t n_ids = 0;
    for (size_t i = 1; i < size && n_ids < 256; i++)
        ids[n_ids++] = data[i] >= 0xF0 && data[i] <= 0xF7 ? g_marker[kind][data[i] - 0xF0] : data[i];
    bool expect = false;
    for (size_t i = n_ids; i-- > 0;) {
        if (ids[i] == g_marker[kind][5]) {
            expect = true;
            break;
        }
        if (ids[i] != ' ' && ids[i] != '\n' && ids[i] != '\r' && ids[i] != '\t') break;
    }
    if (ddt_chat_prompt_opens_thinking(tok, ids, n_ids) != expect) abort();
    for (int c = 0; c < r.n_calls; c++)
        if (!r.calls[c].id || !r.calls[c].name || !r.calls[c].arguments) abort();
    json_t *a = ddt_chat_tool_calls_json(r.calls, r.n_calls, 0);
    if (!a) abort();
    json_decref(a);
    ddt_chat_router_free(&r);
    return 0;
}
