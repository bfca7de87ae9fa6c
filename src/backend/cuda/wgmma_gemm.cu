/*
 * wgmma_gemm.cu — the bf16 weight-streaming x W^T on wgmma + TMA (wgmma_gemm.h
 * says why and what it guarantees).
 *
 * A CTA (two warpgroups, 256 threads) owns 128 weight rows of one group (64 a
 * warpgroup), 64 token columns and a k-range of 64-column k-blocks (its split of
 * the fixed k-split).  Per k-block a stage holds bf16 tiles TMA-loaded with the
 * 128-byte swizzle wgmma reads: W [128 rows][64 k], x_hi [xr tokens][64 k], x_lo
 * the same (xr = the launch's token rows rounded to 8, at most 64: a decode
 * step does not stream 63 rows of zero fill; the rows past xr hold stale bytes
 * that feed only token columns no output takes).  A stage is as large as its
 * x regions need (xa = max(xr, the instruction's N) rows each: the wgmma reads N
 * rows), and a launch asks for shared memory for the stages it uses alone
 * (at most 10 at xa = 8, 6 at 64, never more than a split's k-blocks): a small
 * product's CTAs then share an SM (K2.6's W_UK^T, 256 CTAs of 2 k-blocks, runs
 * 3 an SM in one wave instead of two waves: 10.1 -> 8.2 us at n = 1 on the
 * H200).  More stages in flight alone did not speed up the big single-wave
 * products (q_a | kv_a, q_b: the same time at 6 and 10 stages on the H100), so
 * their streams are not bound by the bytes in flight.  A launch of more than 132
 * CTAs shares SMs, 2 or 3 CTAs an SM with their rings cut to fit (wg_per_sm), so
 * that its CTAs do not queue in waves that each pay the ramp again.  Both operands are K-major, so
 * D[row][token] += W x_hi^T then W x_lo^T, 4 k-steps of m64n64k16 each; the two
 * warpgroups share the x tiles, so x costs half of W's bytes from L2 at n = 64.
 * A ring of S stages keeps S-1 k-blocks in flight;
 * thread 0 refills the stage the previous k-block used once every warp has
 * retired its wgmmas (wait_group 1 keeps one group of tensor work running while
 * the refill is issued).  Weight tiles of the first S stages are issued before
 * griddepcontrol.wait: nothing in a round writes weights, so under a
 * programmatic edge they stream while the predecessor finishes.
 *
 * The k-split's CTAs are one thread-block cluster; each puts its 64x64 partial
 * in its shared memory as [token][row], and after a cluster barrier CTA r adds
 * the partials of elements r, r + ks, ... in rank order and stores them: rows
 * are consecutive in y, so the stores coalesce.
 *
 * Activations: a split pass writes x's rows as two bf16 planes (x_hi = bf16(x),
 * x_lo = bf16(x - x_hi), qmatmul's ws_split arithmetic) in group-major order,
 * row g*n + t, pitch round8(cols) bf16; the x maps cover count*n rows, so the
 * last tile's rows past the end are TMA zero fill.  A tile's rows past n that
 * belong to the next group feed only output columns that are never stored.
 * Where the activations' producer wrote the planes itself (a norm, the MLA
 * merge, or another product's epilogue: ddt_cuda_wg_matmul_next's `next`, the
 * split of each output value stored beside it), the split pass is skipped.
 */
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "backend/cuda/bf16_split_dev.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/hopper_dev.cuh"
#include "backend/cuda/mla_rope_dev.cuh"
#include "backend/cuda/wgmma_gemm.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#pragma nv_diag_suppress 177 /* the plain sm_90 pass compiles the kernel body out */
#endif

