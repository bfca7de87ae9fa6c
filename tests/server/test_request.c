/*
 * test_request.c — the server's request parser: well-formed chat and
 * completion bodies give the fields as sent; every malformed body (not JSON,
 * truncated, invalid UTF-8, wrong types, out-of-range or huge numbers, n > 1,
 * too many stop strings, unknown roles, malformed tools and tool calls) is
 * refused with the field named; chat messages come out normalised for the
 * chat template.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdlib.h>

#include "server/request.h"
#include "text/json_schema.h"

static ddt_status parse(ddt_api_kind kind, const char *body, ddt_api_request *r, ddt_error *err) {
    return ddt_api_request_parse(kind, body, strlen(body), r, err);
}

static void test_chat_fields(void **state) {
    (void)state;
    const char *body =
        "{\"model\": \"m\", \"messages\": [{\"role\": \"system\", \"content\": \"S\"},"
        "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]},"
        "{\"role\": \"assistant\", \"content\": null}, {\"role\": \"developer\", \"content\": \"D\"}],"
        "\"max_completion_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9, \"seed\": -3, \"stop\": [\"x\", \"yz\"],"
        "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"n\": 1, \"user\": \"ignored\","
        "\"speculative\": {\"mode\": \"tree\", \"budget\": 12}}";
    ddt_api_request r;
    ddt_error err = {0};
    assert_int_equal(parse(DDT_API_CHAT, body, &r, &err), DDT_OK);
    assert_int_equal(r.n_msgs, 4);
    /* normalised for the template: text parts joined, null kept, developer -> system */
    char *norm = json_dumps(r.messages, JSON_COMPACT);
    assert_string_equal(norm, "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"ab\"},"
                              "{\"role\":\"assistant\",\"content\":null},{\"role\":\"system\",\"content\":\"D\"}]");
    free(norm);
    assert_null(r.tools);
    assert_null(r.template_kwargs);
    assert_true(r.add_generation_prompt);
    assert_true(r.have_max_tokens);
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.have_temperature && r.temperature == 0.5f);
    assert_true(r.have_top_p && r.top_p == 0.9f);
    assert_true(r.have_seed && r.seed == (uint64_t)-3);
    assert_int_equal(r.n_stop, 2);
    assert_int_equal(r.stop_len[1], 2);
    assert_true(r.stream && r.include_usage);
    assert_true(r.have_mode && r.mode == DDT_MODE_TREE && r.have_budget && r.budget == 12 && !r.budget_auto);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.logprobs, -1);
    assert_int_equal(r.n, 1);
    ddt_api_request_free(&r);
    /* what does not change the output is accepted: zero penalties, an empty bias, text format */
    assert_int_equal(parse(DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                                         "\"frequency_penalty\": 0, \"presence_penalty\": 0.0, \"logit_bias\": {}, "
                                         "\"response_format\": {\"type\": \"text\"}, \"user\": \"u\", \"best_of\": 1}",
                           &r, &err), DDT_OK);
    assert_false(r.json_object);
    assert_int_equal(r.n_logit_bias, 0);
    assert_true(r.presence_penalty == 0.0f && r.frequency_penalty == 0.0f);
    ddt_api_request_free(&r);
    /* the penalties and logit_bias, kept in the order sent (ids as decimal strings) */
    assert_int_equal(parse(DDT_API_COMPLETION, "{\"prompt\": \"a\", \"presence_penalty\": -2, "
                                               "\"frequency_penalty\": 1.5, \"logit_bias\": {\"17\": -100, "
                                               "\"0\": 2.5, \"2147483647\": 100}}", &r, &err), DDT_OK);
    assert_true(r.presence_penalty == -2.0f && r.frequency_penalty == 1.5f && r.repetition_penalty == 0.0f);
    assert_int_equal(r.n_logit_bias, 3);
    assert_int_equal(r.logit_bias_ids[0], 17);
    assert_int_equal(r.logit_bias_ids[1], 0);
    assert_int_equal(r.logit_bias_ids[2], 2147483647);
    assert_true(r.logit_bias[0] == -100.0f && r.logit_bias[1] == 2.5f && r.logit_bias[2] == 100.0f);
    ddt_api_request_free(&r);
    /* JSON mode, in chat and completions */
    assert_int_equal(parse(DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                                         "\"response_format\": {\"type\": \"json_object\"}}", &r, &err), DDT_OK);
    assert_true(r.json_object);
    ddt_api_request_free(&r);
    assert_int_equal(parse(DDT_API_COMPLETION, "{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_object\"}}",
                           &r, &err), DDT_OK);
    assert_true(r.json_object);
    ddt_api_request_free(&r);
    assert_int_equal(parse(DDT_API_COMPLETION, "{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\"}}",
                           &r, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "needs a 'json_schema' object"));
    assert_string_equal(r.param, "response_format");
    /* a schema in the subset is compiled; one outside it is refused with the keyword and its path */
    assert_int_equal(parse(DDT_API_COMPLETION, "{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\", "
                           "\"json_schema\": {\"name\": \"s\", \"strict\": true, \"schema\": {\"type\": \"object\", "
                           "\"properties\": {\"a\": {\"type\": \"integer\"}}}}}}", &r, &err), DDT_OK);
    assert_non_null(r.json_schema);
    assert_false(r.json_object);
    ddt_api_request_free(&r);
    assert_int_equal(parse(DDT_API_COMPLETION, "{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\", "
                           "\"json_schema\": {\"name\": \"s\", \"schema\": {\"type\": \"object\", "
                           "\"properties\": {\"a\": {\"type\": \"integer\", \"minimum\": 0}}}}}}", &r, &err),
                     DDT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "unsupported keyword 'minimum' at $.properties.a"));
    assert_string_equal(r.param, "response_format");
    assert_int_equal(parse(DDT_API_COMPLETION, "{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\", "
                           "\"json_schema\": {\"schema\": {\"type\": \"object\", \"properties\": {}}}}}", &r, &err),
                     DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "'response_format.json_schema.name'"));
    assert_string_equal(r.param, "response_format");
    /* log-probabilities: chat's flag and alternatives */
    const char *lp = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true%s}";
    const char *tails[] = {"", ", \"top_logprobs\": 5", ", \"top_logprobs\": null"};
    const int32_t want[] = {0, 5, 0};
    for (int k = 0; k < 3; k++) {
        char b[256];
        snprintf(b, sizeof b, lp, tails[k]);
        assert_int_equal(parse(DDT_API_CHAT, b, &r, &err), DDT_OK);
        assert_int_equal(r.logprobs, want[k]);
        ddt_api_request_free(&r);
    }
    assert_int_equal(parse(DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                                         "\"logprobs\": false, \"top_logprobs\": null}", &r, &err), DDT_OK);
    assert_int_equal(r.logprobs, -1);
    ddt_api_request_free(&r);
}

