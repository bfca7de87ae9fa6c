/*
 * qmatmul_tc.cuh — the tensor-core path of the quantised matmuls
 * (DDT_CUDA_MM_TENSOR), device code shared by qmatmul_cuda.cu (dense x W^T) and
 * moe_cuda.cu (routed experts): mma.sync m16n8k16, bf16 x bf16 -> fp32.
 *
 * Operands.  The weights are the A operand (16 rows per m-tile), dequantised to
 * bf16 in registers with no rounding: bf16 as is, FP8 E4M3 via f16 (every E4M3
 * value is a bf16 value), INT4 by or-ing the nibble into the mantissa of 128.0
 * (0x4300 | q = 128 + q) and subtracting 136.  The tokens are the N dimension (8
 * per n-tile, unused columns zero).  The fp32 activations are split into
 * x_hi = bf16(x) and x_lo = bf16(x - x_hi) and each tile is multiplied twice, so
 * the products carry about 16 mantissa bits of x (relative error about 2^-17 per
 * term, instead of 2^-9 for plain bf16 activations).  FP8 block scales and INT4
 * group scales multiply fp32 partial sums: every 32-column sub-chunk (one INT4
 * group, a quarter of an FP8 block) starts a fresh accumulator p, and
 * acc = fma(scale, p, acc) once the sub-chunk is done, so the weights stay exact.
 *
 * k order.  Inside a sub-chunk the 32 columns may be fed to the mma in any
 * order as long as A and B agree (the product sums over k).  Lane (g, t) of a
 * warp (g = lane / 4, t = lane % 4) reads the 8 contiguous columns 8t .. 8t+7 of
 * its weight rows (16 bf16 bytes, 8 FP8 bytes or one INT4 word) and uses them
 * for both k-steps of the sub-chunk; tc_col() says which of the 8 feeds which
 * mma slot, and the activations are staged in shared memory in exactly that
 * order (tc_stage), so a lane reads its B fragment with one 16-byte load.
 *
 * Work split and arithmetic order (the determinism contract).  A block has
 * MW x 4 warps: MW row groups, each of 2 m-tiles (32 weight rows, or 16 gate +
 * 16 up rows), and 4 k-slices: k-slice w takes sub-chunks w, w+4, w+8, ... of
 * the row in increasing order.  The 4 slices are added ((s0 + s1) + s2) + s3.
 * That order depends only on the number of columns: the n-tile count NT, the
 * staging depth SU and MW change which registers and blocks do the work, never
 * the operations a (row, token) pair goes through, so a token gives the same
 * bits alone or in any batch (checked bitwise by the tests).
 *
 * Pipeline.  The block stages the activations of SU units (4 sub-chunks each)
 * for its NT x 8 tokens in shared memory as bf16 hi/lo; each warp keeps the
 * packed weights of SU sub-chunks in a register ring and refills a slot as soon
 * as it is consumed, so one stage of weight loads is always in flight across
 * the barriers.
 */
#ifndef DDT_CUDA_QMATMUL_TC_CUH
#define DDT_CUDA_QMATMUL_TC_CUH

#include <cuda_bf16.h>

#include "backend/cuda/qmatmul_dev.cuh"

#define TC_KW 4      /* k-slices (warps) per row group */
#define TC_SUBB 128  /* shared bytes of one token's sub-chunk: 32 columns x (hi, lo) bf16 */

enum { TC_DENSE = 0, TC_GATEUP, TC_DOWN };

/* A routed-expert work item (moe_cuda.cu's sort writes them): one expert's
 * weights (gate, up, down data and scales) and at most C of its entry slots. */
struct MoeItem {
    const uint8_t *d[3];
    const void *s[3];
    int32_t off, cnt; /* cnt 0: no work */
};

/* Everything a tensor-core launch needs (dense or expert). */
struct TcArgs {
    QView W;
    int64_t rows;                       /* output rows (dense: per group; MoE: inter or hidden) */
    /* dense */
    int64_t w_row_stride, w_row_offset;
    int32_t count;
    const float *x;                     /* dense / gate-up input */
    int64_t ldx, x_stride;
    int32_t n;
    float *y;                           /* dense output, MoE h (gate-up) or o (down) */
    int64_t ldy, y_stride;
    bool xvec;                          /* every staged x row 16-byte aligned */
    /* MoE */
    const MoeItem *items;
    const int32_t *sorted_tok;
    const float *h;                     /* down input [entries][inter] */
};

