/*
 * qmatmul_cuda.cu — quantised matrix products on the GPU (see qmatmul_cuda.h).
 *
 * x W^T: one warp per R = 4 consecutive output rows of a group and TB tokens (the
 * token blocks are spread over warps, not looped), with U chunks of loads in
 * flight per row; the per-element
 * order is fixed by qmatmul_dev.cuh, so the choice of TB and U (by n) changes
 * speed only.  Holding 4 rows per warp lets each x
 * value loaded from L1 feed 4 weight rows (the activations are read far more
 * often than the weights, and L1 bandwidth is the next wall after DRAM).
 *
 * x W^T with gated activations (ddt_cuda_matmul_silu): the same kernel with
 * GATED = true, whose activation load computes silu(g) * u from the gate and up
 * rows (qmatmul_dev.cuh), so a gated MLP's SiLU and down projection are one
 * launch, bitwise the two.
 *
 * x W^T on tensor cores (DDT_CUDA_MM_TENSOR): wstream.cuh's weight-streaming
 * kernel over the packed copy ddt_cuda_qweight_pack makes at load, one block per
 * (token block of up to 64, k-split, 16*MT rows, group); n picks the n-tile count
 * NT, which changes the work split only.  A pre-pass (ws_presplit_kernel) splits
 * the activations into bf16 hi / lo once per product, into the caller's
 * workspace, instead of every row block splitting them again.
 *
 * x W: one thread per output column (coalesced weight rows), 4 tokens per thread,
 * summing rows in increasing order from 0.0f with the CPU's dequantised values:
 * the same operations as ddt_cpu_matmul_t_grouped, so results are bit-identical
 * to the CPU; batches of weight loads in flight and x staged in shared memory
 * (see mt_kernel) change the speed only.
 *
 * Embedding: embed_kernel gathers dequantised rows; embed_rmsnorm_kernel does the
 * same gather and the first layer's norm (norm_dev.cuh's norm_row, the rmsnorm
 * kernel's arithmetic) in one launch, bitwise the two launches.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/mla_cuda.h"
#include "backend/cuda/mla_rope_dev.cuh"
#include "backend/cuda/nn_cuda.h"
#include "backend/cuda/norm_dev.cuh"
#include "backend/cuda/qmatmul_cuda.h"
#include "backend/cuda/wgmma_gemm.h"
#include "backend/cuda/qmatmul_dev.cuh"
#include "backend/cuda/wstream.cuh"

#define MM_WARPS 4 /* warps per block of the x W^T kernel */

/* ------------------------------------------------------------------ sizes */

static uint64_t data_bytes(const ddt_qweight *w) {
    const uint64_t r = (uint64_t)w->rows, c = (uint64_t)w->cols;
    switch (w->format) {
    case DDT_Q_DENSE: return r * c * (w->dtype == DDT_DTYPE_F32 ? 4u : 2u);
    case DDT_Q_FP8_BLOCK: return r * c;
    case DDT_Q_INT4_GROUP: return r * ((c + 7) / 8) * 4;
    }
    return 0;
}

static uint64_t scale_bytes(const ddt_qweight *w) {
    const uint64_t r = (uint64_t)w->rows, c = (uint64_t)w->cols;
    switch (w->format) {
    case DDT_Q_DENSE: return 0;
    case DDT_Q_FP8_BLOCK: return ((r + w->block - 1) / w->block) * ((c + w->block - 1) / w->block) * 4;
    case DDT_Q_INT4_GROUP: return r * ((c + w->group - 1) / w->group) * 2;
    }
    return 0;
}

extern "C" uint64_t ddt_cuda_qweight_bytes(const ddt_qweight *w) { return data_bytes(w) + scale_bytes(w); }

/* The dense dtypes the kernels read (qfmt_of maps these; anything else is refused). */
static bool dense_dtype_ok(ddt_dtype t) { return t == DDT_DTYPE_F32 || t == DDT_DTYPE_BF16 || t == DDT_DTYPE_F16; }

static ddt_status check_weight(const ddt_qweight *w, const char *what, ddt_error *err) {
    if (!w || !w->data) return ddt_fail(err, DDT_ERR_INVALID, "%s: no weight data", what);
    if (w->rows < 1 || w->cols < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "%s: weight shape [%lld, %lld]", what, (long long)w->rows,
                        (long long)w->cols);
    switch (w->format) {
    case DDT_Q_DENSE:
        if (!dense_dtype_ok(w->dtype))
            return ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s: dense weight of dtype %d", what, (int)w->dtype);
        return DDT_OK;
    case DDT_Q_FP8_BLOCK:
        if (w->block < 16 || w->block % 16 != 0 || !w->scale_inv)
            return ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s: FP8 block %d (a multiple of 16 with scales needed)", what,
                            w->block);
        return DDT_OK;
    case DDT_Q_INT4_GROUP:
        if (w->group < 1 || !w->scale)
            return ddt_fail(err, DDT_ERR_INVALID, "%s: INT4 group %d without scales", what, w->group);
        return DDT_OK;
    }
    return ddt_fail(err, DDT_ERR_INVALID, "%s: unknown weight format %d", what, (int)w->format);
}

/* ------------------------------------------------------------------ upload */

extern "C" ddt_status ddt_cuda_qweight_upload(const ddt_qweight *host, ddt_qweight *dev, ddt_error *err) {
    ddt_status st = check_weight(host, "qweight_upload", err);
    if (st != DDT_OK) return st;
    ddt_qweight d = *host;
    d.mma = NULL; /* packing is a separate step (ddt_cuda_qweight_pack) */
    d.mma_scale = NULL;
    void *data = NULL, *scale = NULL;
    const uint64_t db = data_bytes(host), sb = scale_bytes(host);
    DDT_CUDA_TRY(cudaMalloc(&data, db), err);
    cudaError_t e = cudaMemcpy(data, host->data, db, cudaMemcpyHostToDevice);
    if (e == cudaSuccess && sb > 0) {
        e = cudaMalloc(&scale, sb);
        if (e == cudaSuccess)
            e = cudaMemcpy(scale, host->format == DDT_Q_FP8_BLOCK ? (const void *)host->scale_inv
                                                                   : (const void *)host->scale,
                           sb, cudaMemcpyHostToDevice);
    }
    if (e != cudaSuccess) {
        cudaFree(data);
        if (scale) cudaFree(scale);
        return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: qweight_upload of %llu + %llu bytes: %s",
                        (unsigned long long)db, (unsigned long long)sb, cudaGetErrorString(e));
    }
    d.data = data;
    d.scale_inv = host->format == DDT_Q_FP8_BLOCK ? (const float *)scale : NULL;
    d.scale = host->format == DDT_Q_INT4_GROUP ? (const uint16_t *)scale : NULL;
    *dev = d;
    return DDT_OK;
}

extern "C" void ddt_cuda_qweight_free(ddt_qweight *dev) {
    if (!dev) return;
    if (dev->data) cudaFree((void *)dev->data);
    if (dev->scale_inv) cudaFree((void *)dev->scale_inv);
    if (dev->scale) cudaFree((void *)dev->scale);
    if (dev->mma) cudaFree((void *)dev->mma);
    if (dev->mma_scale) cudaFree((void *)dev->mma_scale);
    dev->mma = NULL;
    dev->mma_scale = NULL;
    dev->data = NULL;
    dev->scale_inv = NULL;
    dev->scale = NULL;
}

