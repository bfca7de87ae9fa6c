/*
 * json_grammar.c — the JSON recogniser of json_grammar.h.
 *
 * Each mode names what the next byte may be.  A number has no closing byte, so
 * a byte that cannot go on a number ends it and is then read again as what
 * follows the value (a comma, a closing bracket, whitespace).
 *
 * A schema (json_schema.h) adds checks at the few places where the grammar
 * decides something: the first byte of a value (its class, which also picks an
 * anyOf's branch, and whether a container fits the nesting left), a key's bytes
 * (the names of the properties that may come next), the bytes of an enum string
 * or number, a number's '.' / 'e' (not in an integer), a string's characters
 * (its length bounds), and ',' / closing brackets (whether a property or item
 * may or must follow).  A scalar's schema node is not kept in the state: it is
 * found again from the container's position and the class the mode implies.
 */
#include "text/json_grammar.h"

#include <string.h>

#include "text/json_schema.h"

enum {
    M_VALUE,       /* a value (top level, after ':' or after ',' in an array) */
    M_ARRAY_FIRST, /* after '[': a value or ']' */
    M_OBJ_FIRST,   /* after '{': a key or '}' */
    M_KEY,         /* after ',' in an object: a key */
    M_COLON,       /* after a key */
    M_AFTER,       /* after a value inside a container: ',' or the closing bracket */
    M_DONE,        /* the top-level value is complete */
    M_STRING,      /* inside a string */
    M_ESC,         /* after a backslash */
    M_UHEX,        /* inside \uXXXX, sub digits read */
    M_UTF8,        /* inside a multi-byte character, sub bytes still due in lo..hi then 80..BF */
    M_LIT,         /* inside true / false / null, sub bytes matched */
    M_NUM_MINUS,   /* '-': a digit must follow */
    M_NUM_ZERO,    /* a leading 0: no more integer digits */
    M_NUM_INT,     /* integer digits after 1..9 */
    M_NUM_DOT,     /* '.': a digit must follow */
    M_NUM_FRAC,    /* fraction digits */
    M_NUM_E,       /* 'e' / 'E': a sign or a digit */
    M_NUM_ESIGN,   /* the exponent's sign: a digit must follow */
    M_NUM_EXP      /* exponent digits */
};

enum { F_KEY = 1, F_OBJECT_ONLY = 2 };

/* json_grammar.h promises no padding (the mask cache compares states with memcmp) */
_Static_assert(sizeof(ddt_json_state) == 8 + 8 + 4 * DDT_JSON_SCHEMA_MAX_DEPTH + 4 + 4 + 8,
               "ddt_json_state has padding");

static const char *const literals[3] = {"true", "false", "null"};
static const uint8_t literal_len[3] = {4, 5, 4};

void ddt_json_init(ddt_json_state *s, bool object_only) {
    *s = (ddt_json_state){0};
    s->mode = M_VALUE;
    s->flags = object_only ? F_OBJECT_ONLY : 0;
}

static bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

void ddt_json_init_schema(ddt_json_state *s, const struct ddt_json_schema *schema) {
    ddt_json_init(s, true);
    s->schema = schema;
}

static bool top_is_object(const ddt_json_state *s) { return s->depth > 0 && (s->stack >> (s->depth - 1) & 1u); }

/* ---- schema positions */

/* The node a value of class k follows at node i: a union sends each class to its branch. */
static uint16_t resolve(const ddt_json_schema *sc, uint16_t i, int k) {
    const ddt_json_schema_node *n = &sc->nodes[i];
    return (n->flags & DDT_JN_UNION) ? n->alt[k] : i;
}

/* The schema node of the container being written (depth > 0; never a union). */
static const ddt_json_schema_node *top_node(const ddt_json_state *s) {
    return &s->schema->nodes[s->snode[s->depth - 1]];
}

/* The schema node index of the value being written or about to start (maybe a union). */
static uint16_t value_node(const ddt_json_state *s) {
    if (s->depth == 0) return s->schema->root;
    const ddt_json_schema_node *n = top_node(s);
    if (!top_is_object(s)) return n->items;
    return s->schema->prop_node[n->first + s->sidx[s->depth - 1]];
}

/* The node of the scalar of class k being read. */
static const ddt_json_schema_node *scalar_node(const ddt_json_state *s, int k) {
    return &s->schema->nodes[resolve(s->schema, value_node(s), k)];
}

