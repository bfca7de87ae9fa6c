/*
 * wstream.cuh — the weight-streaming tensor-core matmul (DDT_CUDA_MM_TENSOR),
 * device code shared by qmatmul_cuda.cu (dense x W^T, grouped) and moe_cuda.cu
 * (routed experts: gate/up fused with SiLU-mul, down).  One kernel serves every
 * token count: n picks how many 8-token n-tiles a block carries (NT), never the
 * arithmetic a (row, token) pair goes through.
 *
 * Why this shape.  Verifying a tree of n <= 64 tokens must cost about what one
 * decode step costs: a step is bound by reading the weights, so every weight
 * byte is read from DRAM once for all n tokens, at the copy bandwidth.  The
 * weights are the mma's M side (16-row m-tiles) and the tokens its N side (8 per
 * n-tile), so n = 1 pads to 8 columns, not to a 64-row tile ("swap AB").
 *
 * Packed layout (made once at load by ddt_cuda_qweight_pack, qmatmul_cuda.cu).
 * A weight [rows, cols] is cut into m-tiles of 16 rows and units of 32 columns
 * (zero past the edges); unit (mt, u) is UB contiguous bytes at
 * packed + (mt * NU + u) * UB, NU = ceil(cols / 32), m-tiles in order, so a block
 * streaming MT m-tiles over K copies MT long contiguous runs.  Inside a unit the
 * bytes are in the order lane l of a warp wants its A fragments of
 * mma.m16n8k16 (g = l / 4, t = l % 4; rows r0 = g, r1 = g + 8):
 *   k-step j (columns 16j .. 16j+15 of the unit) feeds the mma's k-slots in the
 *   permuted order slot 2t, 2t+1, 2t+8, 2t+9 <- columns 4t, 4t+1, 4t+2, 4t+3,
 *   so a lane's B fragment is the 4 consecutive activations x[4t .. 4t+3] (one
 *   16-byte shared load) and its A fragment is
 *     a0 = W[r0][4t, 4t+1], a1 = W[r1][4t, 4t+1], a2 = W[r0][4t+2, 4t+3], a3 = W[r1][4t+2, 4t+3].
 *   BF16 (UB 1024): bytes j*512 + l*16: the four bf16 pairs a0..a3 of step j.
 *   FP8  (UB 512):  bytes l*16 + j*8 + 2r: the two E4M3 bytes of a_r, step j.
 *   INT4 (UB 256):  bytes l*8 + 4j: one word per step; nibble i (i < 4) is the
 *                   lower column of a_i, nibble i + 4 its upper column (raw
 *                   stored nibbles, value = nibble - 8), so (w >> 4i) & 0x000F000F
 *                   is a_i's bf16 pair after an or and a subtract (exact).
 *                   Scales: 32 bytes per unit at scales + (mt * NU + u) * 32,
 *                   g * 4: bf16 scale of row r0, then of row r1 (group u).
 *   FP8 scales stay in the checkpoint's [ceil(rows/B)][ceil(cols/B)] table: a
 *   unit and an m-tile lie inside one block when B % 32 == 0.
 *
 * Arithmetic order (the determinism contract).  A block's warps are KW k-slices
 * (4, INT4 8: fixed per format) of each token group: slice w takes units w,
 * w+KW, w+2KW, ... of its k-range in increasing order.
 * BF16 accumulates the whole slice in one fp32 accumulator; FP8 and INT4 start
 * a fresh partial p per unit (one INT4 group, a quarter of an FP8 block) and add
 * acc = fma(scale, p, acc).  Activations enter as x_hi = bf16(x), x_lo =
 * bf16(x - x_hi) (ws_split: 16 mantissa bits of x in two mmas; weights exact).
 * The k-range is split over KS blocks of a thread-block cluster, KS fixed by
 * the weight's shape (ws_ksplit), and the KW x KS partials are summed in one
 * fixed order (split-major, slice-minor) through distributed shared memory.
 * None of this depends on n, NT, MT, the stage count or which tokens share a
 * launch, so a token's result has the same bits alone or in any batch (tested
 * bitwise).
 *
 * Split activations.  x_hi and x_lo are made once per product, before the
 * kernel, not by every block: each row block used to re-split the whole staged
 * fp32 activation, and that made the ALU the busiest pipe at n = 64 (ncu, LM
 * head and q_b).  Made by a pre-pass for the dense products (qmatmul_cuda.cu),
 * by extra blocks of the sort launch for the experts' x (moe_cuda.cu) and by
 * the gate/up epilogue for the down projection's h.  A split row of K columns
 * holds nu = ceil(K/32) units of 8 quads (16 bytes each, zeros past K); quad
 * q, columns 4q .. 4q+3, is ws_split of those four values:
 *   {bf16x2 hi(x0, x1), hi(x2, x3), lo(x0, x1), lo(x2, x3)}
 * i.e. a lane's B fragments of the hi and the lo mma, one 16-byte shared load,
 * and as many bytes as the fp32 values, so the stages keep their size.  As u16:
 * column c's hi at 8 (c / 4) + c % 4, its lo 4 further (ws_store_split).  The
 * same ws_split as before on the same values: the bits of every output stay.
 *
 * Pipeline.  S stages of (MT m-tiles x KW units of weights, up to NT*8 tokens x
 * KW units of split activations) in shared memory, filled by cp.async (16-byte
 * chunks, L1 bypassed, zero-filled past the row) S-1 stages ahead; one barrier
 * per stage.
 */