static float host_f16(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, ex = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    uint32_t bits;
    if (ex == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (ex != 0) {
        bits = sign | ((ex - 15 + 127) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int32_t e = -14;
        uint32_t m = man;
        while (!(m & 0x400u)) m <<= 1, e--;
        bits = sign | ((uint32_t)(e + 127) << 23) | ((m & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

extern "C" ddt_status ddt_cuda_vec_upload(const void *data, ddt_dtype dtype, int64_t n, float **dev, ddt_error *err) {
    if (!data || n < 1 || !dev) return ddt_fail(err, DDT_ERR_INVALID, "vec_upload: no data or %lld elements", (long long)n);
    if (dtype != DDT_DTYPE_F32 && dtype != DDT_DTYPE_BF16 && dtype != DDT_DTYPE_F16)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "vec_upload: dtype %d is not a float vector", (int)dtype);
    float *tmp = (float *)malloc((size_t)n * sizeof(float));
    if (!tmp) return ddt_fail(err, DDT_ERR_NOMEM, "vec_upload: %lld floats", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        if (dtype == DDT_DTYPE_F32) {
            tmp[i] = ((const float *)data)[i];
        } else if (dtype == DDT_DTYPE_BF16) {
            uint32_t b = (uint32_t)((const uint16_t *)data)[i] << 16;
            memcpy(&tmp[i], &b, sizeof b);
        } else {
            tmp[i] = host_f16(((const uint16_t *)data)[i]);
        }
    }
    float *d = NULL;
    cudaError_t e = cudaMalloc((void **)&d, (size_t)n * sizeof(float));
    if (e == cudaSuccess) e = cudaMemcpy(d, tmp, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
    free(tmp);
    if (e != cudaSuccess) {
        if (d) cudaFree(d);
        return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: vec_upload of %lld floats: %s", (long long)n,
                        cudaGetErrorString(e));
    }
    *dev = d;
    return DDT_OK;
}

extern "C" void ddt_cuda_free(void *dev) {
    if (dev) cudaFree(dev);
}

/* ------------------------------------------------------------------ y = x W^T */

struct MMArgs {
    QView W;
    int64_t w_row_stride, w_row_offset, rows;
    int32_t count;
    const float *x; /* GATED: the gate rows */
    int64_t ldx, x_stride;
    const float *u; /* GATED: the up rows (row stride ldu, groups at x_stride); else unused */
    int64_t ldu;
    int32_t n;
    float *y;
    int64_t ldy, y_stride;
    bool xvec;
    /* >= 0 (ddt_cuda_matmul_swiglu): rows from pair_from on are (gate, up) pairs,
       written as one silu(gate) * up at column pair_from + (row - pair_from) / 2;
       -1: every row written as it is */
    int64_t pair_from;
    /* qd > 0 (ddt_cuda_matmul_rope): heads of qd rows, rows nope.. of each in rope
       pairs, rotated at token t's position (mla_rope_dev.cuh); 0: off */
    struct {
        const int32_t *len, *depth;
        const float *cos_t, *sin_t;
        int32_t max_pos, capacity, qd, nope, half;
    } rope;
};

/* One warp per (R-row block, TB-token block); the token block is the fastest
 * index, so the warps that read the same weight rows run side by side and share
 * those lines in L2/L1 instead of re-reading them from DRAM.  R and TB only say
 * which warp computes an output: every (row, token) is the same lane sums and the
 * same butterfly for any R, TB or U (warp_dot), so the choice may follow n.
 * GATED: activation j is silu(x[j]) * u[j] (ddt_cuda_matmul_silu).  Every warp
 * computes the SiLU of the activations it reads, i.e. rows / R times per element
 * instead of once: ALU work the launch it saves pays for while the products are
 * small (the drafter, a decode step); measure before using it on large n. */
/* The output side of mm_kernel: every row as it is (the plain products, whose
 * code stays free of the others' branches: a richer epilogue in every instance
 * cost the H200 27-75% on the plain 4-token products), silu(gate) * up of row
 * pairs (ddt_cuda_matmul_swiglu) or MLA's query rope (ddt_cuda_matmul_rope). */
enum { MM_EPI_PLAIN = 0, MM_EPI_SWIGLU = 1, MM_EPI_ROPE = 2 };

template <int F, int R, int TB, int U, bool GATED, int EPI>
static __global__ void __launch_bounds__(MM_WARPS * 32) mm_kernel(const MMArgs a) {
    /* griddepcontrol.wait inside warp_dot_act (PRE), after the first weight loads:
       a warp that leaves here reads and writes nothing */
    DDT_GRID_DEP_LATER();
    const int lane = threadIdx.x & 31;
    const int64_t rblocks = (a.rows + R - 1) / R;
    const int64_t tblocks = (a.n + TB - 1) / TB;
    const int64_t wid = (int64_t)blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (wid >= rblocks * a.count * tblocks) return; /* whole warp leaves together */
    const int64_t rb = wid / tblocks;
    const int32_t t0 = (int32_t)(wid % tblocks) * TB;
    const int64_t g = rb / rblocks, o0 = (rb % rblocks) * R;
    int64_t row[R];
    const uint8_t *wd[R];
    const void *ws[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        wd[r] = a.W.data;
        ws[r] = a.W.scale;
        const int64_t o = o0 + r < a.rows ? o0 + r : a.rows - 1; /* spare rows recompute the last one */
        row[r] = g * a.w_row_stride + a.w_row_offset + o;
    }
    const int ntok = a.n - t0 < TB ? a.n - t0 : TB;
    const float *xr[TB], *ur[TB];
#pragma unroll
    for (int t = 0; t < TB; t++) {
        const int64_t tok = t0 + (t < ntok ? t : 0);
        xr[t] = a.x + tok * a.ldx + g * a.x_stride;
        ur[t] = GATED ? a.u + tok * a.ldu + g * a.x_stride : xr[t];
    }
    float out[R][TB];
    warp_dot_act<F, R, TB, U, GATED, true>(a.W, wd, ws, row, xr, ur, ntok, a.xvec, out);
    if constexpr (EPI == MM_EPI_PLAIN) {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < TB; t++)
                if (lane == r * TB + t && o0 + r < a.rows && t < ntok)
                    a.y[(int64_t)(t0 + t) * a.ldy + g * a.y_stride + o0 + r] = out[r][t];
    } else {
        /* lane r * TB + t writes output (r, t); the butterfly left every output in
           every lane, so the lane also holds its pair's second row r + 1 (R even,
           o0 and the pairs' first rows even: the launchers' conditions).  The
           values are picked by constant indices, then one copy of the epilogue runs. */
        float v0 = 0.0f, v1 = 0.0f;
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < TB; t++)
                if (lane == r * TB + t) {
                    v0 = out[r][t];
                    v1 = out[r + 1 < R ? r + 1 : r][t];
                }
        const int r = lane / TB, t = lane % TB;
        if (lane >= R * TB || o0 + r >= a.rows || t >= ntok) return;
        float *yr = a.y + (int64_t)(t0 + t) * a.ldy + g * a.y_stride;
        const int64_t o = o0 + r;
        if constexpr (EPI == MM_EPI_SWIGLU) {
            if (o < a.pair_from) yr[o] = v0;
            else if (((o - a.pair_from) & 1) == 0)
                /* a gate row and its up row: silu_dev.cuh's arithmetic, as
                   silu_mul and the gated load compute it */
                yr[a.pair_from + (o - a.pair_from) / 2] = silu_mul1(v0, v1);
        } else {
            const int64_t j = o % a.rope.qd;
            if (j < a.rope.nope) {
                yr[o] = v0;
            } else if (((j - a.rope.nope) & 1) == 0) {
                /* (v0, v1): a rope pair, rotated and de-interleaved as rope_write does */
                const int64_t p = (j - a.rope.nope) / 2, h0 = o - j + a.rope.nope;
                int pos, crow;
                bool bad;
                if (!mla_rope_where(a.rope.len, a.rope.depth, t0 + t, a.rope.max_pos, a.rope.capacity, &pos, &crow,
                                    &bad)) {
                    yr[o] = v0; /* rope_write leaves such a token's queries as they are */
                    yr[o + 1] = v1;
                } else {
                    const int64_t te = (int64_t)(bad ? 0 : pos) * a.rope.half + p;
                    float r0, r1;
                    mla_rope_rotate(v0, v1, a.rope.cos_t[te], a.rope.sin_t[te], r0, r1);
                    yr[h0 + p] = bad ? NAN : r0;
                    yr[h0 + p + a.rope.half] = bad ? NAN : r1;
                }
            }
        }
    }
}

extern "C" bool ddt_cuda_kernel_waits_late(const void *func) {
    const char *name = NULL;
    if (!func || cudaFuncGetName(&name, func) != cudaSuccess || !name) {
        cudaGetLastError(); /* a function that is no kernel of ours: not late */
        return false;
    }
    /* mm_kernel's instances, mangled (_Z9mm_kernelI...) or not, the wgmma product
       (wgmma_gemm.cu's wg_gemm_kernel), the MLA verify attention (mla_verify_cuda.cu's
       mla_attn_kernel: its first prefix blocks) and the wgmma experts' down launch
       (wgmma_experts.cuh's wx_kernel<WX_DOWN = 1, F>: its first weight stages, then flags) */
    return strstr(name, "mm_kernel") != NULL || strstr(name, "wg_gemm_kernel") != NULL ||
           strstr(name, "mla_attn_kernel") != NULL || strstr(name, "wx_kernelILi1E") != NULL ||
           strstr(name, "wx_kernel<1,") != NULL;
}

static int64_t mm_warps(const MMArgs &a, int R, int TB) {
    return (a.rows + R - 1) / R * a.count * ((a.n + TB - 1) / TB);
}

template <int F, int R, int TB, int U, bool GATED, int EPI>
static void mm_launch_shape(const MMArgs &a, cudaStream_t s) {
    const unsigned blocks = (unsigned)((mm_warps(a, R, TB) + MM_WARPS - 1) / MM_WARPS);
    mm_kernel<F, R, TB, U, GATED, EPI><<<blocks, MM_WARPS * 32, 0, s>>>(a);
}

/* The warp shape for a product.  These products are latency bound at the few
 * tokens of a round (cuda_bench_mm: 2-25 us for 0.1-2 MB), and three things set
 * the time: the bytes the warps pull through L2 / L1 (each warp reads its R
 * weight rows and its TB activation rows, so x is re-read rows / R times and W
 * n / TB times), each warp's dependent chain (R x TB outputs x its chunks per
 * lane), and the number of warps.  The cost below weighs them as fitted to
 * cuda_bench_mm's table of every shape at the shipped pair's products and n = 1,
 * 16, 65 on the H200 (0.3 us per MB, 0.5 per chain step, 2 per 1000 warps; its
 * picks are within 0.5% of the best shape summed over the table, the old fixed
 * R = 4 and TB by n 14% over).  A choice that follows n is safe: the arithmetic
 * does not depend on the shape (warp_dot).  The gated products run at
 * n <= DDT_CUDA_SILU_FUSE_MAX_N only, with TB = 1. */
static void mm_choose(const MMArgs &a, bool gated, int *R, int *TB) {
    double best = 0;
    const int64_t kc = (a.W.nchunks + 31) / 32; /* chunks a lane sums */
    for (int r = 4; r >= 1; r /= 2)
        for (int tb = 1; tb <= 4; tb *= 2) {
            if ((a.pair_from >= 0 || a.rope.qd > 0) && r == 1) continue; /* a pair in one warp */
            if (tb > 1 && tb / 2 >= a.n) continue; /* a wider token block than n does nothing */
            if (gated && tb > 1) continue;
            const double rb = (double)((a.rows + r - 1) / r) * a.count, tbl = (double)((a.n + tb - 1) / tb);
            const double mb = (rb * a.n * (double)a.W.cols * 4.0 + tbl * (double)a.rows * a.count * (double)a.W.row_bytes) / 1e6;
            const double chain = (double)r * (tb < a.n ? tb : a.n) * (double)kc;
            const double cost = 0.3 * mb + 0.5 * chain + 2.0 * rb * tbl / 1000.0;
            if (best == 0 || cost < best) best = cost, *R = r, *TB = tb;
        }
}

template <int F, int R, bool GATED, int EPI>
static void mm_launch_r(const MMArgs &a, int TB, cudaStream_t s) {
    /* fewer tokens per warp leave registers for more loads in flight; the gated
       products have TB = 1 only (mm_choose never picks more for them) */
    if constexpr (GATED) {
        mm_launch_shape<F, R, 1, 4, true, MM_EPI_PLAIN>(a, s);
    } else {
        if (TB == 1) mm_launch_shape<F, R, 1, 4, false, EPI>(a, s);
        else if (TB == 2) mm_launch_shape<F, R, 2, 2, false, EPI>(a, s);
        else mm_launch_shape<F, R, 4, 1, false, EPI>(a, s);
    }
}

template <int F, bool GATED, int EPI>
static void mm_launch(const MMArgs &a, int R, int TB, cudaStream_t s) {
    if (R == 0) mm_choose(a, GATED, &R, &TB);
    if constexpr (EPI == MM_EPI_PLAIN) {
        if (R == 1) {
            mm_launch_r<F, 1, GATED, EPI>(a, TB, s);
            return;
        }
    }
    /* a pair epilogue has R = 2 or 4 (mm_choose and the shape checks) */
    if (R == 2) mm_launch_r<F, 2, GATED, EPI>(a, TB, s);
    else mm_launch_r<F, 4, GATED, EPI>(a, TB, s);
}

/* The FP32 path's launch for the weight's format (R, TB: the warp shape, 0 and
 * 0 to choose). */
template <bool GATED, int EPI = MM_EPI_PLAIN>
static void mm_dispatch(const ddt_qweight *w, MMArgs &a, int R, int TB, cudaStream_t s) {
    switch (qfmt_of(*w)) {
    case QF_F32: a.W = qview_make<QF_F32>(*w); mm_launch<QF_F32, GATED, EPI>(a, R, TB, s); break;
    case QF_BF16: a.W = qview_make<QF_BF16>(*w); mm_launch<QF_BF16, GATED, EPI>(a, R, TB, s); break;
    case QF_F16: a.W = qview_make<QF_F16>(*w); mm_launch<QF_F16, GATED, EPI>(a, R, TB, s); break;
    case QF_FP8: a.W = qview_make<QF_FP8>(*w); mm_launch<QF_FP8, GATED, EPI>(a, R, TB, s); break;
    case QF_INT4: a.W = qview_make<QF_INT4>(*w); mm_launch<QF_INT4, GATED, EPI>(a, R, TB, s); break;
    }
}

static ddt_status check_groups(const ddt_qweight *w, const ddt_row_groups *g, const char *what, ddt_error *err) {
    if (!g || g->count < 1 || g->rows < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "%s: empty group description", what);
    const int64_t last = (int64_t)(g->count - 1) * g->w_row_stride + g->w_row_offset + g->rows - 1;
    if (g->w_row_offset < 0 || g->w_row_stride < 0 || last >= w->rows)
        return ddt_fail(err, DDT_ERR_RANGE, "%s: groups reach weight row %lld of %lld", what, (long long)last,
                        (long long)w->rows);
    return DDT_OK;
}

/* The activation and output side of a grouped product (the FP32 path's MMArgs;
 * the tensor path reads its activations split, from the workspace). */
template <class A>
static void set_io(A &a, const ddt_row_groups *g, const float *x, int64_t ldx, int32_t n, float *y, int64_t ldy) {
    a.count = g->count;
    a.x = x;
    a.ldx = ldx;
    a.x_stride = g->x_stride;
    a.n = n;
    a.y = y;
    a.ldy = ldy;
    a.y_stride = g->y_stride;
    a.xvec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0 && g->x_stride % 4 == 0;
}

/* ------------------------------------------------------------------ tensor cores */

/* Can the tensor-core path take this weight?  (Otherwise the FP32 path runs: the
 * choice depends on the weight only, so it never breaks batch invariance.) */
extern "C" bool ddt_cuda_qweight_tc_eligible(const ddt_qweight *w) {
    const int F = qfmt_of(*w);
    if (F == QF_BF16) return true;
    if (F == QF_INT4) return w->group == 32 && w->cols % 32 == 0;
    return F == QF_FP8 && w->block % 32 == 0;
}

static int ws_unit_bytes(int F) { return F == QF_BF16 ? 1024 : F == QF_FP8 ? 512 : 256; }

/* Packed bytes of a weight (data, INT4 scales). */
static void ws_packed_bytes(const ddt_qweight *w, uint64_t *db, uint64_t *sb) {
    const uint64_t mtl = (uint64_t)(w->rows + 15) / 16, nu = (uint64_t)(w->cols + 31) / 32;
    const int F = qfmt_of(*w);
    *db = mtl * nu * (uint64_t)ws_unit_bytes(F);
    *sb = F == QF_INT4 ? mtl * nu * 32u : 0u;
}

/*
 * One thread per (m-tile, unit, lane): the lane's bytes of the unit in the order
 * wstream.cuh's header gives, from the row-major device weight.  A lane's 4
 * A-registers hold (row, first column) = (g, 4t), (g+8, 4t), (g, 4t+2), (g+8, 4t+2)
 * of each 16-column k-step, two consecutive columns each.
 */
static __global__ void ws_pack_kernel(const ddt_qweight w, int F, int64_t mtl, int64_t nu, uint8_t *out,
                                      uint8_t *sout) {
    DDT_GRID_DEP_WAIT();
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= mtl * nu * 32) return;
    const int lane = (int)(id & 31);
    const int64_t unit = id >> 5, mt = unit / nu, u = unit % nu;
    const int g = lane >> 2, t = lane & 3;
    const int64_t rr[4] = {mt * 16 + g, mt * 16 + g + 8, mt * 16 + g, mt * 16 + g + 8};
    const int cc[4] = {4 * t, 4 * t, 4 * t + 2, 4 * t + 2};
    auto bf16_of = [&](int64_t row, int64_t col) -> uint32_t { /* raw bf16 bits, 0 outside */
        if (row >= w.rows || col >= w.cols) return 0u;
        return (uint32_t)((const uint16_t *)w.data)[row * w.cols + col];
    };
    auto fp8_of = [&](int64_t row, int64_t col) -> uint32_t {
        if (row >= w.rows || col >= w.cols) return 0u; /* E4M3 0x00 = 0.0 */
        return (uint32_t)((const uint8_t *)w.data)[row * w.cols + col];
    };
    auto nib_of = [&](int64_t row, int64_t col) -> uint32_t { /* stored nibble (q + 8); 8 = value 0 outside */
        if (row >= w.rows || col >= w.cols) return 8u;
        const int64_t words = (w.cols + 7) / 8;
        return (((const uint32_t *)w.data)[row * words + (col >> 3)] >> (4 * (col & 7))) & 0xFu;
    };
    const int64_t c0 = u * 32;
    if (F == QF_BF16) {
        uint8_t *dst = out + unit * 1024;
        for (int j = 0; j < 2; j++) {
            uint32_t v[4];
            for (int r = 0; r < 4; r++) {
                const int64_t col = c0 + 16 * j + cc[r];
                v[r] = bf16_of(rr[r], col) | (bf16_of(rr[r], col + 1) << 16);
            }
            *(uint4 *)(dst + j * 512 + lane * 16) = make_uint4(v[0], v[1], v[2], v[3]);
        }
    } else if (F == QF_FP8) {
        uint32_t v[4];
        for (int j = 0; j < 2; j++)
            for (int r = 0; r < 4; r++) {
                const int64_t col = c0 + 16 * j + cc[r];
                const uint32_t pair = fp8_of(rr[r], col) | (fp8_of(rr[r], col + 1) << 8);
                const int byte = j * 8 + 2 * r; /* word byte/4, half (byte/2)&1 */
                if ((byte & 3) == 0) v[byte >> 2] = pair;
                else v[byte >> 2] |= pair << 16;
            }
        *(uint4 *)(out + unit * 512 + lane * 16) = make_uint4(v[0], v[1], v[2], v[3]);
    } else {
        uint32_t v[2];
        for (int j = 0; j < 2; j++) {
            uint32_t word = 0;
            for (int i = 0; i < 4; i++) {
                const int64_t col = c0 + 16 * j + cc[i];
                word |= nib_of(rr[i], col) << (4 * i);
                word |= nib_of(rr[i], col + 1) << (4 * (i + 4));
            }
            v[j] = word;
        }
        *(uint2 *)(out + unit * 256 + lane * 8) = make_uint2(v[0], v[1]);
        if (t == 0) {
            const int64_t groups = (w.cols + w.group - 1) / w.group;
            const uint32_t s0 = rr[0] < w.rows ? w.scale[rr[0] * groups + u] : 0u;
            const uint32_t s1 = rr[1] < w.rows ? w.scale[rr[1] * groups + u] : 0u;
            *(uint32_t *)(sout + unit * 32 + g * 4) = s0 | (s1 << 16);
        }
    }
}

/* Set on the current device before any launch (packing runs at load, before a
 * round is captured).  Instantiations are per file (static kernels). */
extern "C" ddt_status ddt_cuda_ws_prepare(ddt_error *err) {
    const cudaError_t e = ws_set_smem<WS_DENSE, 1, 2, 4, 8>(); /* the expert kinds: moe_cuda.cu */
    if (e != cudaSuccess)
        return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: tensor-core matmul shared memory attribute: %s",
                        cudaGetErrorString(e));
    return ddt_cuda_wg_prepare(err);
}

/* The packed copy of a weight check_weight has passed (ddt_cuda_qweight_pack_stream). */
static ddt_status pack_checked(ddt_qweight *w, ddt_error *err) {
    ddt_status st;
    if (w->mma) return DDT_OK; /* packed already */
    if (!ddt_cuda_qweight_tc_eligible(w)) return DDT_OK; /* this weight takes the FP32 path in every mode */
    if ((st = ddt_cuda_ws_prepare(err)) != DDT_OK) return st;
    uint64_t db, sb;
    ws_packed_bytes(w, &db, &sb);
    void *d = NULL, *s = NULL;
    DDT_CUDA_TRY(cudaMalloc(&d, db), err);
    if (sb > 0) {
        cudaError_t e = cudaMalloc(&s, sb);
        if (e != cudaSuccess) {
            cudaFree(d);
            return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: qweight_pack scales (%llu bytes): %s",
                            (unsigned long long)sb, cudaGetErrorString(e));
        }
    }
    const int64_t mtl = (w->rows + 15) / 16, nu = (w->cols + 31) / 32, threads = mtl * nu * 32;
    ws_pack_kernel<<<(unsigned)((threads + 255) / 256), 256>>>(*w, qfmt_of(*w), mtl, nu, (uint8_t *)d, (uint8_t *)s);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        cudaFree(d);
        if (s) cudaFree(s);
        return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: qweight_pack [%lld, %lld]: %s", (long long)w->rows,
                        (long long)w->cols, cudaGetErrorString(e));
    }
    w->mma = d;
    w->mma_scale = s;
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_qweight_pack(ddt_qweight *w, ddt_error *err) {
    ddt_status st = check_weight(w, "qweight_pack", err);
    if (st != DDT_OK) return st;
    /* the wgmma path streams the row-major data itself: no second copy (at K2.6 the
       attention projections and the LM head, ~18 GB a GPU) */
    if (!w->mma && ddt_cuda_wg_eligible(w)) return ddt_cuda_ws_prepare(err);
    return pack_checked(w, err);
}

