/*
 * tokenizer_json.c — the Hugging Face tokenizer.json format (DeepSeek-V3, R1,
 * V3.1 and GPT-2-style byte-level BPE) behind the ddt_tokenizer API: the loader
 * (model.vocab / merges, added_tokens, pre_tokenizer, normalizer, decoder), the
 * translation of its Oniguruma regexes to PCRE2, the added-token split, the
 * Split / ByteLevel pre-tokenizers and HF's BPE merge.  See tokenizer.h for
 * which files are accepted and how the ids relate to the `tokenizers` library's.
 *
 * Byte-level BPE works on the text's bytes, each shown to the vocabulary as one
 * character of GPT-2's bytes_to_unicode table, so a word's initial symbols are
 * the ids of its bytes' characters (byte_id) and merges never need the strings
 * again: the merge table maps a pair of ids to (merge rank, merged id).
 */
#include "text/tokenizer_impl.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

#define HF_MAX_STAGES 8                       /* Splits of a pre_tokenizer, ByteLevel's own included */
#define HF_MAX_PATTERN_BYTES ((size_t)64 << 10) /* one regex, before and after translation */

/* Split behaviours (HF's SplitDelimiterBehavior). */
enum { HF_REMOVED, HF_ISOLATED, HF_MERGED_PREV, HF_MERGED_NEXT, HF_CONTIGUOUS };

/* aflags bits: what the added_tokens entry of an id said. */
enum { HF_ADDED = 1, HF_SPECIAL = 2, HF_NORMALIZED = 4 };

/* A piece of text a Split produced: [start, end) and, after the behaviour, whether it goes. */
typedef struct hf_span {
    size_t start, end;
    int flag; /* first: the regex matched it; after the behaviour: removed */
} hf_span;

typedef struct hf_stage {
    pcre2_code *re;
    pcre2_match_data *md;
    int behavior;
    bool invert;
    hf_span *spans; /* [cap] workspace of this stage, reused per piece */
    size_t cap;
} hf_stage;

struct tok_hf {
    hf_stage stages[HF_MAX_STAGES];
    int n_stages;
    int32_t byte_id[256];   /* id of byte b's bytes_to_unicode character, -1 if the vocab lacks it */
    uint8_t *pure;          /* [vocab_size] 1: a model.vocab token made only of byte characters */
    uint64_t *mkeys;        /* [mmask + 1] merge table: 1 << 63 | a << 32 | b, 0 when empty */
    uint64_t *mvals;        /* [mmask + 1] rank << 32 | merged id */
    uint32_t mmask;
    int32_t unk_id;         /* model.unk_token's id, -1 when null */
    bool fuse_unk, ignore_merges;
    /* added tokens: their content (what text matches) apart from their bytes (what decodes) */
    uint8_t *apool;
    size_t apool_len;
    uint32_t *aoff, *alen;  /* [vocab_size] content of an added id in apool */
    uint8_t *aflags;        /* [vocab_size] HF_ADDED | HF_SPECIAL | HF_NORMALIZED */
    tok_table added;        /* content -> id */
    uint32_t *alens[2];     /* distinct content lengths, descending: [0] normalized false, [1] true */
    int32_t n_alens[2];
    uint8_t afirst[2][32];  /* bitmaps of the bytes that start a content, per pass */
};

/* ------------------------------------------------------------------ byte characters */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the
 * other 68 bytes for U+0100.. in byte order. */
static void byte_chars(int32_t cp_of[256]) {
    int32_t extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp_of[b] = printable ? b : 256 + extra++;
    }
}

/* Byte a byte character stands for, or -1 for any other code point. */
static int char_byte(const int32_t cp_of[256], int32_t cp) {
    if (cp < 0 || cp > 0x143) return -1;
    if (cp < 256) return cp_of[cp] == cp ? cp : -1;
    for (int b = 0; b < 256; b++)
        if (cp_of[b] == cp) return b;
    return -1;
}

static size_t utf8_put(int32_t cp, uint8_t *out) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    out[0] = (uint8_t)(0xE0 | cp >> 12); /* byte characters stay below U+0144 */
    out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp & 0x3F));
    return 3;
}

/*
 * The bytes HF's ByteLevel decoder gives for one token string: each character's
 * byte when every character is a byte character, else the string's own UTF-8
 * (so "<｜User｜>" decodes to itself and "Ġhi" to " hi").  out holds n bytes.
 * *pure says which case it was.
 */
static size_t decode_string(const int32_t cp_of[256], const uint8_t *s, size_t n, uint8_t *out, bool *pure) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        i += tok_utf8_next(s + i, n - i, &cp);
        int b = char_byte(cp_of, cp);
        if (b < 0) {
            memcpy(out, s, n);
            *pure = false;
            return n;
        }
        out[o++] = (uint8_t)b;
    }
    *pure = true;
    return o;
}

/* ------------------------------------------------------------------ messages */

/* Start of an error message: the file's name, then the JSON path. */
#define HF_FAIL(err, code, name, ...) hf_fail((err), (code), (name), __VA_ARGS__)

