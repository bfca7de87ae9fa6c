/*
 * jinja.c — the sandboxed Jinja2 subset of jinja.h: a lexer with jinja2's
 * whitespace rules (trim_blocks, lstrip_blocks, "-" and "+" markers), a parser
 * to a read-only syntax tree, and an evaluator over Python-like values whose
 * strings carry a per-byte data/template mask.
 *
 * Layout of this file:
 *   1. arenas, errors and the per-call contexts
 *   2. lexer
 *   3. parser (statements and expressions, jinja2's precedence)
 *   4. values: construction, Python str()/repr(), equality and ordering, JSON
 *   5. evaluator: expressions, attribute and item access, calls, statements
 *   6. filters, tests and methods (name tables)
 *   7. the public functions
 *
 * Memory: the parse owns one arena (the normalised source, the tree); a render
 * owns another (every value, scope and captured text), dropped as a whole at
 * the end.  That is also why errors unwind with longjmp: nothing a render or a
 * parse holds lives outside its arena except the output buffer, which the
 * context owns and frees, so an error anywhere is one jump and one cleanup,
 * and namespaces that refer to themselves cannot leak.
 */
#include "text/jinja.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* ================================================================ 1. arenas, errors */

typedef struct arena_block {
    struct arena_block *next;
    size_t cap, used;
    _Alignas(max_align_t) unsigned char mem[];
} arena_block;

typedef struct arena {
    arena_block *head;
    size_t total; /* bytes obtained from malloc */
    size_t limit;
} arena;

/* NULL when the arena's limit is reached or malloc fails; the caller reports which. */
static void *arena_try(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    arena_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > (64u << 10) ? n : (64u << 10);
        if (a->total + cap > a->limit) return NULL;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->cap = cap;
        b->used = 0;
        b->next = a->head;
        a->head = b;
        a->total += cap;
    }
    void *p = b->mem + b->used;
    b->used += n;
    return p;
}

