/*
 * qmatmul_cuda.h — matrix products of fp32 activations with weights in every
 * checkpoint format (dense F32/BF16/F16, FP8 E4M3 with 128x128 block scales,
 * INT4 group-32 compressed-tensors), on the GPU, for the few tokens of a decode
 * step or a tree verify.  Weights are dequantised inside the kernel; products
 * are accumulated in fp32.  The GPU twin of backend/cpu/qmatmul.h.
 *
 * A device weight is a ddt_qweight whose data / scale pointers are device
 * pointers (ddt_cuda_qweight_upload makes one from a checkpoint view).
 *
 * Determinism contract (the engine's greedy tree == ar invariant rests on it):
 * every output element y[t][o] is computed with an arithmetic order that depends
 * only on the weight's shape, never on n (the number of tokens processed
 * together), on t, or on the launch configuration chosen for n.  A token gives
 * bit-identical results alone or inside a batch.  No atomics in reductions.
 * Nothing here allocates device memory except the upload functions.
 */
#ifndef DDT_CUDA_QMATMUL_H
#define DDT_CUDA_QMATMUL_H

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

/* Copy a host weight view (data and scales) to new device memory; *dev gets the
 * same format / shape with device pointers.  Free with ddt_cuda_qweight_free. */
ddt_status ddt_cuda_qweight_upload(const ddt_qweight *host, ddt_qweight *dev, ddt_error *err);
void ddt_cuda_qweight_free(ddt_qweight *dev);
/* Bytes the weight occupies on the device (data + scales). */
uint64_t ddt_cuda_qweight_bytes(const ddt_qweight *w);

/* Upload a small vector (norm weight, router bias) of dtype F32/BF16/F16 as
 * fp32 device memory [n].  Free with cudaFree (ddt_cuda_free). */
ddt_status ddt_cuda_vec_upload(const void *data, ddt_dtype dtype, int64_t n, float **dev, ddt_error *err);
void ddt_cuda_free(void *dev);


/* The tensor-core layout: add to a device weight (made by upload or random) the
 * packed copy the tensor-core path streams (wstream.cuh: 16-row x 32-column
 * tiles in mma fragment order, INT4 scales beside them), from its row-major
 * data, which stays (the FP32 path, x W and the embedding read it).  A no-op for
 * a weight the tensor-core path does not take (F32 / F16, other FP8 blocks) and
 * for one packed already.  Run at load: it allocates and synchronises.  Freed by
 * ddt_cuda_qweight_free. */
ddt_status ddt_cuda_qweight_pack(ddt_qweight *dev, ddt_error *err);
/* ddt_cuda_qweight_pack makes no packed copy of a weight the tensor mode's
 * products stream from its row-major data (dense bf16 on wgmma + TMA:
 * ddt_cuda_wg_eligible, wgmma_gemm.h); it only prepares the kernels.  The
 * routed experts' kernels (moe_cuda.cu) and tests of the mma.sync stream need the
 * packed copy of every eligible weight: this makes it whatever the format. */
ddt_status ddt_cuda_qweight_pack_stream(ddt_qweight *dev, ddt_error *err);
/* Does the tensor-core path take this weight (bf16; FP8 blocks a multiple of 32;
 * INT4 group 32 with columns a multiple of 32)?  Otherwise it runs the FP32 path in
 * every mode: a property of the weight, never of n. */
bool ddt_cuda_qweight_tc_eligible(const ddt_qweight *w);
/* Bytes of the packed copy (0 when none). */
uint64_t ddt_cuda_qweight_packed_bytes(const ddt_qweight *dev);
/* Set the dense tensor-core kernels' shared-memory limits on the current device
 * (ddt_cuda_qweight_pack calls it; idempotent). */
ddt_status ddt_cuda_ws_prepare(ddt_error *err);

/* How a product is computed (an explicit argument, never hidden state):
 *   DDT_CUDA_MM_FP32    CUDA cores, fp32 fused multiply-adds on the dequantised
 *                       weights (error about 1e-7 relative): the reference path.
 *   DDT_CUDA_MM_TENSOR  tensor cores (mma.sync bf16 -> fp32) for bf16, FP8 block
 *                       (block a multiple of 32) and INT4 group-32 weights, which
 *                       must be packed (ddt_cuda_qweight_pack; an unpacked one is
 *                       an error): the weights exactly, the activations split in
 *                       two bf16 halves (error about 1e-5 relative; wstream.cuh);
 *                       each weight byte is read once for up to 64 tokens.  F32 /
 *                       F16 weights, other FP8 blocks and groups that do not start
 *                       on a multiple of 16 rows take the FP32 path.  The halves
 *                       are made once per product into a caller's workspace
 *                       (ddt_cuda_matmul_workspace_bytes), not by every block.
 * Both keep the determinism contract; they differ from each other in the last bits. */
