/*
 * api.c — see api.h.
 */
#include "server/api.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/utf8.h"

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

/* ------------------------------------------------------------------ logprobs */

static json_t *logprob_value(float v) {
    if (isnan(v)) return json_null();
    if (isinf(v) && v < 0) return json_real(-9999.0);
    return json_real((double)v);
}

/* A token's text (json string, invalid UTF-8 replaced) and, for chat, its bytes. */
static json_t *token_text(const ddt_tokenizer *tok, int32_t id, json_t **bytes) {
    const uint8_t *b = NULL;
    size_t n = 0;
    if (!tok || ddt_tokenizer_token_bytes(tok, id, &b, &n, NULL) != DDT_OK) n = 0;
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n && *bytes; i++) json_array_append_new(*bytes, json_integer(b[i]));
    }
    if (n == 0) return json_string(""); /* an id the tokenizer does not have (or an empty token) */
    return ddt_utf8_json_string((const char *)b, n);
}

/* Characters of text a token adds to a completion (special tokens add none). */
static int64_t token_chars(const ddt_tokenizer *tok, int32_t id) {
    const uint8_t *b;
    size_t n;
    if (!ddt_tokenizer_text_bytes(tok, id, &b, &n)) return 0;
    int64_t c = 0;
    for (size_t i = 0; i < n; i++) c += (b[i] & 0xC0) != 0x80; /* every byte that starts a character */
    return c;
}

static json_t *chat_logprobs(const ddt_api_logprobs *a) {
    json_t *content = json_array();
    for (int32_t k = a->first; content && k < a->first + a->n; k++) {
        const ddt_token_logprobs *p = &a->lp[k];
        /* token_text sets the bytes: called before json_pack, whose arguments have no order */
        json_t *bytes = NULL, *tops = json_array(), *tt = token_text(a->tok, a->ids[k], &bytes);
        json_t *e = json_pack("{s:o, s:o, s:o, s:o}", "token", tt, "logprob", logprob_value(p->logprob), "bytes",
                              bytes, "top_logprobs", tops);
        for (int32_t j = 0; e && j < p->n_top; j++) {
            json_t *tb = NULL, *t = token_text(a->tok, p->top_id[j], &tb);
            json_array_append_new(tops, json_pack("{s:o, s:o, s:o}", "token", t, "logprob",
                                                  logprob_value(p->top_logprob[j]), "bytes", tb));
        }
        if (!e || json_array_append_new(content, e)) {
            json_decref(content);
            return NULL;
        }
    }
    return content ? json_pack("{s:o}", "content", content) : NULL;
}

static json_t *completion_logprobs(const ddt_api_logprobs *a) {
    json_t *tokens = json_array(), *values = json_array(), *tops = json_array(), *offsets = json_array();
    int64_t off = a->offset ? *a->offset : 0;
    for (int32_t k = a->first; k < a->first + a->n; k++) {
        const ddt_token_logprobs *p = &a->lp[k];
        json_array_append_new(tokens, token_text(a->tok, a->ids[k], NULL));
        json_array_append_new(values, logprob_value(p->logprob));
        json_t *d = json_object();
        for (int32_t j = 0; j < p->n_top; j++) {
            /* keyed by text: two ids with the same text keep the likelier (listed first) */
            json_t *t = token_text(a->tok, p->top_id[j], NULL);
            if (t && d && !json_object_get(d, json_string_value(t)))
                json_object_set_new(d, json_string_value(t), logprob_value(p->top_logprob[j]));
            json_decref(t);
        }
        json_array_append_new(tops, d);
        json_array_append_new(offsets, json_integer(off));
        off += token_chars(a->tok, a->ids[k]);
    }
    if (a->offset) *a->offset = off;
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", values, "top_logprobs", tops,
                     "text_offset", offsets);
}

static json_t *logprobs_json(ddt_api_kind kind, const ddt_api_logprobs *a) {
    if (!a) return json_null();
    return kind == DDT_API_CHAT ? chat_logprobs(a) : completion_logprobs(a);
}