static void arena_free(arena *a) {
    arena_block *b = a->head;
    while (b) {
        arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
    a->total = 0;
}

/* Line and column (1-based, bytes) of offset pos in the normalised source. */
static void line_col(const char *src, size_t pos, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t i = 0; i < pos; i++) {
        if (src[i] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

/*
 * The error of a parse or a render: "line L, column C: <message>", where src
 * is the normalised source and pos an offset in it; line 1, column 1 when src
 * is NULL (an error that belongs to no node).  Both callers then unwind.
 */
static ddt_status located_fail(ddt_error *err, ddt_status st, const char *src, size_t pos, const char *fmt, va_list ap)
    DDT_PRINTF(5, 0);
static ddt_status located_fail(ddt_error *err, ddt_status st, const char *src, size_t pos, const char *fmt, va_list ap) {
    char msg[DDT_ERROR_MSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    int line = 1, col = 1;
    if (src) line_col(src, pos, &line, &col);
    return ddt_fail(err, st, "line %d, column %d: %s", line, col, msg);
}

/* ================================================================ 2. lexer */

/* Python's str.isspace() for one UTF-8 character at s[i..n): its byte length, or 0. */
static size_t py_space_at(const char *s, size_t i, size_t n) {
    unsigned char c = (unsigned char)s[i];
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
    if (c == 0xc2 && i + 1 < n) {
        unsigned char d = (unsigned char)s[i + 1];
        return (d == 0x85 || d == 0xa0) ? 2 : 0;
    }
    if (i + 2 < n) {
        unsigned char d = (unsigned char)s[i + 1], e = (unsigned char)s[i + 2];
        if (c == 0xe1 && d == 0x9a && e == 0x80) return 3; /* U+1680 */
        if (c == 0xe2 && d == 0x80 && (e <= 0x8a || e == 0xa8 || e == 0xa9 || e == 0xaf)) return 3;
        if (c == 0xe2 && d == 0x81 && e == 0x9f) return 3; /* U+205F */
        if (c == 0xe3 && d == 0x80 && e == 0x80) return 3; /* U+3000 */
    }
    return 0;
}

/* Start of the UTF-8 character that ends just before byte i. */
static size_t utf8_prev(const char *s, size_t i) {
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xc0) == 0x80) j--;
    return j;
}

/* Length of s[0..n) after dropping trailing Python whitespace. */
static size_t py_rstrip_len(const char *s, size_t n) {
    while (n > 0) {
        size_t j = utf8_prev(s, n);
        if (py_space_at(s, j, n) != n - j) break;
        n = j;
    }
    return n;
}

static size_t utf8_len_at(const char *s, size_t i, size_t n) {
    unsigned char c = (unsigned char)s[i];
    size_t l = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    return i + l <= n ? l : n - i;
}

static uint32_t utf8_decode(const char *s, size_t i, size_t n, size_t *len) {
    size_t l = utf8_len_at(s, i, n);
    const unsigned char *u = (const unsigned char *)s + i;
    uint32_t cp = l == 1 ? u[0] : l == 2 ? (u[0] & 0x1fu) : l == 3 ? (u[0] & 0x0fu) : (u[0] & 0x07u);
    for (size_t k = 1; k < l; k++) cp = cp << 6 | (u[k] & 0x3fu);
    *len = l;
    return cp;
}

static size_t utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Strict UTF-8 (no overlongs, no surrogates): the offset of the first bad byte, or n. */
static size_t utf8_check(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t l = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (l == 0 || i + l > n) return i;
        for (size_t k = 1; k < l; k++)
            if (((unsigned char)s[i + k] & 0xc0) != 0x80) return i;
        unsigned char d = (unsigned char)s[i + 1];
        if ((c == 0xe0 && d < 0xa0) || (c == 0xed && d > 0x9f) || (c == 0xf0 && d < 0x90) || (c == 0xf4 && d > 0x8f))
            return i;
        i += l;
    }
    return n;
}

typedef enum tok_type {
    T_EOF,
    T_DATA,        /* text between tags (already whitespace-controlled) */
    T_VAR_BEGIN,   /* {{ */
    T_VAR_END,     /* }} */
    T_BLOCK_BEGIN, /* {% */
    T_BLOCK_END,   /* %} */
    T_NAME,
    T_STRING, /* decoded value in p/n */
    T_INT,
    T_FLOAT,
    T_OP /* p/n: the operator's text */
} tok_type;

typedef struct token {
    tok_type type;
    uint32_t pos; /* offset in the normalised source */
    const char *p;
    size_t n;
    int64_t ival;
    double fval;
} token;

typedef struct parser parser;
static _Noreturn void perr(parser *P, size_t pos, ddt_status st, const char *fmt, ...) DDT_PRINTF(4, 5);

struct node;

struct parser {
    jmp_buf jb;
    ddt_status st;
    ddt_error *err;
    arena *tree; /* the template's arena: source, tree, decoded strings */
    const char *src;
    size_t len;
    token *toks; /* malloc'd, freed by the caller of the parse */
    size_t ntok, captok;
    size_t i; /* current token */
    int depth;
    int loop_depth;  /* break/continue are valid only inside a loop of the same macro */
    struct node *macro; /* macro whose body is being parsed (varargs/kwargs use) */
};

static _Noreturn void perr(parser *P, size_t pos, ddt_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    P->st = located_fail(P->err, st, P->src, pos > P->len ? P->len : pos, fmt, ap);
    va_end(ap);
    longjmp(P->jb, 1);
}

static void *palloc(parser *P, size_t n) {
    void *p = arena_try(P->tree, n);
    if (!p) {
        P->st = ddt_fail(P->err, DDT_ERR_NOMEM, "template: out of memory while parsing");
        longjmp(P->jb, 1);
    }
    memset(p, 0, n);
    return p;
}

static token *push_tok(parser *P, tok_type t, size_t pos, const char *p, size_t n) {
    if (P->ntok == P->captok) {
        size_t cap = P->captok ? P->captok * 2 : 256;
        token *nt = realloc(P->toks, cap * sizeof *nt);
        if (!nt) {
            P->st = ddt_fail(P->err, DDT_ERR_NOMEM, "template: out of memory while lexing");
            longjmp(P->jb, 1);
        }
        P->toks = nt;
        P->captok = cap;
    }
    token *k = &P->toks[P->ntok++];
    memset(k, 0, sizeof *k);
    k->type = t;
    k->pos = (uint32_t)pos;
    k->p = p;
    k->n = n;
    return k;
}

static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool starts(const char *s, size_t i, size_t n, const char *w) {
    size_t l = strlen(w);
    return i + l <= n && memcmp(s + i, w, l) == 0;
}

/* Python's regex \s* over ASCII and Unicode whitespace: the end offset. */
static size_t skip_space(const char *s, size_t i, size_t n) {
    size_t l;
    while (i < n && (l = py_space_at(s, i, n)) > 0) i += l;
    return i;
}

/* Digits with single underscores between them ((\d+_)*\d+): end offset, or i if none. */
static size_t scan_digits(const char *s, size_t i, size_t n) {
    if (i >= n || !is_digit(s[i])) return i;
    size_t j = i;
    while (j < n) {
        if (is_digit(s[j])) {
            j++;
        } else if (s[j] == '_' && j + 1 < n && is_digit(s[j + 1])) {
            j++;
        } else {
            break;
        }
    }
    return j;
}

/* A string literal's body decoded as Python's "unicode-escape" does. */
static void lex_string(parser *P, size_t start, size_t *end) {
    const char *s = P->src;
    char q = s[start];
    size_t i = start + 1;
    while (i < P->len && s[i] != q) i += s[i] == '\\' && i + 1 < P->len ? 2 : 1;
    if (i >= P->len) perr(P, start, DDT_ERR_INVALID, "unterminated string literal");
    size_t body = start + 1, blen = i - body;
    char *out = palloc(P, blen + 1);
    size_t o = 0;
    for (size_t k = body; k < i;) {
        char c = s[k];
        if (c != '\\') {
            out[o++] = c;
            k++;
            continue;
        }
        char e = s[k + 1];
        k += 2;
        uint32_t cp;
        int digits = 0, base = 16;
        switch (e) {
        case 'n': out[o++] = '\n'; continue;
        case 't': out[o++] = '\t'; continue;
        case 'r': out[o++] = '\r'; continue;
        case '\\': out[o++] = '\\'; continue;
        case '\'': out[o++] = '\''; continue;
        case '"': out[o++] = '"'; continue;
        case 'a': out[o++] = '\a'; continue;
        case 'b': out[o++] = '\b'; continue;
        case 'f': out[o++] = '\f'; continue;
        case 'v': out[o++] = '\v'; continue;
        case '\n': continue; /* a backslash-newline joins lines */
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        case 'N': perr(P, k - 2, DDT_ERR_UNSUPPORTED, "\\N{...} escapes are not supported");
        default:
            if (e >= '0' && e <= '7') {
                base = 8;
                digits = 3;
                k--; /* the digit is part of the number */
                break;
            }
            /* unknown escapes keep their backslash, as Python does */
            out[o++] = '\\';
            k--;
            continue;
        }
        cp = 0;
        int got = 0;
        while (got < digits && k < i) {
            char d = s[k];
            int v = d >= '0' && d <= '9' ? d - '0' : d >= 'a' && d <= 'f' ? d - 'a' + 10 : d >= 'A' && d <= 'F' ? d - 'A' + 10 : 99;
            if (v >= base) break;
            cp = cp * (uint32_t)base + (uint32_t)v;
            got++;
            k++;
        }
        if (base == 16 && got < digits) perr(P, k, DDT_ERR_INVALID, "truncated \\%c escape in a string literal", e);
        if (cp > 0x10ffff) perr(P, k, DDT_ERR_INVALID, "escape past U+10FFFF in a string literal");
        if (cp >= 0xd800 && cp <= 0xdfff) perr(P, k, DDT_ERR_UNSUPPORTED, "surrogate escapes are not supported");
        o += utf8_encode(cp, out + o);
    }
    token *t = push_tok(P, T_STRING, start, out, o);
    (void)t;
    *end = i + 1;
}

static const char *const OPS2[] = {"//", "**", "==", "!=", ">=", "<="};
static const char OPS1[] = "+-/*%~[](){}><=.:|,;";

/*
 * The end of a tag whose closer ("%}", "#}" or "}}") starts at s[i], possibly
 * after a "-" or "+" marker; 0 when none does.  Blocks, comments and endraw
 * share jinja2's rules: "-" eats the whitespace after the tag, "+" keeps it,
 * and a plain closer eats one newline (trim_blocks).  A {{ }} tag has no "+"
 * form and trim_blocks leaves it alone.  *line_start is set only on a match:
 * whether the tag ended a line, so that lstrip_blocks applies to the next one.
 */
static size_t tag_close(const char *s, size_t i, size_t n, const char *closer, bool *line_start) {
    bool var = closer[0] == '}';
    if (i < n && s[i] == '-' && starts(s, i + 1, n, closer)) {
        size_t e = skip_space(s, i + 3, n);
        *line_start = e > i + 3 && s[e - 1] == '\n';
        return e;
    }
    if (!var && i < n && s[i] == '+' && starts(s, i + 1, n, closer)) {
        *line_start = false;
        return i + 3;
    }
    if (starts(s, i, n, closer)) {
        size_t e = i + 2;
        if (!var && e < n && s[e] == '\n') e++;
        *line_start = !var && s[e - 1] == '\n';
        return e;
    }
    return 0;
}

/*
 * Tokens of one {{ }} or {% %} tag starting at i (after the opener); returns
 * the offset after the closing tag and sets *line_start when the close
 * consumed a trailing newline (lstrip_blocks then applies to the next tag).
 */
static size_t lex_tag(parser *P, size_t i, bool block, bool *line_start) {
    const char *s = P->src;
    size_t n = P->len;
    char stack[DDT_JINJA_MAX_DEPTH];
    int depth = 0;
    size_t open = i;
    for (;;) {
        if (i >= n) perr(P, open, DDT_ERR_INVALID, "unexpected end of template: the tag opened here is not closed");
        if (depth == 0) {
            size_t e = tag_close(s, i, n, block ? "%}" : "}}", line_start);
            if (e) {
                push_tok(P, block ? T_BLOCK_END : T_VAR_END, i, NULL, 0);
                return e;
            }
        }
        size_t w = skip_space(s, i, n);
        if (w > i) {
            i = w;
            continue;
        }
        char c = s[i];
        /* float: digits then a fraction and/or an exponent, not right after a '.' */
        if (is_digit(c) && !(i > 0 && s[i - 1] == '.')) {
            size_t j = scan_digits(s, i, n);
            size_t f = j;
            bool isf = false;
            if (f < n && s[f] == '.' && scan_digits(s, f + 1, n) > f + 1) {
                f = scan_digits(s, f + 1, n);
                isf = true;
            }
            if (f < n && (s[f] == 'e' || s[f] == 'E')) {
                size_t g = f + 1;
                if (g < n && (s[g] == '+' || s[g] == '-')) g++;
                size_t h = scan_digits(s, g, n);
                if (h > g) {
                    f = h;
                    isf = true;
                }
            }
            if (isf) {
                char buf[128];
                size_t o = 0;
                for (size_t k = i; k < f && o + 1 < sizeof buf; k++)
                    if (s[k] != '_') buf[o++] = s[k];
                buf[o] = '\0';
                token *t = push_tok(P, T_FLOAT, i, s + i, f - i);
                t->fval = strtod(buf, NULL);
                i = f;
                continue;
            }
        }
        if (is_digit(c)) {
            size_t j = i;
            int base = 10;
            if (c == '0' && i + 1 < n && (s[i + 1] == 'x' || s[i + 1] == 'X' || s[i + 1] == 'o' || s[i + 1] == 'O' ||
                                           s[i + 1] == 'b' || s[i + 1] == 'B')) {
                char b = (char)(s[i + 1] | 0x20);
                base = b == 'x' ? 16 : b == 'o' ? 8 : 2;
                j = i + 2;
            }
            uint64_t v = 0;
            bool over = false;
            size_t digits = 0;
            if (base == 10 && c == '0') {
                /* 0(_?0)*: a leading zero takes only zeros */
                j = i + 1;
                while (j < n && (s[j] == '0' || (s[j] == '_' && j + 1 < n && s[j + 1] == '0'))) j++;
                digits = 1;
            } else {
                while (j < n) {
                    char d = s[j];
                    if (d == '_' && j + 1 < n && s[j + 1] != '_' && (digits > 0 || base != 10)) {
                        j++;
                        continue;
                    }
                    int dv = d >= '0' && d <= '9' ? d - '0' : (d | 0x20) >= 'a' && (d | 0x20) <= 'f' ? (d | 0x20) - 'a' + 10 : 99;
                    if (dv >= base) break;
                    if (v > (UINT64_MAX - (uint64_t)dv) / (uint64_t)base) over = true;
                    v = v * (uint64_t)base + (uint64_t)dv;
                    digits++;
                    j++;
                }
            }
            if (digits == 0) perr(P, i, DDT_ERR_INVALID, "malformed number literal");
            if (over || v > (uint64_t)INT64_MAX) perr(P, i, DDT_ERR_RANGE, "integer literal out of the 64-bit range");
            token *t = push_tok(P, T_INT, i, s + i, j - i);
            t->ival = (int64_t)v;
            i = j;
            continue;
        }
        if (is_name_start(c)) {
            size_t j = i + 1;
            while (j < n && is_name_char(s[j])) j++;
            push_tok(P, T_NAME, i, s + i, j - i);
            i = j;
            continue;
        }
        if (c == '\'' || c == '"') {
            lex_string(P, i, &i);
            continue;
        }
        size_t ol = 0;
        for (size_t k = 0; k < sizeof OPS2 / sizeof OPS2[0]; k++)
            if (starts(s, i, n, OPS2[k])) ol = 2;
        if (ol == 0 && c != '\0' && strchr(OPS1, c)) ol = 1;
        if (ol == 0) {
            if ((unsigned char)c < 0x20 || (unsigned char)c >= 0x7f)
                perr(P, i, DDT_ERR_INVALID, "unexpected character (byte 0x%02x) in a tag", (unsigned char)c);
            perr(P, i, DDT_ERR_INVALID, "unexpected character '%c' in a tag", c);
        }
        if (ol == 1 && (c == '(' || c == '[' || c == '{')) {
            if (depth >= DDT_JINJA_MAX_DEPTH) perr(P, i, DDT_ERR_RANGE, "brackets nested deeper than %d", DDT_JINJA_MAX_DEPTH);
            stack[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (ol == 1 && (c == ')' || c == ']' || c == '}')) {
            if (depth == 0) perr(P, i, DDT_ERR_INVALID, "unexpected '%c'", c);
            if (stack[depth - 1] != c) perr(P, i, DDT_ERR_INVALID, "unexpected '%c', expected '%c'", c, stack[depth - 1]);
            depth--;
        }
        push_tok(P, T_OP, i, s + i, ol);
        i += ol;
    }
}

/* Applies lstrip_blocks / "-" to the text before a tag and emits it. */
static void emit_text(parser *P, size_t from, size_t to, char sign, bool lstrip, bool line_start) {
    const char *s = P->src;
    size_t n = to - from;
    if (sign == '-') {
        n = py_rstrip_len(s + from, n);
    } else if (sign != '+' && lstrip) {
        size_t l = n;
        while (l > 0 && s[from + l - 1] != '\n') l--;
        if (l > 0 || line_start) {
            bool blank = true;
            for (size_t k = from + l; k < to; k++)
                if (s[k] != ' ' && s[k] != '\t') blank = false;
            if (blank) n = l;
        }
    }
    if (n > 0) push_tok(P, T_DATA, from, s + from, n);
}

static void lex(parser *P) {
    const char *s = P->src;
    size_t n = P->len, i = 0;
    bool line_start = true;
    while (i < n) {
        size_t t = i;
        while (t + 1 < n && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= n) {
            push_tok(P, T_DATA, i, s + i, n - i);
            break;
        }
        char kind = s[t + 1];
        char sign = t + 2 < n && (s[t + 2] == '-' || s[t + 2] == '+') ? s[t + 2] : 0;
        size_t after = t + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            emit_text(P, i, t, sign, true, line_start);
            size_t j = after;
            for (;; j++) {
                if (j + 1 >= n) perr(P, t, DDT_ERR_INVALID, "missing end of comment tag");
                size_t e = tag_close(s, j, n, "#}", &line_start);
                if (e) {
                    i = e;
                    break;
                }
            }
            continue;
        }
        if (kind == '%') {
            /* {% raw %} ... {% endraw %}: the body is text, taken as is */
            size_t r = skip_space(s, after, n);
            if (starts(s, r, n, "raw")) {
                size_t e = skip_space(s, r + 3, n);
                size_t body = 0;
                if (starts(s, e, n, "-%}")) body = skip_space(s, e + 3, n);
                else if (starts(s, e, n, "%}")) body = e + 2;
                if (body) {
                    emit_text(P, i, t, sign, true, line_start);
                    bool ls = s[body - 1] == '\n';
                    size_t j = body;
                    for (;; j++) {
                        if (j + 1 >= n) perr(P, t, DDT_ERR_INVALID, "missing end of raw directive");
                        if (s[j] != '{' || s[j + 1] != '%') continue;
                        char esign = j + 2 < n && (s[j + 2] == '-' || s[j + 2] == '+') ? s[j + 2] : 0;
                        size_t k = skip_space(s, j + 2 + (esign ? 1 : 0), n);
                        if (!starts(s, k, n, "endraw")) continue;
                        k = skip_space(s, k + 6, n);
                        bool nls = false;
                        size_t end = tag_close(s, k, n, "%}", &nls);
                        if (!end) continue;
                        emit_text(P, body, j, esign, true, ls);
                        i = end;
                        line_start = nls;
                        break;
                    }
                    continue;
                }
            }
        }
        emit_text(P, i, t, sign, kind == '%', line_start);
        push_tok(P, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, t, NULL, 0);
        i = lex_tag(P, after, kind == '%', &line_start);
    }
    push_tok(P, T_EOF, n, NULL, 0);
}

/* ================================================================ 3. parser */

typedef enum node_kind {
    /* statements */
    N_BODY, /* items: statements */
    N_TEXT, /* str */
    N_OUTPUT, /* a: expression */
    N_IF,     /* items: conditions, items2: bodies, c: else body */
    N_FOR,    /* a: target, b: iterable, c: filter, d: body, e: else body */
    N_SET,    /* a: target, b: value */
    N_SETBLOCK, /* a: target, d: body, c: filters over N_CAPTURED or NULL */
    N_FILTERBLOCK, /* d: body, c: filters over N_CAPTURED */
    N_MACRO,  /* str: name, items: parameters (N_NAME), items2: defaults, d: body */
    N_BREAK,
    N_CONTINUE,
    /* expressions */
    N_CONST, /* val */
    N_NAME,  /* str */
    N_TUPLE, /* items */
    N_LIST,  /* items */
    N_DICT,  /* items: keys, items2: values */
    N_GETATTR, /* a: object, str: attribute */
    N_GETITEM, /* a: object, b: key */
    N_SLICE,   /* a: object, b: start, c: stop, d: step (each may be NULL) */
    N_CALL,    /* a: callee, items: positional, items2: keyword values, names */
    N_FILTER,  /* str: filter name, a: input, arguments as N_CALL */
    N_TEST,    /* str: test name, a: input, arguments as N_CALL, op: 1 when negated */
    N_BINOP,   /* op, a, b */
    N_UNARY,   /* op, a */
    N_AND,
    N_OR,
    N_COMPARE, /* a: first operand, items: other operands, ops */
    N_COND,    /* a: test, b: value when true, c: value when false (or NULL) */
    N_CAPTURED /* the text a set or filter block captured */
} node_kind;

enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT, OP_NEG, OP_POS, OP_NOT,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

/* A string slice: pointer and length, not NUL-terminated. */
typedef struct sref {
    const char *p;
    size_t n;
} sref;

/* ---- values (declared here: constants live in the tree) */

typedef enum vtype { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_MACRO, V_FUNC,
                     V_METHOD, V_LOOP } vtype;

enum {
    F_DATA = 1,   /* scalar: from the data context; string without mask: every byte is data;
                     container: something inside is data */
    F_MARKUP = 2, /* string marked safe (markupsafe.Markup): '+' escapes its str operand */
    F_TUPLE = 4,  /* a list that prints as a tuple */
    F_UNSAFE = 8  /* undefined standing for a method the sandbox refuses */
};

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct scope scope;
typedef struct loopstate loopstate;
typedef struct node node;

typedef struct jv {
    uint8_t t;
    uint8_t f;
    uint16_t id; /* V_FUNC / V_METHOD: which */
    union {
        int64_t i;
        double d;
        struct {
            const char *p;
            const uint8_t *m; /* per-byte data flags, or NULL (then F_DATA says all or none) */
            size_t n;
        } s; /* V_STR; V_UNDEF keeps its name here */
        jlist *l;
        jdict *dict; /* V_DICT, V_NS */
        struct {
            const node *def;
            scope *sc;
        } mac;
        struct {
            struct jv *self; /* V_METHOD: the bound object */
        } meth;
        loopstate *loop;
    } u;
} jv;

struct jlist {
    size_t n;
    jv *v;
};

struct jdict {
    size_t n, cap;
    jv *k, *v;
};

struct node {
    uint8_t kind;
    uint8_t op;
    uint8_t flags; /* N_MACRO: 1 uses varargs, 2 uses kwargs; N_FOR: 1 the body uses loop.nextitem etc. */
    uint32_t pos;
    sref str;
    node *a, *b, *c, *d, *e;
    node **items, **items2;
    size_t n, n2;
    sref *names; /* N_CALL/N_FILTER/N_TEST: keyword names (n2 of them) */
    uint8_t *ops;   /* N_COMPARE */
    jv val;         /* N_CONST */
};

typedef struct nodevec {
    node **v;
    size_t n, cap;
} nodevec;

/* Node vectors grow in malloc'd memory while a list is parsed, then move to the arena. */
static void nv_push(parser *P, nodevec *nv, node *x) {
    if (nv->n == nv->cap) {
        size_t cap = nv->cap ? nv->cap * 2 : 8;
        node **v = palloc(P, cap * sizeof *v);
        if (nv->n) memcpy(v, nv->v, nv->n * sizeof *v);
        nv->v = v;
        nv->cap = cap;
    }
    nv->v[nv->n++] = x;
}

static node *mk(parser *P, node_kind k, size_t pos) {
    node *x = palloc(P, sizeof *x);
    x->kind = (uint8_t)k;
    x->pos = (uint32_t)pos;
    return x;
}

static token *cur(parser *P) { return &P->toks[P->i]; }
static token *peek_tok(parser *P, size_t k) {
    size_t j = P->i + k;
    return &P->toks[j < P->ntok ? j : P->ntok - 1];
}
static void adv(parser *P) {
    if (P->i + 1 < P->ntok) P->i++;
}
static bool sref_is(sref s, const char *w) { return s.n == strlen(w) && memcmp(s.p, w, s.n) == 0; }
static bool tok_is_op(const token *t, const char *op) { return t->type == T_OP && sref_is((sref){t->p, t->n}, op); }
static bool tok_is_name(const token *t, const char *w) { return t->type == T_NAME && sref_is((sref){t->p, t->n}, w); }

static const char *tok_desc(const token *t, char *buf, size_t cap) {
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_DATA: return "template text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_STRING: return "a string";
    case T_INT:
    case T_FLOAT: return "a number";
    default: break;
    }
    int len = t->n > 40 ? 40 : (int)t->n;
    snprintf(buf, cap, "'%.*s'", len, t->p);
    return buf;
}

static _Noreturn void unexpected(parser *P, const char *wanted) {
    char b[64];
    token *t = cur(P);
    perr(P, t->pos, DDT_ERR_INVALID, "unexpected %s, expected %s", tok_desc(t, b, sizeof b), wanted);
}

static void expect_op(parser *P, const char *op) {
    if (!tok_is_op(cur(P), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(P, w);
    }
    adv(P);
}

static sref expect_name(parser *P) {
    token *t = cur(P);
    if (t->type != T_NAME) unexpected(P, "a name");
    adv(P);
    return (sref){t->p, t->n};
}

static void expect_block_end(parser *P) {
    if (cur(P)->type != T_BLOCK_END) unexpected(P, "'%}'");
    adv(P);
}

/*
 * Before each item of a bracketed, comma-separated list (call arguments, a
 * list or dict literal, a subscript), n items in: false at the closing
 * bracket, which a trailing comma may precede; else past the comma.
 */
static bool list_more(parser *P, size_t n, const char *close) {
    if (tok_is_op(cur(P), close)) return false;
    if (n == 0) return true;
    expect_op(P, ",");
    return !tok_is_op(cur(P), close);
}

static void enter(parser *P) {
    if (++P->depth > DDT_JINJA_MAX_DEPTH)
        perr(P, cur(P)->pos, DDT_ERR_RANGE, "template nested deeper than %d levels", DDT_JINJA_MAX_DEPTH);
}
static void leave(parser *P) { P->depth--; }

static int find_filter(const char *name, size_t n);
static int find_test(const char *name, size_t n);
enum { NO_SUCH = 255 }; /* N_FILTER / N_TEST op of an unknown name */
static node *parse_expr(parser *P, bool condexpr);
static node *parse_tuple(parser *P, bool condexpr, bool explicit_parens, const char *const *end_names);
static node *parse_unary(parser *P, bool with_filter);
static node *parse_or(parser *P);
static node *parse_postfix_filters(parser *P, node *x, bool with_filter);

static bool is_reserved_const(sref s, jv *out) {
    if (sref_is(s, "true") || sref_is(s, "True")) {
        *out = (jv){.t = V_BOOL, .u.i = 1};
        return true;
    }
    if (sref_is(s, "false") || sref_is(s, "False")) {
        *out = (jv){.t = V_BOOL, .u.i = 0};
        return true;
    }
    if (sref_is(s, "none") || sref_is(s, "None")) {
        *out = (jv){.t = V_NONE};
        return true;
    }
    return false;
}

/* Positional and keyword arguments of a call, a filter or a test, after the '('. */
static void parse_call_args(parser *P, node *x) {
    nodevec pos = {0}, kw = {0};
    size_t nk = 0, capk = 0;
    sref *names = NULL;
    expect_op(P, "(");
    while (list_more(P, pos.n + kw.n, ")")) {
        if (tok_is_op(cur(P), "*") || tok_is_op(cur(P), "**"))
            perr(P, cur(P)->pos, DDT_ERR_UNSUPPORTED, "*args and **kwargs in calls are not supported");
        if (cur(P)->type == T_NAME && tok_is_op(peek_tok(P, 1), "=")) {
            sref k = expect_name(P);
            adv(P);
            if (nk == capk) {
                capk = capk ? capk * 2 : 4;
                sref *nn = palloc(P, capk * sizeof *nn);
                if (nk) memcpy(nn, names, nk * sizeof *nn);
                names = nn;
            }
            names[nk++] = k;
            nv_push(P, &kw, parse_expr(P, true));
        } else {
            if (kw.n > 0) perr(P, cur(P)->pos, DDT_ERR_INVALID, "a positional argument follows a keyword argument");
            nv_push(P, &pos, parse_expr(P, true));
        }
    }
    adv(P);
    x->items = pos.v;
    x->n = pos.n;
    x->items2 = kw.v;
    x->n2 = kw.n;
    x->names = names;
}

static node *parse_primary(parser *P) {
    token *t = cur(P);
    node *x;
    switch (t->type) {
    case T_NAME: {
        sref s = {t->p, t->n};
        adv(P);
        x = mk(P, N_CONST, t->pos);
        if (is_reserved_const(s, &x->val)) return x;
        x->kind = N_NAME;
        x->str = s;
        if (P->macro && sref_is(s, "varargs")) P->macro->flags |= 1;
        if (P->macro && sref_is(s, "kwargs")) P->macro->flags |= 2;
        return x;
    }
    case T_STRING: {
        /* adjacent literals join, as in Python */
        size_t total = 0, j = P->i;
        while (P->toks[j].type == T_STRING) total += P->toks[j++].n;
        char *buf = palloc(P, total + 1);
        size_t o = 0;
        while (cur(P)->type == T_STRING) {
            memcpy(buf + o, cur(P)->p, cur(P)->n);
            o += cur(P)->n;
            adv(P);
        }
        x = mk(P, N_CONST, t->pos);
        x->val = (jv){.t = V_STR, .u.s = {buf, NULL, total}};
        return x;
    }
    case T_INT:
        adv(P);
        x = mk(P, N_CONST, t->pos);
        x->val = (jv){.t = V_INT, .u.i = t->ival};
        return x;
    case T_FLOAT:
        adv(P);
        x = mk(P, N_CONST, t->pos);
        x->val = (jv){.t = V_FLOAT, .u.d = t->fval};
        return x;
    case T_OP:
        if (tok_is_op(t, "(")) {
            adv(P);
            x = parse_tuple(P, true, true, NULL);
            expect_op(P, ")");
            return x;
        }
        if (tok_is_op(t, "[")) {
            adv(P);
            nodevec items = {0};
            while (list_more(P, items.n, "]")) nv_push(P, &items, parse_expr(P, true));
            adv(P);
            x = mk(P, N_LIST, t->pos);
            x->items = items.v;
            x->n = items.n;
            return x;
        }
        if (tok_is_op(t, "{")) {
            adv(P);
            nodevec ks = {0}, vs = {0};
            while (list_more(P, ks.n, "}")) {
                nv_push(P, &ks, parse_expr(P, true));
                expect_op(P, ":");
                nv_push(P, &vs, parse_expr(P, true));
            }
            adv(P);
            x = mk(P, N_DICT, t->pos);
            x->items = ks.v;
            x->items2 = vs.v;
            x->n = x->n2 = ks.n;
            return x;
        }
        break;
    default: break;
    }
    unexpected(P, "an expression");
}

/* One subscript: an expression or a slice a:b:c (parts optional). */
static node *parse_subscribed(parser *P, node *obj, size_t pos, bool *is_slice) {
    node *parts[3] = {NULL, NULL, NULL};
    *is_slice = false;
    if (!tok_is_op(cur(P), ":")) {
        parts[0] = parse_expr(P, true);
        if (!tok_is_op(cur(P), ":")) return parts[0];
    }
    *is_slice = true;
    adv(P); /* ':' */
    if (!tok_is_op(cur(P), "]") && !tok_is_op(cur(P), ",") && !tok_is_op(cur(P), ":")) parts[1] = parse_expr(P, true);
    if (tok_is_op(cur(P), ":")) {
        adv(P);
        if (!tok_is_op(cur(P), "]") && !tok_is_op(cur(P), ",")) parts[2] = parse_expr(P, true);
    }
    node *x = mk(P, N_SLICE, pos);
    x->a = obj;
    x->b = parts[0];
    x->c = parts[1];
    x->d = parts[2];
    return x;
}

/* The name of a filter or a test: a dotted one ("a.b") names none here, so it fails when evaluated. */
static sref parse_dotted_name(parser *P) {
    sref name = expect_name(P);
    while (tok_is_op(cur(P), ".")) {
        adv(P);
        sref more = expect_name(P);
        name.n = (size_t)(more.p + more.n - name.p);
    }
    return name;
}

static node *parse_filter(parser *P, node *x) {
    /* after '|' */
    token *t = cur(P);
    sref name = parse_dotted_name(P);
    /* an unknown name fails when evaluated: jinja2 accepts one inside an if block that is never taken */
    int id = find_filter(name.p, name.n);
    node *f = mk(P, N_FILTER, t->pos);
    f->str = name;
    f->op = (uint8_t)(id < 0 ? NO_SUCH : id);
    f->a = x;
    if (tok_is_op(cur(P), "(")) parse_call_args(P, f);
    return f;
}

static node *parse_test(parser *P, node *x) {
    /* after 'is' */
    token *t = cur(P);
    node *f = mk(P, N_TEST, t->pos);
    if (tok_is_name(cur(P), "not")) {
        adv(P);
        f->flags = 1;
    }
    f->str = parse_dotted_name(P);
    int id = find_test(f->str.p, f->str.n);
    f->op = (uint8_t)(id < 0 ? NO_SUCH : id);
    f->a = x;
    token *u = cur(P);
    if (tok_is_op(u, "(")) {
        parse_call_args(P, f);
    } else if ((u->type == T_NAME || u->type == T_STRING || u->type == T_INT || u->type == T_FLOAT ||
                tok_is_op(u, "[") || tok_is_op(u, "{")) &&
               !(tok_is_name(u, "else") || tok_is_name(u, "or") || tok_is_name(u, "and"))) {
        /* `x is divisibleby 3`: one argument without parentheses */
        if (tok_is_name(u, "is")) perr(P, u->pos, DDT_ERR_INVALID, "unexpected 'is' after a test");
        node *arg = parse_primary(P);
        arg = parse_postfix_filters(P, arg, false);
        f->items = palloc(P, sizeof *f->items);
        f->items[0] = arg;
        f->n = 1;
    }
    return f;
}

/* Attribute access, subscripts and calls after a primary; then filters and tests. */
static void chain_step(parser *P, int *len);

/* x(...): t is the '(' token. */
static node *parse_call(parser *P, node *x, const token *t) {
    node *c = mk(P, N_CALL, t->pos);
    c->a = x;
    parse_call_args(P, c);
    return c;
}

static node *parse_postfix_filters(parser *P, node *x, bool with_filter) {
    int len = 0;
    for (;; chain_step(P, &len)) {
        token *t = cur(P);
        if (tok_is_op(t, ".")) {
            adv(P);
            token *u = cur(P);
            if (u->type == T_NAME) {
                node *g = mk(P, N_GETATTR, t->pos);
                g->a = x;
                g->str = (sref){u->p, u->n};
                adv(P);
                x = g;
            } else if (u->type == T_INT) {
                node *g = mk(P, N_GETITEM, t->pos);
                g->a = x;
                g->b = mk(P, N_CONST, u->pos);
                g->b->val = (jv){.t = V_INT, .u.i = u->ival};
                adv(P);
                x = g;
            } else {
                unexpected(P, "an attribute name");
            }
        } else if (tok_is_op(t, "[")) {
            adv(P);
            nodevec idx = {0};
            node *single = NULL;
            while (list_more(P, idx.n, "]")) {
                bool sl;
                node *s = parse_subscribed(P, x, t->pos, &sl);
                if (sl) {
                    if (idx.n) perr(P, t->pos, DDT_ERR_UNSUPPORTED, "slices inside a tuple subscript are not supported");
                    single = s;
                    if (!tok_is_op(cur(P), "]")) unexpected(P, "']'");
                    break;
                }
                nv_push(P, &idx, s);
            }
            if (!single && idx.n == 0) unexpected(P, "a subscript");
            adv(P);
            if (single) {
                x = single;
            } else {
                node *g = mk(P, N_GETITEM, t->pos);
                g->a = x;
                if (idx.n == 1) {
                    g->b = idx.v[0];
                } else {
                    g->b = mk(P, N_TUPLE, t->pos);
                    g->b->items = idx.v;
                    g->b->n = idx.n;
                }
                x = g;
            }
        } else if (tok_is_op(t, "(")) {
            x = parse_call(P, x, t);
        } else {
            break;
        }
    }
    /* after a filter or a test only calls, filters and tests follow (jinja2's parse_filter_expr) */
    for (; with_filter; chain_step(P, &len)) {
        token *t = cur(P);
        if (tok_is_op(t, "|")) {
            adv(P);
            x = parse_filter(P, x);
        } else if (tok_is_name(t, "is")) {
            adv(P);
            x = parse_test(P, x);
        } else if (tok_is_op(t, "(")) {
            x = parse_call(P, x, t);
        } else {
            break;
        }
    }
    return x;
}

static node *parse_unary(parser *P, bool with_filter) {
    enter(P);
    token *t = cur(P);
    node *x;
    if (tok_is_op(t, "-") || tok_is_op(t, "+")) {
        adv(P);
        x = mk(P, N_UNARY, t->pos);
        x->op = t->p[0] == '-' ? OP_NEG : OP_POS;
        x->a = parse_unary(P, false);
    } else {
        x = parse_primary(P);
    }
    /* jinja2 applies postfix operators, then (when allowed) filters and tests, to the whole unary */
    x = parse_postfix_filters(P, x, with_filter);
    leave(P);
    return x;
}

/* Left-deep chains (a + b + c ...) are bounded too: evaluation recurses along them. */
static void chain_step(parser *P, int *len) {
    if (++*len > DDT_JINJA_MAX_DEPTH)
        perr(P, cur(P)->pos, DDT_ERR_RANGE, "expression chain longer than %d operands", DDT_JINJA_MAX_DEPTH);
}

/* One operator of a left-associative level: its token, and the node it builds. */
typedef struct chain_op {
    const char *text; /* NULL ends a level's list */
    bool keyword; /* a name token ("and"), not an operator token ("+") */
    uint8_t kind, op;
} chain_op;

/* One level of jinja2's binary operators: operands from `next`, joined left to right by any of ops. */
static node *parse_chain(parser *P, node *(*next)(parser *), const chain_op *ops) {
    node *x = next(P);
    int len = 0;
    for (;;) {
        token *t = cur(P);
        const chain_op *o = ops;
        while (o->text && !(o->keyword ? tok_is_name(t, o->text) : tok_is_op(t, o->text))) o++;
        if (!o->text) return x;
        adv(P);
        chain_step(P, &len);
        node *y = mk(P, o->kind, t->pos);
        y->op = o->op;
        y->a = x;
        y->b = next(P);
        x = y;
    }
}

/* The operands of '**' as parse_chain() takes a level: unary expressions that may carry filters. */
static node *parse_unary_filtered(parser *P) { return parse_unary(P, true); }

static node *parse_pow(parser *P) {
    static const chain_op ops[] = {{"**", false, N_BINOP, OP_POW}, {0}};
    return parse_chain(P, parse_unary_filtered, ops);
}

static node *parse_math2(parser *P) {
    static const chain_op ops[] = {{"*", false, N_BINOP, OP_MUL}, {"/", false, N_BINOP, OP_DIV},
                                   {"//", false, N_BINOP, OP_FLOORDIV}, {"%", false, N_BINOP, OP_MOD}, {0}};
    return parse_chain(P, parse_pow, ops);
}

static node *parse_concat(parser *P) {
    static const chain_op ops[] = {{"~", false, N_BINOP, OP_CONCAT}, {0}};
    return parse_chain(P, parse_math2, ops);
}

static node *parse_math1(parser *P) {
    static const chain_op ops[] = {{"+", false, N_BINOP, OP_ADD}, {"-", false, N_BINOP, OP_SUB}, {0}};
    return parse_chain(P, parse_concat, ops);
}

static node *parse_compare(parser *P) {
    size_t pos = cur(P)->pos;
    node *first = parse_math1(P);
    nodevec rest = {0};
    uint8_t opsbuf[DDT_JINJA_MAX_DEPTH];
    for (;;) {
        token *t = cur(P);
        int op = 0;
        if (tok_is_op(t, "==")) op = OP_EQ;
        else if (tok_is_op(t, "!=")) op = OP_NE;
        else if (tok_is_op(t, "<")) op = OP_LT;
        else if (tok_is_op(t, "<=")) op = OP_LE;
        else if (tok_is_op(t, ">")) op = OP_GT;
        else if (tok_is_op(t, ">=")) op = OP_GE;
        else if (tok_is_name(t, "in")) op = OP_IN;
        else if (tok_is_name(t, "not") && tok_is_name(peek_tok(P, 1), "in")) {
            op = OP_NOTIN;
            adv(P);
        }
        if (!op) break;
        adv(P);
        if (rest.n >= DDT_JINJA_MAX_DEPTH) perr(P, t->pos, DDT_ERR_RANGE, "comparison chain too long");
        opsbuf[rest.n] = (uint8_t)op;
        nv_push(P, &rest, parse_math1(P));
    }
    if (rest.n == 0) return first;
    node *x = mk(P, N_COMPARE, pos);
    x->a = first;
    x->items = rest.v;
    x->n = rest.n;
    x->ops = palloc(P, rest.n);
    memcpy(x->ops, opsbuf, rest.n);
    return x;
}

static node *parse_not(parser *P) {
    token *t = cur(P);
    if (tok_is_name(t, "not")) {
        enter(P);
        adv(P);
        node *x = mk(P, N_UNARY, t->pos);
        x->op = OP_NOT;
        x->a = parse_not(P);
        leave(P);
        return x;
    }
    return parse_compare(P);
}

static node *parse_and(parser *P) {
    static const chain_op ops[] = {{"and", true, N_AND, 0}, {0}};
    return parse_chain(P, parse_not, ops);
}

static node *parse_or(parser *P) {
    static const chain_op ops[] = {{"or", true, N_OR, 0}, {0}};
    return parse_chain(P, parse_and, ops);
}

static node *parse_expr(parser *P, bool condexpr) {
    enter(P);
    node *x = parse_or(P);
    int len = 0;
    while (condexpr && tok_is_name(cur(P), "if")) {
        size_t pos = cur(P)->pos;
        adv(P);
        chain_step(P, &len);
        node *c = mk(P, N_COND, pos);
        c->b = x;
        c->a = parse_or(P);
        if (tok_is_name(cur(P), "else")) {
            adv(P);
            c->c = parse_expr(P, true);
        }
        x = c;
    }
    leave(P);
    return x;
}

static bool at_tuple_end(parser *P, const char *const *end_names) {
    token *t = cur(P);
    if (t->type == T_VAR_END || t->type == T_BLOCK_END || t->type == T_EOF || tok_is_op(t, ")")) return true;
    for (; end_names && *end_names; end_names++)
        if (tok_is_name(t, *end_names)) return true;
    return false;
}

/* An expression, or a tuple of them when commas follow (jinja2's parse_tuple). */
static node *parse_tuple(parser *P, bool condexpr, bool explicit_parens, const char *const *end_names) {
    size_t pos = cur(P)->pos;
    nodevec items = {0};
    bool comma = false;
    for (;;) {
        if (items.n) expect_op(P, ",");
        if (at_tuple_end(P, end_names)) break;
        nv_push(P, &items, parse_expr(P, condexpr));
        if (tok_is_op(cur(P), ",")) comma = true;
        else break;
    }
    if (!comma) {
        if (items.n) return items.v[0];
        if (!explicit_parens) unexpected(P, "an expression");
    }
    node *x = mk(P, N_TUPLE, pos);
    x->items = items.v;
    x->n = items.n;
    return x;
}

/* Assignment target: a name, a namespace attribute (when allowed), or names in a tuple. */
static node *parse_target(parser *P, bool allow_attr, const char *const *end_names) {
    size_t pos = cur(P)->pos;
    if (allow_attr && cur(P)->type == T_NAME && tok_is_op(peek_tok(P, 1), ".")) {
        node *g = mk(P, N_GETATTR, pos);
        g->a = mk(P, N_NAME, pos);
        g->a->str = expect_name(P);
        adv(P);
        g->str = expect_name(P);
        return g;
    }
    nodevec items = {0};
    bool comma = false;
    for (;;) {
        if (items.n) expect_op(P, ",");
        if (at_tuple_end(P, end_names) || tok_is_op(cur(P), "=") || tok_is_op(cur(P), "|")) break;
        node *x;
        if (tok_is_op(cur(P), "(")) {
            enter(P);
            adv(P);
            x = parse_target(P, false, NULL);
            expect_op(P, ")");
            leave(P);
        } else {
            x = mk(P, N_NAME, cur(P)->pos);
            x->str = expect_name(P);
            jv c;
            if (is_reserved_const(x->str, &c)) perr(P, x->pos, DDT_ERR_INVALID, "cannot assign to a constant");
        }
        nv_push(P, &items, x);
        if (tok_is_op(cur(P), ",")) comma = true;
        else break;
    }
    if (items.n == 0) unexpected(P, "an assignment target");
    if (!comma) return items.v[0];
    node *x = mk(P, N_TUPLE, pos);
    x->items = items.v;
    x->n = items.n;
    return x;
}

static node *parse_body(parser *P, const char *const *ends);

/* The '%}' that opens a block, its statements, and the {% <end> %} that is its only way to close. */
static node *parse_block(parser *P, const char *end) {
    expect_block_end(P);
    const char *const ends[] = {end, NULL};
    node *body = parse_body(P, ends);
    adv(P);
    expect_block_end(P);
    return body;
}

/* Filters of `{% set x | f %}` and `{% filter f %}`, applied to an N_CAPTURED node. */
static node *parse_filter_chain(parser *P, bool required) {
    node *x = mk(P, N_CAPTURED, cur(P)->pos);
    if (required) x = parse_filter(P, x);
    while (tok_is_op(cur(P), "|")) {
        adv(P);
        x = parse_filter(P, x);
    }
    return x;
}

static node *parse_statement(parser *P) {
    token *t = cur(P); /* the name after '{%' */
    size_t pos = t->pos;
    if (t->type != T_NAME) unexpected(P, "a statement name");
    sref kw = {t->p, t->n};
    adv(P);
    if (sref_is(kw, "if")) {
        node *x = mk(P, N_IF, pos);
        nodevec conds = {0}, bodies = {0};
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        for (;;) {
            nv_push(P, &conds, parse_tuple(P, false, false, NULL));
            expect_block_end(P);
            nv_push(P, &bodies, parse_body(P, ends));
            token *e = cur(P);
            adv(P);
            if (tok_is_name(e, "elif")) continue;
            if (tok_is_name(e, "else")) x->c = parse_block(P, "endif");
            else expect_block_end(P);
            break;
        }
        x->items = conds.v;
        x->items2 = bodies.v;
        x->n = x->n2 = conds.n;
        return x;
    }
    if (sref_is(kw, "for")) {
        node *x = mk(P, N_FOR, pos);
        static const char *const in_end[] = {"in", NULL};
        x->a = parse_target(P, false, in_end);
        if (!tok_is_name(cur(P), "in")) unexpected(P, "'in'");
        adv(P);
        static const char *const iter_end[] = {"recursive", NULL};
        x->b = parse_tuple(P, false, false, iter_end);
        if (tok_is_name(cur(P), "if")) {
            adv(P);
            x->c = parse_expr(P, true);
        }
        if (tok_is_name(cur(P), "recursive"))
            perr(P, cur(P)->pos, DDT_ERR_UNSUPPORTED, "recursive for loops are not supported");
        expect_block_end(P);
        static const char *const ends[] = {"endfor", "else", NULL};
        P->loop_depth++;
        x->d = parse_body(P, ends);
        P->loop_depth--;
        token *e = cur(P);
        adv(P);
        if (tok_is_name(e, "else")) x->e = parse_block(P, "endfor");
        else expect_block_end(P);
        return x;
    }
    if (sref_is(kw, "set")) {
        node *target = parse_target(P, true, NULL);
        if (tok_is_op(cur(P), "=")) {
            adv(P);
            node *x = mk(P, N_SET, pos);
            x->a = target;
            x->b = parse_tuple(P, true, false, NULL);
            expect_block_end(P);
            return x;
        }
        if (target->kind != N_NAME && target->kind != N_GETATTR)
            perr(P, pos, DDT_ERR_INVALID, "a block set takes one name");
        node *x = mk(P, N_SETBLOCK, pos);
        x->a = target;
        if (tok_is_op(cur(P), "|")) x->c = parse_filter_chain(P, false);
        x->d = parse_block(P, "endset");
        return x;
    }
    if (sref_is(kw, "macro")) {
        node *x = mk(P, N_MACRO, pos);
        x->str = expect_name(P);
        nodevec params = {0}, defs = {0};
        expect_op(P, "(");
        while (!tok_is_op(cur(P), ")")) {
            if (params.n) expect_op(P, ",");
            node *nm = mk(P, N_NAME, cur(P)->pos);
            nm->str = expect_name(P);
            nv_push(P, &params, nm);
            if (tok_is_op(cur(P), "=")) {
                adv(P);
                nv_push(P, &defs, parse_expr(P, true));
            } else {
                if (defs.n && defs.v[defs.n - 1]) perr(P, nm->pos, DDT_ERR_INVALID, "parameter without a default follows one with a default");
                nv_push(P, &defs, NULL);
            }
        }
        adv(P);
        node *outer = P->macro;
        int loops = P->loop_depth;
        P->macro = x;
        P->loop_depth = 0;
        x->d = parse_block(P, "endmacro");
        P->macro = outer;
        P->loop_depth = loops;
        x->items = params.v;
        x->items2 = defs.v;
        x->n = x->n2 = params.n;
        return x;
    }
    if (sref_is(kw, "break") || sref_is(kw, "continue")) {
        if (P->loop_depth == 0) perr(P, pos, DDT_ERR_INVALID, "'%.*s' outside a for loop", (int)kw.n, kw.p);
        expect_block_end(P);
        return mk(P, sref_is(kw, "break") ? N_BREAK : N_CONTINUE, pos);
    }
    if (sref_is(kw, "generation")) {
        /* transformers' assistant-mask tag: here it renders its body */
        return parse_block(P, "endgeneration");
    }
    if (sref_is(kw, "filter")) {
        node *x = mk(P, N_FILTERBLOCK, pos);
        x->c = parse_filter_chain(P, true);
        x->d = parse_block(P, "endfilter");
        return x;
    }
    static const char *const refused[] = {"include", "extends", "block", "import", "from", "call", "with", "do",
                                          "autoescape", "trans", NULL};
    for (const char *const *r = refused; *r; r++)
        if (sref_is(kw, *r)) perr(P, pos, DDT_ERR_UNSUPPORTED, "the '%s' statement is not supported", *r);
    perr(P, pos, DDT_ERR_INVALID, "unknown statement '%.*s'", (int)(kw.n > 40 ? 40 : kw.n), kw.p);
}

/* Statements up to one of `ends` (left current, after its '{%') or the end of the template. */
static node *parse_body(parser *P, const char *const *ends) {
    enter(P);
    size_t pos = cur(P)->pos;
    nodevec items = {0};
    for (;;) {
        token *t = cur(P);
        if (t->type == T_EOF) {
            if (ends) {
                char want[160] = "";
                size_t o = 0;
                for (const char *const *e = ends; *e && o < sizeof want - 40; e++)
                    o += (size_t)snprintf(want + o, sizeof want - o, "%s'%s'", o ? " or " : "", *e);
                perr(P, t->pos, DDT_ERR_INVALID, "unexpected end of template, expected %s", want);
            }
            break;
        }
        if (t->type == T_DATA) {
            node *x = mk(P, N_TEXT, t->pos);
            x->str = (sref){t->p, t->n};
            nv_push(P, &items, x);
            adv(P);
        } else if (t->type == T_VAR_BEGIN) {
            adv(P);
            node *x = mk(P, N_OUTPUT, t->pos);
            x->a = parse_tuple(P, true, false, NULL);
            if (cur(P)->type != T_VAR_END) unexpected(P, "'}}'");
            adv(P);
            nv_push(P, &items, x);
        } else if (t->type == T_BLOCK_BEGIN) {
            token *k = peek_tok(P, 1);
            bool is_end = false;
            for (const char *const *e = ends; e && *e; e++)
                if (tok_is_name(k, *e)) is_end = true;
            if (is_end) {
                adv(P);
                break;
            }
            if (k->type == T_NAME) {
                static const char *const closers[] = {"endif", "endfor", "endset", "endmacro", "endfilter",
                                                      "endgeneration", "elif", "else", NULL};
                for (const char *const *c = closers; *c; c++)
                    if (tok_is_name(k, *c)) perr(P, k->pos, DDT_ERR_INVALID, "unexpected '%s'", *c);
            }
            adv(P);
            nv_push(P, &items, parse_statement(P));
        } else {
            unexpected(P, "template text or a tag");
        }
    }
    node *b = mk(P, N_BODY, pos);
    b->items = items.v;
    b->n = items.n;
    leave(P);
    return b;
}

/*
 * jinja2 reports an unknown filter or test when it compiles the template,
 * except inside an if block or a conditional expression (a "soft" frame),
 * where it fails only if evaluated; loops, macros and set blocks start
 * frames that are not soft again.
 */
static void check_names(parser *P, const node *x, bool soft, int depth) {
    if (!x) return;
    if (depth > 8 * DDT_JINJA_MAX_DEPTH)
        perr(P, x->pos, DDT_ERR_RANGE, "template nested deeper than %d levels", 8 * DDT_JINJA_MAX_DEPTH);
    if ((x->kind == N_FILTER || x->kind == N_TEST) && x->op == NO_SUCH && !soft)
        perr(P, x->pos, DDT_ERR_INVALID, "no %s named '%.*s'", x->kind == N_FILTER ? "filter" : "test",
             (int)(x->str.n > 40 ? 40 : x->str.n), x->str.p);
    switch (x->kind) {
    case N_IF:
        for (size_t i = 0; i < x->n; i++) {
            check_names(P, x->items[i], true, depth + 1);
            check_names(P, x->items2[i], true, depth + 1);
        }
        check_names(P, x->c, true, depth + 1);
        return;
    case N_COND:
        check_names(P, x->a, true, depth + 1);
        check_names(P, x->b, true, depth + 1);
        check_names(P, x->c, true, depth + 1);
        return;
    case N_FOR:
        check_names(P, x->b, soft, depth + 1);
        check_names(P, x->c, false, depth + 1);
        check_names(P, x->d, false, depth + 1);
        check_names(P, x->e, soft, depth + 1);
        return;
    case N_MACRO:
        for (size_t i = 0; i < x->n2; i++) check_names(P, x->items2[i], false, depth + 1);
        check_names(P, x->d, false, depth + 1);
        return;
    case N_SETBLOCK:
    case N_FILTERBLOCK:
        check_names(P, x->c, false, depth + 1);
        check_names(P, x->d, false, depth + 1);
        return;
    default:
        check_names(P, x->a, soft, depth + 1);
        check_names(P, x->b, soft, depth + 1);
        check_names(P, x->c, soft, depth + 1);
        check_names(P, x->d, soft, depth + 1);
        check_names(P, x->e, soft, depth + 1);
        for (size_t i = 0; i < x->n && x->items; i++) check_names(P, x->items[i], soft, depth + 1);
        for (size_t i = 0; i < x->n2 && x->items2; i++) check_names(P, x->items2[i], soft, depth + 1);
        return;
    }
}

struct ddt_jinja {
    arena tree;
    const char *src; /* normalised: "\n" line ends, one trailing newline dropped */
    size_t len;
    node *root;
};

/* ================================================================ 4. values */

/* Output text under construction: bytes and their data flags.  The render's
 * main output lives in malloc'd memory (it is handed to the caller); captured
 * text (set blocks, macro calls, str() of a value) in the render's arena. */
typedef struct sb {
    char *p;
    uint8_t *m;
    size_t n, cap;
    bool heap;
    bool anydata, anytmpl;
} sb;

struct scope {
    scope *parent;
    jdict vars;
    bool captured; /* a macro defined here refers to it */
};

struct loopstate {
    const jv *items;
    size_t n, i;
    int depth;
};

typedef struct rctx {
    jmp_buf jb;
    ddt_status st;
    ddt_error *err;
    const ddt_jinja *t;
    arena a;
    uint64_t steps;
    int depth, macro_depth;
    uintptr_t stack0; /* the render's frame address: the recursion's stack use is measured from it */
    sb main;
    sb *out;
    jdict globals; /* the context: data's names, then trusted's (which win) */
    scope *sc;     /* the current scope (macros capture it) */
    jv captured;   /* N_CAPTURED's value while a set/filter block's filters run */
    int ctl;       /* pending break (1) or continue (2) */
} rctx;

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

static _Noreturn void rfail(rctx *c, const node *at, ddt_status st, const char *fmt, ...) DDT_PRINTF(4, 5);
static _Noreturn void rfail(rctx *c, const node *at, ddt_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    c->st = located_fail(c->err, st, at ? c->t->src : NULL, at ? at->pos : 0, fmt, ap);
    va_end(ap);
    longjmp(c->jb, 1);
}

static void *ralloc(rctx *c, size_t n) {
    void *p = NULL;
    if (n <= DDT_JINJA_MAX_MEMORY && c->a.total + n <= c->a.limit) p = arena_try(&c->a, n);
    if (!p) {
        if (c->a.total + n + (64u << 10) > c->a.limit)
            rfail(c, NULL, DDT_ERR_RANGE, "render needs more than %u MiB of working memory",
                  (unsigned)(DDT_JINJA_MAX_MEMORY >> 20));
        rfail(c, NULL, DDT_ERR_NOMEM, "out of memory while rendering");
    }
    return p;
}

/* One unit of work; long copies and scans call it once per 64 bytes. */
static void charge(rctx *c, const node *at, uint64_t units) {
    c->steps += units;
    if (c->steps > DDT_JINJA_MAX_STEPS)
        rfail(c, at, DDT_ERR_RANGE, "render took more than %llu evaluation steps", (unsigned long long)DDT_JINJA_MAX_STEPS);
}

static void sb_reserve(rctx *c, sb *b, size_t add) {
    if (b->cap - b->n >= add) return;
    size_t limit = DDT_JINJA_MAX_OUTPUT;
    if (add > limit || b->n + add > limit)
        rfail(c, NULL, DDT_ERR_RANGE, "rendered text longer than %u bytes", (unsigned)DDT_JINJA_MAX_OUTPUT);
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->n < add) cap *= 2;
    if (cap > limit) cap = limit;
    if (b->heap) {
        char *p = realloc(b->p, cap + 1);
        if (!p) rfail(c, NULL, DDT_ERR_NOMEM, "out of memory for the rendered text");
        b->p = p;
        uint8_t *m = realloc(b->m, cap + 1);
        if (!m) rfail(c, NULL, DDT_ERR_NOMEM, "out of memory for the rendered text");
        b->m = m;
    } else {
        char *p = ralloc(c, cap + 1);
        uint8_t *m = ralloc(c, cap + 1);
        if (b->n) {
            memcpy(p, b->p, b->n);
            memcpy(m, b->m, b->n);
        }
        b->p = p;
        b->m = m;
    }
    b->cap = cap;
}

static void sb_put(rctx *c, sb *b, const char *p, size_t n, int data) {
    if (n == 0) return;
    charge(c, NULL, n / 64 + 1);
    sb_reserve(c, b, n);
    memcpy(b->p + b->n, p, n);
    memset(b->m + b->n, data ? 1 : 0, n);
    b->n += n;
    if (data) b->anydata = true;
    else b->anytmpl = true;
}

static void sb_putc(rctx *c, sb *b, char ch, int data) { sb_put(c, b, &ch, 1, data); }

static void sb_puts(rctx *c, sb *b, const char *s, int data) { sb_put(c, b, s, strlen(s), data); }

/* Copies a string value with its per-byte flags. */
static void sb_put_str(rctx *c, sb *b, const jv *s, size_t off, size_t n) {
    if (n == 0) return;
    if (!s->u.s.m) {
        sb_put(c, b, s->u.s.p + off, n, s->f & F_DATA);
        return;
    }
    charge(c, NULL, n / 64 + 1);
    sb_reserve(c, b, n);
    memcpy(b->p + b->n, s->u.s.p + off, n);
    memcpy(b->m + b->n, s->u.s.m + off, n);
    for (size_t i = 0; i < n && !(b->anydata && b->anytmpl); i++) {
        if (s->u.s.m[off + i]) b->anydata = true;
        else b->anytmpl = true;
    }
    b->n += n;
}

static jv v_str_raw(const char *p, size_t n, const uint8_t *m, uint8_t f) {
    jv v = {.t = V_STR, .f = f};
    v.u.s.p = p;
    v.u.s.n = n;
    v.u.s.m = m;
    return v;
}

static jv sb_value(sb *b) {
    if (b->cap == 0) return v_str_raw("", 0, NULL, 0);
    b->p[b->n] = '\0';
    if (!b->anydata) return v_str_raw(b->p, b->n, NULL, 0);
    if (!b->anytmpl) return v_str_raw(b->p, b->n, NULL, F_DATA);
    return v_str_raw(b->p, b->n, b->m, 0);
}

static jv v_undef(const char *name, size_t n) {
    jv v = {.t = V_UNDEF};
    v.u.s.p = name;
    v.u.s.n = n;
    return v;
}
static jv v_none(void) { return (jv){.t = V_NONE}; }
static jv v_bool(bool b) { return (jv){.t = V_BOOL, .u.i = b}; }
static jv v_int(int64_t i, uint8_t f) { return (jv){.t = V_INT, .f = f, .u.i = i}; }
static jv v_float(double d, uint8_t f) { return (jv){.t = V_FLOAT, .f = f, .u.d = d}; }
static jv v_cstr(const char *s) { return v_str_raw(s, strlen(s), NULL, 0); }

static bool str_has_data(const jv *s) {
    if (!s->u.s.m) return (s->f & F_DATA) && s->u.s.n > 0;
    return memchr(s->u.s.m, 1, s->u.s.n) != NULL;
}

static bool v_has_data(const jv *v) {
    if (v->t == V_STR) return str_has_data(v);
    return (v->f & F_DATA) != 0;
}

static bool is_num(const jv *v) { return v->t == V_BOOL || v->t == V_INT || v->t == V_FLOAT; }
static double num_d(const jv *v) { return v->t == V_FLOAT ? v->u.d : (double)v->u.i; }

static jlist *list_new(rctx *c, size_t n) {
    jlist *l = ralloc(c, sizeof *l);
    l->n = n;
    l->v = n ? ralloc(c, n * sizeof *l->v) : NULL;
    return l;
}

static jv v_list(jlist *l, uint8_t f) {
    jv v = {.t = V_LIST, .f = f};
    v.u.l = l;
    for (size_t i = 0; i < l->n && !(v.f & F_DATA); i++)
        if (v_has_data(&l->v[i])) v.f |= F_DATA;
    return v;
}

/* A new list holding a copy of items[0..n). */
static jv list_of(rctx *c, const jv *items, size_t n) {
    jlist *l = list_new(c, n);
    if (n) memcpy(l->v, items, n * sizeof *items);
    return v_list(l, 0);
}

static jv v_dict(jdict *d) {
    jv v = {.t = V_DICT};
    v.u.dict = d;
    for (size_t i = 0; i < d->n && !(v.f & F_DATA); i++)
        if (v_has_data(&d->k[i]) || v_has_data(&d->v[i])) v.f |= F_DATA;
    return v;
}

static bool truthy(const jv *v) {
    switch (v->t) {
    case V_UNDEF:
    case V_NONE: return false;
    case V_BOOL:
    case V_INT: return v->u.i != 0;
    case V_FLOAT: return v->u.d != 0.0;
    case V_STR: return v->u.s.n > 0;
    case V_LIST: return v->u.l->n > 0;
    case V_DICT: return v->u.dict->n > 0;
    default: return true;
    }
}

static const char *type_name(const jv *v) {
    switch (v->t) {
    case V_UNDEF: return "undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "str";
    case V_LIST: return v->f & F_TUPLE ? "tuple" : "list";
    case V_DICT: return "dict";
    case V_NS: return "Namespace";
    case V_MACRO: return "Macro";
    case V_FUNC: return "function";
    case V_METHOD: return "method";
    case V_LOOP: return "LoopContext";
    }
    return "?";
}

/* Python's float repr: the shortest digits that read back the same. */
static void fmt_float(double d, char *out, size_t cap) {
    if (isnan(d)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(out, cap, d < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    /* tmp: [-]D[.DDD]e[+-]XX */
    char digits[24];
    size_t nd = 0;
    const char *q = tmp;
    bool neg = false;
    if (*q == '-') {
        neg = true;
        q++;
    }
    for (; *q && *q != 'e'; q++)
        if (*q != '.' && nd < sizeof digits - 1) digits[nd++] = *q;
    int e = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int decpt = e + 1;
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            o += (size_t)snprintf(out + o, cap - o, "0.");
            for (int k = 0; k < -decpt; k++) out[o++] = '0';
            o += (size_t)snprintf(out + o, cap - o, "%s", digits);
        } else if ((size_t)decpt >= nd) {
            o += (size_t)snprintf(out + o, cap - o, "%s", digits);
            for (size_t k = nd; k < (size_t)decpt; k++) out[o++] = '0';
            o += (size_t)snprintf(out + o, cap - o, ".0");
        } else {
            memcpy(out + o, digits, (size_t)decpt);
            o += (size_t)decpt;
            out[o++] = '.';
            o += (size_t)snprintf(out + o, cap - o, "%s", digits + decpt);
        }
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            memcpy(out + o, digits + 1, nd - 1);
            o += nd - 1;
        }
        int x = decpt - 1;
        o += (size_t)snprintf(out + o, cap - o, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    }
    out[o] = '\0';
}

/* Whether Python's str.isprintable() holds for a non-ASCII code point (the
 * common non-printables: C1 controls, format characters, separators, private use). */
static bool cp_printable(uint32_t cp) {
    if (cp < 0x20 || cp == 0x7f) return false;
    if (cp < 0x7f) return true;
    if (cp <= 0xa0 || cp == 0xad) return false;
    if ((cp >= 0x600 && cp <= 0x605) || cp == 0x61c || cp == 0x6dd || cp == 0x70f || cp == 0x180e || cp == 0x1680)
        return false;
    if ((cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) || (cp >= 0x205f && cp <= 0x206f)) return false;
    if (cp == 0x3000 || cp == 0xfeff || (cp >= 0xfff9 && cp <= 0xfffb) || (cp >= 0xfffe && cp <= 0xffff)) return false;
    if (cp >= 0xd800 && cp <= 0xf8ff) return false;
    if ((cp >= 0xe0000 && cp <= 0xe0fff) || cp >= 0xf0000) return false;
    return true;
}

static void put_py_strrepr(rctx *c, sb *b, const char *p, size_t n, int fl) {
    bool sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    sb_putc(c, b, q, fl);
    for (size_t i = 0; i < n;) {
        size_t l;
        uint32_t cp = utf8_decode(p, i, n, &l);
        char e[16];
        if (cp == (uint32_t)q || cp == '\\') {
            e[0] = '\\';
            e[1] = (char)cp;
            sb_put(c, b, e, 2, fl);
        } else if (cp == '\n') {
            sb_put(c, b, "\\n", 2, fl);
        } else if (cp == '\r') {
            sb_put(c, b, "\\r", 2, fl);
        } else if (cp == '\t') {
            sb_put(c, b, "\\t", 2, fl);
        } else if (!cp_printable(cp)) {
            int k = cp < 0x100 ? snprintf(e, sizeof e, "\\x%02x", cp)
                    : cp < 0x10000 ? snprintf(e, sizeof e, "\\u%04x", cp) : snprintf(e, sizeof e, "\\U%08x", cp);
            sb_put(c, b, e, (size_t)k, fl);
        } else {
            sb_put(c, b, p + i, l, fl);
        }
        i += l;
    }
    sb_putc(c, b, q, fl);
}

static void put_repr(rctx *c, sb *b, const jv *v, int fl, int depth);

/* Recursion over a value (repr, JSON, comparison) is bounded: a loop can keep wrapping a namespace's value in a list. */
static void value_depth(rctx *c, const node *at, int depth) {
    if (depth > DDT_JINJA_MAX_DEPTH) rfail(c, at, DDT_ERR_RANGE, "value nested deeper than %d levels", DDT_JINJA_MAX_DEPTH);
}

/* str(v) for scalars; fl is the flag every byte gets. */
static void put_scalar(rctx *c, sb *b, const jv *v, int fl) {
    char buf[64];
    switch (v->t) {
    case V_NONE: sb_puts(c, b, "None", fl); return;
    case V_BOOL: sb_puts(c, b, v->u.i ? "True" : "False", fl); return;
    case V_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v->u.i);
        sb_puts(c, b, buf, fl);
        return;
    case V_FLOAT:
        fmt_float(v->u.d, buf, sizeof buf);
        sb_puts(c, b, buf, fl);
        return;
    default: break;
    }
}

