/*
 * chat_output.c — the generation's ids routed to content, reasoning and tool
 * calls (see chat_output.h).  A small state machine on the marker ids; a call's
 * id and arguments collect in one growing buffer and become a
 * ddt_chat_tool_call at <|tool_call_end|>.  Malformed sequences (a call begun
 * inside another, a section closed inside a call) drop the unfinished call
 * rather than report half of one.
 */
#include "text/chat_output.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/utf8.h"

enum { ST_CONTENT, ST_REASONING, ST_SECTION, ST_CALL_ID, ST_CALL_ARGS };

static int32_t marker(const ddt_tokenizer *tok, const char *text) {
    int32_t id = ddt_tokenizer_token_id(tok, text);
    return id >= 0 && ddt_tokenizer_is_special(tok, id) ? id : -1;
}

void ddt_chat_markers_find(const ddt_tokenizer *tok, ddt_chat_markers *m) {
    m->think = marker(tok, "<think>");
    m->think_end = marker(tok, "</think>");
    m->section_begin = marker(tok, "<|tool_calls_section_begin|>");
    m->section_end = marker(tok, "<|tool_calls_section_end|>");
    m->call_begin = marker(tok, "<|tool_call_begin|>");
    m->arg_begin = marker(tok, "<|tool_call_argument_begin|>");
    m->call_end = marker(tok, "<|tool_call_end|>");
}

void ddt_chat_router_init(ddt_chat_router *r, const ddt_tokenizer *tok, bool in_reasoning) {
    memset(r, 0, sizeof *r);
    r->tok = tok;
    if (tok) ddt_chat_markers_find(tok, &r->m);
    else r->m = (ddt_chat_markers){-1, -1, -1, -1, -1, -1, -1};
    r->state = in_reasoning && r->m.think_end >= 0 ? ST_REASONING : ST_CONTENT;
}

