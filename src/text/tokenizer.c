/*
 * tokenizer.c — tiktoken-format byte-level BPE: the loader of tiktoken.model and
 * tokenizer_config.json, PCRE2 pre-tokenisation with Kimi K2's pattern, the BPE
 * merge of each piece, special tokens; and the format-neutral API (load, which
 * picks the format, encode, decode, look-ups).  tokenizer_json.c holds the
 * tokenizer.json format.  See tokenizer.h for the file formats and the
 * behaviour on invalid UTF-8.
 *
 * Layout: every token's bytes (ordinary, then special) live in one pool; id_off
 * and id_len map an id to its bytes, and two open-addressing hash tables map
 * bytes back to ids (one for ranks, one for special tokens), so a piece of text
 * is looked up without allocating.
 */
#include "text/tokenizer.h"
#include "text/tokenizer_impl.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/file.h"

/* Files larger than these are refused before reading: no real vocabulary comes close. */
#define TOK_MAX_MODEL_BYTES ((size_t)1 << 30)
#define TOK_MAX_CONFIG_BYTES ((size_t)64 << 20)
#define TOK_MAX_PATTERN_BYTES ((size_t)64 << 10)


/*
 * Kimi's pre-tokenisation pattern (tokenization_kimi.py) rewritten for PCRE2:
 *  - Rust's class intersection [X&&[^\p{Han}]] becomes (?!Han)[X]: the same
 *    set, one code point at a time.
 *  - Rust's regex reads a bare \p{Han} as Script=Han, PCRE2 >= 10.40 as
 *    Script_Extensions=Han (which adds 、。〆 and more), so it is spelled
 *    \p{sc:Han} there; older PCRE2 has no sc: prefix and reads \p{Han} as Script.
 *  - \s is spelled out as Unicode White_Space (what Rust's \s is), because
 *    PCRE2's \s under UCP also matches U+180E (MONGOLIAN VOWEL SEPARATOR), which
 *    is no longer White_Space; (?!\S) becomes (?![^WS]).
 */
#if PCRE2_MAJOR > 10 || (PCRE2_MAJOR == 10 && PCRE2_MINOR >= 40)
#define TOK_HAN "\\p{sc:Han}"
#else
#define TOK_HAN "\\p{Han}"
#endif
#define TOK_UPPER "(?:(?!" TOK_HAN ")[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])"
#define TOK_LOWER "(?:(?!" TOK_HAN ")[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])"
#define TOK_CONTR "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
static const char kimi_pattern[] =
    TOK_HAN "+"
    "|[^\\r\\n\\p{L}\\p{N}]?" TOK_UPPER "*" TOK_LOWER "+" TOK_CONTR
    "|[^\\r\\n\\p{L}\\p{N}]?" TOK_UPPER "+" TOK_LOWER "*" TOK_CONTR
    "|\\p{N}{1,3}"
    "| ?[^" TOK_WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" TOK_WS "]*[\\r\\n]+"
    "|[" TOK_WS "]+(?![^" TOK_WS "])"
    "|[" TOK_WS "]+";

/* Named special tokens of Kimi K2 (reference.md section 3); the other ids of the
 * reserved range are "<|reserved_token_<id>|>". */
static const struct {
    int32_t id;
    const char *text;
} kimi_specials[] = {
    {163584, "[BOS]"},         {163585, "[EOS]"},          {163586, "<|im_end|>"},
    {163587, "<|im_user|>"},   {163588, "<|im_assistant|>"}, {163594, "<|im_system|>"},
    {163601, "<|im_middle|>"}, {163838, "[UNK]"},          {163839, "[PAD]"},
};

const char *ddt_tokenizer_kimi_pattern(void) { return kimi_pattern; }

/* ------------------------------------------------------------------ hash table */

static uint64_t tok_hash(const uint8_t *p, size_t n) {
    /* FNV-1a: keys are short (a few bytes), so a byte loop is cheap enough. */
    uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)n;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 32);
}

ddt_status tok_table_init(tok_table *t, size_t n_keys, ddt_error *err) {
    size_t cap = 16;
    while (cap < n_keys * 2) cap *= 2; /* n_keys <= 2^24 + 2^16, no overflow */
    t->slots = ddt_malloc_array(cap, sizeof *t->slots);
    if (!t->slots) return ddt_fail(err, DDT_ERR_NOMEM, "tokenizer: out of memory for a hash table of %zu slots", cap);
    memset(t->slots, 0xff, cap * sizeof *t->slots);
    t->mask = (uint32_t)(cap - 1);
    return DDT_OK;
}

int32_t tok_table_find_in(const tok_table *t, const tok_keys *k, const uint8_t *p, size_t n) {
    uint32_t i = (uint32_t)tok_hash(p, n) & t->mask;
    for (;;) {
        int32_t id = t->slots[i];
        if (id < 0) return -1;
        if (k->len[id] == n && memcmp(k->pool + k->off[id], p, n) == 0) return id;
        i = (i + 1) & t->mask;
    }
}

int32_t tok_table_insert_in(tok_table *t, const tok_keys *k, int32_t id) {
    const uint8_t *p = k->pool + k->off[id];
    size_t n = k->len[id];
    uint32_t i = (uint32_t)tok_hash(p, n) & t->mask;
    for (;;) {
        int32_t other = t->slots[i];
        if (other < 0) {
            t->slots[i] = id;
            return -1;
        }
        if (k->len[other] == n && memcmp(k->pool + k->off[other], p, n) == 0) return other;
        i = (i + 1) & t->mask;
    }
}

