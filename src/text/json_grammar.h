/*
 * json_grammar.h — a byte-at-a-time recogniser of JSON text (RFC 8259) for
 * grammar-constrained decoding: after any prefix it says whether that prefix can
 * still grow into a valid document, and whether the document is complete.
 *
 * A pushdown automaton whose stack is one bit per open container (object or
 * array), so a state is a small struct that callers copy freely: stepping it
 * allocates nothing, and the token mask (json_vocab.h) copies one per trie
 * level.  Covered: objects, arrays, strings with every escape (\uXXXX as four
 * hex digits; a lone surrogate escape is accepted, as RFC 8259's grammar and
 * Python's json module do), strict UTF-8 inside strings (no overlongs, no
 * surrogates, nothing past U+10FFFF), numbers exactly as RFC 8259 writes them,
 * true / false / null, and the four whitespace bytes.
 *
 * Two limits that JSON itself does not have, both so that a model cannot run
 * away inside the grammar: nesting deeper than DDT_JSON_MAX_DEPTH containers is
 * refused (the opening byte past it does not step), and so is a run of more
 * than DDT_JSON_MAX_WS whitespace bytes (a model that loops on spaces must write
 * something else).  Both are generous for pretty-printed output.  And the
 * document starts with its value, no whitespace before it (a generation has no
 * reason to open with blanks, and small models like to; trailing whitespace is
 * accepted, but a token mask ends a complete document with a stop id at once).
 *
 * With a compiled schema (json_schema.h, ddt_json_init_schema) the same state
 * also follows the schema: it keeps, per open container, its schema node and,
 * in an object, which property comes next (while a key is read, the first
 * property whose name matches so far), in an array the items written (counted
 * only as far as minItems / maxItems need); and inside a property name or an
 * enum value how many bytes matched and from which candidate, inside a string
 * with a length bound the characters written.  So a byte the schema forbids does
 * not step either, and no byte steps into a state from which no instance can be
 * finished (a dead end would leave a token mask empty).  Without a schema those
 * fields stay zero and the recogniser is plain JSON.
 */
#ifndef DDT_TEXT_JSON_GRAMMAR_H
#define DDT_TEXT_JSON_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DDT_JSON_MAX_DEPTH 64 /* open containers; the stack is one uint64_t */
#define DDT_JSON_MAX_WS 24    /* consecutive whitespace bytes (a newline and 20-odd spaces of indent) */
#define DDT_JSON_SCHEMA_MAX_DEPTH 8 /* containers a schema may nest (one schema position each in the state) */

struct ddt_json_schema;

/* Laid out without padding, so that copies compare equal byte for byte. */
typedef struct ddt_json_state {
    const struct ddt_json_schema *schema; /* NULL: any JSON */
    uint64_t stack;   /* bit d: the container at depth d + 1 is an object (1) or an array (0) */
    uint16_t snode[DDT_JSON_SCHEMA_MAX_DEPTH]; /* schema: the node of the container at depth d + 1 */
    uint16_t sidx[DDT_JSON_SCHEMA_MAX_DEPTH];  /* schema: in an object, the property being written or next;
                                                  in an array, the items so far (up to its bounds) */
    uint32_t spos;    /* schema: bytes matched of the property name or enum value being read; in a string
                         with a length bound, its characters so far (up to the bound) */
    uint32_t slo;     /* schema: in an enum value, the first (sorted) candidate that still matches */
    uint8_t depth;    /* open containers */
    uint8_t mode;     /* what the next byte may be (json_grammar.c's enum) */
    uint8_t sub;      /* inside a token: literal bytes matched, hex digits read, UTF-8 bytes still due */
    uint8_t lit;      /* which literal (true, false, null); in a \u escape of a string with a length
                         bound, whether its first digit was a 'd' (a surrogate may follow) */
    uint8_t lo, hi;   /* the range of the next UTF-8 continuation byte */
    uint8_t ws;       /* whitespace bytes in the current run */
    uint8_t flags;    /* the string being read is a key; the top level must be an object */
} ddt_json_state;

/* The state before any byte.  object_only: the top-level value must be an object
 * (OpenAI's json_object mode); otherwise any JSON value. */
void ddt_json_init(ddt_json_state *s, bool object_only);

/* The state before any byte of an instance of schema (compiled, json_schema.h;
 * it must outlive every state made from this one).  Its root is an object. */
void ddt_json_init_schema(ddt_json_state *s, const struct ddt_json_schema *schema);

/* Take one byte: true and the state moved on when the prefix so far plus c can
 * still become valid JSON, false (s unchanged) when it cannot. */
bool ddt_json_step(ddt_json_state *s, uint8_t c);

/* Take n bytes in turn: true when every one steps; on false s is where the first
 * refused byte left it (unchanged by that byte). */
bool ddt_json_feed(ddt_json_state *s, const uint8_t *b, size_t n);

/* Whether the bytes so far are a complete document (trailing whitespace allowed).
 * A complete top-level number may still go on (12 -> 123); every other complete
 * document takes nothing but whitespace. */
bool ddt_json_complete(const ddt_json_state *s);

#endif
