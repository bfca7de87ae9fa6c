/*
 * test_api.c — the shapes of chat responses that carry a thinking model's
 * reasoning and tool calls (server/api.h): message.content null when the
 * answer is only calls, reasoning_content and tool_calls in the message, a
 * streamed chunk's tool calls with their index, and prompt_token_ids with
 * return_token_ids; invalid UTF-8 in a call's text is replaced, not refused.
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

#include "server/api.h"

/* len is passed by address: it is read after the call that made body set it (the
 * evaluation order of two arguments is unspecified). */
static json_t *parse(char *body, const size_t *lenp) {
    assert_non_null(body);
    size_t len = *lenp;
    const char *json = body;
    if (!strncmp(body, "data: ", 6)) json += 6, len -= 6; /* an SSE event */
    json_t *o = json_loadb(json, len, 0, NULL);
    assert_non_null(o);
    free(body);
    return o;
}

static void test_tool_call_response(void **state) {
    (void)state;
    ddt_chat_tool_call calls[2] = {{"functions.get_weather:0", "get_weather", "{\"city\": \"Paris\"}"},
                                   {"functions.bad:1", "bad", "\xff{}"}};
    ddt_api_ids ids = {DDT_API_CHAT, "chatcmpl-1", 7, "m", 0};
    int32_t out_ids[2] = {5, 6}, prompt_ids[3] = {1, 2, 3};
    ddt_api_result res = {"", 0, "tool_calls", 3, 2, 0, out_ids, 2, prompt_ids, 3, NULL, DDT_MODE_AR, NULL,
                          {"I should look it up.", 20, calls, 0, 2}};
    size_t len = 0;
    json_t *o = parse(ddt_api_response_body(&ids, &res, 1, &len), &len);
    json_t *choice = json_array_get(json_object_get(o, "choices"), 0), *msg = json_object_get(choice, "message");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_string_equal(json_string_value(json_object_get(msg, "reasoning_content")), "I should look it up.");
    assert_string_equal(json_string_value(json_object_get(choice, "finish_reason")), "tool_calls");
    json_t *tc = json_object_get(msg, "tool_calls");
    assert_int_equal(json_array_size(tc), 2);
    json_t *c0 = json_array_get(tc, 0);
    assert_string_equal(json_string_value(json_object_get(c0, "id")), "functions.get_weather:0");
    assert_string_equal(json_string_value(json_object_get(c0, "type")), "function");
    assert_string_equal(json_string_value(json_object_get(json_object_get(c0, "function"), "name")), "get_weather");
    assert_string_equal(json_string_value(json_object_get(json_object_get(c0, "function"), "arguments")),
                        "{\"city\": \"Paris\"}");
    assert_null(json_object_get(c0, "index")); /* only streamed deltas carry it */
    const char *bad = json_string_value(json_object_get(json_object_get(json_array_get(tc, 1), "function"), "arguments"));
    assert_string_equal(bad, "\xef\xbf\xbd{}"); /* U+FFFD */
    assert_int_equal(json_array_size(json_object_get(o, "prompt_token_ids")), 3);
    json_decref(o);

    /* with text, content stays a string; without calls or reasoning, neither key appears */
    ddt_api_result plain = {"hi", 2, "stop", 3, 1, 0, NULL, 0, NULL, 0, NULL, DDT_MODE_AR, NULL, {0}};
    o = parse(ddt_api_response_body(&ids, &plain, 1, &len), &len);
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "hi");
    assert_null(json_object_get(msg, "tool_calls"));
    assert_null(json_object_get(msg, "reasoning_content"));
    assert_null(json_object_get(o, "prompt_token_ids"));
    json_decref(o);

    /* a streamed chunk: the second call of the response has index 1 */
    ddt_api_extra ex = {"more", 4, calls + 1, 1, 1};
    o = parse(ddt_api_chunk_event(&ids, false, NULL, 0, &ex, NULL, NULL, &len), &len);
    json_t *delta = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "delta");
    assert_null(json_object_get(delta, "content"));
    assert_string_equal(json_string_value(json_object_get(delta, "reasoning_content")), "more");
    json_t *d0 = json_array_get(json_object_get(delta, "tool_calls"), 0);
    assert_int_equal(json_integer_value(json_object_get(d0, "index")), 1);
    assert_string_equal(json_string_value(json_object_get(d0, "id")), "functions.bad:1");
    json_decref(o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tool_call_response),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