typedef enum ddt_cuda_mm_mode { DDT_CUDA_MM_FP32 = 0, DDT_CUDA_MM_TENSOR = 1 } ddt_cuda_mm_mode;

/* Whether a kernel (a kernel node's function) does work before its grid
 * wait (DDT_GRID_DEP_LATER: the x W products load their first weights there),
 * i.e. whether a programmatic edge into it can overlap anything but its launch
 * (the engine's DDT_PDL_EDGES_PRODUCTS).  By the kernel's name: every instance
 * of the product kernel. */
bool ddt_cuda_kernel_waits_late(const void *func);

/* y[t][o] = sum_j x[t][j] * w[o][j]: x [n][w->cols] (row stride ldx), y [n][w->rows]
 * (row stride ldy), device pointers; y must not alias x.  n >= 1. */
ddt_status ddt_cuda_matmul(const ddt_qweight *w, const float *x, int64_t ldx, int32_t n, float *y,
                           int64_t ldy, ddt_cuda_stream stream, ddt_error *err);

/* y[t][g*y_stride + o] = sum_{j < w->cols} x[t][g*x_stride + j] * w[g*w_row_stride + w_row_offset + o][j] */
ddt_status ddt_cuda_matmul_grouped(const ddt_qweight *w, const ddt_row_groups *g, const float *x,
                                   int64_t ldx, int32_t n, float *y, int64_t ldy,
                                   ddt_cuda_stream stream, ddt_error *err);

/* The same with the computation chosen by mode (the two above are DDT_CUDA_MM_FP32).
 * workspace: device memory, 16-byte aligned, overlapping neither x nor y, of at
 * least ddt_cuda_matmul_workspace_bytes(w->cols, groups, n) bytes, needed only
 * when the product takes the tensor-core path (NULL / 0 otherwise; a tensor-path
 * product with too little is DDT_ERR_RANGE); its contents on return are
 * unspecified.  Products on one stream may share one workspace. */
ddt_status ddt_cuda_matmul_mode(const ddt_qweight *w, ddt_cuda_mm_mode mode, const float *x, int64_t ldx, int32_t n,
                                float *y, int64_t ldy, void *workspace, size_t workspace_bytes,
                                ddt_cuda_stream stream, ddt_error *err);
ddt_status ddt_cuda_matmul_grouped_mode(const ddt_qweight *w, ddt_cuda_mm_mode mode, const ddt_row_groups *g,
                                        const float *x, int64_t ldx, int32_t n, float *y, int64_t ldy,
                                        void *workspace, size_t workspace_bytes, ddt_cuda_stream stream,
                                        ddt_error *err);
/* The same with the FP32 path's warp shape given: each warp computes warp_rows
 * (1, 2 or 4) weight rows for warp_tokens (1, 2 or 4) tokens; 0 and 0 let the
 * library choose (what the two above do).  The results are bitwise the same for
 * every shape (the contract above); benchmarks and tests use this to measure
 * and check that.  The tensor-core path ignores the shape (and needs the
 * workspace, as above). */
ddt_status ddt_cuda_matmul_grouped_shape(const ddt_qweight *w, ddt_cuda_mm_mode mode, const ddt_row_groups *g,
                                         const float *x, int64_t ldx, int32_t n, float *y, int64_t ldy,
                                         int32_t warp_rows, int32_t warp_tokens, void *workspace,
                                         size_t workspace_bytes, ddt_cuda_stream stream, ddt_error *err);
/* Workspace bytes of a tensor-path product of up to max_tokens tokens over
 * `count` groups of `cols` activations each (the activations split into bf16 hi
 * and lo, rows padded to whole 32-column units): max_tokens * count *
 * ceil(cols / 32) * 128, the fp32 activations' bytes up to the padding.  0 for
 * arguments below 1.  Allocate it at load, sized for the largest product. */
size_t ddt_cuda_matmul_workspace_bytes(int64_t cols, int32_t count, int32_t max_tokens);