/* The class of a value's first byte (json_schema.h), -1: no value starts so. */
static int byte_class(uint8_t c) {
    switch (c) {
    case '{': return DDT_JK_OBJECT;
    case '[': return DDT_JK_ARRAY;
    case '"': return DDT_JK_STRING;
    case 't': return DDT_JK_TRUE;
    case 'f': return DDT_JK_FALSE;
    case 'n': return DDT_JK_NULL;
    default: return c == '-' || is_digit(c) ? DDT_JK_NUMBER : -1;
    }
}

/* Whether a value of node i, started in the top container, can be finished
 * within the nesting limit (its height counts the containers it must open). */
static bool fits(const ddt_json_state *s, uint16_t i) {
    return s->depth + s->schema->nodes[i].h <= DDT_JSON_SCHEMA_MAX_DEPTH;
}

/* ---- property names: from the next property (sidx) on, the ones that fit, up
 * to and including the first required one, may come next; while a key is read
 * sidx is the first of them whose name matches the bytes so far. */

static bool prop_fits(const ddt_json_state *s, uint16_t j) {
    return fits(s, s->schema->prop_node[top_node(s)->first + j]);
}

static bool prop_required(const ddt_json_state *s, uint16_t j) {
    return s->schema->prop_required[top_node(s)->first + j] != 0;
}

/* Candidate j's name has the bytes matched so far (those of candidate cur). */
static bool same_prefix(const ddt_json_state *s, uint16_t j, uint16_t cur) {
    const ddt_json_schema *sc = s->schema;
    const ddt_json_schema_str *a = &sc->names[top_node(s)->first + j], *b = &sc->names[top_node(s)->first + cur];
    return j == cur || (a->len >= s->spos && !memcmp(sc->bytes + a->off, sc->bytes + b->off, s->spos));
}

/* Whether some property may still be written (a key may start here). */
static bool key_open(const ddt_json_state *s) {
    for (uint16_t j = s->sidx[s->depth - 1]; j < top_node(s)->count; j++) {
        if (prop_fits(s, j)) return true;
        if (prop_required(s, j)) return false;
    }
    return false;
}

static bool key_byte(ddt_json_state *s, uint8_t c) {
    const ddt_json_schema *sc = s->schema;
    const ddt_json_schema_node *n = top_node(s);
    const uint16_t cur = s->sidx[s->depth - 1];
    for (uint16_t j = cur; j < n->count; j++) {
        const ddt_json_schema_str *name = &sc->names[n->first + j];
        if (name->len > s->spos && (uint8_t)sc->bytes[name->off + s->spos] == c && same_prefix(s, j, cur) &&
            prop_fits(s, j)) {
            s->sidx[s->depth - 1] = j;
            s->spos++;
            return true;
        }
        if (prop_required(s, j)) break;
    }
    return false;
}

/* The closing quote of a key: some candidate's name is exactly the bytes read; it becomes sidx. */
static bool key_close(ddt_json_state *s) {
    const ddt_json_schema_node *n = top_node(s);
    const uint16_t cur = s->sidx[s->depth - 1];
    for (uint16_t j = cur; j < n->count; j++) {
        if (s->schema->names[n->first + j].len == s->spos && same_prefix(s, j, cur) && prop_fits(s, j)) {
            s->sidx[s->depth - 1] = j;
            return true;
        }
        if (prop_required(s, j)) break;
    }
    return false;
}

/* ---- enum values: one byte c matched against the sorted texts v[0 .. count)
 * that share the bytes matched so far (spos of them, from candidate slo on). */
static bool match_sorted(ddt_json_state *s, uint16_t first, uint16_t count, uint8_t c) {
    const ddt_json_schema *sc = s->schema;
    const ddt_json_schema_str *v = sc->strs + first, *a = &v[s->slo];
    for (uint32_t k = s->slo; k < count; k++) {
        const ddt_json_schema_str *b = &v[k];
        if (k > s->slo && (b->len < s->spos || memcmp(sc->bytes + b->off, sc->bytes + a->off, s->spos))) break;
        if (b->len > s->spos && (uint8_t)sc->bytes[b->off + s->spos] == c) {
            s->slo = k;
            s->spos++;
            return true;
        }
    }
    return false;
}

/* Whether the bytes matched are a whole text: the first candidate with them is them (sorting puts it first). */
static bool match_whole(const ddt_json_state *s, uint16_t first, uint16_t count) {
    return s->slo < count && s->schema->strs[first + s->slo].len == s->spos;
}

/* ---- string values: an enum, or a length bound (spos counts the characters, up to the bound) */

static bool len_bounded(const ddt_json_schema_node *n) {
    return n->min_len > 0 || n->max_len != DDT_JSON_SCHEMA_UNBOUNDED;
}

