/*
 * test_draft_calibration.c — the draft calibration file (src/io/draft_calibration.c):
 * a file written by ddt_calibration_save reads back to the same weights bit for
 * bit; the shipped drafter's file parses; every malformed file (not JSON, another
 * format or version, a temperature other than 0, weights of the wrong shape, a
 * non-number, a weight out of range, w1 <= 0) is refused with a message that
 * names the file and the field; a missing file names its path.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "io/draft_calibration.h"

static void test_round_trip(void **state) {
    (void)state;
    ddt_draft_calibration c, back;
    ddt_cal_identity(&c);
    c.lookup = 1;
    for (int m = 0; m < DDT_CAL_LOOKUP_LENS; m++) c.lookup_first[m] = 0.3f + 0.0912345f * (float)m;
    c.lookup_next = 0.9312345f;
    for (int b = 0; b < DDT_CAL_BUCKETS; b++) {
        c.w[b][0] = 0.1234567f * (float)(b + 1) - 0.3f;
        c.w[b][1] = 1.0f / (float)(b + 3) + 0.5f;
        c.w[b][2] = -0.7654321f / (float)(b + 1);
    }
    char path[] = "/tmp/ddt_cal_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    ddt_cal_fit_info info;
    memset(&info, 0, sizeof info);
    info.cells[0] = 123;
    info.identity[4] = true;
    ddt_error err = {0};
    assert_int_equal(ddt_calibration_save(path, &c, &info, "a note", &err), DDT_OK);
    assert_int_equal(ddt_calibration_load(path, &back, &err), DDT_OK);
    assert_memory_equal(&c, &back, sizeof c);
    /* and without a lookup rating: none read back */
    c.lookup = 0;
    for (int m = 0; m < DDT_CAL_LOOKUP_LENS; m++) c.lookup_first[m] = 0.0f;
    c.lookup_next = 0.0f;
    assert_int_equal(ddt_calibration_save(path, &c, NULL, NULL, &err), DDT_OK);
    assert_int_equal(ddt_calibration_load(path, &back, &err), DDT_OK);
    assert_memory_equal(&c, &back, sizeof c);
    unlink(path);
    /* a bad calibration is not written */
    c.w[1][1] = -1.0f;
    assert_int_equal(ddt_calibration_save(path, &c, NULL, NULL, &err), DDT_ERR_RANGE);
    assert_int_equal(access(path, F_OK), -1);
}

static void test_shipped(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/models/pystdlib-dflash/%s", DDT_SOURCE_DIR, DDT_CALIBRATION_FILE);
    ddt_draft_calibration c;
    ddt_error err = {0};
    if (ddt_calibration_load(path, &c, &err) != DDT_OK) fail_msg("%s", err.msg);
    /* what the fit found on the shipped pair: the rank-0 token is worth more than its q */
    assert_true(c.w[0][0] > 0.0f);
}

static void expect_error(const char *text, ddt_status want, const char *needle) {
    ddt_draft_calibration c;
    ddt_error err = {0};
    ddt_status st = ddt_calibration_parse(text, strlen(text), "cal.json", &c, &err);
    if (st != want) fail_msg("'%s': status %d, want %d (%s)", text, (int)st, (int)want, err.msg);
    if (!strstr(err.msg, needle)) fail_msg("'%s': message '%s' lacks '%s'", text, err.msg, needle);
    if (!strstr(err.msg, "cal.json")) fail_msg("'%s': message '%s' does not name the file", text, err.msg);
}

#define HEAD "{\"format\": \"ddtree-draft-calibration\", \"version\": 1, \"temperature\": 0, "
#define W5 "[[0,1,0],[0,1,0],[0,1,0],[0,1,0],[0,1,0]]"