static void put_repr(rctx *c, sb *b, const jv *v, int fl, int depth) {
    value_depth(c, NULL, depth);
    switch (v->t) {
    case V_UNDEF: sb_puts(c, b, "Undefined", fl); return;
    case V_STR:
        if (v->f & F_MARKUP) sb_puts(c, b, "Markup(", fl);
        put_py_strrepr(c, b, v->u.s.p, v->u.s.n, fl);
        if (v->f & F_MARKUP) sb_putc(c, b, ')', fl);
        return;
    case V_LIST: {
        bool tup = v->f & F_TUPLE;
        sb_putc(c, b, tup ? '(' : '[', fl);
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i) sb_put(c, b, ", ", 2, fl);
            put_repr(c, b, &v->u.l->v[i], fl, depth + 1);
        }
        if (tup && v->u.l->n == 1) sb_putc(c, b, ',', fl);
        sb_putc(c, b, tup ? ')' : ']', fl);
        return;
    }
    case V_DICT: {
        sb_putc(c, b, '{', fl);
        for (size_t i = 0; i < v->u.dict->n; i++) {
            if (i) sb_put(c, b, ", ", 2, fl);
            put_repr(c, b, &v->u.dict->k[i], fl, depth + 1);
            sb_put(c, b, ": ", 2, fl);
            put_repr(c, b, &v->u.dict->v[i], fl, depth + 1);
        }
        sb_putc(c, b, '}', fl);
        return;
    }
    case V_NS: sb_puts(c, b, "<Namespace>", fl); return;
    case V_MACRO: sb_puts(c, b, "<Macro>", fl); return;
    case V_FUNC:
    case V_METHOD: sb_puts(c, b, "<built-in function>", fl); return;
    case V_LOOP: sb_puts(c, b, "<LoopContext>", fl); return;
    default: put_scalar(c, b, v, fl); return;
    }
}

