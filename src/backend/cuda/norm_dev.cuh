/*
 * norm_dev.cuh — one RMSNorm row on one block of NORM_THREADS threads, with an
 * optional residual added first, for the kernels that end in a norm: nn_cuda.cu's
 * rmsnorm / add_rmsnorm and moe_cuda.cu's expert combine fused with the layer's
 * residual add and the next norm.  One copy of the arithmetic, so a fused kernel
 * gives the bits of the launches it replaces as long as its residual source
 * returns the bits those launches would have stored (issue 13).
 *
 * The row's result never depends on the other rows: 256 threads each sum a fixed
 * slice of squares, then a fixed butterfly and the 8 warp sums in order.
 */
#ifndef DDT_CUDA_NORM_DEV_CUH
#define DDT_CUDA_NORM_DEV_CUH

#include <cuda_runtime.h>
#include <math.h>

#define NORM_THREADS 256
/* Rows of a multiple of 4 floats, 16-byte aligned and at most NORM_VMAX float4 per
 * thread (hidden sizes up to 8192) stay in registers between the sum of squares and
 * the scaling (one read of x); other rows take the strided loop. */
#define NORM_VMAX 8

/* Sum of one value per thread over the block, in a fixed order (xor butterfly in
 * each warp, then the 8 warp sums in index order by every thread): the result is
 * a function of the row only. */
static __device__ float norm_block_sum(float v, float *wsum) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0) wsum[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = wsum[0];
#pragma unroll
    for (int w = 1; w < NORM_THREADS / 32; w++) s += wsum[w];
    return s;
}

/* The residual source of norm_row when there is none. */
struct NormNoResid {
    static constexpr bool on = false;
    __device__ float4 vec(int) const { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    __device__ float one(int) const { return 0.0f; }
};

/*
 * One row, the calling block's: with R::on, x[i] = x[i] + r(i) first (stored back:
 * the layer's residual add), then orow[i] = w[i] * (x[i] * inv) with inv = 1 /
 * sqrt(mean of squares + eps).  r.vec(j) returns elements 4j..4j+3 (vec rows),
 * r.one(i) element i; each is called once per element, by the thread that owns it.
 * vec: the row qualifies for the register path (see NORM_VMAX; the caller checks the
 * alignment of every pointer it reads).  orow may equal xr only without a residual.
 * Every thread of the block must call it (it holds a barrier).
 */
template <class R>
static __device__ __forceinline__ void norm_row(float *xr, int dim, const R &r, const float *__restrict__ w,
                                                float eps, float *orow, bool vec) {
    __shared__ float wsum[NORM_THREADS / 32];
    float s = 0.0f;
    if (vec) {
        float4 v[NORM_VMAX];
        const int nv = dim / 4;
#pragma unroll
        for (int k = 0; k < NORM_VMAX; k++) {
            const int i = threadIdx.x + k * NORM_THREADS;
            if (i < nv) {
                v[k] = ((const float4 *)xr)[i];
                if (R::on) {
                    const float4 a = r.vec(i);
                    v[k].x = v[k].x + a.x, v[k].y = v[k].y + a.y, v[k].z = v[k].z + a.z, v[k].w = v[k].w + a.w;
                }
            }
        }
#pragma unroll
        for (int k = 0; k < NORM_VMAX; k++)
            if (threadIdx.x + k * NORM_THREADS < nv) {
                s += v[k].x * v[k].x;
                s += v[k].y * v[k].y;
                s += v[k].z * v[k].z;
                s += v[k].w * v[k].w;
            }
        const float inv = 1.0f / sqrtf(norm_block_sum(s, wsum) / (float)dim + eps);
#pragma unroll
        for (int k = 0; k < NORM_VMAX; k++) {
            const int i = threadIdx.x + k * NORM_THREADS;
            if (i < nv) {
                if (R::on) ((float4 *)xr)[i] = v[k];
                const float4 g = ((const float4 *)w)[i];
                ((float4 *)orow)[i] = make_float4(g.x * (v[k].x * inv), g.y * (v[k].y * inv), g.z * (v[k].z * inv),
                                                  g.w * (v[k].w * inv));
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) {
        float v = xr[i];
        if (R::on) {
            v = v + r.one(i);
            xr[i] = v; /* read and written by this thread only */
        }
        s += v * v;
    }
    const float inv = 1.0f / sqrtf(norm_block_sum(s, wsum) / (float)dim + eps);
    /* out may alias x: each element is read then written by the same thread */
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) orow[i] = w[i] * (xr[i] * inv);
}

/* Whether a row set takes norm_row's register path: every pointer the kernel reads
 * or writes by float4 (NULL: not used) 16-byte aligned with a row stride (in floats)
 * a multiple of 4, and dim a multiple of 4 within NORM_VMAX float4 per thread. */
static inline bool norm_vec_ok(int32_t dim, const void *const *ptrs, const int64_t *lds, int count) {
    if (dim % 4 != 0 || dim / 4 > NORM_VMAX * NORM_THREADS) return false;
    for (int k = 0; k < count; k++)
        if (ptrs[k] && ((uintptr_t)ptrs[k] % 16 != 0 || lds[k] % 4 != 0)) return false;
    return true;
}

#endif