/* A gated MLP's SiLU and down projection (issue 13):
 *   y[t][o] = sum_j a[t][j] * w[o][j],  a[t][j] = silu(gate[t][j]) * up[t][j], j < w->cols
 * gate, up: [n][w->cols] (row strides ldg, ldu), y: [n][w->rows] (row stride ldy);
 * y must not alias gate or up.  y is bitwise ddt_cuda_silu_mul(gate, up) then
 * ddt_cuda_matmul_mode(w, gate) in every case.  One launch on the FP32 path at
 * n <= DDT_CUDA_SILU_FUSE_MAX_N (the activation computed in the product's load
 * with ddt_cuda_silu_mul's expression, silu_dev.cuh; gate left as it was); else
 * (more tokens, or the tensor-core path) those two steps, the SiLU written
 * over gate's first w->cols columns: callers hand gate over as scratch.  The
 * tensor-core path (silu_mul, the activation split, the product: three
 * launches) needs a workspace as ddt_cuda_matmul_mode does, of
 * ddt_cuda_matmul_workspace_bytes(w->cols, 1, n) bytes, checked before gate is
 * touched; NULL / 0 otherwise.  ddt_cuda_matmul_silu is the FP32 path. */
#define DDT_CUDA_SILU_FUSE_MAX_N 2
ddt_status ddt_cuda_matmul_silu(const ddt_qweight *w, float *gate, int64_t ldg, const float *up, int64_t ldu,
                                int32_t n, float *y, int64_t ldy, ddt_cuda_stream stream, ddt_error *err);
ddt_status ddt_cuda_matmul_silu_mode(const ddt_qweight *w, ddt_cuda_mm_mode mode, float *gate, int64_t ldg,
                                     const float *up, int64_t ldu, int32_t n, float *y, int64_t ldy,
                                     void *workspace, size_t workspace_bytes, ddt_cuda_stream stream,
                                     ddt_error *err);

/* The transposed product y = x W (MLA's q_lat = q_nope W_UK):
 * y[t][g*y_stride + j] = sum_{i < rows} x[t][g*x_stride + i] * w[g*w_row_stride + w_row_offset + i][j],
 * j < w->cols, summed over i in increasing order. */
ddt_status ddt_cuda_matmul_t_grouped(const ddt_qweight *w, const ddt_row_groups *g, const float *x,
                                     int64_t ldx, int32_t n, float *y, int64_t ldy,
                                     ddt_cuda_stream stream, ddt_error *err);

/* A weight for the transposed product on the x W^T paths: *out = a new device
 * weight of the same format, [count * w->cols] rows x [g->rows] columns, whose
 * group k block is the transpose of w's group k rows (out[k*cols + j][i] =
 * w[k*w_row_stride + w_row_offset + i][j]), so that ddt_cuda_matmul_grouped_mode
 * over it with groups {count, w->cols, 0, w->cols} computes what
 * ddt_cuda_matmul_t_grouped computes over w (in the x W^T path's arithmetic
 * order).  Dense F32 / BF16 / F16, and FP8 blocks when the groups lie on whole
 * blocks (the scale grid transposes with them); anything else is
 * DDT_ERR_UNSUPPORTED (ddt_cuda_qweight_transpose_ok says so beforehand).  Load
 * time: allocates and synchronises; free with ddt_cuda_qweight_free. */
bool ddt_cuda_qweight_transpose_ok(const ddt_qweight *w, const ddt_row_groups *g);
ddt_status ddt_cuda_qweight_transpose_groups(const ddt_qweight *w, const ddt_row_groups *g, ddt_qweight *out,
                                             ddt_error *err);

/* A weight whose rows are those of parts[0], then parts[1], ... (count of them,
 * count >= 1): *out = new device memory, [sum of rows] x cols, so that one
 * product over it computes what the products over the parts compute, side by
 * side in y's columns.  The parts must share format, dtype, cols and block /
 * group.  Dense F32 / BF16 / F16 and INT4 (per-row scales) concatenate as they
 * are; FP8 blocks only when every part but the last has rows % block == 0 (the
 * scale grids then stack); anything else is DDT_ERR_UNSUPPORTED
 * (ddt_cuda_qweight_concat_ok says so beforehand).  When any part carries the
 * tensor-core layout, the result is packed too (ddt_cuda_qweight_pack).
 * On the FP32 path the concatenation's products are bitwise those of the parts
 * (an element's order depends only on cols); on the tensor-core path the
 * k-split is picked from the row count, so they may differ in rounding.
 * Load time: allocates and synchronises; free with ddt_cuda_qweight_free. */
bool ddt_cuda_qweight_concat_ok(const ddt_qweight *const *parts, int32_t count);
ddt_status ddt_cuda_qweight_concat_rows(const ddt_qweight *const *parts, int32_t count, ddt_qweight *out,
                                        ddt_error *err);