/* str(v) appended to b: strings keep their flags, everything else is wholly data
 * when anything in it came from the data context. */
static void put_text(rctx *c, sb *b, const jv *v) {
    switch (v->t) {
    case V_UNDEF: return;
    case V_STR: sb_put_str(c, b, v, 0, v->u.s.n); return;
    case V_NONE:
    case V_BOOL:
    case V_INT:
    case V_FLOAT: put_scalar(c, b, v, v->f & F_DATA); return;
    default: put_repr(c, b, v, v_has_data(v), 0); return;
    }
}

static jv to_str(rctx *c, const jv *v) {
    if (v->t == V_STR) {
        jv s = *v;
        s.f &= (uint8_t)~F_MARKUP;
        return s;
    }
    sb b = {0};
    put_text(c, &b, v);
    return sb_value(&b);
}

static void put_html_escaped(rctx *c, sb *b, const jv *s, int fl) {
    for (size_t i = 0; i < s->u.s.n; i++) {
        char ch = s->u.s.p[i];
        const char *r = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '"' ? "&#34;" : ch == '\'' ? "&#39;" : NULL;
        if (r) sb_puts(c, b, r, fl);
        else sb_putc(c, b, ch, fl);
    }
}

/* markupsafe.escape(): Markup stays as is, anything else is str()'d and escaped. */
static jv html_escape(rctx *c, const jv *v) {
    if (v->t == V_STR && (v->f & F_MARKUP)) return *v;
    jv s = to_str(c, v);
    sb b = {0};
    put_html_escaped(c, &b, &s, str_has_data(&s));
    jv r = sb_value(&b);
    r.f |= F_MARKUP;
    return r;
}

/* ---- equality and ordering, as Python compares */

static bool py_eq(rctx *c, const jv *a, const jv *b, int depth) {
    value_depth(c, NULL, depth);
    if (is_num(a) && is_num(b)) {
        if (a->t != V_FLOAT && b->t != V_FLOAT) return a->u.i == b->u.i;
        return num_d(a) == num_d(b);
    }
    if (a->t != b->t) return false;
    switch (a->t) {
    case V_UNDEF:
    case V_NONE: return true;
    case V_STR: return a->u.s.n == b->u.s.n && memcmp(a->u.s.p, b->u.s.p, a->u.s.n) == 0;
    case V_LIST:
        if ((a->f & F_TUPLE) != (b->f & F_TUPLE) || a->u.l->n != b->u.l->n) return false;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!py_eq(c, &a->u.l->v[i], &b->u.l->v[i], depth + 1)) return false;
        return true;
    case V_DICT: {
        jdict *x = a->u.dict, *y = b->u.dict;
        if (x->n != y->n) return false;
        for (size_t i = 0; i < x->n; i++) {
            size_t j = 0;
            while (j < y->n && !py_eq(c, &x->k[i], &y->k[j], depth + 1)) j++;
            if (j == y->n || !py_eq(c, &x->v[i], &y->v[j], depth + 1)) return false;
        }
        return true;
    }
    case V_NS: return a->u.dict == b->u.dict;
    case V_MACRO: return a->u.mac.def == b->u.mac.def && a->u.mac.sc == b->u.mac.sc;
    case V_FUNC: return a->id == b->id;
    default: return false;
    }
}

static int py_cmp(rctx *c, const node *at, const jv *a, const jv *b, int depth) {
    value_depth(c, at, depth);
    if (is_num(a) && is_num(b)) {
        if (a->t != V_FLOAT && b->t != V_FLOAT) return a->u.i < b->u.i ? -1 : a->u.i > b->u.i;
        double x = num_d(a), y = num_d(b);
        return x < y ? -1 : x > y ? 1 : 0; /* NaN compares "equal" here: every Python comparison with it is False */
    }
    if (a->t == V_STR && b->t == V_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int r = memcmp(a->u.s.p, b->u.s.p, n);
        if (r) return r < 0 ? -1 : 1;
        return a->u.s.n < b->u.s.n ? -1 : a->u.s.n > b->u.s.n;
    }
    if (a->t == V_LIST && b->t == V_LIST && (a->f & F_TUPLE) == (b->f & F_TUPLE)) {
        size_t n = a->u.l->n < b->u.l->n ? a->u.l->n : b->u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (py_eq(c, &a->u.l->v[i], &b->u.l->v[i], depth + 1)) continue;
            return py_cmp(c, at, &a->u.l->v[i], &b->u.l->v[i], depth + 1);
        }
        return a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n;
    }
    if (a->t == V_UNDEF || b->t == V_UNDEF)
        rfail(c, at, DDT_ERR_INVALID, "'%.*s' is undefined", (int)(a->t == V_UNDEF ? a : b)->u.s.n,
              (a->t == V_UNDEF ? a : b)->u.s.p ? (a->t == V_UNDEF ? a : b)->u.s.p : "");
    rfail(c, at, DDT_ERR_INVALID, "cannot order %s and %s", type_name(a), type_name(b));
}

/* ---- dictionaries */

static jdict *dict_new(rctx *c, size_t cap) {
    jdict *d = ralloc(c, sizeof *d);
    d->n = 0;
    d->cap = cap;
    d->k = cap ? ralloc(c, cap * sizeof *d->k) : NULL;
    d->v = cap ? ralloc(c, cap * sizeof *d->v) : NULL;
    return d;
}

static jv *dict_find_str(const jdict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == V_STR && d->k[i].u.s.n == n && memcmp(d->k[i].u.s.p, k, n) == 0) return &d->v[i];
    return NULL;
}

static jv *dict_find(rctx *c, const jdict *d, const jv *k) {
    if (k->t == V_STR) return dict_find_str(d, k->u.s.p, k->u.s.n);
    for (size_t i = 0; i < d->n; i++)
        if (py_eq(c, &d->k[i], k, 0)) return &d->v[i];
    return NULL;
}

static bool hashable(const jv *k) {
    if (k->t == V_LIST && (k->f & F_TUPLE)) {
        for (size_t i = 0; i < k->u.l->n; i++)
            if (!hashable(&k->u.l->v[i])) return false;
        return true;
    }
    return k->t == V_NONE || k->t == V_BOOL || k->t == V_INT || k->t == V_FLOAT || k->t == V_STR || k->t == V_UNDEF;
}

/* Insert or replace (a dict keeps the first key's position, as Python's does). */
static void dict_set(rctx *c, jdict *d, const jv *k, const jv *v) {
    jv *slot = dict_find(c, d, k);
    if (slot) {
        *slot = *v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jv *nk = ralloc(c, cap * sizeof *nk), *nvv = ralloc(c, cap * sizeof *nvv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nvv, d->v, d->n * sizeof *nvv);
        }
        d->k = nk;
        d->v = nvv;
        d->cap = cap;
    }
    d->k[d->n] = *k;
    d->v[d->n] = *v;
    d->n++;
}

/* ---- JSON (transformers' tojson: json.dumps with ensure_ascii=False by default) */

static jv from_json(rctx *c, const json_t *j, uint8_t data, int depth) {
    if (depth > DDT_JINJA_MAX_DEPTH)
        rfail(c, NULL, DDT_ERR_RANGE, "context value nested deeper than %d levels", DDT_JINJA_MAX_DEPTH);
    charge(c, NULL, 1);
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jdict *d = dict_new(c, json_object_size(j));
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            d->k[d->n] = v_str_raw(key, strlen(key), NULL, data);
            d->v[d->n] = from_json(c, val, data, depth + 1);
            d->n++;
        }
        jv v = {.t = V_DICT, .f = data};
        v.u.dict = d;
        return v;
    }
    case JSON_ARRAY: {
        jlist *l = list_new(c, json_array_size(j));
        for (size_t i = 0; i < l->n; i++) l->v[i] = from_json(c, json_array_get(j, i), data, depth + 1);
        jv v = {.t = V_LIST, .f = data};
        v.u.l = l;
        return v;
    }
    case JSON_STRING: return v_str_raw(json_string_value(j), json_string_length(j), NULL, data);
    case JSON_INTEGER: return v_int((int64_t)json_integer_value(j), data);
    case JSON_REAL: return v_float(json_real_value(j), data);
    case JSON_TRUE: return (jv){.t = V_BOOL, .f = data, .u.i = 1};
    case JSON_FALSE: return (jv){.t = V_BOOL, .f = data, .u.i = 0};
    default: return (jv){.t = V_NONE, .f = data};
    }
}

typedef struct json_opts {
    const char *indent; /* NULL: one line */
    size_t indent_n;
    const char *item_sep, *key_sep;
    size_t item_n, key_n;
    bool sort_keys, ensure_ascii;
} json_opts;

static void put_json_str(rctx *c, sb *b, const char *p, size_t n, bool ascii, int fl) {
    sb_putc(c, b, '"', fl);
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)p[i];
        char e[16];
        if (ch == '"' || ch == '\\') {
            e[0] = '\\';
            e[1] = (char)ch;
            sb_put(c, b, e, 2, fl);
            i++;
        } else if (ch < 0x20) {
            const char *r = ch == '\n' ? "\\n" : ch == '\r' ? "\\r" : ch == '\t' ? "\\t" : ch == '\b' ? "\\b" : ch == '\f' ? "\\f" : NULL;
            if (r) {
                sb_puts(c, b, r, fl);
            } else {
                snprintf(e, sizeof e, "\\u%04x", ch);
                sb_puts(c, b, e, fl);
            }
            i++;
        } else if (ch >= 0x80 && ascii) {
            size_t l;
            uint32_t cp = utf8_decode(p, i, n, &l);
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(e, sizeof e, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
            } else {
                snprintf(e, sizeof e, "\\u%04x", cp);
            }
            sb_puts(c, b, e, fl);
            i += l;
        } else {
            size_t j = i;
            while (j < n && (unsigned char)p[j] >= 0x20 && p[j] != '"' && p[j] != '\\' && !(ascii && (unsigned char)p[j] >= 0x80)) j++;
            sb_put(c, b, p + i, j - i, fl);
            i = j;
        }
    }
    sb_putc(c, b, '"', fl);
}

static void json_newline(rctx *c, sb *b, const json_opts *o, int level, int fl) {
    sb_putc(c, b, '\n', fl);
    for (int k = 0; k < level; k++) sb_put(c, b, o->indent, o->indent_n, fl);
}

static void put_json(rctx *c, const node *at, sb *b, const jv *v, const json_opts *o, int level, int fl) {
    value_depth(c, at, level);
    char buf[64];
    switch (v->t) {
    case V_NONE: sb_puts(c, b, "null", fl); return;
    case V_BOOL: sb_puts(c, b, v->u.i ? "true" : "false", fl); return;
    case V_INT: put_scalar(c, b, v, fl); return;
    case V_FLOAT:
        if (isnan(v->u.d)) sb_puts(c, b, "NaN", fl);
        else if (isinf(v->u.d)) sb_puts(c, b, v->u.d < 0 ? "-Infinity" : "Infinity", fl);
        else {
            fmt_float(v->u.d, buf, sizeof buf);
            sb_puts(c, b, buf, fl);
        }
        return;
    case V_STR: put_json_str(c, b, v->u.s.p, v->u.s.n, o->ensure_ascii, fl); return;
    case V_LIST: {
        size_t n = v->u.l->n;
        if (n == 0) {
            sb_puts(c, b, "[]", fl);
            return;
        }
        sb_putc(c, b, '[', fl);
        for (size_t i = 0; i < n; i++) {
            if (i) sb_put(c, b, o->item_sep, o->item_n, fl);
            if (o->indent) json_newline(c, b, o, level + 1, fl);
            put_json(c, at, b, &v->u.l->v[i], o, level + 1, fl);
        }
        if (o->indent) json_newline(c, b, o, level, fl);
        sb_putc(c, b, ']', fl);
        return;
    }
    case V_DICT: {
        jdict *d = v->u.dict;
        if (d->n == 0) {
            sb_puts(c, b, "{}", fl);
            return;
        }
        size_t *order = ralloc(c, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (o->sort_keys) {
            for (size_t i = 0; i < d->n; i++)
                if (d->k[i].t != V_STR) rfail(c, at, DDT_ERR_UNSUPPORTED, "tojson(sort_keys=true) with keys that are not strings");
            /* insertion sort: stable, and dicts here are small */
            for (size_t i = 1; i < d->n; i++) {
                size_t x = order[i], j = i;
                while (j > 0 && py_cmp(c, at, &d->k[order[j - 1]], &d->k[x], 0) > 0) {
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        }
        sb_putc(c, b, '{', fl);
        for (size_t ii = 0; ii < d->n; ii++) {
            size_t i = order[ii];
            if (ii) sb_put(c, b, o->item_sep, o->item_n, fl);
            if (o->indent) json_newline(c, b, o, level + 1, fl);
            const jv *k = &d->k[i];
            if (k->t == V_STR) {
                put_json_str(c, b, k->u.s.p, k->u.s.n, o->ensure_ascii, fl);
            } else if (k->t == V_INT || k->t == V_FLOAT || k->t == V_BOOL || k->t == V_NONE) {
                sb_putc(c, b, '"', fl);
                if (k->t == V_INT) put_scalar(c, b, k, fl);
                else put_json(c, at, b, k, o, level + 1, fl);
                sb_putc(c, b, '"', fl);
            } else {
                rfail(c, at, DDT_ERR_INVALID, "tojson: keys must be str, int, float, bool or None, not %s", type_name(k));
            }
            sb_put(c, b, o->key_sep, o->key_n, fl);
            put_json(c, at, b, &d->v[i], o, level + 1, fl);
        }
        if (o->indent) json_newline(c, b, o, level, fl);
        sb_putc(c, b, '}', fl);
        return;
    }
    default: rfail(c, at, DDT_ERR_INVALID, "tojson: object of type %s is not JSON serializable", type_name(v));
    }
}

/* ================================================================ 5. evaluator */

typedef struct args {
    const jv *pos;
    size_t npos;
    const sref *kwn;
    const jv *kwv;
    size_t nkw;
} args;

/* Argument i by position, or by keyword `name`; NULL when absent. */
static const jv *arg(const args *a, size_t i, const char *name) {
    if (i < a->npos) return &a->pos[i];
    for (size_t k = 0; k < a->nkw; k++)
        if (name && sref_is(a->kwn[k], name)) return &a->kwv[k];
    return NULL;
}

typedef jv (*filter_fn)(rctx *c, const node *at, const jv *in, const args *a);
typedef bool (*test_fn)(rctx *c, const node *at, const jv *in, const args *a);
typedef jv (*method_fn)(rctx *c, const node *at, const jv *self, const args *a);

typedef struct filter_def {
    const char *name;
    filter_fn fn;
} filter_def;
typedef struct test_def {
    const char *name;
    test_fn fn;
} test_def;
typedef struct method_def {
    const char *name;
    uint8_t on; /* the value type it is a method of */
    method_fn fn;
} method_def;

static int find_filter(const char *name, size_t n);
static int find_test(const char *name, size_t n);
static const filter_def *filter_at(int i);
static const test_def *test_at(int i);
static const method_def *method_at(int i);
static int find_method(uint8_t on, const char *name, size_t n);

enum { FN_RANGE, FN_NAMESPACE, FN_DICT, FN_RAISE, FN_STRFTIME, FN_COUNT };
static const char *const FN_NAMES[FN_COUNT] = {"range", "namespace", "dict", "raise_exception", "strftime_now"};

static jv eval(rctx *c, const node *x);
static void exec_node(rctx *c, const node *x);
static jv call_value(rctx *c, const node *at, const jv *f, const args *a);

static scope *scope_new(rctx *c, scope *parent) {
    scope *s = ralloc(c, sizeof *s);
    memset(s, 0, sizeof *s);
    s->parent = parent;
    return s;
}

static _Noreturn void undefined_error(rctx *c, const node *at, const jv *u) {
    if (u->f & F_UNSAFE)
        rfail(c, at, DDT_ERR_INVALID, "'%.*s' is not allowed: the sandbox keeps values immutable", (int)u->u.s.n, u->u.s.p);
    if (u->u.s.p) rfail(c, at, DDT_ERR_INVALID, "'%.*s' is undefined", (int)(u->u.s.n > 80 ? 80 : u->u.s.n), u->u.s.p);
    rfail(c, at, DDT_ERR_INVALID, "a value is undefined");
}

static jv lookup(rctx *c, scope *sc, sref name) {
    for (scope *s = sc; s; s = s->parent) {
        jv *v = dict_find_str(&s->vars, name.p, name.n);
        if (v) return *v;
    }
    jv *g = dict_find_str(&c->globals, name.p, name.n);
    if (g) return *g;
    for (int i = 0; i < FN_COUNT; i++)
        if (sref_is(name, FN_NAMES[i])) return (jv){.t = V_FUNC, .id = (uint16_t)i};
    return v_undef(name.p, name.n);
}

/* Items of an iterable: a list's, a dict's keys, a string's characters; undefined gives none. */
static const jv *iter_items(rctx *c, const node *at, const jv *v, size_t *n) {
    switch (v->t) {
    case V_UNDEF: *n = 0; return NULL;
    case V_LIST: *n = v->u.l->n; return v->u.l->v;
    case V_DICT:
        *n = v->u.dict->n;
        return v->u.dict->k;
    case V_STR: {
        size_t cnt = 0;
        for (size_t i = 0; i < v->u.s.n; i += utf8_len_at(v->u.s.p, i, v->u.s.n)) cnt++;
        jv *out = ralloc(c, (cnt ? cnt : 1) * sizeof *out);
        size_t k = 0;
        for (size_t i = 0; i < v->u.s.n;) {
            size_t l = utf8_len_at(v->u.s.p, i, v->u.s.n);
            out[k++] = v_str_raw(v->u.s.p + i, l, v->u.s.m ? v->u.s.m + i : NULL, v->f & F_DATA);
            i += l;
        }
        charge(c, at, cnt / 16 + 1);
        *n = cnt;
        return out;
    }
    default: rfail(c, at, DDT_ERR_INVALID, "'%s' object is not iterable", type_name(v));
    }
}

static void assign(rctx *c, scope *sc, const node *target, const jv *v) {
    if (target->kind == N_NAME) {
        jv k = v_str_raw(target->str.p, target->str.n, NULL, 0);
        dict_set(c, &sc->vars, &k, v);
        return;
    }
    if (target->kind == N_GETATTR) {
        jv ns = lookup(c, sc, target->a->str);
        if (ns.t != V_NS)
            rfail(c, target, DDT_ERR_INVALID, "cannot assign attribute '%.*s' on '%.*s', which is not a namespace()",
                  (int)target->str.n, target->str.p, (int)target->a->str.n, target->a->str.p);
        jv k = v_str_raw(target->str.p, target->str.n, NULL, 0);
        dict_set(c, ns.u.dict, &k, v);
        return;
    }
    /* a tuple of targets: unpack */
    size_t n;
    const jv *items = iter_items(c, target, v, &n);
    if (n != target->n)
        rfail(c, target, DDT_ERR_INVALID, "cannot unpack %zu values into %zu names", n, target->n);
    for (size_t i = 0; i < n; i++) assign(c, sc, target->items[i], &items[i]);
}

/* Each nested evaluation costs machine stack, a frame size that depends on the
 * compiler and its instrumentation (AddressSanitizer's frames are several times a
 * release build's): the level count alone let a recursive macro overflow an
 * 8 MB stack under ASan (the fuzzer found it), so the stack used is bounded too.
 * The frame address, not a local's: ASan may keep locals on a heap "fake stack". */
static void enter_rt(rctx *c, const node *at) {
    if (++c->depth > 8 * DDT_JINJA_MAX_DEPTH)
        rfail(c, at, DDT_ERR_RANGE, "evaluation nested deeper than %d levels", 8 * DDT_JINJA_MAX_DEPTH);
    const uintptr_t now = (uintptr_t)__builtin_frame_address(0);
    const uintptr_t used = c->stack0 > now ? c->stack0 - now : now - c->stack0;
    if (used > DDT_JINJA_MAX_STACK)
        rfail(c, at, DDT_ERR_RANGE, "evaluation nested deeper than %u KB of stack allow (%d levels)",
              DDT_JINJA_MAX_STACK >> 10, c->depth);
}

/* ---- attribute and item access (the sandbox's getattr / getitem) */

static jv v_method(rctx *c, const jv *self, int id) {
    jv m = {.t = V_METHOD, .id = (uint16_t)id};
    jv *s = ralloc(c, sizeof *s);
    *s = *self;
    m.u.meth.self = s;
    return m;
}

static bool name_in(const char *p, size_t n, const char *const *names) {
    for (; *names; names++)
        if (sref_is((sref){p, n}, *names)) return true;
    return false;
}

static const char *const DICT_MUTATORS[] = {"pop", "popitem", "setdefault", "update", "clear", "copy", "fromkeys", NULL};
static const char *const LIST_MUTATORS[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "copy", NULL};

static jv unsafe_undef(rctx *c, const char *type, const char *p, size_t n) {
    char buf[96];
    int k = snprintf(buf, sizeof buf, "%s.%.*s", type, (int)(n > 40 ? 40 : n), p);
    char *s = ralloc(c, (size_t)k + 1);
    memcpy(s, buf, (size_t)k + 1);
    jv u = v_undef(s, (size_t)k);
    u.f |= F_UNSAFE;
    return u;
}

static jv loop_attr(rctx *c, const jv *obj, const char *p, size_t n, bool *found) {
    loopstate *L = obj->u.loop;
    sref s = {p, n};
    *found = true;
    if (sref_is(s, "index")) return v_int((int64_t)L->i + 1, 0);
    if (sref_is(s, "index0")) return v_int((int64_t)L->i, 0);
    if (sref_is(s, "revindex")) return v_int((int64_t)(L->n - L->i), 0);
    if (sref_is(s, "revindex0")) return v_int((int64_t)(L->n - L->i - 1), 0);
    if (sref_is(s, "first")) return v_bool(L->i == 0);
    if (sref_is(s, "last")) return v_bool(L->i + 1 == L->n);
    if (sref_is(s, "length")) return v_int((int64_t)L->n, 0);
    if (sref_is(s, "depth")) return v_int(1, 0);
    if (sref_is(s, "depth0")) return v_int(0, 0);
    if (sref_is(s, "previtem")) return L->i > 0 ? L->items[L->i - 1] : v_undef("previtem", 8);
    if (sref_is(s, "nextitem")) return L->i + 1 < L->n ? L->items[L->i + 1] : v_undef("nextitem", 8);
    int m = find_method(V_LOOP, p, n);
    if (m >= 0) return v_method(c, obj, m);
    *found = false;
    return v_undef(p, n);
}

static jv get_attr(rctx *c, const node *at, const jv *obj, const char *p, size_t n) {
    int m;
    switch (obj->t) {
    case V_UNDEF: undefined_error(c, at, obj);
    case V_DICT:
    case V_NS: {
        /* past a dict's methods, its attributes are its string keys, as a namespace's are */
        if (obj->t == V_DICT) {
            if ((m = find_method(V_DICT, p, n)) >= 0) return v_method(c, obj, m);
            if (name_in(p, n, DICT_MUTATORS)) return unsafe_undef(c, "dict", p, n);
        }
        jv *v = dict_find_str(obj->u.dict, p, n);
        return v ? *v : v_undef(p, n);
    }
    case V_STR:
        if ((m = find_method(V_STR, p, n)) >= 0) return v_method(c, obj, m);
        return v_undef(p, n);
    case V_LIST:
        if ((m = find_method(V_LIST, p, n)) >= 0) return v_method(c, obj, m);
        if (name_in(p, n, LIST_MUTATORS)) return unsafe_undef(c, "list", p, n);
        return v_undef(p, n);
    case V_LOOP: {
        bool found;
        return loop_attr(c, obj, p, n, &found);
    }
    default: return v_undef(p, n);
    }
}

/* A slice's given start or stop as slice.indices() clamps it: negative counts from the end. */
static int64_t slice_bound(int64_t i, int64_t len, bool backward) {
    if (i < 0) {
        i += len;
        if (i < 0) i = backward ? -1 : 0;
    } else if (i >= len) {
        i = backward ? len - 1 : len;
    }
    return i;
}

/* Python's slice.indices(): start, count and step over a sequence of len items. */
static bool slice_indices(rctx *c, const node *at, const jv *s0, const jv *s1, const jv *s2, int64_t len,
                          int64_t *start, int64_t *count, int64_t *step) {
    int64_t st = 1;
    const jv *parts[3] = {s0, s1, s2};
    for (int k = 0; k < 3; k++)
        if (parts[k] && parts[k]->t != V_NONE && parts[k]->t != V_INT && parts[k]->t != V_BOOL)
            rfail(c, at, DDT_ERR_INVALID, "slice indices must be integers or none, not %s", type_name(parts[k]));
    if (s2 && s2->t != V_NONE) st = s2->u.i;
    if (st == 0) rfail(c, at, DDT_ERR_INVALID, "slice step cannot be zero");
    if (st == INT64_MIN) st = -INT64_MAX;
    int64_t lo, hi;
    if (st > 0) {
        lo = 0;
        hi = len;
    } else {
        lo = len - 1;
        hi = -1;
    }
    if (s0 && s0->t != V_NONE) lo = slice_bound(s0->u.i, len, st < 0);
    if (s1 && s1->t != V_NONE) hi = slice_bound(s1->u.i, len, st < 0);
    int64_t cnt = 0;
    if (st < 0) {
        if (hi < lo) cnt = (lo - hi - 1) / (-st) + 1;
    } else if (lo < hi) {
        cnt = (hi - lo - 1) / st + 1;
    }
    *start = lo;
    *count = cnt;
    *step = st;
    return true;
}

/* Byte offsets of a string's code points (n + 1 entries); NULL for pure ASCII. */
static size_t *cp_offsets(rctx *c, const jv *s, size_t *ncp) {
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, cnt = 0;
    bool ascii = true;
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)p[i] >= 0x80) ascii = false;
        if (((unsigned char)p[i] & 0xc0) != 0x80) cnt++;
    }
    *ncp = cnt;
    if (ascii) return NULL;
    size_t *off = ralloc(c, (cnt + 1) * sizeof *off);
    size_t k = 0;
    for (size_t i = 0; i < n; i += utf8_len_at(p, i, n)) off[k++] = i;
    off[k] = n;
    return off;
}

