/*
 * tokenizer.h — byte-level BPE tokenizers in two formats behind one API: the
 * tiktoken format (Kimi K2) and Hugging Face's tokenizer.json (DeepSeek-V3, R1,
 * V3.1, GPT-2-style files).  ddt_tokenizer_load on a model folder reads
 * tiktoken.model when it is there, else tokenizer.json.
 *
 * tiktoken format.  A model folder holds:
 *   tiktoken.model          one line per ordinary token: base64(bytes) SPACE rank
 *                           (ranks unique, not necessarily dense; the rank is the id)
 *   tokenizer_config.json   optional; "added_tokens_decoder" names the special ids
 *                           ({"163584": {"content": "[BOS]", ...}, ...})
 *   tokenizer_pattern.txt   optional; a PCRE2 pre-tokenisation pattern that replaces
 *                           the built-in Kimi pattern (the whole file, a trailing
 *                           newline dropped; compiled with UTF and UCP, so write
 *                           PCRE2 syntax, not Rust's `&&` class intersections)
 *
 * Special tokens follow Kimi's tokenization_kimi.py: the ids n_ranks ..
 * n_ranks+255 are special; those not named by added_tokens_decoder are called
 * "<|reserved_token_<id>|>".  Without a tokenizer_config.json (or without
 * added_tokens_decoder in it) a vocabulary of exactly 163584 ranks gets Kimi's
 * built-in table ([BOS] 163584, [EOS] 163585, <|im_end|> 163586, <|im_user|>
 * 163587, <|im_assistant|> 163588, <|im_system|> 163594, <|im_middle|> 163601,
 * [UNK] 163838, [PAD] 163839, the rest reserved); any other size gets none.
 *
 * Encoding: text is split by the pattern (PCRE2), each piece is merged by BPE
 * exactly as tiktoken's byte_pair_merge does (a piece that is itself a token is
 * that token; otherwise the lowest-rank adjacent pair merges first, leftmost on
 * ties), so ids equal tiktoken's for valid UTF-8 (code points assigned in a
 * Unicode version newer than PCRE2's tables may be classed differently).  Bytes the pattern does not
 * match — invalid UTF-8 — are BPE-merged as one piece per gap instead of being
 * dropped, so decode(encode(x)) == x for every byte string whose bytes all have
 * tokens (every byte-level vocabulary).
 *
 * tokenizer.json format (a folder's tokenizer.json, or a path ending in .json;
 * tokenizer_config.json is not read: the added tokens are in tokenizer.json).
 * Accepted: model.type "BPE" with "vocab" {token: id} in GPT-2's byte-level
 * characters and "merges" ("a b" strings, a leading "#version" line skipped, or
 * [a, b] pairs), unk_token / fuse_unk / ignore_merges, empty
 * continuing_subword_prefix / end_of_word_suffix, no dropout or byte_fallback;
 * "normalizer" null; "pre_tokenizer" ByteLevel (add_prefix_space false,
 * use_regex either way) alone or last of a Sequence of up to 8 Splits (7 with
 * ByteLevel's regex; Regex or String pattern, any behaviour, invert either way); "decoder"
 * ByteLevel; "post_processor" is ignored (encoding is HF's
 * add_special_tokens=False: a chat template writes the BOS); "added_tokens"
 * without lstrip / rstrip / single_word.  Anything else is refused with its
 * JSON path named.  Split regexes are Oniguruma syntax (what `tokenizers`
 * compiles); they are translated to PCRE2 (\s, \w, \d, \h, \v, \uHHHH, bare
 * script names, the dot spelled out as Oniguruma means them) and a construct
 * whose meaning differs and that no known file uses (\b, nested or
 * intersected classes, ^ $, the m s x options) is refused.
 *
 * Encoding as HF's Tokenizer.encode: added tokens are found first
 * (leftmost-longest, those with normalized false, then those with normalized
 * true in what is left); each Split then cuts the text as the onig crate finds
 * matches and the behaviour groups them; each piece's bytes become symbols (the
 * ids of their byte characters) merged by HF's BPE: the pair with the lowest
 * merge-list index first, leftmost on ties (merge ranks are list positions, not
 * ids as in tiktoken).  Ids equal HF's for valid UTF-8 (the same Unicode-version
 * caveat), with two differences: a byte whose character is missing from the
 * vocabulary (and no unk_token) is DDT_ERR_INVALID where HF silently drops it,
 * and invalid UTF-8 (which HF cannot take) forms gaps the regexes do not match,
 * as in the tiktoken format, so it round-trips.  DDT_TOKENIZE_SPECIAL on is HF's
 * default; off is HF's encode_special_tokens = True: added tokens with "special"
 * true are text, the others still match.  In encode_marked's data bytes no added
 * token matches.  DDT_TOKENIZE_KIMI_CHUNKS is ignored.  Decoding is HF's
 * ByteLevel decoder with skip_special_tokens false: a token whose characters are
 * all byte characters gives those bytes, any other its own UTF-8 (added tokens
 * included).  An added token is a special id (ddt_tokenizer_is_special) when
 * "special" is true or the vocabulary lacks it (DeepSeek-R1's non-special
 * <think>); a non-special one that the vocabulary has stays text.
 *
 * Thread safety: encode uses a workspace inside the tokenizer, so one tokenizer
 * must not encode on two threads at once; decode and the look-ups are read-only.
 */