/* out = the rows of a and b interleaved (a0, b0, a1, b1, ...): the gate and up
 * projections of a gated MLP as ddt_cuda_matmul_swiglu takes them.  a and b must
 * share rows, cols, format, dtype and group: dense F32 / BF16 / F16 and INT4
 * (per-row scales); FP8 is DDT_ERR_UNSUPPORTED (a scale block spans 128 rows of
 * one weight; ddt_cuda_qweight_interleave_ok says so beforehand).  a and b are
 * kept.  Load time: allocates and synchronises; free with ddt_cuda_qweight_free. */
bool ddt_cuda_qweight_interleave_ok(const ddt_qweight *a, const ddt_qweight *b);
ddt_status ddt_cuda_qweight_interleave_rows(const ddt_qweight *a, const ddt_qweight *b, ddt_qweight *out,
                                            ddt_error *err);

/*
 * A gated MLP's first half in one launch (FP32 path): w's rows [0, pair_from)
 * are plain rows (a router's, say), written to y's columns [0, pair_from) as
 * ddt_cuda_matmul writes them; rows from pair_from on are (gate, up) pairs
 * (ddt_cuda_qweight_interleave_rows), pair i written as silu(gate) * up to
 * column pair_from + i.  Bitwise ddt_cuda_matmul over the un-interleaved rows
 * then ddt_cuda_silu_mul (the product's elements do not depend on the warp
 * shape, the SiLU is silu_dev.cuh's), and so also what ddt_cuda_matmul_silu's
 * gated load computes; the down product then reads y as a plain input.
 * pair_from even, rows - pair_from even and > 0.  warp_rows / warp_tokens force
 * the warp shape (2 or 4 rows: a pair stays in one warp; 1, 2 or 4 tokens), both
 * 0 to choose.
 */
ddt_status ddt_cuda_matmul_swiglu(const ddt_qweight *w, int64_t pair_from, const float *x, int64_t ldx, int32_t n,
                                  float *y, int64_t ldy, ddt_cuda_stream stream, ddt_error *err);
ddt_status ddt_cuda_matmul_swiglu_shape(const ddt_qweight *w, int64_t pair_from, const float *x, int64_t ldx,
                                        int32_t n, float *y, int64_t ldy, int32_t warp_rows, int32_t warp_tokens,
                                        ddt_cuda_stream stream, ddt_error *err);

/* Projections of one input made one product where the format allows: when the
 * parts concatenate (ddt_cuda_qweight_concat_ok), *out = their stacked copy
 * (ddt_cuda_qweight_concat_rows) and every part is freed; when they do not,
 * *out stays empty and the parts are kept, for separate products.  Load time. */
ddt_status ddt_cuda_qweight_stack_rows(ddt_qweight *const *parts, int32_t count, ddt_qweight *out, ddt_error *err);

/* Embedding gather: out[t][0..cols) = dequantised row ids[t] of w (ids is a
 * device array of n ids, each checked against rows: an id out of range writes
 * NaN to its row).  out row stride ldo.  The engine's forwards start with
 * ddt_cuda_embed_rmsnorm instead; this plain gather stays the general op (a
 * forward without a first norm) and that one's reference in the tests. */
ddt_status ddt_cuda_embed(const ddt_qweight *w, const int32_t *ids, int32_t n, float *out, int64_t ldo,
                          ddt_cuda_stream stream, ddt_error *err);

/* The gather and the first layer's input norm in one launch (a model's forward
 * starts with both; one launch fewer per forward): x[t][0..cols) = the embedding of
 * id t as ddt_cuda_embed stores it (NaN rows for ids out of range), and xn[t] =
 * rmsnorm(x[t]) * norm_w with eps, the bits ddt_cuda_rmsnorm(x, ldx, n, cols,
 * norm_w, eps, xn, ldxn) stores after that gather (same block size, same summation
 * path for the same pointers and strides).  first_id (device, NULL: none) replaces
 * ids[0] for row 0, so a caller whose first token changes every call (the drafter's
 * bonus) needs no copy into ids.  Row strides ldx, ldxn >= cols; xn is x itself or
 * does not overlap it. */
ddt_status ddt_cuda_embed_rmsnorm(const ddt_qweight *w, const int32_t *ids, const int32_t *first_id, int32_t n,
                                  float *x, int64_t ldx, const float *norm_w, float eps, float *xn, int64_t ldxn,
                                  ddt_cuda_stream stream, ddt_error *err);