static jv substr(const jv *s, size_t off, size_t n) {
    return v_str_raw(s->u.s.p + off, n, s->u.s.m ? s->u.s.m + off : NULL, s->f & (F_DATA | F_MARKUP));
}

/* Code points [i, j) of s, where off is what cp_offsets() gave for s. */
static jv cp_substr(const jv *s, const size_t *off, int64_t i, int64_t j) {
    size_t b0 = off ? off[i] : (size_t)i, b1 = off ? off[j] : (size_t)j;
    return substr(s, b0, b1 - b0);
}

static jv do_slice(rctx *c, const node *at, const jv *obj, const jv *s0, const jv *s1, const jv *s2) {
    if (obj->t == V_UNDEF) undefined_error(c, at, obj);
    if (obj->t == V_STR) {
        size_t ncp;
        size_t *off = cp_offsets(c, obj, &ncp);
        int64_t start, count, step;
        if (!slice_indices(c, at, s0, s1, s2, (int64_t)ncp, &start, &count, &step)) return v_undef("slice", 5);
        if (count == 0) return v_str_raw("", 0, NULL, 0);
        if (step == 1) return cp_substr(obj, off, start, start + count);
        sb b = {0};
        for (int64_t k = 0, i = start; k < count; k++, i += step) {
            jv ch = cp_substr(obj, off, i, i + 1);
            sb_put_str(c, &b, &ch, 0, ch.u.s.n);
        }
        jv r = sb_value(&b);
        return r;
    }
    if (obj->t == V_LIST) {
        int64_t start, count, step;
        if (!slice_indices(c, at, s0, s1, s2, (int64_t)obj->u.l->n, &start, &count, &step)) return v_undef("slice", 5);
        jlist *l = list_new(c, (size_t)count);
        charge(c, at, (uint64_t)count / 16 + 1);
        for (int64_t k = 0, i = start; k < count; k++, i += step) l->v[k] = obj->u.l->v[i];
        return v_list(l, obj->f & F_TUPLE);
    }
    /* jinja2 slices with Python's own [a:b:c], so anything but a sequence fails */
    rfail(c, at, DDT_ERR_INVALID, "'%s' object is not subscriptable", type_name(obj));
}

static jv get_item(rctx *c, const node *at, const jv *obj, const jv *key) {
    switch (obj->t) {
    case V_UNDEF: undefined_error(c, at, obj);
    case V_DICT:
        if (hashable(key)) {
            jv *v = dict_find(c, obj->u.dict, key);
            if (v) return *v;
        }
        break;
    case V_LIST:
    case V_STR:
        if (key->t == V_INT || key->t == V_BOOL) {
            int64_t i = key->u.i;
            if (obj->t == V_LIST) {
                int64_t n = (int64_t)obj->u.l->n;
                if (i < 0) i += n;
                if (i < 0 || i >= n) return v_undef("item", 4);
                return obj->u.l->v[i];
            }
            size_t ncp;
            size_t *off = cp_offsets(c, obj, &ncp);
            if (i < 0) i += (int64_t)ncp;
            if (i < 0 || i >= (int64_t)ncp) return v_undef("item", 4);
            return cp_substr(obj, off, i, i + 1);
        }
        break;
    default: break;
    }
    if (key->t == V_STR) return get_attr(c, at, obj, key->u.s.p, key->u.s.n);
    return v_undef("item", 4);
}

/* ---- arithmetic */

static _Noreturn void type_error(rctx *c, const node *at, const char *op, const jv *a, const jv *b) {
    if (a->t == V_UNDEF) undefined_error(c, at, a);
    if (b && b->t == V_UNDEF) undefined_error(c, at, b);
    if (b) rfail(c, at, DDT_ERR_INVALID, "unsupported operand types for %s: '%s' and '%s'", op, type_name(a), type_name(b));
    rfail(c, at, DDT_ERR_INVALID, "bad operand type for %s: '%s'", op, type_name(a));
}

static _Noreturn void overflow(rctx *c, const node *at) {
    rfail(c, at, DDT_ERR_RANGE, "integer result outside the 64-bit range");
}

static jv repeat_seq(rctx *c, const node *at, const jv *seq, int64_t times, uint8_t f) {
    if (times < 0) times = 0;
    if (seq->t == V_STR) {
        if (seq->u.s.n && (uint64_t)times > DDT_JINJA_MAX_OUTPUT / seq->u.s.n)
            rfail(c, at, DDT_ERR_RANGE, "string repetition longer than %u bytes", (unsigned)DDT_JINJA_MAX_OUTPUT);
        sb b = {0};
        for (int64_t k = 0; k < times; k++) sb_put_str(c, &b, seq, 0, seq->u.s.n);
        return sb_value(&b);
    }
    size_t n = seq->u.l->n;
    if (n && (uint64_t)times > (DDT_JINJA_MAX_MEMORY / sizeof(jv)) / n)
        rfail(c, at, DDT_ERR_RANGE, "list repetition too long");
    jlist *l = list_new(c, n * (size_t)times);
    charge(c, at, (uint64_t)l->n / 16 + 1);
    for (int64_t k = 0; k < times; k++)
        if (n) memcpy(l->v + (size_t)k * n, seq->u.l->v, n * sizeof(jv));
    (void)f;
    return v_list(l, seq->f & F_TUPLE);
}

static jv arith(rctx *c, const node *at, int op, const jv *a, const jv *b) {
    uint8_t f = (uint8_t)((v_has_data(a) || v_has_data(b)) ? F_DATA : 0);
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    if (is_num(a) && is_num(b)) {
        bool fl = a->t == V_FLOAT || b->t == V_FLOAT;
        if (op == OP_DIV) {
            double y = num_d(b);
            if (y == 0) rfail(c, at, DDT_ERR_INVALID, "division by zero");
            return v_float(num_d(a) / y, f);
        }
        if (!fl) {
            int64_t x = a->u.i, y = b->u.i, r;
            switch (op) {
            case OP_ADD:
                if (__builtin_add_overflow(x, y, &r)) overflow(c, at);
                return v_int(r, f);
            case OP_SUB:
                if (__builtin_sub_overflow(x, y, &r)) overflow(c, at);
                return v_int(r, f);
            case OP_MUL:
                if (__builtin_mul_overflow(x, y, &r)) overflow(c, at);
                return v_int(r, f);
            case OP_FLOORDIV:
            case OP_MOD:
                if (y == 0) rfail(c, at, DDT_ERR_INVALID, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) overflow(c, at);
                r = x / y;
                {
                    int64_t m = x % y;
                    if (m != 0 && ((m < 0) != (y < 0))) {
                        r--;
                        m += y;
                    }
                    return v_int(op == OP_MOD ? m : r, f);
                }
            case OP_POW:
                if (y < 0) {
                    if (x == 0) rfail(c, at, DDT_ERR_INVALID, "0 cannot be raised to a negative power");
                    return v_float(pow((double)x, (double)y), f);
                }
                r = 1;
                {
                    int64_t base = x;
                    while (y > 0) {
                        if (y & 1)
                            if (__builtin_mul_overflow(r, base, &r)) overflow(c, at);
                        y >>= 1;
                        if (y && __builtin_mul_overflow(base, base, &base)) overflow(c, at);
                    }
                }
                return v_int(r, f);
            default: break;
            }
        } else {
            double x = num_d(a), y = num_d(b), r = 0;
            switch (op) {
            case OP_ADD: r = x + y; break;
            case OP_SUB: r = x - y; break;
            case OP_MUL: r = x * y; break;
            case OP_FLOORDIV:
            case OP_MOD: {
                if (y == 0) rfail(c, at, DDT_ERR_INVALID, "float division or modulo by zero");
                double mod = fmod(x, y), div = (x - mod) / y;
                if (mod != 0) {
                    if ((y < 0) != (mod < 0)) {
                        mod += y;
                        div -= 1.0;
                    }
                } else {
                    mod = copysign(0.0, y);
                }
                double fd;
                if (div != 0) {
                    fd = floor(div);
                    if (div - fd > 0.5) fd += 1.0;
                } else {
                    fd = copysign(0.0, x / y);
                }
                r = op == OP_MOD ? mod : fd;
                break;
            }
            case OP_POW:
                if (x == 0 && y < 0) rfail(c, at, DDT_ERR_INVALID, "0.0 cannot be raised to a negative power");
                if (x < 0 && y != floor(y)) rfail(c, at, DDT_ERR_UNSUPPORTED, "a negative number to a fractional power is complex");
                r = pow(x, y);
                if (isinf(r) && isfinite(x) && isfinite(y)) rfail(c, at, DDT_ERR_RANGE, "float power overflows");
                break;
            default: break;
            }
            return v_float(r, f);
        }
    }
    if (op == OP_ADD && a->t == V_STR && b->t == V_STR) {
        bool markup = (a->f | b->f) & F_MARKUP;
        sb s = {0};
        /* Markup + str escapes the str, as markupsafe does */
        if (markup && !(a->f & F_MARKUP)) put_html_escaped(c, &s, a, str_has_data(a));
        else sb_put_str(c, &s, a, 0, a->u.s.n);
        if (markup && !(b->f & F_MARKUP)) put_html_escaped(c, &s, b, str_has_data(b));
        else sb_put_str(c, &s, b, 0, b->u.s.n);
        jv r = sb_value(&s);
        if (markup) r.f |= F_MARKUP;
        return r;
    }
    if (op == OP_ADD && a->t == V_LIST && b->t == V_LIST && (a->f & F_TUPLE) == (b->f & F_TUPLE)) {
        jlist *l = list_new(c, a->u.l->n + b->u.l->n);
        if (a->u.l->n) memcpy(l->v, a->u.l->v, a->u.l->n * sizeof(jv));
        if (b->u.l->n) memcpy(l->v + a->u.l->n, b->u.l->v, b->u.l->n * sizeof(jv));
        charge(c, at, (uint64_t)l->n / 16 + 1);
        return v_list(l, a->f & F_TUPLE);
    }
    if (op == OP_MUL) {
        if ((a->t == V_STR || a->t == V_LIST) && (b->t == V_INT || b->t == V_BOOL)) return repeat_seq(c, at, a, b->u.i, f);
        if ((b->t == V_STR || b->t == V_LIST) && (a->t == V_INT || a->t == V_BOOL)) return repeat_seq(c, at, b, a->u.i, f);
    }
    if (op == OP_MOD && a->t == V_STR)
        rfail(c, at, DDT_ERR_UNSUPPORTED, "printf-style string formatting ('...' %% x) is not supported");
    type_error(c, at, names[op], a, b);
}

static bool contains(rctx *c, const node *at, const jv *hay, const jv *needle) {
    switch (hay->t) {
    case V_STR:
        if (needle->t != V_STR) {
            if (needle->t == V_UNDEF) undefined_error(c, at, needle);
            rfail(c, at, DDT_ERR_INVALID, "'in <string>' requires a string as left operand, not %s", type_name(needle));
        }
        if (needle->u.s.n == 0) return true;
        if (needle->u.s.n > hay->u.s.n) return false;
        charge(c, at, hay->u.s.n / 64 + 1);
        for (size_t i = 0; i + needle->u.s.n <= hay->u.s.n; i++)
            if (memcmp(hay->u.s.p + i, needle->u.s.p, needle->u.s.n) == 0) return true;
        return false;
    case V_LIST:
        charge(c, at, hay->u.l->n / 16 + 1);
        for (size_t i = 0; i < hay->u.l->n; i++)
            if (py_eq(c, needle, &hay->u.l->v[i], 0)) return true;
        return false;
    case V_DICT:
        if (!hashable(needle)) rfail(c, at, DDT_ERR_INVALID, "unhashable type: '%s'", type_name(needle));
        return dict_find(c, hay->u.dict, needle) != NULL;
    case V_UNDEF: return false;
    default: rfail(c, at, DDT_ERR_INVALID, "argument of type '%s' is not iterable", type_name(hay));
    }
}

/* ---- calls */

typedef struct argbuf {
    jv pos[32];
    jv kw[16];
    args a;
} argbuf;

static void eval_args(rctx *c, const node *x, argbuf *ab, const jv *first) {
    size_t np = x->n + (first ? 1 : 0);
    if (np > 32 || x->n2 > 16) rfail(c, x, DDT_ERR_UNSUPPORTED, "more than 32 positional or 16 keyword arguments");
    size_t k = 0;
    if (first) ab->pos[k++] = *first;
    for (size_t i = 0; i < x->n; i++) ab->pos[k++] = eval(c, x->items[i]);
    for (size_t i = 0; i < x->n2; i++) ab->kw[i] = eval(c, x->items2[i]);
    ab->a = (args){ab->pos, np, x->names, ab->kw, x->n2};
}

static jv capture_body(rctx *c, const node *body) {
    sb cap = {0};
    sb *saved = c->out;
    c->out = &cap;
    exec_node(c, body);
    c->out = saved;
    return sb_value(&cap);
}

static bool sref_eq(sref a, sref b) { return a.n == b.n && memcmp(a.p, b.p, a.n) == 0; }

static jv call_macro(rctx *c, const node *at, const jv *m, const args *a) {
    const node *def = m->u.mac.def;
    if (++c->macro_depth > DDT_JINJA_MAX_DEPTH)
        rfail(c, at, DDT_ERR_RANGE, "macro calls nested deeper than %d levels", DDT_JINJA_MAX_DEPTH);
    bool varargs = def->flags & 1, kwargs = def->flags & 2;
    if (a->npos > def->n && !varargs)
        rfail(c, at, DDT_ERR_INVALID, "macro '%.*s' takes not more than %zu argument(s)", (int)def->str.n, def->str.p, def->n);
    scope *s = scope_new(c, m->u.mac.sc);
    jdict *kwd = dict_new(c, 0);
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i = 0;
        while (i < def->n && !sref_eq(def->items[i]->str, a->kwn[k])) i++;
        if (i == def->n) {
            if (!kwargs)
                rfail(c, at, DDT_ERR_INVALID, "macro '%.*s' takes no keyword argument '%.*s'", (int)def->str.n, def->str.p,
                      (int)a->kwn[k].n, a->kwn[k].p);
            jv key = v_str_raw(a->kwn[k].p, a->kwn[k].n, NULL, 0);
            dict_set(c, kwd, &key, &a->kwv[k]);
        } else if (i < a->npos) {
            rfail(c, at, DDT_ERR_INVALID, "macro '%.*s' got multiple values for argument '%.*s'", (int)def->str.n,
                  def->str.p, (int)a->kwn[k].n, a->kwn[k].p);
        }
    }
    scope *saved_sc = c->sc;
    int saved_ctl = c->ctl;
    c->sc = s;
    /* parameters bind in order; a default may refer to the parameters before it */
    for (size_t i = 0; i < def->n; i++) {
        const node *p = def->items[i];
        const jv *v = i < a->npos ? &a->pos[i] : NULL;
        for (size_t k = 0; !v && k < a->nkw; k++)
            if (sref_eq(a->kwn[k], p->str)) v = &a->kwv[k];
        jv val = v ? *v : def->items2[i] ? eval(c, def->items2[i]) : v_undef(p->str.p, p->str.n);
        assign(c, s, p, &val);
    }
    if (varargs) {
        size_t extra = a->npos > def->n ? a->npos - def->n : 0;
        jlist *l = list_new(c, extra);
        for (size_t i = 0; i < extra; i++) l->v[i] = a->pos[def->n + i];
        jv k = v_cstr("varargs");
        jv v = v_list(l, F_TUPLE);
        dict_set(c, &s->vars, &k, &v);
    }
    if (kwargs) {
        jv k = v_cstr("kwargs");
        jv v = v_dict(kwd);
        dict_set(c, &s->vars, &k, &v);
    }
    jv out = capture_body(c, def->d);
    c->sc = saved_sc;
    c->ctl = saved_ctl;
    c->macro_depth--;
    return out;
}

static int64_t want_int(rctx *c, const node *at, const jv *v, const char *what) {
    if (v->t == V_INT || v->t == V_BOOL) return v->u.i;
    if (v->t == V_UNDEF) undefined_error(c, at, v);
    rfail(c, at, DDT_ERR_INVALID, "%s must be an integer, not %s", what, type_name(v));
}

static jv call_func(rctx *c, const node *at, int id, const args *a) {
    switch (id) {
    case FN_RANGE: {
        if (a->npos < 1 || a->npos > 3) rfail(c, at, DDT_ERR_INVALID, "range expected 1 to 3 arguments, got %zu", a->npos);
        int64_t start = 0, stop, step = 1;
        if (a->npos == 1) {
            stop = want_int(c, at, &a->pos[0], "range()'s argument");
        } else {
            start = want_int(c, at, &a->pos[0], "range()'s start");
            stop = want_int(c, at, &a->pos[1], "range()'s stop");
            if (a->npos == 3) step = want_int(c, at, &a->pos[2], "range()'s step");
        }
        if (step == 0) rfail(c, at, DDT_ERR_INVALID, "range() step must not be zero");
        /* counted in doubles so that no bound of int64 overflows */
        double cnt = step > 0 ? ceil(((double)stop - (double)start) / (double)step) : ceil(((double)start - (double)stop) / (double)-step);
        if (cnt < 0) cnt = 0;
        if (cnt > DDT_JINJA_MAX_RANGE)
            rfail(c, at, DDT_ERR_RANGE, "range of %.0f items is over the sandbox's bound of %d", cnt, DDT_JINJA_MAX_RANGE);
        size_t n = (size_t)cnt;
        charge(c, at, n);
        jlist *l = list_new(c, n);
        for (size_t i = 0; i < n; i++) l->v[i] = v_int(start + (int64_t)i * step, 0);
        return v_list(l, 0);
    }
    case FN_NAMESPACE:
    case FN_DICT: {
        jdict *d = dict_new(c, a->nkw + 4);
        if (a->npos > 1) rfail(c, at, DDT_ERR_INVALID, "%s() takes at most one positional argument", FN_NAMES[id]);
        if (a->npos == 1) {
            const jv *src = &a->pos[0];
            if (src->t == V_DICT || src->t == V_NS) {
                for (size_t i = 0; i < src->u.dict->n; i++) dict_set(c, d, &src->u.dict->k[i], &src->u.dict->v[i]);
            } else if (src->t == V_LIST) {
                for (size_t i = 0; i < src->u.l->n; i++) {
                    const jv *pr = &src->u.l->v[i];
                    if (pr->t != V_LIST || pr->u.l->n != 2)
                        rfail(c, at, DDT_ERR_INVALID, "%s(): each item must be a pair", FN_NAMES[id]);
                    if (!hashable(&pr->u.l->v[0])) rfail(c, at, DDT_ERR_INVALID, "unhashable key");
                    dict_set(c, d, &pr->u.l->v[0], &pr->u.l->v[1]);
                }
            } else if (src->t != V_UNDEF) {
                rfail(c, at, DDT_ERR_INVALID, "%s() cannot take a %s", FN_NAMES[id], type_name(src));
            }
        }
        for (size_t k = 0; k < a->nkw; k++) {
            jv key = v_str_raw(a->kwn[k].p, a->kwn[k].n, NULL, 0);
            dict_set(c, d, &key, &a->kwv[k]);
        }
        if (id == FN_DICT) return v_dict(d);
        jv v = {.t = V_NS};
        v.u.dict = d;
        return v;
    }
    case FN_RAISE: {
        const jv *m = arg(a, 0, "message");
        jv s = m ? to_str(c, m) : v_cstr("");
        rfail(c, at, DDT_ERR_INVALID, "template raised: %.*s", (int)(s.u.s.n > 400 ? 400 : s.u.s.n), s.u.s.p);
    }
    case FN_STRFTIME:
        rfail(c, at, DDT_ERR_UNSUPPORTED, "strftime_now() is not supported: a render must not depend on the clock");
    default: break;
    }
    rfail(c, at, DDT_ERR_INTERNAL, "unknown built-in function %d", id);
}

