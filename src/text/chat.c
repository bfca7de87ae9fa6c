/*
 * chat.c — chat templates (see chat.h): found in a model folder, parsed once
 * with jinja.c, rendered per conversation with the data / template marks kept,
 * and encoded with special tokens recognised only in the template's bytes.
 */
#include "text/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/file.h"

#define CHAT_MAX_CONFIG_BYTES ((size_t)64 << 20)

/* Kimi K2's format (chat.h) as a Jinja template, used when a folder has none. */
static const char builtin_kimi[] =
    "{%- if tools -%}"
    "<|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}<|im_end|>"
    "{%- endif -%}"
    "{%- if messages | length == 0 or messages[0].role != 'system' -%}"
    "<|im_system|>system<|im_middle|>" DDT_CHAT_KIMI_DEFAULT_SYSTEM "<|im_end|>"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- elif m.role == 'tool' -%}<|im_system|>tool<|im_middle|>"
    "{%- else -%}<|im_system|>system<|im_middle|>"
    "{%- endif -%}"
    "{%- if m.role == 'tool' -%}{{ '## Return of ' ~ m.tool_call_id ~ '\\n' }}{%- endif -%}"
    "{%- if m.content is string -%}{{ m.content }}{%- endif -%}"
    "{%- if m.role == 'assistant' and m.tool_calls -%}"
    "<|tool_calls_section_begin|>"
    "{%- for tc in m.tool_calls -%}"
    "<|tool_call_begin|>{{ tc.id }}<|tool_call_argument_begin|>"
    "{%- if tc.function.arguments is string -%}{{ tc.function.arguments }}"
    "{%- else -%}{{ tc.function.arguments | tojson }}{%- endif -%}"
    "<|tool_call_end|>"
    "{%- endfor -%}"
    "<|tool_calls_section_end|>"
    "{%- endif -%}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}";

struct ddt_chat_template {
    ddt_jinja *main;     /* "default" */
    ddt_jinja *tool_use; /* a "tool_use" template of a named list, else NULL */
    json_t *specials;    /* {"bos_token": "...", ...}: the trusted variables every render gets */
    bool builtin;        /* Kimi's format: the tokenizer must have its markers */
    char origin[512];
};

void ddt_chat_template_free(ddt_chat_template *t) {
    if (!t) return;
    ddt_jinja_free(t->main);
    ddt_jinja_free(t->tool_use);
    if (t->specials) json_decref(t->specials);
    free(t);
}

const char *ddt_chat_template_origin(const ddt_chat_template *t) { return t ? t->origin : ""; }

static ddt_status parse_template(const char *src, size_t len, const char *origin, const char *which, ddt_jinja **out,
                                 ddt_error *err) {
    ddt_status st = ddt_jinja_parse(src, len, out, err);
    if (st != DDT_OK) ddt_error_prefix(err, "%s%s%s: ", origin, which ? " " : "", which ? which : "");
    return st;
}

/* tokenizer_config.json's special-token strings: a string, or an AddedToken object {"content": ...}. */
static ddt_status read_specials(ddt_chat_template *t, json_t *cfg, ddt_error *err) {
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        json_t *v = cfg ? json_object_get(cfg, names[k]) : NULL;
        if (json_is_object(v)) v = json_object_get(v, "content");
        if (!json_is_string(v)) continue;
        if (json_object_set_new(t->specials, names[k], json_string(json_string_value(v))))
            return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the chat template's special tokens");
    }
    return DDT_OK;
}

/* The "chat_template" of tokenizer_config.json: a string, or [{"name", "template"}, ...]. */
static ddt_status config_template(ddt_chat_template *t, json_t *tmpl, const char *origin, ddt_error *err) {
    if (json_is_string(tmpl))
        return parse_template(json_string_value(tmpl), json_string_length(tmpl), origin, "chat_template", &t->main, err);
    if (!json_is_array(tmpl))
        return ddt_fail(err, DDT_ERR_FORMAT, "%s: \"chat_template\" must be a string or a list of named templates",
                        origin);
    for (size_t i = 0; i < json_array_size(tmpl); i++) {
        json_t *e = json_array_get(tmpl, i), *name = json_object_get(e, "name"), *src = json_object_get(e, "template");
        if (!json_is_string(name) || !json_is_string(src))
            return ddt_fail(err, DDT_ERR_FORMAT, "%s: \"chat_template\"[%zu] needs string \"name\" and \"template\"",
                            origin, i);
        const char *n = json_string_value(name);
        ddt_jinja **slot = !strcmp(n, "default") ? &t->main : !strcmp(n, "tool_use") ? &t->tool_use : NULL;
        if (!slot) continue;
        if (*slot) return ddt_fail(err, DDT_ERR_FORMAT, "%s: \"chat_template\" names \"%s\" twice", origin, n);
        char which[64];
        snprintf(which, sizeof which, "chat_template \"%s\"", n);
        ddt_status st = parse_template(json_string_value(src), json_string_length(src), origin, which, slot, err);
        if (st != DDT_OK) return st;
    }
    if (!t->main)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s: \"chat_template\" is a list without a \"default\" template", origin);
    return DDT_OK;
}

