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
 * For DeepSeek's markers an ordinary token whose bytes are exactly the marker
 * also counts (a tokenizer.json whose vocabulary holds a non-special added
 * token: encoding the marker's text gives that one id, as the template's
 * prompt does); a marker spelled over several ordinary tokens is text.
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

/* Which tool-call markup the markers are. */
typedef enum ddt_chat_format {
    DDT_CHAT_FORMAT_NONE = 0,  /* no complete set of tool-call markers */
    DDT_CHAT_FORMAT_KIMI = 1,
    DDT_CHAT_FORMAT_DEEPSEEK = 2
} ddt_chat_format;

/* The marker ids (-1: the tokenizer has no such token).  For DeepSeek:
 * section_begin/end <｜tool▁calls▁begin｜>/<｜tool▁calls▁end｜>, call_begin/end
 * <｜tool▁call▁begin｜>/<｜tool▁call▁end｜>, arg_begin <｜tool▁sep｜>. */
typedef struct ddt_chat_markers {
    int32_t think, think_end;
    int32_t section_begin, section_end, call_begin, arg_begin, call_end;
    ddt_chat_format format;    /* whose tool markers these are (KIMI when the tokenizer has any of
                                  Kimi's, else DEEPSEEK when any of DeepSeek's); a server that
                                  forces a call checks that all five are there */
} ddt_chat_markers;

/* DeepSeek's tool-call marker texts (UTF-8: FW is U+FF5C, the full-width bar; LB
 * is U+2581, the lower block that stands for a space). */
#define DDT_DS_FW "\xef\xbd\x9c"
#define DDT_DS_LB "\xe2\x96\x81"
#define DDT_DS_CALLS_BEGIN "<" DDT_DS_FW "tool" DDT_DS_LB "calls" DDT_DS_LB "begin" DDT_DS_FW ">"
#define DDT_DS_CALLS_END "<" DDT_DS_FW "tool" DDT_DS_LB "calls" DDT_DS_LB "end" DDT_DS_FW ">"
#define DDT_DS_CALL_BEGIN "<" DDT_DS_FW "tool" DDT_DS_LB "call" DDT_DS_LB "begin" DDT_DS_FW ">"
#define DDT_DS_CALL_END "<" DDT_DS_FW "tool" DDT_DS_LB "call" DDT_DS_LB "end" DDT_DS_FW ">"
#define DDT_DS_SEP "<" DDT_DS_FW "tool" DDT_DS_LB "sep" DDT_DS_FW ">"

void ddt_chat_markers_find(const ddt_tokenizer *tok, ddt_chat_markers *m);

typedef enum ddt_chat_channel {
    DDT_CHAT_CH_NONE = 0,      /* a marker, or text between markers that no field keeps */
    DDT_CHAT_CH_CONTENT = 1,
    DDT_CHAT_CH_REASONING = 2,
    DDT_CHAT_CH_TOOL = 3       /* part of a tool call: kept by the router itself */
} ddt_chat_channel;

typedef struct ddt_chat_tool_call {
    char *id;        /* Kimi: as generated, trimmed ("functions.get_weather:0"); DeepSeek: "call_K" */
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
    int32_t first_call_index;   /* DeepSeek: the K of the first call's id "call_K" (0 after init; a server
                                   sets the number of calls earlier in the conversation) */
} ddt_chat_router;

/* Whether a chat prompt opens a thinking block, so that the answer starts as
 * reasoning: its last token is <think>, or <think> is followed only by
 * whitespace tokens (DeepSeek-R1's template ends its prompt "<think>\n").  False
 * when the tokenizer has no <think> / </think> pair (nothing would end it). */
bool ddt_chat_prompt_opens_thinking(const ddt_tokenizer *tok, const int32_t *prompt, size_t n);

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
 * <|tool_call_argument_begin|> / <｜tool▁sep｜> routed, its end not yet), read
 * from the text before that marker as finished calls' names are (for a
 * DeepSeek V3 call that text is "function": its name comes later): *name malloc'd, or NULL when no call is at its
 * arguments.  For a server that constrains the arguments by the function the
 * model named.  DDT_ERR_NOMEM when the copy cannot be made. */
ddt_status ddt_chat_router_args_name(const ddt_chat_router *r, char **name, ddt_error *err);

/* calls[0..n) as OpenAI's tool_calls array: [{"id", "type": "function",
 * "function": {"name", "arguments"}}], invalid UTF-8 replaced by U+FFFD; with
 * first_index >= 0 (a streamed delta) entry k also carries "index":
 * first_index + k.  NULL when out of memory. */
json_t *ddt_chat_tool_calls_json(const ddt_chat_tool_call *calls, int n, int first_index);

#endif