extern "C" ddt_status ddt_cuda_qweight_pack_stream(ddt_qweight *w, ddt_error *err) {
    const ddt_status st = check_weight(w, "qweight_pack", err);
    return st != DDT_OK ? st : pack_checked(w, err);
}

extern "C" uint64_t ddt_cuda_qweight_packed_bytes(const ddt_qweight *w) {
    if (!w || !w->mma) return 0;
    uint64_t db, sb;
    ws_packed_bytes(w, &db, &sb);
    return db + sb;
}

/* k-splits of a dense product, from its shape alone: enough blocks of 64 rows to
 * cover the H200's 132 multiprocessors, each split at least 8 units long. */
static int32_t ws_ksplit(int64_t rows, int32_t count, int64_t nu) {
    const int64_t blocks = (rows + 63) / 64 * count;
    int32_t ks = 1;
    while (ks < 8 && blocks * ks < 132 && nu >= (int64_t)16 * ks) ks *= 2;
    return ks;
}

#define WS_SPLIT_THREADS 256

/* The tensor path's activations, split once per product (wstream.cuh's split
 * rows): x's token t, group g -> row t*count + g of out.  Grid-stride over quads. */
static __global__ void __launch_bounds__(WS_SPLIT_THREADS)
ws_presplit_kernel(const float *__restrict__ x, int64_t ldx, int64_t x_stride, int32_t count, int64_t nrows,
                   int64_t cols, int64_t nq, bool vec, uint4 *__restrict__ out) {
    DDT_GRID_DEP_WAIT();
    ws_presplit([&](int64_t r) { return x + (r / count) * ldx + (r % count) * x_stride; }, nrows, cols, nq, vec, out,
                (int64_t)blockIdx.x * WS_SPLIT_THREADS + threadIdx.x, (int64_t)gridDim.x * WS_SPLIT_THREADS);
}

extern "C" size_t ddt_cuda_matmul_workspace_bytes(int64_t cols, int32_t count, int32_t max_tokens) {
    if (cols < 1 || count < 1 || max_tokens < 1) return 0;
    return (size_t)max_tokens * (size_t)count * (size_t)((cols + 31) / 32) * 128u; /* 8 quads of 16 bytes a unit */
}

template <int F, int NT>
static cudaError_t ws_dense_launch(const WsArgs &a, cudaStream_t s) {
    constexpr int MT = ws_mt<F>(NT);
    const int64_t nrb = (a.rows + 16 * MT - 1) / (16 * MT), ntb = (a.n + NT * 8 - 1) / (NT * 8);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(ntb * a.count * nrb * a.ks));
    cfg.blockDim = dim3(ws_threads<F>(NT));
    WsArgs b = a;
    b.xcap = a.n < NT * 8 ? a.n : NT * 8;
    cfg.dynamicSmemBytes = ws_smem_bytes<F>(NT, b.xcap);
    cfg.stream = s;
    cudaLaunchAttribute attr;
    if (a.ks > 1) ddt_cuda_set_cluster(&cfg, &attr, (unsigned)a.ks, 1);
    return cudaLaunchKernelEx(&cfg, ws_kernel<F, WS_DENSE, NT>, b);
}

