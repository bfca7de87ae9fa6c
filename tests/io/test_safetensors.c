/*
 * test_safetensors.c — the safetensors parser against files written here: values
 * of every dtype read back, and one test per kind of damage, each checking the
 * status and that the message names the file and the tensor; plus exhaustive
 * checks of the bf16 / f16 / fp8-e4m3 conversions against ldexp-based formulas.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"

static char g_dir[256];

static int setup_dir(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/ddt_test_st_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown_dir(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_in_dir(const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", g_dir, name);
}

/* ---- a tiny safetensors writer ------------------------------------------- */

typedef struct tw_tensor {
    const char *name;
    const char *dtype;
    int ndim;
    int64_t shape[8];
    const void *data;
    size_t nbytes;
} tw_tensor;

/* Write a file whose header is `header` (padded with spaces to 8 bytes, as writers
 * do) followed by `data`. Returns the header length written. */
static uint64_t write_raw(const char *path, const char *header, const void *data, size_t nbytes) {
    size_t hlen = strlen(header);
    size_t padded = (hlen + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, hlen, f), hlen);
    for (size_t i = hlen; i < padded; i++) fputc(' ', f);
    if (nbytes) assert_int_equal(fwrite(data, 1, nbytes, f), nbytes);
    fclose(f);
    return padded;
}

/* Write a valid file: tensors laid out in order, each aligned to 8 bytes. */
static void write_st(const char *path, const tw_tensor *ts, int n) {
    char header[8192];
    size_t used = 0, off = 0;
    uint8_t *data = calloc(1, 1 << 16);
    assert_non_null(data);
    used += (size_t)snprintf(header + used, sizeof header - used, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        off = (off + 7) / 8 * 8;
        used += (size_t)snprintf(header + used, sizeof header - used, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                 ts[i].name, ts[i].dtype);
        for (int d = 0; d < ts[i].ndim; d++)
            used += (size_t)snprintf(header + used, sizeof header - used, "%s%lld", d ? "," : "",
                                     (long long)ts[i].shape[d]);
        used += (size_t)snprintf(header + used, sizeof header - used, "],\"data_offsets\":[%zu,%zu]}",
                                 off, off + ts[i].nbytes);
        assert_true(off + ts[i].nbytes <= (1 << 16));
        if (ts[i].nbytes) memcpy(data + off, ts[i].data, ts[i].nbytes);
        off += ts[i].nbytes;
    }
    used += (size_t)snprintf(header + used, sizeof header - used, "}");
    assert_true(used < sizeof header);
    write_raw(path, header, data, off);
    free(data);
}

/* Open `name` in the temp dir and expect failure `want` whose message holds the
 * file path and every extra substring given (NULL-terminated). */
static void expect_open_fails(const char *name, ddt_status want, ...) {
    char path[512];
    path_in_dir(name, path, sizeof path);
    ddt_checkpoint *ck = (ddt_checkpoint *)0x1;
    ddt_error err = {0};
    ddt_status st = ddt_checkpoint_open(path, &ck, &err);
    if (st != want) fprintf(stderr, "status %d, message: %s\n", (int)st, err.msg);
    assert_int_equal(st, want);
    assert_null(ck);
    assert_int_equal(err.status, want);
    if (!strstr(err.msg, path)) fprintf(stderr, "message lacks the file: %s\n", err.msg);
    assert_non_null(strstr(err.msg, path));
    va_list ap;
    va_start(ap, want);
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *)) {
        if (!strstr(err.msg, s)) fprintf(stderr, "message lacks \"%s\": %s\n", s, err.msg);
        assert_non_null(strstr(err.msg, s));
    }
    va_end(ap);
}

/* ---- reading back ---------------------------------------------------------- */