namespace {

constexpr int WG_BM = 128, WG_BN = 64, WG_BK = 64; /* weight rows (two warpgroups of 64), tokens, k per stage */
constexpr int WG_TILE = 8192;                       /* one 64x64 bf16 tile */
constexpr int WG_STAGES_BYTES = 6 * 4 * WG_TILE;   /* the ring: 192 KB, one CTA an SM (6 stages at xr = 64) */
constexpr int WG_MAX_S = 10;                        /* stages at xr = 8: 10 x 18 KB */
constexpr int WG_THREADS = 256;
constexpr int WG_OFF_BAR = WG_STAGES_BYTES;
constexpr int WG_SMEM = WG_OFF_BAR + WG_MAX_S * 8 + 1024; /* + room to align the base to 1024 */
constexpr int WG_RS = WG_BM + 4;                    /* row stride of the [token][row] partials */
constexpr int WG_SLOTS = 132;                       /* H200: 132 SMs x 1 CTA; a constant, not the device's */
constexpr int WG_MAX_KS = 8;                       /* portable cluster size */
static_assert(WG_BN * WG_RS * 4 <= WG_OFF_BAR / 2, "the partials reuse the stages (at least half the ring)");

/* A stage's bytes for x boxes of xr rows (a multiple of 8: each box 1024-byte
 * aligned, as the swizzle needs). */
__host__ __device__ constexpr int wg_stage_bytes(int xr) { return 2 * WG_TILE + 2 * xr * 128; }

/* CTAs of a product an SM holds.  Up to 132 CTAs run one an SM with the whole ring
 * (the k-split rule fills the SMs).  A product of more row tiles (so never split) ran
 * them one an SM in waves: K2.6's dense-layer gate | up (288 tiles) in 3, DeepSeek-V3's
 * q_b (192) in 2, the LM head (1280) in 10, each wave paying its CTAs' ramp again.
 * Those now share SMs, each CTA's ring cut so that they fit: 2 an SM up to 264 CTAs, 3
 * up to 396 (one wave), 2 beyond (the LM head: 3 measured slower than 2).  Measured on
 * an H100 against one an SM (twenty-ninth session, BENCHMARKS): DeepSeek-V3's q_b at
 * n = 1 44 -> 41-43 us, K2.6's dense layer 1-3% faster (0.564 -> 0.548 ms at n = 64),
 * the LM head ~1%; the stages a CTA keeps never change the arithmetic. */
__host__ __device__ constexpr int wg_per_sm(int64_t ctas) {
    return ctas <= WG_SLOTS ? 1 : ctas > 2 * WG_SLOTS && ctas <= 3 * WG_SLOTS ? 3 : 2;
}
/* The bytes a CTA's ring may take when p CTAs share an SM: the SM's 228 KB less 1 KB a
 * CTA the runtime reserves, less the alignment room and the barriers. */
__host__ __device__ constexpr int wg_ring_bytes(int p) {
    return p == 1 ? WG_STAGES_BYTES : (233472 / p - 1024) - 1024 - WG_MAX_S * 8;
}
/* The stages a ring of stages for xa token rows holds when p CTAs share an SM. */
__host__ __device__ constexpr int wg_stages(int xa, int p) {
    return wg_ring_bytes(p) / wg_stage_bytes(xa) < WG_MAX_S ? wg_ring_bytes(p) / wg_stage_bytes(xa) : WG_MAX_S;
}
static_assert(wg_stages(8, 1) == WG_MAX_S && wg_stages(64, 1) == 6, "one an SM: the whole ring");
static_assert(wg_stages(8, 2) == 6 && wg_stages(64, 2) == 3 && wg_stages(8, 3) == 4 && wg_stages(64, 3) == 2,
              "stages when 2 or 3 share an SM: at least 2 (one in flight while one is read)");
static_assert(WG_BN * WG_RS * 4 <= wg_ring_bytes(3), "the partials fit where 3 CTAs share an SM");

struct WgArgs {
    int64_t rows;              /* output rows per group */
    int64_t w_row_stride, w_row_offset;
    int32_t n, count, ks;
    int32_t nkb, kb_per_split; /* k-blocks of the row, of a split */
    int32_t xr;                /* token rows the x boxes carry: min(64, round8(count * n)) */
    int32_t xa;                /* token rows a stage's x regions hold: max(xr, the instruction's N), since
                                  the wgmma reads N rows (those past xr stale, into unread columns) */
    int32_t stages, stage_bytes; /* the ring: min(wg_stages(xa, wg_per_sm), a split's k-blocks), wg_stage_bytes(xa) */
    int32_t off_bar;             /* the stages' mbarriers, past the ring and the partials */
    float *y;
    int64_t ldy, y_stride;
    /* the next product's split planes, or nh NULL (ddt_cuda_next_planes): output column
       c = grp * y_stride + row is its group c / n_width's column c % n_width */
    __nv_bfloat16 *nh, *nl;
    int64_t n_pitch, n_width, n_cols;
    /* the output as bf16 too, or b16 NULL (ddt_cuda_next_planes.b16) */
    __nv_bfloat16 *b16;
    int64_t b16_ld, b16_gstride;
    /* MLA's query rope in the epilogue (ddt_cuda_next_planes.rope), or r_rope 0 */
    int32_t r_rope, r_nope, r_qdim, r_heads, r_rank, r_max_pos, r_capacity;
    const int32_t *r_len, *r_depth;
    const float *r_cos, *r_sin;
    __nv_bfloat16 *r_q16;
};

#define WG_SPLIT_THREADS 256

/* x -> the hi / lo planes, row g*n + t, 4 columns a thread (plane pitch xs). */
__global__ void __launch_bounds__(WG_SPLIT_THREADS)
    wg_split_kernel(const float *__restrict__ x, int64_t ldx, int64_t x_stride, int32_t n, int32_t count, int64_t cols,
                    int64_t xs, __nv_bfloat16 *__restrict__ hi, __nv_bfloat16 *__restrict__ lo) {
    DDT_GRID_DEP_WAIT();
    const int64_t nq = (cols + 3) / 4, total = (int64_t)n * count * nq;
    for (int64_t i = (int64_t)blockIdx.x * WG_SPLIT_THREADS + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * WG_SPLIT_THREADS) {
        const int64_t r = i / nq, c = 4 * (i - r * nq);
        const int64_t g = r / n, t = r - g * n;
        const float *src = x + t * ldx + g * x_stride + c;
        __nv_bfloat16 *h = hi + r * xs + c, *l = lo + r * xs + c;
        for (int k = 0; k < 4 && c + k < cols; k++) bf16_split(src[k], h[k], l[k]);
    }
}

/* grid: x = row tile * ks + split (a cluster = the ks splits of one tile), y =
 * token tile, z = group */
template <int NI>
__global__ void __launch_bounds__(WG_THREADS, 1)
    wg_gemm_kernel(const __grid_constant__ CUtensorMap tmw, const __grid_constant__ CUtensorMap tmxh,
                   const __grid_constant__ CUtensorMap tmxl, const WgArgs a) {
    DDT_GRID_DEP_LATER();
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    DDT_GRID_DEP_WAIT();
    __trap(); /* wgmma needs sm_90a; the launcher refuses other devices */
#else
    extern __shared__ __align__(1024) uint8_t wg_smem_raw[];
    const uint32_t raw = smem_u32(wg_smem_raw);
    const uint32_t sb = (raw + 1023u) & ~1023u; /* swizzled tiles need 1024-byte alignment */
    float *const red = (float *)(wg_smem_raw + (sb - raw));
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const uint32_t stage_tx = 2 * WG_TILE + 2u * (uint32_t)a.xr * 128u; /* W + the x boxes' rows */
    const int split = (int)(blockIdx.x % (unsigned)a.ks);
    const int64_t rt = blockIdx.x / (unsigned)a.ks;
    const int tt = blockIdx.y, grp = blockIdx.z;
    const int kb0 = split * a.kb_per_split;
    const int nk = kb0 >= a.nkb ? 0 : (a.nkb - kb0 < a.kb_per_split ? a.nkb - kb0 : a.kb_per_split);
    const int wrow = (int)(grp * a.w_row_stride + a.w_row_offset + rt * WG_BM);
    const int xrow = grp * a.n + tt * WG_BN;
    auto bar = [&](int s) { return sb + (uint32_t)a.off_bar + 8 * s; };
    const int S = a.stages;
    const uint32_t off_xh = 2 * WG_TILE, off_xl = off_xh + (uint32_t)a.xa * 128u;
    auto stage = [&](int s) { return sb + (uint32_t)s * (uint32_t)a.stage_bytes; };

    if (tid == 0) {
        for (int s = 0; s < S; s++) mbar_init(bar(s), 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)&tmw) : "memory");
        asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)&tmxh) : "memory");
        asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)&tmxl) : "memory");
    }
    __syncthreads();
    const int npre = nk < S ? nk : S;
    if (tid == 0)
        for (int s = 0; s < npre; s++) { /* the weights: nothing in a round writes them */
            mbar_expect_tx(bar(s), stage_tx);
            tma_load_2d(stage(s), &tmw, (kb0 + s) * WG_BK, wrow, bar(s));
        }
    DDT_GRID_DEP_WAIT(); /* x (the split pass's planes) and y are the predecessors' */
    if (tid == 0)
        for (int s = 0; s < npre; s++) {
            tma_load_2d(stage(s) + off_xh, &tmxh, (kb0 + s) * WG_BK, xrow, bar(s));
            tma_load_2d(stage(s) + off_xl, &tmxl, (kb0 + s) * WG_BK, xrow, bar(s));
        }

    float acc[NI / 2];
