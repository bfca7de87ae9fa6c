/*
 * wgmma_experts.cuh — the routed INT4 experts on wgmma (issue 12), device code
 * included by moe_cuda.cu: the tensor mode's gate/up (SiLU-mul fused) and down
 * launches for INT4 group-32 experts, over the sort's work items (WsItem: one
 * expert, at most WX_N of its entries).
 *
 * Why.  The mma.sync stream (wstream.cuh) dequantises each INT4 fragment and
 * issues two mma.sync per fragment and 8-token n-tile; at n >= 16 that issue
 * rate, not the weight bytes, set the time (25% of copy bandwidth at n = 32).
 * wgmma takes the dequantised weights straight from registers as its A operand
 * (the packed layout of wstream.cuh already is the m16 x k16 register fragment:
 * lane l's 8 bytes of a unit are its two k-steps' A registers), multiplies them
 * with 16 token columns from shared memory in one instruction per k-step and
 * half of the split activations, and the tensor work of an item hides under its
 * weight stream.
 *
 * Arithmetic (the determinism contract).  Per unit (one INT4 group of 32
 * columns, two k-steps) a fresh partial P of the weights times the item's token
 * columns, a token's hi and lo halves as two columns (k-step 0 overwriting P,
 * then k-step 1), and acc = fma(scale, P_hi + P_lo, acc) over the units in
 * increasing order (other bits than wstream.cuh's four k-slices).  A token's
 * value never depends on which tokens share its item, on n or on the item split.
 *
 * Item classes by entry count, one arithmetic.  A wgmma's tensor time grows with
 * its N, and most items hold few entries (a tree of 16 tokens touches ~57 experts
 * with 1-3 each), so the instruction is as narrow as the item allows:
 *   - at most 16 entries: the 16 hi rows and 16 lo rows side by side as the 32
 *     columns of m64n32k16;
 *   - at most 8: hi rows 0..7 and lo rows 0..7 of the same tile as the 16
 *     columns of m64n16k16 (only the descriptor's 8-row stride changes, 2048);
 *   - at most 4: token r's hi and lo interleaved in rows 2r, 2r + 1 of the first
 *     8-row group, the 8 columns of m64n8k16.
 * Each output is the same column dot product and the same fma chain in every
 * class, so a token's bits do not depend on its item's size.  That rests on the
 * tensor core computing a column the same way whatever N, which PTX does not
 * promise: test_cuda_moe checks it bitwise (each token alone, an item of one,
 * against batches whose experts hold up to 16); on the H200 it holds.  Two
 * m64n32k16 a unit, not four m64n16k16 with hi and lo summed in the tensor core:
 * the narrow instructions cost more tensor time than the 8 FADD they save.
 *
 * Activation layout ("wq" rows, written by the sort launch for x and by the
 * gate/up epilogue for h): a row of K columns is ceil(K / 64) blocks of 256
 * bytes, a block = 128 bytes of x_hi then 128 of x_lo for its 64 columns, each
 * 128 = 4 k-steps of 16 bf16 in the k-slot order of the packed weights: slot
 * 2t + e holds column 4t + e and slot 2t + 8 + e column 4t + 2 + e (t < 4,
 * e < 2), the order wstream.cuh's A fragments expect.  So a token's 16-byte
 * chunks go by cp.async straight into the 128-byte-swizzled K-major B tile
 * wgmma reads (row = token, 64 k-slots = 128 bytes a row).
 *
 * A CTA (WX_WG = 4 warpgroups) = one item x 256 weight rows: down, 16 m-tiles of
 * the expert's down projection; gate/up, 8 m-tiles of gate and the same 8 of up
 * (a warpgroup: 2 of gate in warps 0, 1, the same 2 of up in warps 2, 3), so the
 * SiLU-mul of 128 intermediate rows is the CTA's epilogue.  INT4 stages of 8
 * units (256 columns, WxStage): every warp's 8 packed units and their scales,
 * the item's token rows of 4 blocks (hi and lo), by cp.async, 2 stages; each warp
 * refills its own share of a stage buffer with the weights two stages on as soon as
 * it has read them (wx_pipeline), so while it waits for the next stage it has 2
 * stages' weights in flight (~64 KB a CTA; an H100's K2.6 layer 1% faster at n =
 * 4..32, thirtieth session), not one behind the CTA's barrier.  8 units a stage, not
 * 4: the stage's head (loop test, barrier, copies and their addresses, the
 * descriptor, ~70 issue slots at 4 units, ~87 at 8) is paid once for twice the
 * units, and the stream was issue-bound on the H200: ~57.5 -> ~49.6 slots a unit
 * with wx_partial's 32-bit descriptors (SASS of the m64n8k16 class).  On an H100
 * (twenty-fourth session): n = 1 99.4 -> 95.3 us, the K2.6 layer -3 us at n = 1.
 *
 * What sets the rate (H200, K2.6 experts; BENCHMARKS has the steps).  Instruction
 * issue first: ncu found ~98 instructions a 256-byte unit and 0.71-0.76 warps
 * issued a scheduler a cycle at 37-47% of copy bandwidth.  The loop is trimmed
 * to what a unit needs (~50: two shared loads, 22 of dequantisation with the
 * mask and exponent in one lop3, two wgmmas, 4-8 FADD + FFMA): 32-bit shared
 * addresses, stage sources advanced by a stride, descriptors as constant offsets
 * from the stage's, whole stages without unit tests, absent tokens' FADD / FFMA
 * compiled out.  Then the wgmmas' tensor time, which the item classes cut: n = 1
 * / 16 / 64 at 53 / 75 / 69% of copy bandwidth.  A producer warp with TMA and
 * mbarriers instead of the per-stage barrier measured no faster.  Since the
 * stages of 8 units the stream is no longer issue-bound (twenty-fifth session):
 * 4-7 fewer issue slots a unit (the INT4 bias taken off the partials instead of
 * each weight) gained nothing on an H100 or an H200, nor did each warp's weights
 * by bulk copies; at n = 1 what is left is each kernel's one-wave tail and, on
 * the H200, a per-SM limit (BENCHMARKS, "The INT4 experts at n = 1 CTA by CTA").
 */
