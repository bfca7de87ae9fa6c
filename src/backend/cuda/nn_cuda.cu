/*
 * nn_cuda.cu — RMSNorm, SiLU gate, residual add and row gather on the GPU
 * (see nn_cuda.h).  One block per row for the norm: 256 threads each sum a
 * fixed slice of squares, then a fixed butterfly and the 8 warp sums in order
 * add the partial sums, so a row's result never depends on the other rows.
 */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/nn_cuda.h"

#define NORM_THREADS 256
#define EW_THREADS 256

/* Sum of one value per thread over the block, in a fixed order (xor butterfly in
 * each warp, then the 8 warp sums in index order by every thread): the result is
 * a function of the row only. */
static __device__ float block_sum(float v, float *wsum) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0) wsum[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = wsum[0];
#pragma unroll
    for (int w = 1; w < NORM_THREADS / 32; w++) s += wsum[w];
    return s;
}

/* One block per row.  Rows of a multiple of 4 floats, 16-byte aligned and at most
 * NORM_VMAX float4 per thread (hidden sizes up to 8192) stay in registers between
 * the sum of squares and the scaling (one read of x); other rows take the strided
 * loop.  RESID: x = x + r first (stored back: the residual add of the layer),
 * then the norm of the sum. */
#define NORM_VMAX 8
template <bool RESID>
static __global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_kernel(float *x, int64_t ldx, const float *__restrict__ r, int64_t ldr, int dim, const float *__restrict__ w,
               float eps, float *out, int64_t ldo, bool vec) {
    __shared__ float wsum[NORM_THREADS / 32];
    float *xr = x + (int64_t)blockIdx.x * ldx;
    const float *rr = RESID ? r + (int64_t)blockIdx.x * ldr : nullptr;
    float *orow = out + (int64_t)blockIdx.x * ldo;
    float s = 0.0f;
    if (vec) {
        float4 v[NORM_VMAX];
        const int nv = dim / 4;
#pragma unroll
        for (int k = 0; k < NORM_VMAX; k++) {
            const int i = threadIdx.x + k * NORM_THREADS;
            if (i < nv) {
                v[k] = ((const float4 *)xr)[i];
                if (RESID) {
                    const float4 a = ((const float4 *)rr)[i];
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
        const float inv = 1.0f / sqrtf(block_sum(s, wsum) / (float)dim + eps);
#pragma unroll
        for (int k = 0; k < NORM_VMAX; k++) {
            const int i = threadIdx.x + k * NORM_THREADS;
            if (i < nv) {
                if (RESID) ((float4 *)xr)[i] = v[k];
                const float4 g = ((const float4 *)w)[i];
                ((float4 *)orow)[i] = make_float4(g.x * (v[k].x * inv), g.y * (v[k].y * inv), g.z * (v[k].z * inv),
                                                  g.w * (v[k].w * inv));
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) {
        float v = xr[i];
        if (RESID) {
            v = v + rr[i];
            xr[i] = v; /* read and written by this thread only */
        }
        s += v * v;
    }
    const float inv = 1.0f / sqrtf(block_sum(s, wsum) / (float)dim + eps);
    /* out may alias x: each element is read then written by the same thread */
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) orow[i] = w[i] * (xr[i] * inv);
}

static bool norm_vec(const void *x, int64_t ldx, const void *r, int64_t ldr, const float *w, const void *out,
                     int64_t ldo, int32_t dim) {
    const auto al = [](const void *p) { return p == nullptr || (uintptr_t)p % 16 == 0; };
    return dim % 4 == 0 && dim / 4 <= NORM_VMAX * NORM_THREADS && ldx % 4 == 0 && ldo % 4 == 0 &&
           (r == nullptr || ldr % 4 == 0) && al(x) && al(r) && al(w) && al(out);
}

extern "C" ddt_status ddt_cuda_rmsnorm(const float *x, int64_t ldx, int32_t n, int32_t dim, const float *w, float eps,
                            float *out, int64_t ldo, ddt_cuda_stream stream, ddt_error *err) {
    if (n < 1 || dim < 1) return ddt_fail(err, DDT_ERR_INVALID, "rmsnorm: %d rows of %d", n, dim);
    const bool vec = norm_vec(x, ldx, nullptr, 0, w, out, ldo, dim);
    rmsnorm_kernel<false><<<n, NORM_THREADS, 0, (cudaStream_t)stream>>>((float *)x, ldx, nullptr, 0, dim, w, eps, out,
                                                                        ldo, vec);
    DDT_CUDA_LAUNCHED("rmsnorm", (cudaStream_t)stream, err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_add_rmsnorm(float *x, int64_t ldx, const float *r, int64_t ldr, int32_t n, int32_t dim,
                                           const float *w, float eps, float *out, int64_t ldo, ddt_cuda_stream stream,
                                           ddt_error *err) {
    if (n < 1 || dim < 1 || !x || !r || !w || !out)
        return ddt_fail(err, DDT_ERR_INVALID, "add_rmsnorm: %d rows of %d", n, dim);
    const bool vec = norm_vec(x, ldx, r, ldr, w, out, ldo, dim);
    rmsnorm_kernel<true><<<n, NORM_THREADS, 0, (cudaStream_t)stream>>>(x, ldx, r, ldr, dim, w, eps, out, ldo, vec);
    DDT_CUDA_LAUNCHED("add_rmsnorm", (cudaStream_t)stream, err);
    return DDT_OK;
}

static __global__ void silu_mul_kernel(float *g, int64_t ldg, const float *__restrict__ u, int64_t ldu, int dim) {
    float *gr = g + (int64_t)blockIdx.y * ldg;
    const float *ur = u + (int64_t)blockIdx.y * ldu;
    for (int i = blockIdx.x * EW_THREADS + threadIdx.x; i < dim; i += gridDim.x * EW_THREADS) {
        float v = gr[i];
        gr[i] = v / (1.0f + expf(-v)) * ur[i];
    }
}

ddt_status ddt_cuda_silu_mul(float *g, int64_t ldg, const float *u, int64_t ldu, int32_t n, int32_t dim,
                             ddt_cuda_stream stream, ddt_error *err) {
    if (n < 1 || dim < 1) return ddt_fail(err, DDT_ERR_INVALID, "silu_mul: %d rows of %d", n, dim);
    if (n > 65535) return ddt_fail(err, DDT_ERR_RANGE, "silu_mul: %d rows (at most 65535)", n);
    int bx = (dim + EW_THREADS - 1) / EW_THREADS;
    if (bx > 64) bx = 64;
    silu_mul_kernel<<<dim3(bx, n), EW_THREADS, 0, (cudaStream_t)stream>>>(g, ldg, u, ldu, dim);
    DDT_CUDA_LAUNCHED("silu_mul", (cudaStream_t)stream, err);
    return DDT_OK;
}

static __global__ void add_kernel(float *x, const float *__restrict__ y, int64_t count) {
    for (int64_t i = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x; i < count; i += (int64_t)gridDim.x * EW_THREADS)
        x[i] = x[i] + y[i];
}

ddt_status ddt_cuda_add(float *x, const float *y, int64_t count, ddt_cuda_stream stream, ddt_error *err) {
    if (count < 1) return DDT_OK;
    int64_t blocks = (count + EW_THREADS - 1) / EW_THREADS;
    if (blocks > 1024) blocks = 1024;
    add_kernel<<<(unsigned)blocks, EW_THREADS, 0, (cudaStream_t)stream>>>(x, y, count);
    DDT_CUDA_LAUNCHED("add", (cudaStream_t)stream, err);
    return DDT_OK;
}

static __global__ void gather_rows_kernel(float *dst, int64_t ldd, const float *__restrict__ src, int64_t lds,
                                          const int32_t *__restrict__ rows, int cols) {
    const float *s = src + (int64_t)rows[blockIdx.x] * lds;
    float *d = dst + (int64_t)blockIdx.x * ldd;
    for (int i = threadIdx.x; i < cols; i += EW_THREADS) d[i] = s[i];
}

ddt_status ddt_cuda_gather_rows(float *dst, int64_t ldd, const float *src, int64_t lds, const int32_t *rows,
                                int32_t m, int32_t cols, ddt_cuda_stream stream, ddt_error *err) {
    if (m < 0 || cols < 1) return ddt_fail(err, DDT_ERR_INVALID, "gather_rows: %d rows of %d", m, cols);
    if (m == 0) return DDT_OK;
    gather_rows_kernel<<<m, EW_THREADS, 0, (cudaStream_t)stream>>>(dst, ldd, src, lds, rows, cols);
    DDT_CUDA_LAUNCHED("gather_rows", (cudaStream_t)stream, err);
    return DDT_OK;
}
