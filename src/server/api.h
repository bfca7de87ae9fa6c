/*
 * api.h — the JSON the server sends, shaped as OpenAI's API defines it:
 * error bodies, whole chat / text completions, and the Server-Sent Events
 * of a streamed one (`data: {chunk}` events, a usage chunk with `choices: []`
 * when asked, `data: [DONE]`).  Text given here is valid UTF-8 already
 * (textstream.h).  Every function returns a malloc'd NUL-terminated string
 * (*len bytes), or NULL when out of memory.
 */
#ifndef DDT_SERVER_API_H
#define DDT_SERVER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "server/request.h"
#include "text/chat_output.h"
#include "text/tokenizer.h"

/* What every body of one response repeats. */
typedef struct ddt_api_ids {
    ddt_api_kind kind;
    const char *id;      /* "chatcmpl-..." / "cmpl-..." */
    long long created;   /* Unix seconds */
    const char *model;
    int32_t index;       /* the choice a stream chunk belongs to (n choices stream one after another) */
} ddt_api_ids;

/* The log-probabilities of tokens [first, first + n) of a response (engine.h
 * ddt_token_logprobs), rendered in OpenAI's shape for the response kind:
 *   chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}
 *   completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}
 * A token's "token" is its bytes as text (invalid UTF-8 replaced by U+FFFD; "bytes"
 * keeps them exact); a logprob of -inf reads -9999.0, as OpenAI sends it, a NaN null.
 * text_offset counts characters of the completion's text before each token, from
 * `offset` (the characters before token `first`); *offset advances past the chunk. */
typedef struct ddt_api_logprobs {
    const ddt_token_logprobs *lp; /* lp[first .. first + n) */
    const int32_t *ids;           /* the emitted tokens, ids[first .. first + n) */
    int32_t first, n;
    const ddt_tokenizer *tok;     /* NULL: tokens as "" without bytes */
    int64_t *offset;              /* completions' text_offset; may be NULL for chat */
} ddt_api_logprobs;

/* {"error": {"message", "type", "param", "code"}} (param, code: NULL = null). */
char *ddt_api_error_body(const char *message, const char *type, const char *param, const char *code, size_t *len);

/* What a chat chunk adds beside its content text: a thinking model's reasoning
 * (delta.reasoning_content) and finished tool calls calls[0..n_calls), which are
 * the response's tool calls first_call .. first_call + n_calls - 1 (their "index"). */
typedef struct ddt_api_extra {
    const char *reasoning;
    size_t reasoning_len;
    const ddt_chat_tool_call *calls;
    int first_call, n_calls;
} ddt_api_extra;

/* One SSE event with a chunk: a text delta (chat: after a first role-only
 * delta when role is true; text NULL: none), or the closing chunk when
 * finish_reason is given; ex (NULL: none) chat's reasoning and tool calls;
 * lp (NULL: none asked) the log-probabilities of the tokens since the last chunk. */
char *ddt_api_chunk_event(const ddt_api_ids *r, bool role, const char *text, size_t text_len,
                          const ddt_api_extra *ex, const char *finish_reason, const ddt_api_logprobs *lp,
                          size_t *len);
/* The usage event (choices: []); cached_tokens: the prompt tokens whose context was reused. */
char *ddt_api_usage_event(const ddt_api_ids *r, int64_t prompt_tokens, int64_t completion_tokens,
                          int64_t cached_tokens, size_t *len);
/* An error inside a stream that already answered 200. */
char *ddt_api_error_event(const char *message, size_t *len);

/* The whole (non-streamed) response.  ids: the generated token ids, when the
 * request asked for them (return_token_ids), else NULL; then res[0]'s prompt_ids
 * become the body's prompt_token_ids. */
typedef struct ddt_api_result {
    const char *text;
    size_t text_len;
    const char *finish_reason;
    int64_t prompt_tokens, completion_tokens;
    int64_t cached_tokens; /* of the prompt's, reused from the previous request's context */
    const int32_t *ids;
    int32_t n_ids;
    const int32_t *prompt_ids; /* with ids: the prompt's (as vLLM: top-level prompt_token_ids) */
    int32_t n_prompt_ids;
    const ddt_gen_stats *stats;
    ddt_mode mode;
    const ddt_api_logprobs *logprobs; /* NULL: not asked for */
    ddt_api_extra extra;     /* chat: reasoning_content and tool_calls (message.content is null
                                when there is no text but there are calls) */
} ddt_api_result;
/* n >= 1 choices (res[0..n)), choice k with index k; usage counts the prompt once
 * (res[0]'s) and every choice's completion; the ddtree object sums the rounds. */
char *ddt_api_response_body(const ddt_api_ids *r, const ddt_api_result *res, int n, size_t *len);

/* /tokenize's answer: {"count", "max_model_len", "tokens"}. */
char *ddt_api_tokenize_body(const int32_t *ids, int32_t n, int32_t max_model_len, size_t *len);
/* /detokenize's answer: {"prompt": text}, invalid UTF-8 in text replaced by U+FFFD. */
char *ddt_api_detokenize_body(const char *text, size_t text_len, size_t *len);

#endif
