/*
 * nn_cuda.h — the small element-wise and per-row kernels every model on the
 * GPU needs (RMSNorm, SiLU-gated product, residual add, row gathers), each the
 * twin of backend/cpu/nn.h with the same arithmetic per element, and each
 * independent of how many tokens are processed together (a row's result
 * depends on that row only, with a fixed reduction order).
 * All pointers are device pointers; every launcher takes a stream.
 */
#ifndef DDT_CUDA_NN_H
#define DDT_CUDA_NN_H

#include <stdint.h>

#include "ddtree.h"
#include "backend/cuda/qmatmul_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[t][i] = x[t][i] / sqrt(mean_i(x[t]^2) + eps) * w[i] for i < dim, t < n
 * (row strides ldx, ldo; out may equal x).  The mean of squares is a fixed-order
 * sum over 256 threads, accumulated in fp32. */
ddt_status ddt_cuda_rmsnorm(const float *x, int64_t ldx, int32_t n, int32_t dim, const float *w, float eps,
                            float *out, int64_t ldo, ddt_cuda_stream stream, ddt_error *err);

/* The residual add and the next norm in one launch: x[t][i] = x[t][i] + r[t][i]
 * (stored), then out[t] = rmsnorm(x[t]) as ddt_cuda_rmsnorm computes it (the same
 * bits as ddt_cuda_add then ddt_cuda_rmsnorm when r's rows are 16-byte aligned with
 * ldr % 4 == 0 like x's, as every caller's: alignment picks the summation path).
 * out must not alias x or r. */
ddt_status ddt_cuda_add_rmsnorm(float *x, int64_t ldx, const float *r, int64_t ldr, int32_t n, int32_t dim,
                                const float *w, float eps, float *out, int64_t ldo, ddt_cuda_stream stream,
                                ddt_error *err);

/* ddt_cuda_add_rmsnorm that also writes out's split planes (sp: from
 * ddt_cuda_matmul_split_planes for the product that reads out next; NULL or
 * sp->hi NULL: none), so that product skips its split launch.  The same bits in
 * out. */
ddt_status ddt_cuda_add_rmsnorm_split(float *x, int64_t ldx, const float *r, int64_t ldr, int32_t n, int32_t dim,
                                      const float *w, float eps, float *out, int64_t ldo,
                                      const ddt_cuda_split_planes *sp, ddt_cuda_stream stream, ddt_error *err);

/* One RMSNorm of ddt_cuda_rmsnorm_pair: out[t] = rmsnorm(x[t][0..dim)) * w (row
 * strides ldx, ldo; out may equal x). */
typedef struct ddt_cuda_norm_job {
    const float *x;
    int64_t ldx;
    int32_t dim;
    const float *w;
    float *out;
    int64_t ldo;
} ddt_cuda_norm_job;

/* Two independent RMSNorms over the same n rows in one launch (MLA's q_a and kv_a
 * latents): bitwise ddt_cuda_rmsnorm(jobs[0]) and ddt_cuda_rmsnorm(jobs[1]).  The
 * jobs must not overlap in memory. */
ddt_status ddt_cuda_rmsnorm_pair(const ddt_cuda_norm_job jobs[2], int32_t n, float eps, ddt_cuda_stream stream,
                                 ddt_error *err);

/* ddt_cuda_rmsnorm_pair that also writes the split planes of jobs[0]'s output (sp0,
 * as ddt_cuda_add_rmsnorm_split's sp). */
ddt_status ddt_cuda_rmsnorm_pair_split(const ddt_cuda_norm_job jobs[2], int32_t n, float eps,
                                       const ddt_cuda_split_planes *sp0, ddt_cuda_stream stream, ddt_error *err);

/* g[t][i] = silu(g[t][i]) * u[t][i] for i < dim, t < n (row strides ldg, ldu). */
ddt_status ddt_cuda_silu_mul(float *g, int64_t ldg, const float *u, int64_t ldu, int32_t n, int32_t dim,
                             ddt_cuda_stream stream, ddt_error *err);

