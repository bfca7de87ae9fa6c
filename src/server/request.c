/*
 * request.c — see request.h.  The JSON is parsed by Jansson (which rejects
 * invalid UTF-8, NUL escapes, duplicate keys and nesting deeper than its bound),
 * then every field the server uses is checked for type and range here.
 */
#include "server/request.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/json_schema.h"

#define FAIL(req, st, name, ...) (snprintf((req)->param, sizeof (req)->param, "%s", (name)), \
                                  ddt_fail(err, (st), __VA_ARGS__))

/* An optional number field in [lo, hi]; *have false when absent or null. */
static ddt_status get_number(ddt_api_request *r, json_t *root, const char *name, double lo, double hi,
                             bool *have, double *out, ddt_error *err) {
    json_t *v = json_object_get(root, name);
    *have = false;
    if (!v || json_is_null(v)) return DDT_OK;
    if (!json_is_number(v)) return FAIL(r, DDT_ERR_INVALID, name, "'%s' must be a number", name);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return FAIL(r, DDT_ERR_RANGE, name, "'%s' is %g, outside [%g, %g]", name, x, lo, hi);
    *have = true;
    *out = x;
    return DDT_OK;
}

/* An optional integer field in [lo, hi]. */
static ddt_status get_int(ddt_api_request *r, json_t *root, const char *name, long long lo, long long hi,
                          bool *have, long long *out, ddt_error *err) {
    json_t *v = json_object_get(root, name);
    *have = false;
    if (!v || json_is_null(v)) return DDT_OK;
    if (!json_is_integer(v)) return FAIL(r, DDT_ERR_INVALID, name, "'%s' must be an integer", name);
    long long x = (long long)json_integer_value(v);
    if (x < lo || x > hi) return FAIL(r, DDT_ERR_RANGE, name, "'%s' is %lld, outside [%lld, %lld]", name, x, lo, hi);
    *have = true;
    *out = x;
    return DDT_OK;
}

static ddt_status get_bool(ddt_api_request *r, json_t *obj, const char *name, bool *out, ddt_error *err) {
    json_t *v = json_object_get(obj, name);
    if (!v || json_is_null(v)) return DDT_OK;
    if (!json_is_boolean(v)) return FAIL(r, DDT_ERR_INVALID, name, "'%s' must be true or false", name);
    *out = json_is_true(v);
    return DDT_OK;
}

/* A message's content for the template: a string, null (an assistant turn with
 * only tool calls), or an array of {"type": "text", "text": ...} parts, joined. */
static ddt_status message_content(ddt_api_request *r, json_t *c, size_t i, json_t **out, ddt_error *err) {
    char name[48];
    snprintf(name, sizeof name, "messages[%zu].content", i);
    if (!c || json_is_null(c)) {
        *out = json_null();
        return DDT_OK;
    }
    if (json_is_string(c)) {
        *out = json_incref(c);
        return DDT_OK;
    }
    if (!json_is_array(c))
        return FAIL(r, DDT_ERR_INVALID, name, "'%s' must be a string or an array of text parts", name);
    size_t total = 0;
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *part = json_array_get(c, k);
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") ||
            !json_is_string(text))
            return FAIL(r, DDT_ERR_UNSUPPORTED, name,
                        "'%s' part %zu: only {\"type\": \"text\", \"text\": \"...\"} parts are supported", name, k);
        total += json_string_length(text);
    }
    char *buf = malloc(total + 1);
    if (!buf) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    size_t o = 0;
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *text = json_object_get(json_array_get(c, k), "text");
        memcpy(buf + o, json_string_value(text), json_string_length(text));
        o += json_string_length(text);
    }
    *out = json_stringn_nocheck(buf, o); /* parts of valid JSON strings: valid UTF-8 */
    free(buf);
    if (!*out) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    return DDT_OK;
}

/* Copy an optional string field of a message (absent or null: left out). */
static ddt_status copy_string(ddt_api_request *r, json_t *msg, json_t *dst, const char *field, size_t i, bool required,
                              ddt_error *err) {
    json_t *v = json_object_get(msg, field);
    char name[64];
    snprintf(name, sizeof name, "messages[%zu].%s", i, field);
    if (!v || json_is_null(v)) {
        if (required) return FAIL(r, DDT_ERR_INVALID, name, "'%s' is required", name);
        return DDT_OK;
    }
    if (!json_is_string(v)) return FAIL(r, DDT_ERR_INVALID, name, "'%s' must be a string", name);
    if (json_object_set(dst, field, v)) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    return DDT_OK;
}