/* NT n-tiles by n (a block carries up to 64 tokens; more tokens take more token
 * blocks): the work split only, never the arithmetic. */
template <int F>
static cudaError_t ws_dense(const WsArgs &a, cudaStream_t s) {
    if (a.n <= 8) return ws_dense_launch<F, 1>(a, s);
    if (a.n <= 16) return ws_dense_launch<F, 2>(a, s);
    if (a.n <= 32) return ws_dense_launch<F, 4>(a, s);
    return ws_dense_launch<F, 8>(a, s);
}

/* The tensor path's workspace: present, large enough for n tokens of g's groups,
 * 16-byte aligned. */
static ddt_status tc_workspace_check(const ddt_qweight *w, const ddt_row_groups *g, int32_t n, const void *workspace,
                                     size_t workspace_bytes, ddt_error *err) {
    const size_t need = ddt_cuda_matmul_workspace_bytes(w->cols, g->count, n);
    if (!workspace || workspace_bytes < need)
        return ddt_fail(err, DDT_ERR_RANGE,
                        "matmul (tensor cores): %d tokens x %d groups of %lld columns need %zu workspace bytes "
                        "(ddt_cuda_matmul_workspace_bytes), %zu given",
                        n, g->count, (long long)w->cols, need, workspace ? workspace_bytes : (size_t)0);
    if ((uintptr_t)workspace % 16 != 0)
        return ddt_fail(err, DDT_ERR_INVALID, "matmul (tensor cores): workspace not 16-byte aligned");
    return DDT_OK;
}

static ddt_status tc_matmul(const ddt_qweight *w, const ddt_row_groups *g, const float *x, int64_t ldx, int32_t n,
                            float *y, int64_t ldy, void *workspace, size_t workspace_bytes, cudaStream_t s,
                            ddt_error *err) {
    const ddt_status st = tc_workspace_check(w, g, n, workspace, workspace_bytes, err);
    if (st != DDT_OK) return st;
    /* dense bf16 on wgmma + TMA (a property of the weight, never of n) */
    if (ddt_cuda_wg_eligible(w))
        return ddt_cuda_wg_matmul(w, g, x, ldx, n, y, ldy, workspace, workspace_bytes, s, err);
    WsArgs a;
    memset(&a, 0, sizeof a);
    const int F = qfmt_of(*w);
    a.rows = g->rows;
    a.cols = w->cols;
    a.nu = (w->cols + 31) / 32;
    a.mtiles = (w->rows + 15) / 16;
    a.fp8_block = w->block;
    a.fp8_scols = (int32_t)((w->cols + w->block - 1) / (w->block > 0 ? w->block : 1));
    a.ks = ws_ksplit(g->rows, g->count, a.nu);
    const int64_t kw = F == QF_INT4 ? ws_kw<QF_INT4>() : ws_kw<QF_BF16>(); /* k-slices: splits hold whole stages */
    a.units_per_split = ((a.nu + a.ks - 1) / a.ks + kw - 1) / kw * kw;
    a.wd = (const uint8_t *)w->mma;
    a.wsc = F == QF_INT4 ? w->mma_scale : F == QF_FP8 ? (const void *)w->scale_inv : NULL;
    a.mt_stride = g->w_row_stride / 16;
    a.mt_offset = g->w_row_offset / 16;
    a.count = g->count;
    a.n = n;
    a.y = y;
    a.ldy = ldy;
    a.y_stride = g->y_stride;
    const int64_t nq = a.nu * 8; /* quads of a split row */
    a.xs = (const uint4 *)workspace;
    a.ldxs = g->count * nq;
    a.xs_stride = nq;
    const int64_t blocks = (g->rows + 31) / 32 * g->count * ((n + 7) / 8) * a.ks;
    if (blocks > 0x7FFFFFFF) return ddt_fail(err, DDT_ERR_RANGE, "matmul: %lld blocks", (long long)blocks);
    /* the split: every (token, group) row once, for all the row blocks */
    const int64_t nrows = (int64_t)n * g->count, quads = nrows * nq;
    const int64_t sblocks = (quads + WS_SPLIT_THREADS - 1) / WS_SPLIT_THREADS;
    const bool vec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0 && g->x_stride % 4 == 0;
    ws_presplit_kernel<<<(unsigned)(sblocks < 4096 ? sblocks : 4096), WS_SPLIT_THREADS, 0, s>>>(
        x, ldx, g->x_stride, g->count, nrows, w->cols, nq, vec, (uint4 *)workspace);
    DDT_CUDA_LAUNCHED("matmul (tensor cores) activation split", s, err);
    cudaError_t e;
    switch (F) {
    case QF_BF16: e = ws_dense<QF_BF16>(a, s); break;
    case QF_FP8: e = ws_dense<QF_FP8>(a, s); break;
    default: e = ws_dense<QF_INT4>(a, s); break;
    }
    if (e != cudaSuccess)
        return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: matmul (tensor cores) launch: %s", cudaGetErrorString(e));
    DDT_CUDA_LAUNCHED("matmul (tensor cores)", s, err);
    return DDT_OK;
}

/* The launch arguments of the FP32 path from a grouped product. */
static void set_product(MMArgs &a, const ddt_row_groups *g, const float *x, int64_t ldx, int32_t n, float *y,
                        int64_t ldy) {
    a.rows = g->rows;
    a.w_row_stride = g->w_row_stride;
    a.w_row_offset = g->w_row_offset;
    a.pair_from = -1;
    memset(&a.rope, 0, sizeof a.rope);
    set_io(a, g, x, ldx, n, y, ldy);
}

extern "C" ddt_status ddt_cuda_matmul_grouped(const ddt_qweight *w, const ddt_row_groups *g, const float *x,
                                              int64_t ldx, int32_t n, float *y, int64_t ldy, ddt_cuda_stream stream,
                                              ddt_error *err) {
    return ddt_cuda_matmul_grouped_mode(w, DDT_CUDA_MM_FP32, g, x, ldx, n, y, ldy, NULL, 0, stream, err);
}

/* The checks of an x W^T product, and which path takes it: *tc when the
 * tensor-core path does (mode TENSOR, an eligible weight, groups on the packed
 * layout's m-tiles: a shape property, never n), else the FP32 path. */
static ddt_status mm_check(const ddt_qweight *w, ddt_cuda_mm_mode mode, const ddt_row_groups *g, int32_t n,
                           const float *x, const float *y, bool *tc, ddt_error *err) {
    ddt_status st = check_weight(w, "matmul", err);
    if (st != DDT_OK) return st;
    if ((st = check_groups(w, g, "matmul", err)) != DDT_OK) return st;
    if (n < 1 || !x || !y) return ddt_fail(err, DDT_ERR_INVALID, "matmul: %d tokens", n);
    if ((int64_t)g->count * g->rows * n > (int64_t)MM_WARPS * 0x7FFFFFFF)
        return ddt_fail(err, DDT_ERR_RANGE, "matmul: too many output rows");
    if (mode != DDT_CUDA_MM_FP32 && mode != DDT_CUDA_MM_TENSOR)
        return ddt_fail(err, DDT_ERR_INVALID, "matmul: unknown mode %d", (int)mode);
    if (qfmt_of(*w) == QF_INT4 && (w->group != 32 || w->cols % 32 != 0 || !qview_make<QF_INT4>(*w).wvec))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "matmul: INT4 weight [%lld, %lld] group %d: the GPU needs group 32, columns a "
                        "multiple of 32 and 16-byte aligned data",
                        (long long)w->rows, (long long)w->cols, w->group);
    /* dense bf16 runs wgmma + TMA from the row-major data (any group offsets); the
       other formats the packed mma.sync stream (groups on its 16-row tiles) */
    const bool wg = mode == DDT_CUDA_MM_TENSOR && ddt_cuda_wg_eligible(w);
    *tc = wg || (mode == DDT_CUDA_MM_TENSOR && ddt_cuda_qweight_tc_eligible(w) && g->w_row_stride % 16 == 0 &&
                 g->w_row_offset % 16 == 0);
    if (*tc && !wg && !w->mma)
        return ddt_fail(err, DDT_ERR_INVALID,
                        "matmul: tensor-core mode on a weight [%lld, %lld] that was not packed "
                        "(ddt_cuda_qweight_pack)",
                        (long long)w->rows, (long long)w->cols);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_matmul_grouped_mode(const ddt_qweight *w, ddt_cuda_mm_mode mode,
                                                   const ddt_row_groups *g, const float *x, int64_t ldx, int32_t n,
                                                   float *y, int64_t ldy, void *workspace, size_t workspace_bytes,
                                                   ddt_cuda_stream stream, ddt_error *err) {
    return ddt_cuda_matmul_grouped_shape(w, mode, g, x, ldx, n, y, ldy, 0, 0, workspace, workspace_bytes, stream,
                                         err);
}