/* x[i] = x[i] + y[i] for i < count (x, y contiguous). */
ddt_status ddt_cuda_add(float *x, const float *y, int64_t count, ddt_cuda_stream stream, ddt_error *err);

/* out[i] = parts[0][i] + parts[1][i] + ... + parts[n_parts - 1][i] for i < count, added in
 * part order (((p0 + p1) + p2) + ...), parts[k] at parts + k * count (contiguous; out must not
 * overlap them).  The multi-GPU all-reduce's sum of the ranks' gathered partials: its order
 * depends on neither count nor the launch, so a token's sum is the same at any token count
 * (NCCL's own all-reduce orders each element's additions by its place in the message). */
ddt_status ddt_cuda_sum_parts(const float *parts, int32_t n_parts, int64_t count, float *out, ddt_cuda_stream stream,
                              ddt_error *err);

/* out[t][k * cols + j] = parts[k][t][j] for k < n_parts, t < rows, j < cols: the ranks'
 * column blocks (parts[k] at parts + k * rows * cols, rows of cols floats, as an
 * all-gather leaves them) side by side in rows of ldo >= n_parts * cols floats (out
 * must not overlap them; columns past n_parts * cols untouched).  The multi-GPU
 * logits: each rank computes its vocabulary rows of the LM head for every token. */
ddt_status ddt_cuda_unshard_cols(const float *parts, int32_t n_parts, int64_t rows, int64_t cols, float *out,
                                 int64_t ldo, ddt_cuda_stream stream, ddt_error *err);

/* dst[k][0..cols) = src[rows[k]][0..cols) for k < m (row strides ldd >= cols, lds;
 * rows on the device): ddt_cuda_gather_rows_multi with one source. */
ddt_status ddt_cuda_gather_rows(float *dst, int64_t ldd, const float *src, int64_t lds, const int32_t *rows,
                                int32_t m, int32_t cols, ddt_cuda_stream stream, ddt_error *err);

/* Most sources one ddt_cuda_gather_rows_multi launch takes (they travel by value
 * in the kernel's parameters). */
#define DDT_CUDA_GATHER_MAX_SRC 8

/* The same rows of `count` sources side by side, in one launch: for i < count
 * (1..DDT_CUDA_GATHER_MAX_SRC), dst[k][i*cols + j] = src[i][rows[k]][j] for
 * j < cols, k < m (src a host array of device pointers, all of row stride lds;
 * dst row stride ldd >= count * cols).  Bitwise the count calls
 * ddt_cuda_gather_rows(dst + i*cols, ldd, src[i], lds, rows, m, cols) (plain
 * copies).  The drafter's append puts its target layers' rows next to each
 * other this way: one launch instead of one per layer. */
ddt_status ddt_cuda_gather_rows_multi(float *dst, int64_t ldd, const float *const *src, int32_t count, int64_t lds,
                                      const int32_t *rows, int32_t m, int32_t cols, ddt_cuda_stream stream,
                                      ddt_error *err);

/* ddt_cuda_gather_rows_multi of the rows clamped to a length on the device:
 * row k < m reads rows[min(k, c - 1)], c = min(*n_dev, m), and row 0 of every
 * source when c < 1 -- bitwise a launch that clamps the indices into a buffer
 * (tests/cuda/test_cuda_drafter_ref.cu) then the plain gather of it, in one
 * launch.  The drafter's append gathers a fixed
 * m rows of an accepted path whose length n_dev only the device knows (the
 * slots past it hold anything), so every row read exists. */
ddt_status ddt_cuda_gather_rows_multi_clamped(float *dst, int64_t ldd, const float *const *src, int32_t count,
                                              int64_t lds, const int32_t *rows, const int32_t *n_dev, int32_t m,
                                              int32_t cols, ddt_cuda_stream stream, ddt_error *err);

#ifdef __cplusplus
}
#endif
#endif
