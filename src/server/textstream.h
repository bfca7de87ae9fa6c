/*
 * textstream.h — turns a generation's token bytes into the text a client
 * receives, for streamed deltas and whole responses alike:
 *   - stop strings: the text ends just before the first stop string found
 *     (which is not sent), so text that could still begin one is held back;
 *   - UTF-8: a character split across tokens is sent only once complete, and
 *     bytes that can never be valid become U+FFFD, so every delta is valid JSON
 *     text and the deltas joined equal the whole response.
 * One writer (the engine's callback) and one reader, under the caller's lock.
 */
#ifndef DDT_SERVER_TEXTSTREAM_H
#define DDT_SERVER_TEXTSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddtree.h"

#define DDT_TEXTSTREAM_MAX_STOP 4

typedef struct ddt_textstream {
    char *buf;      /* the decoded text so far (raw bytes), [len] of [cap] */
    size_t len, cap;
    size_t sent;    /* bytes of buf already handed out */
    char *stop[DDT_TEXTSTREAM_MAX_STOP]; /* owned copies */
    size_t stop_len[DDT_TEXTSTREAM_MAX_STOP];
    int n_stop;
    size_t max_stop;
    bool stopped;   /* a stop string matched: buf ends before it, nothing more is taken */
} ddt_textstream;

/* Copies the stop strings (at most DDT_TEXTSTREAM_MAX_STOP, none empty). */
ddt_status ddt_textstream_init(ddt_textstream *ts, const char *const *stop, const size_t *stop_len, int n_stop,
                               ddt_error *err);
void ddt_textstream_free(ddt_textstream *ts);

/* Append a token's bytes; after a stop string matched, ignored.  Returns
 * DDT_ERR_NOMEM when the text cannot grow. */
ddt_status ddt_textstream_push(ddt_textstream *ts, const uint8_t *bytes, size_t n, ddt_error *err);

/*
 * The next delta: text that can no longer change (final: everything left),
 * as a malloc'd, NUL-terminated, valid UTF-8 string (*out_len bytes), and
 * marks it sent.  *out is NULL with *out_len 0 when nothing is ready; returns
 * DDT_ERR_NOMEM when the copy fails.
 */
ddt_status ddt_textstream_take(ddt_textstream *ts, bool final, char **out, size_t *out_len, ddt_error *err);

#endif