static void test_every_dtype_reads_back(void **state) {
    (void)state;
    float f32[3] = {1.5f, -2.25f, 3.0e-3f};
    uint16_t bf16[4] = {0x3F80, 0xC000, 0x7F80, 0x0001};
    uint16_t f16[2] = {0x3C00, 0xFBFF};
    uint8_t f8[5] = {0x38, 0xB8, 0x7E, 0x01, 0x7F};
    int64_t i64[2] = {INT64_MIN, 1234567890123LL};
    int32_t i32[3] = {-7, 0, 2147483647};
    int16_t i16[2] = {-32768, 12345};
    int8_t i8[3] = {-128, 0, 127};
    uint8_t u8[2] = {0, 255};
    uint8_t bools[4] = {1, 0, 0, 1};
    double f64[2] = {3.141592653589793, -1e300};
    tw_tensor ts[] = {
        {"z.f32", "F32", 1, {3}, f32, sizeof f32},
        {"a.bf16", "BF16", 2, {2, 2}, bf16, sizeof bf16},
        {"b.f16", "F16", 1, {2}, f16, sizeof f16},
        {"c.f8", "F8_E4M3", 1, {5}, f8, sizeof f8},
        {"d.i64", "I64", 1, {2}, i64, sizeof i64},
        {"e.i32", "I32", 2, {3, 1}, i32, sizeof i32},
        {"f.i16", "I16", 1, {2}, i16, sizeof i16},
        {"g.i8", "I8", 1, {3}, i8, sizeof i8},
        {"h.u8", "U8", 1, {2}, u8, sizeof u8},
        {"i.bool", "BOOL", 2, {2, 2}, bools, sizeof bools},
        {"j.f64", "F64", 1, {2}, f64, sizeof f64},
        {"k.scalar", "F32", 0, {0}, f32, 4},
        {"l.empty", "BF16", 2, {0, 5}, NULL, 0},
    };
    const int n = (int)(sizeof ts / sizeof ts[0]);
    const ddt_dtype want_dt[] = {DDT_DTYPE_F32, DDT_DTYPE_BF16, DDT_DTYPE_F16, DDT_DTYPE_F8_E4M3,
                                 DDT_DTYPE_I64, DDT_DTYPE_I32,  DDT_DTYPE_I16, DDT_DTYPE_I8,
                                 DDT_DTYPE_U8,  DDT_DTYPE_BOOL, DDT_DTYPE_F64, DDT_DTYPE_F32,
                                 DDT_DTYPE_BF16};
    char path[512];
    path_in_dir("all.safetensors", path, sizeof path);
    write_st(path, ts, n);

    ddt_checkpoint *ck = NULL;
    ddt_error err = {0};
    assert_int_equal(ddt_checkpoint_open(path, &ck, &err), DDT_OK);
    assert_int_equal(ddt_checkpoint_count(ck), n);
    for (int i = 1; i < n; i++)
        assert_true(strcmp(ddt_checkpoint_at(ck, i - 1)->name, ddt_checkpoint_at(ck, i)->name) < 0);
    assert_null(ddt_checkpoint_at(ck, n));
    assert_null(ddt_checkpoint_at(ck, -1));
    for (int i = 0; i < n; i++) {
        const ddt_st_tensor *t = ddt_checkpoint_find(ck, ts[i].name);
        assert_non_null(t);
        assert_string_equal(t->name, ts[i].name);
        assert_int_equal(t->dtype, want_dt[i]);
        assert_string_equal(ddt_dtype_name(t->dtype), ts[i].dtype);
        assert_int_equal(t->ndim, ts[i].ndim);
        int64_t numel = 1;
        for (int d = 0; d < ts[i].ndim; d++) {
            assert_int_equal(t->shape[d], ts[i].shape[d]);
            numel *= ts[i].shape[d];
        }
        assert_int_equal(t->numel, numel);
        assert_int_equal(t->nbytes, ts[i].nbytes);
        assert_int_equal(t->nbytes, (uint64_t)numel * ddt_dtype_size(t->dtype));
        if (ts[i].nbytes) assert_memory_equal(t->data, ts[i].data, ts[i].nbytes);
        assert_int_equal(t->file_index, 0);
        assert_string_equal(ddt_checkpoint_file_name(ck, t->file_index), path);
    }
    /* Typed reads through the mapping, the way a backend uses them. */
    const ddt_st_tensor *t = ddt_checkpoint_find(ck, "d.i64");
    assert_true(((const int64_t *)t->data)[0] == INT64_MIN);
    t = ddt_checkpoint_find(ck, "j.f64");
    assert_true(((const double *)t->data)[1] == -1e300);
    t = ddt_checkpoint_find(ck, "a.bf16");
    assert_true(ddt_bf16_to_f32(((const uint16_t *)t->data)[1]) == -2.0f);
    t = ddt_checkpoint_find(ck, "c.f8");
    assert_true(ddt_fp8_e4m3_to_f32(((const uint8_t *)t->data)[2]) == 448.0f);
    assert_null(ddt_checkpoint_find(ck, "nope"));
    assert_null(ddt_checkpoint_find(ck, "a.bf1"));
    ddt_checkpoint_close(ck);
}