static ddt_status hf_fail(ddt_error *err, ddt_status code, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static ddt_status hf_fail(ddt_error *err, ddt_status code, const char *name, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ddt_fail(err, code, "%s: %s", name, msg);
}

/* A JSON string or key for a message: at most 40 bytes, control bytes as '?'. */
static const char *shown(const char *s, size_t n, char buf[48]) {
    size_t k = 0;
    for (; k < n && k < 40; k++) buf[k] = (unsigned char)s[k] < 0x20 ? '?' : s[k];
    buf[k] = '\0';
    if (n > 40) snprintf(buf + 37, 11, "...");
    return buf;
}

static const char *type_of(json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* A boolean member that may be absent (def); anything else but a boolean is an error. */
static ddt_status get_bool(json_t *obj, const char *key, bool def, bool *out, const char *name, const char *path,
                           ddt_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v) {
        *out = def;
        return DDT_OK;
    }
    if (!json_is_boolean(v))
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s.%s: expected a boolean, found %s", path, key, type_of(v));
    *out = json_is_true(v);
    return DDT_OK;
}

/* A string member that may be absent or null (*out NULL). */
static ddt_status get_opt_string(json_t *obj, const char *key, json_t **out, const char *name, const char *path,
                                 ddt_error *err) {
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return DDT_OK;
    if (!json_is_string(v))
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s.%s: expected a string or null, found %s", path, key, type_of(v));
    *out = v;
    return DDT_OK;
}

/* ------------------------------------------------------------------ regex translation */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_addn(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_add(sbuf *b, const char *s) { sb_addn(b, s, strlen(s)); }

/* Oniguruma's \\w as `tokenizers` compiles it (probed code point by code point):
 * Alphabetic, marks, decimal digits, connector punctuation, and the six Latin-1
 * numbers its Latin-1 table calls word characters (superscripts 1-3, fractions).
 * PCRE2 before 10.40 has no Alphabetic property; letters and letter numbers are
 * most of it. */
#define HF_LATIN1_WORD "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"
#if PCRE2_MAJOR > 10 || (PCRE2_MAJOR == 10 && PCRE2_MINOR >= 40)
#define HF_WORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}" HF_LATIN1_WORD
#else
#define HF_WORD "\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}" HF_LATIN1_WORD
#endif

/* General categories: PCRE2 and Oniguruma read these names alike. */
static bool is_category(const char *s, size_t n) {
    static const char *const names[] = {
        "L",  "Lu", "Ll", "Lt", "Lm", "Lo", "M",  "Mn", "Mc", "Me", "N",  "Nd", "Nl", "No", "P",  "Pc",
        "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S",  "Sm", "Sc", "Sk", "So", "Z",  "Zs", "Zl", "Zp", "C",
        "Cc", "Cf", "Cs", "Co", "Cn", "Any"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (strlen(names[k]) == n && memcmp(names[k], s, n) == 0) return true;
    return false;
}

/*
 * Rewrite a tokenizer.json regex (Oniguruma syntax, which is what `tokenizers`
 * compiles) as PCRE2 with the same matches.  Escapes whose meaning differs are
 * spelled out: \s is Unicode White_Space, \d Nd, \w Oniguruma's word class, \h a
 * hex digit, \v the VT character, \uHHHH a code point; a bare script name
 * \p{Han} becomes \p{sc:Han} because newer PCRE2 reads it as Script_Extensions.
 * Constructs whose semantics differ and that no supported file uses (nested or
 * intersected classes, ^ $ anchors, the m s x flags, \b and friends,
 * back-references) are refused with *why and *at set, not guessed.
 */
static bool translate_regex(const char *s, size_t n, sbuf *out, const char **why, size_t *at) {
    bool in_class = false;
    for (size_t i = 0; i < n;) {
        char c = s[i];
        *at = i;
        if (c == '\\') {
            if (i + 1 >= n) {
                *why = "a trailing backslash";
                return false;
            }
            char e = s[i + 1];
            i += 2;
            switch (e) {
            case 's': sb_add(out, in_class ? TOK_WS : "[" TOK_WS "]"); continue;
            case 'S':
                if (in_class) break;
                sb_add(out, "[^" TOK_WS "]");
                continue;
            case 'd': sb_add(out, "\\p{Nd}"); continue;
            case 'D': sb_add(out, "\\P{Nd}"); continue;
            case 'w': sb_add(out, in_class ? HF_WORD : "[" HF_WORD "]"); continue;
            case 'W':
                if (in_class) break;
                sb_add(out, "[^" HF_WORD "]");
                continue;
            case 'h': sb_add(out, in_class ? "0-9A-Fa-f" : "[0-9A-Fa-f]"); continue;
            case 'H':
                if (in_class) break;
                sb_add(out, "[^0-9A-Fa-f]");
                continue;
            case 'v': sb_add(out, "\\x0B"); continue;
            case 'u': {
                size_t k = 0;
                while (k < 4 && i + k < n && strchr("0123456789abcdefABCDEF", s[i + k]) && s[i + k]) k++;
                if (k != 4) {
                    *why = "\\u without four hex digits";
                    return false;
                }
                sb_add(out, "\\x{");
                sb_addn(out, s + i, 4);
                sb_add(out, "}");
                i += 4;
                continue;
            }
            case 'p':
            case 'P': {
                bool neg = e == 'P';
                const char *name;
                size_t len;
                if (i < n && s[i] == '{') {
                    const char *close = memchr(s + i, '}', n - i);
                    if (!close) {
                        *why = "\\p{ without a closing brace";
                        return false;
                    }
                    name = s + i + 1;
                    len = (size_t)(close - name);
                    i = (size_t)(close - s) + 1;
                    if (len > 0 && name[0] == '^') {
                        neg = !neg;
                        name++;
                        len--;
                    }
                } else if (i < n) {
                    name = s + i; /* \pL */
                    len = 1;
                    i++;
                } else {
                    *why = "\\p without a property";
                    return false;
                }
                if (len == 0 || len > 60) {
                    *why = "an empty or overlong \\p{} name";
                    return false;
                }
                sb_add(out, neg ? "\\P{" : "\\p{");
#if PCRE2_MAJOR > 10 || (PCRE2_MAJOR == 10 && PCRE2_MINOR >= 40)
                if (!is_category(name, len)) sb_add(out, "sc:");
#endif
                sb_addn(out, name, len);
                sb_add(out, "}");
                continue;
            }
            case 'b': case 'B': case 'G': case 'K': case 'R': case 'X': case 'N': case 'O': case 'Q': case 'E':
            case 'g': case 'k': case 'y': case 'Y':
                break;
            default:
                if (e >= '1' && e <= '9') break; /* back-reference */
                /* \t \n \x.. \\ \[ \- \A \z ...: the same in PCRE2 */
                sb_addn(out, s + i - 2, 2);
                continue;
            }
            *at = i - 2;
            *why = "an escape with no PCRE2 equivalent here (\\S \\W \\H inside a class, \\b, \\G, \\K, \\R, \\X, \\N, "
                   "\\O, \\Q, \\E, \\g, \\k, \\y, \\Y or a back-reference)";
            return false;
        }
        if (in_class) {
            if (c == '[' && !(i + 1 < n && s[i + 1] == ':')) {
                *why = "a nested character class";
                return false;
            }
            if (c == '&' && i + 1 < n && s[i + 1] == '&') {
                *why = "a class intersection (&&)";
                return false;
            }
            if (c == '[') { /* a POSIX class [:alpha:] reads the same */
                const char *close = NULL;
                for (size_t k = i + 2; k + 1 < n; k++)
                    if (s[k] == ':' && s[k + 1] == ']') {
                        close = s + k;
                        break;
                    }
                if (!close) {
                    *why = "a nested character class";
                    return false;
                }
                sb_addn(out, s + i, (size_t)(close - (s + i)) + 2);
                i = (size_t)(close - s) + 2;
                continue;
            }
            if (c == ']') in_class = false; /* a ']' first in the class was escaped on entry */
            sb_addn(out, s + i, 1);
            i++;
            continue;
        }
        if (c == '[') {
            in_class = true;
            sb_addn(out, s + i, 1);
            i++;
            if (i < n && s[i] == '^') sb_addn(out, s + i++, 1);
            if (i < n && s[i] == ']') { /* a ']' first in the class is a literal */
                sb_add(out, "\\]");
                i++;
            }
            continue;
        }
        if (c == '^' || c == '$') {
            *why = "an anchor ^ or $ (Oniguruma's are per line)";
            return false;
        }
        if (c == '.') {
            sb_add(out, "[^\\n]"); /* Oniguruma's dot; PCRE2's depends on its newline setting */
            i++;
            continue;
        }
        if (c == '(' && i + 1 < n && s[i + 1] == '?') {
            /* inline options: only i (and its negation) means the same in both */
            size_t k = i + 2;
            while (k < n && ((s[k] >= 'a' && s[k] <= 'z') || s[k] == '-')) {
                if (s[k] != 'i' && s[k] != '-') {
                    *why = "an inline option other than i (m, s and x differ between Oniguruma and PCRE2)";
                    return false;
                }
                k++;
            }
        }
        sb_addn(out, s + i, 1);
        i++;
    }
    if (in_class) {
        *at = n;
        *why = "an unclosed character class";
        return false;
    }
    return true;
}

/* A Split's {"String": "..."}: the literal, every code point as \x{...}. */
static void literal_regex(const char *s, size_t n, sbuf *out) {
    for (size_t i = 0; i < n;) {
        int32_t cp;
        i += tok_utf8_next((const uint8_t *)s + i, n - i, &cp);
        char buf[16];
        snprintf(buf, sizeof buf, "\\x{%X}", (unsigned)(cp < 0 ? 0xFFFD : cp));
        sb_add(out, buf);
    }
}

/* GPT-2's pattern, which ByteLevel with use_regex true splits by (Oniguruma syntax). */
static const char gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static ddt_status add_stage(ddt_tokenizer *tok, const char *regex, size_t len, bool literal, int behavior, bool invert,
                            const char *name, const char *path, ddt_error *err) {
    tok_hf *hf = tok->hf;
    if (hf->n_stages == HF_MAX_STAGES)
        return HF_FAIL(err, DDT_ERR_RANGE, name, "%s: more than %d Split pre-tokenizers", path, HF_MAX_STAGES);
    if (len == 0) return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s: empty pattern", path);
    if (len > HF_MAX_PATTERN_BYTES)
        return HF_FAIL(err, DDT_ERR_RANGE, name, "%s: pattern of %zu bytes, over the limit %zu", path, len,
                       HF_MAX_PATTERN_BYTES);
    sbuf pcre = {0};
    const char *why = NULL;
    size_t at = 0;
    if (literal) literal_regex(regex, len, &pcre);
    else if (!translate_regex(regex, len, &pcre, &why, &at)) {
        free(pcre.p);
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s: unsupported regex: %s at offset %zu", path, why, at);
    }
    if (pcre.oom) {
        free(pcre.p);
        return HF_FAIL(err, DDT_ERR_NOMEM, name, "%s: out of memory", path);
    }
    int code;
    PCRE2_SIZE off;
    hf_stage *st = &hf->stages[hf->n_stages];
    /* MATCH_INVALID_UTF: invalid UTF-8 in the text never matches and stays in a gap */
    st->re = pcre2_compile((PCRE2_SPTR)pcre.p, pcre.len, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &off,
                           NULL);
    free(pcre.p);
    if (!st->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s: the regex does not compile: %s", path, (const char *)msg);
    }
    hf->n_stages++;
    pcre2_jit_compile(st->re, PCRE2_JIT_COMPLETE); /* the interpreter gives the same matches when JIT is absent */
    st->md = pcre2_match_data_create_from_pattern(st->re, NULL);
    if (!st->md) return HF_FAIL(err, DDT_ERR_NOMEM, name, "%s: out of memory", path);
    st->behavior = behavior;
    st->invert = invert;
    return DDT_OK;
}

/* ------------------------------------------------------------------ pre_tokenizer */

static ddt_status load_split(ddt_tokenizer *tok, json_t *pt, const char *name, const char *path, ddt_error *err) {
    json_t *pattern = json_object_get(pt, "pattern");
    json_t *regex = json_is_object(pattern) ? json_object_get(pattern, "Regex") : NULL;
    json_t *str = json_is_object(pattern) ? json_object_get(pattern, "String") : NULL;
    if (!json_is_object(pattern) || json_object_size(pattern) != 1 || (!json_is_string(regex) && !json_is_string(str)))
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s.pattern: expected {\"Regex\": \"...\"} or {\"String\": \"...\"}",
                       path);
    json_t *behavior = json_object_get(pt, "behavior");
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    int b = -1;
    for (int k = 0; k < 5 && json_is_string(behavior); k++)
        if (!strcmp(json_string_value(behavior), names[k])) b = k;
    if (b < 0) {
        char buf[48];
        return HF_FAIL(err, DDT_ERR_FORMAT, name,
                       "%s.behavior: expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous, "
                       "found %s", path,
                       json_is_string(behavior) ? shown(json_string_value(behavior), json_string_length(behavior), buf)
                                                : behavior ? type_of(behavior) : "nothing");
    }
    bool invert = false;
    ddt_status st = get_bool(pt, "invert", false, &invert, name, path, err);
    if (st != DDT_OK) return st;
    char where[160];
    snprintf(where, sizeof where, "%s.pattern.%s", path, regex ? "Regex" : "String");
    json_t *p = regex ? regex : str;
    return add_stage(tok, json_string_value(p), json_string_length(p), !regex, b, invert, name, where, err);
}

/* A ByteLevel pre-tokenizer: GPT-2's split when use_regex, and the byte mapping (implicit in the BPE). */
static ddt_status load_byte_level(ddt_tokenizer *tok, json_t *pt, const char *name, const char *path, ddt_error *err) {
    bool prefix = false, use_regex = false, trim = false;
    ddt_status st = get_bool(pt, "add_prefix_space", true, &prefix, name, path, err);
    if (st == DDT_OK) st = get_bool(pt, "use_regex", true, &use_regex, name, path, err);
    if (st == DDT_OK) st = get_bool(pt, "trim_offsets", true, &trim, name, path, err); /* offsets only */
    if (st != DDT_OK) return st;
    if (prefix)
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s.add_prefix_space: true is not supported (only false)", path);
    if (!use_regex) return DDT_OK;
    char where[160];
    snprintf(where, sizeof where, "%s (GPT-2's pattern)", path);
    return add_stage(tok, gpt2_pattern, sizeof gpt2_pattern - 1, false, HF_ISOLATED, false, name, where, err);
}

static ddt_status load_pre_tokenizer(ddt_tokenizer *tok, json_t *root, const char *name, ddt_error *err) {
    json_t *pt = json_object_get(root, "pre_tokenizer");
    if (!pt || json_is_null(pt))
        return HF_FAIL(err, DDT_ERR_FORMAT, name,
                       "pre_tokenizer: missing; a ByteLevel pre-tokenizer (alone or last of a Sequence) is required");
    json_t *list = NULL;
    size_t n = 1;
    const char *base = "pre_tokenizer";
    json_t *type = json_is_object(pt) ? json_object_get(pt, "type") : NULL;
    if (!json_is_string(type)) return HF_FAIL(err, DDT_ERR_FORMAT, name, "pre_tokenizer.type: expected a string");
    if (!strcmp(json_string_value(type), "Sequence")) {
        list = json_object_get(pt, "pretokenizers");
        if (!json_is_array(list) || json_array_size(list) == 0)
            return HF_FAIL(err, DDT_ERR_FORMAT, name, "pre_tokenizer.pretokenizers: expected a non-empty list");
        n = json_array_size(list);
    }
    for (size_t i = 0; i < n; i++) {
        char path[96];
        json_t *e = pt;
        if (list) {
            snprintf(path, sizeof path, "%s.pretokenizers[%zu]", base, i);
            e = json_array_get(list, i);
        } else {
            snprintf(path, sizeof path, "%s", base);
        }
        json_t *t = json_is_object(e) ? json_object_get(e, "type") : NULL;
        if (!json_is_string(t)) return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s.type: expected a string", path);
        const char *tn = json_string_value(t);
        bool last = i + 1 == n;
        ddt_status st;
        if (!strcmp(tn, "Split")) {
            if (last)
                return HF_FAIL(err, DDT_ERR_FORMAT, name,
                               "%s: the last pre-tokenizer must be ByteLevel (byte-level BPE), found Split", path);
            st = load_split(tok, e, name, path, err);
        } else if (!strcmp(tn, "ByteLevel")) {
            if (!last)
                return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s: ByteLevel must be the last pre-tokenizer", path);
            st = load_byte_level(tok, e, name, path, err);
        } else {
            char buf[48];
            return HF_FAIL(err, DDT_ERR_FORMAT, name,
                           "%s.type: unsupported pre-tokenizer \"%s\" (supported: Sequence of Split, then ByteLevel)",
                           path, shown(tn, json_string_length(t), buf));
        }
        if (st != DDT_OK) return st;
    }
    return DDT_OK;
}

/* normalizer: null or an empty Sequence (nothing to do); decoder: ByteLevel. */
static ddt_status check_normalizer_decoder(json_t *root, const char *name, ddt_error *err) {
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) {
        json_t *t = json_is_object(norm) ? json_object_get(norm, "type") : NULL;
        json_t *list = json_is_object(norm) ? json_object_get(norm, "normalizers") : NULL;
        bool empty_seq = json_is_string(t) && !strcmp(json_string_value(t), "Sequence") && json_is_array(list) &&
                         json_array_size(list) == 0;
        if (!empty_seq) {
            char buf[48];
            return HF_FAIL(err, DDT_ERR_FORMAT, name, "normalizer: unsupported normalizer %s (only null)",
                           json_is_string(t) ? shown(json_string_value(t), json_string_length(t), buf) : type_of(norm));
        }
    }
    json_t *dec = json_object_get(root, "decoder");
    json_t *t = json_is_object(dec) ? json_object_get(dec, "type") : NULL;
    if (!json_is_string(t) || strcmp(json_string_value(t), "ByteLevel") != 0) {
        char buf[48];
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "decoder: unsupported decoder %s (only ByteLevel)",
                       json_is_string(t) ? shown(json_string_value(t), json_string_length(t), buf)
                       : dec ? type_of(dec) : "(missing)");
    }
    json_t *post = json_object_get(root, "post_processor");
    if (post && !json_is_null(post) && !json_is_object(post))
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "post_processor: expected an object or null, found %s", type_of(post));
    return DDT_OK;
}

