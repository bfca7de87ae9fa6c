/*
 * tokenizer_impl.h — internals shared by the two tokenizer formats: the
 * ddt_tokenizer struct, its byte-keyed hash tables, the BPE workspace and the
 * id output of an encode.  tokenizer.c holds the tiktoken format and the
 * format-neutral API; tokenizer_json.c the Hugging Face tokenizer.json format.
 * Not part of the public API: only those two files include it.
 */
#ifndef DDT_TEXT_TOKENIZER_IMPL_H
#define DDT_TEXT_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8

#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"

/* id_kind values.  TOK_SPECIAL is a control token: recognised in text only under
 * DDT_TOKENIZE_SPECIAL (tiktoken) or by the added-token rules (tokenizer.json). */
enum { TOK_UNUSED = 0, TOK_RANK = 1, TOK_SPECIAL = 2 };

/* Unicode White_Space, which is both Rust regex's and Oniguruma's \s, as the inside
 * of a PCRE2 class: PCRE2's own \s differs (U+180E in older tables, U+0085). */
#define TOK_WS "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
               "\\x{202F}\\x{205F}\\x{3000}"

/* Open-addressing hash table from token bytes to id; the bytes live elsewhere
 * (a tok_keys says where), so a look-up allocates nothing. */
typedef struct tok_table {
    int32_t *slots; /* [mask + 1] id, -1 when empty; load <= 1/2 */
    uint32_t mask;
} tok_table;

/* Where a table's keys are: id's key is pool[off[id] .. off[id] + len[id]). */
typedef struct tok_keys {
    const uint8_t *pool;
    const uint32_t *off;
    const uint32_t *len;
} tok_keys;

typedef struct tok_hf tok_hf; /* tokenizer.json state, tokenizer_json.c */

struct ddt_tokenizer {
    uint8_t *pool;       /* [pool_len] bytes of every token: ranks then specials */
    size_t pool_len;
    uint32_t *id_off;    /* [vocab_size] offset of an id's bytes in pool */
    uint32_t *id_len;    /* [vocab_size] length of an id's bytes; 0 when unused */
    uint8_t *id_kind;    /* [vocab_size] TOK_UNUSED, TOK_RANK or TOK_SPECIAL */
    int32_t vocab_size;  /* largest id + 1 */
    int32_t n_ranks;     /* ordinary tokens */
    int32_t n_special;   /* special tokens */
    tok_table ranks;     /* ordinary token bytes -> id */
    tok_table specials;  /* special token text -> id (tiktoken format only) */
    uint8_t special_first[32]; /* bitmap: bytes that start some special token */
    uint32_t *special_lens;    /* [n_special_lens] distinct special lengths, descending */
    int32_t n_special_lens;

    pcre2_code *re;      /* tiktoken format's pattern */
    pcre2_match_data *md;
    pcre2_match_context *mctx; /* both formats: holds the JIT stack */
    pcre2_jit_stack *jit_stack;

    tok_hf *hf;          /* non-NULL for a tokenizer.json tokenizer */

    /* BPE workspace, grown to the longest piece seen; see bpe_piece. */
    size_t ws_cap;       /* piece bytes the workspace holds */
    uint32_t *ws_next;   /* [ws_cap] start of the next part (piece length at the end) */
    int32_t *ws_prev;    /* [ws_cap] start of the previous part, -1 for the first */
    int32_t *ws_rank;    /* [ws_cap] rank of this part merged with the next, -1 if none */
    uint8_t *ws_alive;   /* [ws_cap] 1 while a part starts here */
    uint64_t *ws_heap;   /* [3 * ws_cap] (rank << 32 | start), min-heap */
    int32_t *ws_sym;     /* [ws_cap] id of the part starting here (tokenizer.json's BPE) */
};

/* One encode call: where ids go and what the caller's text was. */
typedef struct tok_encoder {
    ddt_tokenizer *tok;
    const uint8_t *base; /* the caller's text, for offsets in messages */
    const uint8_t *data; /* NULL, or [len of base] marks: a special token only where all are 0 */
    int32_t *ids;        /* [max_ids] output */
    size_t max_ids;
    size_t count;        /* ids produced, may exceed max_ids */
    ddt_error *err;
} tok_encoder;

ddt_status tok_table_init(tok_table *t, size_t n_keys, ddt_error *err);
/* The id whose key equals p[0..n), or -1. */
int32_t tok_table_find_in(const tok_table *t, const tok_keys *k, const uint8_t *p, size_t n);
/* Insert id; returns the id already holding an equal key (nothing inserted), or -1. */
int32_t tok_table_insert_in(tok_table *t, const tok_keys *k, int32_t id);
/* The same over the token bytes (pool, id_off, id_len). */
int32_t tok_table_find(const ddt_tokenizer *tok, const tok_table *t, const uint8_t *p, size_t n);
int32_t tok_table_insert(ddt_tokenizer *tok, tok_table *t, int32_t id);

/* Ensure the id tables hold ids [0, size); new entries are unused. */
ddt_status tok_grow_ids(ddt_tokenizer *tok, int32_t size, ddt_error *err);
/* Grow the BPE workspace to pieces of n bytes. */
ddt_status tok_workspace_reserve(ddt_tokenizer *tok, size_t n, ddt_error *err);
void tok_heap_push(uint64_t *h, size_t *n, uint64_t v);
uint64_t tok_heap_pop(uint64_t *h, size_t *n);
void tok_emit(tok_encoder *e, int32_t id);
/* True when any of the n marks is set (the bytes came from data, not the template). */
bool tok_marked(const uint8_t *data, size_t n);
/* One code point of UTF-8 at s (n > 0 bytes): its byte length; *cp = -1 for an invalid byte. */
size_t tok_utf8_next(const uint8_t *s, size_t n, int32_t *cp);

/* tokenizer_json.c */
ddt_status tok_hf_encode(tok_encoder *e, const uint8_t *s, size_t n, uint32_t flags);
int32_t tok_hf_token_id(const ddt_tokenizer *tok, const uint8_t *text, size_t n);
void tok_hf_free(tok_hf *hf);

#endif