#pragma unroll
    for (int i = 0; i < NI / 2; i++) acc[i] = 0.f;
    /* s: k-block i's stage, ph: its fill's parity, sp: k-block i-1's stage */
    for (int i = 0, s = 0, sp = S - 1, ph = 0; i < nk; i++) {
        mbar_wait(bar(s), (uint32_t)ph);
        /* this warpgroup's 64 weight rows; x rows past xr are stale, read only into
           token columns no output takes */
        const uint32_t w = stage(s) + wg * WG_TILE, xh = stage(s) + off_xh, xl = stage(s) + off_xl;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            wgmma_m64nN<NI>(acc, kmajor_desc(w + kk * 32), kmajor_desc(xh + kk * 32));
            wgmma_m64nN<NI>(acc, kmajor_desc(w + kk * 32), kmajor_desc(xl + kk * 32));
        }
        wgmma_commit();
        wgmma_wait<1>(); /* k-block i-1's tensor work is done: its stage may be refilled */
        const int j = i - 1 + S;
        if (i >= 1 && j < nk) {
            bar_sync(1, WG_THREADS); /* every warp has retired it */
            if (tid == 0) {
                mbar_expect_tx(bar(sp), stage_tx);
                tma_load_2d(stage(sp), &tmw, (kb0 + j) * WG_BK, wrow, bar(sp));
                tma_load_2d(stage(sp) + off_xh, &tmxh, (kb0 + j) * WG_BK, xrow, bar(sp));
                tma_load_2d(stage(sp) + off_xl, &tmxl, (kb0 + j) * WG_BK, xrow, bar(sp));
            }
        }
        sp = s;
        if (++s == S) {
            s = 0;
            ph ^= 1;
        }
    }
    wgmma_wait<0>();
    fence_regs(acc);
    __syncthreads(); /* no warp reads a stage any more: the partials take their place */

    /* accumulator i of this thread: row 64 wg + 16 warp + g (+8 for i & 2), token 8 (i / 4) + 2t (+1 for i & 1) */
    {
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int i = 0; i < NI / 2; i++) {
            const int row = wg * 64 + warp * 16 + g + ((i & 2) ? 8 : 0), tok = 8 * (i >> 2) + 2 * t + (i & 1);
            red[tok * WG_RS + row] = acc[i];
        }
    }
    if (a.ks > 1) cluster_sync();
    else __syncthreads();
    const uint32_t red_addr = smem_u32(red);
    /* every thread of the CTA takes the same number of elements (WG_BM * WG_BN is a
       multiple of WG_THREADS), and element q + 1 of an even q is lane + 1's, with the
       same token and (rows even) the same bounds: the rope's pairs meet by one
       shuffle among the lanes in bounds.  Elements out of bounds are not summed (at
       n = 1, 63 of a tile's 64 token columns) */
    for (int q = split * WG_THREADS + tid; q < WG_BM * WG_BN; q += a.ks * WG_THREADS) {
        const int tok = q / WG_BM, row = q % WG_BM;
        const int64_t orow = rt * WG_BM + row;
        const int otok = tt * WG_BN + tok;
        const bool in = orow < a.rows && otok < a.n;
        const unsigned in_lanes = a.r_rope ? __ballot_sync(0xffffffffu, in) : 0u;
        if (!in) continue;
        const int i = tok * WG_RS + row;
        float v = a.ks > 1 ? cluster_sum_f32(red_addr + 4u * (uint32_t)i, a.ks) : red[i];
        int64_t ycol = (int64_t)grp * a.y_stride + orow;
        if (a.r_rope) {
            /* ddt_cuda_mla_rope_write's rotation of the pair (even row: x0, odd: x1), stored
               de-interleaved; a token whose cache row is outside the cache keeps its
               product values where they are, as rope_write leaves them */
            const float pv = __shfl_xor_sync(in_lanes, v, 1);
            const int j = (int)(orow % a.r_qdim);
            int pos, crow;
            bool bad;
            if (j >= a.r_nope &&
                mla_rope_where(a.r_len, a.r_depth, otok, a.r_max_pos, a.r_capacity, &pos, &crow, &bad)) {
                const int half = a.r_rope / 2, p = (j - a.r_nope) >> 1, odd = (j - a.r_nope) & 1;
                const int64_t h = orow / a.r_qdim;
                const float *cs = a.r_cos + (int64_t)(bad ? 0 : pos) * half, *sn = a.r_sin + (int64_t)(bad ? 0 : pos) * half;
                float r0, r1;
                mla_rope_rotate(odd ? pv : v, odd ? v : pv, cs[p], sn[p], r0, r1);
                v = bad ? NAN : odd ? r1 : r0;
                const int d = p + (odd ? half : 0);
                ycol = h * a.r_qdim + a.r_nope + d;
                if (a.r_q16)
                    a.r_q16[((int64_t)otok * a.r_heads + h) * (a.r_rank + a.r_rope) + a.r_rank + d] = __float2bfloat16(v);
            }
        }
        a.y[(int64_t)otok * a.ldy + ycol] = v;
        if (a.nh) { /* the split the next product's launch would have made of this value */
            const int64_t c = (int64_t)grp * a.y_stride + orow, ng = c / a.n_width, col = c - ng * a.n_width;
            if (col < a.n_cols) {
                const int64_t r = (ng * a.n + otok) * a.n_pitch + col;
                bf16_split(v, a.nh[r], a.nl[r]);
            }
        }
        if (a.b16) a.b16[(int64_t)otok * a.b16_ld + (int64_t)grp * a.b16_gstride + orow] = __float2bfloat16(v);
    }
    if (a.ks > 1) cluster_sync(); /* no CTA leaves while another reads its partials */