/* A byte in M_STRING of a value string: the closing quote, a backslash, an ASCII or a lead byte. */
static bool value_string_byte(ddt_json_state *s, uint8_t c) {
    const ddt_json_schema_node *n = scalar_node(s, DDT_JK_STRING);
    if (n->flags & DDT_JN_STR_ENUM)
        return c == '"' ? match_whole(s, n->str_first, n->str_count) : match_sorted(s, n->str_first, n->str_count, c);
    if (!len_bounded(n)) return true;
    if (c == '"') return s->spos >= n->min_len;
    if (s->spos >= n->max_len) return false;
    /* each character counts once, an escape at its backslash; past the bounds the count stops mattering */
    const uint16_t cap = n->max_len != DDT_JSON_SCHEMA_UNBOUNDED ? n->max_len : n->min_len;
    if (s->spos < cap) s->spos++;
    return true;
}

/* A UTF-8 continuation byte of a key or a value string. */
static bool continuation_byte(ddt_json_state *s, uint8_t c) {
    if (s->flags & F_KEY) return key_byte(s, c);
    const ddt_json_schema_node *n = scalar_node(s, DDT_JK_STRING);
    return !(n->flags & DDT_JN_STR_ENUM) || match_sorted(s, n->str_first, n->str_count, c);
}

/* ---- containers */

static uint16_t items_cap(const ddt_json_schema_node *n) {
    return n->max_items != DDT_JSON_SCHEMA_UNBOUNDED ? n->max_items : n->min_items;
}

/* Whether another item may start in the top array (after a comma: one must). */
static bool item_open(const ddt_json_state *s) {
    const ddt_json_schema_node *n = top_node(s);
    return (n->max_items == DDT_JSON_SCHEMA_UNBOUNDED || s->sidx[s->depth - 1] < n->max_items) && fits(s, n->items);
}

/* ---- the grammar */

/* A value just ended: the top level is complete, or its container goes on (with
 * a schema: in an object at the next property, in an array one item more, the
 * count kept only as far as minItems / maxItems need it). */
static void end_value(ddt_json_state *s) {
    s->mode = s->depth == 0 ? M_DONE : M_AFTER;
    if (s->schema && s->depth > 0) {
        uint16_t *i = &s->sidx[s->depth - 1];
        if (top_is_object(s)) (*i)++;
        else if (*i < items_cap(top_node(s))) (*i)++;
    }
}

/* Open a container; with a schema, node is its (resolved) schema node. */
static bool push(ddt_json_state *s, bool object, uint16_t node) {
    if (s->depth >= DDT_JSON_MAX_DEPTH) return false; /* json_grammar.h: refused, not grown */
    if (s->schema) {
        /* the heights keep a schema's documents within this; a guard for the arrays */
        if (s->depth >= DDT_JSON_SCHEMA_MAX_DEPTH) return false;
        s->snode[s->depth] = node;
        s->sidx[s->depth] = 0;
    }
    uint64_t bit = (uint64_t)1 << s->depth;
    s->stack = object ? s->stack | bit : s->stack & ~bit;
    s->depth++;
    s->mode = object ? M_OBJ_FIRST : M_ARRAY_FIRST;
    return true;
}

static void pop(ddt_json_state *s) {
    s->depth--;
    end_value(s);
}

/* The first byte of a value.  With a schema, its class must be one the value's
 * node allows, and a container must fit the nesting limit with what it needs. */
static bool start_value(ddt_json_state *s, uint8_t c) {
    if (s->depth == 0 && (s->flags & F_OBJECT_ONLY) && c != '{') return false;
    uint16_t node = 0;
    if (s->schema) {
        const ddt_json_schema *sc = s->schema;
        const int k = byte_class(c);
        const uint16_t v = value_node(s);
        if (k < 0 || !(sc->nodes[v].kinds >> k & 1u)) return false;
        node = resolve(sc, v, k);
        const ddt_json_schema_node *n = &sc->nodes[node];
        if (k == DDT_JK_OBJECT && s->depth + n->h_object > DDT_JSON_SCHEMA_MAX_DEPTH) return false;
        if (k == DDT_JK_ARRAY && s->depth + n->h_array > DDT_JSON_SCHEMA_MAX_DEPTH) return false;
        s->spos = s->slo = 0;
        if (k == DDT_JK_NUMBER && (n->flags & DDT_JN_NUM_ENUM) && !match_sorted(s, n->num_first, n->num_count, c))
            return false;
    }
    switch (c) {
    case '{': return push(s, true, node);
    case '[': return push(s, false, node);
    case '"': s->mode = M_STRING; s->flags &= (uint8_t)~F_KEY; return true;
    case '-': s->mode = M_NUM_MINUS; return true;
    case '0': s->mode = M_NUM_ZERO; return true;
    case 't': case 'f': case 'n':
        s->mode = M_LIT;
        s->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        s->sub = 1;
        return true;
    default:
        if (c >= '1' && c <= '9') {
            s->mode = M_NUM_INT;
            return true;
        }
        return false;
    }
}