static jv call_value(rctx *c, const node *at, const jv *f, const args *a) {
    charge(c, at, 1);
    switch (f->t) {
    case V_MACRO: return call_macro(c, at, f, a);
    case V_FUNC: return call_func(c, at, f->id, a);
    case V_METHOD: return method_at(f->id)->fn(c, at, f->u.meth.self, a);
    case V_UNDEF: undefined_error(c, at, f);
    default: rfail(c, at, DDT_ERR_INVALID, "'%s' object is not callable", type_name(f));
    }
}

/* A filter or test name (kind says which) that names none: in the template, or given to map/select as a string. */
static _Noreturn void no_such(rctx *c, const node *at, const char *kind, const char *p, size_t n) {
    rfail(c, at, DDT_ERR_INVALID, "no %s named '%.*s'", kind, (int)(n > 40 ? 40 : n), p);
}

static jv apply_filter(rctx *c, const node *at, int id, const jv *in, const args *a) {
    charge(c, at, 1);
    if (id == NO_SUCH) no_such(c, at, "filter", at->str.p, at->str.n);
    return filter_at(id)->fn(c, at, in, a);
}

static bool apply_test(rctx *c, const node *at, int id, const jv *in, const args *a) {
    charge(c, at, 1);
    if (id == NO_SUCH) no_such(c, at, "test", at->str.p, at->str.n);
    return test_at(id)->fn(c, at, in, a);
}

static jv eval_inner(rctx *c, const node *x) {
    switch (x->kind) {
    case N_CONST: return x->val;
    case N_NAME: return lookup(c, c->sc, x->str);
    case N_CAPTURED: return c->captured;
    case N_TUPLE:
    case N_LIST: {
        jlist *l = list_new(c, x->n);
        for (size_t i = 0; i < x->n; i++) l->v[i] = eval(c, x->items[i]);
        return v_list(l, x->kind == N_TUPLE ? F_TUPLE : 0);
    }
    case N_DICT: {
        jdict *d = dict_new(c, x->n);
        for (size_t i = 0; i < x->n; i++) {
            jv k = eval(c, x->items[i]);
            if (!hashable(&k)) rfail(c, x->items[i], DDT_ERR_INVALID, "unhashable type: '%s'", type_name(&k));
            jv v = eval(c, x->items2[i]);
            dict_set(c, d, &k, &v);
        }
        return v_dict(d);
    }
    case N_GETATTR: {
        jv o = eval(c, x->a);
        return get_attr(c, x, &o, x->str.p, x->str.n);
    }
    case N_GETITEM: {
        jv o = eval(c, x->a);
        jv k = eval(c, x->b);
        return get_item(c, x, &o, &k);
    }
    case N_SLICE: {
        jv o = eval(c, x->a);
        jv s[3];
        const node *parts[3] = {x->b, x->c, x->d};
        for (int k = 0; k < 3; k++) s[k] = parts[k] ? eval(c, parts[k]) : v_none();
        return do_slice(c, x, &o, &s[0], &s[1], &s[2]);
    }
    case N_CALL:
    case N_FILTER:
    case N_TEST: {
        /* the callee or input first, then the arguments (Python's order); a test's input is
         * evaluated as any value: `d.missing is defined` gets an undefined, not an error */
        jv in = eval(c, x->a);
        argbuf ab;
        eval_args(c, x, &ab, NULL);
        if (x->kind == N_CALL) return call_value(c, x, &in, &ab.a);
        if (x->kind == N_FILTER) return apply_filter(c, x, x->op, &in, &ab.a);
        bool r = apply_test(c, x, x->op, &in, &ab.a);
        return v_bool((x->flags & 1) ? !r : r);
    }
    case N_BINOP: {
        jv a = eval(c, x->a);
        jv b = eval(c, x->b);
        if (x->op == OP_CONCAT) {
            sb s = {0};
            put_text(c, &s, &a);
            put_text(c, &s, &b);
            return sb_value(&s);
        }
        return arith(c, x, x->op, &a, &b);
    }
    case N_UNARY: {
        jv a = eval(c, x->a);
        if (x->op == OP_NOT) return v_bool(!truthy(&a));
        if (!is_num(&a)) type_error(c, x, x->op == OP_NEG ? "unary -" : "unary +", &a, NULL);
        if (x->op == OP_POS) return a.t == V_BOOL ? v_int(a.u.i, a.f) : a;
        if (a.t == V_FLOAT) return v_float(-a.u.d, a.f);
        if (a.u.i == INT64_MIN) overflow(c, x);
        return v_int(-a.u.i, a.f);
    }
    case N_AND: {
        jv a = eval(c, x->a);
        return truthy(&a) ? eval(c, x->b) : a;
    }
    case N_OR: {
        jv a = eval(c, x->a);
        return truthy(&a) ? a : eval(c, x->b);
    }
    case N_COMPARE: {
        jv left = eval(c, x->a);
        for (size_t i = 0; i < x->n; i++) {
            jv right = eval(c, x->items[i]);
            bool r;
            switch (x->ops[i]) {
            case OP_EQ: r = py_eq(c, &left, &right, 0); break;
            case OP_NE: r = !py_eq(c, &left, &right, 0); break;
            case OP_LT: r = py_cmp(c, x, &left, &right, 0) < 0; break;
            case OP_LE: r = py_cmp(c, x, &left, &right, 0) <= 0; break;
            case OP_GT: r = py_cmp(c, x, &left, &right, 0) > 0; break;
            case OP_GE: r = py_cmp(c, x, &left, &right, 0) >= 0; break;
            case OP_IN: r = contains(c, x, &right, &left); break;
            default: r = !contains(c, x, &right, &left); break;
            }
            /* NaN: every ordering comparison is False in Python */
            if (x->ops[i] >= OP_LT && x->ops[i] <= OP_GE && ((left.t == V_FLOAT && isnan(left.u.d)) || (right.t == V_FLOAT && isnan(right.u.d))))
                r = false;
            if (!r) return v_bool(false);
            left = right;
        }
        return v_bool(true);
    }
    case N_COND: {
        jv t = eval(c, x->a);
        if (truthy(&t)) return eval(c, x->b);
        return x->c ? eval(c, x->c) : v_undef("conditional expression", 22);
    }
    default: break;
    }
    rfail(c, x, DDT_ERR_INTERNAL, "cannot evaluate node kind %d", x->kind);
}

static jv eval(rctx *c, const node *x) {
    enter_rt(c, x);
    charge(c, x, 1);
    jv v = eval_inner(c, x);
    c->depth--;
    return v;
}

static void exec_for(rctx *c, const node *x) {
    jv it = eval(c, x->b);
    size_t n;
    const jv *items = iter_items(c, x->b, &it, &n);
    scope *outer = c->sc;
    if (x->c && n > 0) {
        /* `for x in xs if cond`: filter first, so that loop.length and loop.last count kept items */
        jv *kept = ralloc(c, n * sizeof *kept);
        size_t k = 0;
        scope *s = scope_new(c, outer);
        c->sc = s;
        for (size_t i = 0; i < n; i++) {
            s->vars.n = 0;
            assign(c, s, x->a, &items[i]);
            jv t = eval(c, x->c);
            if (truthy(&t)) kept[k++] = items[i];
        }
        c->sc = outer;
        items = kept;
        n = k;
    }
    if (n == 0) {
        if (x->e) exec_node(c, x->e);
        return;
    }
    /* jinja2 runs the else block unless some iteration reached the end of the body:
     * an iteration left by break or continue does not count */
    bool completed = false;
    loopstate *L = ralloc(c, sizeof *L);
    L->items = items;
    L->n = n;
    L->i = 0;
    L->depth = 1;
    jv loopv = {.t = V_LOOP};
    loopv.u.loop = L;
    jv loopk = v_cstr("loop");
    scope *s = NULL;
    for (size_t i = 0; i < n; i++) {
        L->i = i;
        /* a fresh scope per iteration: a `set` inside the body does not outlive it (jinja2's
         * scoping); the previous one is reused unless a macro defined in it keeps it */
        if (!s || s->captured) s = scope_new(c, outer);
        s->vars.n = 0;
        c->sc = s;
        dict_set(c, &s->vars, &loopk, &loopv);
        assign(c, s, x->a, &items[i]);
        exec_node(c, x->d);
        c->sc = outer;
        if (c->ctl == CTL_NONE) completed = true;
        if (c->ctl == CTL_BREAK) {
            c->ctl = CTL_NONE;
            break;
        }
        c->ctl = CTL_NONE;
    }
    if (!completed && x->e) exec_node(c, x->e);
}

static void exec_node(rctx *c, const node *x) {
    enter_rt(c, x);
    charge(c, x, 1);
    switch (x->kind) {
    case N_BODY:
        for (size_t i = 0; i < x->n && c->ctl == CTL_NONE; i++) exec_node(c, x->items[i]);
        break;
    case N_TEXT: sb_put(c, c->out, x->str.p, x->str.n, 0); break;
    case N_OUTPUT: {
        jv v = eval(c, x->a);
        put_text(c, c->out, &v);
        break;
    }
    case N_IF: {
        size_t i = 0;
        for (; i < x->n; i++) {
            jv t = eval(c, x->items[i]);
            if (truthy(&t)) {
                exec_node(c, x->items2[i]);
                break;
            }
        }
        if (i == x->n && x->c) exec_node(c, x->c);
        break;
    }
    case N_FOR: exec_for(c, x); break;
    case N_SET: {
        jv v = eval(c, x->b);
        assign(c, c->sc, x->a, &v);
        break;
    }
    case N_SETBLOCK:
    case N_FILTERBLOCK: {
        /* the body renders in an inner scope: its own sets do not leak (jinja2's frame.inner()) */
        scope *outer = c->sc;
        c->sc = scope_new(c, outer);
        jv v = capture_body(c, x->d);
        c->sc = outer;
        if (x->c) {
            jv saved = c->captured;
            c->captured = v;
            v = eval(c, x->c);
            c->captured = saved;
        }
        if (x->kind == N_SETBLOCK) assign(c, c->sc, x->a, &v);
        else put_text(c, c->out, &v);
        break;
    }
    case N_MACRO: {
        jv m = {.t = V_MACRO};
        m.u.mac.def = x;
        m.u.mac.sc = c->sc;
        for (scope *p = c->sc; p; p = p->parent) p->captured = true;
        jv k = v_str_raw(x->str.p, x->str.n, NULL, 0);
        dict_set(c, &c->sc->vars, &k, &m);
        break;
    }
    case N_BREAK: c->ctl = CTL_BREAK; break;
    case N_CONTINUE: c->ctl = CTL_CONTINUE; break;
    default: rfail(c, x, DDT_ERR_INTERNAL, "cannot execute node kind %d", x->kind);
    }
    c->depth--;
}

/* ================================================================ 6. filters, tests, methods */

static int fl_of(const jv *v) { return v_has_data(v) ? 1 : 0; }

static jv want_str(rctx *c, const node *at, const jv *v, const char *what) {
    if (v->t == V_STR) return *v;
    if (v->t == V_UNDEF) undefined_error(c, at, v);
    rfail(c, at, DDT_ERR_INVALID, "%s must be a string, not %s", what, type_name(v));
}

static size_t str_len_cp(const jv *s) {
    size_t cnt = 0;
    for (size_t i = 0; i < s->u.s.n; i++)
        if (((unsigned char)s->u.s.p[i] & 0xc0) != 0x80) cnt++;
    return cnt;
}

static char ascii_upper(char ch) { return ch >= 'a' && ch <= 'z' ? (char)(ch - 32) : ch; }
static char ascii_lower(char ch) { return ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch; }
static bool ascii_alpha(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'); }

/* Case mappings cover ASCII; other characters pass through unchanged. */
enum { CASE_UPPER, CASE_LOWER, CASE_TITLE_STR, CASE_TITLE_FILTER, CASE_CAPITALIZE };

static jv case_map(rctx *c, const jv *in, int mode) {
    jv s = to_str(c, in);
    int fl = str_has_data(&s);
    sb b = {0};
    sb_reserve(c, &b, s.u.s.n + 1);
    bool prev_cased = false, word_start = true;
    for (size_t i = 0; i < s.u.s.n; i++) {
        char ch = s.u.s.p[i], o = ch;
        switch (mode) {
        case CASE_UPPER: o = ascii_upper(ch); break;
        case CASE_LOWER: o = ascii_lower(ch); break;
        case CASE_TITLE_STR:
            o = prev_cased ? ascii_lower(ch) : ascii_upper(ch);
            prev_cased = ascii_alpha(ch); /* non-ASCII counts as uncased (right for CJK and emoji) */
            break;
        case CASE_TITLE_FILTER: {
            bool delim = ch == '-' || ch == '(' || ch == '{' || ch == '[' || ch == '<' || py_space_at(s.u.s.p, i, s.u.s.n);
            if (delim) {
                word_start = true;
            } else {
                o = word_start ? ascii_upper(ch) : ascii_lower(ch);
                word_start = false;
            }
            break;
        }
        default: o = i == 0 ? ascii_upper(ch) : ascii_lower(ch); break;
        }
        sb_putc(c, &b, o, fl);
    }
    return sb_value(&b);
}

/* The set of code points in chars (for strip(chars)); NULL means whitespace. */
static bool cp_in(const jv *chars, const char *p, size_t i, size_t n, size_t *len) {
    if (!chars) {
        *len = py_space_at(p, i, n);
        if (*len) return true;
        *len = utf8_len_at(p, i, n);
        return false;
    }
    *len = utf8_len_at(p, i, n);
    for (size_t k = 0; k < chars->u.s.n;) {
        size_t l = utf8_len_at(chars->u.s.p, k, chars->u.s.n);
        if (l == *len && memcmp(chars->u.s.p + k, p + i, l) == 0) return true;
        k += l;
    }
    return false;
}

static jv strip_impl(rctx *c, const node *at, const jv *s, const jv *chars_arg, bool left, bool right) {
    const jv *chars = NULL;
    jv cs;
    if (chars_arg && chars_arg->t != V_NONE && chars_arg->t != V_UNDEF) {
        cs = want_str(c, at, chars_arg, "strip()'s argument");
        chars = &cs;
    }
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, lo = 0, hi = n, l;
    charge(c, at, n / 64 + 1);
    if (left)
        while (lo < hi && cp_in(chars, p, lo, hi, &l)) lo += l;
    if (right)
        while (hi > lo) {
            size_t j = utf8_prev(p, hi);
            if (!cp_in(chars, p, j, hi, &l) || j + l != hi) break;
            hi = j;
        }
    return substr(s, lo, hi - lo);
}

static jv m_strip(rctx *c, const node *at, const jv *self, const args *a) { return strip_impl(c, at, self, arg(a, 0, "chars"), true, true); }
static jv m_lstrip(rctx *c, const node *at, const jv *self, const args *a) { return strip_impl(c, at, self, arg(a, 0, "chars"), true, false); }
static jv m_rstrip(rctx *c, const node *at, const jv *self, const args *a) { return strip_impl(c, at, self, arg(a, 0, "chars"), false, true); }

static const char *find_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

static const char *rfind_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

static jv split_impl(rctx *c, const node *at, const jv *s, const args *a, bool from_right) {
    const jv *sepv = arg(a, 0, "sep");
    const jv *maxv = arg(a, 1, "maxsplit");
    int64_t maxsplit = maxv ? want_int(c, at, maxv, "maxsplit") : -1;
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    charge(c, at, n / 16 + 1);
    jv *parts = ralloc(c, (n + 2) * sizeof *parts);
    size_t np = 0;
    if (!sepv || sepv->t == V_NONE) {
        if (!from_right) {
            size_t i = 0;
            for (;;) {
                i = skip_space(p, i, n);
                if (i >= n) break;
                if (maxsplit >= 0 && (int64_t)np == maxsplit) {
                    size_t e = py_rstrip_len(p, n);
                    parts[np++] = substr(s, i, (e > i ? e : n) - i);
                    break;
                }
                size_t j = i;
                while (j < n && py_space_at(p, j, n) == 0) j += utf8_len_at(p, j, n);
                parts[np++] = substr(s, i, j - i);
                i = j;
            }
        } else {
            size_t e = n;
            for (;;) {
                e = py_rstrip_len(p, e);
                if (e == 0) break;
                if (maxsplit >= 0 && (int64_t)np == maxsplit) {
                    size_t b0 = skip_space(p, 0, e);
                    parts[np++] = substr(s, b0, e - b0);
                    break;
                }
                size_t j = e;
                while (j > 0) {
                    size_t k = utf8_prev(p, j);
                    if (py_space_at(p, k, j) == j - k) break;
                    j = k;
                }
                parts[np++] = substr(s, j, e - j);
                e = j;
            }
        }
    } else {
        jv sep = want_str(c, at, sepv, "split()'s separator");
        if (sep.u.s.n == 0) rfail(c, at, DDT_ERR_INVALID, "empty separator");
        if (!from_right) {
            size_t i = 0;
            for (;;) {
                const char *f = (maxsplit >= 0 && (int64_t)np >= maxsplit) ? NULL : find_bytes(p + i, n - i, sep.u.s.p, sep.u.s.n);
                if (!f) {
                    parts[np++] = substr(s, i, n - i);
                    break;
                }
                size_t at_ = (size_t)(f - p);
                parts[np++] = substr(s, i, at_ - i);
                i = at_ + sep.u.s.n;
            }
        } else {
            size_t e = n;
            for (;;) {
                const char *f = (maxsplit >= 0 && (int64_t)np >= maxsplit) ? NULL : rfind_bytes(p, e, sep.u.s.p, sep.u.s.n);
                if (!f) {
                    parts[np++] = substr(s, 0, e);
                    break;
                }
                size_t at_ = (size_t)(f - p);
                parts[np++] = substr(s, at_ + sep.u.s.n, e - at_ - sep.u.s.n);
                e = at_;
            }
        }
    }
    /* rsplit cuts from the end, so its parts came last first */
    for (size_t k = 0; from_right && k < np / 2; k++) {
        jv t = parts[k];
        parts[k] = parts[np - 1 - k];
        parts[np - 1 - k] = t;
    }
    return list_of(c, parts, np);
}

static jv m_split(rctx *c, const node *at, const jv *self, const args *a) { return split_impl(c, at, self, a, false); }
static jv m_rsplit(rctx *c, const node *at, const jv *self, const args *a) { return split_impl(c, at, self, a, true); }

/*
 * The argument that str.find(), rfind(), count(), startswith() and endswith()
 * cannot do without (kw: its keyword name, or NULL for positional only).
 * refuse_range: start/end arguments fail as unsupported.  rfind() and count()
 * pass false and ignore them, unlike Python: left so until a test pins a fix.
 */
static const jv *needle_arg(rctx *c, const node *at, const args *a, const char *kw, const char *fname, bool refuse_range) {
    const jv *x = arg(a, 0, kw);
    if (!x) rfail(c, at, DDT_ERR_INVALID, "%s() takes at least 1 argument", fname);
    if (refuse_range && a->npos > 1) rfail(c, at, DDT_ERR_UNSUPPORTED, "start/end arguments of %s() are not supported", fname);
    return x;
}

/* needle_arg() as a string: "sub" of find(), rfind() and count(). */
static jv sub_arg(rctx *c, const node *at, const args *a, const char *fname, bool refuse_range) {
    char what[32];
    snprintf(what, sizeof what, "%s()'s argument", fname);
    return want_str(c, at, needle_arg(c, at, a, "sub", fname, refuse_range), what);
}

static bool affix_one(rctx *c, const node *at, const jv *s, const jv *x, bool end) {
    jv w = want_str(c, at, x, end ? "endswith()'s argument" : "startswith()'s argument");
    if (w.u.s.n > s->u.s.n) return false;
    return memcmp(s->u.s.p + (end ? s->u.s.n - w.u.s.n : 0), w.u.s.p, w.u.s.n) == 0;
}

static jv affix(rctx *c, const node *at, const jv *s, const args *a, bool end) {
    const jv *x = needle_arg(c, at, a, NULL, end ? "endswith" : "startswith", true);
    if (x->t == V_LIST && (x->f & F_TUPLE)) {
        for (size_t i = 0; i < x->u.l->n; i++)
            if (affix_one(c, at, s, &x->u.l->v[i], end)) return v_bool(true);
        return v_bool(false);
    }
    return v_bool(affix_one(c, at, s, x, end));
}

static jv m_startswith(rctx *c, const node *at, const jv *self, const args *a) { return affix(c, at, self, a, false); }
static jv m_endswith(rctx *c, const node *at, const jv *self, const args *a) { return affix(c, at, self, a, true); }
/* upper, lower and capitalize are both str methods and filters, with one meaning (title is not: see CASE_TITLE_*) */
static jv upper_fn(rctx *c, const node *at, const jv *v, const args *a) { (void)at; (void)a; return case_map(c, v, CASE_UPPER); }
static jv lower_fn(rctx *c, const node *at, const jv *v, const args *a) { (void)at; (void)a; return case_map(c, v, CASE_LOWER); }
static jv capitalize_fn(rctx *c, const node *at, const jv *v, const args *a) { (void)at; (void)a; return case_map(c, v, CASE_CAPITALIZE); }
static jv m_title(rctx *c, const node *at, const jv *self, const args *a) { (void)at; (void)a; return case_map(c, self, CASE_TITLE_STR); }

static jv replace_impl(rctx *c, const node *at, const jv *s, const jv *oldv, const jv *newv, const jv *countv) {
    jv o = want_str(c, at, oldv, "replace()'s first argument");
    jv nw = want_str(c, at, newv, "replace()'s second argument");
    int64_t count = countv && countv->t != V_NONE ? want_int(c, at, countv, "replace()'s count") : -1;
    sb b = {0};
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = 0;
    int64_t done = 0;
    if (o.u.s.n == 0) {
        /* Python inserts the replacement before every character and at the end */
        while (count < 0 || done < count) {
            sb_put_str(c, &b, &nw, 0, nw.u.s.n);
            done++;
            if (i >= n) break;
            size_t l = utf8_len_at(p, i, n);
            sb_put_str(c, &b, s, i, l);
            i += l;
        }
        sb_put_str(c, &b, s, i, n - i);
        return sb_value(&b);
    }
    while (count < 0 || done < count) {
        const char *f = find_bytes(p + i, n - i, o.u.s.p, o.u.s.n);
        if (!f) break;
        size_t k = (size_t)(f - p);
        sb_put_str(c, &b, s, i, k - i);
        sb_put_str(c, &b, &nw, 0, nw.u.s.n);
        i = k + o.u.s.n;
        done++;
    }
    if (done == 0) return *s;
    sb_put_str(c, &b, s, i, n - i);
    return sb_value(&b);
}

static jv m_replace(rctx *c, const node *at, const jv *self, const args *a) {
    const jv *o = arg(a, 0, "old"), *n = arg(a, 1, "new");
    if (!o || !n) rfail(c, at, DDT_ERR_INVALID, "replace() takes at least 2 arguments");
    return replace_impl(c, at, self, o, n, arg(a, 2, "count"));
}

/* str.find() / rfind(): the code-point index of the first / last occurrence, or -1. */
static jv find_impl(rctx *c, const node *at, const jv *self, const args *a, bool from_right) {
    jv w = sub_arg(c, at, a, from_right ? "rfind" : "find", !from_right);
    const char *f = (from_right ? rfind_bytes : find_bytes)(self->u.s.p, self->u.s.n, w.u.s.p, w.u.s.n);
    if (!f) return v_int(-1, 0);
    jv pre = substr(self, 0, (size_t)(f - self->u.s.p));
    return v_int((int64_t)str_len_cp(&pre), 0);
}

static jv m_find(rctx *c, const node *at, const jv *self, const args *a) { return find_impl(c, at, self, a, false); }
static jv m_rfind(rctx *c, const node *at, const jv *self, const args *a) { return find_impl(c, at, self, a, true); }

static jv m_str_count(rctx *c, const node *at, const jv *self, const args *a) {
    jv w = sub_arg(c, at, a, "count", false);
    if (w.u.s.n == 0) return v_int((int64_t)str_len_cp(self) + 1, 0);
    int64_t cnt = 0;
    size_t i = 0;
    const char *f;
    while ((f = find_bytes(self->u.s.p + i, self->u.s.n - i, w.u.s.p, w.u.s.n)) != NULL) {
        cnt++;
        i = (size_t)(f - self->u.s.p) + w.u.s.n;
    }
    return v_int(cnt, 0);
}

static jv m_join(rctx *c, const node *at, const jv *self, const args *a) {
    const jv *x = arg(a, 0, "iterable");
    if (!x) rfail(c, at, DDT_ERR_INVALID, "join() takes exactly one argument");
    size_t n;
    const jv *items = iter_items(c, at, x, &n);
    sb b = {0};
    for (size_t i = 0; i < n; i++) {
        if (items[i].t != V_STR)
            rfail(c, at, DDT_ERR_INVALID, "sequence item %zu: expected str instance, %s found", i, type_name(&items[i]));
        if (i) sb_put_str(c, &b, self, 0, self->u.s.n);
        sb_put_str(c, &b, &items[i], 0, items[i].u.s.n);
    }
    return sb_value(&b);
}

static jv m_format(rctx *c, const node *at, const jv *self, const args *a) {
    (void)self;
    (void)a;
    rfail(c, at, DDT_ERR_UNSUPPORTED, "str.format() is not supported");
}

static jv str_pred(const jv *s, int kind) {
    if (s->u.s.n == 0) return v_bool(false);
    bool any_cased = false;
    for (size_t i = 0; i < s->u.s.n; i++) {
        char ch = s->u.s.p[i];
        bool ok;
        switch (kind) {
        case 0: ok = is_digit(ch); break;
        case 1: ok = ascii_alpha(ch); break;
        case 2: ok = is_digit(ch) || ascii_alpha(ch); break;
        case 3: ok = py_space_at(s->u.s.p, i, s->u.s.n) > 0; break;
        case 4:
            if (ch >= 'A' && ch <= 'Z') return v_bool(false);
            any_cased |= ch >= 'a' && ch <= 'z';
            ok = true;
            break;
        default:
            if (ch >= 'a' && ch <= 'z') return v_bool(false);
            any_cased |= ch >= 'A' && ch <= 'Z';
            ok = true;
            break;
        }
        if (!ok) return v_bool(false);
    }
    return v_bool(kind >= 4 ? any_cased : true);
}

static jv m_isdigit(rctx *c, const node *at, const jv *self, const args *a) { (void)c; (void)at; (void)a; return str_pred(self, 0); }
static jv m_isalpha(rctx *c, const node *at, const jv *self, const args *a) { (void)c; (void)at; (void)a; return str_pred(self, 1); }
static jv m_isalnum(rctx *c, const node *at, const jv *self, const args *a) { (void)c; (void)at; (void)a; return str_pred(self, 2); }
static jv m_isspace(rctx *c, const node *at, const jv *self, const args *a) { (void)c; (void)at; (void)a; return str_pred(self, 3); }
static jv m_islower(rctx *c, const node *at, const jv *self, const args *a) { (void)c; (void)at; (void)a; return str_pred(self, 4); }
static jv m_isupper(rctx *c, const node *at, const jv *self, const args *a) { (void)c; (void)at; (void)a; return str_pred(self, 5); }

static jv dict_pairs(rctx *c, const jdict *d) {
    jlist *l = list_new(c, d->n);
    for (size_t i = 0; i < d->n; i++) {
        jlist *p = list_new(c, 2);
        p->v[0] = d->k[i];
        p->v[1] = d->v[i];
        l->v[i] = v_list(p, F_TUPLE);
    }
    return v_list(l, 0);
}

static jv m_items(rctx *c, const node *at, const jv *self, const args *a) { (void)at; (void)a; return dict_pairs(c, self->u.dict); }
static jv m_keys(rctx *c, const node *at, const jv *self, const args *a) { (void)at; (void)a; return list_of(c, self->u.dict->k, self->u.dict->n); }
static jv m_values(rctx *c, const node *at, const jv *self, const args *a) { (void)at; (void)a; return list_of(c, self->u.dict->v, self->u.dict->n); }
static jv m_get(rctx *c, const node *at, const jv *self, const args *a) {
    if (a->npos < 1 || a->npos > 2) rfail(c, at, DDT_ERR_INVALID, "get() takes 1 or 2 arguments");
    if (!hashable(&a->pos[0])) rfail(c, at, DDT_ERR_INVALID, "unhashable type: '%s'", type_name(&a->pos[0]));
    jv *v = dict_find(c, self->u.dict, &a->pos[0]);
    if (v) return *v;
    return a->npos == 2 ? a->pos[1] : v_none();
}
static jv m_list_index(rctx *c, const node *at, const jv *self, const args *a) {
    if (a->npos != 1) rfail(c, at, DDT_ERR_UNSUPPORTED, "index() takes exactly one argument here");
    for (size_t i = 0; i < self->u.l->n; i++)
        if (py_eq(c, &self->u.l->v[i], &a->pos[0], 0)) return v_int((int64_t)i, 0);
    rfail(c, at, DDT_ERR_INVALID, "index(): the value is not in the list");
}
static jv m_list_count(rctx *c, const node *at, const jv *self, const args *a) {
    if (a->npos != 1) rfail(c, at, DDT_ERR_INVALID, "count() takes exactly one argument");
    int64_t n = 0;
    for (size_t i = 0; i < self->u.l->n; i++)
        if (py_eq(c, &self->u.l->v[i], &a->pos[0], 0)) n++;
    return v_int(n, 0);
}
static jv m_cycle(rctx *c, const node *at, const jv *self, const args *a) {
    if (a->npos == 0) rfail(c, at, DDT_ERR_INVALID, "no items for cycling given");
    (void)c;
    return a->pos[self->u.loop->i % a->npos];
}

static const method_def METHODS[] = {
    {"strip", V_STR, m_strip},         {"lstrip", V_STR, m_lstrip},       {"rstrip", V_STR, m_rstrip},
    {"split", V_STR, m_split},         {"rsplit", V_STR, m_rsplit},       {"startswith", V_STR, m_startswith},
    {"endswith", V_STR, m_endswith},   {"upper", V_STR, upper_fn},        {"lower", V_STR, lower_fn},
    {"title", V_STR, m_title},         {"capitalize", V_STR, capitalize_fn}, {"replace", V_STR, m_replace},
    {"find", V_STR, m_find},           {"rfind", V_STR, m_rfind},         {"count", V_STR, m_str_count},
    {"join", V_STR, m_join},           {"format", V_STR, m_format},       {"isdigit", V_STR, m_isdigit},
    {"isalpha", V_STR, m_isalpha},     {"isalnum", V_STR, m_isalnum},     {"isspace", V_STR, m_isspace},
    {"islower", V_STR, m_islower},     {"isupper", V_STR, m_isupper},     {"items", V_DICT, m_items},
    {"keys", V_DICT, m_keys},          {"values", V_DICT, m_values},      {"get", V_DICT, m_get},
    {"index", V_LIST, m_list_index},   {"count", V_LIST, m_list_count},   {"cycle", V_LOOP, m_cycle},
};

static int find_method(uint8_t on, const char *name, size_t n) {
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++)
        if (METHODS[i].on == on && sref_is((sref){name, n}, METHODS[i].name)) return (int)i;
    return -1;
}
static const method_def *method_at(int i) { return &METHODS[i]; }