#ifndef DDT_CUDA_WGMMA_EXPERTS_CUH
#define DDT_CUDA_WGMMA_EXPERTS_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include <type_traits>

#include "backend/cuda/bf16_split_dev.cuh"
#include "backend/cuda/hopper_dev.cuh"
#include "backend/cuda/wstream.cuh"

#define WX_N 16        /* tokens of an item (the wgmma N: their hi and lo rows, 32 columns) */
#define WX_WG 4        /* warpgroups of 64 weight rows a CTA */
#define WX_WARPS (4 * WX_WG)
#define WX_ROWS (64 * WX_WG)
#define WX_THREADS (128 * WX_WG)
#define WX_RS (WX_ROWS + 4) /* row stride of the [token][rows] partials */

/* A stage by weight format.  INT4: 8 units (2 KB a warp) in 2 stages; FP8: 2 units of 512 bytes
 * (1 KB a warp) in 4, where 4 units in 2 stages measured 2-5% slower at n = 4..64 on an H100
 * (twenty-fourth session: the FP8 stream is not issue-bound, its copies want the depth).  Layout:
 * B (WB / 512 blocks x [16 hi rows, 16 lo rows] x 128 bytes, 1024-aligned atoms: one 32-row
 * K-major tile a block), W (warps x WB), INT4 scales (warps x WB / 256 units x 32).  Both formats
 * take the same shared memory, WX_SMEM. */
template <int F>
struct WxStage {
    static constexpr int WB = F == QF_INT4 ? 2048 : 1024; /* weight bytes a warp a stage */
    static constexpr int S = F == QF_INT4 ? 2 : 4;        /* stages (a power of two) */
    static constexpr int OFF_W = WB / 512 * 4096;
    static constexpr int OFF_SC = OFF_W + WX_WARPS * WB;
    static constexpr int BYTES = (OFF_SC + WX_WARPS * (WB / 256) * 32 + 1023) / 1024 * 1024;
    static_assert((S & (S - 1)) == 0 && WB % 512 == 0, "stage index by mask; whole 16-byte lanes");
};
#define WX_SMEM (WxStage<QF_INT4>::S * WxStage<QF_INT4>::BYTES + 1024)
#define WX_U (WxStage<QF_INT4>::WB / 256) /* units (32 columns) a k-split is rounded to: an INT4 stage's */

enum { WX_GATEUP = 0, WX_DOWN = 1 };
static_assert(WxStage<QF_FP8>::S * WxStage<QF_FP8>::BYTES + 1024 == WX_SMEM, "one shared size for both formats");
static_assert(WX_N * WX_RS * 4 <= WX_SMEM - 1024, "the partials reuse the stages");
static_assert(WX_N == WX_WARPS, "one token row a warp: warp r copies the item's row r");

/* bytes of a wq row of `cols` columns */
static __host__ __device__ __forceinline__ int64_t wx_row_bytes(int64_t cols) { return (cols + 63) / 64 * 256; }