static void test_dtype_table(void **state) {
    (void)state;
    const size_t sizes[DDT_DTYPE_COUNT] = {4, 2, 2, 1, 8, 4, 2, 1, 1, 1, 8};
    for (int i = 0; i < DDT_DTYPE_COUNT; i++) assert_int_equal(ddt_dtype_size((ddt_dtype)i), sizes[i]);
    assert_int_equal(ddt_dtype_size(DDT_DTYPE_COUNT), 0);
    assert_string_equal(ddt_dtype_name(DDT_DTYPE_F8_E4M3), "F8_E4M3");
}

static void test_folder_with_single_file(void **state) {
    (void)state;
    char sub[512], path[600];
    path_in_dir("single_dir", sub, sizeof sub);
    assert_int_equal(mkdir(sub, 0700), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", sub);
    float v[2] = {1, 2};
    tw_tensor ts[] = {{"w", "F32", 1, {2}, v, sizeof v}};
    write_st(path, ts, 1);
    ddt_checkpoint *ck = NULL;
    ddt_error err = {0};
    assert_int_equal(ddt_checkpoint_open(sub, &ck, &err), DDT_OK);
    assert_int_equal(ddt_checkpoint_count(ck), 1);
    assert_string_equal(ddt_checkpoint_file_name(ck, 0), path);
    ddt_checkpoint_close(ck);
    /* A folder with neither file. */
    char empty[512];
    path_in_dir("empty_dir", empty, sizeof empty);
    assert_int_equal(mkdir(empty, 0700), 0);
    assert_int_equal(ddt_checkpoint_open(empty, &ck, &err), DDT_ERR_IO);
    assert_non_null(strstr(err.msg, empty));
    assert_int_equal(ddt_checkpoint_open("/nonexistent/ddt.safetensors", &ck, &err), DDT_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/ddt.safetensors"));
}

/* ---- damage ---------------------------------------------------------------- */

static void test_truncated_file(void **state) {
    (void)state;
    char path[512];
    path_in_dir("trunc.safetensors", path, sizeof path);
    FILE *f = fopen(path, "wb");
    fwrite("\x10\x00\x00", 1, 3, f);
    fclose(f);
    expect_open_fails("trunc.safetensors", DDT_ERR_FORMAT, "truncated", NULL);
    path_in_dir("zero.safetensors", path, sizeof path);
    f = fopen(path, "wb");
    fclose(f);
    expect_open_fails("zero.safetensors", DDT_ERR_FORMAT, "truncated", NULL);

    /* A valid file cut inside its data section: the tensor's range now ends past it. */
    float v[16] = {0};
    tw_tensor ts[] = {{"cut.weight", "F32", 1, {16}, v, sizeof v}};
    path_in_dir("cut.safetensors", path, sizeof path);
    write_st(path, ts, 1);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(truncate(path, sb.st_size - 4), 0);
    expect_open_fails("cut.safetensors", DDT_ERR_FORMAT, "cut.weight", "beyond", NULL);
}

static void test_header_length_beyond_file(void **state) {
    (void)state;
    char path[512];
    path_in_dir("hlen.safetensors", path, sizeof path);
    FILE *f = fopen(path, "wb");
    uint8_t hdr[8] = {0x00, 0x10, 0, 0, 0, 0, 0, 0}; /* 4096 */
    fwrite(hdr, 1, 8, f);
    fwrite("{}", 1, 2, f);
    fclose(f);
    expect_open_fails("hlen.safetensors", DDT_ERR_FORMAT, "header length 4096", NULL);

    /* Every byte of the length set: must not wrap around in the bounds check. */
    path_in_dir("hlen_max.safetensors", path, sizeof path);
    f = fopen(path, "wb");
    uint8_t ff[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    fwrite(ff, 1, 8, f);
    fwrite("{}      ", 1, 8, f);
    fclose(f);
    expect_open_fails("hlen_max.safetensors", DDT_ERR_FORMAT, "beyond the file", NULL);
}

static void test_header_over_cap(void **state) {
    (void)state;
    /* A sparse file just over 100 MB whose header claims all of it. */
    char path[512];
    path_in_dir("huge_header.safetensors", path, sizeof path);
    uint64_t hlen = (uint64_t)100 * 1024 * 1024 + 8;
    FILE *f = fopen(path, "wb");
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(hlen >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite("{", 1, 1, f);
    fclose(f);
    assert_int_equal(truncate(path, (off_t)(hlen + 8)), 0);
    expect_open_fails("huge_header.safetensors", DDT_ERR_FORMAT, "cap", NULL);
}

static void test_header_not_json_or_not_object(void **state) {
    (void)state;
    char path[512];
    path_in_dir("notjson.safetensors", path, sizeof path);
    write_raw(path, "{\"a\": {\"dtype\": \"F32\", ", NULL, 0);
    expect_open_fails("notjson.safetensors", DDT_ERR_FORMAT, "not valid JSON", NULL);
    path_in_dir("array.safetensors", path, sizeof path);
    write_raw(path, "[1, 2, 3]", NULL, 0);
    expect_open_fails("array.safetensors", DDT_ERR_FORMAT, "not a JSON object", NULL);
    path_in_dir("entry.safetensors", path, sizeof path);
    write_raw(path, "{\"t.weight\": 5}", NULL, 0);
    expect_open_fails("entry.safetensors", DDT_ERR_FORMAT, "t.weight", "not an object", NULL);
    path_in_dir("dupkey.safetensors", path, sizeof path);
    write_raw(path,
              "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
              "\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
              "ab", 2);
    expect_open_fails("dupkey.safetensors", DDT_ERR_FORMAT, "duplicate", NULL);
}

static void test_unknown_dtype(void **state) {
    (void)state;
    char path[512];
    path_in_dir("dtype.safetensors", path, sizeof path);
    write_raw(path, "{\"x.weight\":{\"dtype\":\"F7\",\"shape\":[2],\"data_offsets\":[0,2]}}", "ab", 2);
    expect_open_fails("dtype.safetensors", DDT_ERR_FORMAT, "x.weight", "unknown dtype", "F7", NULL);
    path_in_dir("dtype2.safetensors", path, sizeof path);
    write_raw(path, "{\"x.weight\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,2]}}", "ab", 2);
    expect_open_fails("dtype2.safetensors", DDT_ERR_FORMAT, "x.weight", "dtype", NULL);
}

static void test_bad_shapes(void **state) {
    (void)state;
    char path[512];
    path_in_dir("neg.safetensors", path, sizeof path);
    write_raw(path, "{\"neg.w\":{\"dtype\":\"U8\",\"shape\":[-2],\"data_offsets\":[0,2]}}", "ab", 2);
    expect_open_fails("neg.safetensors", DDT_ERR_FORMAT, "neg.w", "shape[0]", NULL);

    path_in_dir("huge.safetensors", path, sizeof path);
    write_raw(path,
              "{\"huge.w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],"
              "\"data_offsets\":[0,0]}}",
              NULL, 0);
    expect_open_fails("huge.safetensors", DDT_ERR_FORMAT, "huge.w", "overflow", NULL);

    /* numel fits in int64 but numel x 8 bytes does not fit in 64 bits. */
    path_in_dir("huge2.safetensors", path, sizeof path);
    write_raw(path,
              "{\"huge2.w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
              "\"data_offsets\":[0,0]}}",
              NULL, 0);
    expect_open_fails("huge2.safetensors", DDT_ERR_FORMAT, "huge2.w", "overflow", NULL);

    path_in_dir("ndim.safetensors", path, sizeof path);
    write_raw(path,
              "{\"deep.w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
              "a", 1);
    expect_open_fails("ndim.safetensors", DDT_ERR_FORMAT, "deep.w", "dimensions", NULL);

    path_in_dir("shape_type.safetensors", path, sizeof path);
    write_raw(path, "{\"st.w\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", "a", 1);
    expect_open_fails("shape_type.safetensors", DDT_ERR_FORMAT, "st.w", "shape[0]", NULL);

    path_in_dir("shape_missing.safetensors", path, sizeof path);
    write_raw(path, "{\"sm.w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", "a", 1);
    expect_open_fails("shape_missing.safetensors", DDT_ERR_FORMAT, "sm.w", "shape", NULL);
}

static void test_bad_offsets(void **state) {
    (void)state;
    char path[512];
    path_in_dir("range.safetensors", path, sizeof path);
    write_raw(path, "{\"r.w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", "abcd", 4);
    expect_open_fails("range.safetensors", DDT_ERR_FORMAT, "r.w", "beyond the data section", NULL);

    path_in_dir("order.safetensors", path, sizeof path);
    write_raw(path, "{\"o.w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,1]}}", "abcd", 4);
    expect_open_fails("order.safetensors", DDT_ERR_FORMAT, "o.w", "< begin", NULL);

    path_in_dir("neg_off.safetensors", path, sizeof path);
    write_raw(path, "{\"no.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", "abcd", 4);
    expect_open_fails("neg_off.safetensors", DDT_ERR_FORMAT, "no.w", "data_offsets", NULL);

    path_in_dir("off_arity.safetensors", path, sizeof path);
    write_raw(path, "{\"oa.w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", "abcd", 4);
    expect_open_fails("off_arity.safetensors", DDT_ERR_FORMAT, "oa.w", "data_offsets", NULL);

    path_in_dir("len.safetensors", path, sizeof path);
    write_raw(path, "{\"l.w\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}", "abcdefgh", 8);
    expect_open_fails("len.safetensors", DDT_ERR_FORMAT, "l.w", "needs 6", NULL);

    path_in_dir("overlap.safetensors", path, sizeof path);
    write_raw(path,
              "{\"a.w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
              "\"b.w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[6,10]},"
              "\"c.w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}",
              "abcdefghij", 10);
    expect_open_fails("overlap.safetensors", DDT_ERR_FORMAT, "c.w", "a.w", "overlap", NULL);

    /* Containment: a later-starting tensor inside a long one. */
    path_in_dir("inside.safetensors", path, sizeof path);
    write_raw(path,
              "{\"long.w\":{\"dtype\":\"U8\",\"shape\":[10],\"data_offsets\":[0,10]},"
              "\"mid.w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
              "\"tail.w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[6,8]}}",
              "abcdefghij", 10);
    expect_open_fails("inside.safetensors", DDT_ERR_FORMAT, "mid.w", "long.w", "overlap", NULL);

    path_in_dir("align.safetensors", path, sizeof path);
    write_raw(path, "{\"al.w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}", "abcdefgh", 8);
    expect_open_fails("align.safetensors", DDT_ERR_FORMAT, "al.w", "aligned", NULL);
}

static void test_empty_tensors_do_not_overlap(void **state) {
    (void)state;
    char path[512];
    path_in_dir("empties.safetensors", path, sizeof path);
    write_raw(path,
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
              "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
              "\"f\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]}}",
              "abcd", 4);
    ddt_checkpoint *ck = NULL;
    ddt_error err = {0};
    assert_int_equal(ddt_checkpoint_open(path, &ck, &err), DDT_OK);
    assert_int_equal(ddt_checkpoint_count(ck), 3);
    assert_int_equal(ddt_checkpoint_find(ck, "e")->numel, 0);
    ddt_checkpoint_close(ck);
}

static void test_parse_in_memory(void **state) {
    (void)state;
    /* The fuzz entry point: same checks on a buffer, file name used in messages.
     * Header padded with spaces to 64 bytes so the data is 8-byte aligned. */
    char hdr[65];
    snprintf(hdr, sizeof hdr, "%-64s", "{\"m\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[0,4]}}");
    uint64_t h = 64;
    _Alignas(8) uint8_t buf[8 + 64 + 4];
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(h >> (8 * i));
    memcpy(buf + 8, hdr, h);
    int16_t vals[2] = {-3, 9};
    memcpy(buf + 8 + h, vals, 4);
    ddt_st_tensor *ts = NULL;
    int32_t n = -1;
    ddt_error err = {0};
    assert_int_equal(ddt_st_parse(buf, sizeof buf, "mem", &ts, &n, &err), DDT_OK);
    assert_int_equal(n, 1);
    assert_string_equal(ts[0].name, "m");
    assert_ptr_equal(ts[0].data, buf + 8 + h);
    assert_int_equal(((const int16_t *)ts[0].data)[1], 9);
    ddt_st_tensors_free(ts, n);

    /* Every prefix of the valid image fails cleanly and leaves no table. */
    for (size_t len = 0; len < sizeof buf; len++) {
        ts = (ddt_st_tensor *)0x1;
        n = -1;
        assert_int_equal(ddt_st_parse(buf, len, "prefix", &ts, &n, &err), DDT_ERR_FORMAT);
        assert_null(ts);
        assert_int_equal(n, 0);
        assert_non_null(strstr(err.msg, "prefix"));
    }

    /* The same header shifted by one byte leaves the I16 data at an odd offset. */
    char odd[66];
    snprintf(odd, sizeof odd, "%-65s", hdr);
    _Alignas(8) uint8_t buf2[8 + 65 + 4];
    h = 65;
    for (int i = 0; i < 8; i++) buf2[i] = (uint8_t)(h >> (8 * i));
    memcpy(buf2 + 8, odd, h);
    memcpy(buf2 + 8 + h, vals, 4);
    assert_int_equal(ddt_st_parse(buf2, sizeof buf2, "odd", &ts, &n, &err), DDT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "odd"));
    assert_non_null(strstr(err.msg, "tensor m"));
    assert_non_null(strstr(err.msg, "aligned"));
}

/* ---- conversions ------------------------------------------------------------- */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Compare bit-exactly, except that any NaN matches any NaN of the same sign. */
static void assert_same_float(float got, double want, unsigned code) {
    if (isnan(want)) {
        if (!isnan(got)) fprintf(stderr, "code 0x%x: got %g, want NaN\n", code, (double)got);
        assert_true(isnan(got));
        return;
    }
    float w = (float)want;
    if (f32_bits(got) != f32_bits(w))
        fprintf(stderr, "code 0x%x: got %a, want %a\n", code, (double)got, (double)w);
    assert_int_equal(f32_bits(got), f32_bits(w));
}

/* Reference decoder for a binary float with `eb` exponent bits and `mb` mantissa
 * bits, written from the definition with ldexp. */
static double ref_decode(unsigned v, int eb, int mb, int bias, int has_inf) {
    int sign = (v >> (eb + mb)) & 1;
    unsigned e = (v >> mb) & ((1u << eb) - 1);
    unsigned m = v & ((1u << mb) - 1);
    double mag;
    if (has_inf && e == (1u << eb) - 1) mag = m ? NAN : INFINITY;
    else if (e == 0) mag = ldexp((double)m, 1 - bias - mb);
    else mag = ldexp((double)((1u << mb) + m), (int)e - bias - mb);
    return sign ? -mag : mag;
}

static void test_bf16_to_f32_exhaustive(void **state) {
    (void)state;
    for (unsigned v = 0; v < 65536; v++)
        assert_same_float(ddt_bf16_to_f32((uint16_t)v), ref_decode(v, 8, 7, 127, 1), v);
}

static void test_f16_to_f32_exhaustive(void **state) {
    (void)state;
    for (unsigned v = 0; v < 65536; v++)
        assert_same_float(ddt_f16_to_f32((uint16_t)v), ref_decode(v, 5, 10, 15, 1), v);
    assert_true(ddt_f16_to_f32(0x7BFF) == 65504.0f);
    assert_true(ddt_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
}

static void test_fp8_e4m3_to_f32_exhaustive(void **state) {
    (void)state;
    for (unsigned v = 0; v < 256; v++) {
        double want = ((v & 0x7F) == 0x7F) ? NAN : ref_decode(v, 4, 3, 7, 0);
        if ((v & 0x7F) == 0x7F) want = NAN;
        assert_same_float(ddt_fp8_e4m3_to_f32((uint8_t)v), want, v);
    }
    assert_true(ddt_fp8_e4m3_to_f32(0x7E) == 448.0f);
    assert_true(ddt_fp8_e4m3_to_f32(0xFE) == -448.0f);
    assert_true(ddt_fp8_e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
    assert_true(ddt_fp8_e4m3_to_f32(0x78) == 256.0f); /* e=15 is a normal exponent, not inf */
    assert_true(isnan(ddt_fp8_e4m3_to_f32(0x7F)) && isnan(ddt_fp8_e4m3_to_f32(0xFF)));
    assert_true(signbit(ddt_fp8_e4m3_to_f32(0x80)) && ddt_fp8_e4m3_to_f32(0x80) == 0.0f);
}

/* Independent round-to-nearest-even to bf16, by comparing distances in double. */
static uint16_t ref_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t lo = (uint16_t)(u >> 16);
    if (isinf(f)) return lo;
    double x = fabs((double)f);
    double lo_v = fabs(ref_decode(lo, 8, 7, 127, 1));
    unsigned hi_mag = (lo & 0x7FFFu) + 1;
    /* The step past the largest finite bf16 lands on 2^128, which bf16 spells inf. */
    double hi_v = hi_mag == 0x7F80u ? ldexp(1.0, 128) : fabs(ref_decode(hi_mag, 8, 7, 127, 1));
    double dl = x - lo_v, dh = hi_v - x;
    if (dl < dh) return lo;
    if (dh < dl) return (uint16_t)((lo & 0x8000u) | hi_mag);
    return (lo & 1u) ? (uint16_t)((lo & 0x8000u) | hi_mag) : lo;
}

static void test_f32_to_bf16_rounding(void **state) {
    (void)state;
    const uint32_t lows[] = {0x0000, 0x0001, 0x3FFF, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF};
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (uint32_t hi = 0; hi < 65536; hi++) {
        for (int k = 0; k < 9; k++) {
            uint32_t low;
            if (k < 8) {
                low = lows[k];
            } else {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                low = (uint32_t)rng & 0xFFFFu;
            }
            uint32_t u = (hi << 16) | low;
            float f;
            memcpy(&f, &u, sizeof f);
            uint16_t got = ddt_f32_to_bf16(f);
            if (isnan(f)) {
                /* NaN stays NaN with its sign, even when only low mantissa bits were set. */
                assert_true(isnan(ddt_bf16_to_f32(got)));
                assert_int_equal(got & 0x8000u, (u >> 16) & 0x8000u);
                continue;
            }
            uint16_t want = ref_to_bf16(f);
            if (got != want) fprintf(stderr, "f32 0x%08x: got 0x%04x want 0x%04x\n", u, got, want);
            assert_int_equal(got, want);
        }
    }
    /* Round trip of every finite bf16 is exact. */
    for (unsigned v = 0; v < 65536; v++) {
        float f = ddt_bf16_to_f32((uint16_t)v);
        if (!isnan(f)) assert_int_equal(ddt_f32_to_bf16(f), v);
    }
    assert_int_equal(ddt_f32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(ddt_f32_to_bf16(3.4028235e38f), 0x7F80); /* rounds up to inf */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_dtype_reads_back),
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_folder_with_single_file),
        cmocka_unit_test(test_truncated_file),
        cmocka_unit_test(test_header_length_beyond_file),
        cmocka_unit_test(test_header_over_cap),
        cmocka_unit_test(test_header_not_json_or_not_object),
        cmocka_unit_test(test_unknown_dtype),
        cmocka_unit_test(test_bad_shapes),
        cmocka_unit_test(test_bad_offsets),
        cmocka_unit_test(test_empty_tensors_do_not_overlap),
        cmocka_unit_test(test_parse_in_memory),
        cmocka_unit_test(test_bf16_to_f32_exhaustive),
        cmocka_unit_test(test_f16_to_f32_exhaustive),
        cmocka_unit_test(test_fp8_e4m3_to_f32_exhaustive),
        cmocka_unit_test(test_f32_to_bf16_rounding),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
