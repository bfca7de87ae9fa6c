/*
 * server.h — `ddtree serve`'s HTTP side: an OpenAI-compatible API over one
 * engine, on libmicrohttpd (one thread per connection).
 *
 *   POST /v1/chat/completions   messages through the model's chat template (chat.h),
 *                               tools declared and tool calls / reasoning parsed back
 *   POST /v1/completions        a text prompt or token ids
 *   POST /tokenize, /detokenize  the ids a request would decode from, and ids to text
 *   GET  /v1/models, /health, /metrics (Prometheus text)
 *
 * The engine decodes one stream at a time, so one worker thread owns it and
 * serves a bounded FIFO of requests in arrival order; HTTP threads check and
 * tokenize a request, queue it, then wait for its tokens (or stream them as
 * Server-Sent Events).  A client that disconnects cancels its request at the
 * next round.  Every request is decoded from a fresh context with its own
 * sampling settings, so one request cannot change another's output.
 */
#ifndef DDT_SERVER_SERVER_H
#define DDT_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddtree.h"
#include "engine/engine.h"
#include "text/chat.h"
#include "text/tokenizer.h"

#define DDT_SERVER_DEFAULT_MAX_BODY (1u << 20)
#define DDT_SERVER_DEFAULT_QUEUE 64
#define DDT_SERVER_DEFAULT_CONNECTIONS 128

typedef struct ddt_server_options {
    const char *host;        /* address to bind, NULL = 127.0.0.1 */
    int port;                /* 0 = any free port (ddt_server_port says which) */
    const char *api_key;     /* NULL or "" = no authentication */
    const char *model_name;  /* the id /v1/models lists and responses carry */
    size_t max_body;         /* request body limit in bytes (413 above), 0 = default */
    int max_queue;           /* requests waiting (503 above), 0 = default */
    int max_connections;     /* open connections, 0 = default */
    ddt_sampling sampling;   /* defaults for fields a request leaves out */
    bool has_draft;          /* a drafter is loaded: chain and tree may be asked for */
    bool can_switch;         /* the engine takes per-request mode / budget (CPU backend, one GPU) */
    bool can_chain;          /* ... and chain among them (a GPU engine needs room for the chain's nodes) */
    bool can_auto;           /* ... and the auto budget (a GPU engine only when started with it) */
    bool can_logprobs;       /* the engine reports log-probabilities (`ddtree serve`: every engine) */
    bool can_json;           /* the engine takes a JSON constraint: response_format json_object / json_schema,
                                and tool calls' arguments (`ddtree serve`: every engine; false: response_format
                                refused, tool calls' arguments unconstrained) */
    bool can_logit_rules;    /* the engine takes logit_bias and the penalties (`ddtree serve`: every engine) */
    int32_t max_budget;      /* the largest per-request tree budget (the engine's reserve) */
    int32_t default_budget;  /* tree budget for a request asking for tree without one */
    const ddt_chat_template *chat_template; /* the model's (chat.h); NULL: the built-in Kimi K2 one */
} ddt_server_options;

typedef struct ddt_server ddt_server;

/* Start listening; the engine and tokenizer (NULL: token-id prompts only) stay
 * owned by the caller and must outlive the server. */
ddt_status ddt_server_start(ddt_engine *eng, ddt_tokenizer *tok, const ddt_server_options *o, ddt_server **out,
                            ddt_error *err);
/* The port the server listens on. */
int ddt_server_port(const ddt_server *s);
/* Cancel queued and running requests, close every connection, stop the worker, free. */
void ddt_server_stop(ddt_server *s);

#endif
