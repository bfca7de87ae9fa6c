/*
 * nn_cuda.cu — RMSNorm, SiLU gate, residual add and row gathers on the GPU
 * (see nn_cuda.h).  One block per row for the norm, whose arithmetic is
 * norm_dev.cuh's (shared with the MoE layer's fused end in moe_cuda.cu).
 */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/nn_cuda.h"
#include "backend/cuda/norm_dev.cuh"
#include "backend/cuda/silu_dev.cuh"

#define EW_THREADS 256

/* The residual source of add_rmsnorm: a row of r. */
struct NormRowResid {
    static constexpr bool on = true;
    const float *__restrict__ r;
    __device__ float4 vec(int i) const { return ((const float4 *)r)[i]; }
    __device__ float one(int i) const { return r[i]; }
};

/* One block per row (norm_dev.cuh).  RESID: x = x + r first (stored back: the
 * residual add of the layer), then the norm of the sum. */
template <bool RESID, int NT>
static __global__ void __launch_bounds__(NT, 1)
rmsnorm_kernel(float *x, int64_t ldx, const float *__restrict__ r, int64_t ldr, int dim, const float *__restrict__ w,
               float eps, float *out, int64_t ldo, bool vec, const ddt_cuda_split_planes sp) {
    DDT_GRID_DEP_WAIT();
    float *xr = x + (int64_t)blockIdx.x * ldx;
    float *orow = out + (int64_t)blockIdx.x * ldo;
    const NormSplitRow spr = norm_split_row(sp, blockIdx.x);
    if (RESID) norm_row<NT>(xr, dim, NormRowResid{r + (int64_t)blockIdx.x * ldr}, w, eps, orow, vec, spr);
    else norm_row<NT>(xr, dim, NormNoResid{}, w, eps, orow, vec, spr);
}

static bool norm_vec(const void *x, int64_t ldx, const void *r, int64_t ldr, const float *w, const void *out,
                     int64_t ldo, int32_t dim) {
    const void *ptrs[4] = {x, r, w, out};
    const int64_t lds[4] = {ldx, ldr, 0, ldo};
    return norm_vec_ok(dim, ptrs, lds, 4);
}