#ifndef DDT_TEXT_TOKENIZER_H
#define DDT_TEXT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddtree.h"

/* Largest id (rank or special) accepted, so that id tables stay bounded on hostile files. */
#define DDT_TOKENIZER_MAX_ID ((1 << 24) - 1)
/* tokenizer.json files larger than this are refused before parsing (DeepSeek-V3's is 7.5 MiB). */
#define DDT_TOKENIZER_MAX_JSON_BYTES ((size_t)256 << 20)
/* Number of special ids reserved after the ranks (Kimi's num_reserved_special_tokens). */
#define DDT_TOKENIZER_N_RESERVED 256
/* The built-in Kimi table applies to a vocabulary of exactly this many ranks. */
#define DDT_TOKENIZER_KIMI_RANKS 163584

/* Flags of ddt_tokenizer_encode. */
enum {
    /* Recognise special-token text ("<|im_end|>") as its id; without it such text is
     * encoded as ordinary bytes (tiktoken's encode_ordinary / disallowed_special=()). */
    DDT_TOKENIZE_SPECIAL = 1u << 0,
    /* Split the text first as Kimi's TikTokenTokenizer.encode does: chunks of 400000
     * code points, then no run of more than 25000 consecutive whitespace or
     * non-whitespace code points (Python str.isspace()), each part encoded alone.
     * Gives the Hugging Face tokenizer's ids for very long inputs. */
    DDT_TOKENIZE_KIMI_CHUNKS = 1u << 1
};

typedef struct ddt_tokenizer ddt_tokenizer;

/* The inputs of ddt_tokenizer_create, already in memory; names are for messages. */
typedef struct ddt_tokenizer_source {
    const char *model_name;   /* e.g. the tiktoken.model path */
    const uint8_t *model;     /* [model_len] tiktoken.model text */
    size_t model_len;
    const char *config_name;  /* tokenizer_config.json path; NULL when config is NULL */
    const char *config;       /* [config_len] JSON text, or NULL */
    size_t config_len;
    const char *pattern_name; /* pattern file path; NULL when pattern is NULL */
    const char *pattern;      /* [pattern_len] PCRE2 pattern, or NULL for Kimi's */
    size_t pattern_len;
} ddt_tokenizer_source;

/* The built-in Kimi pre-tokenisation pattern, in PCRE2 syntax (NUL-terminated). */
const char *ddt_tokenizer_kimi_pattern(void);

/*
 * Load a tokenizer from a model folder (reads tiktoken.model, and
 * tokenizer_config.json and tokenizer_pattern.txt when present; without
 * tiktoken.model, tokenizer.json), from a tokenizer.json file given directly
 * (a path ending in .json), or from a tiktoken.model file (no side files).
 */