#endif
}

bool wg_prepared = false;

/* A [rows][cols] bf16 matrix of row pitch `pitch` elements, read in boxes of 64
 * columns x box_rows rows with the 128-byte swizzle; elements past its edges
 * read as zero. */
bool wg_encode(encode_tiled_fn enc, CUtensorMap *map, const void *base, int64_t rows, int64_t cols, int64_t pitch,
               int box_rows) {
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)pitch * 2};
    cuuint32_t box[2] = {WG_BK, (cuuint32_t)box_rows};
    cuuint32_t estr[2] = {1, 1};
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base), dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

} /* namespace */

extern "C" bool ddt_cuda_wg_eligible(const ddt_qweight *w) {
    return w && w->format == DDT_Q_DENSE && w->dtype == DDT_DTYPE_BF16 && w->data && w->cols % 8 == 0 &&
           (uintptr_t)w->data % 16 == 0 && w->rows > 0 && w->rows <= 0x7FFFFFFF && w->cols <= 0x7FFFFFFF;
}

/* Clusters of ks CTAs (ks = 1..WG_MAX_KS) of the product kernel that run at once on this
 * device (cudaOccupancyMaxActiveClusters), measured by ddt_cuda_wg_prepare; [1] = 0 until
 * then. */
static int32_t wg_cluster_cap[WG_MAX_KS + 1];

