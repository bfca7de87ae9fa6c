/*
 * api.c — see api.h.
 */
#include "server/api.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* s (freed here) as one "data: ...\n\n" event. */
static char *sse_event(char *s, size_t *len) {
    if (!s) return NULL;
    size_t n = strlen(s);
    char *e = malloc(n + 9);
    if (e) {
        memcpy(e, "data: ", 6);
        memcpy(e + 6, s, n);
        memcpy(e + 6 + n, "\n\n", 3);
        if (len) *len = n + 8;
    }
    free(s);
    return e;
}

/* Serialise and free o; with sse, as one event. */
static char *dump(json_t *o, bool sse, size_t *len) {
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return NULL;
    if (sse) return sse_event(s, len);
    if (len) *len = strlen(s);
    return s;
}

static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

char *ddt_api_error_body(const char *message, const char *type, const char *param, const char *code, size_t *len) {
    json_t *msg = json_string(message);
    if (!msg) msg = json_string("(the message was not valid UTF-8)");
    return dump(json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message", msg, "type", type, "param",
                          str_or_null(param), "code", str_or_null(code)),
                false, len);
}

static json_t *head(const ddt_api_ids *r, bool chunk) {
    const char *object = r->kind == DDT_API_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                 : "text_completion";
    return json_pack("{s:s, s:s, s:I, s:s}", "id", r->id, "object", object, "created", (json_int_t)r->created,
                     "model", r->model);
}

/* usage, with OpenAI's prompt_tokens_details.cached_tokens: the prompt tokens whose
 * context the engine reused from the previous request (engine.h prefix_cache) */
static json_t *usage(int64_t prompt, int64_t completion, int64_t cached) {
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)prompt, "completion_tokens",
                     (json_int_t)completion, "total_tokens", (json_int_t)(prompt + completion),
                     "prompt_tokens_details", "cached_tokens", (json_int_t)cached);
}

char *ddt_api_chunk_event(const ddt_api_ids *r, bool role, const char *text, size_t text_len,
                          const char *finish_reason, size_t *len) {
    json_t *o = head(r, true);
    json_t *choice = json_pack("{s:i, s:o}", "index", 0, "finish_reason", str_or_null(finish_reason));
    json_t *t = text ? json_stringn(text, text_len) : NULL;
    if (!o || !choice || (text && !t)) {
        json_decref(o);
        json_decref(choice);
        json_decref(t);
        return NULL;
    }
    if (r->kind == DDT_API_CHAT) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (t) json_object_set_new(delta, "content", t);
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", t ? t : json_string(""));
        json_object_set_new(choice, "logprobs", json_null());
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    return dump(o, true, len);
}

char *ddt_api_usage_event(const ddt_api_ids *r, int64_t prompt_tokens, int64_t completion_tokens,
                          int64_t cached_tokens, size_t *len) {
    json_t *o = head(r, true);
    if (!o) return NULL;
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage(prompt_tokens, completion_tokens, cached_tokens));
    return dump(o, true, len);
}

char *ddt_api_error_event(const char *message, size_t *len) {
    return sse_event(ddt_api_error_body(message, "internal_error", NULL, NULL, NULL), len);
}

char *ddt_api_response_body(const ddt_api_ids *r, const ddt_api_result *res, size_t *len) {
    json_t *o = head(r, false);
    json_t *t = json_stringn(res->text ? res->text : "", res->text ? res->text_len : 0);
    json_t *choice = json_pack("{s:i, s:s, s:n}", "index", 0, "finish_reason", res->finish_reason, "logprobs");
    if (!o || !t || !choice) {
        json_decref(o);
        json_decref(t);
        json_decref(choice);
        return NULL;
    }
    if (r->kind == DDT_API_CHAT) json_object_set_new(choice, "message", json_pack("{s:s, s:o}", "role", "assistant",
                                                                                  "content", t));
    else json_object_set_new(choice, "text", t);
    if (res->ids) {
        json_t *a = json_array();
        for (int32_t i = 0; i < res->n_ids; i++) json_array_append_new(a, json_integer(res->ids[i]));
        json_object_set_new(choice, "token_ids", a);
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", usage(res->prompt_tokens, res->completion_tokens, res->cached_tokens));
    if (res->stats) {
        const ddt_gen_stats *s = res->stats;
        json_object_set_new(o, "ddtree", json_pack("{s:s, s:i, s:I, s:f, s:f, s:f}", "mode", ddt_mode_name(res->mode),
                                                   "rounds", s->rounds, "nodes_verified",
                                                   (json_int_t)s->nodes_verified, "mean_acceptance",
                                                   s->mean_acceptance, "tokens_per_s", s->tokens_per_s,
                                                   "seconds", s->t_total));
    }
    return dump(o, false, len);
}
