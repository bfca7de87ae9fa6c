/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors header parser: any
 * byte string must either be rejected with a status or yield a table whose every
 * tensor lies inside the buffer, has nbytes = numel x dtype size, and is sorted by
 * name.  Each accepted tensor's first and last byte is read so that AddressSanitizer
 * sees any range that escapes the buffer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ddt_st_tensor *ts = NULL;
    int32_t n = 0;
    ddt_error err;
    if (ddt_st_parse(data, size, "fuzz.safetensors", &ts, &n, &err) != DDT_OK) {
        if (ts != NULL || n != 0 || err.msg[0] == '\0') __builtin_trap();
        return 0;
    }
    volatile uint8_t sink = 0;
    for (int32_t i = 0; i < n; i++) {
        const ddt_st_tensor *t = &ts[i];
        const uint8_t *p = t->data;
        if (t->ndim < 0 || t->ndim > DDT_ST_MAX_DIMS) __builtin_trap();
        if ((uint64_t)t->numel * ddt_dtype_size(t->dtype) != t->nbytes) __builtin_trap();
        if (p < data || t->nbytes > (uint64_t)(data + size - p)) __builtin_trap();
        if (i > 0 && strcmp(ts[i - 1].name, t->name) >= 0) __builtin_trap();
        if (t->nbytes) sink ^= p[0] ^ p[t->nbytes - 1];
    }
    (void)sink;
    ddt_st_tensors_free(ts, n);
    return 0;
}
