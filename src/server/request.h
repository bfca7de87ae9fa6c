/*
 * request.h — the body of an OpenAI-style POST /v1/chat/completions or
 * /v1/completions, parsed and checked into a plain struct before anything
 * reaches the engine.  Every way a body can be wrong (not JSON, not UTF-8,
 * a field of the wrong type or out of range, a feature this server lacks such
 * as n > 16) gives DDT_ERR_INVALID / DDT_ERR_RANGE / DDT_ERR_UNSUPPORTED with a
 * message naming the field, and `param` set to it, for an HTTP 400 body.
 * Fields that do not change the output (user, metadata, store, ...) are ignored,
 * as OpenAI-compatible servers do; a field that would change it and that this
 * server does not apply (a response_format JSON schema outside the supported subset (text/json_schema.h; a tool's parameters outside it
 * only loosen that tool's arguments to a JSON object), best_of > 1, a suffix) is refused rather than
 * silently dropped (so is a per-request chat_template).  Chat messages are checked and normalised for the chat
 * template (text parts joined, "developer" read as "system", tool calls and
 * tool results kept); tools are checked for OpenAI's function shape.  This is
 * the server's fuzzed parser.
 */
#ifndef DDT_SERVER_REQUEST_H
#define DDT_SERVER_REQUEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddtree.h"
#include "engine/engine.h"

#define DDT_API_MAX_MESSAGES 1024
#define DDT_API_MAX_STOP 4          /* as OpenAI */
#define DDT_API_MAX_STOP_LEN 512    /* bytes per stop string */
#define DDT_API_MAX_TOKENS 1000000  /* max_tokens sanity bound; the context bounds it further */
#define DDT_API_MAX_PROMPT_IDS (1 << 20)
#define DDT_API_MAX_TOP_LOGPROBS 20 /* = DDT_MAX_TOP_LOGPROBS (engine.h) */
#define DDT_API_MAX_TOOLS 256
#define DDT_API_MAX_N 16            /* choices per request (each decoded in turn) */
#define DDT_API_MAX_LOGIT_BIAS 1024 /* logit_bias entries (= DDT_LOGIT_BIAS_MAX, engine.h) */

typedef enum ddt_api_kind { DDT_API_CHAT = 0, DDT_API_COMPLETION = 1 } ddt_api_kind;

typedef enum ddt_tool_choice {
    DDT_TOOL_CHOICE_AUTO = 0,
    DDT_TOOL_CHOICE_NONE = 1,
    DDT_TOOL_CHOICE_REQUIRED = 2,
    DDT_TOOL_CHOICE_NAMED = 3
} ddt_tool_choice;

typedef struct ddt_api_request {
    ddt_api_kind kind;
    /* chat: the conversation, checked and normalised for the chat template (chat.h):
     * roles system (also "developer"), user, assistant, tool; content a string or
     * null (text parts joined); name, tool_calls, tool_call_id, reasoning_content kept */
    json_t *messages;
    size_t n_msgs;
    json_t *tools;         /* the declared functions (NULL: none, or tool_choice "none") */
    ddt_tool_choice tool_choice; /* REQUIRED / NAMED: the server opens the answer with the
                                    tool-call markers (a call section; and the named call) and the
                                    model writes the rest; on the CPU backend the arguments are
                                    grammar-constrained (tool_schemas) and the call ends the answer;
                                    AUTO: the model decides, and on the CPU backend each call's
                                    arguments are grammar-constrained alike */
    const char *tool_choice_name; /* NAMED: the function (one that 'tools' declares); also set for
                                     REQUIRED when 'tools' declares one function, which is then
                                     the only call the answer can make (forced by name alike) */
    int32_t tool_forced;   /* the index in 'tools' of tool_choice_name, -1 when none is forced */
    /* Every choice but NONE, with tools: each function's "parameters" compiled
     * (text/json_schema.h) for the grammar of a call's arguments, [n_tool_schemas] in 'tools'
     * order, owned; NULL where a tool has no parameters or ones outside the subset (or malformed:
     * a tool's schema describes the tool, so it is no reason to refuse the request), whose
     * arguments are then held to a JSON object only, tool_schema_note saying why (the first such
     * tool a call may use).  NAMED compiles only the named function's.  NULL array for NONE or
     * no tools. */
    struct ddt_json_schema **tool_schemas;
    int32_t n_tool_schemas;
    char tool_schema_note[256];
    int32_t n_prior_calls; /* tool calls in the conversation so far: a forced call's index */
    json_t *template_kwargs; /* chat_template_kwargs (NULL: none) */
    bool add_generation_prompt; /* extension, default true */
    /* completion: a text prompt, or token ids */
    const char *prompt;
    size_t prompt_len;
    int32_t *prompt_ids;
    size_t n_prompt_ids;
    /* limits and sampling: have_* says the request set it (else the server's default) */
    bool have_max_tokens;
    int64_t max_tokens;
    bool have_temperature, have_top_p, have_top_k, have_seed;
    float temperature, top_p;
    int32_t top_k;
    uint64_t seed;
    const char *stop[DDT_API_MAX_STOP];
    size_t stop_len[DDT_API_MAX_STOP];
    int n_stop;
    bool stream, include_usage;
    bool return_token_ids; /* extension: the choice carries the generated token ids */
    bool json_object;      /* response_format {"type": "json_object"}: the output is one JSON object
                              (grammar-constrained decoding: engine.h ddt_engine_set_constraint) */
    struct ddt_json_schema *json_schema; /* response_format {"type": "json_schema"}: the compiled schema
                              (text/json_schema.h), owned; NULL: none */
    int32_t n;             /* choices, 1..DDT_API_MAX_N (not with stream): decoded one after the
                              other, choice k sampled with the seed + k */
    bool echo;             /* completions: the prompt comes back before the completion, and with
                              logprobs the prompt's tokens are scored too (max_tokens may be 0) */
    int32_t logprobs;      /* -1: none; else log-probabilities with this many alternatives a token
                              (chat: "logprobs": true + "top_logprobs"; completions: "logprobs": N) */
    /* presence_penalty / frequency_penalty (-2..2) and logit_bias ({"id": -100..100}, at most
     * DDT_API_MAX_LOGIT_BIAS ids, each below the model's vocabulary: the server checks that) */
    float presence_penalty, frequency_penalty;
    float repetition_penalty; /* extension (vLLM's): (0, 10], 0 when absent; 1 changes nothing */
    int32_t n_logit_bias;
    int32_t *logit_bias_ids; /* owned, [n_logit_bias], in the order sent */
    float *logit_bias;       /* owned, [n_logit_bias] */
    /* extension "speculative": {"mode": "ar"|"chain"|"tree", "budget": N|"auto"} */
    bool have_mode, have_budget, budget_auto;
    ddt_mode mode;
    int32_t budget;
    const char *model; /* as sent, NULL when absent */
    char param[64];    /* on failure: the offending field ("" for the body as a whole) */
    void *owned_;      /* the parsed JSON, which owns the strings */
} ddt_api_request;

/* Parse body[0..len) as a request of this kind.  On failure the request holds
 * nothing to free but param is set; on success free it with ddt_api_request_free. */
ddt_status ddt_api_request_parse(ddt_api_kind kind, const char *body, size_t len, ddt_api_request *req,
                                 ddt_error *err);
void ddt_api_request_free(ddt_api_request *req);

#endif