/* ------------------------------------------------------------------ model */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint64_t merge_key(int32_t a, int32_t b) { return 1ull << 63 | (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

/* (rank << 32 | merged id) of the pair, or UINT64_MAX. */
static uint64_t merge_find(const tok_hf *hf, int32_t a, int32_t b) {
    uint64_t key = merge_key(a, b);
    for (uint32_t i = (uint32_t)mix64(key) & hf->mmask;; i = (i + 1) & hf->mmask) {
        if (hf->mkeys[i] == key) return hf->mvals[i];
        if (hf->mkeys[i] == 0) return UINT64_MAX;
    }
}

/* Insert or overwrite: a pair listed twice keeps its later rank, as HF's map does. */
static void merge_put(tok_hf *hf, int32_t a, int32_t b, uint64_t val) {
    uint64_t key = merge_key(a, b);
    for (uint32_t i = (uint32_t)mix64(key) & hf->mmask;; i = (i + 1) & hf->mmask) {
        if (hf->mkeys[i] == key || hf->mkeys[i] == 0) {
            hf->mkeys[i] = key;
            hf->mvals[i] = val;
            return;
        }
    }
}

/* Id of a vocab string, or -1. */
static int32_t vocab_id(json_t *vocab, const char *s, size_t n) {
    json_t *v = json_object_getn(vocab, s, n);
    return json_is_integer(v) ? (int32_t)json_integer_value(v) : -1;
}

static ddt_status load_merges(tok_hf *hf, json_t *model, json_t *vocab, const char *name, ddt_error *err) {
    json_t *merges = json_object_get(model, "merges");
    if (!merges || json_is_null(merges)) merges = NULL;
    else if (!json_is_array(merges))
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "model.merges: expected a list, found %s", type_of(merges));
    size_t n = merges ? json_array_size(merges) : 0;
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    if (cap > (size_t)1 << 31) return HF_FAIL(err, DDT_ERR_RANGE, name, "model.merges: %zu merges, too many", n);
    hf->mkeys = ddt_calloc_array(cap, sizeof *hf->mkeys);
    hf->mvals = ddt_malloc_array(cap, sizeof *hf->mvals);
    if (!hf->mkeys || !hf->mvals) return HF_FAIL(err, DDT_ERR_NOMEM, name, "model.merges: out of memory");
    hf->mmask = (uint32_t)(cap - 1);
    char *joined = NULL;
    size_t joined_cap = 0;
    ddt_status st = DDT_OK;
    bool strings = n > 0 && json_is_string(json_array_get(merges, 0));
    uint32_t rank = 0;
    for (size_t i = 0; i < n && st == DDT_OK; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a, *b;
        size_t la, lb;
        if (strings) {
            if (!json_is_string(m)) {
                st = HF_FAIL(err, DDT_ERR_FORMAT, name, "model.merges[%zu]: expected a string like the first merge, "
                             "found %s", i, type_of(m));
                break;
            }
            const char *s = json_string_value(m);
            size_t l = json_string_length(m);
            if (l >= 8 && !memcmp(s, "#version", 8)) continue; /* a merges.txt header, not a merge */
            const char *sp = memchr(s, ' ', l);
            if (!sp || memchr(sp + 1, ' ', l - (size_t)(sp + 1 - s))) {
                st = HF_FAIL(err, DDT_ERR_FORMAT, name, "model.merges[%zu]: expected \"a b\" with exactly one space", i);
                break;
            }
            a = s, la = (size_t)(sp - s), b = sp + 1, lb = l - la - 1;
        } else {
            json_t *ja = json_array_get(m, 0), *jb = json_array_get(m, 1);
            if (!json_is_array(m) || json_array_size(m) != 2 || !json_is_string(ja) || !json_is_string(jb)) {
                st = HF_FAIL(err, DDT_ERR_FORMAT, name, "model.merges[%zu]: expected a pair of strings", i);
                break;
            }
            a = json_string_value(ja), la = json_string_length(ja), b = json_string_value(jb), lb = json_string_length(jb);
        }
        int32_t ia = vocab_id(vocab, a, la), ib = vocab_id(vocab, b, lb);
        if (la + lb + 1 > joined_cap) {
            joined_cap = (la + lb + 1) * 2;
            char *p = realloc(joined, joined_cap);
            if (!p) {
                st = HF_FAIL(err, DDT_ERR_NOMEM, name, "model.merges: out of memory");
                break;
            }
            joined = p;
        }
        memcpy(joined, a, la);
        memcpy(joined + la, b, lb);
        int32_t ij = vocab_id(vocab, joined, la + lb);
        char buf[48];
        if (ia < 0 || ib < 0 || ij < 0) {
            const char *what = ia < 0 ? a : ib < 0 ? b : joined;
            size_t wl = ia < 0 ? la : ib < 0 ? lb : la + lb;
            st = HF_FAIL(err, DDT_ERR_FORMAT, name, "model.merges[%zu]: %s token \"%s\" is not in model.vocab", i,
                         ia < 0 ? "the left" : ib < 0 ? "the right" : "the merged", shown(what, wl, buf));
            break;
        }
        merge_put(hf, ia, ib, (uint64_t)rank << 32 | (uint32_t)ij);
        rank++;
    }
    free(joined);
    return st;
}

/* Checks one id of model.vocab or added_tokens. */
static ddt_status check_id(json_t *v, const char *name, const char *path, int32_t *id, ddt_error *err) {
    if (!json_is_integer(v))
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s: the id must be an integer, found %s", path, v ? type_of(v) : "nothing");
    json_int_t x = json_integer_value(v);
    if (x < 0 || x > DDT_TOKENIZER_MAX_ID)
        return HF_FAIL(err, DDT_ERR_RANGE, name, "%s: id %lld is out of range (0 .. %d)", path, (long long)x,
                       DDT_TOKENIZER_MAX_ID);
    *id = (int32_t)x;
    return DDT_OK;
}

/* model.vocab into the pool, ids and pure flags; *max_id is the largest id seen so far. */
static ddt_status load_vocab(ddt_tokenizer *tok, json_t *vocab, const int32_t cp_of[256], int32_t max_id,
                             const char *name, ddt_error *err) {
    tok_hf *hf = tok->hf;
    size_t total = 0;
    const char *key;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach(vocab, key, klen, v) {
        total += klen; /* <= the file's size */
    }
    ddt_status st = tok_grow_ids(tok, max_id + 1, err);
    if (st != DDT_OK) return st;
    tok->pool = malloc(total + 1);
    hf->pure = ddt_calloc_array((size_t)max_id + 1, 1);
    if (!tok->pool || !hf->pure) return HF_FAIL(err, DDT_ERR_NOMEM, name, "model.vocab: out of memory");
    json_object_keylen_foreach(vocab, key, klen, v) {
        char path[96], buf[48];
        snprintf(path, sizeof path, "model.vocab[\"%s\"]", shown(key, klen, buf));
        int32_t id;
        if ((st = check_id(v, name, path, &id, err)) != DDT_OK) return st;
        if (klen == 0) return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s: empty token", path);
        if (tok->id_kind[id] != TOK_UNUSED) {
            char other[48];
            return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s: id %d is also the id of \"%s\"", path, id,
                           shown((const char *)tok->pool + tok->id_off[id], tok->id_len[id], other));
        }
        bool pure;
        size_t len = decode_string(cp_of, (const uint8_t *)key, klen, tok->pool + tok->pool_len, &pure);
        tok->id_off[id] = (uint32_t)tok->pool_len;
        tok->id_len[id] = (uint32_t)len;
        tok->id_kind[id] = TOK_RANK;
        hf->pure[id] = pure;
        tok->pool_len += len;
    }
    return DDT_OK;
}

