/*
 * kv_cuda.cu — KV commit of the accepted path (see kv_cuda.h).
 *
 * One block per layer.  A path row may be the destination of an earlier path
 * entry's move (path [0, 2, 3]: row 2 is read for k = 1 and written for k = 2),
 * so each block first reads every moving row of a column slab into shared
 * memory, synchronises, then writes them: no order between threads matters.
 * The path is checked in every block (it is at most 32 entries) so a bad path
 * moves nothing.  The status and the len advance are then done by the last
 * block to finish (an arrival ticket, kv->ticket), so the commit is one launch;
 * a cache without a ticket takes a second one-thread launch for them instead.
 *
 * Why the fused advance gives the two launches' results: every block decides
 * from the same len and path (nothing in the launch writes them before the last
 * block's advance), so every block, and the advance, take the same path_ok
 * branch; and the advance writes len only after every block has counted in,
 * which each block does after a __syncthreads that follows every one of its
 * threads' reads of len (a fence before the ticket orders those reads before the
 * count; the last block fences again after it, before its write).
 */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kv_cuda.h"

#define KV_THREADS 256
#define KV_SLAB 1024 /* bytes of each row staged per pass */

static_assert(KV_SLAB % 16 == 0, "slabs move 16-byte words");

static __device__ bool path_ok(const int32_t *path, int m, int len, int capacity) {
    if (m < 1 || m > DDT_MAX_PATH || len < 0 || path[0] != 0) return false;
    for (int k = 1; k < m; k++)
        if (path[k] <= path[k - 1]) return false;
    return len + path[m - 1] < capacity;
}

/* Record the commit's outcome: what the second launch (or the last block) does. */
static __device__ __forceinline__ void kv_record(int32_t *len_p, int32_t *status, bool ok, int len, int m) {
    if (ok) {
        *len_p = len + m;
        *status = DDT_CUDA_KV_OK;
    } else {
        *status = DDT_CUDA_KV_BAD_PATH;
    }
}

/* ticket NULL: the copies only (kv_advance_kernel follows).  Otherwise every
 * block counts in once, copies done or skipped, and the last one records. */
static __global__ void __launch_bounds__(KV_THREADS)
kv_commit_kernel(char *__restrict__ data, int capacity, int row_bytes, int32_t *len_p, int32_t *status,
                 const int32_t *__restrict__ path, const int32_t *path_len, unsigned *ticket) {
    DDT_GRID_DEP_WAIT();
    __shared__ uint4 slab[DDT_MAX_PATH][KV_SLAB / 16];
    /* len is read here once, into a register, by every thread: the last block
       rewrites it below, after every block has counted in */
    const int m = *path_len, len = *len_p;
    /* the same value in every thread of every block: uniform branches */
    const bool ok = path_ok(path, m, len, capacity);
    if (ok) {
        char *layer = data + (size_t)blockIdx.x * (size_t)capacity * (size_t)row_bytes;
        for (int c0 = 0; c0 < row_bytes; c0 += KV_SLAB) {
            const int words = (row_bytes - c0 < KV_SLAB ? row_bytes - c0 : KV_SLAB) / 16;
            for (int i = threadIdx.x; i < m * words; i += blockDim.x) {
                int k = i / words, w = i % words;
                const uint4 *src = (const uint4 *)(layer + (size_t)(len + path[k]) * row_bytes + c0);
                slab[k][w] = src[w];
            }
            __syncthreads();
            for (int i = threadIdx.x; i < m * words; i += blockDim.x) {
                int k = i / words, w = i % words;
                uint4 *dst = (uint4 *)(layer + (size_t)(len + k) * row_bytes + c0);
                dst[w] = slab[k][w];
            }
            __syncthreads();
        }
    }
    if (!ticket) return;
    /* a bad path skipped the loop's barriers: this one makes sure every thread of
       the block has read len before thread 0 counts the block in */
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence(); /* release: the block's reads (and copies) before its count */
        if (atomicAdd(ticket, 1u) == gridDim.x - 1) {
            __threadfence(); /* acquire: every other block's count (hence reads) before the write */
            kv_record(len_p, status, ok, len, m);
            *ticket = 0u; /* every block has counted: nobody else touches it in this launch */
        }
    }
}