/* ---- filters */

static int64_t length_of(rctx *c, const node *at, const jv *v) {
    switch (v->t) {
    case V_UNDEF: return 0;
    case V_STR: return (int64_t)str_len_cp(v);
    case V_LIST: return (int64_t)v->u.l->n;
    case V_DICT: return (int64_t)v->u.dict->n;
    default: rfail(c, at, DDT_ERR_INVALID, "object of type '%s' has no len()", type_name(v));
    }
}

static jv f_length(rctx *c, const node *at, const jv *in, const args *a) { (void)a; return v_int(length_of(c, at, in), 0); }

static jv f_default(rctx *c, const node *at, const jv *in, const args *a) {
    (void)c;
    (void)at;
    const jv *d = arg(a, 0, "default_value");
    const jv *b = arg(a, 1, "boolean");
    bool use = in->t == V_UNDEF || (b && truthy(b) && !truthy(in));
    if (!use) return *in;
    return d ? *d : v_cstr("");
}

static void json_opts_from(rctx *c, const node *at, const args *a, json_opts *o) {
    memset(o, 0, sizeof *o);
    const jv *ea = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent"), *sep = arg(a, 2, "separators"),
             *sk = arg(a, 3, "sort_keys");
    o->ensure_ascii = ea && truthy(ea);
    o->sort_keys = sk && truthy(sk);
    if (ind && ind->t != V_NONE) {
        if (ind->t == V_INT || ind->t == V_BOOL) {
            int64_t k = ind->u.i < 0 ? 0 : ind->u.i;
            if (k > 64) rfail(c, at, DDT_ERR_RANGE, "tojson indent over 64 spaces");
            char *sp = ralloc(c, (size_t)k + 1);
            memset(sp, ' ', (size_t)k);
            o->indent = sp;
            o->indent_n = (size_t)k;
        } else if (ind->t == V_STR) {
            o->indent = ind->u.s.p;
            o->indent_n = ind->u.s.n;
        } else {
            rfail(c, at, DDT_ERR_INVALID, "tojson indent must be an integer or a string");
        }
    }
    o->item_sep = o->indent ? "," : ", ";
    o->key_sep = ": ";
    if (sep && sep->t != V_NONE) {
        if (sep->t != V_LIST || sep->u.l->n != 2 || sep->u.l->v[0].t != V_STR || sep->u.l->v[1].t != V_STR)
            rfail(c, at, DDT_ERR_INVALID, "tojson separators must be a pair of strings");
        o->item_sep = sep->u.l->v[0].u.s.p;
        o->item_n = sep->u.l->v[0].u.s.n;
        o->key_sep = sep->u.l->v[1].u.s.p;
        o->key_n = sep->u.l->v[1].u.s.n;
    } else {
        o->item_n = strlen(o->item_sep);
        o->key_n = strlen(o->key_sep);
    }
}

static jv f_tojson(rctx *c, const node *at, const jv *in, const args *a) {
    json_opts o;
    json_opts_from(c, at, a, &o);
    sb b = {0};
    put_json(c, at, &b, in, &o, 0, fl_of(in));
    return sb_value(&b);
}

static jv f_trim(rctx *c, const node *at, const jv *in, const args *a) {
    jv s = to_str(c, in);
    return strip_impl(c, at, &s, arg(a, 0, "chars"), true, true);
}

static jv f_string(rctx *c, const node *at, const jv *in, const args *a) {
    (void)at;
    (void)a;
    if (in->t == V_STR) return *in; /* soft_str keeps Markup */
    return to_str(c, in);
}

/* Python's int(str): optional sign, digits with single underscores, surrounding whitespace. */
static bool parse_py_int(const jv *s, int base, int64_t *out) {
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = skip_space(p, 0, n);
    n = py_rstrip_len(p, n);
    bool neg = false;
    if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
    if (base == 16 && i + 1 < n && p[i] == '0' && (p[i + 1] | 0x20) == 'x') i += 2;
    if (base == 8 && i + 1 < n && p[i] == '0' && (p[i + 1] | 0x20) == 'o') i += 2;
    if (base == 2 && i + 1 < n && p[i] == '0' && (p[i + 1] | 0x20) == 'b') i += 2;
    if (i >= n) return false;
    uint64_t v = 0;
    bool last_us = true;
    for (; i < n; i++) {
        char ch = p[i];
        if (ch == '_') {
            if (last_us) return false;
            last_us = true;
            continue;
        }
        int d = ch >= '0' && ch <= '9' ? ch - '0' : (ch | 0x20) >= 'a' && (ch | 0x20) <= 'z' ? (ch | 0x20) - 'a' + 10 : 99;
        if (d >= base) return false;
        if (v > ((uint64_t)INT64_MAX + 1 - (uint64_t)d) / (uint64_t)base) return false;
        v = v * (uint64_t)base + (uint64_t)d;
        last_us = false;
    }
    if (last_us) return false;
    if (!neg && v > (uint64_t)INT64_MAX) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static bool parse_py_float(const jv *s, double *out) {
    const char *p = s->u.s.p;
    size_t n = s->u.s.n, i = skip_space(p, 0, n);
    n = py_rstrip_len(p, n);
    if (i >= n || n - i > 300) return false;
    char buf[320];
    size_t o = 0;
    for (size_t k = i; k < n; k++) {
        char ch = p[k];
        if (ch == '_') {
            if (k == i || k + 1 >= n || !is_digit(p[k - 1]) || !is_digit(p[k + 1])) return false;
            continue;
        }
        if (!(is_digit(ch) || ch == '.' || ch == 'e' || ch == 'E' || ch == '+' || ch == '-' || ascii_alpha(ch))) return false;
        buf[o++] = ch;
    }
    buf[o] = '\0';
    /* strtod also takes hex floats and "infinity"-like words Python spells differently */
    for (size_t k = 0; k < o; k++)
        if ((buf[k] | 0x20) == 'x' || (buf[k] | 0x20) == 'p') return false;
    char *end;
    double d = strtod(buf, &end);
    if (end != buf + o || o == 0) return false;
    *out = d;
    return true;
}

static jv f_int(rctx *c, const node *at, const jv *in, const args *a) {
    const jv *dv = arg(a, 0, "default");
    const jv *bv = arg(a, 1, "base");
    jv def = dv ? *dv : v_int(0, 0);
    int base = bv ? (int)want_int(c, at, bv, "int()'s base") : 10;
    uint8_t f = in->f & F_DATA;
    if (in->t == V_STR && str_has_data(in)) f = F_DATA;
    if (in->t == V_UNDEF) undefined_error(c, at, in); /* Undefined.__int__ fails */
    switch (in->t) {
    case V_INT: return *in;
    case V_BOOL: return v_int(in->u.i, f);
    case V_FLOAT:
        if (!isfinite(in->u.d) || fabs(in->u.d) >= 9.2e18) return def;
        return v_int((int64_t)in->u.d, f);
    case V_STR: {
        int64_t r;
        if (base >= 2 && base <= 36 && parse_py_int(in, base, &r)) return v_int(r, f);
        double d;
        if (base == 10 && parse_py_float(in, &d) && isfinite(d) && fabs(d) < 9.2e18) return v_int((int64_t)d, f);
        return def;
    }
    default: return def;
    }
}

static jv f_float(rctx *c, const node *at, const jv *in, const args *a) {
    const jv *dv = arg(a, 0, "default");
    jv def = dv ? *dv : v_float(0.0, 0);
    uint8_t f = (uint8_t)(v_has_data(in) ? F_DATA : 0);
    if (in->t == V_UNDEF) undefined_error(c, at, in); /* Undefined.__float__ fails */
    if (in->t == V_FLOAT) return *in;
    if (in->t == V_INT || in->t == V_BOOL) return v_float((double)in->u.i, f);
    double d;
    if (in->t == V_STR && parse_py_float(in, &d)) return v_float(d, f);
    return def;
}

static jv f_first(rctx *c, const node *at, const jv *in, const args *a) {
    (void)a;
    size_t n;
    const jv *items = iter_items(c, at, in, &n);
    return n ? items[0] : v_undef("first", 5);
}

static jv f_last(rctx *c, const node *at, const jv *in, const args *a) {
    (void)a;
    size_t n;
    const jv *items = iter_items(c, at, in, &n);
    return n ? items[n - 1] : v_undef("last", 4);
}

/* environment.getitem along a dotted path ("a.b.0"), for attribute= arguments */
static jv attr_path(rctx *c, const node *at, const jv *item, const jv *path) {
    jv p = want_str(c, at, path, "attribute");
    jv cur = *item;
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < p.u.s.n && p.u.s.p[j] != '.') j++;
        jv key = v_str_raw(p.u.s.p + i, j - i, NULL, 0);
        bool digits = j > i;
        for (size_t k = i; k < j; k++)
            if (!is_digit(p.u.s.p[k])) digits = false;
        if (digits && j - i < 18) key = v_int(strtoll(p.u.s.p + i, NULL, 10), 0);
        if (cur.t == V_UNDEF) undefined_error(c, at, &cur);
        cur = get_item(c, at, &cur, &key);
        if (j >= p.u.s.n) break;
        i = j + 1;
    }
    return cur;
}

static jv f_join(rctx *c, const node *at, const jv *in, const args *a) {
    const jv *d = arg(a, 0, "d");
    const jv *attr = arg(a, 1, "attribute");
    jv sep = d ? to_str(c, d) : v_cstr("");
    size_t n;
    const jv *items = iter_items(c, at, in, &n);
    sb b = {0};
    for (size_t i = 0; i < n; i++) {
        if (i) sb_put_str(c, &b, &sep, 0, sep.u.s.n);
        jv it = attr ? attr_path(c, at, &items[i], attr) : items[i];
        put_text(c, &b, &it);
    }
    return sb_value(&b);
}

static jv f_title(rctx *c, const node *at, const jv *in, const args *a) { (void)at; (void)a; return case_map(c, in, CASE_TITLE_FILTER); }

static jv f_replace(rctx *c, const node *at, const jv *in, const args *a) {
    const jv *o = arg(a, 0, "old"), *n = arg(a, 1, "new");
    if (!o || !n) rfail(c, at, DDT_ERR_INVALID, "replace takes an old and a new string");
    jv s = to_str(c, in);
    jv os = to_str(c, o), ns = to_str(c, n);
    return replace_impl(c, at, &s, &os, &ns, arg(a, 2, "count"));
}

static jv f_list(rctx *c, const node *at, const jv *in, const args *a) {
    (void)a;
    size_t n;
    const jv *items = iter_items(c, at, in, &n);
    return list_of(c, items, n);
}

static jv f_reverse(rctx *c, const node *at, const jv *in, const args *a) {
    (void)a;
    if (in->t == V_STR) {
        jv full = *in;
        return do_slice(c, at, &full, NULL, NULL, &(jv){.t = V_INT, .u.i = -1});
    }
    size_t n;
    const jv *items = iter_items(c, at, in, &n);
    jlist *l = list_new(c, n);
    for (size_t i = 0; i < n; i++) l->v[i] = items[n - 1 - i];
    return v_list(l, 0);
}

static jv f_items(rctx *c, const node *at, const jv *in, const args *a) {
    (void)a;
    if (in->t == V_UNDEF) return v_list(list_new(c, 0), 0);
    if (in->t != V_DICT) rfail(c, at, DDT_ERR_INVALID, "can only get item pairs from a mapping, not %s", type_name(in));
    return dict_pairs(c, in->u.dict);
}

static jv f_safe(rctx *c, const node *at, const jv *in, const args *a) {
    (void)at;
    (void)a;
    jv s = to_str(c, in);
    s.f |= F_MARKUP;
    return s;
}

static jv f_escape(rctx *c, const node *at, const jv *in, const args *a) { (void)at; (void)a; return html_escape(c, in); }

static jv f_abs(rctx *c, const node *at, const jv *in, const args *a) {
    (void)a;
    if (in->t == V_FLOAT) return v_float(fabs(in->u.d), in->f & F_DATA);
    if (in->t == V_INT || in->t == V_BOOL) {
        if (in->u.i == INT64_MIN) overflow(c, at);
        return v_int(in->u.i < 0 ? -in->u.i : in->u.i, in->f & F_DATA);
    }
    type_error(c, at, "abs()", in, NULL);
}

static jv f_round(rctx *c, const node *at, const jv *in, const args *a) {
    const jv *pv = arg(a, 0, "precision"), *mv = arg(a, 1, "method");
    int64_t prec = pv ? want_int(c, at, pv, "round()'s precision") : 0;
    if (!is_num(in)) type_error(c, at, "round()", in, NULL);
    double x = num_d(in), r;
    if (prec < 0 || prec > 15) rfail(c, at, DDT_ERR_UNSUPPORTED, "round() precision outside 0..15");
    jv m = mv ? want_str(c, at, mv, "round()'s method") : v_cstr("common");
    double scale = pow(10.0, (double)prec);
    if (sref_is((sref){m.u.s.p, m.u.s.n}, "common")) {
        if (in->t != V_FLOAT) return v_int(in->u.i, in->f & F_DATA); /* round(int, n) stays an int */
        /* Python rounds the exact binary value half to even: printf does the same */
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
        r = strtod(buf, NULL);
    } else if (sref_is((sref){m.u.s.p, m.u.s.n}, "floor")) {
        r = floor(x * scale) / scale;
    } else if (sref_is((sref){m.u.s.p, m.u.s.n}, "ceil")) {
        r = ceil(x * scale) / scale;
    } else {
        rfail(c, at, DDT_ERR_INVALID, "method must be common, ceil or floor");
    }
    return v_float(r, in->f & F_DATA);
}

/* The key a sort/unique/min/max compares: an attribute, lowercased strings when not case sensitive. */
static jv sort_key(rctx *c, const node *at, const jv *item, const jv *attr, bool case_sensitive) {
    jv k = attr && attr->t != V_NONE ? attr_path(c, at, item, attr) : *item;
    if (!case_sensitive && k.t == V_STR) return case_map(c, &k, CASE_LOWER);
    return k;
}

/* Stable merge sort of items by keys. */
static void merge_sort(rctx *c, const node *at, jv *items, jv *keys, size_t n, jv *ti, jv *tk, bool rev) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(c, at, items, keys, h, ti, tk, rev);
    merge_sort(c, at, items + h, keys + h, n - h, ti, tk, rev);
    size_t i = 0, j = h, o = 0;
    while (i < h && j < n) {
        int r = py_cmp(c, at, &keys[j], &keys[i], 0);
        bool take_right = rev ? r > 0 : r < 0;
        if (take_right) {
            ti[o] = items[j];
            tk[o++] = keys[j++];
        } else {
            ti[o] = items[i];
            tk[o++] = keys[i++];
        }
    }
    while (i < h) {
        ti[o] = items[i];
        tk[o++] = keys[i++];
    }
    while (j < n) {
        ti[o] = items[j];
        tk[o++] = keys[j++];
    }
    memcpy(items, ti, n * sizeof(jv));
    memcpy(keys, tk, n * sizeof(jv));
}

