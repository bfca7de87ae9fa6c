/*
 * safetensors.c — parser of one safetensors file image (header validation, tensor
 * table sorted by name) and the scalar dtype conversions every backend uses.
 *
 * The file is hostile input: every number in the header is checked before it is
 * used to form a pointer, so that a damaged or crafted file yields DDT_ERR_FORMAT
 * with a message naming the file and the tensor, never an out-of-range read.
 * Opening files, shards and weight views live in checkpoint.c.
 */
#include "io/safetensors.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

/* A real header is a few MB (K2.6: ~100k tensors); anything far larger is damage or
 * an attempt to make the JSON parser allocate without bound. */
#define DDT_ST_MAX_HEADER ((uint64_t)100 * 1024 * 1024)

static const struct {
    const char *name;
    size_t size;
} dtype_table[DDT_DTYPE_COUNT] = {
    [DDT_DTYPE_F32] = {"F32", 4},     [DDT_DTYPE_BF16] = {"BF16", 2},
    [DDT_DTYPE_F16] = {"F16", 2},     [DDT_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [DDT_DTYPE_I64] = {"I64", 8},     [DDT_DTYPE_I32] = {"I32", 4},
    [DDT_DTYPE_I16] = {"I16", 2},     [DDT_DTYPE_I8] = {"I8", 1},
    [DDT_DTYPE_U8] = {"U8", 1},       [DDT_DTYPE_BOOL] = {"BOOL", 1},
    [DDT_DTYPE_F64] = {"F64", 8},
};

size_t ddt_dtype_size(ddt_dtype dt) {
    if ((unsigned)dt >= DDT_DTYPE_COUNT) return 0;
    return dtype_table[dt].size;
}

const char *ddt_dtype_name(ddt_dtype dt) {
    if ((unsigned)dt >= DDT_DTYPE_COUNT) return "?";
    return dtype_table[dt].name;
}

static bool dtype_from_name(const char *s, ddt_dtype *out) {
    for (int i = 0; i < DDT_DTYPE_COUNT; i++) {
        if (strcmp(s, dtype_table[i].name) == 0) {
            *out = (ddt_dtype)i;
            return true;
        }
    }
    return false;
}

void ddt_st_tensors_free(ddt_st_tensor *tensors, int32_t count) {
    if (!tensors) return;
    for (int32_t i = 0; i < count; i++) free(tensors[i].name);
    free(tensors);
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const ddt_st_tensor *)a)->name, ((const ddt_st_tensor *)b)->name);
}

/* Byte range of a tensor inside the data section, kept beside the table only while
 * parsing (the public struct holds a pointer instead). */
typedef struct st_range {
    uint64_t begin, end;
    int32_t index;
} st_range;