/* Tools: declared functions, assistant tool calls and tool results pass through to the template;
 * tool_choice "none" leaves the tools out; chat_template_kwargs and add_generation_prompt are kept. */
static void test_chat_tools(void **state) {
    (void)state;
    const char *body =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"weather?\", \"name\": \"bob\", \"extra\": 1},"
        "{\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"think\", \"tool_calls\": [{\"id\": "
        "\"functions.w:0\", \"type\": \"function\", \"function\": {\"name\": \"w\", \"arguments\": \"{\\\"c\\\": 1}\"}}]},"
        "{\"role\": \"tool\", \"tool_call_id\": \"functions.w:0\", \"content\": \"sunny\"}],"
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"w\", \"description\": \"d\","
        " \"parameters\": {\"type\": \"object\"}}}], \"tool_choice\": \"auto\", \"parallel_tool_calls\": false,"
        "\"chat_template_kwargs\": {\"thinking\": true}, \"add_generation_prompt\": false}";
    ddt_api_request r;
    ddt_error err = {0};
    assert_int_equal(parse(DDT_API_CHAT, body, &r, &err), DDT_OK);
    char *m = json_dumps(r.messages, JSON_COMPACT);
    assert_string_equal(m, "[{\"role\":\"user\",\"content\":\"weather?\",\"name\":\"bob\"},"
                           "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"functions.w:0\","
                           "\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":\"{\\\"c\\\": 1}\"}}],"
                           "\"reasoning_content\":\"think\"},"
                           "{\"role\":\"tool\",\"content\":\"sunny\",\"tool_call_id\":\"functions.w:0\"}]");
    free(m);
    assert_non_null(r.tools);
    assert_int_equal(json_array_size(r.tools), 1);
    assert_true(json_is_true(json_object_get(r.template_kwargs, "thinking")));
    assert_false(r.add_generation_prompt);
    ddt_api_request_free(&r);
    assert_int_equal(parse(DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": "
                                         "[{\"type\": \"function\", \"function\": {\"name\": \"w\"}}], \"tool_choice\": \"none\"}",
                           &r, &err), DDT_OK);
    assert_null(r.tools);
    ddt_api_request_free(&r);
    /* a forced call: "required", or a declared function by name; a call's index counts the conversation's */
    const char *tools = "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"w\"}}, {\"type\": \"function\","
                        " \"function\": {\"name\": \"v\"}}]";
    char b2[1024];
    snprintf(b2, sizeof b2, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"a\", \"function\": "
             "{\"name\": \"w\", \"arguments\": \"{}\"}}, {\"id\": \"b\", \"function\": {\"name\": \"v\", \"arguments\": "
             "\"{}\"}}]}], %s, \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"v\"}}}", tools);
    assert_int_equal(parse(DDT_API_CHAT, b2, &r, &err), DDT_OK);
    assert_int_equal(r.tool_choice, DDT_TOOL_CHOICE_NAMED);
    assert_string_equal(r.tool_choice_name, "v");
    assert_int_equal(r.n_prior_calls, 2);
    assert_non_null(r.tools);
    ddt_api_request_free(&r);
    snprintf(b2, sizeof b2, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], %s, \"tool_choice\": "
             "\"required\"}", tools);
    assert_int_equal(parse(DDT_API_CHAT, b2, &r, &err), DDT_OK);
    assert_int_equal(r.tool_choice, DDT_TOOL_CHOICE_REQUIRED);
    assert_int_equal(r.n_prior_calls, 0);
    /* two functions, neither with parameters: no name forced, no schema, a note on the first */
    assert_null(r.tool_choice_name);
    assert_int_equal(r.tool_forced, -1);
    assert_int_equal(r.n_tool_schemas, 2);
    assert_null(r.tool_schemas[0]);
    assert_null(r.tool_schemas[1]);
    assert_string_equal(r.tool_schema_note, "tools[0].function.parameters: no 'parameters'");
    ddt_api_request_free(&r);
    /* the arguments' grammars: "required" compiles every function's parameters (the model picks
       one), and with a single function forces it by name; a schema outside the subset is no error */
    const char *ok_params = "{\"type\": \"object\", \"properties\": {\"c\": {\"type\": \"string\"}}}";
    const char *bad_params = "{\"type\": \"object\", \"properties\": {\"c\": {\"type\": \"integer\", "
                             "\"minimum\": 1}}}";
    snprintf(b2, sizeof b2, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
             "\"function\", \"function\": {\"name\": \"w\", \"parameters\": %s}}, {\"type\": \"function\", "
             "\"function\": {\"name\": \"v\", \"parameters\": %s}}], \"tool_choice\": \"required\"}", bad_params,
             ok_params);
    assert_int_equal(parse(DDT_API_CHAT, b2, &r, &err), DDT_OK);
    assert_int_equal(r.n_tool_schemas, 2);
    assert_null(r.tool_schemas[0]);
    assert_non_null(r.tool_schemas[1]);
    assert_int_equal(r.tool_schemas[1]->nodes[0].kinds, 1u << DDT_JK_OBJECT);
    assert_non_null(strstr(r.tool_schema_note, "tools[0].function.parameters: unsupported keyword 'minimum' at "
                                                "$.properties.c"));
    ddt_api_request_free(&r);
    /* named: only the named function's, and no note for the others */
    snprintf(b2, sizeof b2, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
             "\"function\", \"function\": {\"name\": \"w\", \"parameters\": %s}}, {\"type\": \"function\", "
             "\"function\": {\"name\": \"v\", \"parameters\": %s}}], \"tool_choice\": {\"type\": \"function\", "
             "\"function\": {\"name\": \"v\"}}}", bad_params, ok_params);
    assert_int_equal(parse(DDT_API_CHAT, b2, &r, &err), DDT_OK);
    assert_int_equal(r.tool_forced, 1);
    assert_null(r.tool_schemas[0]);
    assert_non_null(r.tool_schemas[1]);
    assert_string_equal(r.tool_schema_note, "");
    ddt_api_request_free(&r);
    /* "required" of one function: forced by name, as if named */
    snprintf(b2, sizeof b2, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
             "\"function\", \"function\": {\"name\": \"w\", \"parameters\": %s}}], \"tool_choice\": "
             "\"required\"}", bad_params);
    assert_int_equal(parse(DDT_API_CHAT, b2, &r, &err), DDT_OK);
    assert_int_equal(r.tool_choice, DDT_TOOL_CHOICE_REQUIRED);
    assert_string_equal(r.tool_choice_name, "w");
    assert_int_equal(r.tool_forced, 0);
    assert_null(r.tool_schemas[0]);
    assert_non_null(strstr(r.tool_schema_note, "'minimum'"));
    ddt_api_request_free(&r);
    /* auto (the default) compiles every function's, as the model may call any: none is forced */
    snprintf(b2, sizeof b2, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
             "\"function\", \"function\": {\"name\": \"w\", \"parameters\": %s}}, {\"type\": \"function\", "
             "\"function\": {\"name\": \"v\", \"parameters\": %s}}]}", ok_params, bad_params);
    assert_int_equal(parse(DDT_API_CHAT, b2, &r, &err), DDT_OK);
    assert_int_equal(r.tool_choice, DDT_TOOL_CHOICE_AUTO);
    assert_int_equal(r.n_tool_schemas, 2);
    assert_non_null(r.tool_schemas[0]);
    assert_null(r.tool_schemas[1]);
    assert_non_null(strstr(r.tool_schema_note, "tools[1].function.parameters: unsupported keyword 'minimum'"));
    assert_int_equal(r.tool_forced, -1);
    ddt_api_request_free(&r);
    /* "none" leaves the tools out, so nothing to compile */
    snprintf(b2, sizeof b2, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
             "\"function\", \"function\": {\"name\": \"w\", \"parameters\": %s}}], \"tool_choice\": \"none\"}",
             ok_params);
    assert_int_equal(parse(DDT_API_CHAT, b2, &r, &err), DDT_OK);
    assert_null(r.tool_schemas);
    assert_null(r.tools);
    ddt_api_request_free(&r);
    snprintf(b2, sizeof b2, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], %s, \"tool_choice\": "
             "{\"type\": \"function\", \"function\": {\"name\": \"zz\"}}}", tools);
    assert_int_equal(parse(DDT_API_CHAT, b2, &r, &err), DDT_ERR_INVALID);
    assert_string_equal(r.param, "tool_choice");
    assert_non_null(strstr(err.msg, "'zz'"));
}

