/*
 * qmatmul_dev.cuh — device code shared by qmatmul_cuda.cu and moe_cuda.cu (no
 * relocatable device code, so each includes it): a warp computes the dot products
 * of R weight rows with TB activation rows, weights dequantised in registers.
 *
 * Fixed arithmetic order (the determinism contract): a row is cut into chunks of
 * CW columns (one 16-byte load of packed weights: 8 dense, 16 FP8, 32 INT4 values);
 * lane l takes chunks l, l+32, l+64, ... in increasing order.  Inside a chunk, each
 * 8-column piece is a sequential sum (INT4: even and odd nibbles as two sequential
 * sums, odd ones scaled by 1/16 afterwards — exact, see int4_piece), pieces are
 * added in order, the chunk sum (times its FP8 / INT4 scale) is added to the lane's
 * accumulator, and the 32 lanes are combined by a fixed xor-shuffle tree.  None of
 * this depends on R, TB, the token count, the launch shape or the alignment of x:
 * a row / token pair gives the same bits in any batch.
 *
 * The sums use fused multiply-adds written out as __fmaf_rn (the build passes
 * --fmad=false, so the compiler never contracts on its own): one rounding per
 * term instead of two, half the instructions, and still one fixed order.
 *
 * Gated activations (GATED = true; ddt_cuda_matmul_silu): activation element j of
 * a token is silu(g[j]) * u[j] (silu_dev.cuh) computed where x[j] would be loaded,
 * from the gate and up rows, instead of read from x.  Only the load changes: the
 * value is the float ddt_cuda_silu_mul would have stored, and the sums above are
 * the same code, so the fused product is bitwise silu_mul then the product.
 */
#ifndef DDT_CUDA_QMATMUL_DEV_CUH
#define DDT_CUDA_QMATMUL_DEV_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/silu_dev.cuh"
#include "io/safetensors.h"

enum { QF_F32 = 0, QF_BF16, QF_F16, QF_FP8, QF_INT4 };

template <int F> struct QFmt;
template <> struct QFmt<QF_F32> { static constexpr int CW = 8, RAWN = 2, ESZ = 4; };
template <> struct QFmt<QF_BF16> { static constexpr int CW = 8, RAWN = 1, ESZ = 2; };
template <> struct QFmt<QF_F16> { static constexpr int CW = 8, RAWN = 1, ESZ = 2; };
template <> struct QFmt<QF_FP8> { static constexpr int CW = 16, RAWN = 1, ESZ = 1; };
template <> struct QFmt<QF_INT4> { static constexpr int CW = 32, RAWN = 1, ESZ = 0; };

/* What the chunked kernels need of a weight (built on the device for MoE experts). */
struct QView {
    const uint8_t *data;
    const void *scale;   /* FP8: float scale_inv; INT4: bf16 scale; else unused */
    int64_t cols;
    int64_t row_bytes;   /* bytes between rows of data */
    int64_t nchunks;     /* ceil(cols / CW) */
    int32_t sstride;     /* FP8: scale columns; INT4: groups per row */
    int32_t block;       /* FP8 block edge */
    bool wvec;           /* base and every row 16-byte aligned: full chunks load as uint4 */
};

static __host__ __device__ inline int qfmt_of(const ddt_qweight &w) {
    if (w.format == DDT_Q_FP8_BLOCK) return QF_FP8;
    if (w.format == DDT_Q_INT4_GROUP) return QF_INT4;
    if (w.dtype == DDT_DTYPE_BF16) return QF_BF16;
    if (w.dtype == DDT_DTYPE_F16) return QF_F16;
    return QF_F32;
}

