/*
 * qmatmul.h — matrix products of fp32 activations with borrowed weights in every
 * checkpoint format (dense F32/BF16/F16, FP8 E4M3 with 128x128 block scales,
 * INT4 group-32 compressed-tensors).  Weights are read where they lie (the
 * checkpoint mapping): dense ones widened in registers, FP8 and INT4 dequantised
 * a chunk at a time on the stack; products are accumulated in fp32.  Nothing
 * allocates.
 *
 * Every output element is computed by one thread with an arithmetic order that
 * depends only on the weight's column count, never on the number of rows of x
 * processed together or the thread count: the same token gives bit-identical
 * results alone or inside a batch (prefill vs tree verify).  For x W^T that
 * order (16 fused multiply-add lanes, then a fixed tree; qmatmul.c) is also the
 * same with or without SIMD, so results do not depend on the build either.
 */
#ifndef DDT_BACKEND_CPU_QMATMUL_H
#define DDT_BACKEND_CPU_QMATMUL_H

#include <stdint.h>

#include "backend/row_groups.h"
#include "backend/cpu/pool.h"
#include "io/safetensors.h"


/* Dequantise w[row][c0 .. c0+len) to fp32 into out[len].  Bounds are the caller's. */
void ddt_cpu_dequant(const ddt_qweight *w, int64_t row, int64_t c0, int64_t len, float *out);

/* y[t][o] = sum_j x[t][j] * w[o][j]:  x [n][w->cols] (row stride ldx),
 * y [n][w->rows] (row stride ldy).  y must not alias x. */
void ddt_cpu_matmul(ddt_cpu_pool *pool, const ddt_qweight *w, const float *x, int64_t ldx, int64_t n,
                    float *y, int64_t ldy);

/* ddt_cpu_matmul through the portable C kernel (no intrinsics): bitwise the same
 * results, much slower; the tests compare the two. */
void ddt_cpu_matmul_portable(ddt_cpu_pool *pool, const ddt_qweight *w, const float *x, int64_t ldx, int64_t n,
                             float *y, int64_t ldy);

/* y[t][g*y_stride + o] = sum_{j < w->cols} x[t][g*x_stride + j] * w[g*w_row_stride + w_row_offset + o][j]
 * for o < rows. */
void ddt_cpu_matmul_grouped(ddt_cpu_pool *pool, const ddt_qweight *w, const ddt_row_groups *g,
                            const float *x, int64_t ldx, int64_t n, float *y, int64_t ldy);

/* The transposed product, y = x W:
 * y[t][g*y_stride + j] = sum_{i < rows} x[t][g*x_stride + i] * w[g*w_row_stride + w_row_offset + i][j]
 * for j < w->cols.  MLA's absorbed query q_lat = q_nope W_UK uses it. */
void ddt_cpu_matmul_t_grouped(ddt_cpu_pool *pool, const ddt_qweight *w, const ddt_row_groups *g,
                              const float *x, int64_t ldx, int64_t n, float *y, int64_t ldy);

/* Read element i of a small dense vector (norm weights, biases) of dtype F32/BF16/F16. */
float ddt_cpu_vec_at(const void *data, ddt_dtype dtype, int64_t i);

#endif
