/*
 * textstream.c — see textstream.h.
 */
#include "server/textstream.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/utf8.h"

ddt_status ddt_textstream_init(ddt_textstream *ts, const char *const *stop, const size_t *stop_len, int n_stop,
                               ddt_error *err) {
    memset(ts, 0, sizeof *ts);
    if (n_stop < 0 || n_stop > DDT_TEXTSTREAM_MAX_STOP || (n_stop && (!stop || !stop_len)))
        return ddt_fail(err, DDT_ERR_INVALID, "textstream: bad stop list (%d strings)", n_stop);
    for (int i = 0; i < n_stop; i++) {
        if (!stop[i] || stop_len[i] == 0) {
            ddt_textstream_free(ts);
            return ddt_fail(err, DDT_ERR_INVALID, "textstream: stop string %d is empty", i);
        }
        ts->stop[i] = malloc(stop_len[i]);
        if (!ts->stop[i]) {
            ddt_textstream_free(ts);
            return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
        }
        memcpy(ts->stop[i], stop[i], stop_len[i]);
        ts->stop_len[i] = stop_len[i];
        ts->n_stop = i + 1;
        if (stop_len[i] > ts->max_stop) ts->max_stop = stop_len[i];
    }
    return DDT_OK;
}

void ddt_textstream_free(ddt_textstream *ts) {
    if (!ts) return;
    for (int i = 0; i < ts->n_stop; i++) free(ts->stop[i]);
    free(ts->buf);
    memset(ts, 0, sizeof *ts);
}

/* The first position >= from where a stop string starts in buf, or len. */
static size_t find_stop(const ddt_textstream *ts, size_t from) {
    size_t best = ts->len;
    for (int s = 0; s < ts->n_stop; s++) {
        size_t L = ts->stop_len[s];
        for (size_t p = from; p + L <= ts->len && p < best; p++)
            if (!memcmp(ts->buf + p, ts->stop[s], L)) {
                best = p;
                break;
            }
    }
    return best;
}

ddt_status ddt_textstream_push(ddt_textstream *ts, const uint8_t *bytes, size_t n, ddt_error *err) {
    if (ts->stopped || n == 0) return DDT_OK;
    if (ts->len + n + 1 > ts->cap) {
        size_t cap = ts->cap ? ts->cap : 256;
        while (cap < ts->len + n + 1) cap *= 2;
        char *b = realloc(ts->buf, cap);
        if (!b) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the response text");
        ts->buf = b;
        ts->cap = cap;
    }
    size_t old = ts->len;
    memcpy(ts->buf + ts->len, bytes, n);
    ts->len += n;
    if (ts->n_stop) {
        /* a new match must end in the new bytes; earlier text held none */
        size_t from = old >= ts->max_stop ? old - ts->max_stop + 1 : 0;
        size_t at = find_stop(ts, from);
        if (at < ts->len) {
            ts->len = at;
            ts->stopped = true;
        }
    }
    return DDT_OK;
}

/* The longest suffix of buf[0..len) that is a proper prefix of a stop string. */
static size_t stop_prefix_tail(const ddt_textstream *ts) {
    size_t best = 0;
    for (int s = 0; s < ts->n_stop; s++) {
        size_t L = ts->stop_len[s];
        for (size_t k = L - 1; k > best; k--)
            if (k <= ts->len && !memcmp(ts->buf + ts->len - k, ts->stop[s], k)) {
                best = k;
                break;
            }
    }
    return best;
}

ddt_status ddt_textstream_take(ddt_textstream *ts, bool final, char **out, size_t *out_len, ddt_error *err) {
    *out = NULL;
    *out_len = 0;
    size_t end = ts->len;
    if (!final && !ts->stopped) {
        end -= stop_prefix_tail(ts);
        end = ddt_utf8_complete_len(ts->buf, end);
    }
    if (end <= ts->sent) return DDT_OK;
    char *s = ddt_utf8_sanitize(ts->buf + ts->sent, end - ts->sent, out_len);
    if (!s) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for a response delta");
    ts->sent = end;
    *out = s;
    return DDT_OK;
}