static ddt_status load_model(ddt_tokenizer *tok, json_t *model, const char *name, ddt_error *err) {
    tok_hf *hf = tok->hf;
    json_t *t = json_object_get(model, "type");
    if (t && (!json_is_string(t) || strcmp(json_string_value(t), "BPE") != 0)) {
        char buf[48];
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "model.type: unsupported model %s (only BPE)",
                       json_is_string(t) ? shown(json_string_value(t), json_string_length(t), buf) : type_of(t));
    }
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "model.dropout: BPE dropout (random merges) is not supported");
    json_t *prefix, *suffix, *unk;
    ddt_status st = get_opt_string(model, "continuing_subword_prefix", &prefix, name, "model", err);
    if (st == DDT_OK) st = get_opt_string(model, "end_of_word_suffix", &suffix, name, "model", err);
    if (st == DDT_OK) st = get_opt_string(model, "unk_token", &unk, name, "model", err);
    bool byte_fallback = false;
    if (st == DDT_OK) st = get_bool(model, "fuse_unk", false, &hf->fuse_unk, name, "model", err);
    if (st == DDT_OK) st = get_bool(model, "byte_fallback", false, &byte_fallback, name, "model", err);
    if (st == DDT_OK) st = get_bool(model, "ignore_merges", false, &hf->ignore_merges, name, "model", err);
    if (st != DDT_OK) return st;
    if (prefix && json_string_length(prefix) > 0)
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "model.continuing_subword_prefix: not supported (only null or \"\")");
    if (suffix && json_string_length(suffix) > 0)
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "model.end_of_word_suffix: not supported (only null or \"\")");
    if (byte_fallback) return HF_FAIL(err, DDT_ERR_FORMAT, name, "model.byte_fallback: true is not supported");
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "model.vocab: expected an object {token: id}, found %s",
                       vocab ? type_of(vocab) : "nothing");
    hf->unk_id = -1;
    if (unk) {
        hf->unk_id = vocab_id(vocab, json_string_value(unk), json_string_length(unk));
        if (hf->unk_id < 0) {
            char buf[48];
            return HF_FAIL(err, DDT_ERR_FORMAT, name, "model.unk_token: \"%s\" is not in model.vocab",
                           shown(json_string_value(unk), json_string_length(unk), buf));
        }
    }
    return DDT_OK;
}