extern "C" int32_t ddt_cuda_wg_ksplit_rule(int64_t rows, int32_t count, int64_t cols, const int32_t *cap) {
    const int64_t tiles = (rows + WG_BM - 1) / WG_BM * (count > 0 ? count : 1), nkb = (cols + WG_BK - 1) / WG_BK;
    /* One wave: the most splits (1, 2, 4 or 8, each at least two k-blocks) whose CTAs all
       run at once on the 132 SMs, one CTA an SM; a product with more tiles than that is not
       split.  A CTA streams at most ~40 GB/s (ncu of the K2.6 layer at n = 1: q_a | kv_a on
       68 CTAs ran at 2 TB/s) and pays a fixed ramp and reduction, so more splits than SMs only
       add waves of fixed costs: the wave model this replaces split K2.6's q_b (96 tiles) 4 ways
       into 3 waves (23 us for 38 MB) and the front (35 tiles) 8 ways into 3 waves. */
    /* With the device's cluster capacities (cap) any size 2..8 whose clusters all run at
       once: K2.6's q_a | kv_a (17 tiles) took 4 (68 CTAs) where 5 or 6 fit, the front (35
       tiles) 2 (70) where 3 fit; a cluster must sit in one GPC, so a size whose clusters do
       not all fit at once (17 of 7 on a GPU of 8 GPCs of 16-18 SMs) would add a wave.
       Without (cap NULL), powers of two. */
    int32_t best = 1;
    for (int32_t ks = 2; ks <= WG_MAX_KS; ks++) {
        if (nkb < 2 * ks || tiles * ks > WG_SLOTS) break;
        if (cap ? tiles <= cap[ks] : (ks & (ks - 1)) == 0) best = ks;
    }
    return best;
}

extern "C" int32_t ddt_cuda_wg_ksplit(int64_t rows, int32_t count, int64_t cols) {
    return ddt_cuda_wg_ksplit_rule(rows, count, cols, wg_cluster_cap[1] > 0 ? wg_cluster_cap : NULL);
}

extern "C" const int32_t *ddt_cuda_wg_cluster_caps(void) { return wg_cluster_cap[1] > 0 ? wg_cluster_cap : NULL; }

extern "C" ddt_status ddt_cuda_wg_prepare(ddt_error *err) {
    if (wg_prepared) return DDT_OK;
    DDT_CUDA_TRY(cudaFuncSetAttribute(wg_gemm_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM), err);
    DDT_CUDA_TRY(cudaFuncSetAttribute(wg_gemm_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM), err);
    DDT_CUDA_TRY(cudaFuncSetAttribute(wg_gemm_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM), err);
    DDT_CUDA_TRY(cudaFuncSetAttribute(wg_gemm_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM), err);
    /* the k-split rule's cluster capacities: every instance has the same block, shared
       memory and cluster shape, so one stands for all */
    int32_t cap[WG_MAX_KS + 1] = {0};
    cap[1] = WG_SLOTS;
    for (int ks = 2; ks <= WG_MAX_KS; ks++) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)(ks * WG_SLOTS), 1, 1);
        cfg.blockDim = dim3(WG_THREADS);
        cfg.dynamicSmemBytes = WG_SMEM;
        cudaLaunchAttribute attr;
        ddt_cuda_set_cluster(&cfg, &attr, (unsigned)ks, 1);
        int n = 0;
        DDT_CUDA_TRY(cudaOccupancyMaxActiveClusters(&n, (void *)wg_gemm_kernel<8>, &cfg), err);
        cap[ks] = n;
    }
    memcpy(wg_cluster_cap, cap, sizeof cap);
    wg_prepared = true;
    return DDT_OK;
}