extern "C" ddt_status ddt_cuda_rmsnorm(const float *x, int64_t ldx, int32_t n, int32_t dim, const float *w, float eps,
                            float *out, int64_t ldo, ddt_cuda_stream stream, ddt_error *err) {
    if (n < 1 || dim < 1) return ddt_fail(err, DDT_ERR_INVALID, "rmsnorm: %d rows of %d", n, dim);
    const bool vec = norm_vec(x, ldx, nullptr, 0, w, out, ldo, dim);
    const ddt_cuda_split_planes none = {NULL, NULL, 0};
    norm_launch(norm_threads(dim), [&](auto nt) {
        constexpr int NT = decltype(nt)::value;
        rmsnorm_kernel<false, NT><<<n, NT, 0, (cudaStream_t)stream>>>((float *)x, ldx, nullptr, 0, dim, w, eps, out, ldo,
                                                                       vec, none);
    });
    DDT_CUDA_LAUNCHED("rmsnorm", (cudaStream_t)stream, err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_add_rmsnorm(float *x, int64_t ldx, const float *r, int64_t ldr, int32_t n, int32_t dim,
                                           const float *w, float eps, float *out, int64_t ldo, ddt_cuda_stream stream,
                                           ddt_error *err) {
    return ddt_cuda_add_rmsnorm_split(x, ldx, r, ldr, n, dim, w, eps, out, ldo, NULL, stream, err);
}

extern "C" ddt_status ddt_cuda_add_rmsnorm_split(float *x, int64_t ldx, const float *r, int64_t ldr, int32_t n,
                                                 int32_t dim, const float *w, float eps, float *out, int64_t ldo,
                                                 const ddt_cuda_split_planes *sp, ddt_cuda_stream stream,
                                                 ddt_error *err) {
    if (n < 1 || dim < 1 || !x || !r || !w || !out)
        return ddt_fail(err, DDT_ERR_INVALID, "add_rmsnorm: %d rows of %d", n, dim);
    ddt_cuda_split_planes p;
    const ddt_status st = norm_split_check("add_rmsnorm", sp, dim, &p, err);
    if (st != DDT_OK) return st;
    const bool vec = norm_vec(x, ldx, r, ldr, w, out, ldo, dim);
    norm_launch(norm_threads(dim), [&](auto nt) {
        constexpr int NT = decltype(nt)::value;
        rmsnorm_kernel<true, NT><<<n, NT, 0, (cudaStream_t)stream>>>(x, ldx, r, ldr, dim, w, eps, out, ldo, vec, p);
    });
    DDT_CUDA_LAUNCHED("add_rmsnorm", (cudaStream_t)stream, err);
    return DDT_OK;
}

/* ddt_cuda_rmsnorm_pair's launch: blockIdx.y picks the job, blockIdx.x the row. */
struct NormPair {
    ddt_cuda_norm_job job[2];
    bool vec[2];
    ddt_cuda_split_planes sp0; /* job 0's output planes, or none */
};

/* NT: norm_threads of the longer row; each row is normed by its own count */
template <int NT>
static __global__ void __launch_bounds__(NT, 1) rmsnorm_pair_kernel(const NormPair p, float eps) {
    DDT_GRID_DEP_WAIT();
    /* the job by a select of constant indices: p.job[blockIdx.y] put the parameter struct
       in local memory (a 128-byte stack frame, a store and a load before the norm) */
    const bool second = blockIdx.y != 0;
    const ddt_cuda_norm_job j = second ? p.job[1] : p.job[0];
    float *xr = (float *)j.x + (int64_t)blockIdx.x * j.ldx;
    norm_row<NT>(xr, j.dim, NormNoResid{}, j.w, eps, j.out + (int64_t)blockIdx.x * j.ldo, second ? p.vec[1] : p.vec[0],
                 second ? NormSplitRow{nullptr, nullptr} : norm_split_row(p.sp0, blockIdx.x));
}

extern "C" ddt_status ddt_cuda_rmsnorm_pair(const ddt_cuda_norm_job jobs[2], int32_t n, float eps,
                                            ddt_cuda_stream stream, ddt_error *err) {
    return ddt_cuda_rmsnorm_pair_split(jobs, n, eps, NULL, stream, err);
}

extern "C" ddt_status ddt_cuda_rmsnorm_pair_split(const ddt_cuda_norm_job jobs[2], int32_t n, float eps,
                                                  const ddt_cuda_split_planes *sp0, ddt_cuda_stream stream,
                                                  ddt_error *err) {
    NormPair p;
    if (!jobs) return ddt_fail(err, DDT_ERR_INVALID, "rmsnorm_pair: no jobs");
    ddt_status st = norm_split_check("rmsnorm_pair", sp0, jobs[0].dim, &p.sp0, err);
    if (st != DDT_OK) return st;
    for (int i = 0; i < 2; i++) {
        const ddt_cuda_norm_job &j = jobs[i];
        if (n < 1 || j.dim < 1 || !j.x || !j.w || !j.out)
            return ddt_fail(err, DDT_ERR_INVALID, "rmsnorm_pair: job %d: %d rows of %d", i, n, j.dim);
        p.job[i] = j;
        p.vec[i] = norm_vec(j.x, j.ldx, nullptr, 0, j.w, j.out, j.ldo, j.dim);
    }
    norm_launch(max(norm_threads(jobs[0].dim), norm_threads(jobs[1].dim)), [&](auto nt) {
        constexpr int NT = decltype(nt)::value;
        rmsnorm_pair_kernel<NT><<<dim3((unsigned)n, 2), NT, 0, (cudaStream_t)stream>>>(p, eps);
    });
    DDT_CUDA_LAUNCHED("rmsnorm_pair", (cudaStream_t)stream, err);
    return DDT_OK;
}

static __global__ void silu_mul_kernel(float *g, int64_t ldg, const float *__restrict__ u, int64_t ldu, int dim) {
    DDT_GRID_DEP_WAIT();
    float *gr = g + (int64_t)blockIdx.y * ldg;
    const float *ur = u + (int64_t)blockIdx.y * ldu;
    /* silu_dev.cuh's expression: ddt_cuda_matmul_silu recomputes it bit for bit */
    for (int i = blockIdx.x * EW_THREADS + threadIdx.x; i < dim; i += gridDim.x * EW_THREADS) {
        const float v = gr[i];
        gr[i] = silu_mul1(v, ur[i]);
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
    DDT_GRID_DEP_WAIT();
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


static __global__ void sum_parts_kernel(const float *parts, int n_parts, int64_t count, float *out) {
    DDT_GRID_DEP_WAIT();
    for (int64_t i = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x; i < count; i += (int64_t)gridDim.x * EW_THREADS) {
        float s = parts[i];
        for (int k = 1; k < n_parts; k++) s = s + parts[(int64_t)k * count + i];
        out[i] = s;
    }
}

ddt_status ddt_cuda_sum_parts(const float *parts, int32_t n_parts, int64_t count, float *out, ddt_cuda_stream stream,
                              ddt_error *err) {
    if (n_parts < 1 || count < 0)
        return ddt_fail(err, DDT_ERR_INVALID, "sum of parts: %d parts of %lld floats", n_parts, (long long)count);
    if (count == 0) return DDT_OK;
    int64_t blocks = (count + EW_THREADS - 1) / EW_THREADS;
    if (blocks > 1024) blocks = 1024;
    sum_parts_kernel<<<(unsigned)blocks, EW_THREADS, 0, (cudaStream_t)stream>>>(parts, n_parts, count, out);
    DDT_CUDA_LAUNCHED("sum_parts", (cudaStream_t)stream, err);
    return DDT_OK;
}

/* One thread a float of out, in out's order: a rank's row is cols contiguous floats. */
static __global__ void unshard_cols_kernel(const float *parts, int64_t rows, int64_t cols, int64_t total,
                                           float *out, int64_t ldo) {
    DDT_GRID_DEP_WAIT();
    const int64_t wide = total / rows; /* n_parts * cols */
    for (int64_t i = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x; i < total; i += (int64_t)gridDim.x * EW_THREADS) {
        const int64_t t = i / wide, c = i % wide, k = c / cols, j = c % cols;
        out[t * ldo + c] = parts[(k * rows + t) * cols + j];
    }
}

ddt_status ddt_cuda_unshard_cols(const float *parts, int32_t n_parts, int64_t rows, int64_t cols, float *out,
                                 int64_t ldo, ddt_cuda_stream stream, ddt_error *err) {
    if (n_parts < 1 || rows < 0 || cols < 0 || ldo < (int64_t)n_parts * cols)
        return ddt_fail(err, DDT_ERR_INVALID, "unshard columns: %d parts of %lld x %lld into rows of %lld", n_parts,
                        (long long)rows, (long long)cols, (long long)ldo);
    const int64_t total = (int64_t)n_parts * rows * cols;
    if (total == 0) return DDT_OK;
    int64_t blocks = (total + EW_THREADS - 1) / EW_THREADS;
    if (blocks > 4096) blocks = 4096;
    unshard_cols_kernel<<<(unsigned)blocks, EW_THREADS, 0, (cudaStream_t)stream>>>(parts, rows, cols, total, out, ldo);
    DDT_CUDA_LAUNCHED("unshard_cols", (cudaStream_t)stream, err);
    return DDT_OK;
}

/* One source: the multi-source gather's launch with count 1 (one kernel for both). */
ddt_status ddt_cuda_gather_rows(float *dst, int64_t ldd, const float *src, int64_t lds, const int32_t *rows,
                                int32_t m, int32_t cols, ddt_cuda_stream stream, ddt_error *err) {
    return ddt_cuda_gather_rows_multi(dst, ldd, &src, 1, lds, rows, m, cols, stream, err);
}

/* ddt_cuda_gather_rows_multi's sources, by value (the launch reads no host array). */
struct GatherSrcs {
    const float *src[DDT_CUDA_GATHER_MAX_SRC];
};

/* blockIdx.x: the row k, blockIdx.y: the source i, whose row goes to column block
 * i.  The sources are a __grid_constant__ parameter so that indexing them by
 * blockIdx.y reads the parameter in place (a plain one is copied to local memory
 * first).  n_dev not NULL: the row index is clamped first, rows[min(k, c - 1)]
 * with c = min(*n_dev, gridDim.x), row 0 when c < 1. */
static __global__ void gather_rows_multi_kernel(float *dst, int64_t ldd, const __grid_constant__ GatherSrcs srcs,
                                                int64_t lds, const int32_t *__restrict__ rows,
                                                const int32_t *__restrict__ n_dev, int cols) {
    DDT_GRID_DEP_WAIT();
    const int k = (int)blockIdx.x;
    int r;
    if (n_dev) {
        int c = *n_dev;
        if (c > (int)gridDim.x) c = (int)gridDim.x;
        r = c >= 1 ? rows[k < c ? k : c - 1] : 0;
    } else {
        r = rows[k];
    }
    const float *s = srcs.src[blockIdx.y] + (int64_t)r * lds;
    float *d = dst + (int64_t)k * ldd + (int64_t)blockIdx.y * cols;
    for (int i = threadIdx.x; i < cols; i += EW_THREADS) d[i] = s[i];
}

static ddt_status gather_multi(float *dst, int64_t ldd, const float *const *src, int32_t count, int64_t lds,
                               const int32_t *rows, const int32_t *n_dev, int32_t m, int32_t cols,
                               ddt_cuda_stream stream, ddt_error *err) {
    if (!dst || !src || !rows || m < 0 || cols < 1 || count < 1 || count > DDT_CUDA_GATHER_MAX_SRC ||
        ldd < (int64_t)count * cols)
        return ddt_fail(err, DDT_ERR_INVALID, "gather_rows_multi: %d rows of %d sources x %d (row stride %lld)", m,
                        count, cols, (long long)ldd);
    GatherSrcs g = {};
    for (int32_t i = 0; i < count; i++) {
        if (!src[i]) return ddt_fail(err, DDT_ERR_INVALID, "gather_rows_multi: source %d is NULL", i);
        g.src[i] = src[i];
    }
    if (m == 0) return DDT_OK;
    gather_rows_multi_kernel<<<dim3((unsigned)m, (unsigned)count), EW_THREADS, 0, (cudaStream_t)stream>>>(
        dst, ldd, g, lds, rows, n_dev, cols);
    DDT_CUDA_LAUNCHED("gather_rows_multi", (cudaStream_t)stream, err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_gather_rows_multi(float *dst, int64_t ldd, const float *const *src, int32_t count,
                                                 int64_t lds, const int32_t *rows, int32_t m, int32_t cols,
                                                 ddt_cuda_stream stream, ddt_error *err) {
    return gather_multi(dst, ldd, src, count, lds, rows, NULL, m, cols, stream, err);
}

extern "C" ddt_status ddt_cuda_gather_rows_multi_clamped(float *dst, int64_t ldd, const float *const *src,
                                                         int32_t count, int64_t lds, const int32_t *rows,
                                                         const int32_t *n_dev, int32_t m, int32_t cols,
                                                         ddt_cuda_stream stream, ddt_error *err) {
    if (!n_dev) return ddt_fail(err, DDT_ERR_INVALID, "gather_rows_multi_clamped: NULL length");
    return gather_multi(dst, ldd, src, count, lds, rows, n_dev, m, cols, stream, err);
}