ddt_status ddt_tokenizer_load(const char *path, ddt_tokenizer **out, ddt_error *err);

/* Build a tokenizer from in-memory files (see ddt_tokenizer_source). */
ddt_status ddt_tokenizer_create(const ddt_tokenizer_source *src, ddt_tokenizer **out,
                                ddt_error *err);

/* Build a tokenizer from the text of a tokenizer.json (len bytes); name is for messages. */
ddt_status ddt_tokenizer_create_json(const char *name, const char *json, size_t len, ddt_tokenizer **out,
                                     ddt_error *err);

void ddt_tokenizer_free(ddt_tokenizer *tok);

/*
 * Encode len bytes of text (any bytes; need not be NUL-terminated) into ids.
 * Writes min(count, max_ids) ids and sets *n_ids to the full count; when the
 * count exceeds max_ids it returns DDT_ERR_RANGE (ids may be NULL with max_ids 0
 * to ask for the count).  DDT_ERR_INVALID when a byte sequence has no token (a
 * vocabulary without all 256 single bytes).
 */
ddt_status ddt_tokenizer_encode(ddt_tokenizer *tok, const char *text, size_t len, uint32_t flags,
                                int32_t *ids, size_t max_ids, size_t *n_ids, ddt_error *err);

/*
 * As ddt_tokenizer_encode with DDT_TOKENIZE_SPECIAL, except that special-token
 * text is recognised only where every one of its bytes has data[i] == 0: a chat
 * template's rendered text (jinja.h), where data[i] == 1 marks bytes that came
 * from a message, so "<|im_end|>" typed by a user stays ordinary text while the
 * template's own markers become their ids.  The text between special tokens is
 * encoded as one piece whatever its marks, so for text without special-token
 * strings in the data the ids equal encoding the whole string with specials
 * recognised (what apply_chat_template does).  flags: DDT_TOKENIZE_KIMI_CHUNKS
 * or 0 (DDT_TOKENIZE_SPECIAL is implied).  data may be NULL (all template).
 */
ddt_status ddt_tokenizer_encode_marked(ddt_tokenizer *tok, const char *text, const uint8_t *data, size_t len,
                                       uint32_t flags, int32_t *ids, size_t max_ids, size_t *n_ids,
                                       ddt_error *err);

/*
 * Decode n ids into bytes (special ids give their text).  Writes
 * min(length, cap) bytes, sets *len to the full length, DDT_ERR_RANGE when it
 * exceeds cap; DDT_ERR_INVALID naming the first id not in the vocabulary.
 * No NUL terminator is written.
 */
ddt_status ddt_tokenizer_decode(const ddt_tokenizer *tok, const int32_t *ids, size_t n, char *buf,
                                size_t cap, size_t *len, ddt_error *err);

/* The bytes of one id (borrowed, valid while tok lives); DDT_ERR_INVALID for an unknown id. */
ddt_status ddt_tokenizer_token_bytes(const ddt_tokenizer *tok, int32_t id, const uint8_t **bytes,
                                     size_t *len, ddt_error *err);

/* Id of a special token's text, else of an ordinary token with exactly these bytes; -1 if none. */
int32_t ddt_tokenizer_token_id(const ddt_tokenizer *tok, const char *text);

/* Largest id + 1 (ranks and specials). */
int32_t ddt_tokenizer_vocab_size(const ddt_tokenizer *tok);
/* Number of ordinary tokens (lines of tiktoken.model; model.vocab's text tokens). */
int32_t ddt_tokenizer_n_ranks(const ddt_tokenizer *tok);
/* Number of special tokens. */
int32_t ddt_tokenizer_n_special(const ddt_tokenizer *tok);
/* True when id is a special token. */
bool ddt_tokenizer_is_special(const ddt_tokenizer *tok, int32_t id);
/* The bytes id adds to a generation's text (borrowed): true for an ordinary token;
 * false, with none, for a special token (not text), an unknown id or a NULL tok. */
bool ddt_tokenizer_text_bytes(const ddt_tokenizer *tok, int32_t id, const uint8_t **bytes, size_t *len);

#endif