void ddt_chat_router_free(ddt_chat_router *r) {
    if (!r) return;
    for (int i = 0; i < r->n_calls; i++) {
        free(r->calls[i].id);
        free(r->calls[i].name);
        free(r->calls[i].arguments);
    }
    free(r->buf);
    memset(r, 0, sizeof *r);
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* A malloc'd, NUL-terminated copy of s[0..n) without surrounding whitespace. */
static char *trimmed(const char *s, size_t n) {
    while (n && is_space(*s)) s++, n--;
    while (n && is_space(s[n - 1])) n--;
    char *o = malloc(n + 1);
    if (!o) return NULL;
    if (n) memcpy(o, s, n);
    o[n] = '\0';
    return o;
}

/* "functions.NAME:IDX" -> NAME (Kimi's ids; vLLM's kimi_k2 parser reads them the same
 * way); an id of another shape is its own name. */
static char *name_of(const char *id) {
    const char *s = id, *e = id + strlen(id);
    if (!strncmp(s, "functions.", 10)) s += 10;
    const char *colon = strrchr(s, ':');
    if (colon && colon[1]) {
        const char *d = colon + 1;
        while (*d >= '0' && *d <= '9') d++;
        if (*d == '\0') e = colon;
    }
    return trimmed(s, (size_t)(e - s));
}

static ddt_status finish_call(ddt_chat_router *r, ddt_error *err) {
    if (r->overflow || r->n_calls >= DDT_CHAT_MAX_TOOL_CALLS) {
        r->overflow = true;
        return DDT_OK;
    }
    ddt_chat_tool_call c = {trimmed(r->buf ? r->buf : "", r->id_len), NULL, NULL};
    if (c.id) c.name = name_of(c.id);
    if (c.id) c.arguments = trimmed(r->buf ? r->buf + r->id_len : "", r->len - r->id_len);
    if (!c.id || !c.name || !c.arguments) {
        free(c.id);
        free(c.name);
        free(c.arguments);
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for a tool call");
    }
    r->calls[r->n_calls++] = c;
    return DDT_OK;
}

static ddt_status append(ddt_chat_router *r, int32_t id, ddt_error *err) {
    const uint8_t *b;
    size_t n;
    if (!ddt_tokenizer_text_bytes(r->tok, id, &b, &n) || n == 0) return DDT_OK;
    if (r->overflow || r->len + n > DDT_CHAT_MAX_CALL_BYTES) {
        r->overflow = true; /* this call is dropped at its end */
        return DDT_OK;
    }
    if (r->len + n > r->cap) {
        size_t cap = r->cap ? r->cap : 256;
        while (cap < r->len + n) cap *= 2;
        char *nb = realloc(r->buf, cap);
        if (!nb) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for a tool call");
        r->buf = nb;
        r->cap = cap;
    }
    memcpy(r->buf + r->len, b, n);
    r->len += n;
    return DDT_OK;
}

static void begin_call(ddt_chat_router *r) {
    r->len = r->id_len = 0;
    /* one oversized call is dropped, the next starts afresh (unless the count is full) */
    r->overflow = r->n_calls >= DDT_CHAT_MAX_TOOL_CALLS;
    r->state = ST_CALL_ID;
}

ddt_status ddt_chat_route(ddt_chat_router *r, int32_t id, ddt_chat_channel *ch, bool *call_done, ddt_error *err) {
    *ch = DDT_CHAT_CH_NONE;
    *call_done = false;
    const ddt_chat_markers *m = &r->m;
    /* markers have ids >= 0, so a missing one (-1) never matches an emitted id */
    switch (r->state) {
    case ST_CONTENT:
    case ST_REASONING:
        if (id == m->think && r->state == ST_CONTENT && m->think_end >= 0) r->state = ST_REASONING;
        else if (id == m->think_end && r->state == ST_REASONING) r->state = ST_CONTENT;
        else if (id == m->section_begin) r->state = ST_SECTION;
        else if (id == m->call_begin) begin_call(r); /* a call without its section: read it all the same */
        else if (id == m->think || id == m->think_end || id == m->section_end) {
            /* a stray marker: not text */
        } else {
            *ch = r->state == ST_CONTENT ? DDT_CHAT_CH_CONTENT : DDT_CHAT_CH_REASONING;
        }
        return DDT_OK;
    case ST_SECTION:
        if (id == m->call_begin) begin_call(r);
        else if (id == m->section_end) r->state = ST_CONTENT;
        return DDT_OK; /* text between calls (whitespace) belongs to nothing */
    case ST_CALL_ID:
    case ST_CALL_ARGS:
        if (id == m->call_begin) {
            begin_call(r); /* the unfinished call is dropped */
        } else if (id == m->section_end) {
            r->state = ST_CONTENT; /* likewise */
        } else if (id == m->arg_begin && r->state == ST_CALL_ID) {
            r->id_len = r->len;
            r->state = ST_CALL_ARGS;
        } else if (id == m->call_end && r->state == ST_CALL_ARGS) {
            r->state = ST_SECTION;
            bool dropped = r->overflow;
            ddt_status st = finish_call(r, err);
            if (st != DDT_OK) return st;
            *call_done = !dropped;
        } else if (!ddt_tokenizer_is_special(r->tok, id)) {
            *ch = DDT_CHAT_CH_TOOL;
            return append(r, id, err);
        }
        return DDT_OK;
    }
    return DDT_OK;
}

ddt_status ddt_chat_router_args_name(const ddt_chat_router *r, char **name, ddt_error *err) {
    *name = NULL;
    if (r->state != ST_CALL_ARGS) return DDT_OK;
    /* the id's bytes end at id_len; name_of wants them NUL-terminated */
    char *id = trimmed(r->buf ? r->buf : "", r->id_len);
    if (id) *name = name_of(id);
    free(id);
    return *name ? DDT_OK : ddt_fail(err, DDT_ERR_NOMEM, "out of memory for a tool call's name");
}

json_t *ddt_chat_tool_calls_json(const ddt_chat_tool_call *calls, int n, int first_index) {
    json_t *a = json_array();
    for (int k = 0; a && k < n; k++) {
        const ddt_chat_tool_call *c = &calls[k];
        json_t *o = json_pack("{s:o, s:s, s:{s:o, s:o}}", "id", ddt_utf8_json_string(c->id, strlen(c->id)), "type",
                              "function", "function", "name", ddt_utf8_json_string(c->name, strlen(c->name)),
                              "arguments", ddt_utf8_json_string(c->arguments, strlen(c->arguments)));
        if (o && first_index >= 0) json_object_set_new(o, "index", json_integer(first_index + k));
        if (!o || json_array_append_new(a, o)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}
