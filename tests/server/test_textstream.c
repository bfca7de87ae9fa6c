/*
 * test_textstream.c — streamed text: a UTF-8 character split across tokens is
 * held back until complete; bytes that can never be valid become U+FFFD; text
 * that could begin a stop string is held back, and the text ends just before
 * a stop string, also one split across tokens; the deltas joined always equal
 * the whole text taken at once.  Also the UTF-8 helpers themselves.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "server/textstream.h"
#include "text/utf8.h"

/* Push pieces one by one, taking a delta after each; returns the joined deltas. */
static char *stream(const char *const *pieces, size_t n, const char *stop, char deltas[][64], size_t *n_deltas,
                    bool *stopped) {
    ddt_textstream ts;
    ddt_error err = {0};
    size_t sl = stop ? strlen(stop) : 0;
    assert_int_equal(ddt_textstream_init(&ts, stop ? &stop : NULL, stop ? &sl : NULL, stop ? 1 : 0, &err), DDT_OK);
    static char joined[1024];
    joined[0] = '\0';
    size_t k = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n) assert_int_equal(ddt_textstream_push(&ts, (const uint8_t *)pieces[i], strlen(pieces[i]), &err), DDT_OK);
        char *d;
        size_t dl;
        assert_int_equal(ddt_textstream_take(&ts, i == n, &d, &dl, &err), DDT_OK);
        if (deltas) snprintf(deltas[i], 64, "%s", d ? d : "");
        if (d) {
            assert_true(ddt_utf8_valid(d, dl));
            strcat(joined, d);
            k++;
        }
        free(d);
    }
    *n_deltas = k;
    *stopped = ts.stopped;
    ddt_textstream_free(&ts);
    return joined;
}

static void test_split_character_held_back(void **state) {
    (void)state;
    /* "é" = C3 A9 and "€" = E2 82 AC, each split over two tokens */
    const char *pieces[] = {"a\xC3", "\xA9\x62\xE2\x82", "\xAC"}; /* \x62 = 'b' */
    char d[4][64];
    size_t n;
    bool stopped;
    char *all = stream(pieces, 3, NULL, d, &n, &stopped);
    assert_string_equal(d[0], "a");
    assert_string_equal(d[1], "\xC3\xA9" "b");
    assert_string_equal(d[2], "\xE2\x82\xAC");
    assert_string_equal(all, "a\xC3\xA9" "b\xE2\x82\xAC");
    assert_false(stopped);
}

static void test_invalid_bytes_replaced(void **state) {
    (void)state;
    const char *pieces[] = {"x\xFF", "y\xC3", "z", "\xE2\x82"}; /* a lone FF, a lead cut by z, a final cut */
    size_t n;
    bool stopped;
    char *all = stream(pieces, 4, NULL, NULL, &n, &stopped);
    assert_string_equal(all, "x\xEF\xBF\xBDy\xEF\xBF\xBDz\xEF\xBF\xBD\xEF\xBF\xBD");
    size_t len;
    char *whole = ddt_utf8_sanitize("x\xFFy\xC3z\xE2\x82", 8, &len);
    assert_string_equal(whole, all); /* the deltas joined == the whole text at once */
    free(whole);
}

static void test_stop_string_split_across_tokens(void **state) {
    (void)state;
    const char *pieces[] = {"hello wor", "ld\nEN", "D more", "never"};
    char d[5][64];
    size_t n;
    bool stopped;
    char *all = stream(pieces, 4, "\nEND", d, &n, &stopped);
    assert_string_equal(d[0], "hello wor");
    assert_string_equal(d[1], "ld"); /* "\nEN" could begin the stop string: held */
    assert_string_equal(all, "hello world");
    assert_true(stopped);
}

static void test_held_prefix_released(void **state) {
    (void)state;
    const char *pieces[] = {"a\nE", "X"};
    char d[3][64];
    size_t n;
    bool stopped;
    char *all = stream(pieces, 2, "\nEND", d, &n, &stopped);
    assert_string_equal(d[0], "a");
    assert_string_equal(d[1], "\nEX"); /* no longer a prefix: sent */
    assert_string_equal(all, "a\nEX");
    assert_false(stopped);
}

static void test_stop_at_start_and_bad_init(void **state) {
    (void)state;
    const char *pieces[] = {"STOP", "x"};
    size_t n;
    bool stopped;
    char *all = stream(pieces, 2, "STOP", NULL, &n, &stopped);
    assert_string_equal(all, "");
    assert_int_equal(n, 0);
    assert_true(stopped);
    ddt_textstream ts;
    ddt_error err = {0};
    const char *empty = "";
    size_t zero = 0;
    assert_int_equal(ddt_textstream_init(&ts, &empty, &zero, 1, &err), DDT_ERR_INVALID);
    assert_int_equal(ddt_textstream_init(&ts, NULL, NULL, 9, &err), DDT_ERR_INVALID);
}

static void test_utf8_helpers(void **state) {
    (void)state;
    assert_true(ddt_utf8_valid("a\xC3\xA9\xF0\x9F\x98\x80", 7));
    assert_false(ddt_utf8_valid("\xC0\x80", 2));         /* overlong NUL */
    assert_false(ddt_utf8_valid("\xED\xA0\x80", 3));     /* surrogate */
    assert_false(ddt_utf8_valid("\xF4\x90\x80\x80", 4)); /* above U+10FFFF */
    assert_int_equal(ddt_utf8_complete_len("ab\xF0\x9F\x98", 5), 2);
    assert_int_equal(ddt_utf8_complete_len("ab\xF0\x9F\x98\x80", 6), 6);
    assert_int_equal(ddt_utf8_complete_len("ab\xFF", 3), 3); /* never valid: not held */
    assert_int_equal(ddt_utf8_complete_len("", 0), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_character_held_back),
        cmocka_unit_test(test_invalid_bytes_replaced),
        cmocka_unit_test(test_stop_string_split_across_tokens),
        cmocka_unit_test(test_held_prefix_released),
        cmocka_unit_test(test_stop_at_start_and_bad_init),
        cmocka_unit_test(test_utf8_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