#ifndef DDT_CUDA_WSTREAM_CUH
#define DDT_CUDA_WSTREAM_CUH

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "backend/cuda/cp_async_dev.cuh"
#include "backend/cuda/qmatmul_dev.cuh"

namespace ws_cg = cooperative_groups;

#define WS_UNIT 32     /* columns per unit */

enum { WS_DENSE = 0, WS_GATEUP, WS_DOWN };

template <int F> struct WsFmt;
template <> struct WsFmt<QF_BF16> { static constexpr int UB = 1024, SB = 0; };
template <> struct WsFmt<QF_FP8> { static constexpr int UB = 512, SB = 0; };
template <> struct WsFmt<QF_INT4> { static constexpr int UB = 256, SB = 32; };

/* k-slices KW (warps per token group, units per stage): fixed per format, never
 * by n.  INT4 units are 256 bytes, so INT4 takes 8 slices: twice the warps and
 * bytes per stage for the same instruction overheads. */
template <int F> static __host__ __device__ constexpr int ws_kw() { return F == QF_INT4 ? 8 : 4; }
/* shared bytes per token row of a stage: KW units of split activations (KW*32
 * columns, 4 bytes each) + 64 pad (rows alternate bank halves) */
template <int F> static __host__ __device__ constexpr int ws_xrow() { return ws_kw<F>() * 128 + 64; }
/* Per n-tile count NT: warps in WN token groups of NT/WN n-tiles each (so a big
 * batch is not one warp per scheduler), m-tiles per block MT (more for the
 * narrow formats, whose units are small: fewer fixed costs per byte), and
 * pipeline stages sized so NT <= 4 leaves room for two blocks per SM. */
template <int F> static __host__ __device__ constexpr int ws_wn(int NT) {
    return F == QF_INT4 ? (NT >= 8 ? 2 : 1) : (NT >= 4 ? NT / 2 : 1);
}
template <int F> static __host__ __device__ constexpr int ws_mt(int NT) { return F != QF_BF16 && NT <= 2 ? 8 : 4; }
template <int F> static __host__ __device__ constexpr int ws_stages(int NT) {
    return NT <= 2 ? 4 : F == QF_INT4 && NT == 8 ? 2 : 3; /* INT4's 64 rows of 256 columns: 2 stages fit */
}
template <int F> static __host__ __device__ constexpr int ws_wbytes(int NT) {
    return ws_mt<F>(NT) * ws_kw<F>() * (WsFmt<F>::UB + WsFmt<F>::SB);
}
/* A stage holds xcap token rows (at most NT*8: the most tokens a block of the
 * launch gets), so a decode step's stage is its weights and one row, and more
 * blocks fit an SM (issue slots, not bytes in flight, are what n = 1 runs out of). */
