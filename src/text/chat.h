/*
 * chat.h — Kimi K2's chat template, producing token ids directly:
 *
 *   <|im_system|>system<|im_middle|>{system}<|im_end|>
 *   <|im_user|>user<|im_middle|>{user}<|im_end|>
 *   <|im_assistant|>assistant<|im_middle|>{reply}<|im_end|> ...
 *   <|im_assistant|>assistant<|im_middle|>            (the generation prompt)
 *
 * (no newlines between messages).  As in Kimi K2's chat_template.jinja, a
 * conversation whose first message is not a system message gets the default
 * system message DDT_CHAT_KIMI_DEFAULT_SYSTEM first.  The <|...|> markers are
 * emitted as their special ids; message text is encoded as ordinary text, so
 * "<|im_end|>" typed by a user cannot inject a control token (Hugging Face's
 * apply_chat_template would recognise it; for text without special-token
 * strings the ids are the same).  Thinking-mode markers (<think>) are not added.
 */
#ifndef DDT_TEXT_CHAT_H
#define DDT_TEXT_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddtree.h"
#include "text/tokenizer.h"

#define DDT_CHAT_KIMI_DEFAULT_SYSTEM "You are Kimi, an AI assistant created by Moonshot AI."

typedef enum ddt_chat_role { DDT_CHAT_SYSTEM = 0, DDT_CHAT_USER = 1, DDT_CHAT_ASSISTANT = 2 } ddt_chat_role;

typedef struct ddt_chat_message {
    ddt_chat_role role;
    const char *content; /* [len] bytes, need not be NUL-terminated */
    size_t len;
} ddt_chat_message;

/*
 * Encode a conversation; with add_generation_prompt the assistant header ends
 * it.  Output convention as ddt_tokenizer_encode: min(count, max_ids) ids
 * written, *n_ids = count, DDT_ERR_RANGE when the buffer is too small.
 * DDT_ERR_INVALID when the tokenizer lacks one of the markers or a role is bad.
 */
ddt_status ddt_chat_encode(ddt_tokenizer *tok, const ddt_chat_message *msgs, size_t n_msgs,
                           bool add_generation_prompt, int32_t *ids, size_t max_ids, size_t *n_ids,
                           ddt_error *err);

/* One user turn: system (NULL for the default) and user (NUL-terminated), then the generation prompt. */
ddt_status ddt_chat_encode_prompt(ddt_tokenizer *tok, const char *system, const char *user, int32_t *ids,
                                  size_t max_ids, size_t *n_ids, ddt_error *err);

#endif