/* An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}]. */
static ddt_status copy_tool_calls(ddt_api_request *r, json_t *msg, json_t *dst, size_t i, ddt_error *err) {
    json_t *tc = json_object_get(msg, "tool_calls");
    char name[64];
    snprintf(name, sizeof name, "messages[%zu].tool_calls", i);
    if (!tc || json_is_null(tc)) return DDT_OK;
    if (!json_is_array(tc)) return FAIL(r, DDT_ERR_INVALID, name, "'%s' must be an array", name);
    for (size_t k = 0; k < json_array_size(tc); k++) {
        json_t *c = json_array_get(tc, k), *fn = json_object_get(c, "function");
        json_t *type = json_object_get(c, "type"), *args = json_object_get(fn, "arguments");
        if (!json_is_object(c) || !json_is_string(json_object_get(c, "id")) ||
            (type && !(json_is_string(type) && !strcmp(json_string_value(type), "function"))) || !json_is_object(fn) ||
            !json_is_string(json_object_get(fn, "name")) || !(json_is_string(args) || json_is_object(args)))
            return FAIL(r, DDT_ERR_INVALID, name,
                        "'%s'[%zu] must be {\"id\": string, \"type\": \"function\", \"function\": {\"name\": string, "
                        "\"arguments\": string}}", name, k);
    }
    if (json_object_set(dst, "tool_calls", tc)) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    return DDT_OK;
}

static ddt_status parse_message(ddt_api_request *r, json_t *msg, size_t i, json_t *out, ddt_error *err) {
    char name[48];
    snprintf(name, sizeof name, "messages[%zu]", i);
    if (!json_is_object(msg)) return FAIL(r, DDT_ERR_INVALID, name, "'%s' must be an object", name);
    json_t *role = json_object_get(msg, "role");
    snprintf(name, sizeof name, "messages[%zu].role", i);
    if (!json_is_string(role)) return FAIL(r, DDT_ERR_INVALID, name, "'%s' must be a string", name);
    const char *rs = json_string_value(role);
    /* "developer" is OpenAI's newer name for the system role, which chat templates know */
    bool sys = !strcmp(rs, "system") || !strcmp(rs, "developer"), user = !strcmp(rs, "user");
    bool asst = !strcmp(rs, "assistant"), tool = !strcmp(rs, "tool");
    if (!sys && !user && !asst && !tool)
        return FAIL(r, DDT_ERR_UNSUPPORTED, name,
                    "'%s': role '%.32s' is not supported (system, developer, user, assistant, tool)", name, rs);
    json_t *content = NULL;
    ddt_status st = message_content(r, json_object_get(msg, "content"), i, &content, err);
    if (st) return st;
    if (json_object_set_new(out, "role", json_string(sys ? "system" : rs)) ||
        json_object_set_new(out, "content", content))
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    if ((st = copy_string(r, msg, out, "name", i, false, err))) return st;
    if (asst && (st = copy_tool_calls(r, msg, out, i, err))) return st;
    if (asst && (st = copy_string(r, msg, out, "reasoning_content", i, false, err))) return st;
    if (tool && (st = copy_string(r, msg, out, "tool_call_id", i, true, err))) return st;
    return DDT_OK;
}

static ddt_status parse_messages(ddt_api_request *r, json_t *root, ddt_error *err) {
    json_t *m = json_object_get(root, "messages");
    if (!m) return FAIL(r, DDT_ERR_INVALID, "messages", "'messages' is required");
    if (!json_is_array(m)) return FAIL(r, DDT_ERR_INVALID, "messages", "'messages' must be an array");
    size_t n = json_array_size(m);
    if (n == 0) return FAIL(r, DDT_ERR_INVALID, "messages", "'messages' is empty");
    if (n > DDT_API_MAX_MESSAGES)
        return FAIL(r, DDT_ERR_RANGE, "messages", "'messages' has %zu entries, more than %d", n, DDT_API_MAX_MESSAGES);
    if (!(r->messages = json_array())) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *out = json_object();
        if (!out || json_array_append_new(r->messages, out)) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
        ddt_status st = parse_message(r, json_array_get(m, i), i, out, err);
        if (st) return st;
    }
    r->n_msgs = n;
    return DDT_OK;
}

