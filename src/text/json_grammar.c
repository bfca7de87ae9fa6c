/*
 * json_grammar.c — the JSON recogniser of json_grammar.h.
 *
 * Each mode names what the next byte may be.  A number has no closing byte, so
 * a byte that cannot go on a number ends it and is then read again as what
 * follows the value (a comma, a closing bracket, whitespace).
 *
 * A schema (json_schema.h) adds checks at the few places where the grammar
 * decides something: the first byte of a value (its type), a key's bytes (the
 * next property's name), the bytes of an enum string, a number's '.' / 'e' (not
 * in an integer), and ',' / '}' after a property (more due, or all written).
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

/* The schema node of the container being written (depth > 0). */
static const ddt_json_schema_node *top_node(const ddt_json_state *s) {
    return &s->schema->nodes[s->snode[s->depth - 1]];
}

/* The schema node index of the value being written or about to start. */
static uint16_t value_node(const ddt_json_state *s) {
    if (s->depth == 0) return 0;
    const ddt_json_schema_node *n = top_node(s);
    if (n->type == DDT_JS_ARRAY) return n->first;
    return s->schema->prop_node[n->first + s->sidx[s->depth - 1]];
}

/* The name of the property being written (the top container is an object with one due). */
static const ddt_json_schema_str *key_name(const ddt_json_state *s) {
    return &s->schema->names[top_node(s)->first + s->sidx[s->depth - 1]];
}

/* Whether c may be the first byte of a value of schema node n. */
static bool type_allows(const ddt_json_schema_node *n, uint8_t c) {
    switch (n->type) {
    case DDT_JS_OBJECT: return c == '{';
    case DDT_JS_ARRAY: return c == '[';
    case DDT_JS_STRING:
    case DDT_JS_ENUM: return c == '"';
    case DDT_JS_INTEGER:
    case DDT_JS_NUMBER: return c == '-' || is_digit(c);
    case DDT_JS_BOOLEAN: return c == 't' || c == 'f';
    case DDT_JS_NULL: return c == 'n';
    default: return false;
    }
}

/* One byte c of a key or enum string (not its closing quote): matched against the
 * expected name, or the enum's sorted candidates sharing the bytes matched so far. */
static bool match_byte(ddt_json_state *s, uint8_t c) {
    const ddt_json_schema *sc = s->schema;
    if (s->flags & F_KEY) {
        const ddt_json_schema_str *name = key_name(s);
        if (s->spos >= name->len || (uint8_t)sc->bytes[name->off + s->spos] != c) return false;
        s->spos++;
        return true;
    }
    const ddt_json_schema_node *n = &sc->nodes[value_node(s)];
    if (n->type != DDT_JS_ENUM) return true; /* any string */
    const ddt_json_schema_str *v = sc->strs + n->first, *a = &v[s->slo];
    for (uint32_t k = s->slo; k < n->count; k++) {
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

/* Whether a key or enum string may close here: every byte of a name or candidate matched. */
static bool match_close(const ddt_json_state *s) {
    const ddt_json_schema *sc = s->schema;
    if (s->flags & F_KEY) return s->spos == key_name(s)->len;
    const ddt_json_schema_node *n = &sc->nodes[value_node(s)];
    return n->type != DDT_JS_ENUM || sc->strs[n->first + s->slo].len == s->spos;
}

/* ---- the grammar */

/* A value just ended: the top level is complete, or its container goes on (in an
 * object with a schema, at the next property). */
static void end_value(ddt_json_state *s) {
    s->mode = s->depth == 0 ? M_DONE : M_AFTER;
    if (s->schema && top_is_object(s)) s->sidx[s->depth - 1]++;
}

static bool push(ddt_json_state *s, bool object) {
    if (s->depth >= DDT_JSON_MAX_DEPTH) return false; /* json_grammar.h: refused, not grown */
    if (s->schema) {
        /* compile bounds a schema's nesting; this only guards the arrays */
        if (s->depth >= DDT_JSON_SCHEMA_MAX_DEPTH) return false;
        s->snode[s->depth] = value_node(s);
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

/* The first byte of a value. */
static bool start_value(ddt_json_state *s, uint8_t c) {
    if (s->depth == 0 && (s->flags & F_OBJECT_ONLY) && c != '{') return false;
    if (s->schema) {
        if (!type_allows(&s->schema->nodes[value_node(s)], c)) return false;
        s->spos = s->slo = 0;
    }
    switch (c) {
    case '{': return push(s, true);
    case '[': return push(s, false);
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

/* A byte inside a string: the UTF-8 lead bytes set the range of the next byte
 * (Unicode's table of well-formed sequences). */
static bool string_byte(ddt_json_state *s, uint8_t c) {
    if (s->schema) {
        if (c == '"' ? !match_close(s) : !match_byte(s, c)) return false;
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
            pop(s);
            return true;
        }
        return start_value(s, c);
    case M_OBJ_FIRST:
    case M_KEY:
        if (is_ws(c)) return whitespace(s);
        if (c == '}' && s->mode == M_OBJ_FIRST) {
            if (s->schema && top_node(s)->count != 0) return false; /* every property is due */
            pop(s);
            return true;
        }
        if (c != '"') return false;
        if (s->schema && s->sidx[s->depth - 1] >= top_node(s)->count) return false;
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
            /* with a schema, a comma in an object only while properties are due, and '}' after the last */
            if (s->schema && top_is_object(s) && s->sidx[s->depth - 1] >= top_node(s)->count) return false;
            s->mode = top_is_object(s) ? M_KEY : M_VALUE;
            return true;
        }
        if (c == (top_is_object(s) ? '}' : ']')) {
            if (s->schema && top_is_object(s) && s->sidx[s->depth - 1] < top_node(s)->count) return false;
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
        if (++s->sub == 4) s->mode = M_STRING;
        return true;
    case M_UTF8:
        if (c < s->lo || c > s->hi) return false;
        if (s->schema && !match_byte(s, c)) return false;
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
        return true;
    case M_NUM_DOT:
        if (!is_digit(c)) return false;
        s->mode = M_NUM_FRAC;
        return true;
    case M_NUM_E:
        if (c == '+' || c == '-') s->mode = M_NUM_ESIGN;
        else if (is_digit(c)) s->mode = M_NUM_EXP;
        else return false;
        return true;
    case M_NUM_ESIGN:
        if (!is_digit(c)) return false;
        s->mode = M_NUM_EXP;
        return true;
    case M_NUM_ZERO:
    case M_NUM_INT:
    case M_NUM_FRAC:
    case M_NUM_EXP:
        if (is_digit(c) && s->mode != M_NUM_ZERO) return true;
        if (s->schema && (c == '.' || c == 'e' || c == 'E') &&
            s->schema->nodes[value_node(s)].type == DDT_JS_INTEGER)
            return false; /* an integer has neither fraction nor exponent */
        if (c == '.' && (s->mode == M_NUM_ZERO || s->mode == M_NUM_INT)) {
            s->mode = M_NUM_DOT;
            return true;
        }
        if ((c == 'e' || c == 'E') && s->mode != M_NUM_EXP) {
            s->mode = M_NUM_E;
            return true;
        }
        /* the number ends here; c is what follows it */
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
