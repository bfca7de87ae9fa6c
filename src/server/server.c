/*
 * server.c — see server.h.  libmicrohttpd runs a thread per connection, so a
 * handler may block while its job waits in the queue or decodes; while it
 * waits it looks at its socket every WAIT_SLICE_MS, and a peer that has closed
 * it cancels the job.  A streamed response is a callback response whose reader
 * blocks for the next delta and returns it as SSE events; its state has its own
 * lifetime, freed by libmicrohttpd when the response is done with.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include "server/server.h"

#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "core/error.h"
#include "text/json_schema.h"
#include "server/api.h"
#include "server/job.h"
#include "server/metrics.h"
#include "server/request.h"
#include "text/chat.h"
#include "text/json_vocab.h"
#include "text/utf8.h"

#define WAIT_SLICE_MS 50
#define CONNECTION_TIMEOUT_S 120 /* idle or stalled connections (a body that never ends) */
#define DRAIN_FACTOR 16          /* bodies up to this many times the limit are read, then refused */

struct ddt_server {
    ddt_engine *eng;
    ddt_tokenizer *tok;
    ddt_json_vocab *json_vocab; /* the token masks of JSON mode and tool calls' arguments (o.can_json and a tokenizer) */
    pthread_mutex_t tok_mu; /* encoding uses the tokenizer's scratch space */
    const ddt_chat_template *chat; /* the options' or own_chat */
    ddt_chat_template *own_chat;   /* the built-in one, when the options gave none */
    int32_t think;          /* <think>: a prompt ending in it starts the answer as reasoning */
    ddt_chat_markers markers; /* the tokenizer's thinking and tool-call markers (all -1 without one) */
    int ds_layout;          /* DeepSeek markers: the call layout the chat template writes (DS_LAYOUT_*) */
    ddt_server_options o;
    char *host, *api_key, *model_name;
    struct MHD_Daemon *d;
    int port;
    ddt_job_queue q;
    ddt_metrics metrics;
    int32_t vocab, max_ctx, eos, im_end;
    ddt_mode mode;
    int32_t budget;
    bool budget_auto;
    pthread_mutex_t id_mu;
    unsigned long long next_id;
};

/* Per-request state of a connection (libmicrohttpd's con_cls). */
typedef struct conn {
    int route;
    char *body;
    size_t len, cap;
    bool too_big;
} conn;

enum { ROUTE_CHAT = 1, ROUTE_COMPLETION = 2, ROUTE_TOKENIZE = 3, ROUTE_DETOKENIZE = 4 };

/* ------------------------------------------------------------------ responses */

/* hdr: extra response headers, name and value pairs ending with a NULL name (or NULL: none). */
static enum MHD_Result send_body_with(ddt_server *s, struct MHD_Connection *c, unsigned code, char *body, size_t len,
                                      const char *type, const char *const *hdr) {
    if (!body) {
        static const char oom[] = "{\"error\": {\"message\": \"out of memory\", \"type\": \"internal_error\"}}";
        struct MHD_Response *r = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        enum MHD_Result res = MHD_queue_response(c, MHD_HTTP_INTERNAL_SERVER_ERROR, r);
        MHD_destroy_response(r);
        ddt_metrics_add_status(&s->metrics, 500);
        return res;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    for (size_t i = 0; hdr && hdr[i]; i += 2) MHD_add_response_header(r, hdr[i], hdr[i + 1]);
    if (code == MHD_HTTP_UNAUTHORIZED) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result res = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    ddt_metrics_add_status(&s->metrics, (int)code);
    return res;
}

static enum MHD_Result send_body(ddt_server *s, struct MHD_Connection *c, unsigned code, char *body, size_t len,
                                 const char *type) {
    return send_body_with(s, c, code, body, len, type, NULL);
}

static enum MHD_Result send_error(ddt_server *s, struct MHD_Connection *c, unsigned code, const char *msg,
                                  const char *param) {
    const char *type = code == 401 ? "authentication_error" : code == 404 ? "not_found_error"
                     : code == 503 ? "server_busy" : code >= 500 ? "internal_error" : "invalid_request_error";
    const char *ecode = code == 401 ? "invalid_api_key" : code == 413 ? "request_too_large"
                      : code == 405 ? "method_not_allowed" : NULL;
    size_t len = 0;
    char *body = ddt_api_error_body(msg, type, param && *param ? param : NULL, ecode, &len);
    return send_body(s, c, code, body, len, "application/json");
}

/* ------------------------------------------------------------------ waiting */

/* Whether the peer closed its socket (the request body has been read, so
 * readable-with-no-bytes means end of stream). */
static bool client_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char ch;
        ssize_t n = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return false;
}

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* With j->mu held: wait until the job changed past *seen or finished; false
 * (and the job cancelled) when the client left meanwhile. */
static bool wait_change(ddt_job *j, uint64_t *seen, int fd) {
    while (!j->done && j->version == *seen) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += WAIT_SLICE_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (client_gone(fd)) { /* checked on every wake: a busy generation wakes us before any timeout */
            j->cancel = true;
            return false;
        }
    }
    *seen = j->version;
    return true;
}

/* ------------------------------------------------------------------ building a job */

typedef struct prepared {
    ddt_job *job;
    unsigned code;   /* 0 when fine, else the HTTP status of the failure */
    char msg[DDT_ERROR_MSG_MAX];
    char param[64];
} prepared;

static void prep_fail(prepared *p, unsigned code, const char *param, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static void prep_fail(prepared *p, unsigned code, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, sizeof p->msg, fmt, ap);
    va_end(ap);
    p->code = code;
    snprintf(p->param, sizeof p->param, "%s", param ? param : "");
}

/* The prompt's token ids (owned by the job). */
static bool encode_prompt(ddt_server *s, const ddt_api_request *rq, ddt_job *j, prepared *p) {
    if (rq->prompt_ids) {
        for (size_t i = 0; i < rq->n_prompt_ids; i++)
            if (rq->prompt_ids[i] >= s->vocab) {
                prep_fail(p, 400, "prompt", "'prompt'[%zu]: token id %d is outside the vocabulary [0, %d)", i,
                          rq->prompt_ids[i], s->vocab);
                return false;
            }
        j->prompt = malloc(rq->n_prompt_ids * sizeof(int32_t));
        if (!j->prompt) return prep_fail(p, 500, NULL, "out of memory"), false;
        memcpy(j->prompt, rq->prompt_ids, rq->n_prompt_ids * sizeof(int32_t));
        j->n_prompt = (int32_t)rq->n_prompt_ids;
        return true;
    }
    if (!s->tok) {
        prep_fail(p, 400, rq->kind == DDT_API_CHAT ? "messages" : "prompt",
                  "this model folder has no tokenizer (tiktoken.model or tokenizer.json): send 'prompt' as token ids");
        return false;
    }
    size_t n = 0;
    ddt_error err = {0};
    ddt_status st;
    if (rq->kind == DDT_API_CHAT) {
        ddt_chat_input in = {rq->messages, rq->tools, rq->template_kwargs, rq->add_generation_prompt};
        pthread_mutex_lock(&s->tok_mu);
        st = ddt_chat_encode(s->chat, s->tok, &in, &j->prompt, &n, &err);
        pthread_mutex_unlock(&s->tok_mu);
    } else {
        /* BPE gives at most one token per byte */
        size_t cap = rq->prompt_len + 1;
        j->prompt = malloc(cap * sizeof(int32_t));
        if (!j->prompt) return prep_fail(p, 500, NULL, "out of memory"), false;
        pthread_mutex_lock(&s->tok_mu);
        st = ddt_tokenizer_encode(s->tok, rq->prompt, rq->prompt_len, 0, j->prompt, cap, &n, &err);
        pthread_mutex_unlock(&s->tok_mu);
    }
    if (st != DDT_OK) {
        prep_fail(p, st == DDT_ERR_NOMEM ? 500 : 400, rq->kind == DDT_API_CHAT ? "messages" : "prompt", "%s", err.msg);
        return false;
    }
    if (n == 0) return prep_fail(p, 400, "prompt", "the prompt is empty"), false;
    if (n > (size_t)INT32_MAX) return prep_fail(p, 400, "prompt", "the prompt has %zu tokens", n), false;
    j->n_prompt = (int32_t)n;
    return true;
}