static __global__ void kv_advance_kernel(int32_t *len_p, int32_t *status, int capacity,
                                         const int32_t *path, const int32_t *path_len) {
    DDT_GRID_DEP_WAIT();
    const int m = *path_len, len = *len_p;
    kv_record(len_p, status, path_ok(path, m, len, capacity), len, m);
}

extern "C" ddt_status ddt_cuda_kv_commit(const ddt_cuda_kv *kv, const int32_t *path,
                                         const int32_t *path_len, ddt_cuda_stream stream,
                                         ddt_error *err) {
    if (!kv || !kv->data || !kv->len || !kv->status || !path || !path_len)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_kv_commit: NULL argument");
    if (kv->n_layers < 1 || kv->capacity < 1 || kv->row_bytes < 16 || kv->row_bytes % 16 ||
        kv->row_bytes > 8192)
        return ddt_fail(err, DDT_ERR_RANGE,
                        "KV cache of %d layers x %d rows x %d bytes: rows must be 16..8192 bytes, "
                        "a multiple of 16", kv->n_layers, kv->capacity, kv->row_bytes);
    if (((uintptr_t)kv->data & 15u) != 0)
        return ddt_fail(err, DDT_ERR_INVALID, "KV cache data is not 16-byte aligned");
    cudaStream_t s = (cudaStream_t)stream;
    kv_commit_kernel<<<kv->n_layers, KV_THREADS, 0, s>>>((char *)kv->data, kv->capacity, kv->row_bytes,
                                                         kv->len, kv->status, path, path_len, kv->ticket);
    DDT_CUDA_LAUNCHED("kv_commit", s, err);
    if (kv->ticket) return DDT_OK; /* the last block advanced */
    kv_advance_kernel<<<1, 1, 0, s>>>(kv->len, kv->status, kv->capacity, path, path_len);
    DDT_CUDA_LAUNCHED("kv_advance", s, err);
    return DDT_OK;
}

static __global__ void kv_add_kernel(int32_t *len_p, int32_t *status, int capacity, int n) {
    DDT_GRID_DEP_WAIT();
    const int len = *len_p;
    if (len + n <= capacity) *len_p = len + n;
    else *status = DDT_CUDA_KV_BAD_PATH;
}

extern "C" ddt_status ddt_cuda_kv_advance(const ddt_cuda_kv *kv, int32_t n, ddt_cuda_stream stream, ddt_error *err) {
    if (!kv || !kv->len || n < 0) return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_kv_advance: bad argument");
    kv_add_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(kv->len, kv->status, kv->capacity, n);
    DDT_CUDA_LAUNCHED("kv_advance", (cudaStream_t)stream, err);
    return DDT_OK;
}

static __global__ void kv_set_kernel(int32_t *len_p, int32_t *status, int new_len) {
    DDT_GRID_DEP_WAIT();
    *len_p = new_len;
    *status = DDT_CUDA_KV_OK;
}

extern "C" ddt_status ddt_cuda_kv_set_len(const ddt_cuda_kv *kv, int32_t new_len, ddt_cuda_stream stream,
                                         ddt_error *err) {
    if (!kv || !kv->len) return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_kv_set_len: NULL cache");
    if (new_len < 0 || new_len > kv->capacity)
        return ddt_fail(err, DDT_ERR_RANGE, "KV length %d outside 0..%d", new_len, kv->capacity);
    /* a kernel, not a memcpy from a host stack variable that may be gone when it runs */
    kv_set_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(kv->len, kv->status, new_len);
    DDT_CUDA_LAUNCHED("kv_set_len", (cudaStream_t)stream, err);
    return DDT_OK;
}
