/*
 * json_vocab.h — a model's vocabulary as a byte trie, for the token masks of
 * JSON-constrained decoding: from a recogniser state (json_grammar.h), the set
 * of token ids whose bytes it accepts.
 *
 * Built once per tokenizer (a server builds it at start and shares it, read
 * only, with every request); a mask is one depth-first walk of the trie that
 * steps a copy of the state per edge and prunes a branch at the first refused
 * byte, so it visits only the prefixes the grammar allows.  Special tokens and
 * ids without bytes are never in a mask, and neither is a token of no bytes
 * (it could repeat forever without moving the grammar), nor a token of more than
 * DDT_JSON_VOCAB_MAX_TOKEN bytes (which bounds a mask's recursion; real
 * vocabularies have none, and the same text can be spelt with shorter tokens).
 */
#ifndef DDT_TEXT_JSON_VOCAB_H
#define DDT_TEXT_JSON_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddtree.h"
#include "text/json_grammar.h"
#include "text/tokenizer.h"

#define DDT_JSON_VOCAB_MAX_TOKEN 256

typedef struct ddt_json_vocab ddt_json_vocab;

/*
 * From raw token bytes: id i (0 <= i < vocab) spells bytes[i][0..len[i]); len[i] = 0
 * (or bytes[i] NULL) leaves id i out of every mask.  The bytes are copied.
 */
ddt_status ddt_json_vocab_create_bytes(const uint8_t *const *bytes, const size_t *len, int32_t vocab,
                                       ddt_json_vocab **out, ddt_error *err);

/* From a tokenizer: the ordinary tokens among ids 0..vocab-1 (the model's vocabulary,
 * which may be larger or smaller than the tokenizer's); specials left out. */
ddt_status ddt_json_vocab_create(const ddt_tokenizer *tok, int32_t vocab, ddt_json_vocab **out, ddt_error *err);

void ddt_json_vocab_free(ddt_json_vocab *v);

int32_t ddt_json_vocab_size(const ddt_json_vocab *v);

/*
 * allow[0..vocab) := whether each id may come next in state s: while the document
 * is incomplete, the tokens whose bytes all step s (the stop ids never); once it
 * is complete, only the stop ids (stop[0..n_stop), those inside the vocabulary),
 * so a finished document ends at once.  Returns how many ids are allowed (0: no
 * token of this vocabulary can go on from s).  Allocates nothing.
 */
int32_t ddt_json_vocab_mask(const ddt_json_vocab *v, const ddt_json_state *s, const int32_t *stop, int32_t n_stop,
                            uint8_t *allow);

/* Step s by the bytes of token id: false (s unchanged) when the grammar refuses them,
 * the id has no bytes here, or it is outside the vocabulary. */
bool ddt_json_vocab_advance(const ddt_json_vocab *v, ddt_json_state *s, int32_t id);

/*
 * Masks by state, kept.  A generation asks for the mask of the same few states
 * over and over (inside a string, after a comma at some depth, ...), and on a
 * real vocabulary (~160k tokens) one mask walks most of the trie: in a string
 * nearly every token is allowed.  The cache keeps `entries` masks keyed by the
 * whole state, a schema's pointer and positions included (the stack bits and
 * schema positions above the depth cleared: they are stale, never read) and computes a
 * missing one into the least recently used entry.  All its memory is allocated at
 * create; get allocates nothing.  The stop ids are part of a mask: the cache keeps
 * the list its masks were made with and starts afresh when a get brings another
 * (a list longer than DDT_JSON_MASK_CACHE_MAX_STOP is never kept, so every get with
 * one computes its mask).  Clear it when the vocabulary changes.
 */
#define DDT_JSON_MASK_CACHE_MAX_STOP 16
typedef struct ddt_json_mask_cache ddt_json_mask_cache;

ddt_status ddt_json_mask_cache_create(int32_t vocab, int32_t entries, ddt_json_mask_cache **out, ddt_error *err);
void ddt_json_mask_cache_free(ddt_json_mask_cache *c);
void ddt_json_mask_cache_clear(ddt_json_mask_cache *c);

/* ddt_json_vocab_mask(v, s, stop, n_stop) from the cache (v must have the cache's
 * vocabulary size); *count := its allowed ids.  The mask stays valid until the next
 * get or clear. */
const uint8_t *ddt_json_mask_cache_get(ddt_json_mask_cache *c, const ddt_json_vocab *v, const ddt_json_state *s,
                                       const int32_t *stop, int32_t n_stop, int32_t *count);

/* Lookups answered from the cache and lookups computed since create. */
void ddt_json_mask_cache_stats(const ddt_json_mask_cache *c, int64_t *hits, int64_t *misses);

#endif