extern "C" ddt_status ddt_cuda_matmul_grouped_shape(const ddt_qweight *w, ddt_cuda_mm_mode mode,
                                                    const ddt_row_groups *g, const float *x, int64_t ldx, int32_t n,
                                                    float *y, int64_t ldy, int32_t warp_rows, int32_t warp_tokens,
                                                    void *workspace, size_t workspace_bytes, ddt_cuda_stream stream,
                                                    ddt_error *err) {
    bool tc = false;
    ddt_status st = mm_check(w, mode, g, n, x, y, &tc, err);
    if (st != DDT_OK) return st;
    if ((warp_rows != 0 || warp_tokens != 0) &&
        !((warp_rows == 1 || warp_rows == 2 || warp_rows == 4) && (warp_tokens == 1 || warp_tokens == 2 || warp_tokens == 4)))
        return ddt_fail(err, DDT_ERR_INVALID, "matmul: warp shape %d rows x %d tokens (1, 2 or 4 each, or both 0)",
                        warp_rows, warp_tokens);
    cudaStream_t s = (cudaStream_t)stream;
    if (tc) return tc_matmul(w, g, x, ldx, n, y, ldy, workspace, workspace_bytes, s, err);
    MMArgs a;
    set_product(a, g, x, ldx, n, y, ldy);
    a.u = NULL;
    a.ldu = 0;
    mm_dispatch<false>(w, a, warp_rows, warp_tokens, s);
    DDT_CUDA_LAUNCHED("matmul", s, err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_matmul_mode(const ddt_qweight *w, ddt_cuda_mm_mode mode, const float *x, int64_t ldx,
                                           int32_t n, float *y, int64_t ldy, void *workspace, size_t workspace_bytes,
                                           ddt_cuda_stream stream, ddt_error *err) {
    if (!w) return ddt_fail(err, DDT_ERR_INVALID, "matmul: no weight");
    ddt_row_groups g = {1, 0, 0, w->rows, 0, 0};
    return ddt_cuda_matmul_grouped_mode(w, mode, &g, x, ldx, n, y, ldy, workspace, workspace_bytes, stream, err);
}

extern "C" bool ddt_cuda_matmul_split_planes(const ddt_qweight *w, ddt_cuda_mm_mode mode, int32_t n, void *workspace,
                                             size_t workspace_bytes, ddt_cuda_split_planes *out) {
    return ddt_cuda_matmul_split_planes_grouped(w, mode, 1, n, workspace, workspace_bytes, out);
}

extern "C" ddt_status ddt_cuda_matmul_presplit(const ddt_qweight *w, ddt_cuda_mm_mode mode, int32_t n, float *y,
                                               int64_t ldy, void *workspace, size_t workspace_bytes,
                                               ddt_cuda_stream stream, ddt_error *err) {
    ddt_cuda_split_planes p;
    if (!ddt_cuda_matmul_split_planes(w, mode, n, workspace, workspace_bytes, &p))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "matmul (presplit): weight [%lld, %lld] in mode %d for %d tokens "
                        "reads no split planes (ddt_cuda_matmul_split_planes)", w ? (long long)w->rows : 0LL,
                        w ? (long long)w->cols : 0LL, (int)mode, n);
    if (!y || ldy < w->rows) return ddt_fail(err, DDT_ERR_INVALID, "matmul (presplit): output stride %lld < %lld rows",
                                             (long long)ldy, (long long)w->rows);
    return ddt_cuda_wg_matmul_presplit(w, n, y, ldy, workspace, workspace_bytes, stream, err);
}

extern "C" bool ddt_cuda_matmul_writes_next(const ddt_qweight *w, ddt_cuda_mm_mode mode) {
    return w && mode == DDT_CUDA_MM_TENSOR && ddt_cuda_wg_eligible(w);
}

extern "C" bool ddt_cuda_matmul_split_planes_grouped(const ddt_qweight *w, ddt_cuda_mm_mode mode, int32_t count,
                                                     int32_t n, void *workspace, size_t workspace_bytes,
                                                     ddt_cuda_split_planes *out) {
    if (!out) return false;
    memset(out, 0, sizeof *out);
    /* the wgmma path only: the mma.sync stream reads another layout (ws_presplit's) */
    if (!ddt_cuda_matmul_writes_next(w, mode)) return false;
    return ddt_cuda_wg_split_planes_grouped(w, count, n, workspace, workspace_bytes, out);
}

extern "C" ddt_status ddt_cuda_matmul_grouped_next(const ddt_qweight *w, ddt_cuda_mm_mode mode,
                                                   const ddt_row_groups *g, const float *x, int64_t ldx, int32_t n,
                                                   float *y, int64_t ldy, void *workspace, size_t workspace_bytes,
                                                   const ddt_cuda_next_planes *next, ddt_cuda_stream stream,
                                                   ddt_error *err) {
    if (x && !next) return ddt_cuda_matmul_grouped_mode(w, mode, g, x, ldx, n, y, ldy, workspace, workspace_bytes,
                                                        stream, err);
    ddt_status st = check_weight(w, "matmul (next)", err);
    if (st != DDT_OK) return st;
    if ((st = check_groups(w, g, "matmul (next)", err)) != DDT_OK) return st;
    if (!ddt_cuda_matmul_writes_next(w, mode))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "matmul (next): weight [%lld, %lld] in mode %d is not on the wgmma "
                        "path (ddt_cuda_matmul_writes_next): it neither reads pre-split activations nor writes "
                        "the next product's", (long long)w->rows, (long long)w->cols, (int)mode);
    if (n < 1 || !y) return ddt_fail(err, DDT_ERR_INVALID, "matmul (next): %d tokens, output %p", n, (void *)y);
    return ddt_cuda_wg_matmul_next(w, g, x, ldx, n, y, ldy, workspace, workspace_bytes, next, stream, err);
}

extern "C" ddt_status ddt_cuda_matmul(const ddt_qweight *w, const float *x, int64_t ldx, int32_t n, float *y,
                                      int64_t ldy, ddt_cuda_stream stream, ddt_error *err) {
    return ddt_cuda_matmul_mode(w, DDT_CUDA_MM_FP32, x, ldx, n, y, ldy, NULL, 0, stream, err);
}

/* A forced warp shape of a product whose output rows come in pairs (swiglu, rope):
 * 2 or 4 rows (a pair in one warp) x 1, 2 or 4 tokens, or both 0 to choose. */