static void test_completion_prompts(void **state) {
    (void)state;
    ddt_api_request r;
    ddt_error err = {0};
    assert_int_equal(parse(DDT_API_COMPLETION, "{\"prompt\": \"hello\", \"max_tokens\": 3, \"stop\": \"\\n\"}", &r,
                           &err), DDT_OK);
    assert_int_equal(r.prompt_len, 5);
    assert_int_equal(r.n_stop, 1);
    assert_false(r.stream);
    ddt_api_request_free(&r);
    assert_int_equal(parse(DDT_API_COMPLETION, "{\"prompt\": [\"one\"]}", &r, &err), DDT_OK);
    assert_int_equal(r.prompt_len, 3);
    ddt_api_request_free(&r);
    assert_int_equal(parse(DDT_API_COMPLETION, "{\"prompt\": [5, 6, 7], \"speculative\": {\"budget\": \"auto\"}}", &r,
                           &err), DDT_OK);
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 7);
    assert_true(r.have_budget && r.budget_auto && !r.have_mode);
    assert_int_equal(r.logprobs, -1);
    ddt_api_request_free(&r);
    /* completions' logprobs is the count of alternatives */
    assert_int_equal(parse(DDT_API_COMPLETION, "{\"prompt\": \"a\", \"logprobs\": 3, \"n\": 16}", &r, &err), DDT_OK);
    assert_int_equal(r.logprobs, 3);
    assert_int_equal(r.n, 16);
    ddt_api_request_free(&r);
    assert_int_equal(parse(DDT_API_COMPLETION, "{\"prompt\": \"a\", \"logprobs\": 0}", &r, &err), DDT_OK);
    assert_int_equal(r.logprobs, 0);
    assert_false(r.echo);
    ddt_api_request_free(&r);
    /* echo: the prompt scored, max_tokens may be 0 */
    assert_int_equal(parse(DDT_API_COMPLETION, "{\"prompt\": \"a\", \"echo\": true, \"max_tokens\": 0, \"logprobs\": 1}",
                           &r, &err), DDT_OK);
    assert_true(r.echo && r.have_max_tokens && r.max_tokens == 0 && r.logprobs == 1);
    ddt_api_request_free(&r);
}

