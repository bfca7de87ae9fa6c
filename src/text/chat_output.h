/*
 * chat_output.h — splits what a chat model generates into the parts of an
 * OpenAI chat response: `content`, `reasoning_content` (a thinking model's text
 * between <think> and </think>) and `tool_calls` (Kimi K2's tool-call section:
 *
 *   <|tool_calls_section_begin|>
 *     <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|> ...
 *   <|tool_calls_section_end|>
 *
 * as reference.md section "What serving users expect" describes it).  It works
 * on ids, not text: the markers are special tokens, which a user's text can
 * never produce, so "<think>" written out in an answer stays content.  The
 * markers are looked up in the tokenizer by their text; a tokenizer without one
 * (a model that does not think, or has no tool tokens) simply never switches.
 *
 * One router per generation: feed every emitted id in order.  It owns the
 * finished tool calls; the caller appends token bytes to the channel each id
 * is routed to.  A call cut short (the generation ended inside it) is never
 * reported.  No allocation except for the tool calls' text.
 */
#ifndef DDT_TEXT_CHAT_OUTPUT_H
#define DDT_TEXT_CHAT_OUTPUT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddtree.h"
#include "text/tokenizer.h"

#define DDT_CHAT_MAX_TOOL_CALLS 128
#define DDT_CHAT_MAX_CALL_BYTES (1u << 20) /* id + arguments of one call */

/* The marker ids (-1: the tokenizer has no such special token). */
typedef struct ddt_chat_markers {
    int32_t think, think_end;
    int32_t section_begin, section_end, call_begin, arg_begin, call_end;
} ddt_chat_markers;

void ddt_chat_markers_find(const ddt_tokenizer *tok, ddt_chat_markers *m);

typedef enum ddt_chat_channel {
    DDT_CHAT_CH_NONE = 0,      /* a marker, or text between markers that no field keeps */
    DDT_CHAT_CH_CONTENT = 1,
    DDT_CHAT_CH_REASONING = 2,
    DDT_CHAT_CH_TOOL = 3       /* part of a tool call: kept by the router itself */
} ddt_chat_channel;

typedef struct ddt_chat_tool_call {
    char *id;        /* as generated, trimmed: "functions.get_weather:0" */
    char *name;      /* the function: "get_weather" */
    char *arguments; /* as generated, trimmed: a JSON object's text */
} ddt_chat_tool_call;

typedef struct ddt_chat_router {
    ddt_chat_markers m;
    const ddt_tokenizer *tok;
    int state;                  /* internal */
    char *buf;                  /* the call being read: id bytes, then argument bytes */
    size_t len, cap, id_len;
    ddt_chat_tool_call calls[DDT_CHAT_MAX_TOOL_CALLS];
    int n_calls;
    bool overflow;              /* a call over DDT_CHAT_MAX_CALL_BYTES or past the count: dropped */
} ddt_chat_router;

/* Start a generation.  in_reasoning: the prompt ended inside a thinking block
 * (its last token is <think>), so the text starts as reasoning. */
void ddt_chat_router_init(ddt_chat_router *r, const ddt_tokenizer *tok, bool in_reasoning);
void ddt_chat_router_free(ddt_chat_router *r);

/*
 * Route one emitted id: the channel its text bytes belong to (the caller
 * appends them for CONTENT and REASONING; TOOL bytes the router keeps).
 * *call_done is set when the id completed a tool call (r->calls[r->n_calls - 1]).
 * DDT_ERR_NOMEM when a call's text cannot grow (the router stays usable).
 */
ddt_status ddt_chat_route(ddt_chat_router *r, int32_t id, ddt_chat_channel *ch, bool *call_done, ddt_error *err);

/* The function name of the call whose arguments are being read (its
 * <|tool_call_argument_begin|> routed, its end not yet), read from its id as
 * finished calls' names are: *name malloc'd, or NULL when no call is at its
 * arguments.  For a server that constrains the arguments by the function the
 * model named.  DDT_ERR_NOMEM when the copy cannot be made. */
ddt_status ddt_chat_router_args_name(const ddt_chat_router *r, char **name, ddt_error *err);

/* calls[0..n) as OpenAI's tool_calls array: [{"id", "type": "function",
 * "function": {"name", "arguments"}}], invalid UTF-8 replaced by U+FFFD; with
 * first_index >= 0 (a streamed delta) entry k also carries "index":
 * first_index + k.  NULL when out of memory. */
json_t *ddt_chat_tool_calls_json(const ddt_chat_tool_call *calls, int n, int first_index);

#endif
