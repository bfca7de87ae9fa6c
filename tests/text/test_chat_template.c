/*
 * test_chat_template.c — finding and using a model folder's chat template
 * (text/chat.h): chat_template.jinja before tokenizer_config.json's, the
 * "default" and "tool_use" entries of a named list, the special-token strings
 * as template variables, chat_template_kwargs, and every malformed input
 * (a template that does not parse, a config of the wrong shape, a reserved
 * kwarg, messages that are not objects) refused with a message naming where.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "text/chat.h"

static json_t *J(const char *text) {
    json_t *j = json_loads(text, 0, NULL);
    if (!j) fail_msg("bad test JSON: %s", text);
    return j;
}

/* The rendered text of a conversation (NUL-terminated, malloc'd), or NULL with err set. */
static char *render(const ddt_chat_template *t, const char *messages, const char *tools, const char *kwargs,
                    bool gen, ddt_status *st, ddt_error *err) {
    json_t *m = J(messages), *tl = tools ? J(tools) : NULL, *kw = kwargs ? J(kwargs) : NULL;
    ddt_chat_input in = {m, tl, kw, gen};
    ddt_jinja_text out;
    *st = ddt_chat_render(t, &in, &out, err);
    json_decref(m);
    if (tl) json_decref(tl);
    if (kw) json_decref(kw);
    if (*st != DDT_OK) return NULL;
    char *s = strdup(out.bytes);
    ddt_jinja_text_free(&out);
    return s;
}

static ddt_chat_template *create(const char *src, const char *config) {
    ddt_chat_template *t = NULL;
    ddt_error err;
    ddt_status st = ddt_chat_template_create(src, src ? strlen(src) : 0, "t.jinja", config,
                                             config ? strlen(config) : 0, &t, &err);
    if (st != DDT_OK) fail_msg("create: %s", err.msg);
    return t;
}

static void expect_create_fails(const char *src, const char *config, ddt_status want, const char *msg) {
    ddt_chat_template *t = (ddt_chat_template *)1;
    ddt_error err = {0};
    ddt_status st = ddt_chat_template_create(src, src ? strlen(src) : 0, src ? "t.jinja" : "cfg.json", config,
                                             config ? strlen(config) : 0, &t, &err);
    assert_null(t);
    if (st != want || !strstr(err.msg, msg))
        fail_msg("want %d \"%s\", got %d \"%s\"", (int)want, msg, (int)st, err.msg);
}

static void test_sources_and_variables(void **state) {
    (void)state;
    const char *cfg = "{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\", \"lstrip\": false},"
                      " \"chat_template\": \"cfg:{{ bos_token }}{{ messages[0].content }}{{ eos_token }}\"}";
    ddt_status st;
    ddt_error err;
    /* the config's own template, with its special-token strings */
    ddt_chat_template *t = create(NULL, cfg);
    char *s = render(t, "[{\"role\": \"user\", \"content\": \"hi\"}]", NULL, NULL, true, &st, &err);
    assert_string_equal(s, "cfg:<s>hi</s>");
    free(s);
    ddt_chat_template_free(t);
    /* a template given directly wins over the config's */
    t = create("direct:{{ add_generation_prompt }}|{{ tools | length if tools else 'none' }}|{{ x }}", cfg);
    assert_string_equal(ddt_chat_template_origin(t), "t.jinja");
    s = render(t, "[]", "[{\"type\": \"function\"}]", "{\"x\": 7}", false, &st, &err);
    assert_string_equal(s, "direct:False|1|7");
    free(s);
    s = render(t, "[]", "[]", NULL, true, &st, &err); /* no tools: none */
    assert_string_equal(s, "direct:True|none|");
    free(s);
    /* kwargs may not replace what the server sets */
    assert_null(render(t, "[]", NULL, "{\"messages\": 1}", true, &st, &err));
    assert_int_equal(st, DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "'messages' is set by the server"));
    assert_null(render(t, "[3]", NULL, NULL, true, &st, &err));
    assert_non_null(strstr(err.msg, "messages[0]"));
    assert_null(render(t, "[]", "{}", NULL, true, &st, &err));
    assert_non_null(strstr(err.msg, "'tools' must be an array"));
    ddt_chat_template_free(t);
    /* no template anywhere: the built-in one */
    t = create(NULL, "{\"bos_token\": null}");
    assert_string_equal(ddt_chat_template_origin(t), "built-in Kimi K2");
    s = render(t, "[{\"role\": \"user\", \"content\": \"hi\"}]", NULL, NULL, false, &st, &err);
    assert_string_equal(s, "<|im_system|>system<|im_middle|>" DDT_CHAT_KIMI_DEFAULT_SYSTEM
                           "<|im_end|><|im_user|>user<|im_middle|>hi<|im_end|>");
    free(s);
    ddt_chat_template_free(t);
}