/* The grammars of the calls' arguments (request.h tool_schemas): the forced function's
 * parameters, or with none forced ("required" of several, "auto") every function's, since the
 * model picks the name.  A schema that does not compile leaves NULL and a note; only running
 * out of memory fails. */
static ddt_status compile_tool_schemas(ddt_api_request *r, json_t *tools, ddt_error *err) {
    const size_t nt = json_array_size(tools);
    r->tool_schemas = calloc(nt, sizeof *r->tool_schemas);
    if (!r->tool_schemas) return FAIL(r, DDT_ERR_NOMEM, "tools", "out of memory");
    r->n_tool_schemas = (int32_t)nt;
    for (size_t k = 0; k < nt; k++) {
        json_t *fn = json_object_get(json_array_get(tools, k), "function");
        if (r->tool_choice_name && strcmp(json_string_value(json_object_get(fn, "name")), r->tool_choice_name))
            continue;
        if (r->tool_choice_name) r->tool_forced = (int32_t)k;
        json_t *params = json_object_get(fn, "parameters");
        ddt_error e = {0};
        ddt_status st = json_is_object(params) ? ddt_json_schema_compile(params, &r->tool_schemas[k], &e)
                                               : ddt_fail(&e, DDT_ERR_UNSUPPORTED, "no 'parameters'");
        if (st == DDT_ERR_NOMEM) return FAIL(r, st, "tools", "tools[%zu].function.parameters: %.200s", k, e.msg);
        if (st && !r->tool_schema_note[0])
            snprintf(r->tool_schema_note, sizeof r->tool_schema_note, "tools[%zu].function.parameters: %.200s", k, e.msg);
        if (r->tool_choice_name) break; /* a forced name declared twice: its first declaration */
    }
    return DDT_OK;
}

/* tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}], with
 * tool_choice "auto" (the default), "none" (the tools are left out of the prompt), "required"
 * or {"type": "function", "function": {"name": ...}} (the server starts the answer with the
 * call's opening markers: see request.h). */
