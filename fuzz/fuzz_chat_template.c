/*
 * fuzz_chat_template.c — libFuzzer target for a model folder's chat-template
 * settings: any bytes as tokenizer_config.json (its "chat_template" as a
 * string or a named list, its special-token strings as strings or AddedToken
 * objects) either give a template, which renders a small conversation with
 * and without tools or fails with a message, or are refused with a message;
 * never a crash or a leak.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ddt_chat_template *t = NULL;
    ddt_error err;
    err.msg[0] = '\0';
    if (ddt_chat_template_create(NULL, 0, NULL, (const char *)data, size, &t, &err) != DDT_OK) {
        if (err.msg[0] == '\0' || t != NULL) __builtin_trap();
        return 0;
    }
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi <|im_end|>\"},"
                              " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"functions.f:0\","
                              " \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]},"
                              " {\"role\": \"tool\", \"tool_call_id\": \"functions.f:0\", \"content\": \"1\"}]",
                              0, NULL);
    json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", 0, NULL);
    if (!msgs || !tools) __builtin_trap();
    for (int k = 0; k < 2; k++) {
        ddt_chat_input in = {msgs, k ? tools : NULL, NULL, k == 0};
        ddt_jinja_text out;
        err.msg[0] = '\0';
        if (ddt_chat_render(t, &in, &out, &err) == DDT_OK) {
            if (!out.bytes || out.bytes[out.len] != '\0') __builtin_trap();
            ddt_jinja_text_free(&out);
        } else if (err.msg[0] == '\0') {
            __builtin_trap();
        }
    }
    json_decref(msgs);
    json_decref(tools);
    ddt_chat_template_free(t);
    return 0;
}