ddt_status ddt_chat_template_create(const char *src, size_t len, const char *origin, const char *config,
                                    size_t config_len, ddt_chat_template **out, ddt_error *err) {
    if (!out || (!src && len) || (!config && config_len))
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_chat_template_create: NULL argument");
    *out = NULL;
    ddt_chat_template *t = calloc(1, sizeof *t);
    if (!t || !(t->specials = json_object())) {
        free(t);
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for a chat template");
    }
    json_t *cfg = NULL;
    ddt_status st = DDT_OK;
    if (config) {
        json_error_t je;
        cfg = json_loadb(config, config_len, 0, &je);
        if (!json_is_object(cfg))
            st = ddt_fail(err, DDT_ERR_FORMAT, "tokenizer_config.json: %s (line %d)",
                          cfg ? "not a JSON object" : je.text, cfg ? 1 : je.line);
    }
    if (st == DDT_OK) st = read_specials(t, cfg, err);
    json_t *cfg_tmpl = cfg ? json_object_get(cfg, "chat_template") : NULL;
    if (st == DDT_OK && src) {
        snprintf(t->origin, sizeof t->origin, "%s", origin ? origin : "chat template");
        st = parse_template(src, len, t->origin, NULL, &t->main, err);
    } else if (st == DDT_OK && cfg_tmpl && !json_is_null(cfg_tmpl)) {
        snprintf(t->origin, sizeof t->origin, "%s", origin ? origin : "tokenizer_config.json");
        st = config_template(t, cfg_tmpl, t->origin, err);
    } else if (st == DDT_OK) {
        snprintf(t->origin, sizeof t->origin, "built-in Kimi K2");
        t->builtin = true;
        st = parse_template(builtin_kimi, sizeof builtin_kimi - 1, t->origin, NULL, &t->main, err);
    }
    if (cfg) json_decref(cfg);
    if (st != DDT_OK) {
        ddt_chat_template_free(t);
        return st;
    }
    *out = t;
    ddt_error_clear(err);
    return DDT_OK;
}

ddt_status ddt_chat_template_load(const char *model_dir, const char *template_file, ddt_chat_template **out,
                                  ddt_error *err) {
    if (!model_dir || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_chat_template_load: NULL argument");
    *out = NULL;
    if (strlen(model_dir) > 3800 || (template_file && strlen(template_file) > 4000))
        return ddt_fail(err, DDT_ERR_INVALID, "%.64s...: path too long", template_file ? template_file : model_dir);
    char jpath[4096], cpath[4096];
    if (template_file) snprintf(jpath, sizeof jpath, "%s", template_file);
    else snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", model_dir);
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", model_dir);
    char *src = NULL, *cfg = NULL;
    size_t src_len = 0, cfg_len = 0;
    /* a named file must exist; the folder's own is optional */
    ddt_status st = ddt_read_file(jpath, DDT_JINJA_MAX_SOURCE, template_file == NULL, &src, &src_len, err);
    if (st == DDT_OK) st = ddt_read_file(cpath, CHAT_MAX_CONFIG_BYTES, true, &cfg, &cfg_len, err);
    if (st == DDT_OK) st = ddt_chat_template_create(src, src_len, src ? jpath : cpath, cfg, cfg_len, out, err);
    free(src);
    free(cfg);
    return st;
}

/* Variables the engine sets, which chat_template_kwargs may not replace. */
static bool reserved(const char *name) {
    static const char *const names[] = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                                        "unk_token", "pad_token"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (!strcmp(name, names[k])) return true;
    return false;
}

ddt_status ddt_chat_render(const ddt_chat_template *t, const ddt_chat_input *in, ddt_jinja_text *out,
                           ddt_error *err) {
    if (!t || !in || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_chat_render: NULL argument");
    memset(out, 0, sizeof *out);
    if (!json_is_array(in->messages)) return ddt_fail(err, DDT_ERR_INVALID, "chat: 'messages' must be an array");
    for (size_t i = 0; i < json_array_size(in->messages); i++) {
        json_t *m = json_array_get(in->messages, i);
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
            return ddt_fail(err, DDT_ERR_INVALID, "chat: messages[%zu] must be an object with a string 'role'", i);
    }
    if (in->tools && !json_is_null(in->tools) && !json_is_array(in->tools))
        return ddt_fail(err, DDT_ERR_INVALID, "chat: 'tools' must be an array");
    if (in->kwargs && !json_is_null(in->kwargs) && !json_is_object(in->kwargs))
        return ddt_fail(err, DDT_ERR_INVALID, "chat: 'chat_template_kwargs' must be an object");
    bool have_tools = in->tools && json_is_array(in->tools) && json_array_size(in->tools) > 0;
    json_t *data = json_object(), *trusted = json_deep_copy(t->specials);
    ddt_status st = DDT_OK;
    if (!data || !trusted) st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the chat template's variables");
    if (st == DDT_OK && in->kwargs && json_is_object(in->kwargs)) {
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)in->kwargs, key, v) {
            if (reserved(key)) {
                st = ddt_fail(err, DDT_ERR_INVALID, "chat_template_kwargs: '%.64s' is set by the server", key);
                break;
            }
            if (json_object_set(data, key, v)) {
                st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the chat template's variables");
                break;
            }
        }
    }
    /* the JSON objects are only read while rendering; set() just takes a reference */
    if (st == DDT_OK &&
        (json_object_set(data, "messages", (json_t *)in->messages) ||
         json_object_set_new(data, "tools", have_tools ? json_incref((json_t *)in->tools) : json_null()) ||
         json_object_set_new(trusted, "add_generation_prompt", json_boolean(in->add_generation_prompt))))
        st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the chat template's variables");
    if (st == DDT_OK) {
        const ddt_jinja *tmpl = have_tools && t->tool_use ? t->tool_use : t->main;
        st = ddt_jinja_render(tmpl, data, trusted, out, err);
        if (st != DDT_OK) ddt_error_prefix(err, "chat template (%s): ", t->origin);
    }
    if (data) json_decref(data);
    if (trusted) json_decref(trusted);
    return st;
}