/* A byte that goes on the number being read: with a schema enum of numbers, it
 * must go on one of their texts. */
static bool number_byte(ddt_json_state *s, uint8_t c) {
    if (!s->schema) return true;
    const ddt_json_schema_node *n = scalar_node(s, DDT_JK_NUMBER);
    return !(n->flags & DDT_JN_NUM_ENUM) || match_sorted(s, n->num_first, n->num_count, c);
}

/* The number being read ends here: with a schema enum of numbers, on a whole text. */
static bool number_end(ddt_json_state *s) {
    if (!s->schema) return true;
    const ddt_json_schema_node *n = scalar_node(s, DDT_JK_NUMBER);
    if ((n->flags & DDT_JN_NUM_ENUM) && !match_whole(s, n->num_first, n->num_count)) return false;
    s->spos = s->slo = 0;
    return true;
}

/* A byte inside a string: the UTF-8 lead bytes set the range of the next byte
 * (Unicode's table of well-formed sequences). */
static bool string_byte(ddt_json_state *s, uint8_t c) {
    if (s->schema) {
        if (s->flags & F_KEY) {
            if (c == '"' ? !key_close(s) : !key_byte(s, c)) return false;
        } else if (!value_string_byte(s, c)) {
            return false;
        }
    }
    if (c == '"') {
        s->spos = s->slo = 0;
        if (s->flags & F_KEY) s->mode = M_COLON;
        else end_value(s);
        return true;
    }
    if (c == '\\') {
        s->mode = M_ESC;
        return true;
    }
    if (c < 0x20) return false; /* control characters must be escaped */
    if (c < 0x80) return true;
    uint8_t due, lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) due = 1;
    else if (c == 0xE0) due = 2, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) due = 2;
    else if (c == 0xED) due = 2, hi = 0x9F; /* no surrogates */
    else if (c >= 0xEE && c <= 0xEF) due = 2;
    else if (c == 0xF0) due = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) due = 3;
    else if (c == 0xF4) due = 3, hi = 0x8F; /* nothing past U+10FFFF */
    else return false;                      /* a stray continuation byte, C0, C1, F5..FF */
    s->mode = M_UTF8;
    s->sub = due;
    s->lo = lo;
    s->hi = hi;
    return true;
}

/* Whitespace between tokens, capped (json_grammar.h). */
static bool whitespace(ddt_json_state *s) {
    if (s->ws >= DDT_JSON_MAX_WS) return false;
    s->ws++;
    return true;
}