/* Packed weights of one sub-chunk for one lane: [tile][row half (g, g+8)]. */
template <int F> struct TcRaw;
template <> struct TcRaw<QF_BF16> {
    uint4 v[2][2];
};
template <> struct TcRaw<QF_FP8> {
    uint2 v[2][2];
    float s[2][2];
};
template <> struct TcRaw<QF_INT4> {
    uint32_t v[2][2];
    uint32_t s[2][2]; /* raw bf16 bits: converted where used, so no instruction waits on the load early */
};

/* Which of a lane's 8 columns feeds k-step s, B register r (k 2t.. or 2t+8..), half hh. */
template <int F> static __host__ __device__ constexpr int tc_col(int s, int r, int hh) {
    /* INT4: a word holds nibbles 0..7; (w >> 4i) & 0x000F000F pairs nibble i with i+4 */
    return F == QF_INT4 ? 2 * s + r + 4 * hh : 4 * s + 2 * r + hh;
}

/* Pointers to the 4 weight rows a lane reads and their scale rows. */
struct TcRows {
    const uint8_t *p[2][2];
    const void *s[2][2];
};

template <int F>
static __device__ __forceinline__ void tc_load(const TcRows &R, int64_t sc, int64_t cols, bool wvec, int t,
                                               int32_t block, TcRaw<F> &raw) {
    const int64_t c0 = sc * 32 + 8 * t; /* this lane's first column */
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if constexpr (F == QF_INT4) {
                /* columns are a multiple of 32: a valid sub-chunk is whole */
                raw.v[a][h] = __ldg((const uint32_t *)(R.p[a][h] + sc * 16 + 4 * t));
                raw.s[a][h] = __ldg((const uint16_t *)R.s[a][h] + sc);
            } else if constexpr (F == QF_FP8) {
                if (wvec && c0 + 8 <= cols) {
                    raw.v[a][h] = __ldg((const uint2 *)(R.p[a][h] + c0));
                } else { /* odd widths: byte by byte, zero past the row */
                    uint32_t wd[2] = {0u, 0u};
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        if (c0 + e < cols) wd[e >> 2] |= (uint32_t)R.p[a][h][c0 + e] << (8 * (e & 3));
                    raw.v[a][h] = make_uint2(wd[0], wd[1]);
                }
                raw.s[a][h] = __ldg((const float *)R.s[a][h] + (sc * 32) / block);
            } else {
                if (wvec && c0 + 8 <= cols) {
                    raw.v[a][h] = __ldg((const uint4 *)(R.p[a][h] + c0 * 2));
                } else {
                    uint32_t wd[4] = {0u, 0u, 0u, 0u};
                    const uint16_t *rp = (const uint16_t *)R.p[a][h];
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        if (c0 + e < cols) wd[e >> 1] |= (uint32_t)rp[c0 + e] << (16 * (e & 1));
                    raw.v[a][h] = make_uint4(wd[0], wd[1], wd[2], wd[3]);
                }
            }
        }
}

static __device__ __forceinline__ void tc_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* nibbles i and i+4 of w as a bf16 pair (q - 8), exactly */
static __device__ __forceinline__ uint32_t tc_int4_pair(uint32_t w, int i) {
    uint32_t v = ((w >> (4 * i)) & 0x000F000Fu) | 0x43004300u; /* 128 + q in each half */
    const uint32_t k136 = 0x43084308u;                          /* 136.0 in each half */
    __nv_bfloat162 r = __hsub2(*reinterpret_cast<const __nv_bfloat162 *>(&v),
                               *reinterpret_cast<const __nv_bfloat162 *>(&k136));
    return *reinterpret_cast<uint32_t *>(&r);
}

/* two E4M3 bytes (low byte = lower column) as a bf16 pair, exactly */
static __device__ __forceinline__ uint32_t tc_fp8_pair(uint32_t w16) {
    __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w16 & 0xFFFFu), __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<__half2 *>(&hr));
    __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    return *reinterpret_cast<uint32_t *>(&b);
}

/* A fragments [tile][k-step][reg] of one sub-chunk (regs: row g k-lo, row g+8 k-lo,
 * row g k-hi, row g+8 k-hi, as mma.sync's A layout). */