template <int F> static __host__ __device__ inline QView qview_make(const ddt_qweight &w) {
    QView v;
    v.data = (const uint8_t *)w.data;
    v.cols = w.cols;
    v.block = w.block;
    if (F == QF_INT4) {
        v.row_bytes = ((w.cols + 7) / 8) * 4;
        v.scale = w.scale;
        v.sstride = (int32_t)((w.cols + w.group - 1) / w.group);
    } else if (F == QF_FP8) {
        v.row_bytes = w.cols;
        v.scale = w.scale_inv;
        v.sstride = (int32_t)((w.cols + w.block - 1) / w.block);
    } else {
        v.row_bytes = w.cols * QFmt<F>::ESZ;
        v.scale = nullptr;
        v.sstride = 0;
    }
    v.nchunks = (w.cols + QFmt<F>::CW - 1) / QFmt<F>::CW;
    v.wvec = ((uintptr_t)w.data % 16 == 0) && (v.row_bytes % 16 == 0);
    return v;
}

struct QRaw {
    uint4 u[2];
};

/* Chunk c of a row: packed bits (zero beyond cols: value 0 in every dense / FP8
 * encoding; INT4 rows never have partial chunks) and its scale. */
template <int F>
static __device__ __forceinline__ void qload(const QView &W, const uint8_t *rb, const void *srow, int64_t c,
                                             QRaw &raw, float &s) {
    constexpr int CW = QFmt<F>::CW;
    const bool full = (c + 1) * CW <= W.cols;
    if (F == QF_INT4 || (W.wvec && full)) {
        const uint4 *p = (const uint4 *)(rb + c * 16 * QFmt<F>::RAWN);
        raw.u[0] = __ldg(p);
        if (QFmt<F>::RAWN == 2) raw.u[1] = __ldg(p + 1);
    } else {
        /* element-wise (odd widths): the same bits as the vector load would give */
        uint32_t wd[8];
#pragma unroll
        for (int i = 0; i < 8; i++) wd[i] = 0;
        const int64_t c0 = c * CW;
#pragma unroll
        for (int e = 0; e < CW; e++) {
            if (c0 + e < W.cols) {
                uint32_t bits;
                if (QFmt<F>::ESZ == 4) bits = ((const uint32_t *)rb)[c0 + e];
                else if (QFmt<F>::ESZ == 2) bits = ((const uint16_t *)rb)[c0 + e];
                else bits = rb[c0 + e];
                const int sh = (e * QFmt<F>::ESZ * 8) % 32;
                wd[(e * QFmt<F>::ESZ) / 4] |= bits << sh;
            }
        }
        raw.u[0] = make_uint4(wd[0], wd[1], wd[2], wd[3]);
        raw.u[1] = make_uint4(wd[4], wd[5], wd[6], wd[7]);
    }
    if (F == QF_FP8) {
        s = ((const float *)srow)[(c * CW) / W.block];
    } else if (F == QF_INT4) {
        s = __uint_as_float((uint32_t)((const uint16_t *)srow)[c] << 16);
    } else {
        s = 1.0f;
    }
}

static __device__ __forceinline__ uint32_t u4_get(const uint4 &u, int i) {
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

/* Piece p (8 columns) of a dense / FP8 chunk as floats (FP8 unscaled). */
template <int F> static __device__ __forceinline__ void dense_piece(const QRaw &raw, int p, float v[8]) {
    if (F == QF_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[i] = __uint_as_float(u4_get(raw.u[0], i));
            v[4 + i] = __uint_as_float(u4_get(raw.u[1], i));
        }
    } else if (F == QF_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t w = u4_get(raw.u[0], i);
            v[2 * i] = __uint_as_float(w << 16);
            v[2 * i + 1] = __uint_as_float(w & 0xFFFF0000u);
        }
    } else if (F == QF_F16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t w = u4_get(raw.u[0], i);
            v[2 * i] = __half2float(__ushort_as_half((unsigned short)(w & 0xFFFFu)));
            v[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
        }
    } else { /* FP8: bytes 8p .. 8p+7 */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            uint32_t w = u4_get(raw.u[0], 2 * p + i);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)((w >> (16 * h)) & 0xFFFFu), __NV_E4M3);
                float2 f = __half22float2(*reinterpret_cast<__half2 *>(&hr));
                v[4 * i + 2 * h] = f.x;
                v[4 * i + 2 * h + 1] = f.y;
            }
        }
    }
}