/* ------------------------------------------------------------------ added_tokens */

static ddt_status load_added(ddt_tokenizer *tok, json_t *added, json_t *vocab, const int32_t cp_of[256],
                             const char *name, ddt_error *err) {
    tok_hf *hf = tok->hf;
    size_t n = added ? json_array_size(added) : 0;
    size_t content_total = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *c = json_object_get(json_array_get(added, i), "content");
        if (json_is_string(c)) content_total += json_string_length(c);
    }
    size_t vs = (size_t)tok->vocab_size;
    hf->apool = malloc(content_total + 1);
    hf->aoff = ddt_calloc_array(vs, sizeof *hf->aoff);
    hf->alen = ddt_calloc_array(vs, sizeof *hf->alen);
    hf->aflags = ddt_calloc_array(vs, 1);
    uint8_t *pool = realloc(tok->pool, tok->pool_len + content_total + 1);
    if (pool) tok->pool = pool;
    if (!hf->apool || !hf->aoff || !hf->alen || !hf->aflags || !pool)
        return HF_FAIL(err, DDT_ERR_NOMEM, name, "added_tokens: out of memory");
    ddt_status st = tok_table_init(&hf->added, n, err);
    if (st != DDT_OK) return st;
    for (int p = 0; p < 2; p++) {
        hf->alens[p] = ddt_malloc_array(n + 1, sizeof *hf->alens[p]);
        if (!hf->alens[p]) return HF_FAIL(err, DDT_ERR_NOMEM, name, "added_tokens: out of memory");
    }
    tok_keys keys = {hf->apool, hf->aoff, hf->alen};
    for (size_t i = 0; i < n; i++) {
        char path[64];
        snprintf(path, sizeof path, "added_tokens[%zu]", i);
        json_t *e = json_array_get(added, i);
        if (!json_is_object(e)) return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s: expected an object", path);
        json_t *c = json_object_get(e, "content");
        if (!json_is_string(c) || json_string_length(c) == 0)
            return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s.content: expected a non-empty string", path);
        int32_t id;
        char idpath[80];
        snprintf(idpath, sizeof idpath, "%s.id", path);
        if ((st = check_id(json_object_get(e, "id"), name, idpath, &id, err)) != DDT_OK) return st;
        bool special = false, normalized = false, lstrip = false, rstrip = false, single = false;
        if ((st = get_bool(e, "special", false, &special, name, path, err)) != DDT_OK) return st;
        if ((st = get_bool(e, "normalized", !special, &normalized, name, path, err)) != DDT_OK) return st;
        if ((st = get_bool(e, "lstrip", false, &lstrip, name, path, err)) != DDT_OK) return st;
        if ((st = get_bool(e, "rstrip", false, &rstrip, name, path, err)) != DDT_OK) return st;
        if ((st = get_bool(e, "single_word", false, &single, name, path, err)) != DDT_OK) return st;
        if (lstrip || rstrip || single)
            return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s.%s: true is not supported (only false)", path,
                           lstrip ? "lstrip" : rstrip ? "rstrip" : "single_word");
        const char *s = json_string_value(c);
        size_t len = json_string_length(c);
        char buf[48], other[48];
        int32_t in_vocab = vocab_id(vocab, s, len);
        /* HF keeps a vocab token's own id for an added token of the same text */
        if (in_vocab >= 0 && in_vocab != id)
            return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s: \"%s\" has id %d here but %d in model.vocab", path,
                           shown(s, len, buf), id, in_vocab);
        if (in_vocab < 0 && tok->id_kind[id] == TOK_RANK)
            return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s: id %d of \"%s\" is already the id of \"%s\" in model.vocab",
                           path, id, shown(s, len, buf),
                           shown((const char *)tok->pool + tok->id_off[id], tok->id_len[id], other));
        if (hf->aflags[id])
            return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s: id %d is given to two added tokens", path, id);
        memcpy(hf->apool + hf->apool_len, s, len);
        hf->aoff[id] = (uint32_t)hf->apool_len;
        hf->alen[id] = (uint32_t)len;
        hf->apool_len += len;
        int32_t dup = tok_table_insert_in(&hf->added, &keys, id);
        if (dup >= 0)
            return HF_FAIL(err, DDT_ERR_FORMAT, name, "%s: \"%s\" is also the content of added token id %d", path,
                           shown(s, len, buf), dup);
        hf->aflags[id] = (uint8_t)(HF_ADDED | (special ? HF_SPECIAL : 0) | (normalized ? HF_NORMALIZED : 0));
        if (in_vocab < 0) {
            /* its bytes: HF decodes added tokens through the ByteLevel decoder too */
            bool pure;
            size_t bl = decode_string(cp_of, (const uint8_t *)s, len, tok->pool + tok->pool_len, &pure);
            tok->id_off[id] = (uint32_t)tok->pool_len;
            tok->id_len[id] = (uint32_t)bl;
            tok->pool_len += bl;
        }
        /* A control token for ddtree: every special one, and every one the vocab lacks
         * (a non-special marker such as DeepSeek-R1's <think>); a non-special added token
         * that the vocab has is text. */
        tok->id_kind[id] = special || in_vocab < 0 ? TOK_SPECIAL : TOK_RANK;
        int p = normalized ? 1 : 0;
        uint8_t first = (uint8_t)s[0];
        hf->afirst[p][first >> 3] |= (uint8_t)(1u << (first & 7));
        int32_t k = 0;
        while (k < hf->n_alens[p] && hf->alens[p][k] > len) k++;
        if (k < hf->n_alens[p] && hf->alens[p][k] == len) continue;
        memmove(hf->alens[p] + k + 1, hf->alens[p] + k, (size_t)(hf->n_alens[p] - k) * sizeof *hf->alens[p]);
        hf->alens[p][k] = (uint32_t)len;
        hf->n_alens[p]++;
    }
    return DDT_OK;
}

