/*
 * kv_cuda.h — KV commit on the GPU: after a tree verify wrote node i's latent
 * row at cache row len + i in every layer, move the accepted path's rows to
 * len .. len + m - 1 and advance len, all from device memory (the path and its
 * length come from the walk kernel), so the round needs no host sync and can be
 * captured in a CUDA graph.  Rows are opaque bytes (bf16 or fp32 latent rows).
 */
#ifndef DDT_CUDA_KV_H
#define DDT_CUDA_KV_H

#include <stdint.h>

#include "backend/cuda/cuda_types.h"
#include "ddtree.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { DDT_CUDA_KV_OK = 0, DDT_CUDA_KV_BAD_PATH = 1 };

typedef struct ddt_cuda_kv {
    void *data;           /* device [n_layers][capacity][row_bytes] */
    int32_t n_layers;
    int32_t capacity;     /* rows per layer */
    int32_t row_bytes;    /* a multiple of 16, <= 8192 */
    int32_t *len;         /* device [1] committed rows */
    int32_t *status;      /* device [1] DDT_CUDA_KV_* of the last commit */
    /* device [1], 0 between commits, or NULL: the commit's arrival ticket.  With
     * it the commit is one launch (the last layer block to finish advances len);
     * NULL keeps the older two launches (copy, then a one-thread advance), so a
     * cache built without it (a test's) still commits.  Same results either way. */
    uint32_t *ticket;
} ddt_cuda_kv;

/*
 * Commit: path[0..*path_len) (device) must start at 0, increase strictly and
 * stay below capacity - len, and *path_len in 1..DDT_MAX_PATH; otherwise nothing
 * moves and *status = DDT_CUDA_KV_BAD_PATH.  One launch on `stream` when
 * kv->ticket is set (it must be 0 before, and is 0 again after), else two.
 */
ddt_status ddt_cuda_kv_commit(const ddt_cuda_kv *kv, const int32_t *path, const int32_t *path_len,
                              ddt_cuda_stream stream, ddt_error *err);

/* After a prefill of n rows at len..len+n-1: len += n (one-thread launch; a
 * length past capacity sets *status = DDT_CUDA_KV_BAD_PATH and leaves len). */
ddt_status ddt_cuda_kv_advance(const ddt_cuda_kv *kv, int32_t n, ddt_cuda_stream stream, ddt_error *err);

/* len = new_len from the host (0 <= new_len <= capacity): rollback or reset. */
ddt_status ddt_cuda_kv_set_len(const ddt_cuda_kv *kv, int32_t new_len, ddt_cuda_stream stream, ddt_error *err);

#ifdef __cplusplus
}
#endif
#endif