/* Whether a chat prompt opens a thinking block (chat_output.h): the answer then
 * starts as reasoning. */
static bool prompt_opens_thinking(const ddt_server *s, const ddt_job *j) {
    return j->chat && s->think >= 0 && ddt_chat_prompt_opens_thinking(s->tok, j->prompt, (size_t)j->n_prompt);
}

/* Whether the tokenizer names all five tool-call markers (Kimi's, or DeepSeek's in the same roles). */
static bool has_call_markers(const ddt_chat_markers *m) {
    return m->section_begin >= 0 && m->section_end >= 0 && m->call_begin >= 0 && m->arg_begin >= 0 &&
           m->call_end >= 0;
}

/* Whether tool_choice asks for a call ("required", or a function by name). */
static bool forces_call(const ddt_api_request *rq) {
    return rq->tool_choice == DDT_TOOL_CHOICE_REQUIRED || rq->tool_choice == DDT_TOOL_CHOICE_NAMED;
}

/*
 * Which of DeepSeek's two call layouts (chat_output.h) the chat template writes,
 * found by rendering a conversation with one assistant tool call and looking
 * at what follows <｜tool▁sep｜>: the function's name (V3 / R1: the type
 * "function" is before it) or the name before it (V3.1).  A forced call is
 * started in the model's own layout, so the server must know it; the router
 * reads either.  UNKNOWN when the template renders neither (or fails).
 */
enum { DS_LAYOUT_UNKNOWN = 0, DS_LAYOUT_V3 = 1, DS_LAYOUT_V31 = 2 };
#define DS_PROBE_NAME "ddt_probe_function"

static int deepseek_layout(const ddt_chat_template *t) {
    json_t *msgs = json_pack("[{s:s, s:s}, {s:s, s:s, s:[{s:s, s:s, s:{s:s, s:s}}]}]", "role", "user", "content",
                             "hi", "role", "assistant", "content", "", "tool_calls", "id", "call_0", "type",
                             "function", "function", "name", DS_PROBE_NAME, "arguments", "{\"a\": 1}");
    if (!msgs) return DS_LAYOUT_UNKNOWN;
    ddt_chat_input in = {msgs, NULL, NULL, false};
    ddt_jinja_text out = {0};
    ddt_error err = {0};
    int layout = DS_LAYOUT_UNKNOWN;
    if (ddt_chat_render(t, &in, &out, &err) == DDT_OK && out.bytes) {
        char *z = malloc(out.len + 1); /* the rendered bytes with a NUL for strstr */
        if (z) {
            memcpy(z, out.bytes, out.len);
            z[out.len] = '\0';
            if (strstr(z, DDT_DS_SEP DS_PROBE_NAME)) layout = DS_LAYOUT_V3;
            else if (strstr(z, DS_PROBE_NAME DDT_DS_SEP)) layout = DS_LAYOUT_V31;
            free(z);
        }
    }
    ddt_jinja_text_free(&out);
    json_decref(msgs);
    return layout;
}

/*
 * A forced call's opening in DeepSeek's markup, f[*n..] (room for the head's
 * ids given), as start_chat's Kimi one: the section marker, then for a named
 * function its call up to the arguments, in the template's layout:
 *   V3.1: <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>
 *   V3:   <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n
 * (V3's arguments then end at <｜tool▁call▁end｜> without the closing fence:
 * the grammar ends the document at that marker, and the router takes a call
 * without it).  "required" of several functions lets the model name the call,
 * which works only in V3.1's layout, where the name comes before the separator
 * that ends the first generation (job.h arg_begin): V3's name comes after it,
 * in plain text no stop id can end.  False with the 400 given.
 */
static bool deepseek_forced_head(ddt_server *s, const ddt_api_request *rq, const ddt_chat_markers *m, int32_t *f,
                                 int32_t *n, size_t room, prepared *p) {
    if (s->ds_layout == DS_LAYOUT_UNKNOWN) {
        prep_fail(p, 400, "tool_choice", "'tool_choice' asks for a call, but the chat template (%s) does not show "
                  "which DeepSeek call layout the model writes (rendering an assistant tool call gave neither "
                  "NAME<\uff5ctool\u2581sep\uff5c>ARGS nor function<\uff5ctool\u2581sep\uff5c>NAME): ask "
                  "with \"auto\"", ddt_chat_template_origin(s->chat));
        return false;
    }
    if (!rq->tool_choice_name && s->ds_layout == DS_LAYOUT_V3) {
        prep_fail(p, 400, "tool_choice", "'tool_choice' \"required\" of several functions cannot be served for "
                  "this model: in DeepSeek-V3's call layout the function's name follows <\uff5ctool\u2581sep\uff5c> "
                  "as plain text, so the model cannot name the call before its arguments are constrained; name "
                  "the function ({\"type\": \"function\", \"function\": {\"name\": ...}}) or ask with "
                  "\"auto\"");
        return false;
    }
    f[(*n)++] = m->section_begin;
    if (!rq->tool_choice_name) return true;
    char text[200];
    ddt_error err = {0};
    size_t k = 0;
    ddt_status st = DDT_OK;
    f[(*n)++] = m->call_begin;
    pthread_mutex_lock(&s->tok_mu);
    if (s->ds_layout == DS_LAYOUT_V3) {
        st = ddt_tokenizer_encode(s->tok, "function", 8, 0, f + *n, room - (size_t)*n, &k, &err);
        *n += (int32_t)k;
        f[(*n)++] = m->arg_begin;
        int tl = snprintf(text, sizeof text, "%.100s\n```json\n", rq->tool_choice_name);
        if (st == DDT_OK) st = ddt_tokenizer_encode(s->tok, text, (size_t)tl, 0, f + *n, room - (size_t)*n, &k, &err);
        *n += (int32_t)k;
    } else {
        int tl = snprintf(text, sizeof text, "%.100s", rq->tool_choice_name);
        st = ddt_tokenizer_encode(s->tok, text, (size_t)tl, 0, f + *n, room - (size_t)*n, &k, &err);
        *n += (int32_t)k;
        f[(*n)++] = m->arg_begin;
    }
    pthread_mutex_unlock(&s->tok_mu);
    if (st != DDT_OK) return prep_fail(p, 400, "tool_choice", "'tool_choice': %s", err.msg), false;
    return true;
}

/* A chat job's output routing (content, reasoning and tool calls come apart on the
 * marker ids: chat_output.h) and, for a tool_choice that asks for a call, the
 * answer's forced start: the call-section marker ("required" of several
 * functions), then the named call's opening up to its arguments (Kimi's
 * "functions.NAME:IDX", IDX counting the conversation's calls; "required" of one
 * function names it), appended to the prompt and fed to the router, so the model
 * writes the arguments and the parse sees the whole call. */
