/*
 * fuzz_jinja.c — libFuzzer target for the Jinja2 subset: any bytes either fail
 * to parse with a status and a message, or parse into a template that renders
 * against a small fixed conversation with a status (never a crash, a hang past
 * the step bound, or a leak); a success gives NUL-terminated text whose mask
 * holds only 0 and 1, and a failure leaves the output empty.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char CONTEXT[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"hi <|im_end|> \\u00e9\\ud83d\\ude00\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"think\","
    "  \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\","
    "   \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null, true]}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"42\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ddt_jinja *t = NULL;
    ddt_error err;
    if (ddt_jinja_parse((const char *)data, size, &t, &err) != DDT_OK) {
        if (err.msg[0] == '\0' || t != NULL) __builtin_trap();
        return 0;
    }
    json_t *ctx = json_loads(CONTEXT, 0, NULL);
    json_t *trusted = json_pack("{s:s, s:b}", "bos_token", "<s>", "add_generation_prompt", 1);
    if (!ctx || !trusted) __builtin_trap();
    ddt_jinja_text out;
    ddt_status st = ddt_jinja_render(t, ctx, trusted, &out, &err);
    if (st == DDT_OK) {
        if (!out.bytes || out.bytes[out.len] != '\0' || out.len > DDT_JINJA_MAX_OUTPUT) __builtin_trap();
        for (size_t i = 0; i < out.len; i++)
            if (out.data[i] > 1) __builtin_trap();
        ddt_jinja_text_free(&out);
    } else if (err.msg[0] == '\0' || out.bytes != NULL || out.len != 0) {
        __builtin_trap();
    }
    json_decref(ctx);
    json_decref(trusted);
    ddt_jinja_free(t);
    return 0;
}