template <int F>
static __device__ __forceinline__ void tc_dequant(const TcRaw<F> &raw, uint32_t (&A)[2][2][4]) {
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int s = 0; s < 2; s++)
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint32_t v;
                    if constexpr (F == QF_INT4) {
                        v = tc_int4_pair(raw.v[a][h], 2 * s + r);
                    } else if constexpr (F == QF_FP8) {
                        const uint32_t w = s == 0 ? raw.v[a][h].x : raw.v[a][h].y;
                        v = tc_fp8_pair(r == 0 ? w : w >> 16);
                    } else {
                        v = u4_get(raw.v[a][h], 2 * s + r);
                    }
                    A[a][s][2 * r + h] = v;
                }
}

/*
 * One sub-chunk for the warp's 2 tiles and NT n-tiles.  xs: the staged sub-chunk
 * of token 0 (token i at xs + i * tstride).
 */
template <int F, int NT>
static __device__ __forceinline__ void tc_compute(const TcRaw<F> &raw, const uint8_t *xs, int tstride, int lane,
                                                  float (&acc)[2][NT][4]) {
    const int g = lane >> 2, t = lane & 3;
    uint32_t A[2][2][4];
    tc_dequant<F>(raw, A);
    float sc[2][2];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if constexpr (F == QF_INT4) sc[a][h] = __uint_as_float(raw.s[a][h] << 16);
            else if constexpr (F == QF_FP8) sc[a][h] = raw.s[a][h];
            else sc[a][h] = 1.0f;
        }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const uint8_t *xb = xs + (nt * 8 + g) * tstride + t * 16;
        const uint4 b0 = *(const uint4 *)xb;        /* step 0: {hi r0, hi r1, lo r0, lo r1} */
        const uint4 b1 = *(const uint4 *)(xb + 64); /* step 1 */
#pragma unroll
        for (int a = 0; a < 2; a++) {
            if constexpr (F == QF_BF16) { /* no scale: one accumulator over the whole row */
                tc_mma(acc[a][nt], A[a][0], b0.x, b0.y);
                tc_mma(acc[a][nt], A[a][0], b0.z, b0.w);
                tc_mma(acc[a][nt], A[a][1], b1.x, b1.y);
                tc_mma(acc[a][nt], A[a][1], b1.z, b1.w);
            } else {
                float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                tc_mma(p, A[a][0], b0.x, b0.y);
                tc_mma(p, A[a][0], b0.z, b0.w);
                tc_mma(p, A[a][1], b1.x, b1.y);
                tc_mma(p, A[a][1], b1.z, b1.w);
                acc[a][nt][0] = __fmaf_rn(sc[a][0], p[0], acc[a][nt][0]);
                acc[a][nt][1] = __fmaf_rn(sc[a][0], p[1], acc[a][nt][1]);
                acc[a][nt][2] = __fmaf_rn(sc[a][1], p[2], acc[a][nt][2]);
                acc[a][nt][3] = __fmaf_rn(sc[a][1], p[3], acc[a][nt][3]);
            }
        }
    }
}

static __device__ __forceinline__ uint32_t tc_pack(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    __nv_bfloat162 b = __halves2bfloat162(lo, hi);
    return *reinterpret_cast<uint32_t *>(&b);
}

/*
 * Stage units [u0, u0 + SU) of the block's first ntok tokens (row pointers xrows)
 * as bf16 hi/lo in fragment order; zeros past cols.  Each item is one token's 8
 * columns of one lane slot of one sub-chunk.  The padding tokens' rows were zeroed
 * once (tc_zero_padding) and are never written here: at decode, 7 of the 8 tokens
 * of the n-tile are padding.
 */
template <int F, int NT, int SU>
static __device__ __forceinline__ void tc_stage(uint8_t *xs, const float *const *xrows, int ntok, int64_t u0,
                                                int64_t cols, bool xvec, int tstride) {
    const int items = ntok * (SU * TC_KW * 4);
    for (int it = threadIdx.x; it < items; it += blockDim.x) {
        const int t = it & 3, c = (it >> 2) % (SU * TC_KW), i = it / (4 * SU * TC_KW);
        const int64_t col0 = (u0 * TC_KW + c) * 32 + 8 * t;
        const float *xr = xrows[i];
        float f[8];
        if (xvec && col0 + 8 <= cols) {
            const float4 p = *(const float4 *)(xr + col0), q = *(const float4 *)(xr + col0 + 4);
            f[0] = p.x, f[1] = p.y, f[2] = p.z, f[3] = p.w, f[4] = q.x, f[5] = q.y, f[6] = q.z, f[7] = q.w;
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) f[e] = col0 + e < cols ? xr[col0 + e] : 0.0f;
        }
        __nv_bfloat16 hi[8], lo[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            hi[e] = __float2bfloat16_rn(f[e]);
            lo[e] = __float2bfloat16_rn(f[e] - __bfloat162float(hi[e])); /* the difference is exact */
        }
        uint8_t *dst = xs + i * tstride + c * TC_SUBB + t * 16;
#pragma unroll
        for (int s = 0; s < 2; s++) {
            const int k00 = tc_col<F>(s, 0, 0), k01 = tc_col<F>(s, 0, 1);
            const int k10 = tc_col<F>(s, 1, 0), k11 = tc_col<F>(s, 1, 1);
            *(uint4 *)(dst + 64 * s) = make_uint4(tc_pack(hi[k00], hi[k01]), tc_pack(hi[k10], hi[k11]),
                                                  tc_pack(lo[k00], lo[k01]), tc_pack(lo[k10], lo[k11]));
        }
    }
}