static ddt_status pair_shape_check(const char *what, int32_t warp_rows, int32_t warp_tokens, ddt_error *err) {
    if ((warp_rows != 0 || warp_tokens != 0) &&
        !((warp_rows == 2 || warp_rows == 4) && (warp_tokens == 1 || warp_tokens == 2 || warp_tokens == 4)))
        return ddt_fail(err, DDT_ERR_INVALID,
                        "%s: warp shape %d rows x %d tokens (2 or 4 rows: a pair in one warp; 1, 2 or 4 tokens; or "
                        "both 0)",
                        what, warp_rows, warp_tokens);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_matmul_swiglu_shape(const ddt_qweight *w, int64_t pair_from, const float *x,
                                                   int64_t ldx, int32_t n, float *y, int64_t ldy, int32_t warp_rows,
                                                   int32_t warp_tokens, ddt_cuda_stream stream, ddt_error *err) {
    if (!w) return ddt_fail(err, DDT_ERR_INVALID, "matmul_swiglu: no weight");
    const ddt_row_groups g = {1, 0, 0, w->rows, 0, 0};
    bool tc = false;
    ddt_status st = mm_check(w, DDT_CUDA_MM_FP32, &g, n, x, y, &tc, err);
    if (st != DDT_OK) return st;
    if (pair_from < 0 || pair_from % 2 != 0 || pair_from >= w->rows || (w->rows - pair_from) % 2 != 0)
        return ddt_fail(err, DDT_ERR_INVALID,
                        "matmul_swiglu: pairs from row %lld of %lld (an even start, an even number of rows after it)",
                        (long long)pair_from, (long long)w->rows);
    if ((st = pair_shape_check("matmul_swiglu", warp_rows, warp_tokens, err)) != DDT_OK) return st;
    if (ldy < pair_from + (w->rows - pair_from) / 2)
        return ddt_fail(err, DDT_ERR_INVALID, "matmul_swiglu: row stride %lld < %lld output columns", (long long)ldy,
                        (long long)(pair_from + (w->rows - pair_from) / 2));
    cudaStream_t s = (cudaStream_t)stream;
    MMArgs a;
    set_product(a, &g, x, ldx, n, y, ldy);
    a.u = NULL;
    a.ldu = 0;
    a.pair_from = pair_from; /* mm_choose then takes R = 2 or 4 */
    mm_dispatch<false, MM_EPI_SWIGLU>(w, a, warp_rows, warp_tokens, s);
    DDT_CUDA_LAUNCHED("matmul_swiglu", s, err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_matmul_swiglu(const ddt_qweight *w, int64_t pair_from, const float *x, int64_t ldx,
                                             int32_t n, float *y, int64_t ldy, ddt_cuda_stream stream,
                                             ddt_error *err) {
    return ddt_cuda_matmul_swiglu_shape(w, pair_from, x, ldx, n, y, ldy, 0, 0, stream, err);
}

extern "C" ddt_status ddt_cuda_matmul_rope(const ddt_qweight *w, const float *x, int64_t ldx, float *y, int64_t ldy,
                                           const ddt_cuda_mla_rope_args *r, int32_t warp_rows, int32_t warp_tokens,
                                           ddt_cuda_stream stream, ddt_error *err) {
    if (!w || !r) return ddt_fail(err, DDT_ERR_INVALID, "matmul_rope: NULL argument");
    const ddt_row_groups g = {1, 0, 0, w->rows, 0, 0};
    bool tc = false;
    ddt_status st = mm_check(w, DDT_CUDA_MM_FP32, &g, r->n, x, y, &tc, err);
    if (st != DDT_OK) return st;
    if (!r->interleave || r->heads < 1 || r->nope < 0 || r->nope % 2 != 0 || r->rope < 2 || r->rope % 2 != 0 ||
        r->qdim != r->nope + r->rope || w->rows != (int64_t)r->heads * r->qdim || !r->len || !r->depth || !r->cos_t ||
        !r->sin_t)
        return ddt_fail(err, DDT_ERR_INVALID,
                        "matmul_rope: %lld rows for %d heads of %d + %d (interleaved pairs, even sizes, rows = heads "
                        "x (nope + rope), position and table arrays)",
                        (long long)w->rows, r->heads, r->nope, r->rope);
    if (ldy < w->rows) return ddt_fail(err, DDT_ERR_INVALID, "matmul_rope: row stride %lld < %lld", (long long)ldy,
                                       (long long)w->rows);
    if ((st = pair_shape_check("matmul_rope", warp_rows, warp_tokens, err)) != DDT_OK) return st;
    cudaStream_t s = (cudaStream_t)stream;
    MMArgs a;
    set_product(a, &g, x, ldx, r->n, y, ldy);
    a.u = NULL;
    a.ldu = 0;
    a.rope.len = r->len;
    a.rope.depth = r->depth;
    a.rope.cos_t = r->cos_t;
    a.rope.sin_t = r->sin_t;
    a.rope.max_pos = r->max_pos;
    a.rope.capacity = r->capacity;
    a.rope.qd = r->qdim;
    a.rope.nope = r->nope;
    a.rope.half = r->rope / 2;
    mm_dispatch<false, MM_EPI_ROPE>(w, a, warp_rows, warp_tokens, s);
    DDT_CUDA_LAUNCHED("matmul_rope", s, err);
    return DDT_OK;
}

/* silu_mul and the wgmma product's split pass in one launch: g = silu(g) * u stored
 * over the gate rows (ddt_cuda_silu_mul's bits, the function's contract) and its bf16
 * hi / lo planes, the values wg_split_kernel would write from it. */
#define SILU_SPLIT_THREADS 256
static __global__ void __launch_bounds__(SILU_SPLIT_THREADS)
silu_split_kernel(float *g, int64_t ldg, const float *__restrict__ u, int64_t ldu, int32_t n, int64_t cols,
                  const ddt_cuda_split_planes p) {
    DDT_GRID_DEP_WAIT();
    const int64_t total = (int64_t)n * cols;
    for (int64_t i = (int64_t)blockIdx.x * SILU_SPLIT_THREADS + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * SILU_SPLIT_THREADS) {
        const int64_t t = i / cols, c = i - t * cols;
        const float v = silu_mul1(g[t * ldg + c], u[t * ldu + c]);
        g[t * ldg + c] = v;
        bf16_split(v, ((__nv_bfloat16 *)p.hi)[t * p.pitch + c], ((__nv_bfloat16 *)p.lo)[t * p.pitch + c]);
    }
}

extern "C" ddt_status ddt_cuda_matmul_silu_mode(const ddt_qweight *w, ddt_cuda_mm_mode mode, float *gate, int64_t ldg,
                                                const float *up, int64_t ldu, int32_t n, float *y, int64_t ldy,
                                                void *workspace, size_t workspace_bytes, ddt_cuda_stream stream,
                                                ddt_error *err) {
    if (!w) return ddt_fail(err, DDT_ERR_INVALID, "matmul_silu: no weight");
    if (!up) return ddt_fail(err, DDT_ERR_INVALID, "matmul_silu: no up rows");
    const ddt_row_groups g = {1, 0, 0, w->rows, 0, 0};
    bool tc = false;
    ddt_status st = mm_check(w, mode, &g, n, gate, y, &tc, err);
    if (st != DDT_OK) return st;
    cudaStream_t s = (cudaStream_t)stream;
    if (tc || n > DDT_CUDA_SILU_FUSE_MAX_N) {
        /* silu_mul then the product, the SiLU written over the gate rows (two
           launches; on the tensor cores' wgmma path the SiLU runs in the split
           pass, two launches too, and the mma.sync stream keeps three: silu_mul,
           its split pass, the product).  More
           tokens: every warp of the fused kernel recomputes the SiLU (expf and a
           division) of all it reads, rows / R times per element, which measured
           on the H200 costs more than the launch it saves (the shipped target's
           shared down at 65 tokens: 10.7 us fused against 3.3 + 2.1 apart). */
        if (w->cols > INT32_MAX) return ddt_fail(err, DDT_ERR_RANGE, "matmul_silu: %lld columns", (long long)w->cols);
        /* a missing or short workspace is refused before gate is overwritten */
        if (tc && (st = tc_workspace_check(w, &g, n, workspace, workspace_bytes, err)) != DDT_OK) return st;
        ddt_cuda_split_planes p;
        if (tc && ddt_cuda_wg_split_planes(w, n, workspace, workspace_bytes, &p)) {
            /* the wgmma path: the SiLU and the split in one launch, then the product alone */
            const int64_t total = (int64_t)n * w->cols, blocks = (total + SILU_SPLIT_THREADS - 1) / SILU_SPLIT_THREADS;
            silu_split_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), SILU_SPLIT_THREADS, 0, s>>>(
                gate, ldg, up, ldu, n, w->cols, p);
            DDT_CUDA_LAUNCHED("matmul_silu: silu + split", s, err);
            return ddt_cuda_wg_matmul_presplit(w, n, y, ldy, workspace, workspace_bytes, stream, err);
        }
        if ((st = ddt_cuda_silu_mul(gate, ldg, up, ldu, n, (int32_t)w->cols, stream, err)) != DDT_OK) return st;
        if (tc) return tc_matmul(w, &g, gate, ldg, n, y, ldy, workspace, workspace_bytes, s, err);
    }
    MMArgs a;
    set_product(a, &g, gate, ldg, n, y, ldy);
    if (n > DDT_CUDA_SILU_FUSE_MAX_N) { /* the plain product of the SiLU just written */
        a.u = NULL;
        a.ldu = 0;
        mm_dispatch<false>(w, a, 0, 0, s);
    } else {
        a.u = up;
        a.ldu = ldu;
        a.xvec = a.xvec && (uintptr_t)up % 16 == 0 && ldu % 4 == 0;
        mm_dispatch<true>(w, a, 0, 0, s);
    }
    DDT_CUDA_LAUNCHED("matmul_silu", s, err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_matmul_silu(const ddt_qweight *w, float *gate, int64_t ldg, const float *up,
                                           int64_t ldu, int32_t n, float *y, int64_t ldy, ddt_cuda_stream stream,
                                           ddt_error *err) {
    return ddt_cuda_matmul_silu_mode(w, DDT_CUDA_MM_FP32, gate, ldg, up, ldu, n, y, ldy, NULL, 0, stream, err);
}

/* ------------------------------------------------------------------ y = x W */

#define MT_THREADS 128 /* at most; a narrow weight gets a narrower block */
#define MT_TB 4        /* tokens per block */
#define MT_U 16        /* weight rows a thread loads at once */
#define MT_XR 256      /* x rows staged in shared memory per pass (a multiple of MT_U) */

/* Rows [i0, i0 + MT_U) of column j from weight row wrow0 + i0 on, those below
 * `rows`; nothing for a thread without a column (j < 0). */
template <int F>
static __device__ __forceinline__ void mt_fetch(const ddt_qweight &w, int64_t wrow0, int64_t i0, int64_t rows,
                                                int64_t j, uint32_t (&bits)[MT_U], float (&scale)[MT_U]) {
#pragma unroll
    for (int k = 0; k < MT_U; k++) {
        bits[k] = 0;
        scale[k] = 0.0f;
        if (j >= 0 && i0 + k < rows) qelem_load<F>(w, wrow0 + i0 + k, j, bits[k], scale[k]);
    }
}

/* y = x W, one thread per (column, MT_TB tokens): acc = acc + x[t][i] * w[i][j]
 * over i = 0 .. rows - 1 in order from 0.0f, as ddt_cpu_matmul_t_grouped and
 * the earlier one-load-per-step kernel.  The latency chain is cut by loading
 * MT_U rows' weights at once, the next MT_U while the current are summed, and
 * by staging the block's x rows in shared memory (read as float4); the first
 * weights are in flight while x is staged. */
template <int F>
static __global__ void __launch_bounds__(MT_THREADS)
mt_kernel(const ddt_qweight w, const ddt_row_groups g, const float *__restrict__ x, int64_t ldx, int32_t n,
          float *__restrict__ y, int64_t ldy) {
    DDT_GRID_DEP_WAIT();
    __shared__ __align__(16) float xs[MT_TB][MT_XR];
    const int64_t jc = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t j = jc < w.cols ? jc : -1; /* -1: no column, but the block's barriers */
    const int64_t grp = blockIdx.y;
    const int32_t t0 = (int32_t)blockIdx.z * MT_TB;
    const int ntok = n - t0 < MT_TB ? n - t0 : MT_TB;
    const int64_t rows = g.rows, wrow0 = grp * g.w_row_stride + g.w_row_offset;
    const float *xb = x + (int64_t)t0 * ldx + grp * g.x_stride;
    float acc[MT_TB];
#pragma unroll
    for (int t = 0; t < MT_TB; t++) acc[t] = 0.0f;
    uint32_t wb[MT_U];
    float ws[MT_U];
    mt_fetch<F>(w, wrow0, 0, rows, j, wb, ws);
    for (int64_t r0 = 0; r0 < rows; r0 += MT_XR) {
        const int nr = rows - r0 < MT_XR ? (int)(rows - r0) : MT_XR;
        const int nr_u = (nr + MT_U - 1) / MT_U * MT_U; /* zeros up to whole MT_U-row batches */
        __syncthreads(); /* the previous pass is done with xs */
        for (int e = threadIdx.x; e < MT_TB * nr_u; e += blockDim.x) {
            const int t = e / nr_u, i = e % nr_u;
            xs[t][i] = (t < ntok && i < nr) ? xb[(int64_t)t * ldx + r0 + i] : 0.0f;
        }
        __syncthreads();
        for (int i0 = 0; i0 < nr; i0 += MT_U) {
            uint32_t nb[MT_U];
            float nsc[MT_U];
            mt_fetch<F>(w, wrow0, r0 + i0 + MT_U, rows, j, nb, nsc); /* the next batch, in flight meanwhile */
            float wv[MT_U];
#pragma unroll
            for (int k = 0; k < MT_U; k++) wv[k] = qelem_decode<F>(wb[k], ws[k], j);
#pragma unroll
            for (int t = 0; t < MT_TB; t++) {
                float xv[MT_U];
#pragma unroll
                for (int k = 0; k < MT_U; k += 4) {
                    const float4 x4 = *reinterpret_cast<const float4 *>(&xs[t][i0 + k]);
                    xv[k] = x4.x, xv[k + 1] = x4.y, xv[k + 2] = x4.z, xv[k + 3] = x4.w;
                }
#pragma unroll
                for (int k = 0; k < MT_U; k++)
                    if (i0 + k < nr) acc[t] = acc[t] + xv[k] * wv[k];
            }
#pragma unroll
            for (int k = 0; k < MT_U; k++) wb[k] = nb[k], ws[k] = nsc[k];
        }
    }
    if (j < 0) return;
#pragma unroll
    for (int t = 0; t < MT_TB; t++)
        if (t < ntok) y[(int64_t)(t0 + t) * ldy + grp * g.y_stride + j] = acc[t];
}

extern "C" ddt_status ddt_cuda_matmul_t_grouped(const ddt_qweight *w, const ddt_row_groups *g, const float *x,
                                                int64_t ldx, int32_t n, float *y, int64_t ldy,
                                                ddt_cuda_stream stream, ddt_error *err) {
    ddt_status st = check_weight(w, "matmul_t", err);
    if (st != DDT_OK) return st;
    if ((st = check_groups(w, g, "matmul_t", err)) != DDT_OK) return st;
    if (n < 1 || !x || !y) return ddt_fail(err, DDT_ERR_INVALID, "matmul_t: %d tokens", n);
    if (g->count > 65535 || (n + MT_TB - 1) / MT_TB > 65535)
        return ddt_fail(err, DDT_ERR_RANGE, "matmul_t: %d groups x %d tokens over the grid limit", g->count, n);
    /* a block as wide as the columns (whole warps, at most MT_THREADS): the
       64-column MLA products get 64-thread blocks, not half-idle 128 */
    const int64_t cols32 = (w->cols + 31) / 32 * 32;
    const unsigned threads = (unsigned)(cols32 < MT_THREADS ? cols32 : MT_THREADS);
    dim3 grid((unsigned)((w->cols + threads - 1) / threads), (unsigned)g->count, (unsigned)((n + MT_TB - 1) / MT_TB));
    cudaStream_t s = (cudaStream_t)stream;
    switch (qfmt_of(*w)) {
    case QF_F32: mt_kernel<QF_F32><<<grid, threads, 0, s>>>(*w, *g, x, ldx, n, y, ldy); break;
    case QF_BF16: mt_kernel<QF_BF16><<<grid, threads, 0, s>>>(*w, *g, x, ldx, n, y, ldy); break;
    case QF_F16: mt_kernel<QF_F16><<<grid, threads, 0, s>>>(*w, *g, x, ldx, n, y, ldy); break;
    case QF_FP8: mt_kernel<QF_FP8><<<grid, threads, 0, s>>>(*w, *g, x, ldx, n, y, ldy); break;
    case QF_INT4: mt_kernel<QF_INT4><<<grid, threads, 0, s>>>(*w, *g, x, ldx, n, y, ldy); break;
    }
    DDT_CUDA_LAUNCHED("matmul_t", s, err);
    return DDT_OK;
}

/* ------------------------------------------------------------------ per-group transpose */

/* dst[g][j][i] = src[g*stride + off + i][j] over es-byte elements: dst is
 * [count][C][R] row-major, src rows of src_ld elements.  Load time only. */
static __global__ void transpose_groups_kernel(uint8_t *__restrict__ dst, const uint8_t *__restrict__ src, int es,
                                               int64_t count, int64_t R, int64_t C, int64_t stride, int64_t off,
                                               int64_t src_ld) {
    DDT_GRID_DEP_WAIT();
    const int64_t total = count * C * R;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += (int64_t)gridDim.x * blockDim.x) {
        const int64_t grp = o / (C * R), rem = o - grp * C * R, j = rem / R, i = rem - j * R;
        const uint8_t *sp = src + ((grp * stride + off + i) * src_ld + j) * es;
        for (int b = 0; b < es; b++) dst[o * es + b] = sp[b];
    }
}

/* The end of making a device weight on the stream: wait for its kernels, then
 * hand it out (*out = *w), or free it and report the first failure. */
static ddt_status weight_made(ddt_status st, ddt_qweight *w, ddt_qweight *out, const char *what, ddt_error *err) {
    if (st == DDT_OK) {
        cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) st = ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: %s: %s", what, cudaGetErrorString(e));
    }
    if (st != DDT_OK) {
        ddt_cuda_qweight_free(w);
        return st;
    }
    *out = *w;
    return DDT_OK;
}

static ddt_status transpose_launch(uint8_t *dst, const void *src, int es, int64_t count, int64_t R, int64_t C,
                                   int64_t stride, int64_t off, int64_t src_ld, ddt_error *err) {
    const int64_t total = count * C * R;
    int64_t blocks = (total + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    transpose_groups_kernel<<<(unsigned)blocks, 256>>>(dst, (const uint8_t *)src, es, count, R, C, stride, off, src_ld);
    DDT_CUDA_LAUNCHED("qweight_transpose_groups", 0, err);
    return DDT_OK;
}

/* A weight's description (format, shape, scale layout) with none of its device
 * buffers: the start of a weight built from it (transpose, concat, interleave),
 * which then owns only what it allocates. */
static ddt_qweight qweight_shape_of(const ddt_qweight *w) {
    ddt_qweight o = *w;
    o.data = NULL;
    o.scale_inv = NULL;
    o.scale = NULL;
    o.mma = NULL;
    o.mma_scale = NULL;
    return o;
}

extern "C" bool ddt_cuda_qweight_transpose_ok(const ddt_qweight *w, const ddt_row_groups *g) {
    if (!w || !g || !w->data || g->count < 1 || g->rows < 1 || g->w_row_offset < 0 || g->w_row_stride < 0 ||
        (int64_t)(g->count - 1) * g->w_row_stride + g->w_row_offset + g->rows > w->rows)
        return false;
    if (w->format == DDT_Q_DENSE) return dense_dtype_ok(w->dtype);
    if (w->format != DDT_Q_FP8_BLOCK || w->block < 1 || !w->scale_inv) return false;
    /* whole scale blocks on both sides: every transposed block is one source block */
    const int64_t B = w->block;
    return g->w_row_stride % B == 0 && g->w_row_offset % B == 0 && g->rows % B == 0 && w->cols % B == 0;
}

extern "C" ddt_status ddt_cuda_qweight_transpose_groups(const ddt_qweight *w, const ddt_row_groups *g, ddt_qweight *out,
                                                        ddt_error *err) {
    if (!out) return ddt_fail(err, DDT_ERR_INVALID, "qweight_transpose_groups: NULL output");
    memset(out, 0, sizeof *out);
    if (!ddt_cuda_qweight_transpose_ok(w, g))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "qweight_transpose_groups: a weight [%lld, %lld] of format %d: only dense F32/BF16/F16 and FP8 "
                        "with groups on whole blocks",
                        w ? (long long)w->rows : 0ll, w ? (long long)w->cols : 0ll, w ? (int)w->format : -1);
    const int es = w->format == DDT_Q_FP8_BLOCK ? 1 : w->dtype == DDT_DTYPE_F32 ? 4 : 2;
    const int64_t R = g->rows, C = w->cols, cnt = g->count;
    ddt_qweight o = qweight_shape_of(w);
    o.rows = cnt * C;
    o.cols = R;
    void *d = NULL, *sc = NULL;
    ddt_status st = ddt_cuda_malloc_array(&d, (size_t)(cnt * C * R), (size_t)es, NULL, err);
    if (st != DDT_OK) return st;
    o.data = d;
    st = transpose_launch((uint8_t *)d, w->data, es, cnt, R, C, g->w_row_stride, g->w_row_offset, C, err);
    if (st == DDT_OK && w->format == DDT_Q_FP8_BLOCK) {
        /* the scale grid transposes the same way, in blocks: [count*C/B][R/B] */
        const int64_t B = w->block, scols = (w->cols + B - 1) / B;
        st = ddt_cuda_malloc_array(&sc, (size_t)(cnt * (C / B) * (R / B)), sizeof(float), NULL, err);
        if (st == DDT_OK) {
            o.scale_inv = (const float *)sc;
            st = transpose_launch((uint8_t *)sc, w->scale_inv, 4, cnt, R / B, C / B, g->w_row_stride / B,
                                  g->w_row_offset / B, scols, err);
        }
    }
    return weight_made(st, &o, out, "qweight_transpose_groups", err);
}

/* ------------------------------------------------------------------ row concatenation */

extern "C" bool ddt_cuda_qweight_concat_ok(const ddt_qweight *const *parts, int32_t count) {
    if (!parts || count < 1) return false;
    int64_t rows = 0;
    for (int32_t i = 0; i < count; i++) {
        const ddt_qweight *p = parts[i], *a = parts[0];
        if (!p || !p->data || p->rows < 1 || p->cols != a->cols || p->format != a->format || p->dtype != a->dtype)
            return false;
        if (p->rows > INT64_MAX / 2 - rows) return false;
        rows += p->rows;
        switch (p->format) {
        case DDT_Q_DENSE:
            if (p->dtype != DDT_DTYPE_F32 && p->dtype != DDT_DTYPE_BF16 && p->dtype != DDT_DTYPE_F16) return false;
            break;
        case DDT_Q_FP8_BLOCK:
            /* a part ending inside a scale block would share that block's scale
               with the next part's first rows */
            if (p->block < 1 || p->block != a->block || !p->scale_inv) return false;
            if (i + 1 < count && p->rows % p->block != 0) return false;
            break;
        case DDT_Q_INT4_GROUP:
            if (p->group < 1 || p->group != a->group || !p->scale) return false;
            break;
        default: return false;
        }
    }
    return true;
}

extern "C" ddt_status ddt_cuda_qweight_concat_rows(const ddt_qweight *const *parts, int32_t count, ddt_qweight *out,
                                                   ddt_error *err) {
    if (!out) return ddt_fail(err, DDT_ERR_INVALID, "qweight_concat_rows: NULL output");
    memset(out, 0, sizeof *out);
    if (!ddt_cuda_qweight_concat_ok(parts, count))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "qweight_concat_rows: %d parts that do not concatenate by rows (formats, columns or an FP8 "
                        "part not on whole scale blocks)",
                        count);
    ddt_qweight o = qweight_shape_of(parts[0]);
    o.rows = 0;
    bool packed = false;
    for (int32_t i = 0; i < count; i++) {
        o.rows += parts[i]->rows;
        packed = packed || parts[i]->mma != NULL;
    }
    /* data_bytes / scale_bytes of each part are its rows' bytes: row-major data,
       and per-row (INT4) or per-block-row (FP8, whole blocks but the last) scales */
    void *d = NULL, *sc = NULL;
    ddt_status st = ddt_cuda_malloc_array(&d, (size_t)data_bytes(&o), 1, NULL, err);
    if (st != DDT_OK) return st;
    o.data = d;
    const uint64_t sb = scale_bytes(&o);
    if (sb > 0) {
        st = ddt_cuda_malloc_array(&sc, (size_t)sb, 1, NULL, err);
        if (st != DDT_OK) {
            ddt_cuda_qweight_free(&o);
            return st;
        }
        if (o.format == DDT_Q_FP8_BLOCK) o.scale_inv = (const float *)sc;
        else o.scale = (const uint16_t *)sc;
    }
    uint64_t doff = 0, soff = 0;
    cudaError_t e = cudaSuccess;
    for (int32_t i = 0; i < count && e == cudaSuccess; i++) {
        const ddt_qweight *p = parts[i];
        const uint64_t db = data_bytes(p), pb = scale_bytes(p);
        e = cudaMemcpy((uint8_t *)d + doff, p->data, db, cudaMemcpyDeviceToDevice);
        if (e == cudaSuccess && pb > 0)
            e = cudaMemcpy((uint8_t *)sc + soff,
                           p->format == DDT_Q_FP8_BLOCK ? (const void *)p->scale_inv : (const void *)p->scale, pb,
                           cudaMemcpyDeviceToDevice);
        doff += db;
        soff += pb;
    }
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        ddt_cuda_qweight_free(&o);
        return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: qweight_concat_rows [%lld, %lld]: %s", (long long)o.rows,
                        (long long)o.cols, cudaGetErrorString(e));
    }
    if (packed && (st = ddt_cuda_qweight_pack(&o, err)) != DDT_OK) {
        ddt_cuda_qweight_free(&o);
        return st;
    }
    *out = o;
    return DDT_OK;
}