template <int F> static __host__ __device__ constexpr int ws_stage_bytes(int NT, int xcap) {
    return ws_wbytes<F>(NT) + xcap * ws_xrow<F>();
}
template <int F> static __host__ __device__ constexpr int ws_smem_bytes(int NT, int xcap) {
    /* the pipeline, reused at the end for the k-slice partials [KW][MT*NT*4][32];
       an n-tile reads all 8 of its rows, so 7 rows of slack follow the last stage
       (rows past xcap hold garbage, feed only unstored output columns) */
    return ws_stages<F>(NT) * ws_stage_bytes<F>(NT, xcap) + 7 * ws_xrow<F>() > ws_kw<F>() * ws_mt<F>(NT) * NT * 512
               ? ws_stages<F>(NT) * ws_stage_bytes<F>(NT, xcap) + 7 * ws_xrow<F>()
               : ws_kw<F>() * ws_mt<F>(NT) * NT * 512;
}
/* every instantiation fits the 227 KB an SM gives one block */
static_assert(ws_smem_bytes<QF_INT4>(8, 64) <= 227 * 1024 && ws_smem_bytes<QF_INT4>(4, 32) <= 227 * 1024 &&
                  ws_smem_bytes<QF_BF16>(8, 64) <= 227 * 1024 && ws_smem_bytes<QF_FP8>(8, 64) <= 227 * 1024,
              "wstream stages exceed shared memory");
template <int F> static __host__ __device__ constexpr int ws_threads(int NT) { return 32 * ws_kw<F>() * ws_wn<F>(NT); }

/* A routed-expert work item (moe_cuda.cu's sort writes them): one expert's
 * packed gate, up, down (data, INT4 scales / FP8 scale_inv) and at most C of its
 * entry slots. */
struct WsItem {
    const uint8_t *d[3];
    const void *s[3];
    int32_t off, cnt; /* cnt 0: no work */
};

struct WsArgs {
    int64_t rows;        /* output rows (dense: per group; gate/up: inter; down: hidden) */
    int64_t cols;        /* reduction length */
    int64_t nu;          /* units per row: ceil(cols / 32) */
    int64_t mtiles;      /* m-tiles of the whole packed weight */
    int32_t fp8_block, fp8_scols;
    int32_t ks;          /* k-splits = cluster size (dense only; 1 for experts) */
    int32_t xcap;        /* token rows per stage: >= any block's token count, <= NT*8 */
    int64_t units_per_split; /* a multiple of KW */
    /* split activations (rows of nu*8 quads, see the top): dense: token t, group g
       at xs + t*ldxs + g*xs_stride; gate/up: x's row of token t at xs + t*ldxs;
       down: entry e's row of h at xs + e*ldxs */
    const uint4 *xs;
    int64_t ldxs, xs_stride;
    /* dense */
    const uint8_t *wd;   /* packed data */
    const void *wsc;     /* INT4 packed scales / FP8 scale_inv */
    int64_t mt_stride, mt_offset; /* group g's rows start at m-tile g*mt_stride + mt_offset */
    int32_t count;
    int32_t n;
    float *y;            /* dense: y; down: its output [entries][rows] */
    int64_t ldy, y_stride;
    /* experts */
    const WsItem *items;
    const int32_t *sorted_tok;
    uint4 *hs;           /* gate/up: h = silu(gate) * up, split, entry e's row at hs + e * 8 ceil(rows / 32) */
};

static __device__ __forceinline__ uint32_t ws_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, bytes past `valid` zero-filled (valid 0..16). */
static __device__ __forceinline__ void ws_cp16(void *dst, const void *src, int valid) {
    cp_async_cg16_fill(ws_smem_addr(dst), src, valid);
}

/* The S-stage cp.async pipeline of ws_kernel (wgmma_experts.cuh's wx_kernel runs its
 * own, wx_pipeline, whose warps refill their weights without the barrier): stages
 * 0 .. S-2 in flight first; then per stage st, once it has landed for every thread
 * (whose barrier also frees stage st-1's buffer), stage st+S-1 is issued and body(st)
 * consumes st.  load(st) must issue nothing for st >= nst. */
template <int S, class I, class Load, class Body>
static __device__ __forceinline__ void ws_pipeline(I nst, Load load, Body body) {
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        load((I)s);
        cp_async_commit();
    }
    for (I st = 0; st < nst; st++) {
        cp_async_wait<S - 2>();
        __syncthreads();
        load(st + S - 1);
        cp_async_commit();
        body(st);
    }
}