/* x[col0 .. col0+8) of one activation row; zeros past cols on the element path. */
static __device__ __forceinline__ void xload8(const float *xr, int64_t col0, int64_t cols, bool vec, float x[8]) {
    if (vec && col0 + 8 <= cols) {
        float4 a = *(const float4 *)(xr + col0), b = *(const float4 *)(xr + col0 + 4);
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) x[e] = col0 + e < cols ? xr[col0 + e] : 0.0f;
    }
}

/* The same 8 activations of a gated row: silu(gr[j]) * ur[j], zeros past cols
 * (as xload8 gives past cols, without evaluating anything there).  vec: both rows
 * 16-byte aligned (float4 loads of g and u); either way the same values. */
static __device__ __forceinline__ void xload8_silu(const float *gr, const float *ur, int64_t col0, int64_t cols,
                                                   bool vec, float x[8]) {
    if (vec && col0 + 8 <= cols) {
        const float4 ga = *(const float4 *)(gr + col0), gb = *(const float4 *)(gr + col0 + 4);
        const float4 ua = *(const float4 *)(ur + col0), ub = *(const float4 *)(ur + col0 + 4);
        x[0] = silu_mul1(ga.x, ua.x), x[1] = silu_mul1(ga.y, ua.y), x[2] = silu_mul1(ga.z, ua.z);
        x[3] = silu_mul1(ga.w, ua.w), x[4] = silu_mul1(gb.x, ub.x), x[5] = silu_mul1(gb.y, ub.y);
        x[6] = silu_mul1(gb.z, ub.z), x[7] = silu_mul1(gb.w, ub.w);
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) x[e] = col0 + e < cols ? silu_mul1(gr[col0 + e], ur[col0 + e]) : 0.0f;
    }
}

/*
 * INT4 piece: the 8 nibbles of one word.  Each byte b holds columns 2b (low nibble)
 * and 2b+1 (high nibble).  Or-ing the low nibble into the mantissa of 2^23 gives
 * 2^23 + q exactly, so subtracting 2^23 + 8 is q - 8 with no conversion; the high
 * nibble lands as 2^23 + 16q and gives 16(q - 8).  16 (q-8) x rounds to exactly 16
 * times the rounded (q-8) x, so the odd sum times 1/16 is the sum of (q-8) x.
 * The piece value is the even sum plus the odd sum / 16.
 */
static __device__ __forceinline__ void int4_vals(uint32_t w, float ve[4], float vo[4]) {
#pragma unroll
    for (int b = 0; b < 4; b++) {
        uint32_t byte = w >> (8 * b);
        ve[b] = __uint_as_float(0x4B000000u | (byte & 0x0Fu)) - 8388616.0f;
        vo[b] = __uint_as_float(0x4B000000u | (byte & 0xF0u)) - 8388736.0f;
    }
}

/*
 * Lane-level accumulation of one chunk for R rows x TB tokens into acc.
 * col0 = first column of the chunk; xr[t] = activation row t (t < ntok), or with
 * GATED its gate row and ur[t] its up row (ur unused otherwise).
 */
