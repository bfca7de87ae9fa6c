/*
 * utf8.c — see utf8.h.
 */
#include "text/utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The sequence length a lead byte announces, 0 for a continuation or invalid lead. */
static size_t lead_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 0;
}

size_t ddt_utf8_seq(const unsigned char *s, size_t n) {
    if (n == 0) return 0;
    size_t len = lead_len(s[0]);
    if (!len || len > n) return 0;
    if (len == 1) return 1;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    uint32_t cp = s[0] & (0x7Fu >> len);
    for (size_t i = 1; i < len; i++) cp = (cp << 6) | (s[i] & 0x3Fu);
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

bool ddt_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t l = ddt_utf8_seq(u + i, n - i);
        if (!l) return false;
        i += l;
    }
    return true;
}

size_t ddt_utf8_complete_len(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    /* the last lead byte within 3 bytes of the end decides */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = u[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation: look further back */
        size_t want = lead_len(c);
        /* a lead whose sequence is not finished yet, with only continuations after it */
        if (want > back) return n - back;
        return n;
    }
    return n;
}

char *ddt_utf8_sanitize(const char *s, size_t n, size_t *out_len) {
    if (n > (SIZE_MAX - 1) / 3) return NULL;
    char *buf = malloc(n * 3 + 1);
    if (!buf) return NULL;
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t l = ddt_utf8_seq(u + i, n - i);
        if (l) {
            memcpy(buf + o, s + i, l);
            o += l;
            i += l;
        } else {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    buf[o] = '\0';
    if (out_len) *out_len = o;
    return buf;
}

json_t *ddt_utf8_json_string(const char *s, size_t n) {
    size_t len;
    char *clean = ddt_utf8_sanitize(s, n, &len);
    json_t *j = clean ? json_stringn(clean, len) : NULL;
    free(clean);
    return j;
}
