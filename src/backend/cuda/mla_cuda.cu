/*
 * mla_cuda.cu — RoPE + cache write and the exact absorbed MLA attention (see
 * mla_cuda.h).
 *
 * Attention: one block of 128 threads per (token, head).  The block lists the
 * token's ancestors by depth (from its visibility row), so that logical
 * position p maps to cache row p (p < len) or len + anc[p - len].  Scores: warp
 * w takes positions w, w + 4, ...; lane l sums dims l, l + 32, ... of the
 * 576-wide (rank + rope) dot product in order, then a fixed xor-shuffle tree.
 * Softmax: a fixed block tree for the max and the sum.  Output: thread d sums
 * p_j * c_j[d] over positions in increasing order.  Every order depends on the
 * logical positions only, never on n or on which rows hold the ancestors.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/mla_cuda.h"

#define ATTN_THREADS 128
#define ATTN_WARPS (ATTN_THREADS / 32)
#define ROPE_THREADS 128

static __global__ void __launch_bounds__(ROPE_THREADS)
rope_write_kernel(ddt_cuda_mla_rope_args a) {
    DDT_GRID_DEP_WAIT();
    const int i = blockIdx.x, half = a.rope / 2;
    const int pos = *a.len + a.depth[i];
    const int row = *a.len + i;
    const bool bad = pos < 0 || pos >= a.max_pos || row < 0 || row >= a.capacity;
    if (row < 0 || row >= a.capacity) return; /* nowhere to write; the caller checked capacity */
    const float *cs = a.cos_t + (int64_t)(bad ? 0 : pos) * half;
    const float *sn = a.sin_t + (int64_t)(bad ? 0 : pos) * half;
    const int64_t base = (int64_t)row * (a.rank + a.rope);
    float *dst = a.bf16_cache ? NULL : (float *)a.cache + base;
    __nv_bfloat16 *dst16 = a.bf16_cache ? (__nv_bfloat16 *)a.cache + base : NULL;
    for (int d = threadIdx.x; d < a.rank; d += ROPE_THREADS) {
        float v = bad ? NAN : a.kvn[(int64_t)i * a.rank + d];
        if (dst16) dst16[d] = __float2bfloat16(v);
        else dst[d] = v;
    }
    /* k_rope: one thread per rotation pair */
    const float *kr = a.kva + (int64_t)i * a.kva_ld + a.rank;
    for (int p = threadIdx.x; p < half; p += ROPE_THREADS) {
        float x0, x1;
        if (a.interleave) { x0 = kr[2 * p]; x1 = kr[2 * p + 1]; }
        else { x0 = kr[p]; x1 = kr[p + half]; }
        float c = cs[p], s = sn[p];
        float r0 = bad ? NAN : x0 * c - x1 * s, r1 = bad ? NAN : x1 * c + x0 * s;
        if (dst16) {
            dst16[a.rank + p] = __float2bfloat16(r0);
            dst16[a.rank + p + half] = __float2bfloat16(r1);
        } else {
            dst[a.rank + p] = r0;
            dst[a.rank + p + half] = r1;
        }
    }
    /* queries: rotate every (head, pair) into shared memory, then write back;
       interleaved pairs are read from where other pairs are written */
    extern __shared__ float stage[]; /* [heads][rope] */
    for (int it = threadIdx.x; it < a.heads * half; it += ROPE_THREADS) {
        const int h = it / half, p = it % half;
        const float *qr = a.q + ((int64_t)i * a.heads + h) * a.qdim + a.nope;
        float x0, x1;
        if (a.interleave) { x0 = qr[2 * p]; x1 = qr[2 * p + 1]; }
        else { x0 = qr[p]; x1 = qr[p + half]; }
        float c = cs[p], s = sn[p];
        stage[h * a.rope + p] = bad ? NAN : x0 * c - x1 * s;
        stage[h * a.rope + p + half] = bad ? NAN : x1 * c + x0 * s;
    }
    __syncthreads();
    for (int it = threadIdx.x; it < a.heads * a.rope; it += ROPE_THREADS) {
        const int h = it / a.rope, d = it % a.rope;
        a.q[((int64_t)i * a.heads + h) * a.qdim + a.nope + d] = stage[it];
    }
}

