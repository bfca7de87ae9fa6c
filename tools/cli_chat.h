/*
 * cli_chat.h — what the command-line chat tools (generate --chat, chat) do with a
 * chat model's answer: print it with its thinking and tool-call markers visible,
 * and split it into the message serve returns (text/chat_output.h).
 */
#ifndef DDT_TOOLS_CLI_CHAT_H
#define DDT_TOOLS_CLI_CHAT_H

#include <jansson.h>
#include <stdint.h>

#include "text/chat_output.h"
#include "text/tokenizer.h"

/* Print ids[0..n) to stdout: ordinary tokens' bytes, and the markers' text
 * (markers NULL: none) so that where thinking ends and a call begins shows;
 * other special tokens print nothing. */
void cli_print_tokens(const ddt_tokenizer *tok, const ddt_chat_markers *markers, const int32_t *ids, int32_t n);

/*
 * The answer out[0..n) as an OpenAI chat message: {"role": "assistant",
 * "content", "reasoning_content" (when there is any), "tool_calls": [{"id",
 * "type": "function", "function": {"name", "arguments"}}] (when there are any)};
 * it starts inside a thinking block when the prompt opens one
 * (ddt_chat_prompt_opens_thinking: <think>, then at most whitespace).
 * Invalid UTF-8 becomes U+FFFD.  NULL when out of memory.
 */
json_t *cli_chat_message(const ddt_tokenizer *tok, const int32_t *prompt, int32_t n_prompt, const int32_t *out,
                         int32_t n);

#endif