/* Each body is refused; param names the field ("" = the body itself). */
static void test_bad_bodies(void **state) {
    (void)state;
    static const struct {
        ddt_api_kind kind;
        const char *body;
        const char *param;
    } cases[] = {
        {DDT_API_CHAT, "", ""},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}", ""}, /* truncated */
        {DDT_API_CHAT, "[1, 2]", ""},
        {DDT_API_CHAT, "{\"messages\": [], \"messages\": []}", ""}, /* duplicate key */
        {DDT_API_CHAT, "{}", "messages"},
        {DDT_API_CHAT, "{\"messages\": {}}", "messages"},
        {DDT_API_CHAT, "{\"messages\": []}", "messages"},
        {DDT_API_CHAT, "{\"messages\": [3]}", "messages[0]"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": 1}]}", "messages[0].role"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"function\", \"content\": \"x\"}]}", "messages[0].role"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", "messages[0].tool_call_id"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\", \"tool_call_id\": 3}]}",
         "messages[0].tool_call_id"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"name\": []}]}", "messages[0].name"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": {}}]}", "messages[0].tool_calls"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"a\", \"function\": "
                       "{\"name\": \"f\"}}]}]}", "messages[0].tool_calls"}, /* no arguments */
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"a\", \"type\": \"x\","
                       " \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]}]}", "messages[0].tool_calls"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": {}}", "tools"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
                       "\"function\"}]}", "tools[0]"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
                       "\"function\", \"function\": {\"name\": \"f\", \"parameters\": 3}}]}", "tools[0]"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"required\"}",
         "tool_choice"}, /* no tools to call */
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"any\"}",
         "tool_choice"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": {\"type\": "
                       "\"function\", \"function\": {\"name\": \"f\"}}}", "tool_choice"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"parallel_tool_calls\": 1}",
         "parallel_tool_calls"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": 1}",
         "chat_template_kwargs"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template\": \"{{x}}\"}",
         "chat_template"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"continue_final_message\": true}",
         "continue_final_message"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"tools\": [{}]}", "tools"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages[0].content"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
         "messages[0].content"},
        {DDT_API_COMPLETION, "{}", "prompt"},
        {DDT_API_COMPLETION, "{\"prompt\": \"\"}", "prompt"},
        {DDT_API_COMPLETION, "{\"prompt\": 5}", "prompt"},
        {DDT_API_COMPLETION, "{\"prompt\": [1, -2]}", "prompt"},
        {DDT_API_COMPLETION, "{\"prompt\": [1, 99999999999]}", "prompt"},
        {DDT_API_COMPLETION, "{\"prompt\": [\"a\", \"b\"]}", "prompt"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"max_tokens\": \"5\"}", "max_tokens"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"max_tokens\": 0}", "max_tokens"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"max_tokens\": 2.5}", "max_tokens"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"max_tokens\": 9223372036854775807}", "max_tokens"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"max_tokens\": 99999999999999999999999}", ""}, /* too big for JSON ints */
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"temperature\": 1e999}", ""},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"temperature\": 3}", "temperature"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"temperature\": \"hot\"}", "temperature"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"top_p\": 0}", "top_p"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"seed\": 1.5}", "seed"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"n\": 17}", "n"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"n\": 0}", "n"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"n\": 100000000}", "n"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"n\": 2, \"stream\": true, \"echo\": true}", "echo"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"stream\": \"yes\"}", "stream"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"stream_options\": 1}", "stream_options"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"stream_options\": {\"include_usage\": 1}}",
         "stream_options.include_usage"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"stop\": 5}", "stop"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"stop\": [\"\"]}", "stop"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"stop\": [\"1\", \"2\", \"3\", \"4\", \"5\"]}", "stop"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"logprobs\": true}", "logprobs"}, /* a count there */
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"frequency_penalty\": 2.5}", "frequency_penalty"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"presence_penalty\": -2.01}", "presence_penalty"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"presence_penalty\": 3}", "presence_penalty"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"frequency_penalty\": \"x\"}", "frequency_penalty"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"logit_bias\": {\"5\": 100.5}}", "logit_bias"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"logit_bias\": [5]}", "logit_bias"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"logit_bias\": {\"-5\": 1}}", "logit_bias"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"logit_bias\": {\"05\": 1}}", "logit_bias"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"logit_bias\": {\"x\": 1}}", "logit_bias"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"logit_bias\": {\"\": 1}}", "logit_bias"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"logit_bias\": {\"2147483648\": 1}}", "logit_bias"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"logit_bias\": {\"7\": \"1\"}}", "logit_bias"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"logit_bias\": {\"7\": null}}", "logit_bias"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"repetition_penalty\": 0}", "repetition_penalty"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"repetition_penalty\": 10.5}", "repetition_penalty"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"repetition_penalty\": -1}", "repetition_penalty"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
                       "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"s\", \"schema\": {}}}}",
         "response_format"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
                       "{\"type\": \"yaml\"}}", "response_format"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"response_format\": {}}", "response_format"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": 1}",
         "response_format"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"best_of\": 3}", "best_of"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"suffix\": \"z\"}", "suffix"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"logprobs\": 21}", "logprobs"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"logprobs\": -1}", "logprobs"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": 2}", "logprobs"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}",
         "top_logprobs"}, /* needs logprobs: true */
        {DDT_API_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, \"top_logprobs\": 21}",
         "top_logprobs"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"echo\": true, \"stream\": true}", "echo"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"echo\": 1}", "echo"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"echo\": true}", "echo"},
        {DDT_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 0}",
         "max_tokens"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"speculative\": 3}", "speculative"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"speculative\": {\"mode\": \"beam\"}}", "speculative.mode"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"speculative\": {\"budget\": 0}}", "speculative.budget"},
        {DDT_API_COMPLETION, "{\"prompt\": \"a\", \"speculative\": {\"budget\": 5000}}", "speculative.budget"},
        {DDT_API_COMPLETION, "{\"prompt\": \"\\u0000\"}", ""}, /* NUL escapes are refused */
        {DDT_API_COMPLETION, "{\"prompt\": \"\xff\xfe\"}", ""},   /* invalid UTF-8 */
        {DDT_API_COMPLETION, "{\"prompt\": \"\xed\xa0\x80\"}", ""}, /* a UTF-8-encoded surrogate */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ddt_api_request r;
        ddt_error err = {0};
        ddt_status st = parse(cases[i].kind, cases[i].body, &r, &err);
        if (st == DDT_OK) fail_msg("case %zu (%s) was accepted", i, cases[i].body);
        if (strcmp(r.param, cases[i].param)) fail_msg("case %zu: param '%s', expected '%s'", i, r.param, cases[i].param);
        assert_true(strlen(err.msg) > 0);
    }
}

static void test_nesting_and_nul(void **state) {
    (void)state;
    /* deep nesting is refused by the parser's depth bound, not a stack overflow */
    static char deep[200100];
    size_t n = 0;
    n += (size_t)snprintf(deep, sizeof deep, "{\"prompt\": \"a\", \"x\": ");
    for (int i = 0; i < 100000; i++) deep[n++] = '[';
    for (int i = 0; i < 100000; i++) deep[n++] = ']';
    deep[n++] = '}';
    ddt_api_request r;
    ddt_error err = {0};
    assert_int_not_equal(ddt_api_request_parse(DDT_API_COMPLETION, deep, n, &r, &err), DDT_OK);
    /* a raw NUL byte inside the body */
    const char body[] = "{\"prompt\": \"a\0b\"}";
    assert_int_not_equal(ddt_api_request_parse(DDT_API_COMPLETION, body, sizeof body - 1, &r, &err), DDT_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_fields),
        cmocka_unit_test(test_chat_tools),
        cmocka_unit_test(test_completion_prompts),
        cmocka_unit_test(test_bad_bodies),
        cmocka_unit_test(test_nesting_and_nul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