extern "C" ddt_status ddt_cuda_mla_rope_write(const ddt_cuda_mla_rope_args *a, ddt_cuda_stream stream,
                                              ddt_error *err) {
    if (a->n < 1 || a->rope < 2 || a->rope % 2 || a->heads < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "mla rope: %d tokens, rope dim %d, %d heads", a->n, a->rope, a->heads);
    size_t smem = sizeof(float) * (size_t)a->heads * (size_t)a->rope;
    if (smem > 48 * 1024) return ddt_fail(err, DDT_ERR_UNSUPPORTED, "mla rope: %d heads x %d rope dims", a->heads, a->rope);
    rope_write_kernel<<<a->n, ROPE_THREADS, smem, (cudaStream_t)stream>>>(*a);
    DDT_CUDA_LAUNCHED("mla_rope_write", (cudaStream_t)stream, err);
    return DDT_OK;
}

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __global__ void __launch_bounds__(ATTN_THREADS)
mla_attn_kernel(ddt_cuda_mla_attn_args a) {
    DDT_GRID_DEP_WAIT();
    extern __shared__ float smem[];
    const int width = a.rank + a.rope;
    float *q = smem;                          /* [width] */
    float *red = q + width;                   /* [ATTN_THREADS] */
    int *anc = (int *)(red + ATTN_THREADS);   /* [n] */
    const int i = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
    const int len = *a.len;
    const int d_i = a.depth[i];
    /* ancestors by depth: visible node j at depth depth[j] */
    for (int j = threadIdx.x; j < a.n; j += ATTN_THREADS) {
        bool v = a.vis ? ((a.vis[(int64_t)i * a.vis_words + (j >> 6)] >> (j & 63)) & 1u) : j <= i;
        if (v) {
            int dj = a.depth[j];
            if (dj >= 0 && dj <= d_i) anc[dj] = j;
        }
    }
    for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) q[d] = a.q_lat[((int64_t)i * a.heads + h) * a.rank + d];
    for (int d = threadIdx.x; d < a.rope; d += ATTN_THREADS)
        q[a.rank + d] = a.q_rope[(int64_t)i * a.q_rope_ld_t + (int64_t)h * a.q_rope_ld_h + d];
    __syncthreads();
    const int P = len + d_i + 1;
    float *sc = a.scores + ((int64_t)i * a.heads + h) * a.capacity;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float mx = -INFINITY;
    for (int p = warp; p < P; p += ATTN_WARPS) {
        const int row = p < len ? p : len + anc[p - len];
        const float *kv = a.cache + (int64_t)row * width;
        float s = 0.0f;
        for (int d = lane; d < width; d += 32) s += q[d] * kv[d];
        s = warp_sum(s) * a.scale;
        if (lane == 0) sc[p] = s;
        mx = fmaxf(mx, s);
    }
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < ATTN_WARPS; w++) m = fmaxf(m, red[w]);
    __syncthreads();
    float part = 0.0f;
    for (int p = threadIdx.x; p < P; p += ATTN_THREADS) {
        float e = expf(sc[p] - m);
        sc[p] = e;
        part += e;
    }
    red[threadIdx.x] = part;
    __syncthreads();
    for (int step = ATTN_THREADS / 2; step > 0; step >>= 1) {
        if (threadIdx.x < step) red[threadIdx.x] += red[threadIdx.x + step];
        __syncthreads();
    }
    const float inv = 1.0f / red[0];
    float *out = a.out + ((int64_t)i * a.heads + h) * a.rank;
    for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) {
        float acc = 0.0f;
        for (int p = 0; p < P; p++) {
            const int row = p < len ? p : len + anc[p - len];
            acc += sc[p] * a.cache[(int64_t)row * width + d];
        }
        out[d] = acc * inv;
    }
}

