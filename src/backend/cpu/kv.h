/*
 * kv.h — the target's KV cache on the CPU backend, the twin of
 * backend/cuda/kv_cuda.h (ddt_cuda_kv: the same commit rule on device memory;
 * tests/cuda/test_cuda_kv.c checks it against ddt_cpu_kv_commit's rule).
 * Per layer and per row one row of `width` floats; for the target (model/target.c)
 * a row is the MLA latent: kv_lora_rank normalised latent values c followed by
 * qk_rope_head_dim rotated shared key values k_rope (576 floats per token per
 * layer for DeepSeek-V3 / Kimi).  Rows [0, len) are committed tokens.  A forward
 * writes its tokens' rows at [len, len + n) without committing them; prefill
 * then advances len, tree verify leaves len alone and commit moves the accepted
 * nodes' rows down to [len, len + m).  Allocated once; nothing else allocates.
 * (Was model/kv_cache.h, ddt_kv_cache_*.)
 */
#ifndef DDT_BACKEND_CPU_KV_H
#define DDT_BACKEND_CPU_KV_H

#include <stdint.h>

#include "ddtree.h"

typedef struct ddt_cpu_kv {
    int32_t n_layers;
    int32_t width;     /* kv_lora_rank + qk_rope_head_dim */
    int32_t capacity;  /* rows per layer */
    int32_t len;       /* committed rows, 0..capacity */
    float *data;       /* [n_layers][capacity][width], owned */
} ddt_cpu_kv;

ddt_status ddt_cpu_kv_alloc(int32_t n_layers, int32_t width, int32_t capacity, ddt_cpu_kv *kv, ddt_error *err);
void ddt_cpu_kv_free(ddt_cpu_kv *kv);

/* Row `row` of layer `layer` ([width] floats). */
static inline float *ddt_cpu_kv_row(const ddt_cpu_kv *kv, int32_t layer, int32_t row) {
    return kv->data + ((size_t)layer * (size_t)kv->capacity + (size_t)row) * (size_t)kv->width;
}

/*
 * Commit m uncommitted rows: row len + src[k] moves to len + k in every layer
 * (k < m), then len += m.  src must be strictly increasing with src[k] >= k (a
 * root-to-node path of a topologically ordered tree is), so moving in order
 * never overwrites a row still to be read; rows must lie below capacity.
 */
ddt_status ddt_cpu_kv_commit(ddt_cpu_kv *kv, const int32_t *src, int32_t m, ddt_error *err);

/* Drop committed rows: len = new_len (0 <= new_len <= len). */
ddt_status ddt_cpu_kv_truncate(ddt_cpu_kv *kv, int32_t new_len, ddt_error *err);

#endif
