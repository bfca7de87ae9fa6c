/*
 * chat_output.c — the generation's ids routed to content, reasoning and tool
 * calls (see chat_output.h).  A small state machine on the marker ids; a call's
 * id and arguments collect in one growing buffer and become a
 * ddt_chat_tool_call at <|tool_call_end|>.  Kimi's and DeepSeek's markups have
 * the same shape (section, calls, a separator between a call's head and its
 * arguments), so one machine reads both; only turning a finished call's two
 * texts into id, name and arguments differs.  Malformed sequences (a call
 * begun inside another, a section closed inside a call) drop the unfinished
 * call rather than report half of one.
 */
#include "text/chat_output.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/utf8.h"

enum { ST_CONTENT, ST_REASONING, ST_SECTION, ST_CALL_ID, ST_CALL_ARGS };

static int32_t marker(const ddt_tokenizer *tok, const char *text) {
    int32_t id = ddt_tokenizer_token_id(tok, text);
    return id >= 0 && ddt_tokenizer_is_special(tok, id) ? id : -1;
}

/* DeepSeek's markers are added tokens that tokenizer.json may mark non-special;
 * one the vocabulary also holds is an ordinary id here (tokenizer.h), yet it is
 * still the one id the marker's text encodes to, so it counts when its bytes
 * are the whole marker. */
static int32_t ds_marker(const ddt_tokenizer *tok, const char *text) {
    int32_t id = ddt_tokenizer_token_id(tok, text);
    if (id < 0 || ddt_tokenizer_is_special(tok, id)) return id;
    const uint8_t *b;
    size_t n;
    return ddt_tokenizer_text_bytes(tok, id, &b, &n) && n == strlen(text) && !memcmp(b, text, n) ? id : -1;
}

void ddt_chat_markers_find(const ddt_tokenizer *tok, ddt_chat_markers *m) {
    m->think = marker(tok, "<think>");
    m->think_end = marker(tok, "</think>");
    m->section_begin = marker(tok, "<|tool_calls_section_begin|>");
    m->section_end = marker(tok, "<|tool_calls_section_end|>");
    m->call_begin = marker(tok, "<|tool_call_begin|>");
    m->arg_begin = marker(tok, "<|tool_call_argument_begin|>");
    m->call_end = marker(tok, "<|tool_call_end|>");
    m->format = DDT_CHAT_FORMAT_NONE;
    const bool any_kimi = m->section_begin >= 0 || m->section_end >= 0 || m->call_begin >= 0 ||
                          m->arg_begin >= 0 || m->call_end >= 0;
    if (any_kimi) {
        m->format = DDT_CHAT_FORMAT_KIMI;
        return;
    }
    /* No Kimi marker at all: DeepSeek's, if the tokenizer has them.  A vocabulary
     * with both is Kimi's (its markers are looked up first, as before). */
    ddt_chat_markers d = {
        .section_begin = ds_marker(tok, DDT_DS_CALLS_BEGIN), .section_end = ds_marker(tok, DDT_DS_CALLS_END),
        .call_begin = ds_marker(tok, DDT_DS_CALL_BEGIN), .arg_begin = ds_marker(tok, DDT_DS_SEP),
        .call_end = ds_marker(tok, DDT_DS_CALL_END)};
    if (d.section_begin < 0 && d.section_end < 0 && d.call_begin < 0 && d.arg_begin < 0 && d.call_end < 0) return;
    m->section_begin = d.section_begin;
    m->section_end = d.section_end;
    m->call_begin = d.call_begin;
    m->arg_begin = d.arg_begin;
    m->call_end = d.call_end;
    m->format = DDT_CHAT_FORMAT_DEEPSEEK;
    /* R1 and V3.1 add <think> / </think> as non-special added tokens; the same rule */
    m->think = ds_marker(tok, "<think>");
    m->think_end = ds_marker(tok, "</think>");
}

bool ddt_chat_prompt_opens_thinking(const ddt_tokenizer *tok, const int32_t *prompt, size_t n) {
    if (!tok) return false;
    ddt_chat_markers m;
    ddt_chat_markers_find(tok, &m);
    if (m.think < 0 || m.think_end < 0) return false;
    for (size_t i = n; i-- > 0;) {
        if (prompt[i] == m.think) return true;
        const uint8_t *b;
        size_t len;
        if (!ddt_tokenizer_text_bytes(tok, prompt[i], &b, &len)) return false; /* another marker */
        for (size_t k = 0; k < len; k++)
            if (b[k] != ' ' && b[k] != '\n' && b[k] != '\r' && b[k] != '\t') return false;
    }
    return false;
}