/* Zero the staged rows of tokens ntok .. NT*8-1 (bf16 zero is all-zero bits). */
template <int NT>
static __device__ __forceinline__ void tc_zero_padding(uint8_t *xs, int ntok, int tstride) {
    uint4 *p = (uint4 *)(xs + ntok * tstride);
    const int count = (NT * 8 - ntok) * tstride / 16;
    for (int i = threadIdx.x; i < count; i += blockDim.x) p[i] = make_uint4(0u, 0u, 0u, 0u);
}

/* Bytes of dynamic shared memory: the x stage, reused for the k-slice reduction. */
static __host__ __device__ constexpr int tc_tstride(int SU) { return SU * TC_KW * TC_SUBB + 64; }
static __host__ __device__ constexpr int tc_smem_bytes(int NT, int SU, int MW) {
    return NT * 8 * tc_tstride(SU) > MW * 2 * NT * 128 * 4 ? NT * 8 * tc_tstride(SU) : MW * 2 * NT * 128 * 4;
}

/*
 * The kernel.  KIND:
 *   TC_DENSE  grid.x = (group, row block, token block), token block fastest;
 *             row block = MW x 32 rows; y[t][g*y_stride + o]
 *   TC_GATEUP grid (item, row block of MW x 16 intermediate rows): tile 0 gate,
 *             tile 1 up; h[entry][o] = silu(gate) * up
 *   TC_DOWN   grid (item, row block of MW x 32 hidden rows); o[entry][o]
 */