static int cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* One header entry -> one tensor; `data` is the start of the data section. */
static ddt_status parse_entry(const char *file, const char *key, json_t *val, const uint8_t *data,
                              uint64_t data_size, uint64_t data_file_offset, ddt_st_tensor *t,
                              st_range *r, ddt_error *err) {
    if (!json_is_object(val))
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: tensor %s: header entry is not an object",
                        file, key);

    json_t *jd = json_object_get(val, "dtype");
    if (!json_is_string(jd))
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: tensor %s: \"dtype\" missing or not a string",
                        file, key);
    if (!dtype_from_name(json_string_value(jd), &t->dtype))
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: tensor %s: unknown dtype \"%.32s\"", file,
                        key, json_string_value(jd));

    json_t *js = json_object_get(val, "shape");
    if (!json_is_array(js))
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: tensor %s: \"shape\" missing or not an array",
                        file, key);
    size_t ndim = json_array_size(js);
    if (ndim > DDT_ST_MAX_DIMS)
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: tensor %s: %zu dimensions, at most %d", file,
                        key, ndim, DDT_ST_MAX_DIMS);
    t->ndim = (int32_t)ndim;
    uint64_t numel = 1;
    for (size_t d = 0; d < ndim; d++) {
        json_t *jv = json_array_get(js, d);
        if (!json_is_integer(jv) || json_integer_value(jv) < 0)
            return ddt_fail(err, DDT_ERR_FORMAT,
                            "file %s: tensor %s: shape[%zu] is not a non-negative integer", file,
                            key, d);
        uint64_t dim = (uint64_t)json_integer_value(jv);
        t->shape[d] = (int64_t)dim;
        /* Keep numel below 2^63 so it fits int64_t; the byte check below is tighter. */
        if (dim != 0 && numel > (uint64_t)INT64_MAX / dim)
            return ddt_fail(err, DDT_ERR_FORMAT,
                            "file %s: tensor %s: element count overflows (shape[%zu] = %llu)", file,
                            key, d, (unsigned long long)dim);
        numel *= dim;
    }
    t->numel = (int64_t)numel;
    uint64_t esize = ddt_dtype_size(t->dtype);
    if (numel > UINT64_MAX / esize)
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: tensor %s: byte size overflows", file, key);
    uint64_t nbytes = numel * esize;

    json_t *jo = json_object_get(val, "data_offsets");
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "file %s: tensor %s: \"data_offsets\" missing or not [begin, end]", file,
                        key);
    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
        json_integer_value(je) < 0)
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "file %s: tensor %s: data_offsets are not non-negative integers", file, key);
    uint64_t begin = (uint64_t)json_integer_value(jb), end = (uint64_t)json_integer_value(je);
    if (end < begin)
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: tensor %s: data_offsets end %llu < begin %llu",
                        file, key, (unsigned long long)end, (unsigned long long)begin);
    if (end > data_size)
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "file %s: tensor %s: data_offsets [%llu, %llu] beyond the data section "
                        "(%llu bytes)",
                        file, key, (unsigned long long)begin, (unsigned long long)end,
                        (unsigned long long)data_size);
    if (end - begin != nbytes)
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "file %s: tensor %s: %llu bytes in data_offsets, but shape x %s needs %llu",
                        file, key, (unsigned long long)(end - begin), ddt_dtype_name(t->dtype),
                        (unsigned long long)nbytes);
    /* Readers cast `data` to float or int64_t pointers; an unaligned element would be
     * undefined behaviour there.  Writers pad the header to 8 bytes and order
     * tensors by alignment, so real files always pass. */
    if (nbytes > 0 && (data_file_offset + begin) % esize != 0)
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "file %s: tensor %s: data at file offset %llu is not aligned to its %s "
                        "element size %llu",
                        file, key, (unsigned long long)(data_file_offset + begin),
                        ddt_dtype_name(t->dtype), (unsigned long long)esize);

    t->nbytes = nbytes;
    t->data = data + begin;
    r->begin = begin;
    r->end = end;
    return DDT_OK;
}