void ddt_chat_router_init(ddt_chat_router *r, const ddt_tokenizer *tok, bool in_reasoning) {
    memset(r, 0, sizeof *r);
    r->tok = tok;
    if (tok) ddt_chat_markers_find(tok, &r->m);
    else r->m = (ddt_chat_markers){-1, -1, -1, -1, -1, -1, -1, DDT_CHAT_FORMAT_NONE};
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

static bool starts_with(const char *s, size_t n, const char *p) {
    size_t k = strlen(p);
    return n >= k && !memcmp(s, p, k);
}

/*
 * A DeepSeek call from its head (the text before <｜tool▁sep｜>) and its body
 * (the text after).  V3 / R1 write the type "function" as the head and
 * "NAME\n```json\nARGS\n```" as the body; V3.1 the name as the head and the
 * arguments as the body.  A "function" head whose body's first line is a name
 * (not the start of a JSON value) is V3's layout; anything else is V3.1's, so a
 * V3.1 function called "function" still reads right.  Out of memory: false.
 */
static bool deepseek_call(const char *head, size_t hn, const char *body, size_t bn, char **name, char **args) {
    while (hn && is_space(*head)) head++, hn--;
    while (hn && is_space(head[hn - 1])) hn--;
    const char *b = body, *e = body + bn;
    while (b < e && is_space(*b)) b++;
    const char *nl = memchr(b, '\n', (size_t)(e - b));
    if (hn == 8 && !memcmp(head, "function", 8) && nl && nl > b && *b != '{' && *b != '[') {
        *name = trimmed(b, (size_t)(nl - b));
        const char *a = nl + 1;
        while (a < e && is_space(*a)) a++;
        if (starts_with(a, (size_t)(e - a), "```")) {
            /* the fence line: "```json" (any info string) */
            const char *fl = memchr(a, '\n', (size_t)(e - a));
            a = fl ? fl + 1 : e;
        }
        const char *z = e;
        while (z > a && is_space(z[-1])) z--;
        if (z - a >= 3 && !memcmp(z - 3, "```", 3)) z -= 3; /* the closing fence, when written */
        *args = trimmed(a, (size_t)(z - a));
    } else {
        *name = trimmed(head, hn);
        *args = trimmed(body, bn);
    }
    return *name && *args;
}

static ddt_status finish_call(ddt_chat_router *r, ddt_error *err) {
    if (r->overflow || r->n_calls >= DDT_CHAT_MAX_TOOL_CALLS) {
        r->overflow = true;
        return DDT_OK;
    }
    const char *buf = r->buf ? r->buf : "";
    ddt_chat_tool_call c = {NULL, NULL, NULL};
    if (r->m.format == DDT_CHAT_FORMAT_DEEPSEEK) {
        char id[32];
        snprintf(id, sizeof id, "call_%ld", (long)r->first_call_index + r->n_calls);
        c.id = trimmed(id, strlen(id));
        if (c.id && !deepseek_call(buf, r->id_len, buf + r->id_len, r->len - r->id_len, &c.name, &c.arguments)) {
            free(c.name);
            free(c.arguments);
            c.name = c.arguments = NULL;
        }
    } else {
        c.id = trimmed(buf, r->id_len);
        if (c.id) c.name = name_of(c.id);
        if (c.id) c.arguments = trimmed(buf + r->id_len, r->len - r->id_len);
    }
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

/* One of the markers (a DeepSeek one may be an ordinary id, which must not
 * become a call's text). */
static bool is_marker(const ddt_chat_markers *m, int32_t id) {
    return id == m->think || id == m->think_end || id == m->section_begin || id == m->section_end ||
           id == m->call_begin || id == m->arg_begin || id == m->call_end;
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
        else if (id == m->think || id == m->think_end || id == m->section_end || id == m->arg_begin ||
                 id == m->call_end) {
            /* a stray marker: not text (DeepSeek's may be ordinary ids, which have bytes) */
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
        } else if (!ddt_tokenizer_is_special(r->tok, id) && !is_marker(m, id)) {
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
    if (id) *name = r->m.format == DDT_CHAT_FORMAT_DEEPSEEK ? id : name_of(id);
    if (*name != id) free(id);
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