static ddt_status parse_tools(ddt_api_request *r, json_t *root, ddt_error *err) {
    json_t *choice = json_object_get(root, "tool_choice");
    const char *bad = "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                      "\"function\": {\"name\": ...}}";
    r->tool_choice = DDT_TOOL_CHOICE_AUTO;
    if (choice && !json_is_null(choice)) {
        if (json_is_string(choice)) {
            const char *c = json_string_value(choice);
            if (!strcmp(c, "none")) r->tool_choice = DDT_TOOL_CHOICE_NONE;
            else if (!strcmp(c, "required")) r->tool_choice = DDT_TOOL_CHOICE_REQUIRED;
            else if (strcmp(c, "auto")) return FAIL(r, DDT_ERR_INVALID, "tool_choice", "%s", bad);
        } else {
            json_t *type = json_object_get(choice, "type"), *name = json_object_get(json_object_get(choice, "function"),
                                                                                   "name");
            if (!json_is_object(choice) || !json_is_string(type) || strcmp(json_string_value(type), "function") ||
                !json_is_string(name) || json_string_length(name) == 0)
                return FAIL(r, DDT_ERR_INVALID, "tool_choice", "%s", bad);
            r->tool_choice = DDT_TOOL_CHOICE_NAMED;
            r->tool_choice_name = json_string_value(name);
        }
    }
    bool par = true;
    json_t *pv = json_object_get(root, "parallel_tool_calls");
    if (pv && !json_is_null(pv)) {
        ddt_status st = get_bool(r, root, "parallel_tool_calls", &par, err);
        if (st) return st;
    }
    (void)par; /* a hint about the model's choice, as elsewhere: not enforced */
    json_t *tools = json_object_get(root, "tools");
    size_t nt = json_is_array(tools) ? json_array_size(tools) : 0;
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return FAIL(r, DDT_ERR_INVALID, "tools", "'tools' must be an array");
    if (nt > DDT_API_MAX_TOOLS)
        return FAIL(r, DDT_ERR_RANGE, "tools", "'tools' has %zu entries, more than %d", nt, DDT_API_MAX_TOOLS);
    bool named_found = false;
    for (size_t k = 0; k < nt; k++) {
        json_t *t = json_array_get(tools, k), *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
        json_t *params = json_object_get(fn, "parameters"), *desc = json_object_get(fn, "description");
        json_t *name = json_object_get(fn, "name");
        char field[32];
        snprintf(field, sizeof field, "tools[%zu]", k);
        if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function") ||
            !json_is_object(fn) || !json_is_string(name) || (params && !json_is_null(params) && !json_is_object(params)) ||
            (desc && !json_is_null(desc) && !json_is_string(desc)))
            return FAIL(r, DDT_ERR_INVALID, field,
                        "'%s' must be {\"type\": \"function\", \"function\": {\"name\": string, \"description\": "
                        "string, \"parameters\": object}}", field);
        if (r->tool_choice == DDT_TOOL_CHOICE_NAMED && !strcmp(json_string_value(name), r->tool_choice_name))
            named_found = true;
    }
    if ((r->tool_choice == DDT_TOOL_CHOICE_REQUIRED || r->tool_choice == DDT_TOOL_CHOICE_NAMED) && nt == 0)
        return FAIL(r, DDT_ERR_INVALID, "tool_choice", "'tool_choice' asks for a call but 'tools' declares none");
    if (r->tool_choice == DDT_TOOL_CHOICE_NAMED && !named_found)
        return FAIL(r, DDT_ERR_INVALID, "tool_choice", "'tool_choice' names '%.64s', which 'tools' does not declare",
                    r->tool_choice_name);
    if (r->tool_choice != DDT_TOOL_CHOICE_NONE && nt > 0) r->tools = json_incref(tools);
    r->tool_forced = -1;
    if (r->tool_choice == DDT_TOOL_CHOICE_REQUIRED && nt == 1)
        r->tool_choice_name = json_string_value(json_object_get(json_object_get(json_array_get(tools, 0), "function"),
                                                                "name"));
    if (r->tool_choice != DDT_TOOL_CHOICE_NONE && nt > 0) {
        ddt_status st = compile_tool_schemas(r, tools, err);
        if (st) return st;
    }
    /* the index of a forced call: Kimi numbers calls across the conversation */
    for (size_t i = 0; i < r->n_msgs; i++) {
        json_t *tc = json_object_get(json_array_get(r->messages, i), "tool_calls");
        r->n_prior_calls += json_is_array(tc) ? (int32_t)json_array_size(tc) : 0;
    }
    return DDT_OK;
}

/* "prompt": a string, an array of one string, or an array of token ids. */
static ddt_status parse_prompt(ddt_api_request *r, json_t *root, ddt_error *err) {
    json_t *p = json_object_get(root, "prompt");
    if (!p) return FAIL(r, DDT_ERR_INVALID, "prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        r->prompt = json_string_value(p);
        r->prompt_len = json_string_length(p);
        if (r->prompt_len == 0) return FAIL(r, DDT_ERR_INVALID, "prompt", "'prompt' is empty");
        return DDT_OK;
    }
    if (!json_is_array(p))
        return FAIL(r, DDT_ERR_INVALID, "prompt", "'prompt' must be a string or an array of token ids");
    size_t n = json_array_size(p);
    if (n == 0) return FAIL(r, DDT_ERR_INVALID, "prompt", "'prompt' is empty");
    if (n > DDT_API_MAX_PROMPT_IDS)
        return FAIL(r, DDT_ERR_RANGE, "prompt", "'prompt' has %zu token ids, more than %d", n, DDT_API_MAX_PROMPT_IDS);
    r->prompt_ids = malloc(n * sizeof(int32_t));
    if (!r->prompt_ids) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(p, i);
        if (json_is_string(v))
            return FAIL(r, DDT_ERR_UNSUPPORTED, "prompt", "'prompt': only one prompt per request is supported");
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return FAIL(r, DDT_ERR_INVALID, "prompt", "'prompt'[%zu] must be a token id (an integer >= 0)", i);
        r->prompt_ids[i] = (int32_t)json_integer_value(v);
    }
    r->n_prompt_ids = n;
    return DDT_OK;
}