/* ------------------------------------------------------------------ bodies */

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
                          const ddt_api_extra *ex, const char *finish_reason, const ddt_api_logprobs *lp,
                          size_t *len) {
    json_t *o = head(r, true);
    json_t *choice = json_pack("{s:i, s:o, s:o}", "index", (int)r->index, "finish_reason", str_or_null(finish_reason),
                               "logprobs", logprobs_json(r->kind, lp));
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
        if (ex && ex->reasoning_len)
            json_object_set_new(delta, "reasoning_content", json_stringn(ex->reasoning, ex->reasoning_len));
        if (ex && ex->n_calls)
            json_object_set_new(delta, "tool_calls", ddt_chat_tool_calls_json(ex->calls, ex->n_calls, ex->first_call));
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", t ? t : json_string(""));
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

/* One choice of a whole response. */
static json_t *choice_json(const ddt_api_ids *r, const ddt_api_result *res, int index) {
    json_t *t = json_stringn(res->text ? res->text : "", res->text ? res->text_len : 0);
    json_t *choice = json_pack("{s:i, s:s, s:o}", "index", index, "finish_reason", res->finish_reason, "logprobs",
                               logprobs_json(r->kind, res->logprobs));
    if (!t || !choice) {
        json_decref(t);
        json_decref(choice);
        return NULL;
    }
    if (r->kind == DDT_API_CHAT) {
        const ddt_api_extra *ex = &res->extra;
        /* an answer that is only tool calls has null content, as OpenAI sends it */
        if (ex->n_calls && json_string_length(t) == 0) {
            json_decref(t);
            t = json_null();
        }
        json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content", t);
        if (msg && ex->reasoning_len)
            json_object_set_new(msg, "reasoning_content", json_stringn(ex->reasoning, ex->reasoning_len));
        if (msg && ex->n_calls)
            json_object_set_new(msg, "tool_calls", ddt_chat_tool_calls_json(ex->calls, ex->n_calls, -1));
        json_object_set_new(choice, "message", msg);
    } else {
        json_object_set_new(choice, "text", t);
    }
    if (res->ids) {
        json_t *a = json_array();
        for (int32_t i = 0; i < res->n_ids; i++) json_array_append_new(a, json_integer(res->ids[i]));
        json_object_set_new(choice, "token_ids", a);
    }
    return choice;
}

char *ddt_api_response_body(const ddt_api_ids *r, const ddt_api_result *res, int n, size_t *len) {
    json_t *o = head(r, false), *choices = json_array();
    if (!o || !choices || n < 1) {
        json_decref(o);
        json_decref(choices);
        return NULL;
    }
    /* usage as OpenAI counts n choices: the prompt once, every choice's completion */
    int64_t completion = 0, rounds = 0, accepted = 0, tokens = 0;
    int64_t nodes = 0;
    double seconds = 0.0, decode = 0.0;
    for (int k = 0; k < n; k++) {
        json_t *ch = choice_json(r, &res[k], k);
        if (!ch || json_array_append_new(choices, ch)) {
            json_decref(o);
            json_decref(choices);
            return NULL;
        }
        completion += res[k].completion_tokens;
        if (res[k].stats) {
            const ddt_gen_stats *s = res[k].stats;
            rounds += s->rounds, accepted += s->accepted, nodes += s->nodes_verified, tokens += s->tokens;
            seconds += s->t_total, decode += s->t_total - s->t_prefill;
        }
    }
    json_object_set_new(o, "choices", choices);
    if (res[0].ids && res[0].prompt_ids) {
        json_t *a = json_array();
        for (int32_t i = 0; a && i < res[0].n_prompt_ids; i++)
            json_array_append_new(a, json_integer(res[0].prompt_ids[i]));
        json_object_set_new(o, "prompt_token_ids", a);
    }
    json_object_set_new(o, "usage", usage(res[0].prompt_tokens, completion, res[0].cached_tokens));
    if (res[0].stats)
        json_object_set_new(o, "ddtree", json_pack("{s:s, s:I, s:I, s:f, s:f, s:f}", "mode", ddt_mode_name(res[0].mode),
                                                   "rounds", (json_int_t)rounds, "nodes_verified", (json_int_t)nodes,
                                                   "mean_acceptance", rounds ? (double)accepted / (double)rounds : 0.0,
                                                   "tokens_per_s", decode > 0 ? (double)tokens / decode : 0.0,
                                                   "seconds", seconds));
    return dump(o, false, len);
}

char *ddt_api_tokenize_body(const int32_t *ids, int32_t n, int32_t max_model_len, size_t *len) {
    json_t *a = json_array();
    for (int32_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(ids[i]))) {
            json_decref(a);
            a = NULL;
        }
    if (!a) return NULL;
    return dump(json_pack("{s:i, s:i, s:o}", "count", n, "max_model_len", max_model_len, "tokens", a), false, len);
}

char *ddt_api_detokenize_body(const char *text, size_t text_len, size_t *len) {
    json_t *t = ddt_utf8_json_string(text, text_len);
    if (!t) return NULL;
    return dump(json_pack("{s:o}", "prompt", t), false, len);
}