template <int F, int R, int TB, bool GATED>
static __device__ __forceinline__ void qchunk(const QRaw (&raw)[R], const float (&s)[R], int64_t col0, int64_t cols,
                                              const float *const (&xr)[TB], const float *const (&ur)[TB], int ntok,
                                              bool xvec, float (&acc)[R][TB]) {
    constexpr int NP = QFmt<F>::CW / 8;
    float part[R][TB];
#pragma unroll
    for (int p = 0; p < NP; p++) {
        float x[TB][8];
#pragma unroll
        for (int t = 0; t < TB; t++)
            if (t < ntok) {
                if (GATED) xload8_silu(xr[t], ur[t], col0 + 8 * p, cols, xvec, x[t]);
                else xload8(xr[t], col0 + 8 * p, cols, xvec, x[t]);
            }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (F == QF_INT4) {
                float ve[4], vo[4];
                int4_vals(u4_get(raw[r].u[0], p), ve, vo);
#pragma unroll
                for (int t = 0; t < TB; t++) {
                    if (t >= ntok) continue;
                    float qe = ve[0] * x[t][0];
                    qe = __fmaf_rn(ve[1], x[t][2], qe);
                    qe = __fmaf_rn(ve[2], x[t][4], qe);
                    qe = __fmaf_rn(ve[3], x[t][6], qe);
                    float qo = vo[0] * x[t][1];
                    qo = __fmaf_rn(vo[1], x[t][3], qo);
                    qo = __fmaf_rn(vo[2], x[t][5], qo);
                    qo = __fmaf_rn(vo[3], x[t][7], qo);
                    /* qo * 1/16 is exact, so the fma rounds once as the add did */
                    float q = __fmaf_rn(qo, 0.0625f, qe);
                    part[r][t] = p == 0 ? q : part[r][t] + q;
                }
            } else {
                float v[8];
                dense_piece<F>(raw[r], p, v);
#pragma unroll
                for (int t = 0; t < TB; t++) {
                    if (t >= ntok) continue;
                    float q = v[0] * x[t][0];
#pragma unroll
                    for (int e = 1; e < 8; e++) q = __fmaf_rn(v[e], x[t][e], q);
                    part[r][t] = p == 0 ? q : part[r][t] + q;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < TB; t++) {
            if (t >= ntok) continue;
            if (F == QF_FP8 || F == QF_INT4) acc[r][t] = __fmaf_rn(part[r][t], s[r], acc[r][t]);
            else acc[r][t] = acc[r][t] + part[r][t];
        }
}

/* Row `row` of a weight's scales: FP8 its block row, INT4 its group scales. */
template <int F>
static __device__ __forceinline__ const void *qscale_row(const QView &W, const void *scale, int64_t row) {
    if (F == QF_FP8) return (const float *)scale + (row / W.block) * W.sstride;
    if (F == QF_INT4) return (const uint16_t *)scale + row * W.sstride;
    return scale;
}

/*
 * The whole warp: out[r][t] = sum_j x_t[j] * w_r[row_r][j] for t < ntok, in every lane.
 * Row r lives in the weight with data wd[r] and scales ws[r]; all R weights share
 * W's shape and format (gate and up of one expert, or R rows of one matrix).
 * Each lane issues the loads of U chunks x R rows (16 bytes each) before using any
 * of them, so that many bytes are in flight per warp; the chunks are then consumed
 * in increasing order, so U changes nothing in the arithmetic.
 * warp_dot_act is the general form (GATED: xr the gate rows, ur the up rows;
 * qchunk), warp_dot the plain product.
 */
/* PRE: the caller has not waited for its grid dependencies yet (griddepcontrol.wait):
 * the first U chunks of weights and scales are loaded, then the wait, then anything
 * else.  Only for weights no kernel of the graph writes (the model's); the loads of a
 * kernel launched early by a programmatic edge then overlap its predecessor. */
template <int F, int R, int TB, int U, bool GATED, bool PRE = false>
static __device__ __forceinline__ void warp_dot_act(const QView &W, const uint8_t *const (&wd)[R],
                                                    const void *const (&ws)[R], const int64_t (&row)[R],
                                                    const float *const (&xr)[TB], const float *const (&ur)[TB],
                                                    int ntok, bool xvec, float (&out)[R][TB]) {
    const int lane = threadIdx.x & 31;
    float acc[R][TB];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < TB; t++) acc[r][t] = 0.0f;
    const uint8_t *rb[R];
    const void *sr[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        rb[r] = wd[r] + row[r] * W.row_bytes;
        sr[r] = qscale_row<F>(W, ws[r], row[r]);
    }
    for (int64_t cb = lane;; cb += 32 * U) {
        QRaw raw[U][R];
        float sc[U][R];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (cb + 32 * u < W.nchunks) {
#pragma unroll
                for (int r = 0; r < R; r++) qload<F>(W, rb[r], sr[r], cb + 32 * u, raw[u][r], sc[u][r]);
            }
        if (PRE && cb == lane) DDT_GRID_DEP_WAIT(); /* every lane, with or without chunks */
        if (cb >= W.nchunks) break;
#pragma unroll
        for (int u = 0; u < U; u++)
            if (cb + 32 * u < W.nchunks)
                qchunk<F, R, TB, GATED>(raw[u], sc[u], (cb + 32 * u) * QFmt<F>::CW, W.cols, xr, ur, ntok, xvec,
                                        acc);
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < TB; t++) {
            float v = acc[r][t];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, off);
            out[r][t] = v;
        }
}

