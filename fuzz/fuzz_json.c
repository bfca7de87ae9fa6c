/*
 * fuzz_json.c — libFuzzer target for JSON mode's recogniser (text/json_grammar.h)
 * and token masks (text/json_vocab.h).  Input: a flags byte, then document bytes
 * up to the first NUL, then a vocabulary of tokens separated by '\n' (at most
 * 64).  The document is fed byte by byte; a refused byte must leave the state
 * as it was and is skipped, so the bytes kept are always a live prefix, on which
 * the depth and whitespace limits must hold.  At a few points along the way the
 * vocabulary's mask must be exactly the tokens whose bytes step the state (or
 * only the stop id once the document is complete; tokens over
 * DDT_JSON_VOCAB_MAX_TOKEN bytes never), and advancing by an allowed
 * token must give the state its bytes give.  Any crash, leak, overrun or UB is a
 * bug, as is a broken invariant (abort).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/json_grammar.h"
#include "text/json_vocab.h"

#define MAX_TOKENS 64

static void check_mask(const ddt_json_vocab *v, const uint8_t *const *tb, const size_t *tl, int32_t n,
                       const ddt_json_state *s) {
    uint8_t allow[MAX_TOKENS + 1];
    const int32_t stop = n; /* the id after the tokens: no bytes */
    int32_t count = ddt_json_vocab_mask(v, s, &stop, 1, allow), want_count = 0;
    const bool complete = ddt_json_complete(s);
    for (int32_t i = 0; i <= n; i++) {
        ddt_json_state t = *s;
        const bool steps = i < n && tl[i] > 0 && ddt_json_feed(&t, tb[i], tl[i]);
        const bool want = complete ? i == stop : steps && tl[i] <= DDT_JSON_VOCAB_MAX_TOKEN;
        if (want != (allow[i] != 0)) abort();
        want_count += want;
        ddt_json_state u = *s;
        if (ddt_json_vocab_advance(v, &u, i) != steps) abort();
        if (steps && memcmp(&t, &u, sizeof t)) abort();
    }
    if (count != want_count) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 60000) return 0;
    const bool object_only = data[0] & 1;
    const uint8_t *doc = data + 1;
    const uint8_t *nul = memchr(doc, 0, size - 1);
    size_t doc_len = nul ? (size_t)(nul - doc) : size - 1;
    /* the vocabulary after the NUL: '\n'-separated tokens, and one stop id without bytes */
    const uint8_t *tb[MAX_TOKENS + 1];
    size_t tl[MAX_TOKENS + 1];
    int32_t n = 0;
    if (nul) {
        const uint8_t *p = nul + 1, *end = data + size;
        while (p < end && n < MAX_TOKENS) {
            const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
            const uint8_t *stop = nl ? nl : end;
            tb[n] = p;
            tl[n] = (size_t)(stop - p);
            n++;
            p = nl ? nl + 1 : end;
        }
    }
    tb[n] = NULL;
    tl[n] = 0;
    ddt_json_vocab *v = NULL;
    ddt_error err;
    if (ddt_json_vocab_create_bytes(tb, tl, n + 1, &v, &err) != DDT_OK) abort();

    ddt_json_state s;
    ddt_json_init(&s, object_only);
    check_mask(v, tb, tl, n, &s);
    for (size_t i = 0; i < doc_len; i++) {
        ddt_json_state before = s;
        if (!ddt_json_step(&s, doc[i])) {
            if (memcmp(&s, &before, sizeof s)) abort();
            continue;
        }
        if (s.depth > DDT_JSON_MAX_DEPTH || s.ws > DDT_JSON_MAX_WS) abort();
        if (i % 16 == 15 || i + 1 == doc_len) check_mask(v, tb, tl, n, &s);
    }
    ddt_json_vocab_free(v);
    return 0;
}