static __device__ __forceinline__ void ws_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ uint32_t ws_bits(__nv_bfloat162 b) { return *reinterpret_cast<uint32_t *>(&b); }

/* nibbles i and i+4 of w as a bf16 pair (q - 8), exactly: 0x4300 | q is 128 + q */
static __device__ __forceinline__ uint32_t ws_int4_pair(uint32_t w, int i) {
    uint32_t v = ((w >> (4 * i)) & 0x000F000Fu) | 0x43004300u;
    const uint32_t k136 = 0x43084308u;
    __nv_bfloat162 r = __hsub2(*reinterpret_cast<const __nv_bfloat162 *>(&v),
                               *reinterpret_cast<const __nv_bfloat162 *>(&k136));
    return ws_bits(r);
}

/* two E4M3 bytes (low byte = lower column) as a bf16 pair, exactly */
static __device__ __forceinline__ uint32_t ws_fp8_pair(uint32_t w16) {
    __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w16 & 0xFFFFu), __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<__half2 *>(&hr));
    return ws_bits(__floats2bfloat162_rn(f.x, f.y));
}

/* x[4t .. 4t+3] -> B fragments (hi b0, hi b1, lo b0, lo b1) */
static __device__ __forceinline__ void ws_split(const float4 v, uint32_t (&b)[4]) {
    const __nv_bfloat162 h01 = __floats2bfloat162_rn(v.x, v.y), h23 = __floats2bfloat162_rn(v.z, v.w);
    const float2 f01 = __bfloat1622float2(h01), f23 = __bfloat1622float2(h23);
    b[0] = ws_bits(h01);
    b[1] = ws_bits(h23);
    b[2] = ws_bits(__floats2bfloat162_rn(v.x - f01.x, v.y - f01.y)); /* the differences are exact */
    b[3] = ws_bits(__floats2bfloat162_rn(v.z - f23.x, v.w - f23.y));
}

/* Quad q of a split row (see the top) from the fp32 row r of `cols` values:
 * columns 4q .. 4q+3, zero past cols (the values the old stage loader's
 * zero-filling copies gave).  vec: r is 16-byte aligned. */
static __device__ __forceinline__ uint4 ws_split_quad(const float *r, int64_t q, int64_t cols, bool vec) {
    const int64_t c = 4 * q;
    float4 v;
    if (vec && c + 4 <= cols) {
        v = *(const float4 *)(r + c);
    } else {
        v.x = c < cols ? r[c] : 0.0f;
        v.y = c + 1 < cols ? r[c + 1] : 0.0f;
        v.z = c + 2 < cols ? r[c + 2] : 0.0f;
        v.w = c + 3 < cols ? r[c + 3] : 0.0f;
    }
    uint32_t b[4];
    ws_split(v, b);
    return make_uint4(b[0], b[1], b[2], b[3]);
}

/* Split nrows fp32 rows of `cols` values (row i at row_of(i); vec: every row
 * 16-byte aligned) into out, row i at out + i*nq, nq = 8 ceil(cols / 32) quads.
 * Thread `tid` of `nth` takes quads tid, tid + nth, ... (one 16-byte store each). */
template <class RowOf>
static __device__ __forceinline__ void ws_presplit(RowOf row_of, int64_t nrows, int64_t cols, int64_t nq, bool vec,
                                                   uint4 *out, int64_t tid, int64_t nth) {
    for (int64_t i = tid; i < nrows * nq; i += nth) {
        const int64_t r = i / nq;
        out[i] = ws_split_quad(row_of(r), i - r * nq, cols, vec);
    }
}

/* One value into a split row at hs (its column c): ws_split's bits of v, as the
 * quad its four columns would give (the split is per element). */
static __device__ __forceinline__ void ws_store_split(uint4 *hs, int64_t c, float v) {
    uint32_t b[4];
    ws_split(make_float4(v, 0.0f, 0.0f, 0.0f), b);
    uint16_t *p = (uint16_t *)hs + 8 * (c >> 2) + (c & 3);
    p[0] = (uint16_t)(b[0] & 0xFFFFu); /* hi */
    p[4] = (uint16_t)(b[2] & 0xFFFFu); /* lo */
}