/* ddt_cuda_embed_rmsnorm that also writes xn's split planes (sp, as
 * ddt_cuda_add_rmsnorm_split's; NULL or sp->hi NULL: none). */
ddt_status ddt_cuda_embed_rmsnorm_split(const ddt_qweight *w, const int32_t *ids, const int32_t *first_id, int32_t n,
                                        float *x, int64_t ldx, const float *norm_w, float eps, float *xn, int64_t ldxn,
                                        const ddt_cuda_split_planes *sp, ddt_cuda_stream stream, ddt_error *err);

/* The split planes the tensor-core product of w at mode reads for n tokens
 * (count-1 groups), inside workspace: true and *out set when that product takes
 * pre-split activations (ddt_cuda_matmul_presplit: the wgmma path, dense bf16),
 * false (and *out zero) otherwise, or when the workspace is missing or short.  A
 * property of the weight, the mode and n only. */
bool ddt_cuda_matmul_split_planes(const ddt_qweight *w, ddt_cuda_mm_mode mode, int32_t n, void *workspace,
                                  size_t workspace_bytes, ddt_cuda_split_planes *out);

/* y = x W^T with x already in the split planes ddt_cuda_matmul_split_planes gave
 * for (w, mode, n, workspace): the product ddt_cuda_matmul_mode runs, without its
 * split launch, so bitwise its result when a producer wrote the planes (x is not
 * read).  DDT_ERR_UNSUPPORTED where ddt_cuda_matmul_split_planes is false. */
ddt_status ddt_cuda_matmul_presplit(const ddt_qweight *w, ddt_cuda_mm_mode mode, int32_t n, float *y, int64_t ldy,
                                    void *workspace, size_t workspace_bytes, ddt_cuda_stream stream, ddt_error *err);

/* Does w's product at mode write the next product's split planes in its epilogue
 * and read pre-split grouped activations (the wgmma path: tensor-core mode, dense
 * bf16)?  A property of the weight and the mode only. */
bool ddt_cuda_matmul_writes_next(const ddt_qweight *w, ddt_cuda_mm_mode mode);

/* ddt_cuda_matmul_split_planes for a grouped product of `count` groups (plane row
 * g * n + t): where ddt_cuda_matmul_grouped_next with x NULL reads them. */
bool ddt_cuda_matmul_split_planes_grouped(const ddt_qweight *w, ddt_cuda_mm_mode mode, int32_t count, int32_t n,
                                          void *workspace, size_t workspace_bytes, ddt_cuda_split_planes *out);

/* The grouped product of ddt_cuda_matmul_grouped_mode, bitwise, with two options
 * for the wgmma path (ddt_cuda_matmul_writes_next; DDT_ERR_UNSUPPORTED elsewhere):
 * x NULL: its activations are already split in the workspace
 * (ddt_cuda_matmul_split_planes_grouped, written by their producer: no split
 * launch); next non-NULL: the epilogue also writes each output value's split
 * where the next product reads it (cuda_types.h), so that product may run with x
 * NULL in its own workspace.  x given and next NULL is ddt_cuda_matmul_grouped_mode. */
ddt_status ddt_cuda_matmul_grouped_next(const ddt_qweight *w, ddt_cuda_mm_mode mode, const ddt_row_groups *g,
                                        const float *x, int64_t ldx, int32_t n, float *y, int64_t ldy,
                                        void *workspace, size_t workspace_bytes, const ddt_cuda_next_planes *next,
                                        ddt_cuda_stream stream, ddt_error *err);

/* Tests and benchmarks: a device weight of the given format and shape filled on the
 * device with hash-random values (dense: uniform in [-amp, amp); FP8: random
 * non-NaN bytes with scales in [amp/2, amp); INT4: random nibbles with bf16
 * scales in [amp, 2 amp)), so multi-GB layers need no host copy.  F32 / BF16 /
 * FP8 / INT4 (group 32, block 128).  Free with ddt_cuda_qweight_free.  Syncs. */
ddt_status ddt_cuda_qweight_random(ddt_qformat format, ddt_dtype dtype, int64_t rows, int64_t cols, float amp,
                                   uint64_t seed, ddt_qweight *dev, ddt_error *err);
/* dev[0..n) = hash-uniform values in [lo, hi) (deterministic in seed and index). */
ddt_status ddt_cuda_fill_uniform(float *dev, int64_t n, float lo, float hi, uint64_t seed, ddt_cuda_stream stream,
                                 ddt_error *err);

#ifdef __cplusplus
}
#endif
#endif