ddt_status ddt_st_parse(const uint8_t *buf, size_t len, const char *file_name,
                        ddt_st_tensor **out_tensors, int32_t *out_count, ddt_error *err) {
    const char *file = file_name ? file_name : "(memory)";
    *out_tensors = NULL;
    *out_count = 0;
    if (!buf && len) return ddt_fail(err, DDT_ERR_INVALID, "file %s: NULL buffer", file);
    if (len < 8)
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "file %s: truncated: %zu bytes, a safetensors file starts with an 8-byte "
                        "header length",
                        file, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > (uint64_t)(len - 8))
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "file %s: header length %llu beyond the file size %zu (truncated or not "
                        "safetensors)",
                        file, (unsigned long long)hlen, len);
    if (hlen > DDT_ST_MAX_HEADER)
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: header length %llu over the %llu-byte cap",
                        file, (unsigned long long)hlen, (unsigned long long)DDT_ST_MAX_HEADER);
    if (hlen < 2)
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: header of %llu bytes cannot be a JSON object",
                        file, (unsigned long long)hlen);

    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: header is not valid JSON: %s (line %d)",
                        file, jerr.text, jerr.line);
    if (!json_is_object(root)) {
        json_decref(root);
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: header is not a JSON object", file);
    }

    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_size = (uint64_t)len - 8 - hlen;
    size_t n = json_object_size(root);
    if (json_object_get(root, "__metadata__")) n--;
    if (n > (size_t)INT32_MAX) {
        json_decref(root);
        return ddt_fail(err, DDT_ERR_RANGE, "file %s: %zu tensors, too many", file, n);
    }

    ddt_st_tensor *ts = ddt_calloc_array(n, sizeof *ts);
    st_range *rs = ddt_calloc_array(n, sizeof *rs);
    if (!ts || !rs) {
        free(ts);
        free(rs);
        json_decref(root);
        return ddt_fail(err, DDT_ERR_NOMEM, "file %s: out of memory for %zu tensors", file, n);
    }

    ddt_status st = DDT_OK;
    int32_t count = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue; /* free-form strings; not needed */
        ddt_st_tensor *t = &ts[count];
        st = parse_entry(file, key, val, data, data_size, 8 + hlen, t, &rs[count], err);
        if (st != DDT_OK) break;
        t->name = strdup(key);
        if (!t->name) {
            st = ddt_fail(err, DDT_ERR_NOMEM, "file %s: out of memory", file);
            break;
        }
        rs[count].index = count;
        count++;
    }
    json_decref(root);
    if (st != DDT_OK) {
        ddt_st_tensors_free(ts, count);
        free(rs);
        return st;
    }

    /* Overlap: sorted by begin, each non-empty range must start at or after the
     * furthest end seen so far.  Empty tensors own no bytes and cannot collide. */
    qsort(rs, (size_t)count, sizeof *rs, cmp_range);
    uint64_t max_end = 0;
    int32_t max_owner = -1;
    for (int32_t i = 0; i < count; i++) {
        if (rs[i].begin == rs[i].end) continue;
        if (max_owner >= 0 && rs[i].begin < max_end) {
            st = ddt_fail(err, DDT_ERR_FORMAT,
                          "file %s: tensor %s: bytes [%llu, %llu) overlap tensor %s [.., %llu)",
                          file, ts[rs[i].index].name, (unsigned long long)rs[i].begin,
                          (unsigned long long)rs[i].end, ts[max_owner].name,
                          (unsigned long long)max_end);
            break;
        }
        max_end = rs[i].end;
        max_owner = rs[i].index;
    }
    free(rs);
    if (st != DDT_OK) {
        ddt_st_tensors_free(ts, count);
        return st;
    }

    qsort(ts, (size_t)count, sizeof *ts, cmp_tensor_name);
    *out_tensors = ts;
    *out_count = count;
    return DDT_OK;
}

/* ---- scalar conversions ------------------------------------------------- */

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float ddt_bf16_to_f32(uint16_t v) { return f32_from_bits((uint32_t)v << 16); }

uint16_t ddt_f32_to_bf16(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        /* Truncating a NaN could clear every mantissa bit left and make it inf;
         * setting the quiet bit keeps it a NaN with its sign. */
        return (uint16_t)((u >> 16) | 0x0040u);
    }
    /* Round to nearest, ties to even: add 0x7FFF plus the lowest kept bit.  A carry
     * into the exponent is the correct rounding up (to inf past the max). */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float ddt_f16_to_f32(uint16_t v) {
    uint32_t sign = (uint32_t)(v & 0x8000u) << 16;
    uint32_t exp = (v >> 10) & 0x1Fu;
    uint32_t man = v & 0x3FFu;
    if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (man << 13)); /* inf / NaN */
    if (exp != 0) return f32_from_bits(sign | ((exp - 15 + 127) << 23) | (man << 13));
    if (man == 0) return f32_from_bits(sign);
    /* Subnormal: shift the mantissa up until its leading one becomes implicit. */
    int32_t e = -14;
    while (!(man & 0x400u)) {
        man <<= 1;
        e--;
    }
    man &= 0x3FFu;
    return f32_from_bits(sign | ((uint32_t)(e + 127) << 23) | (man << 13));
}

float ddt_fp8_e4m3_to_f32(uint8_t v) {
    /* e4m3fn: bias 7, no infinities; S.1111.111 is the only NaN pattern. */
    uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    uint32_t exp = (v >> 3) & 0xFu;
    uint32_t man = v & 0x7u;
    if (exp == 0xF && man == 0x7) return f32_from_bits(sign | 0x7FC00000u);
    if (exp != 0) return f32_from_bits(sign | ((exp - 7 + 127) << 23) | (man << 20));
    if (man == 0) return f32_from_bits(sign);
    int32_t e = -6;
    while (!(man & 0x8u)) {
        man <<= 1;
        e--;
    }
    man &= 0x7u;
    return f32_from_bits(sign | ((uint32_t)(e + 127) << 23) | (man << 20));
}
