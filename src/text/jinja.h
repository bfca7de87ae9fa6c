/*
 * jinja.h — a sandboxed subset of Jinja2, enough for the chat templates that
 * Hugging Face checkpoints ship (tokenizer_config.json's "chat_template" or a
 * chat_template.jinja file): Kimi K2.x, DeepSeek-V3 / R1 / V3.1 and relatives.
 *
 * It renders the way transformers' apply_chat_template does: an environment
 * with trim_blocks and lstrip_blocks on, the loopcontrols extension (break,
 * continue), the {% generation %} tag (rendered as its body), tojson that keeps
 * non-ASCII characters, and raise_exception(msg).
 *
 * Why the output carries a mask: a chat template is text with special-token
 * strings ("<|im_end|>") in it, and the conversation's strings are pasted in
 * between.  Every byte of the output records whether it came from the template
 * (its literals, or a string from the trusted context) or from the data
 * context (a message, a tool's JSON): the chat encoder recognises special
 * tokens only in template bytes, so a user who types "<|im_end|>" gets text,
 * not a control token.  A value computed from data (a filter's result, a
 * concatenation, a slice) stays data byte for byte where the bytes are copied,
 * and wholly data where they are transformed.
 *
 * Bounds: the template source (DDT_JINJA_MAX_SOURCE), nesting, the number of
 * evaluation steps and the output size are bounded, so a hostile template or
 * conversation gets an error, never a hang or a crash.  Errors name the
 * template's line and column and what was wrong.
 */
#ifndef DDT_TEXT_JINJA_H
#define DDT_TEXT_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "ddtree.h"

#define DDT_JINJA_MAX_SOURCE (1u << 20)     /* template bytes */
#define DDT_JINJA_MAX_OUTPUT (64u << 20)    /* rendered bytes */
#define DDT_JINJA_MAX_STEPS 50000000ull     /* evaluation steps of one render */
#define DDT_JINJA_MAX_DEPTH 256             /* nesting of blocks, expressions and macro calls */
#define DDT_JINJA_MAX_STACK (2u << 20)      /* machine stack one render may use (recursion) */
#define DDT_JINJA_MAX_MEMORY (256u << 20)   /* working memory of one render (values, captured text) */
#define DDT_JINJA_MAX_RANGE 100000          /* items of one range(), as jinja2's sandbox allows */

typedef struct ddt_jinja ddt_jinja;

/* The rendered text: bytes[len] (NUL-terminated past len) and data[len], where
 * data[i] is 1 when bytes[i] came from the data context, 0 from the template. */
typedef struct ddt_jinja_text {
    char *bytes;
    uint8_t *data;
    size_t len;
} ddt_jinja_text;

/* Parse a template.  DDT_ERR_INVALID with "line L, column C: ..." on a syntax
 * error or an unsupported construct; DDT_ERR_RANGE past the source bound. */
ddt_status ddt_jinja_parse(const char *src, size_t len, ddt_jinja **out, ddt_error *err);
void ddt_jinja_free(ddt_jinja *t);

/*
 * Render with two JSON objects of variables (either may be NULL): `data` (the
 * messages, the tools: their strings are data) and `trusted` (bos_token,
 * add_generation_prompt, ...: their strings are template).  A name in both is
 * taken from `trusted`.  Neither object is modified or kept.
 * DDT_ERR_INVALID with the line and column on an evaluation error (an
 * undefined name called, a type error, raise_exception's message: "template
 * raised: <message>"); DDT_ERR_RANGE past a bound.  On success *out owns its
 * buffers (ddt_jinja_text_free); on failure *out is empty.
 */
ddt_status ddt_jinja_render(const ddt_jinja *t, const json_t *data, const json_t *trusted,
                            ddt_jinja_text *out, ddt_error *err);
void ddt_jinja_text_free(ddt_jinja_text *text);

#endif