static void test_parse_errors(void **state) {
    (void)state;
    ddt_draft_calibration c;
    ddt_error err = {0};
    const char *ok = HEAD "\"weights\": " W5 ", \"fit\": {\"anything\": [1, 2]}, \"extra\": null}";
    assert_int_equal(ddt_calibration_parse(ok, strlen(ok), "cal.json", &c, &err), DDT_OK);
    assert_true(c.w[3][1] == 1.0f && c.w[3][0] == 0.0f);
    expect_error("{", DDT_ERR_FORMAT, "not valid JSON");
    expect_error("[1]", DDT_ERR_FORMAT, "not a JSON object");
    expect_error("{\"format\": \"other\", \"version\": 1, \"temperature\": 0, \"weights\": " W5 "}", DDT_ERR_FORMAT,
                 "field format");
    expect_error("{\"version\": 1}", DDT_ERR_FORMAT, "field format");
    expect_error("{\"format\": \"ddtree-draft-calibration\", \"version\": 2, \"temperature\": 0, \"weights\": " W5 "}",
                 DDT_ERR_UNSUPPORTED, "field version");
    expect_error("{\"format\": \"ddtree-draft-calibration\", \"version\": 1.0, \"temperature\": 0}", DDT_ERR_UNSUPPORTED,
                 "field version");
    expect_error("{\"format\": \"ddtree-draft-calibration\", \"version\": 1, \"temperature\": 1, \"weights\": " W5 "}",
                 DDT_ERR_UNSUPPORTED, "field temperature");
    expect_error("{\"format\": \"ddtree-draft-calibration\", \"version\": 1, \"weights\": " W5 "}", DDT_ERR_UNSUPPORTED,
                 "field temperature");
    expect_error(HEAD "\"weights\": [[0,1,0],[0,1,0]]}", DDT_ERR_FORMAT, "field weights");
    expect_error(HEAD "\"weights\": {}}", DDT_ERR_FORMAT, "field weights");
    expect_error(HEAD "\"w\": 1}", DDT_ERR_FORMAT, "field weights");
    expect_error(HEAD "\"weights\": [[0,1,0],[0,1],[0,1,0],[0,1,0],[0,1,0]]}", DDT_ERR_FORMAT, "weights[1]");
    expect_error(HEAD "\"weights\": [[0,1,0],[0,1,0],[0,\"1\",0],[0,1,0],[0,1,0]]}", DDT_ERR_FORMAT,
                 "weights[2][1] is not a number");
    expect_error(HEAD "\"weights\": [[0,1,0],[0,1,0],[0,1,0],[0,1,1e300],[0,1,0]]}", DDT_ERR_RANGE, "weights[3][2]");
    expect_error(HEAD "\"weights\": [[0,1,0],[0,1,0],[0,1,0],[0,1,0],[0,-0.5,0]]}", DDT_ERR_RANGE,
                 "bucket 4 (ranks 8+) weight 1");
    expect_error(HEAD "\"weights\": [[0,0,0],[0,1,0],[0,1,0],[0,1,0],[0,1,0]]}", DDT_ERR_RANGE, "must be > 0");
    expect_error("{\"format\": \"ddtree-draft-calibration\", \"format\": \"x\"}", DDT_ERR_FORMAT, "not valid JSON");
    /* the lookup rating */
    const char *lk = HEAD "\"weights\": " W5 ", \"lookup\": {\"first\": [0.5,0.6,0.7,0.7,0.8,0.9,0.95], \"next\": 0.9}}";
    assert_int_equal(ddt_calibration_parse(lk, strlen(lk), "cal.json", &c, &err), DDT_OK);
    assert_true(c.lookup == 1 && c.lookup_first[6] == 0.95f && c.lookup_next == 0.9f);
    expect_error(HEAD "\"weights\": " W5 ", \"lookup\": {\"first\": [0.5], \"next\": 0.9}}", DDT_ERR_FORMAT,
                 "field lookup");
    expect_error(HEAD "\"weights\": " W5 ", \"lookup\": [1]}", DDT_ERR_FORMAT, "field lookup");
    expect_error(HEAD "\"weights\": " W5 ", \"lookup\": {\"first\": [0.5,0.6,0.7,0.7,0.8,0.9,0.95]}}",
                 DDT_ERR_FORMAT, "field lookup");
    expect_error(HEAD "\"weights\": " W5 ", \"lookup\": {\"first\": [0.5,0.6,0.7,\"a\",0.8,0.9,0.95], "
                 "\"next\": 0.9}}", DDT_ERR_FORMAT, "lookup.first[3]");
    expect_error(HEAD "\"weights\": " W5 ", \"lookup\": {\"first\": [0.5,0.6,0.7,0.7,0.8,0.9,0], "
                 "\"next\": 0.9}}", DDT_ERR_RANGE, "match of 8 tokens");
    expect_error(HEAD "\"weights\": " W5 ", \"lookup\": {\"first\": [0.5,0.6,0.7,0.7,0.8,0.9,0.9], "
                 "\"next\": 1.5}}", DDT_ERR_RANGE, "next-token chance");
    /* a missing file names its path */
    assert_int_equal(ddt_calibration_load("/nonexistent/cal.json", &c, &err), DDT_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/cal.json"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_shipped),
        cmocka_unit_test(test_parse_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