/* The split planes of `rows` activation rows of `cols` columns in the workspace:
 * hi at its start, lo after it, pitch round8(cols) (the TMA's 16-byte row pitch).
 * The split pass writes them there, the product's x maps read them, and a
 * producer that writes them itself (ddt_cuda_wg_split_planes) finds them here. */
struct WgPlanes {
    int64_t pitch, plane; /* elements: a row, a plane */
    __nv_bfloat16 *hi, *lo;
};
static WgPlanes wg_planes(int64_t cols, int64_t rows, void *workspace) {
    WgPlanes p;
    p.pitch = (cols + 7) / 8 * 8;
    p.plane = rows * p.pitch;
    p.hi = (__nv_bfloat16 *)workspace;
    p.lo = p.hi + p.plane;
    return p;
}

/* The product; x NULL: the planes are already in the workspace (presplit); next:
 * the epilogue also writes them for the next product (NULL: not). */
static ddt_status wg_matmul(const ddt_qweight *w, const ddt_row_groups *g, const float *x, int64_t ldx, int32_t n,
                            float *y, int64_t ldy, void *workspace, size_t workspace_bytes,
                            const ddt_cuda_next_planes *next, cudaStream_t s, ddt_error *err) {
    if (!ddt_cuda_wg_eligible(w))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "matmul (wgmma): weight [%lld, %lld] is not dense bf16 with "
                        "columns a multiple of 8 and 16-byte aligned data", (long long)w->rows, (long long)w->cols);
    if (n < 1 || g->count < 1 || (int64_t)g->count * n > 0x7FFFFFFF)
        return ddt_fail(err, DDT_ERR_INVALID, "matmul (wgmma): %d tokens x %d groups", n, g->count);
    const WgPlanes pl = wg_planes(w->cols, (int64_t)g->count * n, workspace);
    const int64_t xs = pl.pitch;
    const size_t need = (size_t)pl.plane * 4;
    if (!workspace || workspace_bytes < need || (uintptr_t)workspace % 16 != 0)
        return ddt_fail(err, DDT_ERR_RANGE, "matmul (wgmma): %d tokens x %d groups of %lld columns need %zu "
                        "16-byte aligned workspace bytes, %zu given", n, g->count, (long long)w->cols, need,
                        workspace ? workspace_bytes : (size_t)0);
    const int64_t rtiles = (g->rows + WG_BM - 1) / WG_BM, ttiles = (n + WG_BN - 1) / WG_BN;
    const int32_t ks = ddt_cuda_wg_ksplit(g->rows, g->count, w->cols);
    if (rtiles * ks > 0x7FFFFFFF || ttiles > 65535 || g->count > 65535)
        return ddt_fail(err, DDT_ERR_RANGE, "matmul (wgmma): grid %lld x %lld x %d too large",
                        (long long)(rtiles * ks), (long long)ttiles, g->count);
    encode_tiled_fn enc = get_encoder();
    if (!enc) return ddt_fail(err, DDT_ERR_UNSUPPORTED, "matmul (wgmma): cuTensorMapEncodeTiled is not available");
    __nv_bfloat16 *hi = pl.hi, *lo = pl.lo;
    /* the x boxes carry as many rows as there are (rounded to 8, the swizzle's
       period), not 64: a decode step's boxes are 8 rows, not 63 of zero fill */
    const int64_t xrows = (int64_t)g->count * n;
    const int xr = xrows >= WG_BN ? WG_BN : (int)((xrows + 7) / 8 * 8);
    CUtensorMap tmw, tmxh, tmxl;
    if (!wg_encode(enc, &tmw, w->data, w->rows, w->cols, w->cols, WG_BM) ||
        !wg_encode(enc, &tmxh, hi, xrows, w->cols, xs, xr) || !wg_encode(enc, &tmxl, lo, xrows, w->cols, xs, xr))
        return ddt_fail(err, DDT_ERR_INVALID, "matmul (wgmma): cuTensorMapEncodeTiled refused [%lld, %lld]",
                        (long long)w->rows, (long long)w->cols);
    WgArgs a;
    memset(&a, 0, sizeof a);
    a.rows = g->rows;
    a.w_row_stride = g->w_row_stride;
    a.w_row_offset = g->w_row_offset;
    a.n = n;
    a.count = g->count;
    a.ks = ks;
    a.nkb = (int32_t)((w->cols + WG_BK - 1) / WG_BK);
    a.kb_per_split = (a.nkb + ks - 1) / ks;
    a.xr = xr;
    /* no more stages than a split has k-blocks, and shared memory for those alone:
       W_UK^T's 256 CTAs of 2 k-blocks each (K2.6) then run 3 an SM in one wave, not
       one an SM in two waves of fixed costs (11.6 us for 8.4 MB on the H100); past
       132 CTAs no more than wg_per_sm's share of an SM */
    const int ni = n <= 8 ? 8 : n <= 16 ? 16 : n <= 32 ? 32 : 64;
    a.xa = xr > ni ? xr : ni;
    const int per_sm = wg_per_sm(rtiles * ks * ttiles * g->count);
    a.stages = wg_stages(a.xa, per_sm) < a.kb_per_split ? wg_stages(a.xa, per_sm) : a.kb_per_split;
    a.stage_bytes = wg_stage_bytes(a.xa);
    {
        const int ring = a.stages * a.stage_bytes, red = WG_BN * WG_RS * 4;
        a.off_bar = ring > red ? ring : red;
    }
    a.y = y;
    a.ldy = ldy;
    a.y_stride = g->y_stride;
    if (next && next->planes.hi) {
        if (!next->planes.lo || next->width < 1 || next->cols < 1 || next->cols > next->width ||
            next->planes.pitch < next->cols)
            return ddt_fail(err, DDT_ERR_INVALID, "matmul (wgmma): next product's planes: width %lld, %lld columns, "
                            "pitch %lld", (long long)next->width, (long long)next->cols, (long long)next->planes.pitch);
        a.nh = (__nv_bfloat16 *)next->planes.hi;
        a.nl = (__nv_bfloat16 *)next->planes.lo;
        a.n_pitch = next->planes.pitch;
        a.n_width = next->width;
        a.n_cols = next->cols;
    }
    if (next && next->b16) {
        /* every token's row of every group inside [0, b16_ld): no group's rows reach the next's */
        if (next->b16_gstride < g->rows || next->b16_ld < (int64_t)(g->count - 1) * next->b16_gstride + g->rows)
            return ddt_fail(err, DDT_ERR_INVALID, "matmul (wgmma): bf16 output: %lld rows a group, group stride %lld, "
                            "token stride %lld", (long long)g->rows, (long long)next->b16_gstride,
                            (long long)next->b16_ld);
        a.b16 = (__nv_bfloat16 *)next->b16;
        a.b16_ld = next->b16_ld;
        a.b16_gstride = next->b16_gstride;
    }
    if (next && next->rope) {
        const ddt_cuda_mla_rope_args &r = *next->rope;
        /* one group of heads x (nope + rope) rows, pairs interleaved; the planes (when
           written too) only of nope columns, which the rope leaves alone */
        if (!r.interleave || r.rope < 2 || r.rope % 2 || r.nope < 0 || r.nope % 2 || r.qdim != r.nope + r.rope ||
            r.heads < 1 || g->count != 1 || g->rows != (int64_t)r.heads * r.qdim || !r.len || !r.depth || !r.cos_t ||
            !r.sin_t || (next->planes.hi && next->cols > r.nope))
            return ddt_fail(err, DDT_ERR_INVALID, "matmul (wgmma): query rope over %lld rows in %d groups: %d heads x "
                            "(%d + %d)%s", (long long)g->rows, g->count, r.heads, r.nope, r.rope,
                            r.interleave ? "" : ", pairs not interleaved");
        a.r_rope = r.rope;
        a.r_nope = r.nope;
        a.r_qdim = r.qdim;
        a.r_heads = r.heads;
        a.r_rank = r.rank;
        a.r_max_pos = r.max_pos;
        a.r_capacity = r.capacity;
        a.r_len = r.len;
        a.r_depth = r.depth;
        a.r_cos = r.cos_t;
        a.r_sin = r.sin_t;
        a.r_q16 = (__nv_bfloat16 *)r.q16;
    }
    if (next && !next->planes.hi && !next->b16 && !next->rope)
        return ddt_fail(err, DDT_ERR_INVALID, "matmul (wgmma): a next with no planes, bf16 output or rope");

    if (x) {
        const int64_t quads = (int64_t)n * g->count * ((w->cols + 3) / 4);
        const int64_t sblocks = (quads + WG_SPLIT_THREADS - 1) / WG_SPLIT_THREADS;
        wg_split_kernel<<<(unsigned)(sblocks < 4096 ? sblocks : 4096), WG_SPLIT_THREADS, 0, s>>>(
            x, ldx, g->x_stride, n, g->count, w->cols, xs, hi, lo);
        DDT_CUDA_LAUNCHED("matmul (wgmma) activation split", s, err);
    }

    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(rtiles * ks), (unsigned)ttiles, (unsigned)g->count);
    cfg.blockDim = dim3(WG_THREADS);
    cfg.dynamicSmemBytes = (size_t)a.off_bar + 8u * (size_t)a.stages + 1024u; /* <= WG_SMEM */
    cfg.stream = s;
    cudaLaunchAttribute attr;
    if (ks > 1) ddt_cuda_set_cluster(&cfg, &attr, (unsigned)ks, 1);
    /* the instruction's token columns: the fewest of 8, 16, 32, 64 that hold a tile's tokens
       (a wgmma's tensor time grows with N; the column dot products do not change with it,
       test_cuda_wgmma_gemm checks a token's bits alone and in batches of 17 / 64 / 70 / 130) */
    const cudaError_t e = ni == 8    ? cudaLaunchKernelEx(&cfg, wg_gemm_kernel<8>, tmw, tmxh, tmxl, a)
                          : ni == 16 ? cudaLaunchKernelEx(&cfg, wg_gemm_kernel<16>, tmw, tmxh, tmxl, a)
                          : ni == 32 ? cudaLaunchKernelEx(&cfg, wg_gemm_kernel<32>, tmw, tmxh, tmxl, a)
                                     : cudaLaunchKernelEx(&cfg, wg_gemm_kernel<64>, tmw, tmxh, tmxl, a);
    if (e != cudaSuccess)
        return ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: matmul (wgmma) launch: %s", cudaGetErrorString(e));
    DDT_CUDA_LAUNCHED("matmul (wgmma)", s, err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_wg_matmul(const ddt_qweight *w, const ddt_row_groups *g, const float *x, int64_t ldx,
                                         int32_t n, float *y, int64_t ldy, void *workspace, size_t workspace_bytes,
                                         ddt_cuda_stream stream, ddt_error *err) {
    if (!x) return ddt_fail(err, DDT_ERR_INVALID, "matmul (wgmma): no activations");
    return wg_matmul(w, g, x, ldx, n, y, ldy, workspace, workspace_bytes, NULL, (cudaStream_t)stream, err);
}

extern "C" ddt_status ddt_cuda_wg_matmul_next(const ddt_qweight *w, const ddt_row_groups *g, const float *x,
                                              int64_t ldx, int32_t n, float *y, int64_t ldy, void *workspace,
                                              size_t workspace_bytes, const ddt_cuda_next_planes *next,
                                              ddt_cuda_stream stream, ddt_error *err) {
    if (!w || !g) return ddt_fail(err, DDT_ERR_INVALID, "matmul (wgmma): no weight or groups");
    return wg_matmul(w, g, x, ldx, n, y, ldy, workspace, workspace_bytes, next, (cudaStream_t)stream, err);
}

extern "C" bool ddt_cuda_wg_split_planes(const ddt_qweight *w, int32_t n, void *workspace, size_t workspace_bytes,
                                         ddt_cuda_split_planes *out) {
    return ddt_cuda_wg_split_planes_grouped(w, 1, n, workspace, workspace_bytes, out);
}

extern "C" bool ddt_cuda_wg_split_planes_grouped(const ddt_qweight *w, int32_t count, int32_t n, void *workspace,
                                                 size_t workspace_bytes, ddt_cuda_split_planes *out) {
    memset(out, 0, sizeof *out);
    if (!ddt_cuda_wg_eligible(w) || n < 1 || count < 1 || (int64_t)count * n > 0x7FFFFFFF || !workspace ||
        (uintptr_t)workspace % 16 != 0)
        return false;
    const WgPlanes pl = wg_planes(w->cols, (int64_t)count * n, workspace); /* wg_matmul's layout: row g*n + t */
    if (workspace_bytes < (size_t)pl.plane * 4) return false;
    out->hi = (uint16_t *)pl.hi;
    out->lo = (uint16_t *)pl.lo;
    out->pitch = pl.pitch;
    return true;
}

extern "C" ddt_status ddt_cuda_wg_matmul_presplit(const ddt_qweight *w, int32_t n, float *y, int64_t ldy,
                                                  void *workspace, size_t workspace_bytes, ddt_cuda_stream stream,
                                                  ddt_error *err) {
    if (!w) return ddt_fail(err, DDT_ERR_INVALID, "matmul (wgmma, presplit): no weight");
    const ddt_row_groups g = {1, 0, 0, w->rows, 0, 0};
    return wg_matmul(w, &g, NULL, 0, n, y, ldy, workspace, workspace_bytes, NULL, (cudaStream_t)stream, err);
}
