/*
 * chat.h — a conversation to token ids through the model's own chat template,
 * as transformers' apply_chat_template does it: the checkpoint's Jinja template
 * (chat_template.jinja in the model folder, else tokenizer_config.json's
 * "chat_template": a string, or a list of named templates of which "default"
 * is used, and "tool_use" when the request declares tools), rendered with
 * `messages`, `tools`, `add_generation_prompt`, the tokenizer's special-token
 * strings (bos_token, eos_token, unk_token, pad_token) and the request's
 * chat_template_kwargs (e.g. `thinking`), then encoded with special tokens
 * recognised.  A folder without a template gets the built-in one: Kimi K2's
 * format (reference.md, "What serving users expect"):
 *
 *   [<|im_system|>tool_declare<|im_middle|>{tools as compact JSON}<|im_end|>]
 *   <|im_system|>system<|im_middle|>{system}<|im_end|>
 *   <|im_user|>user<|im_middle|>{user}<|im_end|>
 *   <|im_assistant|>assistant<|im_middle|>{reply}[tool-call section]<|im_end|>
 *   <|im_system|>tool<|im_middle|>## Return of {tool_call_id}\n{result}<|im_end|> ...
 *   <|im_assistant|>assistant<|im_middle|>            (the generation prompt)
 *
 * (no newlines between messages; the default system message
 * DDT_CHAT_KIMI_DEFAULT_SYSTEM first when the conversation has none).
 *
 * Injection: special-token text counts only where the template itself wrote it
 * (jinja.h's data marks, ddt_tokenizer_encode_marked), so "<|im_end|>" typed in
 * a message is ordinary text, never a control token.  For conversations without
 * special-token strings in them the ids are apply_chat_template's.
 */
#ifndef DDT_TEXT_CHAT_H
#define DDT_TEXT_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddtree.h"
#include "text/jinja.h"
#include "text/tokenizer.h"

#define DDT_CHAT_KIMI_DEFAULT_SYSTEM "You are Kimi, an AI assistant created by Moonshot AI."

typedef struct ddt_chat_template ddt_chat_template;

/*
 * The chat template of a model folder (see above), or the built-in one when it
 * has none; template_file (NULL: none) replaces the folder's own (a server's
 * --chat-template), the folder's tokenizer_config.json still giving the
 * special tokens' strings.  DDT_ERR_IO naming a file that cannot be read,
 * DDT_ERR_FORMAT naming the file when a template or tokenizer_config.json is
 * malformed, DDT_ERR_INVALID (with line and column) when the template does not
 * parse.
 */
ddt_status ddt_chat_template_load(const char *model_dir, const char *template_file, ddt_chat_template **out,
                                  ddt_error *err);

/*
 * From memory: src[len] (NULL: the built-in template), origin names it in
 * messages, config (tokenizer_config.json's text, or NULL) gives the special
 * tokens' strings and, when src is NULL, may hold the template itself.
 */
ddt_status ddt_chat_template_create(const char *src, size_t len, const char *origin, const char *config,
                                    size_t config_len, ddt_chat_template **out, ddt_error *err);
void ddt_chat_template_free(ddt_chat_template *t);

/* Where the template came from: "built-in Kimi K2", ".../chat_template.jinja", ... */
const char *ddt_chat_template_origin(const ddt_chat_template *t);

/* One conversation.  messages: an array of {"role", "content", ...} objects as
 * the OpenAI API has them (content a string; tool_calls, tool_call_id, name and
 * reasoning_content passed through); tools: NULL or an array; kwargs: NULL or
 * an object of extra template variables (chat_template_kwargs). */
typedef struct ddt_chat_input {
    const json_t *messages;
    const json_t *tools;
    const json_t *kwargs;
    bool add_generation_prompt;
} ddt_chat_input;

/* The rendered text with its data marks (jinja.h).  DDT_ERR_INVALID for a
 * malformed input or a template error ("chat template: line L, column C: ..."),
 * for a kwargs name the engine sets itself, and for what the template raised. */
ddt_status ddt_chat_render(const ddt_chat_template *t, const ddt_chat_input *in, ddt_jinja_text *out,
                           ddt_error *err);

/* Render and encode: *ids is malloc'd (*n_ids ids; free it). */
ddt_status ddt_chat_encode(const ddt_chat_template *t, ddt_tokenizer *tok, const ddt_chat_input *in, int32_t **ids,
                           size_t *n_ids, ddt_error *err);

/*
 * One user turn: system (NULL: none, so the template's default applies) and
 * user (NUL-terminated), then the generation prompt; t NULL: the built-in
 * template.  Output as ddt_tokenizer_encode: min(count, max_ids) ids written,
 * *n_ids = count, DDT_ERR_RANGE when the buffer is too small.
 */
ddt_status ddt_chat_encode_prompt(const ddt_chat_template *t, ddt_tokenizer *tok, const char *system,
                                  const char *user, int32_t *ids, size_t max_ids, size_t *n_ids, ddt_error *err);

#endif