static bool start_chat(ddt_server *s, const ddt_api_request *rq, ddt_job *j, prepared *p) {
    j->chat = true;
    const bool thinking = prompt_opens_thinking(s, j);
    ddt_chat_router_init(&j->router, s->tok, thinking);
    j->router.first_call_index = rq->n_prior_calls; /* DeepSeek's made-up ids go on from the conversation's */
    if (!forces_call(rq)) return true;
    const ddt_chat_markers *m = &j->router.m;
    if (!has_call_markers(m)) {
        prep_fail(p, 400, "tool_choice", "'tool_choice' asks for a call, but this model's tokenizer has no complete "
                  "set of tool-call markers (Kimi's <|tool_calls_section_begin|> ... or DeepSeek's "
                  "<\uff5ctool\u2581calls\u2581begin\uff5c> ...) to start one with");
        return false;
    }
    if (thinking) {
        prep_fail(p, 400, "tool_choice", "'tool_choice' asks for a call, but the prompt opens a thinking block: "
                  "ask with \"auto\", or turn thinking off (chat_template_kwargs)");
        return false;
    }
    const size_t name_len = rq->tool_choice_name ? strlen(rq->tool_choice_name) : 0;
    /* the head's text is at most ~130 bytes ("functions." / "function" + 100 of the name + a
     * fence or index), each byte at most one id, plus four markers */
    const size_t room = 4 + 160 + (name_len < 100 ? name_len : 100);
    int32_t *grown = realloc(j->prompt, ((size_t)j->n_prompt + room) * sizeof *grown);
    if (!grown) return prep_fail(p, 500, NULL, "out of memory"), false;
    j->prompt = grown;
    int32_t *f = j->prompt + j->n_prompt, n = 0;
    if (m->format == DDT_CHAT_FORMAT_DEEPSEEK) {
        if (!deepseek_forced_head(s, rq, m, f, &n, room, p)) return false;
    } else {
        char head[160];
        size_t n_head = 0;
        int hl = rq->tool_choice_name ? snprintf(head, sizeof head, "functions.%.100s:%d", rq->tool_choice_name,
                                                 (int)rq->n_prior_calls)
                                      : 0;
        f[n++] = m->section_begin;
        if (hl > 0) {
            f[n++] = m->call_begin;
            ddt_error err = {0};
            pthread_mutex_lock(&s->tok_mu);
            ddt_status st = ddt_tokenizer_encode(s->tok, head, (size_t)hl, 0, f + n, (size_t)hl, &n_head, &err);
            pthread_mutex_unlock(&s->tok_mu);
            if (st != DDT_OK) return prep_fail(p, 400, "tool_choice", "'tool_choice': %s", err.msg), false;
            n += (int32_t)n_head;
            f[n++] = m->arg_begin;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        ddt_chat_channel ch;
        bool done;
        ddt_error err = {0};
        if (ddt_chat_route(&j->router, f[i], &ch, &done, &err) != DDT_OK)
            return prep_fail(p, 500, NULL, "%s", err.msg), false;
    }
    j->n_prompt += n;
    return true;
}

/* echo's prompt: the text as sent, or the ids' text (special tokens are not text,
 * as in a completion), valid UTF-8 (ids may cut a character); NULL when out of
 * memory. */
static char *echo_text(const ddt_server *s, const ddt_api_request *rq, const int32_t *ids, int32_t n, size_t *len) {
    if (rq->prompt) return ddt_utf8_sanitize(rq->prompt, rq->prompt_len, len);
    size_t cap = 0, used = 0;
    const uint8_t *b;
    size_t bl;
    for (int32_t i = 0; i < n; i++)
        if (ddt_tokenizer_text_bytes(s->tok, ids[i], &b, &bl)) cap += bl;
    char *raw = malloc(cap + 1);
    if (!raw) return NULL;
    for (int32_t i = 0; i < n; i++)
        if (ddt_tokenizer_text_bytes(s->tok, ids[i], &b, &bl)) memcpy(raw + used, b, bl), used += bl;
    char *clean = ddt_utf8_sanitize(raw, used, len);
    free(raw);
    return clean;
}

/* A copy of s[0..n) with a NUL, NULL when out of memory. */
static char *copy_str(const char *s, size_t n) {
    char *c = malloc(n + 1);
    if (c) memcpy(c, s, n), c[n] = '\0';
    return c;
}

/* How a request's tool calls are decoded. */
typedef enum tools_mode {
    TOOLS_NONE,    /* no call can be made: no tools (or "none"), not chat, or "auto" under
                      response_format, whose answer is one JSON document */
    TOOLS_FREE,    /* the model writes the arguments freely (*why says why) */
    TOOLS_GRAMMAR  /* each call's arguments under its function's grammar (tool_grammar) */
} tools_mode;

static tools_mode tool_calls_mode(const ddt_server *s, const ddt_api_request *rq, const char **why) {
    *why = NULL;
    if (rq->kind != DDT_API_CHAT || !rq->tools) return TOOLS_NONE;
    if (!forces_call(rq) && (rq->json_object || rq->json_schema)) return TOOLS_NONE;
    if (!s->o.can_json || !s->json_vocab) {
        *why = !s->o.can_json ? "this server's engine takes no grammar"
                             : "this model folder has no tokenizer to build the token masks from";
        return TOOLS_FREE;
    }
    /* a forced call without them is refused (start_chat); "auto" just cannot tell arguments apart */
    if (!has_call_markers(&s->markers)) {
        *why = "this model's tokenizer has no Kimi tool-call markers (<|tool_call_argument_begin|> ...), nor "
               "DeepSeek's, to find a call's arguments by";
        return TOOLS_FREE;
    }
    /* DeepSeek's markers: "auto" finds a call's arguments after <｜tool▁sep｜> only in V3.1's layout;
       V3 / R1 write the function's name there, then a fence (a forced call writes both itself) */
    if (!forces_call(rq) && s->markers.format == DDT_CHAT_FORMAT_DEEPSEEK && s->ds_layout != DS_LAYOUT_V31) {
        *why = "this model writes DeepSeek-V3's call layout (function, the tool separator, then the name and a "
               "fence), where no marker opens the arguments";
        return TOOLS_FREE;
    }
    return TOOLS_GRAMMAR;
}

/* Calls' arguments under the grammar (job.h call_end), on an engine that takes a
 * constraint: for a forced call by name, its parameters; when the model names its
 * calls ("required" of several functions: one call; "auto": any number, or none)
 * each function's name and compiled parameters copied into the job (which
 * outlives the request), for the arguments of each call to be generated under the
 * grammar of the function it names.  The markers are checked (tool_calls_mode).
 * A function whose parameters did not compile gets a JSON object (the response
 * says so: tool_args_headers). */
static bool tool_grammar(ddt_server *s, const ddt_api_request *rq, ddt_job *j, prepared *p) {
    const ddt_chat_markers *m = &j->router.m;
    ddt_error err = {0};
    j->call_end = m->call_end;
    j->one_call = forces_call(rq);
    j->json = (ddt_json_constraint){s->json_vocab, true, NULL};
    if (rq->tool_forced >= 0) {
        const ddt_json_schema *sc = rq->tool_schemas[rq->tool_forced];
        if (sc && ddt_json_schema_copy(sc, &j->schema, &err) != DDT_OK)
            return prep_fail(p, 500, NULL, "%s", err.msg), false;
        j->json.schema = j->schema;
        return true;
    }
    const int32_t n = rq->n_tool_schemas;
    j->arg_begin = m->arg_begin;
    j->tool_names = calloc((size_t)n, sizeof *j->tool_names);
    j->tool_schemas = calloc((size_t)n, sizeof *j->tool_schemas);
    if (!j->tool_names || !j->tool_schemas) return prep_fail(p, 500, NULL, "out of memory"), false;
    j->n_tools = n;
    for (int32_t k = 0; k < n; k++) {
        json_t *name = json_object_get(json_object_get(json_array_get(rq->tools, (size_t)k), "function"), "name");
        if (!(j->tool_names[k] = copy_str(json_string_value(name), json_string_length(name))))
            return prep_fail(p, 500, NULL, "out of memory"), false;
        if (rq->tool_schemas[k] && ddt_json_schema_copy(rq->tool_schemas[k], &j->tool_schemas[k], &err) != DDT_OK)
            return prep_fail(p, 500, NULL, "%s", err.msg), false;
    }
    return true;
}

/*
 * What a call's arguments are held to, for the response's headers
 * (x-ddtree-tool-arguments): "schema" (the function's parameters), "json_object"
 * (its parameters are outside the schema subset, malformed or absent: any JSON
 * object), "mixed" (the model names the call among several functions, some of
 * each), or "unconstrained" (an engine that takes no grammar, or for "auto" a
 * tokenizer without the tool-call markers).  note (x-ddtree-tool-arguments-note,
 * "" for none) says why: for "unconstrained", or the first function a call may
 * use that is not held to its schema, in printable ASCII (a header value cannot
 * carry the rest).  value "" when no call can be made (tool_calls_mode).
 */
static void tool_args_headers(const ddt_server *s, const ddt_api_request *rq, char value[16], char note[256]) {
    value[0] = note[0] = '\0';
    const char *why;
    tools_mode md = tool_calls_mode(s, rq, &why);
    if (md == TOOLS_NONE) return;
    if (md == TOOLS_FREE) {
        snprintf(value, 16, "unconstrained");
        snprintf(note, 256, "%s", why);
        return;
    }
    int32_t with = 0, of = 0;
    for (int32_t k = 0; k < rq->n_tool_schemas; k++)
        if (rq->tool_forced < 0 || k == rq->tool_forced) of++, with += rq->tool_schemas[k] != NULL;
    snprintf(value, 16, "%s", with == of ? "schema" : with == 0 ? "json_object" : "mixed");
    size_t n = 0;
    for (const char *c = rq->tool_schema_note; *c && n < 255; c++, n++)
        note[n] = *c >= 0x20 && *c < 0x7f ? *c : '?';
    note[n] = '\0';
}

/* Check a parsed request against this server and make its job. */
static void prepare(ddt_server *s, const ddt_api_request *rq, prepared *p) {
    memset(p, 0, sizeof *p);
    ddt_job *j = ddt_job_new(rq->stop, rq->stop_len, rq->n_stop);
    if (!j) {
        prep_fail(p, 500, NULL, "out of memory");
        return;
    }
    j->t_arrival = ddt_job_now();
    if (!encode_prompt(s, rq, j, p) || (rq->kind == DDT_API_CHAT && !start_chat(s, rq, j, p))) {
        ddt_job_release(j);
        return;
    }
    if (j->n_prompt >= s->max_ctx) {
        prep_fail(p, 400, rq->kind == DDT_API_CHAT ? "messages" : "prompt",
                  "this model's maximum context length is %d tokens, and the prompt has %d (at least one "
                  "must be left for the completion)", s->max_ctx, j->n_prompt);
        ddt_job_release(j);
        return;
    }
    int64_t room = s->max_ctx - j->n_prompt;
    if (rq->have_max_tokens && rq->max_tokens > room) {
        prep_fail(p, 400, "max_tokens",
                  "this model's maximum context length is %d tokens, but %lld were requested (%d in the prompt, "
                  "%lld for the completion)", s->max_ctx, (long long)(j->n_prompt + rq->max_tokens), j->n_prompt,
                  (long long)rq->max_tokens);
        ddt_job_release(j);
        return;
    }
    j->max_new = (int32_t)(rq->have_max_tokens ? rq->max_tokens : room);
    /* stop tokens: end of sequence, and the end of the assistant's turn in chat */
    if (s->eos >= 0) j->stop_ids[j->n_stop_ids++] = s->eos;
    if (rq->kind == DDT_API_CHAT && s->im_end >= 0 && s->im_end != s->eos) j->stop_ids[j->n_stop_ids++] = s->im_end;
    j->sampling = s->o.sampling;
    if (rq->have_temperature) j->sampling.temperature = rq->temperature;
    if (rq->have_top_p) j->sampling.top_p = rq->top_p;
    if (rq->have_top_k) j->sampling.top_k = rq->top_k;
    if (rq->have_seed) j->sampling.seed = rq->seed;
    ddt_error err = {0};
    if (ddt_sampling_check(&j->sampling, &err) != DDT_OK) {
        prep_fail(p, 400, "temperature", "%s", err.msg);
        ddt_job_release(j);
        return;
    }
    j->mode = rq->have_mode ? rq->mode : s->mode;
    j->budget_auto = rq->have_budget ? rq->budget_auto : (j->mode == s->mode ? s->budget_auto : false);
    j->budget = rq->have_budget && !rq->budget_auto ? rq->budget
              : s->mode == DDT_MODE_TREE ? s->budget : s->o.default_budget;
    if (j->budget_auto) j->budget = s->o.max_budget;
    if (j->mode != DDT_MODE_TREE) {
        j->budget = s->budget;
        j->budget_auto = false;
    }
    if (rq->logprobs >= 0 && !s->o.can_logprobs) {
        prep_fail(p, 400, "logprobs", "log-probabilities need the CPU backend or one GPU (this server's engine "
                  "splits the model over several)");
        ddt_job_release(j);
        return;
    }
    if (rq->json_object || rq->json_schema) {
        const char *no = !s->o.can_json ? "this server's engine takes no JSON constraint"
                       : !s->json_vocab ? "this model folder has no tokenizer to build the token masks from"
                       : j->n_stop_ids == 0 ? "the model has no end-of-sequence token to end the object with"
                       : prompt_opens_thinking(s, j) ? "the prompt opens a thinking block, and the reasoning is "
                                                       "no JSON: turn thinking off (chat_template_kwargs)"
                       : forces_call(rq) ? "'tool_choice' forces a tool call, which is no JSON object"
                           : NULL;
        if (no) {
            prep_fail(p, 400, "response_format", "'response_format' %s cannot be served: %s",
                      rq->json_schema ? "json_schema" : "json_object", no);
            ddt_job_release(j);
            return;
        }
        /* each job (n of them for n choices) has its own copy: it is read while the job runs, after
           the request is gone, and jobs are released on different threads */
        if (rq->json_schema && ddt_json_schema_copy(rq->json_schema, &j->schema, &err) != DDT_OK) {
            prep_fail(p, 500, NULL, "%s", err.msg);
            ddt_job_release(j);
            return;
        }
        j->json = (ddt_json_constraint){s->json_vocab, true, j->schema};
    }
    if (rq->n_logit_bias > 0 || rq->presence_penalty != 0.0f || rq->frequency_penalty != 0.0f ||
        (rq->repetition_penalty != 0.0f && rq->repetition_penalty != 1.0f)) {
        const char *param = rq->n_logit_bias > 0 ? "logit_bias"
                          : rq->presence_penalty != 0.0f ? "presence_penalty"
                          : rq->frequency_penalty != 0.0f ? "frequency_penalty" : "repetition_penalty";
        if (!s->o.can_logit_rules) {
            prep_fail(p, 400, param, "'%s' needs logit rules, which this server's engine does not take", param);
            ddt_job_release(j);
            return;
        }
        for (int32_t i = 0; i < rq->n_logit_bias; i++)
            if (rq->logit_bias_ids[i] >= s->vocab) {
                prep_fail(p, 400, "logit_bias", "'logit_bias': token id %d is outside the vocabulary [0, %d)",
                          rq->logit_bias_ids[i], s->vocab);
                ddt_job_release(j);
                return;
            }
        if (!ddt_job_set_logit_rules(j, rq->logit_bias_ids, rq->logit_bias, rq->n_logit_bias, rq->presence_penalty,
                                     rq->frequency_penalty, rq->repetition_penalty)) {
            prep_fail(p, 500, NULL, "out of memory");
            ddt_job_release(j);
            return;
        }
    }
    const char *free_why;
    if (tool_calls_mode(s, rq, &free_why) == TOOLS_GRAMMAR && !tool_grammar(s, rq, j, p)) {
        ddt_job_release(j);
        return;
    }
    j->logprobs = rq->logprobs;
    j->echo = rq->echo;
    if (j->echo && !(j->echo_text = echo_text(s, rq, j->prompt, j->n_prompt, &j->echo_len))) {
        prep_fail(p, 500, NULL, "out of memory");
        ddt_job_release(j);
        return;
    }
    bool same = j->mode == s->mode && (j->mode != DDT_MODE_TREE || (j->budget == s->budget &&
                                                                     j->budget_auto == s->budget_auto));
    const char *why = NULL;
    if (j->mode != DDT_MODE_AR && !s->o.has_draft) why = "the server was started without a drafter (--draft)";
    else if (!same && !s->o.can_switch) why = "this server's engine runs one mode and budget (several GPUs, or a GPU "
                                                         "started in ar mode)";
    else if (!same && j->mode == DDT_MODE_CHAIN && !s->o.can_chain)
        why = "this server's GPU engine holds fewer nodes than a chain round verifies (start it with a larger "
              "--budget)";
    else if (!same && j->mode == DDT_MODE_TREE && j->budget_auto && !s->o.can_auto)
        why = "the auto budget on the GPU needs a server started with --budget auto";
    else if (j->mode == DDT_MODE_TREE && j->budget > s->o.max_budget) why = "the budget is over the server's --max-budget";
    if (why) {
        char b[32] = "";
        if (j->mode == DDT_MODE_TREE && j->budget_auto) snprintf(b, sizeof b, " (budget auto)");
        else if (j->mode == DDT_MODE_TREE) snprintf(b, sizeof b, " (budget %d)", j->budget);
        prep_fail(p, 400, "speculative", "'speculative': mode %s%s cannot be served: %s", ddt_mode_name(j->mode), b,
                  why);
        ddt_job_release(j);
        return;
    }
    p->job = j;
}

/* ------------------------------------------------------------------ streaming */

/* A stream of n choices: the jobs' chunks one choice after another (each with
 * its index; a chat choice opens with its role), then the usage (the prompt once,
 * every completion) and [DONE]. */
typedef struct sse {
    ddt_server *srv;
    ddt_job *jobs[DDT_API_MAX_N];
    int n_jobs, cur;     /* jobs[cur]: the choice being streamed */
    int64_t completion_sum; /* the finished choices' counted tokens */
    ddt_api_ids ids;
    char id[64];
    bool include_usage;
    int fd;
    uint64_t seen;
    bool role_sent, ended;
    int32_t logprobs;    /* -1: none asked; else entries go with the chunks */
    int32_t lp_sent;     /* tokens whose log-probabilities went out */
    int64_t lp_offset;   /* completions' text_offset: characters of text before token lp_sent */
    int calls_sent;      /* chat: tool calls already streamed */
    char *pending;       /* prepared event bytes not yet given to libmicrohttpd */
    size_t plen, poff;
} sse;

/* Append an event and free it; *len is read here, after the event was made
 * (argument evaluation order is unspecified, so it cannot be passed by value). */
static bool sse_append(sse *x, char *ev, const size_t *len) {
    if (!ev) return false;
    size_t n = *len;
    char *p = realloc(x->pending, x->plen + n);
    if (!p) {
        free(ev);
        return false;
    }
    memcpy(p + x->plen, ev, n);
    x->pending = p;
    x->plen += n;
    free(ev);
    return true;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    sse *x = cls;
    for (;;) {
        if (x->poff < x->plen) {
            size_t n = x->plen - x->poff < max ? x->plen - x->poff : max;
            memcpy(buf, x->pending + x->poff, n);
            x->poff += n;
            return (ssize_t)n;
        }
        x->plen = x->poff = 0;
        if (x->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        size_t n = 0;
        if (!x->role_sent && x->ids.kind == DDT_API_CHAT) {
            /* OpenAI's first chat chunk carries the role and no text */
            x->role_sent = true;
            if (!sse_append(x, ddt_api_chunk_event(&x->ids, true, "", 0, NULL, NULL, NULL, &n), &n))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        ddt_job *j = x->jobs[x->cur];
        pthread_mutex_lock(&j->mu);
        if (!wait_change(j, &x->seen, x->fd)) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        char *delta = NULL;
        size_t dlen = 0;
        ddt_error err;
        bool done = j->done, ok = ddt_textstream_take(&j->text, done, &delta, &dlen, &err) == DDT_OK;
        char *rdelta = NULL;
        size_t rlen = 0;
        ok = ok && ddt_textstream_take(&j->reasoning, done, &rdelta, &rlen, &err) == DDT_OK;
        /* finished calls never change: read their entries after unlocking */
        ddt_api_extra ex = {rdelta, rlen, j->router.calls + x->calls_sent, x->calls_sent,
                            j->router.n_calls - x->calls_sent};
        ddt_status st = j->status;
        char msg[DDT_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", j->error);
        const char *finish = ddt_job_finish_reason(j);
        bool cancelled = j->cancel;
        int64_t prompt = j->n_prompt, completion = j->n_counted, cached = j->stats.cached_tokens;
        const ddt_token_logprobs *lp = j->lp;
        const int32_t *out_ids = j->out;
        pthread_mutex_unlock(&j->mu);
        if (!ok) {
            free(delta);
            free(rdelta);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        /* the counted tokens' entries not sent yet go with this chunk (they and the
           ids below the count no longer change) */
        ddt_api_logprobs lpa = {lp, out_ids, x->lp_sent, (int32_t)completion - x->lp_sent, x->srv->tok,
                                &x->lp_offset};
        const ddt_api_logprobs *lpp = x->logprobs >= 0 && lp ? &lpa : NULL;
        bool any = delta || ex.reasoning_len || ex.n_calls;
        if (any && !sse_append(x, ddt_api_chunk_event(&x->ids, false, delta, dlen, &ex, NULL, lpp, &n), &n)) {
            free(delta);
            free(rdelta);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (any && lpp) x->lp_sent = (int32_t)completion;
        x->calls_sent += ex.n_calls;
        free(delta);
        free(rdelta);
        if (!done) continue;
        if (st != DDT_OK || cancelled) {
            /* the server stops, or the engine failed: say so, then end the stream */
            if (!sse_append(x, ddt_api_error_event(st != DDT_OK ? msg : "the server is shutting down", &n), &n))
                return MHD_CONTENT_READER_END_WITH_ERROR;
        } else {
            /* the closing chunk carries the entries no text delta took */
            lpa.first = x->lp_sent;
            lpa.n = (int32_t)completion - x->lp_sent;
            if (!sse_append(x, ddt_api_chunk_event(&x->ids, false, NULL, 0, NULL, finish, lpp, &n), &n))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            x->lp_sent = (int32_t)completion;
            x->completion_sum += completion;
            if (x->cur + 1 < x->n_jobs) { /* the next choice, from its start */
                x->cur++;
                x->ids.index = x->cur;
                x->seen = 0;
                x->role_sent = false;
                x->lp_sent = 0;
                x->lp_offset = 0;
                x->calls_sent = 0;
                continue;
            }
            if (x->include_usage &&
                !sse_append(x, ddt_api_usage_event(&x->ids, prompt, x->completion_sum, cached, &n), &n))
                return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        static const char done_ev[] = "data: [DONE]\n\n";
        char *d = malloc(sizeof done_ev);
        if (!d) return MHD_CONTENT_READER_END_WITH_ERROR;
        memcpy(d, done_ev, sizeof done_ev);
        n = sizeof done_ev - 1;
        if (!sse_append(x, d, &n)) return MHD_CONTENT_READER_END_WITH_ERROR;
        x->ended = true;
    }
}

static void sse_free(void *cls) {
    sse *x = cls;
    for (int k = 0; k < x->n_jobs; k++) {
        pthread_mutex_lock(&x->jobs[k]->mu);
        if (!x->jobs[k]->done) x->jobs[k]->cancel = true; /* the connection ended before the generation */
        pthread_mutex_unlock(&x->jobs[k]->mu);
        ddt_job_release(x->jobs[k]);
    }
    free(x->pending);
    free(x);
}

/* ------------------------------------------------------------------ generation endpoints */

static void make_id(ddt_server *s, ddt_api_kind kind, char *buf, size_t n) {
    pthread_mutex_lock(&s->id_mu);
    unsigned long long k = ++s->next_id;
    pthread_mutex_unlock(&s->id_mu);
    snprintf(buf, n, "%s-%llx%06llx", kind == DDT_API_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)time(NULL), k);
}

/* One finished job's choice, ready to render: what ddt_api_result points to that
 * is not the job's own (echo's joined text and arrays). */
typedef struct choice_out {
    ddt_api_result res;
    ddt_api_logprobs lpa;
    int64_t offset;
    char *text;
    char *reasoning;
    ddt_token_logprobs *lp_all;
    int32_t *ids_all;
} choice_out;

static void choice_free(choice_out *o) {
    free(o->text);
    free(o->reasoning);
    free(o->lp_all);
    free(o->ids_all);
}

/* Fill o from a job that is done and ended well (read after its done flag, so
 * nothing changes it any more); false when out of memory. */
static bool choice_of(ddt_server *s, ddt_job *j, bool want_ids, int32_t want_lp, choice_out *o) {
    memset(o, 0, sizeof *o);
    size_t tlen = 0;
    ddt_error err;
    bool ok = ddt_textstream_take(&j->text, true, &o->text, &tlen, &err) == DDT_OK;
    size_t rlen = 0;
    ok = ok && ddt_textstream_take(&j->reasoning, true, &o->reasoning, &rlen, &err) == DDT_OK;
    /* echo: the prompt's text and tokens come first */
    const int32_t n_all = j->echo ? j->n_prompt + j->n_counted : j->n_counted;
    if (ok && j->echo) {
        char *both = malloc(j->echo_len + tlen + 1);
        ok = both != NULL;
        if (ok) {
            memcpy(both, j->echo_text, j->echo_len);
            if (tlen) memcpy(both + j->echo_len, o->text, tlen);
            tlen += j->echo_len;
            both[tlen] = '\0';
            free(o->text);
            o->text = both;
        }
        if (ok && j->prompt_lp) {
            o->lp_all = malloc((size_t)n_all * sizeof *o->lp_all);
            o->ids_all = malloc((size_t)n_all * sizeof *o->ids_all);
            ok = o->lp_all && o->ids_all;
            if (ok) {
                memcpy(o->lp_all, j->prompt_lp, (size_t)j->n_prompt * sizeof *o->lp_all);
                memcpy(o->ids_all, j->prompt, (size_t)j->n_prompt * sizeof *o->ids_all);
                if (j->n_counted) {
                    memcpy(o->lp_all + j->n_prompt, j->lp, (size_t)j->n_counted * sizeof *o->lp_all);
                    memcpy(o->ids_all + j->n_prompt, j->out, (size_t)j->n_counted * sizeof *o->ids_all);
                }
            }
        }
    }
    o->lpa = (ddt_api_logprobs){o->lp_all ? o->lp_all : j->lp, o->ids_all ? o->ids_all : j->out, 0, n_all, s->tok,
                                &o->offset};
    const bool with_lp = want_lp >= 0 && (j->echo ? o->lp_all != NULL : j->lp != NULL);
    o->res = (ddt_api_result){o->text ? o->text : "", tlen, ddt_job_finish_reason(j), j->n_prompt, j->n_counted,
                              j->stats.cached_tokens, want_ids ? j->out : NULL, j->n_counted, j->prompt, j->n_prompt,
                              &j->stats, j->ran_mode,
                              with_lp ? &o->lpa : NULL,
                              {o->reasoning, rlen, j->router.calls, 0, j->router.n_calls}};
    return ok;
}

static void release_jobs(ddt_job **jobs, int n, bool cancel) {
    for (int k = 0; k < n; k++) {
        if (cancel) {
            pthread_mutex_lock(&jobs[k]->mu);
            jobs[k]->cancel = true;
            pthread_mutex_unlock(&jobs[k]->mu);
        }
        ddt_job_release(jobs[k]);
    }
}

static enum MHD_Result serve_generation(ddt_server *s, struct MHD_Connection *c, conn *cn) {
    ddt_api_kind kind = cn->route == ROUTE_CHAT ? DDT_API_CHAT : DDT_API_COMPLETION;
    ddt_api_request rq;
    ddt_error err = {0};
    ddt_status st = ddt_api_request_parse(kind, cn->body, cn->len, &rq, &err);
    if (st != DDT_OK) return send_error(s, c, st == DDT_ERR_NOMEM ? 500 : 400, err.msg, rq.param);
    /* n choices: n jobs of the same request, choice k sampled with the seed + k (the
       prefix cache gives the later ones the prompt's context) */
    ddt_job *jobs[DDT_API_MAX_N];
    const int nc = rq.n;
    prepared p;
    memset(&p, 0, sizeof p);
    int made = 0;
    for (; made < nc; made++) {
        prepare(s, &rq, &p);
        if (p.code) break;
        jobs[made] = p.job;
        jobs[made]->sampling.seed += (uint64_t)made;
    }
    bool stream = rq.stream, include_usage = rq.include_usage, want_ids = rq.return_token_ids;
    const int32_t want_lp = rq.logprobs;
    char targs[16], tnote[256];
    tool_args_headers(s, &rq, targs, tnote);
    const char *hdr[] = {targs[0] ? "x-ddtree-tool-arguments" : NULL, targs, tnote[0] ? "x-ddtree-tool-arguments-note"
                                                                                      : NULL, tnote, NULL};
    ddt_api_request_free(&rq);
    if (p.code) {
        release_jobs(jobs, made, false);
        return send_error(s, c, p.code, p.msg, p.param);
    }
    for (int k = 0; k < nc; k++) {
        st = ddt_job_queue_push(&s->q, jobs[k], &err);
        if (st != DDT_OK) {
            release_jobs(jobs, k, true); /* the queued ones end unstarted */
            release_jobs(jobs + k, nc - k, false);
            return send_error(s, c, 503, err.msg, NULL);
        }
    }
    ddt_api_ids ids = {kind, NULL, (long long)time(NULL), s->model_name, 0};
    int fd = conn_fd(c);
    if (stream) {
        sse *x = calloc(1, sizeof *x);
        if (!x) {
            release_jobs(jobs, nc, true);
            return send_error(s, c, 500, "out of memory", NULL);
        }
        x->srv = s;
        /* the HTTP side's references move to the stream */
        for (int k = 0; k < nc; k++) x->jobs[k] = jobs[k];
        x->n_jobs = nc;
        make_id(s, kind, x->id, sizeof x->id);
        x->ids = ids;
        x->ids.id = x->id;
        x->include_usage = include_usage;
        x->logprobs = want_lp;
        x->fd = fd;
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, x, sse_free);
        if (!r) {
            sse_free(x);
            return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        for (size_t i = 0; hdr[i]; i += 2) MHD_add_response_header(r, hdr[i], hdr[i + 1]);
        enum MHD_Result res = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        ddt_metrics_add_status(&s->metrics, 200);
        return res;
    }
    char id[64];
    make_id(s, kind, id, sizeof id);
    ids.id = id;
    /* every choice in order; the first that fails answers for all (code, msg: 0 when
       the client left, the connection then closed without an answer) */
    choice_out outs[DDT_API_MAX_N];
    int filled = 0;
    unsigned code = 200;
    char msg[DDT_ERROR_MSG_MAX] = "";
    for (; filled < nc && code == 200; filled++) {
        ddt_job *jk = jobs[filled];
        uint64_t seen = 0;
        pthread_mutex_lock(&jk->mu);
        bool present = true;
        while (!jk->done && (present = wait_change(jk, &seen, fd))) {
        }
        if (!present) {
            code = 0;
        } else if (jk->status != DDT_OK || jk->cancel) {
            snprintf(msg, sizeof msg, "%s", jk->status != DDT_OK ? jk->error : "the server is shutting down");
            code = jk->status != DDT_OK ? 500 : 503;
        }
        pthread_mutex_unlock(&jk->mu);
        if (code == 200 && !choice_of(s, jk, want_ids, want_lp, &outs[filled])) {
            snprintf(msg, sizeof msg, "out of memory");
            code = 500;
        } else if (code != 200) {
            memset(&outs[filled], 0, sizeof outs[filled]); /* nothing to free */
        }
    }
    enum MHD_Result res;
    if (code == 200) {
        ddt_api_result res_all[DDT_API_MAX_N];
        for (int k = 0; k < nc; k++) res_all[k] = outs[k].res;
        size_t len = 0;
        char *body = ddt_api_response_body(&ids, res_all, nc, &len);
        res = send_body_with(s, c, 200, body, len, "application/json", hdr);
    } else {
        res = code ? send_error(s, c, code, msg, NULL) : MHD_NO; /* MHD_NO: the client left, close */
    }
    for (int k = 0; k < filled; k++) choice_free(&outs[k]);
    release_jobs(jobs, nc, code != 200);
    return res;
}

/* ------------------------------------------------------------------ tokens */

/* POST /tokenize (vLLM's): {"messages": [...], "tools", "tool_choice", "chat_template_kwargs",
 * "add_generation_prompt"} or {"prompt": ...} gives {"count", "max_model_len", "tokens"}: the
 * ids a chat or completion request with the same fields would decode from (the chat template,
 * a forced call's opening included), without decoding anything. */
static enum MHD_Result serve_tokenize(ddt_server *s, struct MHD_Connection *c, conn *cn) {
    json_error_t je;
    json_t *root = json_loadb(cn->body ? cn->body : "", cn->len, JSON_REJECT_DUPLICATES, &je);
    bool chat = json_is_object(root) && json_object_get(root, "messages");
    if (root) json_decref(root);
    ddt_api_request rq;
    ddt_error err = {0};
    ddt_status st = ddt_api_request_parse(chat ? DDT_API_CHAT : DDT_API_COMPLETION, cn->body, cn->len, &rq, &err);
    if (st != DDT_OK) return send_error(s, c, st == DDT_ERR_NOMEM ? 500 : 400, err.msg, rq.param);
    prepared p;
    memset(&p, 0, sizeof p);
    ddt_job *j = ddt_job_new(NULL, NULL, 0);
    if (!j) {
        ddt_api_request_free(&rq);
        return send_error(s, c, 500, "out of memory", NULL);
    }
    bool ok = encode_prompt(s, &rq, j, &p) && (!chat || start_chat(s, &rq, j, &p));
    ddt_api_request_free(&rq);
    enum MHD_Result res;
    if (ok) {
        size_t len = 0;
        char *body = ddt_api_tokenize_body(j->prompt, j->n_prompt, s->max_ctx, &len);
        res = send_body(s, c, 200, body, len, "application/json");
    } else {
        res = send_error(s, c, p.code, p.msg, p.param);
    }
    ddt_job_release(j);
    return res;
}

/* POST /detokenize: {"tokens": [ids]} gives {"prompt": text} (special tokens as their text,
 * invalid UTF-8 as U+FFFD). */
static enum MHD_Result serve_detokenize(ddt_server *s, struct MHD_Connection *c, conn *cn) {
    if (!s->tok)
        return send_error(s, c, 400, "this model folder has no tokenizer (tiktoken.model or tokenizer.json)", NULL);
    json_error_t je;
    json_t *root = json_loadb(cn->body ? cn->body : "", cn->len, JSON_REJECT_DUPLICATES, &je);
    json_t *tokens = json_is_object(root) ? json_object_get(root, "tokens") : NULL;
    if (!json_is_array(tokens)) {
        if (root) json_decref(root);
        return send_error(s, c, 400, root ? "'tokens' must be an array of token ids" : "the body is not valid JSON",
                          root ? "tokens" : NULL);
    }
    size_t n = json_array_size(tokens);
    if (n > DDT_API_MAX_PROMPT_IDS) {
        json_decref(root);
        return send_error(s, c, 400, "'tokens' is too long", "tokens");
    }
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    char msg[160] = "";
    for (size_t i = 0; ids && i < n && !msg[0]; i++) {
        json_t *v = json_array_get(tokens, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= s->vocab)
            snprintf(msg, sizeof msg, "'tokens'[%zu] is not a token id of this model's vocabulary [0, %d)", i, s->vocab);
        else
            ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(root);
    if (!ids || msg[0]) {
        free(ids);
        return msg[0] ? send_error(s, c, 400, msg, "tokens") : send_error(s, c, 500, "out of memory", NULL);
    }
    /* the longest token bounds the text: at most n times it */
    size_t cap = 0, len = 0;
    ddt_error err = {0};
    ddt_status st = ddt_tokenizer_decode(s->tok, ids, n, NULL, 0, &cap, &err);
    char *text = st == DDT_OK || st == DDT_ERR_RANGE ? malloc(cap + 1) : NULL;
    if (text) st = ddt_tokenizer_decode(s->tok, ids, n, text, cap, &len, &err);
    free(ids);
    if (!text || st != DDT_OK) {
        free(text);
        return send_error(s, c, text || st == DDT_ERR_RANGE ? 400 : 500, text ? err.msg : "out of memory", "tokens");
    }
    size_t blen = 0;
    char *body = ddt_api_detokenize_body(text, len, &blen);
    free(text);
    return send_body(s, c, 200, body, blen, "application/json");
}

/* ------------------------------------------------------------------ routing */

static bool authorized(ddt_server *s, struct MHD_Connection *c) {
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7)) return false;
    h += 7;
    size_t a = strlen(h), b = strlen(s->api_key);
    /* compare in time independent of where they differ */
    unsigned char diff = (unsigned char)(a != b);
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)(s->api_key[i] ^ (i < a ? h[i] : 0));
    return diff == 0;
}

static enum MHD_Result serve_get(ddt_server *s, struct MHD_Connection *c, const char *url) {
    if (!strcmp(url, "/health")) {
        char *b = strdup("{\"status\":\"ok\"}");
        return send_body(s, c, 200, b, b ? strlen(b) : 0, "application/json");
    }
    if (!strcmp(url, "/metrics")) {
        size_t len = 0;
        char *b = ddt_metrics_render(&s->metrics, &len);
        return send_body(s, c, 200, b, len, "text/plain; version=0.0.4");
    }
    if (!authorized(s, c)) return send_error(s, c, 401, "a valid API key is needed: Authorization: Bearer KEY", NULL);
    json_t *o = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i}]}", "object", "list", "data", "id", s->model_name,
                          "object", "model", "created", (json_int_t)time(NULL), "owned_by", "ddtree",
                          "max_model_len", s->max_ctx);
    char *b = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return send_body(s, c, 200, b, b ? strlen(b) : 0, "application/json");
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    ddt_server *s = cls;
    conn *cn = *con_cls;
    if (!cn) {
        bool get = !strcmp(method, MHD_HTTP_METHOD_GET), post = !strcmp(method, MHD_HTTP_METHOD_POST);
        int route = !strcmp(url, "/v1/chat/completions") ? ROUTE_CHAT
                  : !strcmp(url, "/v1/completions")      ? ROUTE_COMPLETION
                  : !strcmp(url, "/tokenize")            ? ROUTE_TOKENIZE
                  : !strcmp(url, "/detokenize")          ? ROUTE_DETOKENIZE
                                                         : 0;
        bool get_route = !strcmp(url, "/health") || !strcmp(url, "/metrics") || !strcmp(url, "/v1/models");
        if (get_route && get) return serve_get(s, c, url);
        if ((get_route && !get) || (route && !post)) return send_error(s, c, 405, "method not allowed here", NULL);
        if (!route) return send_error(s, c, 404, "no such endpoint", NULL);
        if (!authorized(s, c))
            return send_error(s, c, 401, "a valid API key is needed: Authorization: Bearer KEY", NULL);
        /* A body somewhat over the limit is read and dropped before the 413, so a client still
         * sending it gets the answer instead of a reset; one far over it is refused at once. */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno || *end || n > (unsigned long long)s->o.max_body * DRAIN_FACTOR) {
                char msg[128];
                snprintf(msg, sizeof msg, "the request body is over the limit of %zu bytes", s->o.max_body);
                return send_error(s, c, 413, msg, NULL);
            }
        }
        cn = calloc(1, sizeof *cn);
        if (!cn) return MHD_NO;
        cn->route = route;
        *con_cls = cn;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (cn->too_big || cn->len + n > s->o.max_body) {
            cn->too_big = true; /* read and drop the rest, then answer 413 */
            return MHD_YES;
        }
        if (cn->len + n + 1 > cn->cap) {
            size_t cap = cn->cap ? cn->cap : 4096;
            while (cap < cn->len + n + 1) cap *= 2;
            char *b = realloc(cn->body, cap);
            if (!b) return MHD_NO;
            cn->body = b;
            cn->cap = cap;
        }
        memcpy(cn->body + cn->len, upload_data, n);
        cn->len += n;
        return MHD_YES;
    }
    if (cn->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is over the limit of %zu bytes", s->o.max_body);
        return send_error(s, c, 413, msg, NULL);
    }
    if (cn->route == ROUTE_TOKENIZE) return serve_tokenize(s, c, cn);
    if (cn->route == ROUTE_DETOKENIZE) return serve_detokenize(s, c, cn);
    return serve_generation(s, c, cn);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)cls;
    (void)c;
    (void)why;
    conn *cn = *con_cls;
    if (!cn) return;
    free(cn->body);
    free(cn);
    *con_cls = NULL;
}

