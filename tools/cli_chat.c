/*
 * cli_chat.c — see cli_chat.h.
 */
#include "cli_chat.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/utf8.h"

static bool is_marker(const ddt_chat_markers *m, int32_t id) {
    return m && id >= 0 &&
           (id == m->think || id == m->think_end || id == m->section_begin || id == m->section_end ||
            id == m->call_begin || id == m->arg_begin || id == m->call_end);
}

void cli_print_tokens(const ddt_tokenizer *tok, const ddt_chat_markers *markers, const int32_t *ids, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        const uint8_t *b;
        size_t len;
        if (ddt_tokenizer_text_bytes(tok, ids[i], &b, &len) ||
            (is_marker(markers, ids[i]) && ddt_tokenizer_token_bytes(tok, ids[i], &b, &len, NULL) == DDT_OK))
            fwrite(b, 1, len, stdout);
    }
}

json_t *cli_chat_message(const ddt_tokenizer *tok, const int32_t *prompt, int32_t n_prompt, const int32_t *out,
                         int32_t n) {
    ddt_chat_router r;
    ddt_chat_router_init(&r, tok, ddt_chat_prompt_opens_thinking(tok, prompt, n_prompt > 0 ? (size_t)n_prompt : 0));
    size_t cap = 1, lens[2] = {0, 0};
    for (int32_t i = 0; i < n; i++) {
        const uint8_t *b;
        size_t len;
        if (ddt_tokenizer_text_bytes(tok, out[i], &b, &len)) cap += len;
    }
    char *buf[2] = {malloc(cap), malloc(cap)}; /* content, reasoning */
    bool ok = buf[0] && buf[1];
    for (int32_t i = 0; ok && i < n; i++) {
        ddt_chat_channel ch;
        bool done;
        ok = ddt_chat_route(&r, out[i], &ch, &done, NULL) == DDT_OK;
        const uint8_t *b;
        size_t len;
        if (ok && (ch == DDT_CHAT_CH_CONTENT || ch == DDT_CHAT_CH_REASONING) &&
            ddt_tokenizer_text_bytes(tok, out[i], &b, &len)) {
            int k = ch == DDT_CHAT_CH_REASONING;
            memcpy(buf[k] + lens[k], b, len);
            lens[k] += len;
        }
    }
    json_t *m = ok ? json_pack("{s:s, s:o}", "role", "assistant", "content", ddt_utf8_json_string(buf[0], lens[0]))
                   : NULL;
    if (m && lens[1]) json_object_set_new(m, "reasoning_content", ddt_utf8_json_string(buf[1], lens[1]));
    if (m && r.n_calls) json_object_set_new(m, "tool_calls", ddt_chat_tool_calls_json(r.calls, r.n_calls, -1));
    free(buf[0]);
    free(buf[1]);
    ddt_chat_router_free(&r);
    return m;
}