/* byte offset of column c's hi value in a wq row (its lo value is 128 further) */
static __host__ __device__ __forceinline__ int64_t wx_col_offset(int64_t c) {
    const int c16 = (int)(c & 15), t = c16 >> 2, e = c16 & 3;
    const int slot = e < 2 ? 2 * t + e : 2 * t + 8 + (e - 2);
    return (c >> 6) * 256 + ((c >> 4) & 3) * 32 + slot * 2;
}

/* columns 4q .. 4q+3 of a row (values v, zeros past the row already in v) into a wq row */
static __device__ __forceinline__ void wx_store_quad(uint8_t *row, int64_t q, float4 v) {
    uint32_t b[4];
    ws_split(v, b); /* hi(x0,x1), hi(x2,x3), lo(x0,x1), lo(x2,x3) */
    const int64_t c = 4 * q;
    uint8_t *p = row + wx_col_offset(c); /* slot 2t of columns 4t, 4t+1; slot 2t+8 holds 4t+2, 4t+3 */
    *(uint32_t *)p = b[0];
    *(uint32_t *)(p + 16) = b[1];
    *(uint32_t *)(p + 128) = b[2];
    *(uint32_t *)(p + 128 + 16) = b[3];
}

/* one value into a wq row */
static __device__ __forceinline__ void wx_store_one(uint8_t *row, int64_t c, float v) {
    __nv_bfloat16 h, l;
    bf16_split(v, h, l); /* ws_split's values */
    uint8_t *p = row + wx_col_offset(c);
    *(__nv_bfloat16 *)p = h;
    *(__nv_bfloat16 *)(p + 128) = l;
}

/* D[64 x N] (+)= A[64 x 16] (registers) * B[16 x N] (K-major smem), N = 8, 16, 32; scale_d 0
   overwrites D */
template <int N>
static __device__ __forceinline__ void wx_mma(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, int scale_d);
template <>
__device__ __forceinline__ void wx_mma<8>(float (&d)[4], const uint32_t (&a)[4], uint64_t db, int scale_d) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wx_mma<16>(float (&d)[8], const uint32_t (&a)[4], uint64_t db, int scale_d) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wx_mma<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t db, int scale_d) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}

/* nibbles i and i + 4 of w as a bf16 pair (q - 8), exactly (ws_int4_pair's arithmetic), the
   mask and the exponent bits in one lop3: (w >> 4i) & 0x000F000F | 0x43004300 */
static __device__ __forceinline__ uint32_t wx_int4_pair(uint32_t w, int i) {
    uint32_t v;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(v) : "r"(w >> (4 * i)), "r"(0x000F000Fu), "r"(0x43004300u));
    const uint32_t k136 = 0x43084308u;
    __nv_bfloat162 r = __hsub2(*reinterpret_cast<const __nv_bfloat162 *>(&v),
                               *reinterpret_cast<const __nv_bfloat162 *>(&k136));
    return ws_bits(r);
}

/* The k-split of an expert projection over `cols` columns, from the layer's shape
 * alone (never n): 2 for long rows (K2.6's gate/up, 7168 columns: a decode step
 * has 8 experts x 32 row blocks, too few CTAs for 132 SMs without it: 134 against
 * 145 us at n = 1; 4 splits for it and 2 for the down projection measured 2-10%
 * slower at every n), else 1. */
static __host__ __device__ __forceinline__ int wx_ksplit(int64_t cols) { return cols >= 4096 ? 2 : 1; }