/* Largest id of model.vocab and added_tokens, checking each id's type and range. */
static ddt_status max_id_of(json_t *vocab, json_t *added, const char *name, int32_t *max_id, ddt_error *err) {
    *max_id = -1;
    const char *key;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach(vocab, key, klen, v) {
        char path[96], buf[48];
        snprintf(path, sizeof path, "model.vocab[\"%s\"]", shown(key, klen, buf));
        int32_t id;
        ddt_status st = check_id(v, name, path, &id, err);
        if (st != DDT_OK) return st;
        if (id > *max_id) *max_id = id;
    }
    for (size_t i = 0; added && i < json_array_size(added); i++) {
        char path[64];
        snprintf(path, sizeof path, "added_tokens[%zu].id", i);
        json_t *e = json_array_get(added, i);
        int32_t id;
        ddt_status st = check_id(json_is_object(e) ? json_object_get(e, "id") : NULL, name, path, &id, err);
        if (st != DDT_OK) return st;
        if (id > *max_id) *max_id = id;
    }
    if (*max_id < 0) return HF_FAIL(err, DDT_ERR_FORMAT, name, "model.vocab: no tokens");
    return DDT_OK;
}

/* The ranks table (token_id's and ignore_merges' look-up): pure vocab tokens first, so
 * that when two tokens decode to the same bytes the one BPE can produce is found. */
static ddt_status index_ranks(ddt_tokenizer *tok, ddt_error *err) {
    ddt_status st = tok_table_init(&tok->ranks, (size_t)tok->vocab_size, err);
    if (st != DDT_OK) return st;
    for (int32_t id = 0; id < tok->vocab_size; id++)
        if (tok->hf->pure[id]) tok_table_insert(tok, &tok->ranks, id); /* a repeat keeps the first */
    for (int32_t id = 0; id < tok->vocab_size; id++)
        if (!tok->hf->pure[id] && tok->id_kind[id] == TOK_RANK) tok_table_insert(tok, &tok->ranks, id);
    for (int32_t id = 0; id < tok->vocab_size; id++) {
        if (tok->id_kind[id] == TOK_RANK) tok->n_ranks++;
        if (tok->id_kind[id] == TOK_SPECIAL) tok->n_special++;
    }
    return DDT_OK;
}

void tok_hf_free(tok_hf *hf) {
    if (!hf) return;
    for (int k = 0; k < hf->n_stages; k++) {
        pcre2_match_data_free(hf->stages[k].md);
        pcre2_code_free(hf->stages[k].re);
        free(hf->stages[k].spans);
    }
    free(hf->pure);
    free(hf->mkeys);
    free(hf->mvals);
    free(hf->apool);
    free(hf->aoff);
    free(hf->alen);
    free(hf->aflags);
    free(hf->added.slots);
    free(hf->alens[0]);
    free(hf->alens[1]);
    free(hf);
}