static bool step(ddt_json_state *s, uint8_t c) {
    switch (s->mode) {
    case M_VALUE:
        /* no whitespace before the document: a generation starts with its value */
        if (is_ws(c)) return s->depth > 0 && whitespace(s);
        return start_value(s, c);
    case M_ARRAY_FIRST:
        if (is_ws(c)) return whitespace(s);
        if (c == ']') {
            if (s->schema && top_node(s)->min_items > 0) return false;
            pop(s);
            return true;
        }
        if (s->schema && top_node(s)->max_items == 0) return false;
        return start_value(s, c);
    case M_OBJ_FIRST:
    case M_KEY:
        if (is_ws(c)) return whitespace(s);
        if (c == '}' && s->mode == M_OBJ_FIRST) {
            if (s->schema && top_node(s)->req_end != 0) return false; /* a required property is due */
            pop(s);
            return true;
        }
        if (c != '"') return false;
        if (s->schema && !key_open(s)) return false;
        s->spos = 0;
        s->mode = M_STRING;
        s->flags |= F_KEY;
        return true;
    case M_COLON:
        if (is_ws(c)) return whitespace(s);
        if (c != ':') return false;
        s->mode = M_VALUE;
        return true;
    case M_AFTER:
        if (is_ws(c)) return whitespace(s);
        if (c == ',') {
            /* with a schema, a comma only where what must follow it (a key, an item) can */
            if (s->schema && !(top_is_object(s) ? key_open(s) : item_open(s))) return false;
            s->mode = top_is_object(s) ? M_KEY : M_VALUE;
            return true;
        }
        if (c == (top_is_object(s) ? '}' : ']')) {
            /* and a closing bracket once no property is due / minItems are written */
            if (s->schema && s->sidx[s->depth - 1] < (top_is_object(s) ? top_node(s)->req_end : top_node(s)->min_items))
                return false;
            pop(s);
            return true;
        }
        return false;
    case M_DONE:
        return is_ws(c) && whitespace(s);
    case M_STRING:
        return string_byte(s, c);
    case M_ESC:
        if (c == 'u') {
            s->mode = M_UHEX;
            s->sub = 0;
            return true;
        }
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
            s->mode = M_STRING;
            return true;
        }
        return false;
    case M_UHEX:
        if (!is_hex(c)) return false;
        /* a string with a length bound counts \uXXXX as one character, which a
         * surrogate pair is not to Python: such strings refuse surrogate escapes
         * (lit remembers that the first digit was a 'd'; keys and enum strings
         * never get here, their texts have no backslash) */
        if (s->schema && s->sub < 2 && len_bounded(scalar_node(s, DDT_JK_STRING))) {
            const bool high = (c >= '8' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
            if (s->sub == 1 && s->lit && high) return false;
            s->lit = s->sub == 0 && (c | 0x20) == 'd';
        }
        if (++s->sub == 4) s->mode = M_STRING;
        return true;
    case M_UTF8:
        if (c < s->lo || c > s->hi) return false;
        if (s->schema && !continuation_byte(s, c)) return false;
        s->lo = 0x80;
        s->hi = 0xBF;
        if (--s->sub == 0) s->mode = M_STRING;
        return true;
    case M_LIT:
        if (c != (uint8_t)literals[s->lit][s->sub]) return false;
        if (++s->sub == literal_len[s->lit]) end_value(s);
        return true;
    case M_NUM_MINUS:
        if (c == '0') s->mode = M_NUM_ZERO;
        else if (c >= '1' && c <= '9') s->mode = M_NUM_INT;
        else return false;
        return number_byte(s, c);
    case M_NUM_DOT:
        if (!is_digit(c)) return false;
        s->mode = M_NUM_FRAC;
        return number_byte(s, c);
    case M_NUM_E:
        if (c == '+' || c == '-') s->mode = M_NUM_ESIGN;
        else if (is_digit(c)) s->mode = M_NUM_EXP;
        else return false;
        return number_byte(s, c);
    case M_NUM_ESIGN:
        if (!is_digit(c)) return false;
        s->mode = M_NUM_EXP;
        return number_byte(s, c);
    case M_NUM_ZERO:
    case M_NUM_INT:
    case M_NUM_FRAC:
    case M_NUM_EXP:
        if (is_digit(c) && s->mode != M_NUM_ZERO) return number_byte(s, c);
        if (s->schema && (c == '.' || c == 'e' || c == 'E') &&
            (scalar_node(s, DDT_JK_NUMBER)->flags & (DDT_JN_INTEGER | DDT_JN_NUM_ENUM)) == DDT_JN_INTEGER)
            return false; /* an integer has neither fraction nor exponent (an enum's texts decide for themselves) */
        if (c == '.' && (s->mode == M_NUM_ZERO || s->mode == M_NUM_INT)) {
            s->mode = M_NUM_DOT;
            return number_byte(s, c);
        }
        if ((c == 'e' || c == 'E') && s->mode != M_NUM_EXP) {
            s->mode = M_NUM_E;
            return number_byte(s, c);
        }
        /* the number ends here; c is what follows it */
        if (!number_end(s)) return false;
        end_value(s);
        return step(s, c);
    default:
        return false;
    }
}

bool ddt_json_step(ddt_json_state *s, uint8_t c) {
    ddt_json_state t = *s;
    const uint8_t mode = t.mode;
    if (!step(&t, c)) return false;
    /* a whitespace run ends at any other byte between tokens */
    if (!is_ws(c) || mode == M_STRING) t.ws = 0;
    *s = t;
    return true;
}

bool ddt_json_feed(ddt_json_state *s, const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!ddt_json_step(s, b[i])) return false;
    return true;
}

bool ddt_json_complete(const ddt_json_state *s) {
    if (s->mode == M_DONE) return true;
    return s->depth == 0 && (s->mode == M_NUM_ZERO || s->mode == M_NUM_INT || s->mode == M_NUM_FRAC ||
                             s->mode == M_NUM_EXP);
}
