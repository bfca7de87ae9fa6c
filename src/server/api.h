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

/* What every body of one response repeats. */
typedef struct ddt_api_ids {
    ddt_api_kind kind;
    const char *id;      /* "chatcmpl-..." / "cmpl-..." */
    long long created;   /* Unix seconds */
    const char *model;
} ddt_api_ids;

/* {"error": {"message", "type", "param", "code"}} (param, code: NULL = null). */
char *ddt_api_error_body(const char *message, const char *type, const char *param, const char *code, size_t *len);

/* One SSE event with a chunk: a text delta (chat: after a first role-only
 * delta when role is true), or the closing chunk when finish_reason is given. */
char *ddt_api_chunk_event(const ddt_api_ids *r, bool role, const char *text, size_t text_len,
                          const char *finish_reason, size_t *len);
/* The usage event (choices: []); cached_tokens: the prompt tokens whose context was reused. */
char *ddt_api_usage_event(const ddt_api_ids *r, int64_t prompt_tokens, int64_t completion_tokens,
                          int64_t cached_tokens, size_t *len);
/* An error inside a stream that already answered 200. */
char *ddt_api_error_event(const char *message, size_t *len);

/* The whole (non-streamed) response.  ids: the generated token ids, when the
 * request asked for them (return_token_ids), else NULL. */
typedef struct ddt_api_result {
    const char *text;
    size_t text_len;
    const char *finish_reason;
    int64_t prompt_tokens, completion_tokens;
    int64_t cached_tokens; /* of the prompt's, reused from the previous request's context */
    const int32_t *ids;
    int32_t n_ids;
    const ddt_gen_stats *stats;
    ddt_mode mode;
} ddt_api_result;
char *ddt_api_response_body(const ddt_api_ids *r, const ddt_api_result *res, size_t *len);

#endif