extern "C" bool ddt_cuda_qweight_interleave_ok(const ddt_qweight *a, const ddt_qweight *b) {
    if (!a || !b || !a->data || !b->data || a->rows < 1 || a->cols < 1 || a->rows != b->rows || a->cols != b->cols ||
        a->format != b->format || a->dtype != b->dtype || a->rows > INT64_MAX / 4)
        return false;
    switch (a->format) {
    case DDT_Q_DENSE: return dense_dtype_ok(a->dtype);
    case DDT_Q_INT4_GROUP: return a->group >= 1 && a->group == b->group && a->scale && b->scale;
    default: return false; /* FP8: a scale block covers 128 rows of one weight */
    }
}

extern "C" ddt_status ddt_cuda_qweight_interleave_rows(const ddt_qweight *a, const ddt_qweight *b, ddt_qweight *out,
                                                      ddt_error *err) {
    if (!out) return ddt_fail(err, DDT_ERR_INVALID, "qweight_interleave_rows: NULL output");
    memset(out, 0, sizeof *out);
    if (!ddt_cuda_qweight_interleave_ok(a, b))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "qweight_interleave_rows: two weights that do not interleave by rows (shapes, formats, or FP8 "
                        "block scales)");
    ddt_qweight o = qweight_shape_of(a);
    o.rows = 2 * a->rows;
    /* row-major data and (INT4) per-row scales: a row's bytes are the total over rows */
    const size_t rb = (size_t)(data_bytes(a) / (uint64_t)a->rows), sr = (size_t)(scale_bytes(a) / (uint64_t)a->rows);
    const size_t rows = (size_t)a->rows;
    void *d = NULL, *sc = NULL;
    ddt_status st = ddt_cuda_malloc_array(&d, (size_t)data_bytes(&o), 1, NULL, err);
    if (st != DDT_OK) return st;
    o.data = d;
    if (sr > 0) {
        st = ddt_cuda_malloc_array(&sc, 2 * rows * sr, 1, NULL, err);
        if (st != DDT_OK) {
            ddt_cuda_qweight_free(&o);
            return st;
        }
        o.scale = (const uint16_t *)sc;
    }
    cudaError_t e = cudaMemcpy2D(d, 2 * rb, a->data, rb, rb, rows, cudaMemcpyDeviceToDevice);
    if (e == cudaSuccess) e = cudaMemcpy2D((uint8_t *)d + rb, 2 * rb, b->data, rb, rb, rows, cudaMemcpyDeviceToDevice);
    if (e == cudaSuccess && sr > 0) e = cudaMemcpy2D(sc, 2 * sr, a->scale, sr, sr, rows, cudaMemcpyDeviceToDevice);
    if (e == cudaSuccess && sr > 0)
        e = cudaMemcpy2D((uint8_t *)sc + sr, 2 * sr, b->scale, sr, sr, rows, cudaMemcpyDeviceToDevice);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        ddt_cuda_qweight_free(&o);
        return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: qweight_interleave_rows [%lld, %lld]: %s", (long long)o.rows,
                        (long long)o.cols, cudaGetErrorString(e));
    }
    *out = o;
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_qweight_stack_rows(ddt_qweight *const *parts, int32_t count, ddt_qweight *out,
                                                  ddt_error *err) {
    if (!out) return ddt_fail(err, DDT_ERR_INVALID, "qweight_stack_rows: NULL output");
    memset(out, 0, sizeof *out);
    if (!ddt_cuda_qweight_concat_ok(parts, count)) return DDT_OK; /* separate products */
    ddt_status st = ddt_cuda_qweight_concat_rows(parts, count, out, err);
    if (st != DDT_OK) return st;
    for (int32_t i = 0; i < count; i++) ddt_cuda_qweight_free(parts[i]);
    return DDT_OK;
}