static ddt_status parse_stop(ddt_api_request *r, json_t *root, ddt_error *err) {
    json_t *s = json_object_get(root, "stop");
    if (!s || json_is_null(s)) return DDT_OK;
    json_t *one[1] = {s};
    size_t n = json_is_array(s) ? json_array_size(s) : 1;
    if (!json_is_array(s) && !json_is_string(s))
        return FAIL(r, DDT_ERR_INVALID, "stop", "'stop' must be a string or an array of strings");
    if (n > DDT_API_MAX_STOP)
        return FAIL(r, DDT_ERR_RANGE, "stop", "'stop' has %zu strings, at most %d are allowed", n, DDT_API_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_is_array(s) ? json_array_get(s, i) : one[0];
        if (!json_is_string(v)) return FAIL(r, DDT_ERR_INVALID, "stop", "'stop'[%zu] must be a string", i);
        size_t len = json_string_length(v);
        if (len == 0) return FAIL(r, DDT_ERR_INVALID, "stop", "'stop'[%zu] is empty", i);
        if (len > DDT_API_MAX_STOP_LEN)
            return FAIL(r, DDT_ERR_RANGE, "stop", "'stop'[%zu] is %zu bytes, longer than %d", i, len,
                        DDT_API_MAX_STOP_LEN);
        r->stop[r->n_stop] = json_string_value(v);
        r->stop_len[r->n_stop++] = len;
    }
    return DDT_OK;
}

static ddt_status parse_speculative(ddt_api_request *r, json_t *root, ddt_error *err) {
    json_t *sp = json_object_get(root, "speculative");
    if (!sp || json_is_null(sp)) return DDT_OK;
    if (!json_is_object(sp))
        return FAIL(r, DDT_ERR_INVALID, "speculative", "'speculative' must be an object {\"mode\", \"budget\"}");
    json_t *m = json_object_get(sp, "mode"), *b = json_object_get(sp, "budget");
    if (m && !json_is_null(m)) {
        if (!json_is_string(m) || !ddt_mode_parse(json_string_value(m), &r->mode))
            return FAIL(r, DDT_ERR_INVALID, "speculative.mode", "'speculative.mode' must be \"ar\", \"chain\" or \"tree\"");
        r->have_mode = true;
    }
    if (b && !json_is_null(b)) {
        if (json_is_string(b) && !strcmp(json_string_value(b), "auto")) {
            r->budget_auto = true;
        } else if (json_is_integer(b) && json_integer_value(b) >= 1 && json_integer_value(b) <= DDT_MAX_BUDGET) {
            r->budget = (int32_t)json_integer_value(b);
        } else {
            return FAIL(r, DDT_ERR_INVALID, "speculative.budget",
                        "'speculative.budget' must be an integer in 1..%d or \"auto\"", DDT_MAX_BUDGET);
        }
        r->have_budget = true;
    }
    return DDT_OK;
}

/* response_format.json_schema: {"name", "schema", "strict", "description"}, the
 * schema compiled here (text/json_schema.h) so that a schema outside the subset
 * is a 400 before anything is queued. */
static ddt_status parse_json_schema(ddt_api_request *r, json_t *js, ddt_error *err) {
    const char *param = "response_format";
    if (!json_is_object(js))
        return FAIL(r, DDT_ERR_INVALID, param, "'response_format': type \"json_schema\" needs a 'json_schema' object "
                    "with 'name' and 'schema'");
    const char *key;
    json_t *v;
    json_object_foreach(js, key, v) {
        if (strcmp(key, "name") && strcmp(key, "schema") && strcmp(key, "strict") && strcmp(key, "description"))
            return FAIL(r, DDT_ERR_UNSUPPORTED, param, "'response_format.json_schema': unknown field '%.60s' (name, "
                        "schema, strict, description)", key);
    }
    json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict"),
           *desc = json_object_get(js, "description"), *schema = json_object_get(js, "schema");
    if (!json_is_string(name) || json_string_length(name) == 0)
        return FAIL(r, DDT_ERR_INVALID, param, "'response_format.json_schema.name' must be a non-empty string");
    if (strict && !json_is_null(strict) && !json_is_boolean(strict))
        return FAIL(r, DDT_ERR_INVALID, param, "'response_format.json_schema.strict' must be true or false");
    if (desc && !json_is_string(desc))
        return FAIL(r, DDT_ERR_INVALID, param, "'response_format.json_schema.description' must be a string");
    if (!json_is_object(schema))
        return FAIL(r, DDT_ERR_INVALID, param, "'response_format.json_schema.schema' must be an object");
    /* strict false or absent changes nothing: the schema is always enforced, which is an instance either way */
    ddt_error e = {0};
    ddt_status st = ddt_json_schema_compile(schema, &r->json_schema, &e);
    if (st)
        return FAIL(r, st, param, "'response_format.json_schema.schema': %s", e.msg);
    return DDT_OK;
}