int32_t tok_table_find(const ddt_tokenizer *tok, const tok_table *t, const uint8_t *p, size_t n) {
    tok_keys k = {tok->pool, tok->id_off, tok->id_len};
    return tok_table_find_in(t, &k, p, n);
}

int32_t tok_table_insert(ddt_tokenizer *tok, tok_table *t, int32_t id) {
    tok_keys k = {tok->pool, tok->id_off, tok->id_len};
    return tok_table_insert_in(t, &k, id);
}

/* ------------------------------------------------------------------ tiktoken.model */

static int b64_value(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/*
 * Parse one non-empty line "base64 rank" (spaces or tabs between, trailing
 * spaces allowed).  Writes the decoded bytes to out when not NULL (sized by a
 * first call with out NULL).
 */
static ddt_status parse_model_line(const char *name, size_t line_no, const uint8_t *s, size_t n,
                                   uint8_t *out, size_t *out_len, int32_t *rank, ddt_error *err) {
    size_t b64_end = 0;
    while (b64_end < n && s[b64_end] != ' ' && s[b64_end] != '\t') b64_end++;
    if (b64_end == 0)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s line %zu: expected 'base64 rank', the line starts with a space", name, line_no);
    if (b64_end == n)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s line %zu: expected 'base64 rank', found no rank", name, line_no);
    if (b64_end % 4 != 0)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s line %zu: bad base64: length %zu is not a multiple of 4", name, line_no, b64_end);
    /* '=' only as the last one or two characters */
    size_t pad = s[b64_end - 1] == '=' ? (s[b64_end - 2] == '=' ? 2 : 1) : 0;
    for (size_t i = 0; i < b64_end - pad; i++) {
        if (b64_value(s[i]) < 0)
            return ddt_fail(err, DDT_ERR_FORMAT, "%s line %zu: bad base64: character 0x%02x at column %zu", name, line_no,
                            s[i], i + 1);
    }
    size_t len = b64_end / 4 * 3 - pad;
    if (len == 0) return ddt_fail(err, DDT_ERR_FORMAT, "%s line %zu: empty token", name, line_no);
    if (out) {
        size_t o = 0;
        for (size_t i = 0; i < b64_end; i += 4) {
            uint32_t v = 0;
            for (size_t k = 0; k < 4; k++) {
                int d = s[i + k] == '=' ? 0 : b64_value(s[i + k]);
                v = v << 6 | (uint32_t)d;
            }
            uint8_t b[3] = {(uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
            for (size_t k = 0; k < 3 && o < len; k++) out[o++] = b[k];
        }
    }
    *out_len = len;

    size_t i = b64_end;
    while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
    if (i == n) return ddt_fail(err, DDT_ERR_FORMAT, "%s line %zu: expected 'base64 rank', found no rank", name, line_no);
    int64_t r = 0;
    size_t digits = 0;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++, digits++) {
        r = r * 10 + (s[i] - '0');
        if (r > DDT_TOKENIZER_MAX_ID)
            return ddt_fail(err, DDT_ERR_RANGE, "%s line %zu: rank over the limit %d", name, line_no, DDT_TOKENIZER_MAX_ID);
    }
    if (digits == 0)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s line %zu: rank is not a decimal number (found 0x%02x)", name, line_no, s[i]);
    while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
    if (i != n)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s line %zu: unexpected byte 0x%02x after the rank", name, line_no, s[i]);
    *rank = (int32_t)r;
    return DDT_OK;
}

/* Next line of buf from *pos: [*start, *start + *len) without "\n" or "\r\n". */
static bool next_line(const uint8_t *buf, size_t n, size_t *pos, const uint8_t **start, size_t *len) {
    if (*pos >= n) return false;
    const uint8_t *s = buf + *pos;
    const uint8_t *nl = memchr(s, '\n', n - *pos);
    size_t l = nl ? (size_t)(nl - s) : n - *pos;
    *pos += l + (nl ? 1 : 0);
    if (l > 0 && s[l - 1] == '\r') l--;
    *start = s;
    *len = l;
    return true;
}

/* Ensure the id tables hold ids [0, size); new entries are unused. */
ddt_status tok_grow_ids(ddt_tokenizer *tok, int32_t size, ddt_error *err) {
    if (size <= tok->vocab_size) return DDT_OK;
    size_t n = (size_t)size, old = (size_t)tok->vocab_size;
    uint32_t *off = realloc(tok->id_off, n * sizeof *off);
    if (off) tok->id_off = off;
    uint32_t *len = realloc(tok->id_len, n * sizeof *len);
    if (len) tok->id_len = len;
    uint8_t *kind = realloc(tok->id_kind, n);
    if (kind) tok->id_kind = kind;
    if (!off || !len || !kind) return ddt_fail(err, DDT_ERR_NOMEM, "tokenizer: out of memory for %d ids", size);
    memset(off + old, 0, (n - old) * sizeof *off);
    memset(len + old, 0, (n - old) * sizeof *len);
    memset(kind + old, 0, n - old);
    tok->vocab_size = size;
    return DDT_OK;
}

static ddt_status load_ranks(ddt_tokenizer *tok, const ddt_tokenizer_source *src, ddt_error *err) {
    const char *name = src->model_name ? src->model_name : "tiktoken.model";
    if (!src->model && src->model_len) return ddt_fail(err, DDT_ERR_INVALID, "%s: no data", name);
    if (src->model_len > TOK_MAX_MODEL_BYTES)
        return ddt_fail(err, DDT_ERR_RANGE, "%s: %zu bytes, over the limit %zu", name, src->model_len, TOK_MAX_MODEL_BYTES);

    /* Pass 1: check every line, count tokens and bytes. */
    size_t pos = 0, line_no = 0, n_tokens = 0, n_bytes = 0;
    int32_t max_rank = -1;
    const uint8_t *line;
    size_t line_len;
    while (next_line(src->model, src->model_len, &pos, &line, &line_len)) {
        line_no++;
        if (line_len == 0) continue; /* tiktoken's loader skips empty lines too */
        size_t len;
        int32_t rank;
        ddt_status st = parse_model_line(name, line_no, line, line_len, NULL, &len, &rank, err);
        if (st != DDT_OK) return st;
        n_tokens++;
        n_bytes += len; /* <= model_len, no overflow */
        if (rank > max_rank) max_rank = rank;
    }
    if (n_tokens == 0) return ddt_fail(err, DDT_ERR_FORMAT, "%s: no tokens (empty file)", name);

    tok->pool = malloc(n_bytes);
    uint32_t *first_line = ddt_calloc_array((size_t)max_rank + 1, sizeof *first_line);
    if (!tok->pool || !first_line) {
        free(first_line);
        return ddt_fail(err, DDT_ERR_NOMEM, "%s: out of memory for %zu tokens", name, n_tokens);
    }
    ddt_status st = tok_grow_ids(tok, max_rank + 1, err);
    if (st == DDT_OK) st = tok_table_init(&tok->ranks, n_tokens, err);

    /* Pass 2: decode into the pool, refuse repeated ranks and repeated bytes. */
    pos = 0;
    line_no = 0;
    while (st == DDT_OK && next_line(src->model, src->model_len, &pos, &line, &line_len)) {
        line_no++;
        if (line_len == 0) continue;
        size_t len;
        int32_t rank;
        st = parse_model_line(name, line_no, line, line_len, tok->pool + tok->pool_len, &len, &rank, err);
        if (st != DDT_OK) break;
        if (tok->id_kind[rank] != TOK_UNUSED) {
            st = ddt_fail(err, DDT_ERR_FORMAT, "%s line %zu: rank %d repeats line %u", name, line_no, rank,
                          first_line[rank]);
            break;
        }
        tok->id_off[rank] = (uint32_t)tok->pool_len;
        tok->id_len[rank] = (uint32_t)len;
        tok->id_kind[rank] = TOK_RANK;
        first_line[rank] = (uint32_t)line_no;
        int32_t other = tok_table_insert(tok, &tok->ranks, rank);
        if (other >= 0) {
            st = ddt_fail(err, DDT_ERR_FORMAT, "%s line %zu: token bytes repeat rank %d of line %u", name, line_no,
                          other, first_line[other]);
            break;
        }
        tok->pool_len += len;
    }
    free(first_line);
    if (st == DDT_OK) tok->n_ranks = (int32_t)n_tokens;
    return st;
}

/* ------------------------------------------------------------------ special tokens */

/* One special token before it is placed in the pool. */
typedef struct tok_special {
    int32_t id;
    bool explicit_; /* named by the config or the built-in table (not a reserved fill) */
    const char *text;
    size_t len;
} tok_special;

static ddt_status add_special(ddt_tokenizer *tok, const tok_special *sp, const char *where, ddt_error *err) {
    if (sp->id < tok->vocab_size && tok->id_kind[sp->id] == TOK_RANK) {
        if (!sp->explicit_) return DDT_OK; /* a reserved fill never shadows a rank */
        return ddt_fail(err, DDT_ERR_FORMAT, "%s: special token id %d is also an ordinary rank", where, sp->id);
    }
    if (sp->id < tok->vocab_size && tok->id_kind[sp->id] == TOK_SPECIAL)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s: special token id %d given twice", where, sp->id);
    ddt_status st = tok_grow_ids(tok, sp->id + 1, err);
    if (st != DDT_OK) return st;
    size_t new_len;
    if (!ddt_add_size(tok->pool_len, sp->len, &new_len) || new_len > UINT32_MAX)
        return ddt_fail(err, DDT_ERR_RANGE, "%s: special tokens too long", where);
    uint8_t *pool = realloc(tok->pool, new_len);
    if (!pool) return ddt_fail(err, DDT_ERR_NOMEM, "%s: out of memory for special tokens", where);
    tok->pool = pool;
    memcpy(pool + tok->pool_len, sp->text, sp->len);
    tok->id_off[sp->id] = (uint32_t)tok->pool_len;
    tok->id_len[sp->id] = (uint32_t)sp->len;
    tok->id_kind[sp->id] = TOK_SPECIAL;
    tok->pool_len = new_len;
    tok->n_special++;
    return DDT_OK;
}

/* Ids n_ranks .. n_ranks+255 not yet named become "<|reserved_token_<id>|>". */
static ddt_status add_reserved(ddt_tokenizer *tok, const char *where, ddt_error *err) {
    for (int32_t i = 0; i < DDT_TOKENIZER_N_RESERVED; i++) {
        int32_t id = tok->n_ranks + i;
        if (id > DDT_TOKENIZER_MAX_ID) break;
        if (id < tok->vocab_size && tok->id_kind[id] != TOK_UNUSED) continue;
        char text[48];
        int len = snprintf(text, sizeof text, "<|reserved_token_%d|>", id);
        tok_special sp = {id, false, text, (size_t)len};
        ddt_status st = add_special(tok, &sp, where, err);
        if (st != DDT_OK) return st;
    }
    return DDT_OK;
}

/* Reads added_tokens_decoder; *found false when the config has none. */
static ddt_status load_config_specials(ddt_tokenizer *tok, const ddt_tokenizer_source *src, bool *found,
                                       ddt_error *err) {
    const char *name = src->config_name ? src->config_name : "tokenizer_config.json";
    *found = false;
    if (src->config_len > TOK_MAX_CONFIG_BYTES)
        return ddt_fail(err, DDT_ERR_RANGE, "%s: %zu bytes, over the limit %zu", name, src->config_len, TOK_MAX_CONFIG_BYTES);
    json_error_t jerr;
    json_t *root = json_loadb(src->config, src->config_len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (!root) return ddt_fail(err, DDT_ERR_FORMAT, "%s line %d column %d: %s", name, jerr.line, jerr.column, jerr.text);
    ddt_status st = DDT_OK;
    json_t *decoder = json_is_object(root) ? json_object_get(root, "added_tokens_decoder") : NULL;
    if (!json_is_object(root)) {
        st = ddt_fail(err, DDT_ERR_FORMAT, "%s: top level is not a JSON object", name);
    } else if (decoder && !json_is_object(decoder)) {
        st = ddt_fail(err, DDT_ERR_FORMAT, "%s: added_tokens_decoder is not an object", name);
    } else if (decoder) {
        *found = true;
        const char *key;
        json_t *val;
        json_object_foreach(decoder, key, val) {
            char where[160];
            snprintf(where, sizeof where, "%s: added_tokens_decoder[\"%.40s\"]", name, key);
            int64_t id = 0;
            size_t k = 0;
            for (; key[k] >= '0' && key[k] <= '9'; k++) {
                if (id <= DDT_TOKENIZER_MAX_ID) id = id * 10 + (key[k] - '0'); /* stays far below INT64_MAX */
            }
            if (k == 0 || key[k] != '\0') {
                st = ddt_fail(err, DDT_ERR_FORMAT, "%s: the key is not a decimal id", where);
                break;
            }
            if (id > DDT_TOKENIZER_MAX_ID) {
                st = ddt_fail(err, DDT_ERR_RANGE, "%s: id over the limit %d", where, DDT_TOKENIZER_MAX_ID);
                break;
            }
            json_t *content = json_is_object(val) ? json_object_get(val, "content") : NULL;
            if (!json_is_string(content) || json_string_length(content) == 0) {
                st = ddt_fail(err, DDT_ERR_FORMAT, "%s: no non-empty string \"content\"", where);
                break;
            }
            tok_special sp = {(int32_t)id, true, json_string_value(content), json_string_length(content)};
            st = add_special(tok, &sp, where, err);
            if (st != DDT_OK) break;
        }
        if (st == DDT_OK) st = add_reserved(tok, name, err);
    }
    json_decref(root);
    return st;
}

static ddt_status load_specials(ddt_tokenizer *tok, const ddt_tokenizer_source *src, ddt_error *err) {
    bool found = false;
    if (src->config) {
        ddt_status st = load_config_specials(tok, src, &found, err);
        if (st != DDT_OK) return st;
    }
    if (!found && tok->n_ranks == DDT_TOKENIZER_KIMI_RANKS) {
        for (size_t i = 0; i < sizeof kimi_specials / sizeof kimi_specials[0]; i++) {
            tok_special sp = {kimi_specials[i].id, true, kimi_specials[i].text, strlen(kimi_specials[i].text)};
            ddt_status st = add_special(tok, &sp, "built-in Kimi special tokens", err);
            if (st != DDT_OK) return st;
        }
        ddt_status st = add_reserved(tok, "built-in Kimi special tokens", err);
        if (st != DDT_OK) return st;
    }

    /* Index the specials: hash of their text, first bytes, distinct lengths. */
    ddt_status st = tok_table_init(&tok->specials, (size_t)tok->n_special, err);
    if (st != DDT_OK) return st;
    tok->special_lens = ddt_malloc_array((size_t)tok->n_special + 1, sizeof *tok->special_lens);
    if (!tok->special_lens) return ddt_fail(err, DDT_ERR_NOMEM, "tokenizer: out of memory for special tokens");
    for (int32_t id = 0; id < tok->vocab_size; id++) {
        if (tok->id_kind[id] != TOK_SPECIAL) continue;
        int32_t other = tok_table_insert(tok, &tok->specials, id);
        if (other >= 0) {
            const char *name = src->config_name ? src->config_name : "special tokens";
            return ddt_fail(err, DDT_ERR_FORMAT, "%s: special tokens %d and %d have the same text", name, other, id);
        }
        uint8_t first = tok->pool[tok->id_off[id]];
        tok->special_first[first >> 3] |= (uint8_t)(1u << (first & 7));
        uint32_t len = tok->id_len[id];
        int32_t k = 0;
        while (k < tok->n_special_lens && tok->special_lens[k] > len) k++;
        if (k < tok->n_special_lens && tok->special_lens[k] == len) continue;
        memmove(tok->special_lens + k + 1, tok->special_lens + k,
                (size_t)(tok->n_special_lens - k) * sizeof *tok->special_lens);
        tok->special_lens[k] = len;
        tok->n_special_lens++;
    }
    return DDT_OK;
}

/* ------------------------------------------------------------------ pattern */

static ddt_status compile_pattern(ddt_tokenizer *tok, const ddt_tokenizer_source *src, ddt_error *err) {
    const char *pat = kimi_pattern;
    size_t pat_len = sizeof kimi_pattern - 1;
    const char *name = "built-in Kimi pattern";
    if (src->pattern) {
        name = src->pattern_name ? src->pattern_name : "pattern";
        pat = src->pattern;
        pat_len = src->pattern_len;
        if (pat_len > TOK_MAX_PATTERN_BYTES)
            return ddt_fail(err, DDT_ERR_RANGE, "%s: %zu bytes, over the limit %zu", name, pat_len, TOK_MAX_PATTERN_BYTES);
        if (pat_len > 0 && pat[pat_len - 1] == '\n') pat_len--;
        if (pat_len > 0 && pat[pat_len - 1] == '\r') pat_len--;
        if (pat_len == 0) return ddt_fail(err, DDT_ERR_FORMAT, "%s: empty pattern", name);
    }
    int code;
    PCRE2_SIZE off;
    /* MATCH_INVALID_UTF: invalid UTF-8 in the text is legal input; it never matches
     * and becomes a gap between matches instead of failing the whole match. */
    tok->re = pcre2_compile((PCRE2_SPTR)pat, pat_len, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &off,
                            NULL);
    if (!tok->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        return ddt_fail(err, DDT_ERR_FORMAT, "%s: offset %zu: %s", name, (size_t)off, (const char *)msg);
    }
    /* JIT when the platform has it; the interpreter gives the same matches. */
    if (pcre2_jit_compile(tok->re, PCRE2_JIT_COMPLETE) == 0) {
        tok->jit_stack = pcre2_jit_stack_create(32 << 10, 4 << 20, NULL);
    }
    tok->mctx = pcre2_match_context_create(NULL);
    tok->md = pcre2_match_data_create_from_pattern(tok->re, NULL);
    if (!tok->mctx || !tok->md) return ddt_fail(err, DDT_ERR_NOMEM, "%s: out of memory", name);
    if (tok->jit_stack) pcre2_jit_stack_assign(tok->mctx, NULL, tok->jit_stack);
    return DDT_OK;
}

/* ------------------------------------------------------------------ load */

/* The BPE merge workspace's arrays (tok_workspace_reserve), freed. */
static void workspace_free(ddt_tokenizer *tok) {
    free(tok->ws_next);
    free(tok->ws_prev);
    free(tok->ws_rank);
    free(tok->ws_alive);
    free(tok->ws_heap);
    free(tok->ws_sym);
}

void ddt_tokenizer_free(ddt_tokenizer *tok) {
    if (!tok) return;
    free(tok->pool);
    free(tok->id_off);
    free(tok->id_len);
    free(tok->id_kind);
    free(tok->ranks.slots);
    free(tok->specials.slots);
    free(tok->special_lens);
    pcre2_match_data_free(tok->md);
    pcre2_match_context_free(tok->mctx);
    pcre2_jit_stack_free(tok->jit_stack);
    pcre2_code_free(tok->re);
    workspace_free(tok);
    tok_hf_free(tok->hf);
    free(tok);
}

ddt_status ddt_tokenizer_create(const ddt_tokenizer_source *src, ddt_tokenizer **out, ddt_error *err) {
    if (!src || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_tokenizer_create: NULL argument");
    *out = NULL;
    ddt_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) return ddt_fail(err, DDT_ERR_NOMEM, "tokenizer: out of memory");
    ddt_status st = load_ranks(tok, src, err);
    if (st == DDT_OK) st = load_specials(tok, src, err);
    if (st == DDT_OK) st = compile_pattern(tok, src, err);
    if (st != DDT_OK) {
        ddt_tokenizer_free(tok);
        return st;
    }
    *out = tok;
    ddt_error_clear(err);
    return DDT_OK;
}

/* A tokenizer.json file: read whole and handed to ddt_tokenizer_create_json. */
static ddt_status load_json_file(const char *path, ddt_tokenizer **out, ddt_error *err) {
    char *json = NULL;
    size_t len = 0;
    ddt_status st = ddt_read_file(path, DDT_TOKENIZER_MAX_JSON_BYTES, false, &json, &len, err);
    if (st == DDT_OK) st = ddt_tokenizer_create_json(path, json, len, out, err);
    free(json);
    return st;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

ddt_status ddt_tokenizer_load(const char *path, ddt_tokenizer **out, ddt_error *err) {
    if (!path || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_tokenizer_load: NULL argument");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return ddt_fail(err, DDT_ERR_IO, "%s: %s", path, strerror(errno));
    size_t plen = strlen(path);
    if (plen > 3800) return ddt_fail(err, DDT_ERR_INVALID, "%.64s...: path too long", path);
    char model_path[4096], config_path[4096], pattern_path[4096];
    bool is_dir = S_ISDIR(sb.st_mode);
    if (is_dir) {
        snprintf(model_path, sizeof model_path, "%s/tiktoken.model", path);
        snprintf(config_path, sizeof config_path, "%s/tokenizer_config.json", path);
        snprintf(pattern_path, sizeof pattern_path, "%s/tokenizer_pattern.txt", path);
        /* tiktoken.model wins when both are there (a Kimi folder may carry a converted
         * tokenizer.json too); a folder with neither is reported as missing both */
        if (stat(model_path, &sb) != 0) {
            char json_path[4096];
            snprintf(json_path, sizeof json_path, "%s/tokenizer.json", path);
            if (stat(json_path, &sb) == 0) return load_json_file(json_path, out, err);
            return ddt_fail(err, DDT_ERR_IO, "%s: no tokenizer: neither tiktoken.model nor tokenizer.json is there",
                            path);
        }
    } else {
        if (ends_with(path, ".json")) return load_json_file(path, out, err);
        snprintf(model_path, sizeof model_path, "%s", path);
    }
    char *model = NULL, *config = NULL, *pattern = NULL;
    size_t model_len = 0, config_len = 0, pattern_len = 0;
    ddt_status st = ddt_read_file(model_path, TOK_MAX_MODEL_BYTES, false, &model, &model_len, err);
    if (st == DDT_OK && is_dir) st = ddt_read_file(config_path, TOK_MAX_CONFIG_BYTES, true, &config, &config_len, err);
    if (st == DDT_OK && is_dir) st = ddt_read_file(pattern_path, TOK_MAX_PATTERN_BYTES, true, &pattern, &pattern_len, err);
    if (st == DDT_OK) {
        ddt_tokenizer_source src = {
            .model_name = model_path, .model = (const uint8_t *)model, .model_len = model_len,
            .config_name = config ? config_path : NULL, .config = config, .config_len = config_len,
            .pattern_name = pattern ? pattern_path : NULL, .pattern = pattern, .pattern_len = pattern_len,
        };
        st = ddt_tokenizer_create(&src, out, err);
    }
    free(model);
    free(config);
    free(pattern);
    return st;
}

/* ------------------------------------------------------------------ encode */


void tok_emit(tok_encoder *e, int32_t id) {
    if (e->count < e->max_ids) e->ids[e->count] = id;
    e->count++;
}

ddt_status tok_workspace_reserve(ddt_tokenizer *tok, size_t n, ddt_error *err) {
    if (n <= tok->ws_cap) return DDT_OK;
    size_t cap = tok->ws_cap * 2 > n ? tok->ws_cap * 2 : n;
    if (cap < 64) cap = 64;
    size_t heap_n;
    if (!ddt_mul_size(cap, 3, &heap_n)) return ddt_fail(err, DDT_ERR_RANGE, "tokenizer: piece of %zu bytes too long", n);
    workspace_free(tok);
    tok->ws_next = ddt_malloc_array(cap, sizeof *tok->ws_next);
    tok->ws_prev = ddt_malloc_array(cap, sizeof *tok->ws_prev);
    tok->ws_rank = ddt_malloc_array(cap, sizeof *tok->ws_rank);
    tok->ws_alive = ddt_malloc_array(cap, 1);
    tok->ws_heap = ddt_malloc_array(heap_n, sizeof *tok->ws_heap);
    tok->ws_sym = ddt_malloc_array(cap, sizeof *tok->ws_sym);
    if (!tok->ws_next || !tok->ws_prev || !tok->ws_rank || !tok->ws_alive || !tok->ws_heap || !tok->ws_sym ||
        cap > INT32_MAX) {
        tok->ws_cap = 0;
        return ddt_fail(err, DDT_ERR_NOMEM, "tokenizer: out of memory for a piece of %zu bytes", n);
    }
    tok->ws_cap = cap;
    return DDT_OK;
}

void tok_heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

uint64_t tok_heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = v;
    return top;
}

/* Rank of the part starting at i merged with the next part, -1 if none or no such token. */
static int32_t pair_rank(const ddt_tokenizer *tok, const uint8_t *p, size_t n, uint32_t i) {
    uint32_t j = tok->ws_next[i];
    if (j >= n) return -1;
    uint32_t end = tok->ws_next[j];
    return tok_table_find(tok, &tok->ranks, p + i, end - i);
}

static ddt_status missing_token(tok_encoder *e, const uint8_t *p, size_t n) {
    return ddt_fail(e->err, DDT_ERR_INVALID, "tokenizer: no token for the %zu byte(s) at offset %zu (first byte 0x%02x)",
                    n, (size_t)(p - e->base), p[0]);
}

/*
 * tiktoken's byte_pair_merge: start from single bytes; repeatedly merge the
 * adjacent pair whose concatenation has the lowest rank (leftmost on ties).
 * A heap of (rank, start) with stale entries skipped makes it O(n log n); an
 * entry is stale when its part is gone or its pair rank changed (a part's span
 * only grows, and ranks of distinct byte strings differ, so equal rank = same pair).
 */
static ddt_status bpe_piece(tok_encoder *e, const uint8_t *p, size_t n) {
    ddt_tokenizer *tok = e->tok;
    if (n == 0) return DDT_OK;
    int32_t whole = tok_table_find(tok, &tok->ranks, p, n);
    if (whole >= 0) {
        tok_emit(e, whole);
        return DDT_OK;
    }
    if (n == 1) return missing_token(e, p, n);
    ddt_status st = tok_workspace_reserve(tok, n, e->err);
    if (st != DDT_OK) return st;
    uint32_t *next = tok->ws_next;
    int32_t *prev = tok->ws_prev, *rank = tok->ws_rank;
    uint8_t *alive = tok->ws_alive;
    uint64_t *heap = tok->ws_heap;
    size_t heap_n = 0;
    for (uint32_t i = 0; i < n; i++) {
        next[i] = i + 1;
        prev[i] = (int32_t)i - 1;
        alive[i] = 1;
    }
    for (uint32_t i = 0; i < n; i++) {
        rank[i] = pair_rank(tok, p, n, i);
        if (rank[i] >= 0) tok_heap_push(heap, &heap_n, (uint64_t)rank[i] << 32 | i);
    }
    while (heap_n > 0) {
        uint64_t top = tok_heap_pop(heap, &heap_n);
        uint32_t i = (uint32_t)top;
        int32_t r = (int32_t)(top >> 32);
        if (!alive[i] || rank[i] != r) continue;
        uint32_t j = next[i];
        alive[j] = 0;
        next[i] = next[j];
        if (next[j] < n) prev[next[j]] = (int32_t)i;
        rank[i] = pair_rank(tok, p, n, i);
        if (rank[i] >= 0) tok_heap_push(heap, &heap_n, (uint64_t)rank[i] << 32 | i);
        if (prev[i] >= 0) {
            uint32_t q = (uint32_t)prev[i];
            rank[q] = pair_rank(tok, p, n, q);
            if (rank[q] >= 0) tok_heap_push(heap, &heap_n, (uint64_t)rank[q] << 32 | q);
        }
    }
    for (uint32_t i = 0; i < n; i = next[i]) {
        int32_t id = tok_table_find(tok, &tok->ranks, p + i, next[i] - i);
        if (id < 0) return missing_token(e, p + i, next[i] - i);
        tok_emit(e, id);
    }
    return DDT_OK;
}

/* Split by the pattern and BPE each piece; unmatched bytes (invalid UTF-8) form pieces too. */
static ddt_status encode_ordinary(tok_encoder *e, const uint8_t *s, size_t n) {
    ddt_tokenizer *tok = e->tok;
    size_t pos = 0, off = 0;
    uint32_t opts = 0;
    while (off < n) {
        int rc = pcre2_match(tok->re, (PCRE2_SPTR)s, n, off, opts, tok->md, tok->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ddt_fail(e->err, DDT_ERR_INVALID, "tokenizer: pre-tokenisation failed at offset %zu: %s",
                            (size_t)(s + off - e->base), (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(tok->md);
        size_t ms = ov[0], me = ov[1];
        ddt_status st = bpe_piece(e, s + pos, ms - pos);
        if (st == DDT_OK) st = bpe_piece(e, s + ms, me - ms);
        if (st != DDT_OK) return st;
        pos = me;
        off = me;
        /* After an empty match (only a custom pattern can give one) the next must be non-empty. */
        opts = me == ms ? PCRE2_NOTEMPTY_ATSTART : 0;
    }
    return bpe_piece(e, s + pos, n - pos);
}

/* Special token starting at s[0] (longest first), else -1; *len set when found. */
static int32_t special_at(const ddt_tokenizer *tok, const uint8_t *s, size_t avail, size_t *len) {
    if (!(tok->special_first[s[0] >> 3] & (1u << (s[0] & 7)))) return -1;
    for (int32_t k = 0; k < tok->n_special_lens; k++) {
        size_t l = tok->special_lens[k];
        if (l > avail) continue;
        int32_t id = tok_table_find(tok, &tok->specials, s, l);
        if (id >= 0) {
            *len = l;
            return id;
        }
    }
    return -1;
}

bool tok_marked(const uint8_t *data, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (data[k]) return true;
    return false;
}

static ddt_status encode_segment(tok_encoder *e, const uint8_t *s, size_t n, uint32_t flags) {
    if (e->tok->hf) return tok_hf_encode(e, s, n, flags);
    if (!(flags & DDT_TOKENIZE_SPECIAL) || e->tok->n_special == 0) return encode_ordinary(e, s, n);
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        int32_t id = special_at(e->tok, s + i, n - i, &len);
        if (id < 0 || (e->data && tok_marked(e->data + (s + i - e->base), len))) continue;
        ddt_status st = encode_ordinary(e, s + start, i - start);
        if (st != DDT_OK) return st;
        tok_emit(e, id);
        start = i + len;
        i = start - 1;
    }
    return encode_ordinary(e, s + start, n - start);
}

size_t tok_utf8_next(const uint8_t *s, size_t n, int32_t *cp) {
    uint8_t b = s[0];
    size_t len;
    int32_t v, min;
    if (b < 0x80) {
        *cp = b;
        return 1;
    } else if (b >= 0xC2 && b <= 0xDF) {
        len = 2, v = b & 0x1F, min = 0x80;
    } else if (b >= 0xE0 && b <= 0xEF) {
        len = 3, v = b & 0x0F, min = 0x800;
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4, v = b & 0x07, min = 0x10000;
    } else {
        *cp = -1;
        return 1;
    }
    if (len > n) {
        *cp = -1;
        return 1;
    }
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) {
            *cp = -1;
            return 1;
        }
        v = v << 6 | (s[k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = -1;
        return 1;
    }
    *cp = v;
    return len;
}

/* Python's str.isspace(). */
static bool py_isspace(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Kimi's TikTokenTokenizer.encode: 400000-code-point chunks, each cut where a run of
 * whitespace or non-whitespace would exceed 25000 code points (_split_whitespaces_or_nonwhitespaces). */
static ddt_status encode_kimi_chunks(tok_encoder *e, const uint8_t *s, size_t n, uint32_t flags) {
    enum { CHUNK_CHARS = 400000, MAX_RUN = 25000 };
    size_t pos = 0;
    do {
        size_t slice_start = pos;
        size_t chars = 0, run = 0;
        bool run_space = false;
        while (pos < n && chars < CHUNK_CHARS) {
            int32_t cp;
            size_t len = tok_utf8_next(s + pos, n - pos, &cp);
            bool space = cp >= 0 && py_isspace(cp);
            if (chars == 0) run_space = space;
            if (space != run_space) {
                run = 1;
                run_space = space;
            } else if (++run > MAX_RUN) {
                ddt_status st = encode_segment(e, s + slice_start, pos - slice_start, flags);
                if (st != DDT_OK) return st;
                slice_start = pos;
                run = 1;
            }
            pos += len;
            chars++;
        }
        ddt_status st = encode_segment(e, s + slice_start, pos - slice_start, flags);
        if (st != DDT_OK) return st;
    } while (pos < n);
    return DDT_OK;
}

static ddt_status encode_with(ddt_tokenizer *tok, const char *text, const uint8_t *data, size_t len, uint32_t flags,
                              int32_t *ids, size_t max_ids, size_t *n_ids, ddt_error *err) {
    tok_encoder e = {tok, (const uint8_t *)text, data, ids, max_ids, 0, err};
    ddt_status st = DDT_OK;
    if (len > 0) {
        const uint8_t *s = (const uint8_t *)text;
        /* Kimi's chunking belongs to its tiktoken tokenizer; tokenizer.json encodes whole texts */
        bool chunks = (flags & DDT_TOKENIZE_KIMI_CHUNKS) && !tok->hf;
        st = chunks ? encode_kimi_chunks(&e, s, len, flags) : encode_segment(&e, s, len, flags);
    }
    *n_ids = e.count;
    if (st != DDT_OK) return st;
    if (e.count > max_ids)
        return ddt_fail(err, DDT_ERR_RANGE, "tokenizer: the text needs %zu ids, the buffer holds %zu", e.count, max_ids);
    ddt_error_clear(err);
    return DDT_OK;
}

ddt_status ddt_tokenizer_encode(ddt_tokenizer *tok, const char *text, size_t len, uint32_t flags, int32_t *ids,
                                size_t max_ids, size_t *n_ids, ddt_error *err) {
    if (!tok || (!text && len) || (!ids && max_ids) || !n_ids)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_tokenizer_encode: NULL argument");
    if (flags & ~(uint32_t)(DDT_TOKENIZE_SPECIAL | DDT_TOKENIZE_KIMI_CHUNKS))
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_tokenizer_encode: unknown flags 0x%x", flags);
    return encode_with(tok, text, NULL, len, flags, ids, max_ids, n_ids, err);
}

ddt_status ddt_tokenizer_encode_marked(ddt_tokenizer *tok, const char *text, const uint8_t *data, size_t len,
                                       uint32_t flags, int32_t *ids, size_t max_ids, size_t *n_ids,
                                       ddt_error *err) {
    if (!tok || (!text && len) || (!ids && max_ids) || !n_ids)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_tokenizer_encode_marked: NULL argument");
    if (flags & ~(uint32_t)(DDT_TOKENIZE_SPECIAL | DDT_TOKENIZE_KIMI_CHUNKS))
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_tokenizer_encode_marked: unknown flags 0x%x", flags);
    return encode_with(tok, text, data, len, flags | DDT_TOKENIZE_SPECIAL, ids, max_ids, n_ids, err);
}

/* ------------------------------------------------------------------ decode and look-ups */

static bool id_known(const ddt_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->vocab_size && tok->id_kind[id] != TOK_UNUSED;
}

ddt_status ddt_tokenizer_decode(const ddt_tokenizer *tok, const int32_t *ids, size_t n, char *buf, size_t cap,
                                size_t *len, ddt_error *err) {
    if (!tok || (!ids && n) || (!buf && cap) || !len)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_tokenizer_decode: NULL argument");
    size_t total = 0;
    *len = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (!id_known(tok, id))
            return ddt_fail(err, DDT_ERR_INVALID, "tokenizer: id %d at position %zu is not in the vocabulary (size %d)",
                            id, i, tok->vocab_size);
        size_t l = tok->id_len[id];
        if (total < cap) memcpy(buf + total, tok->pool + tok->id_off[id], l < cap - total ? l : cap - total);
        total += l; /* <= n * pool size; cannot overflow for n ids in memory */
    }
    *len = total;
    if (total > cap)
        return ddt_fail(err, DDT_ERR_RANGE, "tokenizer: decoding needs %zu bytes, the buffer holds %zu", total, cap);
    ddt_error_clear(err);
    return DDT_OK;
}

ddt_status ddt_tokenizer_token_bytes(const ddt_tokenizer *tok, int32_t id, const uint8_t **bytes, size_t *len,
                                     ddt_error *err) {
    if (!tok || !bytes || !len) return ddt_fail(err, DDT_ERR_INVALID, "ddt_tokenizer_token_bytes: NULL argument");
    if (!id_known(tok, id))
        return ddt_fail(err, DDT_ERR_INVALID, "tokenizer: id %d is not in the vocabulary (size %d)", id, tok->vocab_size);
    *bytes = tok->pool + tok->id_off[id];
    *len = tok->id_len[id];
    return DDT_OK;
}

int32_t ddt_tokenizer_token_id(const ddt_tokenizer *tok, const char *text) {
    if (!tok || !text || !text[0]) return -1;
    size_t n = strlen(text);
    if (tok->hf) return tok_hf_token_id(tok, (const uint8_t *)text, n);
    int32_t id = tok_table_find(tok, &tok->specials, (const uint8_t *)text, n);
    return id >= 0 ? id : tok_table_find(tok, &tok->ranks, (const uint8_t *)text, n);
}

int32_t ddt_tokenizer_vocab_size(const ddt_tokenizer *tok) { return tok ? tok->vocab_size : 0; }
int32_t ddt_tokenizer_n_ranks(const ddt_tokenizer *tok) { return tok ? tok->n_ranks : 0; }
int32_t ddt_tokenizer_n_special(const ddt_tokenizer *tok) { return tok ? tok->n_special : 0; }

bool ddt_tokenizer_is_special(const ddt_tokenizer *tok, int32_t id) {
    return tok && id >= 0 && id < tok->vocab_size && tok->id_kind[id] == TOK_SPECIAL;
}

bool ddt_tokenizer_text_bytes(const ddt_tokenizer *tok, int32_t id, const uint8_t **bytes, size_t *len) {
    *bytes = NULL;
    *len = 0;
    if (!tok || ddt_tokenizer_is_special(tok, id)) return false;
    return ddt_tokenizer_token_bytes(tok, id, bytes, len, NULL) == DDT_OK;
}