/*
 * The kernel.  grid.x: DENSE (k-split, token block, row block, group), the
 * k-split fastest (a cluster = the KS splits of one tile), then the token blocks
 * (more than 64 tokens re-read a tile from L2, not DRAM); GATEUP / DOWN (item,
 * row block), item fastest.  A DENSE block covers MT*16 rows, GATEUP MT/2*16
 * intermediate rows (tiles 0..MT/2-1 gate, the rest up), DOWN MT*16 hidden rows.
 * Warp (kw, wn) = (warp % 4, warp / 4): k-slice kw, n-tiles [wn*NTW, wn*NTW+NTW).
 */
template <int F, int KIND, int NT>
static __global__ void __launch_bounds__(ws_threads<F>(NT)) ws_kernel(const WsArgs a) {
    DDT_GRID_DEP_WAIT();
    constexpr int MT = ws_mt<F>(NT), S = ws_stages<F>(NT), UB = WsFmt<F>::UB, SB = WsFmt<F>::SB;
    constexpr int KW = ws_kw<F>(), XROW = ws_xrow<F>();
    constexpr int WN = ws_wn<F>(NT), NTW = NT / WN, NTH = ws_threads<F>(NT);
    constexpr int WB = ws_wbytes<F>(NT), NTOK = NT * 8;
    const int STB = ws_stage_bytes<F>(NT, a.xcap);
    constexpr int EW = MT * NTW * 4;           /* accumulators per lane */
    constexpr int WCH = UB / 16;               /* 16-byte chunks per unit */
    constexpr int NWC = MT * KW * WCH;      /* weight chunks per stage */
    constexpr int NCH = (NWC + NTH - 1) / NTH; /* of them per thread */
    constexpr int NSC = MT * KW * (SB / 16);
    static_assert(KIND != WS_GATEUP || (MT / 2 * 16) % 32 == 0, "gate/up blocks must cover h's whole units");
    extern __shared__ __align__(16) uint8_t ws_smem[];
    __shared__ const uint4 *xrows[NTOK]; /* the block's split activation rows */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int kw = warp % KW, wn = warp / KW;

    /* ---- what this block computes */
    int64_t grp = 0, rb, u_begin = 0, u_end = a.nu;
    int32_t t0 = 0, ntok, split = 0;
    WsItem item = {};
    int64_t mt_first; /* the block's first m-tile (gate/up: of gate and of up) */
    if constexpr (KIND == WS_DENSE) {
        const int64_t nrb = (a.rows + 16 * MT - 1) / (16 * MT), ntb = (a.n + NTOK - 1) / NTOK;
        int64_t bid = blockIdx.x;
        split = (int32_t)(bid % a.ks);
        bid /= a.ks;
        t0 = (int32_t)(bid % ntb) * NTOK;
        bid /= ntb;
        rb = bid % nrb;
        grp = bid / nrb;
        ntok = a.n - t0 < NTOK ? a.n - t0 : NTOK;
        u_begin = (int64_t)split * a.units_per_split;
        u_end = u_begin + a.units_per_split < a.nu ? u_begin + a.units_per_split : a.nu;
        if (threadIdx.x < NTOK)
            xrows[threadIdx.x] = (int)threadIdx.x < ntok
                                     ? a.xs + (int64_t)(t0 + threadIdx.x) * a.ldxs + grp * a.xs_stride
                                     : nullptr;
        mt_first = grp * a.mt_stride + a.mt_offset + rb * MT;
    } else {
        item = a.items[blockIdx.x];
        if (item.cnt == 0) return; /* the whole block, before any barrier */
        ntok = item.cnt;
        rb = blockIdx.y;
        if (threadIdx.x < NTOK) {
            const uint4 *r = nullptr;
            if ((int)threadIdx.x < ntok) {
                const int e = item.off + threadIdx.x;
                r = a.xs + (KIND == WS_GATEUP ? (int64_t)a.sorted_tok[e] : (int64_t)e) * a.ldxs;
            }
            xrows[threadIdx.x] = r;
        }
        mt_first = KIND == WS_GATEUP ? rb * (MT / 2) : rb * MT;
    }
    /* tile i's m-tile (spare tiles past the end re-read the last one; never stored),
       packed data and scales */
    auto tile_mt = [&](int i) -> int64_t {
        const int64_t mt = mt_first + (KIND == WS_GATEUP && i >= MT / 2 ? i - MT / 2 : i);
        return mt < a.mtiles ? mt : a.mtiles - 1;
    };
    auto tile_w = [&](int i) -> const uint8_t * {
        if constexpr (KIND == WS_DENSE) return a.wd;
        else if constexpr (KIND == WS_GATEUP) return i < MT / 2 ? item.d[0] : item.d[1];
        else return item.d[2];
    };
    auto tile_s = [&](int i) -> const void * {
        if constexpr (KIND == WS_DENSE) return a.wsc;
        else if constexpr (KIND == WS_GATEUP) return i < MT / 2 ? item.s[0] : item.s[1];
        else return item.s[2];
    };
    const int nta = (ntok + 7) >> 3; /* active n-tiles */
    const int64_t nst = u_end > u_begin ? (u_end - u_begin + KW - 1) / KW : 0; /* a last split may be empty */

    /* this thread's weight chunks: chunk c = tid + k*NTH is byte 16c of a stage's
       weights, [tile][4 units][UB], so only the source moves from stage to stage */
    const uint8_t *wsrc[NCH];
#pragma unroll
    for (int k = 0; k < NCH; k++) {
        const int c = threadIdx.x + k * NTH, i = c / (KW * WCH), r = c % (KW * WCH);
        wsrc[k] = c < NWC ? tile_w(i) + tile_mt(i) * a.nu * UB + r * 16 : nullptr;
    }
    const uint8_t *ssrc = nullptr;
    if constexpr (SB > 0) {
        const int c = threadIdx.x, i = c / (KW * (SB / 16)), r = c % (KW * (SB / 16));
        if (c < NSC) ssrc = (const uint8_t *)tile_s(i) + tile_mt(i) * a.nu * SB + r * 16;
    }
    __syncthreads(); /* xrows */

    /* ---- stage loader: units [u0, u0 + KW) of the MT tiles and of the tokens' split rows */
    auto load_stage = [&](int64_t st) {
        if (st >= nst) return;
        uint8_t *sm = ws_smem + (st % S) * STB;
        const int64_t u0 = u_begin + st * KW;
        const int nun = (int)(u_end - u0 < KW ? u_end - u0 : KW);
#pragma unroll
        for (int k = 0; k < NCH; k++) {
            const int c = threadIdx.x + k * NTH;
            if ((NWC % NTH == 0 || c < NWC) && (c % (KW * WCH)) / WCH < nun)
                ws_cp16(sm + c * 16, wsrc[k] + u0 * UB, 16);
        }
        if constexpr (SB > 0) {
            const int c = threadIdx.x;
            if (c < NSC && (c % (KW * (SB / 16))) / (SB / 16) < nun)
                ws_cp16(sm + MT * KW * UB + c * 16, ssrc + u0 * SB, 16);
        }
        /* activations: ntok rows of KW units (8 quads each), zero past the row's nu
           units (a last stage's; no warp reads them: its unit is past u_end) */
        uint8_t *xs = sm + WB;
        for (int c = threadIdx.x; c < ntok * (KW * 8); c += NTH) {
            const int tok = c / (KW * 8), q = c % (KW * 8);
            const bool in = u0 + q / 8 < a.nu;
            ws_cp16(xs + tok * XROW + q * 16, xrows[tok] + (in ? u0 * 8 + q : 0), in ? 16 : 0);
        }
    };

    float acc[MT][NTW][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int n = 0; n < NTW; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][n][c] = 0.0f;

    ws_pipeline<S>(nst, load_stage, [&](int64_t st) {
        const int64_t u = u_begin + st * KW + kw;
        if (u >= u_end || wn * NTW >= nta) return;
        const uint8_t *sm = ws_smem + (st % S) * STB;
        /* B fragments of this warp's n-tiles, both k-steps: quads t and t + 4 of the
           unit, already split (hi b0, hi b1, lo b0, lo b1) */
        uint32_t B[NTW][2][4];
        const uint8_t *xs = sm + WB + kw * 128 + g * XROW + t * 16; /* this slice's unit */
#pragma unroll
        for (int n = 0; n < NTW; n++) {
            if (wn * NTW + n >= nta) break;
            const uint8_t *xr = xs + (wn * NTW + n) * 8 * XROW;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const uint4 v = *(const uint4 *)(xr + 64 * j);
                B[n][j][0] = v.x, B[n][j][1] = v.y, B[n][j][2] = v.z, B[n][j][3] = v.w;
            }
        }
#pragma unroll
        for (int i = 0; i < MT; i++) {
            const uint8_t *wu = sm + (i * KW + kw) * UB;
            uint32_t A[2][4];
            float sc0 = 1.0f, sc1 = 1.0f;
            if constexpr (F == QF_BF16) {
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const uint4 v = *(const uint4 *)(wu + j * 512 + lane * 16);
                    A[j][0] = v.x, A[j][1] = v.y, A[j][2] = v.z, A[j][3] = v.w;
                }
            } else if constexpr (F == QF_FP8) {
                const uint4 v = *(const uint4 *)(wu + lane * 16);
                const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        const uint32_t word = wv[2 * j + (r >> 1)];
                        A[j][r] = ws_fp8_pair((r & 1) ? word >> 16 : word);
                    }
                const int64_t row0 = tile_mt(i) * 16; /* the tile's first weight row (groups start on m-tiles) */
                sc0 = sc1 =
                    __ldg((const float *)tile_s(i) + (row0 / a.fp8_block) * a.fp8_scols + (u * WS_UNIT) / a.fp8_block);
            } else {
                const uint2 v = *(const uint2 *)(wu + lane * 8);
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    A[0][r] = ws_int4_pair(v.x, r);
                    A[1][r] = ws_int4_pair(v.y, r);
                }
                const uint32_t s2 = *(const uint32_t *)(sm + MT * KW * UB + (i * KW + kw) * SB + g * 4);
                sc0 = __uint_as_float(s2 << 16);
                sc1 = __uint_as_float(s2 & 0xFFFF0000u);
            }
