/*
 * fuzz_json_schema.c — libFuzzer target for response_format json_schema's
 * compiler (text/json_schema.h) and the recogniser stepping with a schema
 * (text/json_grammar.h).  Input: schema JSON text up to the first NUL, then
 * document bytes.  A schema Jansson parses is compiled (accepted or refused
 * with a message, never a crash); a compiled one is copied, and the document is
 * fed byte by byte from ddt_json_init_schema: a refused byte must leave the
 * state as it was and is skipped, the depth must stay within the schema's
 * limit, no state reached may be a dead end (some byte steps, or the document
 * is complete: the heights of json_schema.c promise it, through optional
 * properties, anyOf and $ref recursion), and a document the schema state calls
 * complete must be a JSON object
 * Jansson parses (or one Jansson refuses only for a number past its range: an
 * integer past 64 bits, a real past a double, which JSON itself allows; or a
 * lone surrogate escape, which json_grammar.h accepts as RFC 8259's grammar
 * does).  Any crash, leak, overrun or UB is a bug, as is a broken invariant
 * (abort).
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/json_grammar.h"
#include "text/json_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 60000) return 0;
    const uint8_t *nul = memchr(data, 0, size);
    const size_t schema_len = nul ? (size_t)(nul - data) : size;
    json_error_t je;
    json_t *j = json_loadb((const char *)data, schema_len, JSON_REJECT_DUPLICATES, &je);
    if (!j) return 0;
    ddt_json_schema *sc = NULL;
    ddt_error err = {0};
    ddt_status st = ddt_json_schema_compile(j, &sc, &err);
    json_decref(j);
    if (st != DDT_OK) {
        if (sc || err.msg[0] == '\0') abort(); /* a refusal says why and leaves nothing */
        return 0;
    }
    ddt_json_schema *copy = NULL;
    if (ddt_json_schema_copy(sc, &copy, &err) != DDT_OK) abort();
    if (copy->n_nodes != sc->n_nodes || memcmp(copy->nodes, sc->nodes, (size_t)sc->n_nodes * sizeof *sc->nodes))
        abort();
    ddt_json_schema_free(copy);
    if (nul) {
        const uint8_t *doc = nul + 1;
        const size_t doc_len = size - schema_len - 1;
        uint8_t *kept = malloc(doc_len ? doc_len : 1);
        size_t n_kept = 0;
        if (!kept) abort();
        ddt_json_state s;
        ddt_json_init_schema(&s, sc);
        for (size_t i = 0; i < doc_len; i++) {
            ddt_json_state before = s;
            if (!ddt_json_step(&s, doc[i])) {
                if (memcmp(&s, &before, sizeof s)) abort();
                continue;
            }
            kept[n_kept++] = doc[i];
            if (s.depth > DDT_JSON_SCHEMA_MAX_DEPTH || s.ws > DDT_JSON_MAX_WS) abort();
            if (!ddt_json_complete(&s)) {
                bool live = false;
                for (int c = 0; c < 256 && !live; c++) {
                    ddt_json_state t = s;
                    live = ddt_json_step(&t, (uint8_t)c);
                }
                if (!live) abort();
            }
        }
        if (ddt_json_complete(&s)) {
            json_t *d = json_loadb((const char *)kept, n_kept, JSON_ALLOW_NUL, &je);
            if (d ? !json_is_object(d)
                  : !strstr(je.text, "overflow") && !strstr(je.text, "too big") && !strstr(je.text, "invalid Unicode"))
                abort();
            json_decref(d);
        }
        free(kept);
    }
    ddt_json_schema_free(sc);
    return 0;
}