template <int N>
static __device__ __forceinline__ void wx_keep(uint32_t (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}

/* A unit's partial P over its two k-steps: P = A0 B[k-step 0] (overwriting), then += A1
   B[k-step 1], the B tile's descriptor (kmajor_desc's, the 8-row stride SBO bytes) given by
   its low word lo (k-step 1 is 32 bytes further); the wait makes P readable and A0, A1
   reusable.  The descriptor as a 32-bit low word beside a constant high word: a shared
   address past the stage's fits the low word's 14-bit field (< 256 KB), and a 64-bit sum
   made ptxas rebuild the constant high word around every wgmma (5 uniform instructions a
   wgmma, 2.5 of a unit's ~43 issue slots). */
template <int N, int SBO>
static __device__ __forceinline__ void wx_partial(float (&P)[N / 2], uint32_t (&A0)[4], uint32_t (&A1)[4], uint32_t lo) {
    const uint64_t hi = make_desc(0, 0, SBO); /* the high word alone (a constant) */
    wgmma_fence();
    wx_mma<N>(P, A0, hi | lo, 0);
    wx_mma<N>(P, A1, hi | (lo + (32 >> 4)), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(P);
    wx_keep(A0);
    wx_keep(A1);
}

/* Stage st's copies have landed for this thread: the groups committed after the one holding its
 * token rows may stay in flight.  wx_pipeline's group order: W 0 .. W S-1 (a stage's weights
 * each), then X 0 .. X S-2 in one group, then per stage X st+S-1, W st+S: so 2 st groups after
 * stage st's rows while st < S - 1 (they are in the prologue's group), 2S - 3 after. */
template <int S>
static __device__ __forceinline__ void wx_wait_stage(int st) {
    static_assert(S == 2 || S == 4, "the waits below");
    if (st >= S - 1) cp_async_wait<2 * S - 3>();
    else if (st == 0) cp_async_wait<0>();
    else if (st == 1) cp_async_wait<2>();
    else cp_async_wait<4>();
}

/* The experts' S-stage pipeline (ws_pipeline's, but for the weights): a warp's weights and
 * scales in a stage buffer are read by that warp alone, so each warp puts stage st + S's in
 * flight into the buffer of stage st as soon as it has read them (after body(st), over a warp
 * barrier), not after the CTA's barrier of the next stage and that stage's landing: while a warp
 * waits for stage st + 1 it has S stages' weights in flight, not S - 1.  The token rows (read
 * by every warp's wgmmas) keep the CTA barrier: X st+S-1 goes once all warps are past stage
 * st - 1.  The caller has issued W 0 .. W S-1 (wload commits its group); xload / wload issue
 * nothing past nst. */
template <int S, class XLoad, class WLoad, class Body>
static __device__ __forceinline__ void wx_pipeline(int nst, XLoad xload, WLoad wload, Body body) {
#pragma unroll
    for (int st = 0; st < S - 1; st++) xload(st);
    cp_async_commit();
    for (int st = 0; st < nst; st++) {
        wx_wait_stage<S>(st);
        __syncthreads();
        xload(st + S - 1);
        cp_async_commit();
        body(st);
        __syncwarp();
        wload(st + S);
    }
}

struct WxArgs {
    const WsItem *items;
    const int32_t *sorted_tok;
    const uint8_t *xs; /* gate/up: x's wq rows by token; down: h's wq rows by entry */
    int64_t ldxs;      /* bytes between rows */
    int64_t rows, cols, nu, mtiles;
    int32_t ks;        /* k-split: a cluster of ks CTAs along y shares a row block (wx_ksplit) */
    int64_t ups;       /* units a split streams (a multiple of WX_U) */
    uint8_t *hs;       /* gate/up: h out, wq rows by entry (ldhs bytes apart) */
    int64_t ldhs;
    float *y;          /* down: [entries][rows] */
    int32_t fp8_block, fp8_scols; /* FP8: the scale block (a multiple of 32) and scale columns */
    /* The down launch's start by flags (see wx_kernel): done[slot] counts the slot's gate/up CTAs
       that have stored their h (the sort launch zeroes it), done_target is the gate/up grid's
       CTAs a slot; sync[0] is set to gen by the gate/up CTA (0, 0) once its grid wait has
       returned (the sort's items are then written) and reset to 0 by the call's last down CTA,
       sync[1] counts the down CTAs past their wait (the sort zeroes it); gen is the call's own
       value (never 0 or ~0). */
    int32_t *done;
    int32_t done_target;
    uint32_t *sync;
    uint32_t gen;
};

/* a gpu-scope acquire load: the writes released before the value was stored are visible after */
static __device__ __forceinline__ uint32_t wx_ld_acquire(const void *p) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Thread 0's wait for a flag, polling with a backoff up to ~0.5 us: up to 264 waiting CTAs poll a
   few lines, each in one L2 slice that also serves the gate/up stream's share of its bytes */
template <typename Done>
static __device__ __forceinline__ void wx_spin(Done done) {
    unsigned ns = 32;
    while (!done()) {
        __nanosleep(ns);
        if (ns < 512) ns *= 2;
    }
}

/* a work item read through L2 (ld.global.cg): it may be newer than any line an SM's L1 holds */
static __device__ __forceinline__ WsItem wx_item_cg(const WsItem *p) {
    static_assert(sizeof(WsItem) % 8 == 0 && alignof(WsItem) == 8, "whole 8-byte words");
    WsItem r;
    const unsigned long long *src = reinterpret_cast<const unsigned long long *>(p);
    unsigned long long *dst = reinterpret_cast<unsigned long long *>(&r);
#pragma unroll
    for (int i = 0; i < (int)(sizeof(WsItem) / 8); i++) dst[i] = __ldcg(src + i);
    return r;
}

/* grid (item, row block x k-split): gate/up WX_ROWS / 2 intermediate rows a block, down WX_ROWS hidden rows */
template <int KIND, int F>
static __global__ void __launch_bounds__(WX_THREADS, 2) wx_kernel(const WxArgs a) {
    DDT_GRID_DEP_FLAGS();
    static_assert(F == QF_INT4 || F == QF_FP8, "INT4 group 32 or FP8 blocks");
    /* a unit (16 rows x 32 columns a warp): INT4 256 bytes + scales in the stage, FP8 512 bytes
       (its block scale read per unit, as wstream.cuh's FP8 path); a stage (WxStage): 8 INT4
       units (4 token blocks), 2 FP8 units (1 block) */
    using G = WxStage<F>;
    constexpr int UB = F == QF_INT4 ? 256 : 512, UPS = G::WB / UB, BPS = UPS / 2;
    constexpr int WCH = G::WB / 512, XCH = (BPS + 1) / 2; /* 16-byte copies a lane: weights, x */
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __trap(); /* wgmma needs sm_90a */
#else
    const int tid = threadIdx.x;
    /* The start.  Gate/up waits for its grid dependencies (the sort) as every kernel does,
       then CTA (0, 0) publishes the call's gen: the items are written.  Down does not wait
       for the whole gate/up grid (under a programmatic edge its CTAs take the SMs that gate/up
       CTAs leave): it waits for the gen, reads its item, puts its first stages' weights in
       flight (the expert's, never written by a kernel), and waits for its slot's gate/up CTAs
       only before the h rows (below).  What the gen proves: gate/up CTA (0, 0) returned from
       its grid wait, so every kernel before the sort has ended too; a value left by an earlier
       call is 0 (its last down CTA's reset) or another call's gen. */
    if constexpr (KIND == WX_GATEUP) {
        DDT_GRID_DEP_WAIT();
        if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0)
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(a.sync), "r"(a.gen) : "memory");
    } else {
        if (tid == 0) wx_spin([&] { return wx_ld_acquire(a.sync) == a.gen; });
        __syncthreads();
    }
    const WsItem item = KIND == WX_GATEUP ? a.items[blockIdx.x] : wx_item_cg(a.items + blockIdx.x);
    /* down: past the gen, this CTA counts itself in; the call's last resets the gen, so a
       replay of the same call (a graph's) waits for its own gate/up again */
    if (KIND == WX_DOWN && tid == 0 && atomicAdd(a.sync + 1, 1u) == gridDim.x * gridDim.y - 1u) atomicExch(a.sync, 0u);
    if (item.cnt == 0) { /* the whole block, before any barrier */
        if (KIND == WX_DOWN) DDT_GRID_DEP_WAIT(); /* see the end */
        return;
    }
    extern __shared__ __align__(1024) uint8_t wx_smem_raw[];
    const uint32_t raw = smem_u32(wx_smem_raw);
    const uint32_t pad = ((raw + 1023u) & ~1023u) - raw;
    uint8_t *const sm = wx_smem_raw + pad;
    const uint32_t sb = raw + pad;
    const int warp = tid >> 5, wg = warp >> 2, w4 = warp & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int rb = blockIdx.y / a.ks, split = blockIdx.y % a.ks, ntok = item.cnt;
    const int64_t ubeg = split * a.ups, uend = ubeg + a.ups < a.nu ? ubeg + a.ups : a.nu;
    /* warp's m-tile and weight: gate/up, warpgroup wg holds gate m-tiles rb*2WG + 2wg + {0, 1}
       (warps 0, 1) and the same of up (warps 2, 3); down, m-tile rb*4WG + warp.  Spare
       tiles past the end re-read the last one (never stored) */
    int64_t mt = KIND == WX_GATEUP ? (int64_t)rb * (2 * WX_WG) + 2 * wg + (w4 & 1) : (int64_t)rb * WX_WARPS + warp;
    if (mt >= a.mtiles) mt = a.mtiles - 1;
    /* constant indices (a runtime index would put the item in local memory) */
    const uint8_t *wsrc = (KIND == WX_GATEUP ? (w4 < 2 ? item.d[0] : item.d[1]) : item.d[2]) + mt * a.nu * UB;
    const uint8_t *ssrc =
        (const uint8_t *)(KIND == WX_GATEUP ? (w4 < 2 ? item.s[0] : item.s[1]) : item.s[2]) +
        (F == QF_INT4 ? mt * a.nu * 32 : (mt * 16 / a.fp8_block) * a.fp8_scols * 4); /* FP8: the m-tile's scale row */
    /* The stream's per-thread costs are what set its rate (issue-bound: H200, ncu, 0.71-0.76
       warps issued a scheduler a cycle at 37-47% of copy bandwidth), so everything a stage
       can precompute is: 32-bit unit counts, source pointers advanced by a stride, and the
       stage's copy destinations and descriptors as offsets from one base. */
    const int nunits = uend > ubeg ? (int)(uend - ubeg) : 0;
    const int u0 = (int)ubeg, upb = F == QF_FP8 ? a.fp8_block / 32 : 1; /* FP8: units a scale block */
    const int nst = (nunits + UPS - 1) / UPS;
    /* weights: chunks lane + 32 i of the warp's stage (chunk c = unit c / (UB / 16)'s 16-byte
       piece), so a stage's source is contiguous; scales: lanes 0 .. 2 UPS - 1 */
    const uint8_t *const wp0 = wsrc + ubeg * UB + lane * 16;
    const uint8_t *const sp0 = ssrc + ubeg * 32 + lane * 16;
    const uint32_t wdst = G::OFF_W + warp * G::WB + lane * 16, sdst = G::OFF_SC + warp * (UPS * 32) + lane * 16;
    /* the item's token row this warp copies (row warp of the item: XR is 1), BPS blocks x 2
       planes x 8 chunks (lane: plane xp, chunk xc of blocks xb + 2j), swizzled (chunk c of row r at chunk c ^ (r & 7)); block b's tile
       holds the hi rows as its rows 0..15 and the lo rows as 16..31; blocks past the row zero;
       rows past the item are not copied (stale bytes: they feed only token columns no output
       takes) */
    const int xc = lane & 7, xp = (lane >> 3) & 1, xb = lane >> 4;
    const bool xrow_live = warp < ntok;
    /* the sort's token index is a dependent global load: once */
    const uint8_t *const xrow =
        xrow_live ? a.xs + (KIND == WX_GATEUP ? (int64_t)a.sorted_tok[item.off + warp] : (int64_t)(item.off + warp)) * a.ldxs
                  : a.xs;
    const uint8_t *const xp0 = xrow_live ? xrow + (ubeg / 2 + xb) * 256 + xp * 128 + xc * 16 : a.xs;
    /* the lane's block j at stage st is ubeg / 2 + xb + 2j + BPS st: in the row while
       BPS st + 2j < xlim */
    const int xlim = (int)((a.cols + 63) / 64 - (ubeg / 2 + xb));
    /* the tile row of token `warp`'s plane xp: the hi rows 0..15 and the lo rows 16..31; for items
       of at most 4 entries hi and lo interleaved in rows 0..7 (token r: 2r, 2r + 1), one 8-row
       group that m64n8k16 reads whole */
    const int xrw = ntok <= 4 ? 2 * warp + xp : warp + 16 * xp;
    const uint32_t xdst = xb * 4096 + (xrw >> 3) * 1024 + (xrw & 7) * 128 + ((xc ^ (xrw & 7)) * 16);

    /* a stage's copies: the weights (and INT4 scales) where w, then the token rows where x */
    auto load_stage = [&](int st, bool w, bool x) {
        if (st >= nst) return;
        const uint32_t s = sb + (uint32_t)(st & (G::S - 1)) * G::BYTES; /* shared addresses: 32 bits */
        const int left = nunits - st * UPS; /* units of this stage: UPS but at the end */
        const uint8_t *wp = wp0 + (int64_t)st * G::WB;
        if (!w) {
        } else if (left >= UPS) {
#pragma unroll
            for (int i = 0; i < WCH; i++) cp_async_cg16(s + wdst + 512 * i, wp + 512 * i);
            if (F == QF_INT4 && lane < 2 * UPS) cp_async_cg16(s + sdst, sp0 + (int64_t)st * (UPS * 32));
        } else { /* chunk c holds unit c / (UB / 16) */
#pragma unroll
            for (int i = 0; i < WCH; i++)
                if ((lane + 32 * i) / (UB / 16) < left) cp_async_cg16(s + wdst + 512 * i, wp + 512 * i);
            if (F == QF_INT4 && lane < 2 * UPS && (lane >> 1) < left) cp_async_cg16(s + sdst, sp0 + (int64_t)st * (UPS * 32));
        }
        /* the lane's blocks of the stage: xb + 2j (8 KB apart in the tile, 512 bytes in the row) */
#pragma unroll
        for (int j = 0; j < XCH; j++)
            if (x && xrow_live && xb + 2 * j < BPS) {
                if (BPS * st + 2 * j < xlim) cp_async_cg16(s + xdst + 8192 * j, xp0 + (int64_t)st * (BPS * 256) + 512 * j);
                else st_shared_zero16(s + xdst + 8192 * j);
            }
    };
    /* The weights of every stage buffer first, one cp.async group a stage (down: before the wait
       for its slot's h, so they stream while the slot's last gate/up CTAs finish; the expert's
       weights are never written by a kernel); the token rows after (down: the released h,
       cp.async.cg reads L2).  Later stages' weights go by each warp as soon as it has read its
       own share of a stage buffer (wx_pipeline). */
    auto wload = [&](int st) {
        load_stage(st, true, false);
        cp_async_commit();
    };
    auto xload = [&](int st) { load_stage(st, false, true); };
#pragma unroll
    for (int st = 0; st < G::S; st++) wload(st);
    if constexpr (KIND == WX_DOWN) {
        if (tid == 0) wx_spin([&] { return (int)wx_ld_acquire(a.done + blockIdx.x) >= a.done_target; });
        __syncthreads();
    }

    /* this thread's fragments in a stage: the unit's 8 bytes, the scale pair of row g (and g + 8) */
    const uint32_t wrd = G::OFF_W + warp * G::WB + lane * (UB / 32), srd = G::OFF_SC + warp * (UPS * 32) + g * 4;
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; i++) acc[i] = 0.f;
    /* the stream, compiled once per item class (see the top): m64n8k16, m64n16k16 or m64n32k16,
       the FADD / FFMA of absent tokens left out of the code, not predicated off (a predicated
       instruction still takes its issue slot) */
    auto stream = [&](auto cls_tag) {
    constexpr int cls = decltype(cls_tag)::value; /* 0: <= 4 entries, 1: <= 8, 2: <= 16 */
    wx_pipeline<G::S>(nst, xload, wload, [&](int st) {
        const uint32_t s = sb + (uint32_t)(st & (G::S - 1)) * G::BYTES;
        const uint32_t d0 = (uint32_t)kmajor_desc(s); /* the low word (wx_partial) */
        const int left = nunits - st * UPS;
        /* unit uu: P = W x_hi + W x_lo over its two k-steps (the hi rows and the lo rows are
           the B tile's rows 0..15 and 16..31, 2048 bytes apart), then acc = fma(scale, P, acc) */
        auto unit = [&](int uu) {
            uint32_t A0[4], A1[4];
            float sc0, sc1;
            if constexpr (F == QF_INT4) {
                uint32_t w0, w1, s2;
                asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(w0), "=r"(w1) : "r"(s + wrd + uu * 256) : "memory");
                asm volatile("ld.shared.u32 %0, [%1];" : "=r"(s2) : "r"(s + srd + uu * 32) : "memory");
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    A0[r] = wx_int4_pair(w0, r);
                    A1[r] = wx_int4_pair(w1, r);
                }
                sc0 = __uint_as_float(s2 << 16), sc1 = __uint_as_float(s2 & 0xFFFF0000u);
            } else {
                /* 16 bytes a lane: k-step 0's A registers from words 0, 1, k-step 1's from 2, 3 (two
                   E4M3 bytes a register half, exactly in bf16); the unit's block scale */
                uint32_t v[4];
                asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                             : "r"(s + wrd + uu * 512)
                             : "memory");
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    A0[r] = ws_fp8_pair((r & 1) ? v[r >> 1] >> 16 : v[r >> 1]);
                    A1[r] = ws_fp8_pair((r & 1) ? v[2 + (r >> 1)] >> 16 : v[2 + (r >> 1)]);
                }
                sc0 = sc1 = __ldg((const float *)ssrc + (u0 + st * UPS + uu) / upb);
            }
            /* k-steps 2uu, 2uu+1: block uu / 2, k-steps (uu % 2) * 2 + {0, 1}; descriptor
               addresses count 16 bytes */
            const uint32_t db = d0 + (uint32_t)(((uu >> 1) * 4096 + (uu & 1) * 64) >> 4);
            if constexpr (cls == 0) {
                /* at most 4 tokens: rows 2r, 2r + 1 of the tile's first 8-row group are token r's hi
                   and lo, the 8 columns of m64n8k16 (the column dot products of the wider shapes) */
                float P[4];
                wx_partial<8, 1024>(P, A0, A1, db);
                /* P[c]: column 2t + (c & 1), row g (+8 for c & 2): token t's hi partial, then its lo */
                acc[0] = __fmaf_rn(sc0, P[0] + P[1], acc[0]);
                acc[2] = __fmaf_rn(sc1, P[2] + P[3], acc[2]);
            } else if constexpr (cls == 1) {
                /* at most 8 tokens: hi rows 0..7 (atom 0 of the block's tile) and lo rows 0..7
                   (atom 2) as the 16 columns of m64n16k16, the descriptor's 8-row stride 2048
                   bytes: the same column dot products as m64n32k16's, half its tensor work */
                float P[8];
                wx_partial<16, 2048>(P, A0, A1, db);
                /* P[c]: token 2t + (c & 1)'s hi partial, row g (+8 for c & 2); P[4 + c] its lo */
#pragma unroll
                for (int i = 0; i < 4; i++) acc[i] = __fmaf_rn((i & 2) ? sc1 : sc0, P[i] + P[i + 4], acc[i]);
            } else {
                float P[16];
                wx_partial<32, 1024>(P, A0, A1, db);
                /* P[4j + c]: column 8j + 2t + (c & 1), row g (+8 for c & 2): token 8j + 2t + (c & 1)'s
                   hi partial for j < 2, its lo partial at j + 2 */
#pragma unroll
                for (int i = 0; i < 8; i++) acc[i] = __fmaf_rn((i & 2) ? sc1 : sc0, P[i] + P[i + 8], acc[i]);
            }
        };
        /* every stage but a split's last is whole: no unit test in its code */
        if (left >= UPS) {
#pragma unroll
            for (int uu = 0; uu < UPS; uu++) unit(uu);
        } else {
#pragma unroll
            for (int uu = 0; uu < UPS; uu++)
                if (uu < left) unit(uu);
        }
    });
    };
    if (ntok <= 4) stream(std::integral_constant<int, 0>{});
    else if (ntok <= 8) stream(std::integral_constant<int, 1>{});
    else stream(std::integral_constant<int, 2>{});
    cp_async_wait<0>();
    __syncthreads(); /* every warp is done with the stages: the partials take their place */

    /* acc i: CTA row 64 wg + 16 w4 + g (+8 for i & 2), token 8 (i / 4) + 2t (+1 for i & 1);
       items of at most 4: acc 0 and 2 (rows g, g + 8) of token t */
    float *red = (float *)sm; /* [16 tokens][WX_RS] */
    if (ntok <= 4) {
        red[t * WX_RS + warp * 16 + g] = acc[0];
        red[t * WX_RS + warp * 16 + g + 8] = acc[2];
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
            red[(8 * (i >> 2) + 2 * t + (i & 1)) * WX_RS + warp * 16 + g + ((i & 2) ? 8 : 0)] = acc[i];
    }
    /* the k-split's partials: this CTA's, or the sum over the cluster's CTAs in rank order */
    const uint32_t red_addr = smem_u32(red);
    auto part = [&](int i) -> float {
        return a.ks > 1 ? cluster_sum_f32(red_addr + 4u * (uint32_t)i, a.ks) : red[i];
    };
    if (a.ks > 1) cluster_sync();
    else __syncthreads();
    if constexpr (KIND == WX_GATEUP) {
        /* h = silu(gate) * up for the WX_ROWS / 2 rows: row r's gate at CTA row 64 (r / 32) + r % 32,
           its up 32 further; wq rows by entry; the cluster's CTAs take every ks-th output */
        constexpr int HR = WX_ROWS / 2;
        for (int q = split * WX_THREADS + tid; q < WX_N * HR; q += a.ks * WX_THREADS) {
            const int tok = q / HR, r = q % HR;
            if (tok >= ntok) continue;
            const int64_t row = (int64_t)rb * HR + r;
            if (row >= (a.rows + 63) / 64 * 64) continue; /* past h's row (its last block's columns get zeros) */
            const int cr = 64 * (r >> 5) + (r & 31);
            const float gv = part(tok * WX_RS + cr), uv = part(tok * WX_RS + cr + 32);
            const float h = row < a.rows ? gv / (1.0f + expf(-gv)) * uv : 0.0f;
            wx_store_one(a.hs + (int64_t)(item.off + tok) * a.ldhs, row, h);
        }
        /* the slot's down CTAs wait for this count: every thread's h stores made visible, the
           cluster's partials read (the sync below), then one release a CTA */
        __threadfence();
        if (a.ks > 1) cluster_sync();
        else __syncthreads();
        if (tid == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(a.done + blockIdx.x) : "memory");
        return;
    } else {
        for (int q = split * WX_THREADS + tid; q < WX_N * WX_ROWS; q += a.ks * WX_THREADS) {
            const int tok = q / WX_ROWS, r = q % WX_ROWS;
            const int64_t row = (int64_t)rb * WX_ROWS + r;
            if (tok >= ntok || row >= a.rows) continue;
            a.y[(int64_t)(item.off + tok) * a.rows + row] = part(tok * WX_RS + r);
        }
    }
    if (a.ks > 1) cluster_sync(); /* no CTA leaves while another reads its partials */
    /* The grid wait at last (every gate/up CTA of a live slot has ended its work by now): so
       that this grid's end still means that every grid before it has ended, which the
       kernels after it assume (an empty slot's gate/up CTA reads its item after its wait) */
    DDT_GRID_DEP_WAIT();
#endif
}

#endif