/* A named list: "default", and "tool_use" for requests that declare tools. */
static void test_named_list(void **state) {
    (void)state;
    const char *cfg = "{\"chat_template\": [{\"name\": \"rag\", \"template\": \"R\"},"
                      " {\"name\": \"tool_use\", \"template\": \"T{{ tools | length }}\"},"
                      " {\"name\": \"default\", \"template\": \"D\"}]}";
    ddt_chat_template *t = create(NULL, cfg);
    ddt_status st;
    ddt_error err;
    char *s = render(t, "[]", NULL, NULL, true, &st, &err);
    assert_string_equal(s, "D");
    free(s);
    s = render(t, "[]", "[{}, {}]", NULL, true, &st, &err);
    assert_string_equal(s, "T2");
    free(s);
    ddt_chat_template_free(t);
}

static void test_errors(void **state) {
    (void)state;
    expect_create_fails("{% if x %}", NULL, DDT_ERR_INVALID, "t.jinja: line 1");
    expect_create_fails("a\n{{ 1 + }}", NULL, DDT_ERR_INVALID, "line 2");
    expect_create_fails(NULL, "{\"chat_template\": 5}", DDT_ERR_FORMAT, "must be a string or a list");
    expect_create_fails(NULL, "{\"chat_template\": [{\"name\": \"rag\", \"template\": \"R\"}]}", DDT_ERR_FORMAT,
                        "without a \"default\"");
    expect_create_fails(NULL, "{\"chat_template\": [{\"name\": 1}]}", DDT_ERR_FORMAT, "[0] needs string");
    expect_create_fails(NULL, "{\"chat_template\": [{\"name\": \"default\", \"template\": \"a\"},"
                              " {\"name\": \"default\", \"template\": \"b\"}]}", DDT_ERR_FORMAT, "twice");
    expect_create_fails(NULL, "{\"chat_template\": \"{% for %}\"}", DDT_ERR_INVALID, "chat_template: line 1");
    expect_create_fails(NULL, "[1]", DDT_ERR_FORMAT, "not a JSON object");
    expect_create_fails(NULL, "{\"a\": ", DDT_ERR_FORMAT, "tokenizer_config.json");
    /* what a template raises is an error of the request */
    ddt_chat_template *t = create("{{ raise_exception('roles must alternate') }}", NULL);
    ddt_status st;
    ddt_error err;
    assert_null(render(t, "[]", NULL, NULL, true, &st, &err));
    assert_int_equal(st, DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "roles must alternate"));
    assert_non_null(strstr(err.msg, "chat template (t.jinja)"));
    ddt_chat_template_free(t);
}

/* From a folder: chat_template.jinja first, then tokenizer_config.json, then built in. */
static void test_load_folder(void **state) {
    (void)state;
    char dir[] = "/tmp/ddt_chat_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cfg[256], jin[256];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    snprintf(jin, sizeof jin, "%s/chat_template.jinja", dir);
    ddt_chat_template *t = NULL;
    ddt_error err;
    assert_int_equal(ddt_chat_template_load(dir, NULL, &t, &err), DDT_OK);
    assert_string_equal(ddt_chat_template_origin(t), "built-in Kimi K2");
    ddt_chat_template_free(t);
    FILE *f = fopen(cfg, "w");
    fputs("{\"chat_template\": \"C\"}", f);
    fclose(f);
    assert_int_equal(ddt_chat_template_load(dir, NULL, &t, &err), DDT_OK);
    assert_string_equal(ddt_chat_template_origin(t), cfg);
    ddt_chat_template_free(t);
    f = fopen(jin, "w");
    fputs("J{% if %}", f);
    fclose(f);
    assert_int_equal(ddt_chat_template_load(dir, NULL, &t, &err), DDT_ERR_INVALID);
    assert_null(t);
    assert_non_null(strstr(err.msg, "chat_template.jinja: line 1"));
    f = fopen(jin, "w");
    fputs("J", f);
    fclose(f);
    assert_int_equal(ddt_chat_template_load(dir, NULL, &t, &err), DDT_OK);
    assert_string_equal(ddt_chat_template_origin(t), jin);
    ddt_chat_template_free(t);
    /* a named file replaces the folder's own, and must exist */
    char other[300];
    snprintf(other, sizeof other, "%s/other.jinja", dir);
    f = fopen(other, "w");
    fputs("O", f);
    fclose(f);
    assert_int_equal(ddt_chat_template_load(dir, other, &t, &err), DDT_OK);
    assert_string_equal(ddt_chat_template_origin(t), other);
    ddt_chat_template_free(t);
    unlink(other);
    assert_int_equal(ddt_chat_template_load(dir, other, &t, &err), DDT_ERR_IO);
    assert_non_null(strstr(err.msg, "other.jinja"));
    unlink(jin);
    unlink(cfg);
    rmdir(dir);
    assert_int_equal(ddt_chat_template_load(NULL, NULL, &t, &err), DDT_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sources_and_variables),
        cmocka_unit_test(test_named_list),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_load_folder),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
