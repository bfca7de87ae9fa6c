/*
 * kv_cache.h — the MLA latent cache of the target: per layer and per position
 * one row of kv_lora_rank normalised latent values c followed by
 * qk_rope_head_dim rotated shared key values k_rope (576 floats per token per
 * layer for DeepSeek-V3 / Kimi).  Rows [0, len) are committed tokens.  A forward
 * writes its tokens' rows at [len, len + n) without committing them; prefill
 * then advances len, tree verify leaves len alone and commit moves the accepted
 * nodes' rows down to [len, len + m).  Allocated once; nothing else allocates.
 */
#ifndef DDT_MODEL_KV_CACHE_H
#define DDT_MODEL_KV_CACHE_H

#include <stdint.h>

#include "ddtree.h"

typedef struct ddt_kv_cache {
    int32_t n_layers;
    int32_t width;     /* kv_lora_rank + qk_rope_head_dim */
    int32_t capacity;  /* rows per layer */
    int32_t len;       /* committed rows, 0..capacity */
    float *data;       /* [n_layers][capacity][width], owned */
} ddt_kv_cache;

ddt_status ddt_kv_cache_alloc(int32_t n_layers, int32_t width, int32_t capacity, ddt_kv_cache *kv,
                              ddt_error *err);
void ddt_kv_cache_free(ddt_kv_cache *kv);

/* Row `row` of layer `layer` ([width] floats). */
static inline float *ddt_kv_cache_row(const ddt_kv_cache *kv, int32_t layer, int32_t row) {
    return kv->data + ((size_t)layer * (size_t)kv->capacity + (size_t)row) * (size_t)kv->width;
}

/*
 * Commit m uncommitted rows: row len + src[k] moves to len + k in every layer
 * (k < m), then len += m.  src must be strictly increasing with src[k] >= k (a
 * root-to-node path of a topologically ordered tree is), so moving in order
 * never overwrites a row still to be read; rows must lie below capacity.
 */
ddt_status ddt_kv_cache_commit(ddt_kv_cache *kv, const int32_t *src, int32_t m, ddt_error *err);

/* Drop committed rows: len = new_len (0 <= new_len <= len). */
ddt_status ddt_kv_cache_truncate(ddt_kv_cache *kv, int32_t new_len, ddt_error *err);

#endif