template <int F, int KIND, int NT, int SU, int MW>
static __global__ void __launch_bounds__(MW * TC_KW * 32) tc_kernel(const TcArgs a) {
    extern __shared__ __align__(16) uint8_t tc_smem[];
    __shared__ const float *xrows[NT * 8];
    constexpr int NTOK = NT * 8, TSTRIDE = tc_tstride(SU);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int kw = warp % TC_KW, mw = warp / TC_KW;

    /* ---- what this block computes */
    int64_t grp = 0, o_base;
    int32_t t0 = 0, ntok;
    MoeItem item = {};
    if constexpr (KIND == TC_DENSE) {
        const int64_t nrb = (a.rows + 32 * MW - 1) / (32 * MW), ntb = (a.n + NTOK - 1) / NTOK;
        const int64_t bid = blockIdx.x, rest = bid / ntb;
        t0 = (int32_t)(bid % ntb) * NTOK;
        grp = rest / nrb;
        o_base = (rest % nrb) * (32 * MW) + mw * 32;
        ntok = a.n - t0 < NTOK ? a.n - t0 : NTOK;
        if (threadIdx.x < NTOK)
            xrows[threadIdx.x] =
                (int)threadIdx.x < ntok ? a.x + (int64_t)(t0 + threadIdx.x) * a.ldx + grp * a.x_stride : nullptr;
    } else {
        item = a.items[blockIdx.x];
        if (item.cnt == 0) return; /* the whole block: no barrier has been reached */
        ntok = item.cnt;
        o_base = (int64_t)blockIdx.y * (KIND == TC_GATEUP ? 16 * MW : 32 * MW) + mw * (KIND == TC_GATEUP ? 16 : 32);
        if (threadIdx.x < NTOK) {
            const float *r = nullptr;
            if ((int)threadIdx.x < ntok) {
                const int e = item.off + threadIdx.x;
                r = KIND == TC_GATEUP ? a.x + (int64_t)a.sorted_tok[e] * a.ldx : a.h + (int64_t)e * a.W.cols;
            }
            xrows[threadIdx.x] = r;
        }
    }

    /* ---- the lane's weight rows (rows past the end read the last row; never stored) */
    TcRows R;
#pragma unroll
    for (int ti = 0; ti < 2; ti++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int64_t o = o_base + (KIND == TC_GATEUP ? 0 : 16 * ti) + g + 8 * h;
            if (o >= a.rows) o = a.rows - 1;
            const uint8_t *base;
            const void *sbase;
            int64_t wrow = o;
            if constexpr (KIND == TC_DENSE) {
                base = a.W.data, sbase = a.W.scale;
                wrow = grp * a.w_row_stride + a.w_row_offset + o;
            } else if constexpr (KIND == TC_GATEUP) {
                base = item.d[ti], sbase = item.s[ti];
            } else {
                base = item.d[2], sbase = item.s[2];
            }
            R.p[ti][h] = base + wrow * a.W.row_bytes;
            R.s[ti][h] = qscale_row<F>(a.W, sbase, wrow);
        }

    const int64_t cols = a.W.cols, nsub = (cols + 31) / 32;
    const int64_t nunits = (nsub + TC_KW - 1) / TC_KW, nst = (nunits + SU - 1) / SU;
    const bool xvec = KIND == TC_DOWN ? cols % 4 == 0 : a.xvec;
    float acc[2][NT][4];
#pragma unroll
    for (int ti = 0; ti < 2; ti++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[ti][nt][c] = 0.0f;
    tc_zero_padding<NT>(tc_smem, ntok, TSTRIDE); /* ordered before any read by the loop's first barrier */
    TcRaw<F> ring[SU];
#pragma unroll
    for (int j = 0; j < SU; j++) {
        const int64_t sc = (int64_t)j * TC_KW + kw;
        if (sc < nsub) tc_load<F>(R, sc, cols, a.W.wvec, t, a.W.block, ring[j]);
    }
    for (int64_t st = 0; st < nst; st++) {
        __syncthreads(); /* the previous stage's reads are done (and xrows is set) */
        tc_stage<F, NT, SU>(tc_smem, xrows, ntok, st * SU, cols, xvec, TSTRIDE);
        __syncthreads();
#pragma unroll
        for (int j = 0; j < SU; j++) {
            const int64_t sc = (st * SU + j) * TC_KW + kw;
            if (sc < nsub) tc_compute<F, NT>(ring[j], tc_smem + (j * TC_KW + kw) * TC_SUBB, TSTRIDE, lane, acc);
            const int64_t sn = sc + (int64_t)SU * TC_KW;
            if (sn < nsub) tc_load<F>(R, sn, cols, a.W.wvec, t, a.W.block, ring[j]);
        }
    }

    /* ---- k-slices in a fixed order: slice 0 adds 1, then 2, then 3 */
    float *red = (float *)tc_smem + mw * (2 * NT * 128);
#pragma unroll 1
    for (int k = 1; k < TC_KW; k++) {
        __syncthreads();
        if (kw == k)
#pragma unroll
            for (int ti = 0; ti < 2; ti++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int c = 0; c < 4; c++) red[((ti * NT + nt) * 4 + c) * 32 + lane] = acc[ti][nt][c];
        __syncthreads();
        if (kw == 0)
#pragma unroll
            for (int ti = 0; ti < 2; ti++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        acc[ti][nt][c] = acc[ti][nt][c] + red[((ti * NT + nt) * 4 + c) * 32 + lane];
    }
    if (kw != 0) return;

    /* ---- store: accumulator c of lane (g, t) is row g + 8 (c / 2), token 2t + c % 2 */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int tok = nt * 8 + 2 * t + (c & 1);
            if (tok >= ntok) continue;
            const int64_t rloc = g + 8 * (c >> 1);
            if constexpr (KIND == TC_GATEUP) {
                const int64_t o = o_base + rloc;
                if (o < a.rows) {
                    const float gv = acc[0][nt][c], uv = acc[1][nt][c];
                    a.y[(int64_t)(item.off + tok) * a.rows + o] = gv / (1.0f + expf(-gv)) * uv;
                }
            } else {
#pragma unroll
                for (int ti = 0; ti < 2; ti++) {
                    const int64_t o = o_base + 16 * ti + rloc;
                    if (o >= a.rows) continue;
                    if constexpr (KIND == TC_DENSE)
                        a.y[(int64_t)(t0 + tok) * a.ldy + grp * a.y_stride + o] = acc[ti][nt][c];
                    else
                        a.y[(int64_t)(item.off + tok) * a.rows + o] = acc[ti][nt][c];
                }
            }
        }
}

#endif