static ddt_status create_json(ddt_tokenizer *tok, json_t *root, const char *name, ddt_error *err) {
    if (!json_is_object(root)) return HF_FAIL(err, DDT_ERR_FORMAT, name, "the top level is not a JSON object");
    tok->hf = calloc(1, sizeof *tok->hf);
    if (!tok->hf) return HF_FAIL(err, DDT_ERR_NOMEM, name, "out of memory");
    tok_hf *hf = tok->hf;
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "model: expected an object, found %s", model ? type_of(model) : "nothing");
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added))
        return HF_FAIL(err, DDT_ERR_FORMAT, name, "added_tokens: expected a list, found %s", type_of(added));
    if (json_is_null(added)) added = NULL;
    ddt_status st = load_model(tok, model, name, err);
    if (st != DDT_OK) return st;
    json_t *vocab = json_object_get(model, "vocab");
    int32_t cp_of[256];
    byte_chars(cp_of);
    int32_t max_id;
    if ((st = max_id_of(vocab, added, name, &max_id, err)) != DDT_OK) return st;
    if ((st = load_vocab(tok, vocab, cp_of, max_id, name, err)) != DDT_OK) return st;
    if ((st = load_added(tok, added, vocab, cp_of, name, err)) != DDT_OK) return st;
    if ((st = load_merges(hf, model, vocab, name, err)) != DDT_OK) return st;
    if ((st = check_normalizer_decoder(root, name, err)) != DDT_OK) return st;
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        size_t l = utf8_put(cp_of[b], u);
        hf->byte_id[b] = vocab_id(vocab, (const char *)u, l);
    }
    tok->mctx = pcre2_match_context_create(NULL);
    if (!tok->mctx) return HF_FAIL(err, DDT_ERR_NOMEM, name, "out of memory");
    if ((st = load_pre_tokenizer(tok, root, name, err)) != DDT_OK) return st;
    tok->jit_stack = pcre2_jit_stack_create(32 << 10, 4 << 20, NULL);
    if (tok->jit_stack) pcre2_jit_stack_assign(tok->mctx, NULL, tok->jit_stack);
    return index_ranks(tok, err);
}

