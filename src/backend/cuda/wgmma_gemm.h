/*
 * wgmma_gemm.h — the bf16 weight-streaming x W^T on Hopper's asynchronous tensor
 * cores (wgmma) fed by TMA: the tensor-core mode's product for dense bf16 weights
 * (issue 12), called by qmatmul_cuda.cu's tensor path.  Internal to the CUDA
 * backend.
 *
 * Why a second tensor-core kernel.  The mma.sync stream (wstream.cuh) reads each
 * weight once for 64 tokens, but at n >= 16 its instruction issue is the wall
 * (two mma.sync per weight fragment and n-tile for the split activations: the
 * LM head at n = 64 ran 3.5x its n = 1 time).  wgmma m64n64k16 multiplies a 64-row
 * weight tile by 64 tokens in one instruction from shared memory, with no
 * register fragments, so the tensor work of 64 tokens hides under the weight
 * stream: n = 1 and n = 64 cost the same.
 *
 * Determinism contract (qmatmul_cuda.h's): every launch runs the same
 * instruction shape (m64n64k16, 64 token columns, tokens past n are zero rows
 * from the TMA's out-of-bounds fill or rows no output reads), the same k order
 * (64-column k-blocks in increasing order, each 4 k-steps, each the hi then the
 * lo half of the split activations) and a k-split fixed by the weight's shape
 * (rows, groups, columns) whose partials are added in rank order.  Nothing
 * depends on n, so a token's bits are the same alone or in any batch.
 */
#ifndef DDT_CUDA_WGMMA_GEMM_H
#define DDT_CUDA_WGMMA_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/row_groups.h"
#include "backend/cuda/cuda_types.h"
#include "ddtree.h"
#include "io/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Does the wgmma path take this weight: dense bf16, columns a multiple of 8 and
 * 16-byte aligned data (the TMA's row pitch and base), at most 2^31 rows?  A
 * property of the weight alone, never of n. */
bool ddt_cuda_wg_eligible(const ddt_qweight *w);

/* The k-split (a thread-block cluster of this many CTAs per 128-row tile) for a
 * product of `count` groups of `rows` rows over `cols` columns: from the shape
 * and the device alone (never n), the most splits whose CTAs (one per SM) fit
 * 132 multiprocessors in one wave, each at least two 64-column k-blocks, and
 * whose clusters all run at once: cap[ks] clusters of ks CTAs can (cap NULL:
 * only 1, 2, 4 or 8 are taken).  1..8. */
int32_t ddt_cuda_wg_ksplit_rule(int64_t rows, int32_t count, int64_t cols, const int32_t *cap);
/* The rule under this device's capacities (measured by ddt_cuda_wg_prepare;
 * before it, the powers of two): what every product launch uses. */
int32_t ddt_cuda_wg_ksplit(int64_t rows, int32_t count, int64_t cols);
/* The capacities ddt_cuda_wg_prepare measured ([ks] for ks = 1..8), NULL before. */
const int32_t *ddt_cuda_wg_cluster_caps(void);

/* y[t][g*y_stride + o] = sum_j x[t][g*x_stride + j] * w[g*w_row_stride + w_row_offset + o][j]
 * for an eligible weight, n >= 1 tokens: the activations are split into bf16 hi
 * and lo planes in the workspace (ddt_cuda_matmul_workspace_bytes(cols, count,
 * n) bytes, 16-byte aligned, overlapping neither x nor y), then one wgmma launch.
 * Two launches, no allocation, no synchronisation (graph-capturable). */
ddt_status ddt_cuda_wg_matmul(const ddt_qweight *w, const ddt_row_groups *g, const float *x, int64_t ldx, int32_t n,
                              float *y, int64_t ldy, void *workspace, size_t workspace_bytes, ddt_cuda_stream stream,
                              ddt_error *err);

/* Where ddt_cuda_wg_matmul_presplit reads the split planes of n tokens of an
 * eligible weight's product (one group): hi at the workspace's start, lo after
 * it, rows of round8(cols) bf16.  false when w is not eligible or the workspace
 * is missing, misaligned or short. */
bool ddt_cuda_wg_split_planes(const ddt_qweight *w, int32_t n, void *workspace, size_t workspace_bytes,
                              ddt_cuda_split_planes *out);

/* The split planes of `count` groups (rows g * n + t) of an eligible weight's
 * grouped product: ddt_cuda_wg_split_planes for count groups; what
 * ddt_cuda_wg_matmul_next with x NULL reads. */
bool ddt_cuda_wg_split_planes_grouped(const ddt_qweight *w, int32_t count, int32_t n, void *workspace,
                                      size_t workspace_bytes, ddt_cuda_split_planes *out);

/* ddt_cuda_wg_matmul with two options: x NULL reads the split planes already in
 * the workspace (ddt_cuda_wg_split_planes_grouped for g->count groups, written by
 * the activations' producer: the product launch alone), and next (NULL: none)
 * makes the epilogue also write each output value's split into the planes the
 * product that reads this output takes (cuda_types.h, ddt_cuda_next_planes): the
 * planes that product's own split launch would write, bitwise, so it may run
 * presplit.  The next planes must overlap neither y nor this workspace's. */
ddt_status ddt_cuda_wg_matmul_next(const ddt_qweight *w, const ddt_row_groups *g, const float *x, int64_t ldx,
                                   int32_t n, float *y, int64_t ldy, void *workspace, size_t workspace_bytes,
                                   const ddt_cuda_next_planes *next, ddt_cuda_stream stream, ddt_error *err);

/* ddt_cuda_wg_matmul of one group with the split planes already written (by the
 * activations' producer, at ddt_cuda_wg_split_planes): the product launch alone,
 * bitwise the same result. */
ddt_status ddt_cuda_wg_matmul_presplit(const ddt_qweight *w, int32_t n, float *y, int64_t ldy, void *workspace,
                                       size_t workspace_bytes, ddt_cuda_stream stream, ddt_error *err);

/* Raise the wgmma kernel's shared-memory limit (ddt_cuda_ws_prepare calls it at
 * load, outside any capture; idempotent).  The kernel (wg_gemm_kernel) loads its
 * first weight tiles before its grid wait: ddt_cuda_kernel_waits_late counts it
 * a product by that name. */
ddt_status ddt_cuda_wg_prepare(ddt_error *err);

#ifdef __cplusplus
}
#endif
#endif