ddt_status ddt_chat_encode(const ddt_chat_template *t, ddt_tokenizer *tok, const ddt_chat_input *in, int32_t **ids,
                           size_t *n_ids, ddt_error *err) {
    if (!tok || !ids || !n_ids) return ddt_fail(err, DDT_ERR_INVALID, "ddt_chat_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (t && t->builtin) {
        /* without its markers the built-in template would be plain text to this tokenizer:
         * a model of another family with no template of its own */
        static const char *const markers[] = {"<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>",
                                              "<|im_end|>"};
        for (size_t k = 0; k < sizeof markers / sizeof markers[0]; k++) {
            int32_t id = ddt_tokenizer_token_id(tok, markers[k]);
            if (id < 0 || !ddt_tokenizer_is_special(tok, id))
                return ddt_fail(err, DDT_ERR_INVALID,
                                "chat: the model folder has no chat template and its tokenizer has no special token "
                                "%s for the built-in Kimi K2 one", markers[k]);
        }
    }
    ddt_jinja_text text;
    ddt_status st = ddt_chat_render(t, in, &text, err);
    if (st != DDT_OK) return st;
    /* BPE gives at most one id per byte, a special token one for several */
    int32_t *buf = malloc((text.len + 1) * sizeof *buf);
    size_t n = 0;
    if (!buf) st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the chat prompt's ids");
    else st = ddt_tokenizer_encode_marked(tok, text.bytes, text.data, text.len, 0, buf, text.len + 1, &n, err);
    ddt_jinja_text_free(&text);
    if (st != DDT_OK) {
        free(buf);
        return st;
    }
    *ids = buf;
    *n_ids = n;
    return DDT_OK;
}

ddt_status ddt_chat_encode_prompt(const ddt_chat_template *t, ddt_tokenizer *tok, const char *system,
                                  const char *user, int32_t *ids, size_t max_ids, size_t *n_ids, ddt_error *err) {
    if (!tok || !user || (!ids && max_ids) || !n_ids)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_chat_encode_prompt: NULL argument");
    *n_ids = 0;
    ddt_chat_template *own = NULL;
    ddt_status st = DDT_OK;
    if (!t) {
        st = ddt_chat_template_create(NULL, 0, NULL, NULL, 0, &own, err);
        t = own;
    }
    json_t *msgs = json_array();
    if (st == DDT_OK && !msgs) st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the chat prompt");
    if (st == DDT_OK && system &&
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system)))
        st = ddt_fail(err, DDT_ERR_INVALID, "chat: the system message is not valid UTF-8");
    if (st == DDT_OK && json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", user)))
        st = ddt_fail(err, DDT_ERR_INVALID, "chat: the user message is not valid UTF-8");
    int32_t *all = NULL;
    size_t n = 0;
    if (st == DDT_OK) {
        ddt_chat_input in = {.messages = msgs, .add_generation_prompt = true};
        st = ddt_chat_encode(t, tok, &in, &all, &n, err);
    }
    if (msgs) json_decref(msgs);
    ddt_chat_template_free(own);
    if (st != DDT_OK) return st;
    memcpy(ids, all, (n < max_ids ? n : max_ids) * sizeof *ids);
    free(all);
    *n_ids = n;
    if (n > max_ids)
        return ddt_fail(err, DDT_ERR_RANGE, "chat: the conversation needs %zu ids, the buffer holds %zu", n, max_ids);
    ddt_error_clear(err);
    return DDT_OK;
}