#pragma unroll
            for (int n = 0; n < NTW; n++) {
                if (wn * NTW + n >= nta) break;
                if constexpr (F == QF_BF16) {
                    ws_mma(acc[i][n], A[0], B[n][0][0], B[n][0][1]);
                    ws_mma(acc[i][n], A[0], B[n][0][2], B[n][0][3]);
                    ws_mma(acc[i][n], A[1], B[n][1][0], B[n][1][1]);
                    ws_mma(acc[i][n], A[1], B[n][1][2], B[n][1][3]);
                } else {
                    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    ws_mma(p, A[0], B[n][0][0], B[n][0][1]);
                    ws_mma(p, A[0], B[n][0][2], B[n][0][3]);
                    ws_mma(p, A[1], B[n][1][0], B[n][1][1]);
                    ws_mma(p, A[1], B[n][1][2], B[n][1][3]);
                    acc[i][n][0] = __fmaf_rn(sc0, p[0], acc[i][n][0]);
                    acc[i][n][1] = __fmaf_rn(sc0, p[1], acc[i][n][1]);
                    acc[i][n][2] = __fmaf_rn(sc1, p[2], acc[i][n][2]);
                    acc[i][n][3] = __fmaf_rn(sc1, p[3], acc[i][n][3]);
                }
            }
        }
    });
    cp_async_wait<0>();
    __syncthreads(); /* every warp is done with the pipeline buffers */

    /* ---- partials: red[wn][kw][e][lane], e = (i*NTW + n)*4 + c */
    float *red = (float *)ws_smem;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int n = 0; n < NTW; n++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                red[(((wn * KW + kw) * EW) + (i * NTW + n) * 4 + c) * 32 + lane] = acc[i][n][c];

    /* element q -> (token group, accumulator, lane) -> (tile, token, row); the
       k-slices (and splits) of one element are added in one fixed order */
    if constexpr (KIND == WS_DENSE) {
        const int ks = a.ks;
        if (ks > 1) ws_cg::this_cluster().sync(); /* every split's partials are in its shared memory */
        else __syncthreads();
        /* split r of the cluster finishes elements q = r*NTH + tid, then every ks*NTH-th */
        for (int q = split * NTH + threadIdx.x; q < WN * EW * 32; q += ks * NTH) {
            const int gw = q / (EW * 32), e = (q / 32) % EW, l = q & 31;
            const int c = e & 3, n = (e >> 2) % NTW, i = (e >> 2) / NTW, nt = gw * NTW + n;
            if (nt >= nta) continue;
            const int tok = nt * 8 + 2 * (l & 3) + (c & 1);
            const int64_t row = (rb * MT + i) * 16 + (l >> 2) + 8 * (c >> 1);
            if (tok >= ntok || row >= a.rows) continue;
            float v = 0.0f; /* split 0's slice 0, then the rest added in order */
            for (int r = 0; r < ks; r++) {
                const float *rr = ks > 1 ? ws_cg::this_cluster().map_shared_rank(red, r) : red;
                for (int w = 0; w < KW; w++) {
                    const float p = rr[((gw * KW + w) * EW + e) * 32 + l];
                    v = (r == 0 && w == 0) ? p : v + p;
                }
            }
            a.y[(int64_t)(t0 + tok) * a.ldy + grp * a.y_stride + row] = v;
        }
        if (ks > 1) ws_cg::this_cluster().sync(); /* no block leaves while another reads its shared memory */
    } else {
        __syncthreads();
        constexpr int EO = KIND == WS_GATEUP ? EW / 2 : EW; /* outputs per lane and token group */
        for (int q = threadIdx.x; q < WN * EO * 32; q += NTH) {
            const int gw = q / (EO * 32), e = (q / 32) % EO, l = q & 31;
            const int c = e & 3, n = (e >> 2) % NTW, i = (e >> 2) / NTW, nt = gw * NTW + n;
            if (nt >= nta) continue;
            const int tok = nt * 8 + 2 * (l & 3) + (c & 1);
            if (tok >= ntok) continue;
            const float *rg = red + (gw * KW * EW) * 32;
            float v = rg[e * 32 + l];
            for (int w = 1; w < KW; w++) v = v + rg[(w * EW + e) * 32 + l];
            if constexpr (KIND == WS_GATEUP) {
                /* h goes out split for the down launch: its row's columns past rows
                   (up to whole units) are zeros; the blocks' 8*MT rows (32 or 64)
                   cover those units */
                const int64_t row = (rb * (MT / 2) + i) * 16 + (l >> 2) + 8 * (c >> 1);
                uint4 *hrow = a.hs + (int64_t)(item.off + tok) * ((a.rows + 31) / 32 * 8);
                if (row >= a.rows) {
                    if (row < (a.rows + 31) / 32 * 32) ws_store_split(hrow, row, 0.0f);
                    continue;
                }
                const int eu = e + (MT / 2) * NTW * 4; /* the up tile of the same rows */
                float u = rg[eu * 32 + l];
                for (int w = 1; w < KW; w++) u = u + rg[(w * EW + eu) * 32 + l];
                ws_store_split(hrow, row, v / (1.0f + expf(-v)) * u);
            } else {
                const int64_t row = (rb * MT + i) * 16 + (l >> 2) + 8 * (c >> 1);
                if (row >= a.rows) continue;
                a.y[(int64_t)(item.off + tok) * a.rows + row] = v;
            }
        }
    }
}

/* Raise the dynamic shared-memory limit of the instantiations ws_kernel<F, KIND,
 * NT...> (bf16 and FP8; INT4 for dense weights only).  The kernels are static, so each file that
 * launches some sets its own (before any launch: at pack time, ahead of capture). */
template <int KIND, int... NTS> static cudaError_t ws_set_smem() {
    const cudaError_t r[] = {
        cudaFuncSetAttribute(ws_kernel<QF_BF16, KIND, NTS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             ws_smem_bytes<QF_BF16>(NTS, NTS * 8))...,
        cudaFuncSetAttribute(ws_kernel<QF_FP8, KIND, NTS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             ws_smem_bytes<QF_FP8>(NTS, NTS * 8))...,
        cudaSuccess};
    for (cudaError_t e : r)
        if (e != cudaSuccess) return e;
    /* INT4 experts run on wgmma (wgmma_experts.cuh): this stream keeps INT4 for dense weights only */
    if constexpr (KIND == WS_DENSE) {
        const cudaError_t q[] = {cudaFuncSetAttribute(ws_kernel<QF_INT4, KIND, NTS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      ws_smem_bytes<QF_INT4>(NTS, NTS * 8))...};
        for (cudaError_t e : q)
            if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

#endif