ddt_status ddt_tokenizer_create_json(const char *name, const char *json, size_t len, ddt_tokenizer **out,
                                     ddt_error *err) {
    if (!out || (!json && len)) return ddt_fail(err, DDT_ERR_INVALID, "ddt_tokenizer_create_json: NULL argument");
    *out = NULL;
    if (!name) name = "tokenizer.json";
    if (len > DDT_TOKENIZER_MAX_JSON_BYTES)
        return ddt_fail(err, DDT_ERR_RANGE, "%s: %zu bytes, over the limit %zu", name, len,
                        (size_t)DDT_TOKENIZER_MAX_JSON_BYTES);
    json_error_t jerr;
    json_t *root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (!root) return ddt_fail(err, DDT_ERR_FORMAT, "%s line %d column %d: %s", name, jerr.line, jerr.column, jerr.text);
    ddt_tokenizer *tok = calloc(1, sizeof *tok);
    ddt_status st = tok ? create_json(tok, root, name, err) : ddt_fail(err, DDT_ERR_NOMEM, "%s: out of memory", name);
    json_decref(root);
    if (st != DDT_OK) {
        ddt_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    ddt_error_clear(err);
    return DDT_OK;
}

/* ------------------------------------------------------------------ encode */

/* HF's BPE of one pre-tokenized piece: its bytes' characters as symbols, then the
 * pair of lowest merge rank merges first, the leftmost on ties (Word::merge_all). */
static ddt_status hf_bpe(tok_encoder *e, const uint8_t *p, size_t n) {
    ddt_tokenizer *tok = e->tok;
    tok_hf *hf = tok->hf;
    if (n == 0) return DDT_OK;
    if (hf->ignore_merges) {
        int32_t whole = tok_table_find(tok, &tok->ranks, p, n);
        if (whole >= 0 && hf->pure[whole]) {
            tok_emit(e, whole);
            return DDT_OK;
        }
    }
    ddt_status st = tok_workspace_reserve(tok, n, e->err);
    if (st != DDT_OK) return st;
    uint32_t *next = tok->ws_next;
    int32_t *prev = tok->ws_prev, *rank = tok->ws_rank, *sym = tok->ws_sym;
    uint8_t *alive = tok->ws_alive;
    uint64_t *heap = tok->ws_heap;
    size_t heap_n = 0;
    /* Initial symbols; a byte the vocab lacks is unk_token (consecutive ones fused when
     * fuse_unk) or, with no unk_token, an error (HF would drop it silently). */
    int32_t last = -1;
    bool last_unknown = false;
    for (uint32_t i = 0; i < n; i++) {
        int32_t id = hf->byte_id[p[i]];
        bool unknown = id < 0;
        if (unknown) {
            if (hf->unk_id < 0)
                return ddt_fail(e->err, DDT_ERR_INVALID,
                                "tokenizer: no token for the byte 0x%02x at offset %zu (the vocabulary lacks its "
                                "byte-level character and has no unk_token)", p[i], (size_t)(p + i - e->base));
            id = hf->unk_id;
            if (hf->fuse_unk && last_unknown) {
                alive[i] = 0;
                continue;
            }
        }
        alive[i] = 1;
        sym[i] = id;
        prev[i] = last;
        if (last >= 0) next[last] = i;
        last = (int32_t)i;
        last_unknown = unknown;
    }
    next[last] = (uint32_t)n;
    for (uint32_t i = 0; i < n; i = next[i]) {
        rank[i] = -1;
        if (next[i] < n) {
            uint64_t m = merge_find(hf, sym[i], sym[next[i]]);
            if (m != UINT64_MAX) rank[i] = (int32_t)(m >> 32);
        }
        if (rank[i] >= 0) tok_heap_push(heap, &heap_n, (uint64_t)rank[i] << 32 | i);
    }
    while (heap_n > 0) {
        uint64_t top = tok_heap_pop(heap, &heap_n);
        uint32_t i = (uint32_t)top;
        if (!alive[i] || rank[i] != (int32_t)(top >> 32)) continue; /* stale: ranks name their pair */
        uint32_t j = next[i];
        uint64_t m = merge_find(hf, sym[i], sym[j]);
        sym[i] = (int32_t)(uint32_t)m;
        alive[j] = 0;
        next[i] = next[j];
        if (next[i] < n) prev[next[i]] = (int32_t)i;
        uint32_t around[2] = {i, prev[i] >= 0 ? (uint32_t)prev[i] : UINT32_MAX};
        for (int k = 0; k < 2; k++) {
            uint32_t q = around[k];
            if (q == UINT32_MAX) continue;
            rank[q] = -1;
            if (next[q] < n) {
                uint64_t mq = merge_find(hf, sym[q], sym[next[q]]);
                if (mq != UINT64_MAX) rank[q] = (int32_t)(mq >> 32);
            }
            if (rank[q] >= 0) tok_heap_push(heap, &heap_n, (uint64_t)rank[q] << 32 | q);
        }
    }
    for (uint32_t i = 0; i < n; i = next[i]) tok_emit(e, sym[i]);
    return DDT_OK;
}

static ddt_status push_span(tok_encoder *e, hf_stage *st, size_t *count, size_t start, size_t end, int flag) {
    if (*count == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 64;
        hf_span *p = cap < SIZE_MAX / sizeof *p ? realloc(st->spans, cap * sizeof *p) : NULL;
        if (!p) return ddt_fail(e->err, DDT_ERR_NOMEM, "tokenizer: out of memory splitting the text");
        st->spans = p;
        st->cap = cap;
    }
    st->spans[(*count)++] = (hf_span){start, end, flag};
    return DDT_OK;
}

/*
 * Pre-tokenizer stage k on the piece s[0..n), then the next stages on each piece
 * it keeps, then BPE.  The matches are found as the onig crate's find_iter does
 * (an empty match right where the previous match ended is skipped by one
 * character), laid out as HF's Pattern::find_matches (gaps between matches kept),
 * and grouped by the behaviour as NormalizedString::split does; empty pieces go.
 */
static ddt_status hf_split(tok_encoder *e, const uint8_t *s, size_t n, int k) {
    tok_hf *hf = e->tok->hf;
    if (n == 0) return DDT_OK;
    if (k == hf->n_stages) return hf_bpe(e, s, n);
    hf_stage *stg = &hf->stages[k];
    size_t count = 0, prev = 0, from = 0, last_match_end = SIZE_MAX;
    ddt_status st = DDT_OK;
    while (from <= n) {
        int rc = pcre2_match(stg->re, (PCRE2_SPTR)s, n, from, 0, stg->md, e->tok->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ddt_fail(e->err, DDT_ERR_INVALID, "tokenizer: pre-tokenisation failed at offset %zu: %s",
                            (size_t)(s + from - e->base), (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(stg->md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me && me == last_match_end) {
            if (from >= n) break;
            int32_t cp;
            from += tok_utf8_next(s + from, n - from, &cp);
            continue;
        }
        from = me;
        last_match_end = me;
        if (prev != ms && (st = push_span(e, stg, &count, prev, ms, 0)) != DDT_OK) return st;
        if ((st = push_span(e, stg, &count, ms, me, 1)) != DDT_OK) return st;
        prev = me;
    }
    if (prev != n && (st = push_span(e, stg, &count, prev, n, 0)) != DDT_OK) return st;
    hf_span *sp = stg->spans;
    if (stg->invert)
        for (size_t i = 0; i < count; i++) sp[i].flag = !sp[i].flag;
    /* the behaviour: flags become "removed"; [lo, hi) is what is left */
    size_t lo = 0, hi = 0;
    bool prev_match = false;
    switch (stg->behavior) {
    case HF_REMOVED: hi = count; break; /* a match is removed: flag stays */
    case HF_ISOLATED:
        for (size_t i = 0; i < count; i++) sp[i].flag = 0;
        hi = count;
        break;
    case HF_CONTIGUOUS:
    case HF_MERGED_PREV:
        for (size_t i = 0; i < count; i++) {
            bool m = sp[i].flag;
            bool join = stg->behavior == HF_CONTIGUOUS ? m == prev_match : m && !prev_match;
            if (join && hi > 0) sp[hi - 1].end = sp[i].end;
            else sp[hi++] = (hf_span){sp[i].start, sp[i].end, 0};
            prev_match = m;
        }
        break;
    case HF_MERGED_NEXT:
        lo = hi = count;
        for (size_t i = count; i-- > 0;) {
            bool m = sp[i].flag;
            size_t start = sp[i].start, end = sp[i].end;
            if (m && !prev_match && lo < count) sp[lo].start = start;
            else sp[--lo] = (hf_span){start, end, 0};
            prev_match = m;
        }
        break;
    }
    /* Deeper stages reuse their own span buffers only, so this one's stays valid. */
    for (size_t i = lo; i < hi; i++) {
        if (stg->spans[i].flag) continue;
        size_t a = stg->spans[i].start, b = stg->spans[i].end;
        if ((st = hf_split(e, s + a, b - a, k + 1)) != DDT_OK) return st;
    }
    return DDT_OK;
}

/* Longest added token of pass p (0: normalized false, 1: true) starting at s, or -1. */
static int32_t added_at(const tok_hf *hf, int p, const uint8_t *s, size_t avail, size_t *len) {
    if (!(hf->afirst[p][s[0] >> 3] & (1u << (s[0] & 7)))) return -1;
    tok_keys keys = {hf->apool, hf->aoff, hf->alen};
    for (int32_t k = 0; k < hf->n_alens[p]; k++) {
        size_t l = hf->alens[p][k];
        if (l > avail) continue;
        int32_t id = tok_table_find_in(&hf->added, &keys, s, l);
        if (id >= 0 && ((hf->aflags[id] & HF_NORMALIZED) != 0) == (p == 1)) {
            *len = l;
            return id;
        }
    }
    return -1;
}

/*
 * HF's AddedVocabulary split: pass 0 finds the tokens with normalized false in the
 * text, pass 1 those with normalized true in what pass 0 left, each leftmost-longest.
 * A match that may not be recognised here (a special token without
 * DDT_TOKENIZE_SPECIAL, as encode_special_tokens; any added token in bytes marked as
 * data) stays text, and the scan goes on after it, as HF's does.
 */
static ddt_status hf_added_pass(tok_encoder *e, const uint8_t *s, size_t n, uint32_t flags, int p) {
    tok_hf *hf = e->tok->hf;
    if (p == 2) return hf_split(e, s, n, 0);
    if (hf->n_alens[p] == 0) return hf_added_pass(e, s, n, flags, p + 1);
    size_t start = 0;
    for (size_t i = 0; i < n;) {
        size_t len;
        int32_t id = added_at(hf, p, s + i, n - i, &len);
        if (id < 0) {
            i++;
            continue;
        }
        bool skip = (!(flags & DDT_TOKENIZE_SPECIAL) && (hf->aflags[id] & HF_SPECIAL)) ||
                    (e->data && tok_marked(e->data + (s + i - e->base), len));
        if (!skip) {
            ddt_status st = hf_added_pass(e, s + start, i - start, flags, p + 1);
            if (st != DDT_OK) return st;
            tok_emit(e, id);
            start = i + len;
        }
        i += len;
    }
    return hf_added_pass(e, s + start, n - start, flags, p + 1);
}

ddt_status tok_hf_encode(tok_encoder *e, const uint8_t *s, size_t n, uint32_t flags) {
    return hf_added_pass(e, s, n, flags, 0);
}

int32_t tok_hf_token_id(const ddt_tokenizer *tok, const uint8_t *text, size_t n) {
    tok_keys keys = {tok->hf->apool, tok->hf->aoff, tok->hf->alen};
    int32_t id = tok_table_find_in(&tok->hf->added, &keys, text, n);
    return id >= 0 ? id : tok_table_find(tok, &tok->ranks, text, n);
}
