/*
 * utf8.h — UTF-8 checks shared by the command line and the server: JSON
 * strings must be valid UTF-8, but a model may emit any bytes, and a streamed
 * character may arrive split across tokens.
 */
#ifndef DDT_TEXT_UTF8_H
#define DDT_TEXT_UTF8_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* Length (1..4) of the valid UTF-8 sequence starting at s[0..n), 0 when the
 * bytes there are invalid or the sequence is cut off by n. */
size_t ddt_utf8_seq(const unsigned char *s, size_t n);

/* Whether s[0..n) is entirely valid UTF-8 (no overlongs, no surrogates). */
bool ddt_utf8_valid(const char *s, size_t n);

/* How much of s[0..n) can be sent now: all of it but a trailing partial
 * sequence that later bytes could still complete (at most 3 bytes held back). */
size_t ddt_utf8_complete_len(const char *s, size_t n);

/* s[0..n) with every invalid byte replaced by U+FFFD, NUL-terminated, in a
 * malloc'd buffer (*out_len bytes without the NUL); NULL when out of memory. */
char *ddt_utf8_sanitize(const char *s, size_t n, size_t *out_len);

/* A JSON string of s[0..n), sanitised as above (a model's bytes need not be
 * UTF-8, which Jansson refuses); NULL when out of memory. */
json_t *ddt_utf8_json_string(const char *s, size_t n);

#endif