extern "C" ddt_status ddt_cuda_mla_attention(const ddt_cuda_mla_attn_args *a, ddt_cuda_stream stream,
                                             ddt_error *err) {
    if (a->n < 1 || a->heads < 1 || a->rank < 1 || a->rope < 0 || a->capacity < a->n)
        return ddt_fail(err, DDT_ERR_INVALID, "mla attention: %d tokens, %d heads, rank %d, %d cache rows", a->n,
                        a->heads, a->rank, a->capacity);
    if ((int64_t)a->n * a->heads > 0x7fffffff)
        return ddt_fail(err, DDT_ERR_RANGE, "mla attention: %d x %d blocks", a->n, a->heads);
    size_t smem = sizeof(float) * ((size_t)a->rank + (size_t)a->rope + ATTN_THREADS) + sizeof(int) * (size_t)a->n;
    if (smem > 48 * 1024) return ddt_fail(err, DDT_ERR_UNSUPPORTED, "mla attention: %zu bytes of shared memory", smem);
    mla_attn_kernel<<<a->n * a->heads, ATTN_THREADS, smem, (cudaStream_t)stream>>>(*a);
    DDT_CUDA_LAUNCHED("mla_attention", (cudaStream_t)stream, err);
    return DDT_OK;
}

static __global__ void pack_q_kernel(const float *__restrict__ q_lat, const float *__restrict__ q_rope,
                                     int64_t ld_t, int64_t ld_h, int heads, int rank, int rope,
                                     __nv_bfloat16 *__restrict__ q16) {
    DDT_GRID_DEP_WAIT();
    const int i = blockIdx.x / heads, h = blockIdx.x % heads, w = rank + rope;
    __nv_bfloat16 *dst = q16 + (int64_t)blockIdx.x * w;
    const float *ql = q_lat + (int64_t)blockIdx.x * rank, *qr = q_rope + (int64_t)i * ld_t + (int64_t)h * ld_h;
    for (int d = threadIdx.x; d < w; d += blockDim.x) dst[d] = __float2bfloat16(d < rank ? ql[d] : qr[d - rank]);
}

extern "C" ddt_status ddt_cuda_mla_pack_q(const float *q_lat, const float *q_rope, int64_t q_rope_ld_t,
                                          int64_t q_rope_ld_h, int32_t n, int32_t heads, int32_t rank, int32_t rope,
                                          uint16_t *q16, ddt_cuda_stream stream, ddt_error *err) {
    if (n < 1 || heads < 1 || rank < 1 || rope < 0)
        return ddt_fail(err, DDT_ERR_INVALID, "mla pack_q: %d tokens x %d heads", n, heads);
    pack_q_kernel<<<n * heads, 128, 0, (cudaStream_t)stream>>>(q_lat, q_rope, q_rope_ld_t, q_rope_ld_h, heads, rank,
                                                               rope, (__nv_bfloat16 *)q16);
    DDT_CUDA_LAUNCHED("mla_pack_q", (cudaStream_t)stream, err);
    return DDT_OK;
}

static __global__ void cache_fill_kernel(void *cache, int64_t per_layer, int64_t used, int64_t total, bool bf16,
                                         uint64_t seed) {
    DDT_GRID_DEP_WAIT();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        if (i % per_layer >= used) continue;
        uint64_t x = seed ^ ((uint64_t)i * 0x9E3779B97F4A7C15ull);
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        x ^= x >> 31;
        float u = (float)(uint32_t)(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
        if (bf16) ((__nv_bfloat16 *)cache)[i] = __float2bfloat16(u);
        else ((float *)cache)[i] = u;
    }
}

extern "C" ddt_status ddt_cuda_mla_cache_fill(void *cache, int32_t layers, int32_t capacity, int32_t width,
                                              int32_t rows, bool bf16, uint64_t seed, ddt_cuda_stream stream,
                                              ddt_error *err) {
    if (layers < 1 || capacity < 1 || width < 1 || rows < 0 || rows > capacity)
        return ddt_fail(err, DDT_ERR_INVALID, "mla cache_fill: %d rows of %d", rows, capacity);
    const int64_t per_layer = (int64_t)capacity * width;
    cache_fill_kernel<<<4096, 256, 0, (cudaStream_t)stream>>>(cache, per_layer, (int64_t)rows * width,
                                                              per_layer * layers, bf16, seed);
    DDT_CUDA_LAUNCHED("mla_cache_fill", (cudaStream_t)stream, err);
    return DDT_OK;
}