static jv f_sort(rctx *c, const node *at, const jv *in, const args *a) {
    const jv *rv = arg(a, 0, "reverse"), *cs = arg(a, 1, "case_sensitive"), *attr = arg(a, 2, "attribute");
    size_t n;
    const jv *items = iter_items(c, at, in, &n);
    jlist *l = list_new(c, n);
    jv *keys = ralloc(c, (n ? n : 1) * sizeof(jv) * 3);
    for (size_t i = 0; i < n; i++) {
        l->v[i] = items[i];
        keys[i] = sort_key(c, at, &items[i], attr, cs && truthy(cs));
    }
    charge(c, at, n * 8 + 1);
    merge_sort(c, at, l->v, keys, n, keys + n, keys + 2 * n, rv && truthy(rv));
    return v_list(l, 0);
}

static jv f_unique(rctx *c, const node *at, const jv *in, const args *a) {
    const jv *cs = arg(a, 0, "case_sensitive"), *attr = arg(a, 1, "attribute");
    size_t n;
    const jv *items = iter_items(c, at, in, &n);
    jlist *l = list_new(c, n);
    jv *keys = ralloc(c, (n ? n : 1) * sizeof(jv));
    size_t k = 0;
    charge(c, at, n * n / 16 + 1);
    for (size_t i = 0; i < n; i++) {
        jv key = sort_key(c, at, &items[i], attr, cs && truthy(cs));
        if (!hashable(&key)) rfail(c, at, DDT_ERR_INVALID, "unique: unhashable type '%s'", type_name(&key));
        size_t j = 0;
        while (j < k && !py_eq(c, &keys[j], &key, 0)) j++;
        if (j < k) continue;
        keys[k] = key;
        l->v[k++] = items[i];
    }
    l->n = k;
    return v_list(l, 0);
}

static jv minmax(rctx *c, const node *at, const jv *in, const args *a, bool want_max) {
    const jv *cs = arg(a, 0, "case_sensitive"), *attr = arg(a, 1, "attribute");
    size_t n;
    const jv *items = iter_items(c, at, in, &n);
    if (n == 0) return v_undef(want_max ? "max" : "min", 3);
    size_t best = 0;
    jv bk = sort_key(c, at, &items[0], attr, cs && truthy(cs));
    for (size_t i = 1; i < n; i++) {
        jv k = sort_key(c, at, &items[i], attr, cs && truthy(cs));
        int r = py_cmp(c, at, &k, &bk, 0);
        if (want_max ? r > 0 : r < 0) {
            best = i;
            bk = k;
        }
    }
    return items[best];
}

static jv f_max(rctx *c, const node *at, const jv *in, const args *a) { return minmax(c, at, in, a, true); }
static jv f_min(rctx *c, const node *at, const jv *in, const args *a) { return minmax(c, at, in, a, false); }

static jv f_sum(rctx *c, const node *at, const jv *in, const args *a) {
    const jv *attr = arg(a, 0, "attribute"), *start = arg(a, 1, "start");
    size_t n;
    const jv *items = iter_items(c, at, in, &n);
    jv acc = start ? *start : v_int(0, 0);
    for (size_t i = 0; i < n; i++) {
        jv it = attr && attr->t != V_NONE ? attr_path(c, at, &items[i], attr) : items[i];
        acc = arith(c, at, OP_ADD, &acc, &it);
    }
    return acc;
}

static jv f_map(rctx *c, const node *at, const jv *in, const args *a) {
    size_t n;
    const jv *items = truthy(in) ? iter_items(c, at, in, &n) : (n = 0, NULL);
    jlist *l = list_new(c, n);
    if (a->npos == 0) {
        const jv *attr = arg(a, 99, "attribute"), *def = arg(a, 99, "default");
        if (!attr) rfail(c, at, DDT_ERR_INVALID, "map requires a filter name or attribute=");
        for (size_t i = 0; i < n; i++) {
            jv v = attr_path(c, at, &items[i], attr);
            l->v[i] = v.t == V_UNDEF && def ? *def : v;
        }
        return v_list(l, 0);
    }
    jv name = want_str(c, at, &a->pos[0], "map's filter name");
    int id = find_filter(name.u.s.p, name.u.s.n);
    if (id < 0) no_such(c, at, "filter", name.u.s.p, name.u.s.n);
    args sub = {a->pos + 1, a->npos - 1, a->kwn, a->kwv, a->nkw};
    for (size_t i = 0; i < n; i++) l->v[i] = apply_filter(c, at, id, &items[i], &sub);
    return v_list(l, 0);
}

/* select / reject / selectattr / rejectattr */
static jv select_impl(rctx *c, const node *at, const jv *in, const args *a, bool attr_mode, bool keep_if) {
    size_t n;
    const jv *items = truthy(in) ? iter_items(c, at, in, &n) : (n = 0, NULL);
    size_t first = 0;
    const jv *attr = NULL;
    if (attr_mode) {
        if (a->npos < 1) rfail(c, at, DDT_ERR_INVALID, "missing the attribute name");
        attr = &a->pos[0];
        first = 1;
    }
    int tid = -1;
    if (a->npos > first) {
        jv tn = want_str(c, at, &a->pos[first], "the test name");
        tid = find_test(tn.u.s.p, tn.u.s.n);
        if (tid < 0) no_such(c, at, "test", tn.u.s.p, tn.u.s.n);
    }
    args sub = {a->pos + (a->npos > first ? first + 1 : a->npos), a->npos > first ? a->npos - first - 1 : 0, a->kwn, a->kwv, a->nkw};
    jlist *l = list_new(c, n);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        jv v = attr ? attr_path(c, at, &items[i], attr) : items[i];
        bool r = tid >= 0 ? apply_test(c, at, tid, &v, &sub) : truthy(&v);
        if (r == keep_if) l->v[k++] = items[i];
    }
    l->n = k;
    return v_list(l, 0);
}

static jv f_select(rctx *c, const node *at, const jv *in, const args *a) { return select_impl(c, at, in, a, false, true); }
static jv f_reject(rctx *c, const node *at, const jv *in, const args *a) { return select_impl(c, at, in, a, false, false); }
static jv f_selectattr(rctx *c, const node *at, const jv *in, const args *a) { return select_impl(c, at, in, a, true, true); }
static jv f_rejectattr(rctx *c, const node *at, const jv *in, const args *a) { return select_impl(c, at, in, a, true, false); }

static jv f_indent(rctx *c, const node *at, const jv *in, const args *a) {
    const jv *wv = arg(a, 0, "width"), *fv = arg(a, 1, "first"), *bv = arg(a, 2, "blank");
    jv ind;
    if (wv && wv->t == V_STR) {
        ind = *wv;
    } else {
        int64_t w = wv ? want_int(c, at, wv, "indent width") : 4;
        if (w < 0) w = 0;
        if (w > 1024) rfail(c, at, DDT_ERR_RANGE, "indent width over 1024");
        char *sp = ralloc(c, (size_t)w + 1);
        memset(sp, ' ', (size_t)w);
        ind = v_str_raw(sp, (size_t)w, NULL, 0);
    }
    if (in->t != V_STR) type_error(c, at, "+= (indent)", in, NULL); /* jinja2 appends "\n" to the value */
    jv s = *in;
    bool first = fv && truthy(fv), blank = bv && truthy(bv);
    sb b = {0};
    if (first) sb_put_str(c, &b, &ind, 0, ind.u.s.n);
    /* lines as str.splitlines() cuts them (\n, \r\n, \r and the other line boundaries) */
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0, line = 0;
    while (i < n) {
        size_t j = i, brk = 0;
        while (j < n) {
            unsigned char ch = (unsigned char)p[j];
            if (ch == '\r') brk = j + 1 < n && p[j + 1] == '\n' ? 2 : 1;
            else if (ch == '\n' || ch == '\v' || ch == '\f' || (ch >= 0x1c && ch <= 0x1e)) brk = 1;
            else if (ch == 0xc2 && j + 1 < n && (unsigned char)p[j + 1] == 0x85) brk = 2;
            else if (ch == 0xe2 && j + 2 < n && (unsigned char)p[j + 1] == 0x80 && ((unsigned char)p[j + 2] == 0xa8 || (unsigned char)p[j + 2] == 0xa9)) brk = 3;
            if (brk) break;
            j++;
        }
        if (line > 0) {
            sb_putc(c, &b, '\n', 0);
            if (blank || j > i) sb_put_str(c, &b, &ind, 0, ind.u.s.n);
        }
        sb_put_str(c, &b, &s, i, j - i);
        line++;
        i = j + brk;
    }
    return sb_value(&b);
}

static jv f_dictsort(rctx *c, const node *at, const jv *in, const args *a) {
    const jv *cs = arg(a, 0, "case_sensitive"), *by = arg(a, 1, "by"), *rv = arg(a, 2, "reverse");
    if (in->t != V_DICT) rfail(c, at, DDT_ERR_INVALID, "dictsort needs a mapping, not %s", type_name(in));
    jv pairs = dict_pairs(c, in->u.dict);
    size_t n = pairs.u.l->n;
    bool by_value = by && by->t == V_STR && sref_is((sref){by->u.s.p, by->u.s.n}, "value");
    jv *keys = ralloc(c, (n ? n : 1) * sizeof(jv) * 3);
    for (size_t i = 0; i < n; i++) {
        jv k = pairs.u.l->v[i].u.l->v[by_value ? 1 : 0];
        keys[i] = !(cs && truthy(cs)) && k.t == V_STR ? case_map(c, &k, CASE_LOWER) : k;
    }
    merge_sort(c, at, pairs.u.l->v, keys, n, keys + n, keys + 2 * n, rv && truthy(rv));
    return pairs;
}

static jv f_wordcount(rctx *c, const node *at, const jv *in, const args *a) {
    (void)at;
    (void)a;
    jv s = to_str(c, in);
    int64_t cnt = 0;
    bool inw = false;
    for (size_t i = 0; i < s.u.s.n; i++) {
        char ch = s.u.s.p[i];
        bool w = is_digit(ch) || ascii_alpha(ch) || ch == '_' || (unsigned char)ch >= 0x80;
        if (w && !inw) cnt++;
        inw = w;
    }
    return v_int(cnt, 0);
}

static jv f_format(rctx *c, const node *at, const jv *in, const args *a) {
    (void)in;
    (void)a;
    rfail(c, at, DDT_ERR_UNSUPPORTED, "the format filter is not supported");
}

static const filter_def FILTERS[] = {
    {"abs", f_abs},           {"capitalize", capitalize_fn}, {"count", f_length},     {"d", f_default},
    {"default", f_default},   {"dictsort", f_dictsort},     {"e", f_escape},          {"escape", f_escape},
    {"first", f_first},       {"float", f_float},           {"forceescape", f_escape}, {"format", f_format},
    {"indent", f_indent},     {"int", f_int},               {"items", f_items},       {"join", f_join},
    {"last", f_last},         {"length", f_length},         {"list", f_list},         {"lower", lower_fn},
    {"map", f_map},           {"max", f_max},               {"min", f_min},           {"reject", f_reject},
    {"rejectattr", f_rejectattr}, {"replace", f_replace},   {"reverse", f_reverse},   {"round", f_round},
    {"safe", f_safe},         {"select", f_select},         {"selectattr", f_selectattr}, {"sort", f_sort},
    {"string", f_string},     {"sum", f_sum},               {"title", f_title},       {"tojson", f_tojson},
    {"trim", f_trim},         {"unique", f_unique},         {"upper", upper_fn},      {"wordcount", f_wordcount},
};

static int find_filter(const char *name, size_t n) {
    for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0]; i++)
        if (sref_is((sref){name, n}, FILTERS[i].name)) return (int)i;
    return -1;
}
static const filter_def *filter_at(int i) { return &FILTERS[i]; }

/* ---- tests */

static const jv *test_arg(rctx *c, const node *at, const args *a, const char *what) {
    const jv *x = arg(a, 0, NULL);
    if (!x) rfail(c, at, DDT_ERR_INVALID, "the '%s' test takes one argument", what);
    return x;
}

static bool t_defined(rctx *c, const node *at, const jv *v, const args *a) { (void)c; (void)at; (void)a; return v->t != V_UNDEF; }
static bool t_undefined(rctx *c, const node *at, const jv *v, const args *a) { (void)c; (void)at; (void)a; return v->t == V_UNDEF; }
static bool t_none(rctx *c, const node *at, const jv *v, const args *a) { (void)c; (void)at; (void)a; return v->t == V_NONE; }
static bool t_boolean(rctx *c, const node *at, const jv *v, const args *a) { (void)c; (void)at; (void)a; return v->t == V_BOOL; }
static bool t_true(rctx *c, const node *at, const jv *v, const args *a) { (void)c; (void)at; (void)a; return v->t == V_BOOL && v->u.i; }
static bool t_false(rctx *c, const node *at, const jv *v, const args *a) { (void)c; (void)at; (void)a; return v->t == V_BOOL && !v->u.i; }
static bool t_integer(rctx *c, const node *at, const jv *v, const args *a) { (void)c; (void)at; (void)a; return v->t == V_INT; }
static bool t_float(rctx *c, const node *at, const jv *v, const args *a) { (void)c; (void)at; (void)a; return v->t == V_FLOAT; }
static bool t_number(rctx *c, const node *at, const jv *v, const args *a) { (void)c; (void)at; (void)a; return is_num(v); }
static bool t_string(rctx *c, const node *at, const jv *v, const args *a) { (void)c; (void)at; (void)a; return v->t == V_STR; }
static bool t_mapping(rctx *c, const node *at, const jv *v, const args *a) { (void)c; (void)at; (void)a; return v->t == V_DICT; }
static bool t_iterable(rctx *c, const node *at, const jv *v, const args *a) {
    (void)c; (void)at; (void)a;
    return v->t == V_STR || v->t == V_LIST || v->t == V_DICT || v->t == V_UNDEF || v->t == V_LOOP;
}
static bool t_sequence(rctx *c, const node *at, const jv *v, const args *a) {
    (void)c; (void)at; (void)a;
    return v->t == V_STR || v->t == V_LIST || v->t == V_DICT || v->t == V_UNDEF;
}
static bool t_callable(rctx *c, const node *at, const jv *v, const args *a) {
    (void)c; (void)at; (void)a;
    return v->t == V_MACRO || v->t == V_FUNC || v->t == V_METHOD || v->t == V_UNDEF;
}
static bool t_escaped(rctx *c, const node *at, const jv *v, const args *a) { (void)c; (void)at; (void)a; return v->t == V_STR && (v->f & F_MARKUP); }
static bool t_sameas(rctx *c, const node *at, const jv *v, const args *a) {
    const jv *o = test_arg(c, at, a, "sameas");
    if (v->t != o->t) return false;
    if (v->t == V_NONE || v->t == V_BOOL) return v->u.i == o->u.i;
    if (v->t == V_INT) return v->u.i == o->u.i && v->u.i >= -5 && v->u.i <= 256; /* CPython's small-int cache */
    if (v->t == V_LIST) return v->u.l == o->u.l;
    if (v->t == V_DICT || v->t == V_NS) return v->u.dict == o->u.dict;
    return false;
}
static bool t_eq(rctx *c, const node *at, const jv *v, const args *a) { return py_eq(c, v, test_arg(c, at, a, "=="), 0); }
static bool t_ne(rctx *c, const node *at, const jv *v, const args *a) { return !py_eq(c, v, test_arg(c, at, a, "!="), 0); }
static bool t_lt(rctx *c, const node *at, const jv *v, const args *a) { return py_cmp(c, at, v, test_arg(c, at, a, "<"), 0) < 0; }
static bool t_le(rctx *c, const node *at, const jv *v, const args *a) { return py_cmp(c, at, v, test_arg(c, at, a, "<="), 0) <= 0; }
static bool t_gt(rctx *c, const node *at, const jv *v, const args *a) { return py_cmp(c, at, v, test_arg(c, at, a, ">"), 0) > 0; }
static bool t_ge(rctx *c, const node *at, const jv *v, const args *a) { return py_cmp(c, at, v, test_arg(c, at, a, ">="), 0) >= 0; }
static bool t_in(rctx *c, const node *at, const jv *v, const args *a) { return contains(c, at, test_arg(c, at, a, "in"), v); }
static bool t_odd_even(rctx *c, const node *at, const jv *v, bool odd) {
    /* jinja2: value % 2 == 1 (odd), value % 2 == 0 (even) */
    jv two = v_int(2, 0);
    jv m = arith(c, at, OP_MOD, v, &two);
    return num_d(&m) == (odd ? 1.0 : 0.0);
}
static bool t_odd(rctx *c, const node *at, const jv *v, const args *a) { (void)a; return t_odd_even(c, at, v, true); }
static bool t_even(rctx *c, const node *at, const jv *v, const args *a) { (void)a; return t_odd_even(c, at, v, false); }
static bool t_divisibleby(rctx *c, const node *at, const jv *v, const args *a) {
    jv r = arith(c, at, OP_MOD, v, test_arg(c, at, a, "divisibleby"));
    return !truthy(&r);
}
/* the lower / upper tests: str.islower() / isupper() of str(v) */
static bool t_str_pred(rctx *c, const jv *v, int kind) {
    jv s = to_str(c, v);
    return str_pred(&s, kind).u.i != 0;
}
static bool t_lower(rctx *c, const node *at, const jv *v, const args *a) { (void)at; (void)a; return t_str_pred(c, v, 4); }
static bool t_upper(rctx *c, const node *at, const jv *v, const args *a) { (void)at; (void)a; return t_str_pred(c, v, 5); }
static bool t_filter(rctx *c, const node *at, const jv *v, const args *a) {
    (void)c; (void)at; (void)a;
    return v->t == V_STR && find_filter(v->u.s.p, v->u.s.n) >= 0;
}
static bool t_test(rctx *c, const node *at, const jv *v, const args *a) {
    (void)c; (void)at; (void)a;
    return v->t == V_STR && find_test(v->u.s.p, v->u.s.n) >= 0;
}

static const test_def TESTS[] = {
    {"defined", t_defined},   {"undefined", t_undefined}, {"none", t_none},         {"boolean", t_boolean},
    {"true", t_true},         {"false", t_false},         {"integer", t_integer},   {"float", t_float},
    {"number", t_number},     {"string", t_string},       {"mapping", t_mapping},   {"iterable", t_iterable},
    {"sequence", t_sequence}, {"callable", t_callable},   {"escaped", t_escaped},   {"sameas", t_sameas},
    {"eq", t_eq},             {"equalto", t_eq},          {"==", t_eq},             {"ne", t_ne},
    {"!=", t_ne},             {"lt", t_lt},               {"lessthan", t_lt},       {"<", t_lt},
    {"le", t_le},             {"<=", t_le},               {"gt", t_gt},             {"greaterthan", t_gt},
    {">", t_gt},              {"ge", t_ge},               {">=", t_ge},             {"in", t_in},
    {"odd", t_odd},           {"even", t_even},           {"divisibleby", t_divisibleby}, {"lower", t_lower},
    {"upper", t_upper},       {"filter", t_filter},       {"test", t_test},
};

static int find_test(const char *name, size_t n) {
    for (size_t i = 0; i < sizeof TESTS / sizeof TESTS[0]; i++)
        if (sref_is((sref){name, n}, TESTS[i].name)) return (int)i;
    return -1;
}
static const test_def *test_at(int i) { return &TESTS[i]; }

/* ================================================================ 7. public functions */

ddt_status ddt_jinja_parse(const char *src, size_t len, ddt_jinja **out, ddt_error *err) {
    ddt_error_clear(err);
    if (!out) return ddt_fail(err, DDT_ERR_INVALID, "jinja: out is NULL");
    *out = NULL;
    if (!src && len) return ddt_fail(err, DDT_ERR_INVALID, "jinja: template source is NULL");
    if (len > DDT_JINJA_MAX_SOURCE)
        return ddt_fail(err, DDT_ERR_RANGE, "template of %zu bytes is over the bound of %u bytes", len, (unsigned)DDT_JINJA_MAX_SOURCE);
    size_t bad = utf8_check(src ? src : "", len);
    if (bad < len) {
        int line, col;
        line_col(src, bad, &line, &col);
        return ddt_fail(err, DDT_ERR_INVALID, "line %d, column %d: template is not valid UTF-8", line, col);
    }
    ddt_jinja *t = calloc(1, sizeof *t);
    parser *P = calloc(1, sizeof *P);
    if (!t || !P) {
        free(t);
        free(P);
        return ddt_fail(err, DDT_ERR_NOMEM, "jinja: out of memory");
    }
    /* the tree of a 1 MiB template stays far below this; the bound only stops runaway growth */
    t->tree.limit = 256u << 20;
    P->err = err;
    P->tree = &t->tree;
    if (setjmp(P->jb)) {
        ddt_status st = P->st;
        free(P->toks);
        free(P);
        arena_free(&t->tree);
        free(t);
        return st;
    }
    /* newlines as jinja2 sees them: \r\n and \r become \n, one trailing newline is dropped */
    char *norm = palloc(P, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n > 0 && norm[n - 1] == '\n') n--;
    norm[n] = '\0';
    t->src = norm;
    t->len = n;
    P->src = norm;
    P->len = n;
    lex(P);
    P->i = 0;
    t->root = parse_body(P, NULL);
    check_names(P, t->root, false, 0);
    free(P->toks);
    free(P);
    *out = t;
    return DDT_OK;
}

void ddt_jinja_free(ddt_jinja *t) {
    if (!t) return;
    arena_free(&t->tree);
    free(t);
}

static void add_globals(rctx *c, const json_t *obj, uint8_t data) {
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)obj, key, val) {
        jv k = v_str_raw(key, strlen(key), NULL, 0);
        jv v = from_json(c, val, data, 0);
        dict_set(c, &c->globals, &k, &v);
    }
}

ddt_status ddt_jinja_render(const ddt_jinja *t, const json_t *data, const json_t *trusted, ddt_jinja_text *out,
                            ddt_error *err) {
    ddt_error_clear(err);
    if (!out) return ddt_fail(err, DDT_ERR_INVALID, "jinja: out is NULL");
    memset(out, 0, sizeof *out);
    if (!t) return ddt_fail(err, DDT_ERR_INVALID, "jinja: template is NULL");
    if (data && !json_is_object(data)) return ddt_fail(err, DDT_ERR_INVALID, "jinja: the data context must be a JSON object");
    if (trusted && !json_is_object(trusted))
        return ddt_fail(err, DDT_ERR_INVALID, "jinja: the trusted context must be a JSON object");
    rctx *c = calloc(1, sizeof *c);
    if (!c) return ddt_fail(err, DDT_ERR_NOMEM, "jinja: out of memory");
    c->t = t;
    c->err = err;
    c->stack0 = (uintptr_t)__builtin_frame_address(0);
    c->a.limit = DDT_JINJA_MAX_MEMORY;
    c->main.heap = true;
    c->out = &c->main;
    if (setjmp(c->jb)) {
        ddt_status st = c->st;
        free(c->main.p);
        free(c->main.m);
        arena_free(&c->a);
        free(c);
        return st;
    }
    if (data) add_globals(c, data, F_DATA);
    if (trusted) add_globals(c, trusted, 0);
    c->sc = scope_new(c, NULL);
    exec_node(c, t->root);
    if (c->main.cap == 0) sb_reserve(c, &c->main, 1);
    c->main.p[c->main.n] = '\0';
    out->bytes = c->main.p;
    out->data = c->main.m;
    out->len = c->main.n;
    arena_free(&c->a);
    free(c);
    return DDT_OK;
}

void ddt_jinja_text_free(ddt_jinja_text *text) {
    if (!text) return;
    free(text->bytes);
    free(text->data);
    memset(text, 0, sizeof *text);
}