/* logit_bias: null or {"<token id>": bias}, ids as decimal strings (OpenAI's form),
 * biases -100..100; the ids' upper bound is the model's vocabulary, which the
 * server checks. */
static ddt_status parse_logit_bias(ddt_api_request *r, json_t *root, ddt_error *err) {
    const char *param = "logit_bias";
    json_t *lb = json_object_get(root, param);
    if (!lb || json_is_null(lb)) return DDT_OK;
    if (!json_is_object(lb))
        return FAIL(r, DDT_ERR_INVALID, param, "'logit_bias' must be an object of token id (a string) to bias");
    const size_t n = json_object_size(lb);
    if (n > DDT_API_MAX_LOGIT_BIAS)
        return FAIL(r, DDT_ERR_RANGE, param, "'logit_bias' has %zu entries, at most %d are allowed", n,
                    DDT_API_MAX_LOGIT_BIAS);
    if (n == 0) return DDT_OK;
    r->logit_bias_ids = malloc(n * sizeof *r->logit_bias_ids);
    r->logit_bias = malloc(n * sizeof *r->logit_bias);
    if (!r->logit_bias_ids || !r->logit_bias) return FAIL(r, DDT_ERR_NOMEM, param, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(lb, key, v) {
        /* a decimal id: digits only, no sign, no leading zeros but "0", below 2^31 */
        size_t len = strlen(key);
        bool ok = len >= 1 && len <= 10 && (key[0] != '0' || len == 1);
        long long id = 0;
        for (size_t i = 0; ok && i < len; i++) {
            ok = key[i] >= '0' && key[i] <= '9';
            id = id * 10 + (key[i] - '0');
        }
        if (!ok || id > INT32_MAX)
            return FAIL(r, DDT_ERR_INVALID, param, "'logit_bias' key '%.40s' is not a token id (a decimal integer)",
                        key);
        if (!json_is_number(v) || !(json_number_value(v) >= -100.0 && json_number_value(v) <= 100.0))
            return FAIL(r, DDT_ERR_RANGE, param, "'logit_bias'[\"%s\"] must be a number in -100..100", key);
        r->logit_bias_ids[r->n_logit_bias] = (int32_t)id;
        r->logit_bias[r->n_logit_bias] = (float)json_number_value(v);
        r->n_logit_bias++;
    }
    return DDT_OK;
}

static ddt_status parse_fields(ddt_api_request *r, json_t *root, ddt_error *err) {
    ddt_status st = r->kind == DDT_API_CHAT ? parse_messages(r, root, err) : parse_prompt(r, root, err);
    if (st) return st;
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) return FAIL(r, DDT_ERR_INVALID, "model", "'model' must be a string");
        r->model = json_string_value(model);
    }
    bool have;
    long long ll;
    double x;
    /* max_completion_tokens is the newer chat name; it wins when both are given */
    const char *names[2] = {"max_tokens", "max_completion_tokens"};
    for (int k = 0; k < 2; k++) {
        /* 0 only with echo (scoring a prompt), checked below */
        if ((st = get_int(r, root, names[k], 0, DDT_API_MAX_TOKENS, &have, &ll, err))) return st;
        if (have) {
            r->have_max_tokens = true;
            r->max_tokens = ll;
        }
    }
    if ((st = get_number(r, root, "temperature", 0.0, 2.0, &r->have_temperature, &x, err))) return st;
    if (r->have_temperature) r->temperature = (float)x;
    if ((st = get_number(r, root, "top_p", 0.0, 1.0, &r->have_top_p, &x, err))) return st;
    if (r->have_top_p) {
        if (x <= 0.0) return FAIL(r, DDT_ERR_RANGE, "top_p", "'top_p' must be greater than 0");
        r->top_p = (float)x;
    }
    /* top_k: vLLM's extension; -1 and 0 both mean off */
    if ((st = get_int(r, root, "top_k", -1, INT32_MAX, &r->have_top_k, &ll, err))) return st;
    if (r->have_top_k) r->top_k = ll < 0 ? 0 : (int32_t)ll;
    if ((st = get_int(r, root, "seed", INT64_MIN, INT64_MAX, &r->have_seed, &ll, err))) return st;
    if (r->have_seed) r->seed = (uint64_t)ll;
    if ((st = get_int(r, root, "n", 1, DDT_API_MAX_N, &have, &ll, err))) return st;
    r->n = have ? (int32_t)ll : 1;
    bool flag = false;
    r->logprobs = -1;
    if (r->kind == DDT_API_CHAT) {
        /* chat: "logprobs": true, and "top_logprobs": N alternatives (which needs it) */
        if ((st = get_bool(r, root, "logprobs", &flag, err))) return st;
        if ((st = get_int(r, root, "top_logprobs", 0, DDT_API_MAX_TOP_LOGPROBS, &have, &ll, err))) return st;
        if (have && !flag)
            return FAIL(r, DDT_ERR_INVALID, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        if (flag) r->logprobs = have ? (int32_t)ll : 0;
    } else {
        /* completions: "logprobs": N, the alternatives per token (OpenAI allows 5; vLLM, like this, 20) */
        if ((st = get_int(r, root, "logprobs", 0, DDT_API_MAX_TOP_LOGPROBS, &have, &ll, err))) return st;
        if (have) r->logprobs = (int32_t)ll;
    }
    if ((st = get_bool(r, root, "echo", &r->echo, err))) return st;
    if (r->echo && r->kind == DDT_API_CHAT)
        return FAIL(r, DDT_ERR_UNSUPPORTED, "echo", "'echo' is a completions field (chat has none)");
    if (r->have_max_tokens && r->max_tokens == 0 && !r->echo)
        return FAIL(r, DDT_ERR_RANGE, "max_tokens", "'max_tokens' is 0: at least 1 (0 only with 'echo', to score "
                    "the prompt)");
    if ((st = get_number(r, root, "presence_penalty", -2.0, 2.0, &have, &x, err))) return st;
    if (have) r->presence_penalty = (float)x;
    if ((st = get_number(r, root, "frequency_penalty", -2.0, 2.0, &have, &x, err))) return st;
    if (have) r->frequency_penalty = (float)x;
    if ((st = get_number(r, root, "repetition_penalty", 0.0, 10.0, &have, &x, err))) return st;
    if (have && x == 0.0)
        return FAIL(r, DDT_ERR_RANGE, "repetition_penalty", "'repetition_penalty' must be above 0 (1: none)");
    if (have) r->repetition_penalty = (float)x;
    if ((st = parse_logit_bias(r, root, err))) return st;
    json_t *rf = json_object_get(root, "response_format");
    if (rf && !json_is_null(rf)) {
        json_t *type = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
        if (!json_is_string(type))
            return FAIL(r, DDT_ERR_INVALID, "response_format",
                        "'response_format' must be an object with a string 'type' (\"text\", \"json_object\" or "
                        "\"json_schema\")");
        const char *t = json_string_value(type);
        if (!strcmp(t, "json_object")) {
            r->json_object = true;
        } else if (!strcmp(t, "json_schema")) {
            if ((st = parse_json_schema(r, json_object_get(rf, "json_schema"), err))) return st;
        } else if (strcmp(t, "text")) {
            return FAIL(r, DDT_ERR_INVALID, "response_format",
                        "'response_format': unknown type \"%.40s\" (\"text\", \"json_object\" or \"json_schema\")",
                        t);
        }
    }
    if ((st = get_int(r, root, "best_of", 1, 1000000, &have, &ll, err))) {
        if (st != DDT_ERR_RANGE) return st;
        ll = 0;
        have = true;
    }
    if (have && ll != 1) return FAIL(r, DDT_ERR_UNSUPPORTED, "best_of", "'best_of': only 1 is supported");
    json_t *suffix = json_object_get(root, "suffix");
    if (suffix && !json_is_null(suffix) && !(json_is_string(suffix) && json_string_length(suffix) == 0))
        return FAIL(r, DDT_ERR_UNSUPPORTED, "suffix", "'suffix' (insertion) is not supported");
    if (r->kind == DDT_API_CHAT) {
        if ((st = parse_tools(r, root, err))) return st;
        json_t *kw = json_object_get(root, "chat_template_kwargs");
        if (kw && !json_is_null(kw)) {
            if (!json_is_object(kw))
                return FAIL(r, DDT_ERR_INVALID, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
            r->template_kwargs = json_incref(kw);
        }
        json_t *ct = json_object_get(root, "chat_template");
        if (ct && !json_is_null(ct))
            return FAIL(r, DDT_ERR_UNSUPPORTED, "chat_template",
                        "'chat_template': a per-request template is not supported (the model folder's is used)");
        r->add_generation_prompt = true;
        if ((st = get_bool(r, root, "add_generation_prompt", &r->add_generation_prompt, err))) return st;
        bool cont = false;
        if ((st = get_bool(r, root, "continue_final_message", &cont, err))) return st;
        if (cont)
            return FAIL(r, DDT_ERR_UNSUPPORTED, "continue_final_message", "'continue_final_message' is not supported");
    } else {
        json_t *tools = json_object_get(root, "tools");
        if (tools && !json_is_null(tools) && !(json_is_array(tools) && json_array_size(tools) == 0))
            return FAIL(r, DDT_ERR_UNSUPPORTED, "tools", "'tools' is a chat field (completions have none)");
    }
    if ((st = parse_stop(r, root, err))) return st;
    if ((st = get_bool(r, root, "stream", &r->stream, err))) return st;
    if (r->stream && r->echo)
        return FAIL(r, DDT_ERR_UNSUPPORTED, "echo", "'echo' with 'stream' is not supported (ask without stream)");
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return FAIL(r, DDT_ERR_INVALID, "stream_options", "'stream_options' must be an object");
        if ((st = get_bool(r, so, "include_usage", &r->include_usage, err))) {
            snprintf(r->param, sizeof r->param, "stream_options.include_usage");
            return st;
        }
    }
    if ((st = get_bool(r, root, "return_token_ids", &r->return_token_ids, err))) return st;
    return parse_speculative(r, root, err);
}