template <int F, int R, int TB, int U>
static __device__ __forceinline__ void warp_dot(const QView &W, const uint8_t *const (&wd)[R],
                                                const void *const (&ws)[R], const int64_t (&row)[R],
                                                const float *const (&xr)[TB], int ntok, bool xvec,
                                                float (&out)[R][TB]) {
    warp_dot_act<F, R, TB, U, false>(W, wd, ws, row, xr, xr, ntok, xvec, out);
}

/* One weight element (row, col) dequantised exactly as ddt_cpu_dequant does, in
 * two steps so a caller can issue many loads before it decodes any (the x W
 * kernel): qelem_load fetches the raw bits (and the FP8 / INT4 scale),
 * qelem_decode turns them into the value. */
template <int F>
static __device__ __forceinline__ void qelem_load(const ddt_qweight &w, int64_t row, int64_t col, uint32_t &bits,
                                                  float &scale) {
    if (F == QF_F32) {
        bits = ((const uint32_t *)w.data)[row * w.cols + col];
    } else if (F == QF_BF16 || F == QF_F16) {
        bits = ((const uint16_t *)w.data)[row * w.cols + col];
    } else if (F == QF_FP8) {
        bits = ((const uint8_t *)w.data)[row * w.cols + col];
        const int64_t scols = (w.cols + w.block - 1) / w.block;
        scale = w.scale_inv[(row / w.block) * scols + col / w.block];
    } else {
        const int64_t words = (w.cols + 7) / 8, groups = (w.cols + w.group - 1) / w.group;
        bits = ((const uint32_t *)w.data)[row * words + (col >> 3)];
        scale = __uint_as_float((uint32_t)w.scale[row * groups + col / w.group] << 16);
    }
}

template <int F> static __device__ __forceinline__ float qelem_decode(uint32_t bits, float scale, int64_t col) {
    if (F == QF_F32) return __uint_as_float(bits);
    if (F == QF_BF16) return __uint_as_float(bits << 16);
    if (F == QF_F16) return __half2float(__ushort_as_half((unsigned short)bits));
    if (F == QF_FP8) {
        __half_raw hr = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)bits, __NV_E4M3);
        const float f = __half2float(*reinterpret_cast<__half *>(&hr));
        return f * scale;
    }
    const int32_t q = (int32_t)((bits >> (4 * (col & 7))) & 0xFu) - 8;
    return (float)q * scale;
}

template <int F> static __device__ __forceinline__ float qelem(const ddt_qweight &w, int64_t row, int64_t col) {
    uint32_t bits;
    float scale = 0.0f;
    qelem_load<F>(w, row, col, bits, scale);
    return qelem_decode<F>(bits, scale, col);
}

/* The same for a format known only at run time (the embedding). */
static __device__ __forceinline__ float qdeq_elem(const ddt_qweight &w, int64_t row, int64_t col) {
    switch (w.format) {
    case DDT_Q_DENSE:
        if (w.dtype == DDT_DTYPE_F32) return qelem<QF_F32>(w, row, col);
        if (w.dtype == DDT_DTYPE_BF16) return qelem<QF_BF16>(w, row, col);
        return qelem<QF_F16>(w, row, col);
    case DDT_Q_FP8_BLOCK: return qelem<QF_FP8>(w, row, col);
    case DDT_Q_INT4_GROUP: return qelem<QF_INT4>(w, row, col);
    }
    return __int_as_float(0x7FC00000);
}

#endif
