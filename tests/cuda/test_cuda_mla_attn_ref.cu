/*
 * test_cuda_mla_attn_ref.cu — the reference for test_cuda_mla_attn.c: the exact
 * MLA attention kernel as it was before the latency rework (commit b04003a,
 * src/backend/cuda/mla_cuda.cu), kept unchanged but for its name so that the
 * test can require the new kernel to give the same bits.  Built with the
 * library's flags (--fmad=false), which the comparison depends on.  Test code:
 * nothing in the library calls it.
 */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/mla_cuda.h"

#define OLD_ATTN_THREADS 128
#define OLD_ATTN_WARPS (OLD_ATTN_THREADS / 32)

static __device__ __forceinline__ float old_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* OLD mla_attn_kernel, verbatim */
static __global__ void __launch_bounds__(OLD_ATTN_THREADS)
old_mla_attn_kernel(ddt_cuda_mla_attn_args a) {
    DDT_GRID_DEP_WAIT();
    extern __shared__ float smem[];
    const int width = a.rank + a.rope;
    float *q = smem;                              /* [width] */
    float *red = q + width;                       /* [OLD_ATTN_THREADS] */
    int *anc = (int *)(red + OLD_ATTN_THREADS);   /* [n] */
    const int i = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
    const int len = *a.len;
    const int d_i = a.depth[i];
    for (int j = threadIdx.x; j < a.n; j += OLD_ATTN_THREADS) {
        bool v = a.vis ? ((a.vis[(int64_t)i * a.vis_words + (j >> 6)] >> (j & 63)) & 1u) : j <= i;
        if (v) {
            int dj = a.depth[j];
            if (dj >= 0 && dj <= d_i) anc[dj] = j;
        }
    }
    for (int d = threadIdx.x; d < a.rank; d += OLD_ATTN_THREADS) q[d] = a.q_lat[((int64_t)i * a.heads + h) * a.rank + d];
    for (int d = threadIdx.x; d < a.rope; d += OLD_ATTN_THREADS)
        q[a.rank + d] = a.q_rope[(int64_t)i * a.q_rope_ld_t + (int64_t)h * a.q_rope_ld_h + d];
    __syncthreads();
    const int P = len + d_i + 1;
    float *sc = a.scores + ((int64_t)i * a.heads + h) * a.capacity;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float mx = -INFINITY;
    for (int p = warp; p < P; p += OLD_ATTN_WARPS) {
        const int row = p < len ? p : len + anc[p - len];
        const float *kv = a.cache + (int64_t)row * width;
        float s = 0.0f;
        for (int d = lane; d < width; d += 32) s += q[d] * kv[d];
        s = old_warp_sum(s) * a.scale;
        if (lane == 0) sc[p] = s;
        mx = fmaxf(mx, s);
    }
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < OLD_ATTN_WARPS; w++) m = fmaxf(m, red[w]);
    __syncthreads();
    float part = 0.0f;
    for (int p = threadIdx.x; p < P; p += OLD_ATTN_THREADS) {
        float e = expf(sc[p] - m);
        sc[p] = e;
        part += e;
    }
    red[threadIdx.x] = part;
    __syncthreads();
    for (int step = OLD_ATTN_THREADS / 2; step > 0; step >>= 1) {
        if (threadIdx.x < step) red[threadIdx.x] += red[threadIdx.x + step];
        __syncthreads();
    }
    const float inv = 1.0f / red[0];
    float *out = a.out + ((int64_t)i * a.heads + h) * a.rank;
    for (int d = threadIdx.x; d < a.rank; d += OLD_ATTN_THREADS) {
        float acc = 0.0f;
        for (int p = 0; p < P; p++) {
            const int row = p < len ? p : len + anc[p - len];
            acc += sc[p] * a.cache[(int64_t)row * width + d];
        }
        out[d] = acc * inv;
    }
}

/* Launch the old kernel as the old launcher did (the caller keeps the old
 * shared-memory bound); the launch's error, cudaSuccess when it started. */
extern "C" int ref_old_mla_attention(const ddt_cuda_mla_attn_args *a) {
    size_t smem = sizeof(float) * ((size_t)a->rank + (size_t)a->rope + OLD_ATTN_THREADS) + sizeof(int) * (size_t)a->n;
    if (smem > 48 * 1024) return (int)cudaErrorInvalidValue;
    old_mla_attn_kernel<<<a->n * a->heads, OLD_ATTN_THREADS, smem>>>(*a);
    return (int)cudaGetLastError();
}