/* ------------------------------------------------------------------ start / stop */

int ddt_server_port(const ddt_server *s) { return s->port; }

static void server_free(ddt_server *s) {
    ddt_job_queue_destroy(&s->q);
    free(s->host);
    free(s->api_key);
    free(s->model_name);
    ddt_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->tok_mu);
    pthread_mutex_destroy(&s->id_mu);
    ddt_chat_template_free(s->own_chat);
    ddt_json_vocab_free(s->json_vocab);
    free(s);
}

ddt_status ddt_server_start(ddt_engine *eng, ddt_tokenizer *tok, const ddt_server_options *o, ddt_server **out,
                            ddt_error *err) {
    if (!eng || !o || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_server_start: NULL argument");
    *out = NULL;
    if (o->port < 0 || o->port > 65535) return ddt_fail(err, DDT_ERR_RANGE, "port %d outside 0..65535", o->port);
    ddt_server *s = calloc(1, sizeof *s);
    if (!s) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&s->tok_mu, NULL);
    pthread_mutex_init(&s->id_mu, NULL);
    ddt_metrics_init(&s->metrics);
    s->eng = eng;
    s->tok = tok;
    s->o = *o;
    if (!s->o.max_body) s->o.max_body = DDT_SERVER_DEFAULT_MAX_BODY;
    if (s->o.max_queue <= 0) s->o.max_queue = DDT_SERVER_DEFAULT_QUEUE;
    if (s->o.max_connections <= 0) s->o.max_connections = DDT_SERVER_DEFAULT_CONNECTIONS;
    s->host = strdup(o->host ? o->host : "127.0.0.1");
    s->api_key = o->api_key && *o->api_key ? strdup(o->api_key) : NULL;
    s->model_name = strdup(o->model_name ? o->model_name : "ddtree");
    if (!s->host || (o->api_key && *o->api_key && !s->api_key) || !s->model_name) {
        server_free(s);
        return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    }
    s->vocab = ddt_engine_vocab(eng);
    s->max_ctx = ddt_engine_max_ctx(eng);
    s->eos = ddt_engine_model_config(eng)->eos_token_id;
    s->im_end = tok ? ddt_tokenizer_token_id(tok, "<|im_end|>") : -1;
    s->think = -1;
    memset(&s->markers, 0xff, sizeof s->markers); /* every id -1 */
    if (tok) {
        ddt_chat_markers_find(tok, &s->markers);
        s->think = s->markers.think_end >= 0 ? s->markers.think : -1;
    }
    s->chat = o->chat_template;
    if (!s->chat) {
        ddt_status cst = ddt_chat_template_create(NULL, 0, NULL, NULL, 0, &s->own_chat, err);
        if (cst != DDT_OK) {
            server_free(s);
            return cst;
        }
        s->chat = s->own_chat;
    }
    /* the markers found above: DeepSeek's call layout comes from rendering the chat template */
    s->ds_layout = s->markers.format == DDT_CHAT_FORMAT_DEEPSEEK ? deepseek_layout(s->chat) : DS_LAYOUT_UNKNOWN;
    ddt_engine_speculation(eng, &s->mode, &s->budget, &s->budget_auto);
    if (tok && o->can_json) {
        ddt_status jst = ddt_json_vocab_create(tok, s->vocab, &s->json_vocab, err);
        if (jst != DDT_OK) {
            server_free(s);
            return jst;
        }
    }

    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    const struct sockaddr *addr;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (inet_pton(AF_INET, s->host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)o->port);
        addr = (const struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, s->host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)o->port);
        addr = (const struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        ddt_status st = ddt_fail(err, DDT_ERR_INVALID, "--host %s: expected a numeric IPv4 or IPv6 address", s->host);
        server_free(s);
        return st;
    }
    ddt_status st = ddt_job_queue_start(&s->q, eng, tok, o->can_switch, s->o.max_queue, &s->metrics, err);
    if (st) {
        server_free(s);
        return st;
    }
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, handle, s, MHD_OPTION_SOCK_ADDR, addr,
                            MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)s->o.max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)CONNECTION_TIMEOUT_S, MHD_OPTION_END);
    if (!s->d) {
        ddt_job_queue_stop(&s->q);
        st = ddt_fail(err, DDT_ERR_IO, "cannot listen on %s port %d (in use, or not an address of this machine?)",
                      s->host, o->port);
        server_free(s);
        return st;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? (int)di->port : o->port;
    *out = s;
    return DDT_OK;
}

void ddt_server_stop(ddt_server *s) {
    if (!s) return;
    /* jobs first: handlers blocked on them then answer, so the daemon's threads can end */
    ddt_job_queue_stop(&s->q);
    MHD_stop_daemon(s->d);
    server_free(s);
}
