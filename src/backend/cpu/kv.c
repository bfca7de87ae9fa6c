/*
 * kv.c — allocation, commit (compaction of accepted tree rows) and
 * truncation of the KV cache (see kv.h); the CPU twin of backend/cuda/kv_cuda.cu.
 */
#include "backend/cpu/kv.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

ddt_status ddt_cpu_kv_alloc(int32_t n_layers, int32_t width, int32_t capacity, ddt_cpu_kv *kv, ddt_error *err) {
    memset(kv, 0, sizeof *kv);
    if (n_layers <= 0 || width <= 0 || capacity <= 0)
        return ddt_fail(err, DDT_ERR_INVALID, "kv cache: layers %d, width %d, capacity %d must be positive",
                        n_layers, width, capacity);
    size_t rows, total;
    if (!ddt_mul_size((size_t)n_layers, (size_t)capacity, &rows) || !ddt_mul_size(rows, (size_t)width, &total))
        return ddt_fail(err, DDT_ERR_RANGE, "kv cache: %d layers x %d rows x %d floats overflows", n_layers,
                        capacity, width);
    kv->data = ddt_calloc_array(total, sizeof(float));
    if (!kv->data)
        return ddt_fail(err, DDT_ERR_NOMEM, "kv cache: cannot allocate %d layers x %d rows x %d floats",
                        n_layers, capacity, width);
    kv->n_layers = n_layers;
    kv->width = width;
    kv->capacity = capacity;
    return DDT_OK;
}

void ddt_cpu_kv_free(ddt_cpu_kv *kv) {
    if (!kv) return;
    free(kv->data);
    memset(kv, 0, sizeof *kv);
}

ddt_status ddt_cpu_kv_commit(ddt_cpu_kv *kv, const int32_t *src, int32_t m, ddt_error *err) {
    if (m < 0 || (m > 0 && !src)) return ddt_fail(err, DDT_ERR_INVALID, "kv cache commit: bad path of %d rows", m);
    for (int32_t k = 0; k < m; k++) {
        if (src[k] < k || (k > 0 && src[k] <= src[k - 1]))
            return ddt_fail(err, DDT_ERR_INVALID,
                            "kv cache commit: path[%d] = %d: rows must be strictly increasing and >= their index",
                            k, src[k]);
        if ((int64_t)kv->len + src[k] >= kv->capacity)
            return ddt_fail(err, DDT_ERR_RANGE, "kv cache commit: path[%d] = %d: row %lld beyond capacity %d", k,
                            src[k], (long long)kv->len + src[k], kv->capacity);
    }
    for (int32_t l = 0; l < kv->n_layers; l++)
        for (int32_t k = 0; k < m; k++)
            if (src[k] != k)
                memcpy(ddt_cpu_kv_row(kv, l, kv->len + k), ddt_cpu_kv_row(kv, l, kv->len + src[k]),
                       (size_t)kv->width * sizeof(float));
    kv->len += m;
    return DDT_OK;
}

ddt_status ddt_cpu_kv_truncate(ddt_cpu_kv *kv, int32_t new_len, ddt_error *err) {
    if (new_len < 0 || new_len > kv->len)
        return ddt_fail(err, DDT_ERR_INVALID, "kv cache: cannot roll back to length %d (length is %d)", new_len,
                        kv->len);
    kv->len = new_len;
    return DDT_OK;
}