ddt_status ddt_api_request_parse(ddt_api_kind kind, const char *body, size_t len, ddt_api_request *req,
                                 ddt_error *err) {
    if (!req) return ddt_fail(err, DDT_ERR_INVALID, "ddt_api_request_parse: NULL request");
    memset(req, 0, sizeof *req);
    req->kind = kind;
    req->tool_forced = -1;
    if (!body && len) return ddt_fail(err, DDT_ERR_INVALID, "ddt_api_request_parse: NULL body");
    if (kind != DDT_API_CHAT && kind != DDT_API_COMPLETION)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_api_request_parse: unknown kind %d", (int)kind);
    json_error_t je;
    json_t *root = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return ddt_fail(err, DDT_ERR_INVALID, "the body is not valid JSON: %s (at byte %d)", je.text, je.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return ddt_fail(err, DDT_ERR_INVALID, "the body must be a JSON object");
    }
    req->owned_ = root;
    ddt_status st = parse_fields(req, root, err);
    if (st) {
        char param[sizeof req->param];
        memcpy(param, req->param, sizeof param);
        ddt_api_request_free(req);
        memcpy(req->param, param, sizeof param);
        return st;
    }
    ddt_error_clear(err);
    return DDT_OK;
}

void ddt_api_request_free(ddt_api_request *req) {
    if (!req) return;
    if (req->messages) json_decref(req->messages);
    if (req->tools) json_decref(req->tools);
    if (req->template_kwargs) json_decref(req->template_kwargs);
    free(req->prompt_ids);
    ddt_json_schema_free(req->json_schema);
    free(req->logit_bias_ids);
    free(req->logit_bias);
    for (int32_t k = 0; k < req->n_tool_schemas; k++) ddt_json_schema_free(req->tool_schemas[k]);
    free(req->tool_schemas);
    if (req->owned_) json_decref((json_t *)req->owned_);
    memset(req, 0, sizeof *req);
}