/* ------------------------------------------------------------------ embedding */

/* Element c of the embedding of id: the dequantised weight, or NaN for an id out of
 * range.  One expression for embed_kernel and embed_rmsnorm_kernel, so the fused
 * launch stores the bits the plain gather stores. */
static __device__ __forceinline__ float embed_elem(const ddt_qweight &w, int32_t id, int64_t c) {
    return (id >= 0 && id < w.rows) ? qdeq_elem(w, id, c) : __int_as_float(0x7FC00000);
}

static __global__ void embed_kernel(const ddt_qweight w, const int32_t *__restrict__ ids, float *out, int64_t ldo) {
    DDT_GRID_DEP_WAIT();
    const int32_t id = ids[blockIdx.y];
    float *o = out + (int64_t)blockIdx.y * ldo;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < w.cols; c += (int64_t)gridDim.x * blockDim.x)
        o[c] = embed_elem(w, id, c);
}

extern "C" ddt_status ddt_cuda_embed(const ddt_qweight *w, const int32_t *ids, int32_t n, float *out, int64_t ldo,
                                     ddt_cuda_stream stream, ddt_error *err) {
    ddt_status st = check_weight(w, "embed", err);
    if (st != DDT_OK) return st;
    if (n < 1 || n > 65535 || !ids || !out) return ddt_fail(err, DDT_ERR_INVALID, "embed: %d ids", n);
    int64_t bx = (w->cols + 255) / 256;
    if (bx > 64) bx = 64;
    embed_kernel<<<dim3((unsigned)bx, (unsigned)n), 256, 0, (cudaStream_t)stream>>>(*w, ids, out, ldo);
    DDT_CUDA_LAUNCHED("embed", (cudaStream_t)stream, err);
    return DDT_OK;
}

/* a K2.6 row (7168 at 512 threads) in one batch of 14, up to 2048 at 256 threads in
   one of 8: 16 covers both */
#define EMBED_BATCH 16

/* The gather and the first layer's norm in one launch, one block of norm_threads per
 * row: the block stores its embedding row to x (embed_elem: embed_kernel's bits),
 * waits at a barrier so every thread sees the whole row in global memory, then runs
 * norm_row on that row exactly as rmsnorm_kernel does (same block size, same path
 * flag), so xn holds the bits ddt_cuda_rmsnorm would have written.  Row 0 takes
 * *first_id instead of ids[0] when first_id is given (the drafter's bonus token,
 * which saves a copy into its id block every round). */
template <int NT>
static __global__ void __launch_bounds__(NT, 1)
embed_rmsnorm_kernel(const ddt_qweight w, const int32_t *__restrict__ ids, const int32_t *__restrict__ first_id,
                     float *x, int64_t ldx, const float *__restrict__ nw, float eps, float *xn, int64_t ldxn,
                     bool vec, const ddt_cuda_split_planes sp) {
    DDT_GRID_DEP_WAIT();
    const int32_t id = (first_id && blockIdx.x == 0) ? *first_id : ids[blockIdx.x];
    float *xr = x + (int64_t)blockIdx.x * ldx;
    /* EMBED_BATCH elements a thread loaded before any is stored: x may alias the
       weight for all the compiler knows, so a load-store loop waited a memory
       latency per element (17.5 us for one K2.6 row of 7168 on the H200) */
    for (int64_t c0 = threadIdx.x; c0 < w.cols; c0 += (int64_t)EMBED_BATCH * NT) {
        float v[EMBED_BATCH];
#pragma unroll
        for (int u = 0; u < EMBED_BATCH; u++) {
            const int64_t c = c0 + (int64_t)u * NT;
            v[u] = c < w.cols ? embed_elem(w, id, c) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < EMBED_BATCH; u++) {
            const int64_t c = c0 + (int64_t)u * NT;
            if (c < w.cols) xr[c] = v[u];
        }
    }
    __syncthreads(); /* the norm's threads read elements other threads stored */
    norm_row<NT>(xr, (int)w.cols, NormNoResid{}, nw, eps, xn + (int64_t)blockIdx.x * ldxn, vec,
                 norm_split_row(sp, blockIdx.x));
}

extern "C" ddt_status ddt_cuda_embed_rmsnorm(const ddt_qweight *w, const int32_t *ids, const int32_t *first_id,
                                             int32_t n, float *x, int64_t ldx, const float *norm_w, float eps,
                                             float *xn, int64_t ldxn, ddt_cuda_stream stream, ddt_error *err) {
    return ddt_cuda_embed_rmsnorm_split(w, ids, first_id, n, x, ldx, norm_w, eps, xn, ldxn, NULL, stream, err);
}

extern "C" ddt_status ddt_cuda_embed_rmsnorm_split(const ddt_qweight *w, const int32_t *ids, const int32_t *first_id,
                                                   int32_t n, float *x, int64_t ldx, const float *norm_w, float eps,
                                                   float *xn, int64_t ldxn, const ddt_cuda_split_planes *sp,
                                                   ddt_cuda_stream stream, ddt_error *err) {
    ddt_status st = check_weight(w, "embed_rmsnorm", err);
    if (st != DDT_OK) return st;
    ddt_cuda_split_planes p;
    if ((st = norm_split_check("embed_rmsnorm", sp, w->cols, &p, err)) != DDT_OK) return st;
    if (n < 1 || n > 65535 || !ids || !x || !norm_w || !xn)
        return ddt_fail(err, DDT_ERR_INVALID, "embed_rmsnorm: %d ids (ids, x, norm weight and xn needed)", n);
    if (w->cols > INT32_MAX || ldx < w->cols || ldxn < w->cols)
        return ddt_fail(err, DDT_ERR_INVALID, "embed_rmsnorm: rows of %lld with strides %lld, %lld",
                        (long long)w->cols, (long long)ldx, (long long)ldxn);
    const int32_t dim = (int32_t)w->cols;
    /* ddt_cuda_rmsnorm's path choice for (x, ldx, w, xn, ldxn): the register path sums
     * in another order, so the flag must be the one that launch would compute */
    const void *ptrs[4] = {x, nullptr, norm_w, xn};
    const int64_t lds[4] = {ldx, 0, 0, ldxn};
    const bool vec = norm_vec_ok(dim, ptrs, lds, 4);
    norm_launch(norm_threads(dim), [&](auto nt) {
        constexpr int NT = decltype(nt)::value;
        embed_rmsnorm_kernel<NT><<<(unsigned)n, NT, 0, (cudaStream_t)stream>>>(*w, ids, first_id, x, ldx, norm_w, eps, xn,
                                                                               ldxn, vec, p);
    });
    DDT_CUDA_LAUNCHED("embed_rmsnorm", (cudaStream_t)stream, err);
    return DDT_OK;
}

/* ------------------------------------------------------------------ random weights */

static __device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* kind 0: random 32-bit words; 1: bf16 in [-a, a); 2: FP8 bytes, never NaN;
 * 3: bf16 scales in [a, 2a); 4: fp32 in [lo, hi) */
static __global__ void fill_kernel(void *dst, int64_t count, int kind, float lo, float hi, uint64_t seed) {
    DDT_GRID_DEP_WAIT();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        const uint64_t r = mix64(seed ^ mix64((uint64_t)i));
        const float u = (float)(r >> 40) * (1.0f / 16777216.0f);
        switch (kind) {
        case 0: ((uint32_t *)dst)[i] = (uint32_t)r; break;
        case 1: ((uint16_t *)dst)[i] = (uint16_t)(__float_as_uint((2.0f * u - 1.0f) * hi) >> 16); break;
        case 2: {
            uint8_t b = (uint8_t)r;
            if ((b & 0x7Fu) == 0x7Fu) b = (uint8_t)(b & 0xFEu);
            ((uint8_t *)dst)[i] = b;
            break;
        }
        case 3: ((uint16_t *)dst)[i] = (uint16_t)(__float_as_uint(hi * (1.0f + u)) >> 16); break;
        default: ((float *)dst)[i] = lo + (hi - lo) * u; break;
        }
    }
}

static ddt_status fill(void *dst, int64_t count, int kind, float lo, float hi, uint64_t seed, cudaStream_t s,
                       ddt_error *err) {
    if (count < 1) return DDT_OK;
    int64_t blocks = (count + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    fill_kernel<<<(unsigned)blocks, 256, 0, s>>>(dst, count, kind, lo, hi, seed);
    DDT_CUDA_LAUNCHED("fill", s, err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_fill_uniform(float *dev, int64_t n, float lo, float hi, uint64_t seed,
                                            ddt_cuda_stream stream, ddt_error *err) {
    return fill(dev, n, 4, lo, hi, seed, (cudaStream_t)stream, err);
}

extern "C" ddt_status ddt_cuda_qweight_random(ddt_qformat format, ddt_dtype dtype, int64_t rows, int64_t cols,
                                              float amp, uint64_t seed, ddt_qweight *dev, ddt_error *err) {
    ddt_qweight w;
    memset(&w, 0, sizeof w);
    w.format = format;
    w.dtype = format == DDT_Q_FP8_BLOCK ? DDT_DTYPE_F8_E4M3 : format == DDT_Q_INT4_GROUP ? DDT_DTYPE_I32 : dtype;
    w.rows = rows;
    w.cols = cols;
    w.block = DDT_FP8_BLOCK;
    w.group = DDT_INT4_GROUP;
    w.data = (const void *)1; /* placeholders for the checks */
    w.scale = (const uint16_t *)1;
    w.scale_inv = (const float *)1;
    ddt_status st = check_weight(&w, "qweight_random", err);
    if (st != DDT_OK) return st;
    if (format == DDT_Q_DENSE && dtype == DDT_DTYPE_F16)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "qweight_random: F16 is not generated");
    const uint64_t db = data_bytes(&w), sb = scale_bytes(&w);
    void *data = NULL, *scale = NULL;
    DDT_CUDA_TRY(cudaMalloc(&data, db), err);
    if (sb > 0) {
        cudaError_t e = cudaMalloc(&scale, sb);
        if (e != cudaSuccess) {
            cudaFree(data);
            return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: qweight_random scales: %s", cudaGetErrorString(e));
        }
    }
    w.data = data;
    w.scale = format == DDT_Q_INT4_GROUP ? (const uint16_t *)scale : NULL;
    w.scale_inv = format == DDT_Q_FP8_BLOCK ? (const float *)scale : NULL;
    cudaStream_t s = 0;
    switch (format) {
    case DDT_Q_DENSE:
        st = dtype == DDT_DTYPE_F32 ? fill(data, rows * cols, 4, -amp, amp, seed, s, err)
                                    : fill(data, rows * cols, 1, 0.0f, amp, seed, s, err);
        break;
    case DDT_Q_FP8_BLOCK:
        st = fill(data, (int64_t)db, 2, 0, 0, seed, s, err);
        if (st == DDT_OK) st = fill(scale, (int64_t)(sb / 4), 4, amp * 0.5f, amp, seed + 1, s, err);
        break;
    case DDT_Q_INT4_GROUP:
        st = fill(data, (int64_t)(db / 4), 0, 0, 0, seed, s, err);
        if (st == DDT_OK) st = fill(scale, (int64_t)(sb / 2), 3, 0, amp, seed + 1, s, err);
        break;
    }
    return weight_made(st, &w, dev, "qweight_random", err);
}
