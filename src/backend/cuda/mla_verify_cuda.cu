/*
 * mla_verify_cuda.cu — tree-verify MLA-absorb attention on Hopper (see
 * mla_verify_cuda.h for the contract).
 *
 * Work split.  The T*H query rows are cut into tiles of 64 (one wgmma M); the
 * cache rows into blocks of 64: the prefix blocks, then one "tail" block that
 * starts at row n_prefix and holds the tree's T rows (masked by vis).  The
 * blocks are divided evenly into S splits with S*tiles close to the 132
 * multiprocessors and at least DDT_MLA_MIN_BPS blocks a split; one CTA = one query tile x one split.  All the tiles of a
 * split read the same cache rows at about the same time, so the cache comes
 * from HBM about once and from L2 for the other tiles.
 *
 * One CTA (FlashMLA-like, two warpgroups, 1 CTA per SM, 226 KB of shared memory):
 *   shared: Q tile [64][576] and two cache stages [64][576] (each as nine
 *   64x64 bf16 tiles of 128-byte rows in the 128-byte swizzle that TMA writes
 *   and wgmma reads), P [64][64] bf16, per-row scale / max / sum.
 *   warpgroup 0: S = Q K^T (wgmma m64n64k16, 36 steps), mask, online softmax
 *     (exp2, running max), P in bf16 to shared memory, then O[:, 0:256] += P V.
 *   warpgroup 1: O[:, 256:512] += P V; its first thread also issues the TMA
 *     loads of the next blocks once both warpgroups released a stage.
 *   The 64x512 fp32 output tile is 128 registers per thread in each warpgroup;
 *   V is the same shared tile as K, read transposed (MN-major descriptor).
 * Rows of a block past the valid ones (past n_prefix, past the tree, or past
 * the cache) are zeroed in shared memory before use: a NaN there must not reach
 * P V through 0 * NaN.
 *
 * Merge of the splits, in split order (deterministic): each split writes its
 * normalised output and log2-sum-exp; out = sum_s w_s O_s / sum_s w_s with
 * w_s = 2^(lse_s - max lse).  Two paths with the same arithmetic, hence the
 * same bits: when the S splits of a tile fit one thread-block cluster (S <= 8,
 * e.g. T >= 17 at H = 64) they merge through distributed shared memory (each
 * CTA pushes its rows to the CTA that merges them, over the then idle cache
 * stages) and nothing goes through HBM; otherwise through the workspace and a
 * second (combine) kernel: past 8 splits one that stages every split's rows in
 * shared memory at once (mla_combine_staged_kernel), else one that reads them in
 * rounds of 8 (mla_combine_kernel).
 *
 * The softmax is taken in base 2 (scores scaled by scale*log2 e) with the
 * hardware exp2; P is rounded to bf16 for the tensor cores and the row sums add
 * the rounded values, so numerator and denominator agree.
 */
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cuda/bf16_split_dev.cuh"
#include "backend/cuda/cp_async_dev.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/hopper_dev.cuh"
#include "backend/cuda/mla_verify_cuda.h"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* A plain sm_90 pass (-arch=sm_90a also emits compute_90 PTX) compiles the split
 * kernel's body out, which leaves its Hopper-only helpers unreferenced. */
#pragma nv_diag_suppress 177
#endif

namespace {

constexpr int DK = DDT_MLA_DK, DV = DDT_MLA_DV;
constexpr int BM = 64;          /* query rows per CTA: one wgmma M */
constexpr int BN = 64;          /* cache rows per block */
constexpr int KT = DK / 64;     /* 9 column tiles of 64 per row */
constexpr int TILE = 8192;      /* bytes of one 64x64 bf16 tile */
constexpr int BLK = KT * TILE;  /* 73728: a Q tile or a cache block */
#ifndef DDT_MLA_SPLIT_TARGET
#define DDT_MLA_SPLIT_TARGET 132
#endif
/* H200 multiprocessors; a constant so plans do not depend on the device (-D for measurements) */
constexpr int SPLIT_TARGET = DDT_MLA_SPLIT_TARGET;
constexpr int MAX_CLUSTER = 8;  /* portable cluster size */
constexpr int NTHREADS = 256;
constexpr int SO_LD = DV + 8;   /* fp32 row stride of the staged output (spreads banks) */

constexpr int OFF_Q = 0;
constexpr int OFF_KV = BLK;             /* two stages */
constexpr int OFF_P = OFF_KV + 2 * BLK;
constexpr int OFF_SCALE = OFF_P + TILE; /* [64] per-row rescale of the block */
constexpr int OFF_M = OFF_SCALE + 256;  /* [64] final running max (log2 domain) */
constexpr int OFF_L = OFF_M + 256;      /* [64] final row sum */
constexpr int OFF_BAR = OFF_L + 256;
constexpr int BAR_FULL = 0;             /* [2]: the nine tiles of a stage landed */
constexpr int BAR_EMPTY = 2;            /* [2]: both warpgroups are done with a stage */
constexpr int BAR_Q = 4;
constexpr int N_BARS = 5;
constexpr int SMEM_BYTES = OFF_BAR + N_BARS * 8 + 1024; /* + room to align the base to 1024 */
constexpr bool recv_fits() { /* the cluster merge's receive buffer: C splits x ceil(64/C) rows */
    for (int c = 1; c <= 8; c++)
        if (c * ((BM + c - 1) / c) * SO_LD * 4 > 2 * BLK || c * ((BM + c - 1) / c) * 4 > TILE) return false;
    return true;
}
static_assert(recv_fits(), "the cluster merge's receive buffers fit over the cache stages and P");
static_assert(SMEM_BYTES <= 232448, "fits the 227 KB a Hopper CTA may use");

/* 1 (default): warpgroup 0 waits for its P V before the next block's S and
 * releases the stage at once; 0: leaves it in flight under the next S.  On the
 * H200, 1 was as fast or faster everywhere (T=16, N=64K: 249 vs 266 us), as the
 * stage then goes back to the TMA producer a block earlier. */
#ifndef MLA_DRAIN_PV
#define MLA_DRAIN_PV 1
#endif

/* named barriers (0 is __syncthreads) */
constexpr int NB_P_READY = 1; /* wg0 arrives, wg1 waits: P and scale of the block are in smem */
constexpr int NB_P_FREE = 2;  /* wg1 arrives, wg0 waits: wg1 finished reading P */
constexpr int NB_WG0 = 3;     /* warpgroup 0 alone */

struct Params {
    const int32_t *n_prefix;
    const uint64_t *vis;
    int T, H, n_rows, n_qtiles, s_grid;
    long long max_prefix, kv_rows;
    float scale_log2;
    float *o_part;   /* [s_grid][n_rows][DV] normalised split outputs (global path) */
    float *lse_part; /* [s_grid][n_rows] log2-sum-exp of each split */
    void *out;
    int out_fp32;
    long long out_ld;
    float *lse;
    __nv_bfloat16 *ph, *pl; /* out's split planes (fp32 out), row h * T + t; ph NULL: none */
    long long ppitch;
};

/* ---- split plan: a function of (n_prefix, query tiles) only ---- */

/* Blocks a split takes at least.  A split of one 64-row block reads 74 KB of cache
 * and writes 131 KB of partials (64 rows x 513 fp32) that the combine reads back, so
 * at small T (one or two query tiles) the one-block splits of SPLIT_TARGET moved
 * more bytes through the merge than through the attention.  Measured on the H200
 * (twelfth session, cuda_bench_mla, T = 1): at least 1 / 3 / 9 blocks a split took
 * 13.5 / 14.7 / 25.0 us at N = 1024, 18.4 / 16.8 / 25.6 at 4096, 27.8 / 24.8 / 28.5
 * at 16384, 45 / 45 / 43 at 65536; in the K2.6 layer at N = 4096 attention + combine
 * 19.8 -> 17.8 us with 3. */
#ifndef DDT_MLA_MIN_BPS
#define DDT_MLA_MIN_BPS 3
#endif
/* The most splits nb blocks (prefix + tail) take at n_qtiles query tiles: the plan's
 * cap (SPLIT_TARGET CTAs, at least DDT_MLA_MIN_BPS blocks a split, at most a split a
 * block).  Both the plan and the grid bound below derive from it, so they move together. */
__host__ __device__ inline long long max_splits(long long nb, int n_qtiles) {
    long long smax = SPLIT_TARGET / n_qtiles;
    if (smax > (nb + DDT_MLA_MIN_BPS - 1) / DDT_MLA_MIN_BPS) smax = (nb + DDT_MLA_MIN_BPS - 1) / DDT_MLA_MIN_BPS;
    if (smax < 1) smax = 1;
    return smax < nb ? smax : nb;
}

__host__ __device__ inline void split_plan(long long np, int n_qtiles, int &S, int &bps) {
    const long long nb = (np + BN - 1) / BN + 1; /* prefix blocks + the tail block */
    const long long smax = max_splits(nb, n_qtiles);
    const long long b = (nb + smax - 1) / smax;
    bps = (int)b;
    S = (int)((nb + b - 1) / b);
}

/* An upper bound of S for every n_prefix <= max_prefix: the grid's y. */
__host__ __device__ inline int grid_splits(long long max_prefix, int n_qtiles) {
    return (int)max_splits((max_prefix + BN - 1) / BN + 1, n_qtiles);
}

/* ---- PTX wrappers: hopper_dev.cuh, and the MN-major descriptor of V ---- */

/* MN-major operand (V = the cache tile read transposed): 64 columns per 128-byte
 * row, the next 64 columns one tile (8192 bytes) on, 8-row groups 1024 apart. */
__device__ __forceinline__ uint64_t mnmajor_desc(uint32_t saddr) { return make_desc(saddr, TILE, 1024); }

#define F8(i)                                                                                              \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
        "+f"(d[i + 7])
#define F32(i) F8(i), F8(i + 8), F8(i + 16), F8(i + 24)

/* D[64x256] += A[64x16] (K-major smem) * B[16x256] (MN-major smem: transposed) */
__device__ __forceinline__ void wgmma_m64n256_tb(float (&d)[128], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, 1;\n"
        "}\n"
        : F32(0), F32(32), F32(64), F32(96)
        : "l"(da), "l"(db), "r"(1));
}

#undef F32
#undef F8

/* ---- geometry of one block of cache rows ---- */

struct BlockGeom {
    int row0;  /* first cache row */
    int valid; /* rows of the block in use (the rest is zeroed) */
    bool tail; /* the tree's rows: masked by vis */
};

__device__ __forceinline__ BlockGeom block_geom(int b, int nbp, long long np, int T) {
    BlockGeom g;
    if (b < nbp) {
        g.row0 = b * BN;
        const long long left = np - (long long)g.row0;
        g.valid = left < BN ? (int)left : BN;
        g.tail = false;
    } else {
        g.row0 = (int)np;
        g.valid = T;
        g.tail = true;
    }
    return g;
}

#ifndef DDT_MLA_KV_EVICT_FIRST
#define DDT_MLA_KV_EVICT_FIRST 0
#endif
__device__ __forceinline__ void load_block(const CUtensorMap *tmkv, uint32_t sb, int stage, int row0) {
    const uint32_t dst = sb + OFF_KV + stage * BLK, bar = sb + OFF_BAR + (BAR_FULL + stage) * 8;
    mbar_expect_tx(bar, BLK);
#if DDT_MLA_KV_EVICT_FIRST
    /* experiment: the cache rows marked first to go from L2, so that the splits' partials
       stay there for the merge (at N = 65536 the stream is 75 MB through a 50 MB L2) */
    const uint64_t pol = l2_evict_first();
#pragma unroll 1
    for (int kt = 0; kt < KT; kt++) tma_load_2d_hint(dst + kt * TILE, tmkv, kt * 64, row0, bar, pol);
#else
#pragma unroll 1
    for (int kt = 0; kt < KT; kt++) tma_load_2d(dst + kt * TILE, tmkv, kt * 64, row0, bar);
#endif
}

/* ---- the merge of the splits of one row, 4 output columns (shared by every path) ---- */

/* S partial rows (normalised, each with its log2-sum-exp) merged in split order:
 * res = sum_s w_s O_s / sum_s w_s with w_s = 2^(lse_s - M), M the largest lse_s,
 * and lse_out = (M + log2 sum_s w_s) * lse_scale (1: log2, ln 2: natural); no
 * visible row (M = -inf): res 0, lse_out -inf.  B loads in flight, the sums in
 * split order (the same bits for any B). */
template <int B, class OF>
__device__ __forceinline__ void merge_splits(int S, const float *lse, int lse_stride, OF o_of, float lse_scale,
                                             float4 &res, float &lse_out) {
    float M = -INFINITY;
    for (int s = 0; s < S; s++) M = fmaxf(M, lse[s * lse_stride]);
    if (M == -INFINITY) { /* no visible row (padding rows only) */
        res = make_float4(0.f, 0.f, 0.f, 0.f);
        lse_out = -INFINITY;
    } else {
        float W = 0.f;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int s0 = 0; s0 < S; s0 += B) {
            float4 v[B];
#pragma unroll
            for (int k = 0; k < B; k++)
                if (s0 + k < S) v[k] = o_of(s0 + k);
#pragma unroll
            for (int k = 0; k < B; k++) {
                if (s0 + k < S) {
                    const float w = ex2(lse[(s0 + k) * lse_stride] - M);
                    W += w;
                    acc.x += w * v[k].x;
                    acc.y += w * v[k].y;
                    acc.z += w * v[k].z;
                    acc.w += w * v[k].w;
                }
            }
        }
        res = make_float4(acc.x / W, acc.y / W, acc.z / W, acc.w / W);
        lse_out = (M + log2f(W)) * lse_scale;
    }
}

template <int B, class OF>
__device__ __forceinline__ void combine_row(const Params &p, int S, bool ok, long long grow, int c4, bool write_lse,
                                            const float *lse, int lse_stride, OF o_of) {
    float4 res;
    float lse_out;
    if (!ok) {
        res = make_float4(NAN, NAN, NAN, NAN);
        lse_out = NAN;
    } else {
        merge_splits<B>(S, lse, lse_stride, o_of, 0.69314718055994531f, res, lse_out);
    }
    if (p.out_fp32) {
        *(float4 *)((float *)p.out + grow * p.out_ld + c4) = res;
        if (p.ph) { /* W_UV's activations, head-major: its split launch's planes, bitwise */
            const long long t = grow / p.H, h = grow - t * p.H, r = (h * p.T + t) * p.ppitch + c4;
            /* four columns a plane in one 8-byte store (r is a multiple of 4: the pitch is
               a multiple of 8), bf16_split's values */
            __nv_bfloat16 hv[4], lv[4];
            bf16_split(res.x, hv[0], lv[0]);
            bf16_split(res.y, hv[1], lv[1]);
            bf16_split(res.z, hv[2], lv[2]);
            bf16_split(res.w, hv[3], lv[3]);
            *(uint2 *)(p.ph + r) = *(const uint2 *)hv;
            *(uint2 *)(p.pl + r) = *(const uint2 *)lv;
        }
    } else {
        __nv_bfloat162 lo = __floats2bfloat162_rn(res.x, res.y), hi = __floats2bfloat162_rn(res.z, res.w);
        uint2 u;
        u.x = *(uint32_t *)&lo;
        u.y = *(uint32_t *)&hi;
        *(uint2 *)((__nv_bfloat16 *)p.out + grow * p.out_ld + c4) = u;
    }
    if (write_lse && p.lse) p.lse[grow] = lse_out;
}

/* ---- the split kernel ---- */

/* Before its grid wait the kernel reads *n_prefix and TMA-loads its first
 * prefix blocks: the committed rows [0, n_prefix) and n_prefix itself are
 * written only between forwards (a round's commit, an advance, set_len: after
 * the forward's last kernel in a graph, or in an earlier stream operation),
 * never by a kernel of the forward this launch belongs to, so no programmatic
 * predecessor writes them.  The queries, the tree's own rows and vis are the
 * predecessors' and are read after the wait.  (A prefix block's rows past
 * n_prefix may be loaded while written: they are zeroed before use.) */
template <bool CLUSTER>
__global__ void __launch_bounds__(NTHREADS, 1)
    mla_attn_kernel(const __grid_constant__ CUtensorMap tmq, const __grid_constant__ CUtensorMap tmkv, const Params p) {
    DDT_GRID_DEP_LATER();
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    DDT_GRID_DEP_WAIT();
    __trap(); /* a pass for plain sm_90 (-arch=sm_90a also emits compute_90 PTX): wgmma needs sm_90a */
#else
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t sb = (raw + 1023u) & ~1023u; /* swizzled tiles need 1024-byte alignment */
    uint8_t *const sg = smem_raw + (sb - raw);
    float *const s_scale = (float *)(sg + OFF_SCALE);
    float *const s_m = (float *)(sg + OFF_M);
    float *const s_l = (float *)(sg + OFF_L);

    const int qtile = blockIdx.x, split = blockIdx.y;
    const int tid = threadIdx.x, wg = tid >> 7, t = tid & 127;
    const int warp = t >> 5, lane = tid & 31, quad = lane & 3;
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8; /* this thread's rows of the accumulators */

    const long long np = *p.n_prefix;
    const bool ok = np >= 0 && np <= p.max_prefix && np + p.T <= p.kv_rows;
    int S = 0, bps = 0;
    if (ok) split_plan(np, p.n_qtiles, S, bps);
    const int nbp = ok ? (int)((np + BN - 1) / BN) : 0;
    const int b_begin = split * bps;
    const int nblk = (ok && split < S) ? min(nbp + 1, b_begin + bps) - b_begin : 0;
    if (!CLUSTER && nblk == 0) return; /* the combine kernel reads splits < S only */

    float o[128]; /* this warpgroup's half of the 64x512 output tile */
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;

    if (nblk > 0) {
        if (tid == 0) {
            for (int i = 0; i < N_BARS; i++) mbar_init(sb + OFF_BAR + i * 8, (i == BAR_EMPTY || i == BAR_EMPTY + 1) ? 2 : 1);
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncthreads();
        if (tid == 0) {
            asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)&tmq) : "memory");
            asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)&tmkv) : "memory");
            /* the first prefix blocks while the predecessors finish (the top says why) */
            for (int i = 0; i < 2 && i < nblk; i++) {
                const BlockGeom g = block_geom(b_begin + i, nbp, np, p.T);
                if (!g.tail) load_block(&tmkv, sb, i, g.row0);
            }
        }
    }
    DDT_GRID_DEP_WAIT(); /* the queries, the tree's rows and vis are the predecessors' */
    if (nblk > 0) {
        if (tid == 0) {
            const uint32_t qbar = sb + OFF_BAR + BAR_Q * 8;
            mbar_expect_tx(qbar, BLK);
            for (int kt = 0; kt < KT; kt++) tma_load_2d(sb + OFF_Q + kt * TILE, &tmq, kt * 64, qtile * BM, qbar);
            for (int i = 0; i < 2 && i < nblk; i++) {
                const BlockGeom g = block_geom(b_begin + i, nbp, np, p.T);
                if (g.tail) load_block(&tmkv, sb, i, g.row0);
            }
        }
        const uint32_t pb = sb + OFF_P;

        if (wg == 0) {
            /* ---- warpgroup 0: scores, mask, softmax, P, left half of O ---- */
            const long long g0 = (long long)qtile * BM + r0, g1 = g0 + 8;
            const uint64_t vis0 = g0 < p.n_rows ? p.vis[g0 / p.H] : 0ull;
            const uint64_t vis1 = g1 < p.n_rows ? p.vis[g1 / p.H] : 0ull;
            const float sl2 = p.scale_log2;
            float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
            int pv_stage = -1; /* stage whose P V is still in flight */
            mbar_wait(sb + OFF_BAR + BAR_Q * 8, 0);
#pragma unroll 1
            for (int i = 0; i < nblk; i++) {
                const int stage = i & 1;
                const uint32_t par = (i >> 1) & 1;
                const BlockGeom g = block_geom(b_begin + i, nbp, np, p.T);
                const uint32_t kv = sb + OFF_KV + stage * BLK;
                /* the whole block first: a wait between wgmmas would make ptxas serialise them */
                mbar_wait(sb + OFF_BAR + (BAR_FULL + stage) * 8, par);
                if (g.valid < BN) {
                    /* zero the unused rows (NaN there would survive 0 * NaN in P V) */
                    const int nz = (BN - g.valid) * 8;
                    for (int idx = t; idx < KT * nz; idx += 128) {
                        const int kt = idx / nz, rem = idx - kt * nz;
                        st_shared_zero16(kv + kt * TILE + (g.valid + (rem >> 3)) * 128 + (rem & 7) * 16);
                    }
                    fence_proxy_async();
                    bar_sync(NB_WG0, 128);
                }
                float s[32];
#pragma unroll
                for (int j = 0; j < 32; j++) s[j] = 0.f;
                fence_regs(s);
                wgmma_fence();
#pragma unroll
                for (int kt = 0; kt < KT; kt++) {
#pragma unroll
                    for (int kk = 0; kk < 4; kk++)
                        wgmma_m64n64(s, kmajor_desc(sb + OFF_Q + kt * TILE + kk * 32), kmajor_desc(kv + kt * TILE + kk * 32));
                }
                wgmma_commit();
                if (pv_stage >= 0) {
                    /* the previous block's P V ran under this S: release its stage */
                    wgmma_wait<1>();
                    fence_regs(o);
                    if (t == 0) mbar_arrive(sb + OFF_BAR + (BAR_EMPTY + pv_stage) * 8);
                }
                wgmma_wait<0>();
                fence_regs(s);

                /* mask: columns past the valid rows; in the tail, non-ancestors */
                if (g.valid < BN || g.tail) {
#pragma unroll
                    for (int j = 0; j < 32; j++) {
                        const int c = 8 * (j >> 2) + 2 * quad + (j & 1);
                        const uint64_t vr = (j & 2) ? vis1 : vis0;
                        const bool keep = c < g.valid && (!g.tail || ((vr >> c) & 1ull));
                        if (!keep) s[j] = -INFINITY;
                    }
                }
                /* online softmax over the block (log2 domain) */
                float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
                for (int j = 0; j < 32; j++) {
                    if (j & 2)
                        mx1 = fmaxf(mx1, s[j]);
                    else
                        mx0 = fmaxf(mx0, s[j]);
                }
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
                const float mn0 = fmaxf(m0, mx0 * sl2), mn1 = fmaxf(m1, mx1 * sl2);
                const float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
                const float a0 = ex2(m0 - mu0), a1 = ex2(m1 - mu1);
                m0 = mn0;
                m1 = mn1;
                uint32_t pk[16];
                float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
                for (int j = 0; j < 32; j += 2) {
                    const float mu = (j & 2) ? mu1 : mu0;
                    const __nv_bfloat162 b2 =
                        __floats2bfloat162_rn(ex2(__fmaf_rn(s[j], sl2, -mu)), ex2(__fmaf_rn(s[j + 1], sl2, -mu)));
                    const float2 f = __bfloat1622float2(b2);
                    if (j & 2)
                        sum1 += f.x + f.y;
                    else
                        sum0 += f.x + f.y;
                    pk[j >> 1] = *(const uint32_t *)&b2;
                }
                l0 = l0 * a0 + sum0;
                l1 = l1 * a1 + sum1;

                /* P to shared memory (swizzled like a TMA tile), scale beside it */
                if (i > 0) bar_sync(NB_P_FREE, 256);
#pragma unroll
                for (int jj = 0; jj < 8; jj++) {
                    st_shared_u32(pb + r0 * 128 + ((jj ^ (r0 & 7)) << 4) + quad * 4, pk[2 * jj]);
                    st_shared_u32(pb + r1 * 128 + ((jj ^ (r1 & 7)) << 4) + quad * 4, pk[2 * jj + 1]);
                }
                if (quad == 0) {
                    s_scale[r0] = a0;
                    s_scale[r1] = a1;
                }
                fence_proxy_async();
                bar_arrive(NB_P_READY, 256);
                bar_sync(NB_WG0, 128);

#pragma unroll
                for (int j = 0; j < 128; j++) o[j] *= (j & 2) ? a1 : a0;
                fence_regs(o); /* the rescale must land before the fence, not be scheduled after it */
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    wgmma_m64n256_tb(o, kmajor_desc(pb + kk * 32), mnmajor_desc(kv + kk * 2048));
                wgmma_commit();
#if MLA_DRAIN_PV
                wgmma_wait<0>();
                fence_regs(o);
                if (t == 0) mbar_arrive(sb + OFF_BAR + (BAR_EMPTY + stage) * 8);
#else
                pv_stage = stage; /* left in flight: waited for under the next block's S */
#endif
            }
            if (pv_stage >= 0) {
                wgmma_wait<0>();
                fence_regs(o);
                if (t == 0) mbar_arrive(sb + OFF_BAR + (BAR_EMPTY + pv_stage) * 8);
            }
            l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
            l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
            l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
            l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
            if (quad == 0) {
                s_m[r0] = m0;
                s_m[r1] = m1;
                s_l[r0] = l0;
                s_l[r1] = l1;
            }
        } else {
            /* ---- warpgroup 1: right half of O; its thread 0 refills the stages ---- */
#pragma unroll 1
            for (int i = 0; i < nblk; i++) {
                const int stage = i & 1;
                const uint32_t par = (i >> 1) & 1;
                const uint32_t kv = sb + OFF_KV + stage * BLK;
                bar_sync(NB_P_READY, 256);
                const float a0 = s_scale[r0], a1 = s_scale[r1];
#pragma unroll
                for (int j = 0; j < 128; j++) o[j] *= (j & 2) ? a1 : a0;
                fence_regs(o); /* the rescale must land before the fence, not be scheduled after it */
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    wgmma_m64n256_tb(o, kmajor_desc(pb + kk * 32), mnmajor_desc(kv + 4 * TILE + kk * 2048));
                wgmma_commit();
                wgmma_wait<0>();
                fence_regs(o);
                if (i + 1 < nblk) bar_arrive(NB_P_FREE, 256);
                if (t == 0) {
                    const uint32_t empty = sb + OFF_BAR + (BAR_EMPTY + stage) * 8;
                    mbar_arrive(empty);
                    if (i + 2 < nblk) {
                        mbar_wait(empty, par); /* warpgroup 0 is done with the stage too */
                        load_block(&tmkv, sb, stage, block_geom(b_begin + i + 2, nbp, np, p.T).row0);
                    }
                }
                __syncwarp();
            }
        }
    }
    fence_proxy_async(); /* the stages are rewritten below by ordinary stores */
    __syncthreads();

    /* ---- epilogue: this split's normalised rows and log2-sum-exp ---- */
    const long long g0 = (long long)qtile * BM + r0, g1 = g0 + 8;
    const int cbase = wg * 256 + 2 * quad;
    float inv0 = 0.f, inv1 = 0.f, lse0 = -INFINITY, lse1 = -INFINITY;
    if (nblk > 0) {
        const float L0 = s_l[r0], L1 = s_l[r1];
        if (L0 > 0.f) {
            inv0 = 1.f / L0;
            lse0 = s_m[r0] + log2f(L0);
        }
        if (L1 > 0.f) {
            inv1 = 1.f / L1;
            lse1 = s_m[r1] + log2f(L1);
        }
    }
    if (!CLUSTER) {
        float *op = p.o_part + (size_t)split * p.n_rows * DV;
        if (g0 < p.n_rows) {
#pragma unroll
            for (int jj = 0; jj < 32; jj++)
                *(float2 *)(op + g0 * DV + cbase + 8 * jj) = make_float2(o[4 * jj] * inv0, o[4 * jj + 1] * inv0);
            if (wg == 0 && quad == 0) p.lse_part[(size_t)split * p.n_rows + g0] = lse0;
        }
        if (g1 < p.n_rows) {
#pragma unroll
            for (int jj = 0; jj < 32; jj++)
                *(float2 *)(op + g1 * DV + cbase + 8 * jj) = make_float2(o[4 * jj + 2] * inv1, o[4 * jj + 3] * inv1);
            if (wg == 0 && quad == 0) p.lse_part[(size_t)split * p.n_rows + g1] = lse1;
        }
    } else {
        /* Rows [lo(c), lo(c+1)) of the tile, lo(c) = c*64/C, are merged by CTA c of
         * the cluster.  Each split pushes its rows into the owner's shared memory
         * (remote stores do not wait), then every CTA merges from local memory. */
        const int C = gridDim.y, crank = split;
        const int rpm = (BM + C - 1) / C;
        const uint32_t recv_o = sb + OFF_KV, recv_lse = sb + OFF_P;
        cluster_sync(); /* every CTA is done with its stages: they become receive buffers */
        if (nblk > 0) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = h ? r1 : r0;
                int owner = 0;
                for (int c = 1; c < C; c++)
                    if (c * BM / C <= r) owner = c;
                const int rl = r - owner * BM / C;
                const float inv = h ? inv1 : inv0;
                const uint32_t row = map_to_cta(recv_o + (uint32_t)((crank * rpm + rl) * SO_LD + cbase) * 4, (uint32_t)owner);
#pragma unroll
                for (int jj = 0; jj < 32; jj++)
                    st_cluster_v2(row + jj * 32, o[4 * jj + 2 * h] * inv, o[4 * jj + 2 * h + 1] * inv);
                if (wg == 0 && quad == 0)
                    st_cluster_f32(map_to_cta(recv_lse + (uint32_t)(crank * rpm + rl) * 4, (uint32_t)owner), h ? lse1 : lse0);
            }
        }
        cluster_sync(); /* all pushes have landed */
        const int lo = crank * BM / C, hi = (crank + 1) * BM / C;
        const float *const rlse = (const float *)(sg + OFF_P);
        const float *const ro = (const float *)(sg + OFF_KV);
        for (int item = tid; item < (hi - lo) * 128; item += NTHREADS) {
            const int rl = item >> 7, c4 = (item & 127) * 4;
            const long long grow = (long long)qtile * BM + lo + rl;
            if (grow >= p.n_rows) continue;
            combine_row<8>(p, S, ok, grow, c4, c4 == 0, rlse + rl, rpm,
                        [&](int sp) { return *(const float4 *)(ro + (size_t)(sp * rpm + rl) * SO_LD + c4); });
        }
    }
#endif
}

/* ---- global-path merge: one CTA per query row ---- */

__global__ void __launch_bounds__(128) mla_combine_kernel(const Params p) {
    DDT_GRID_DEP_WAIT();
    __shared__ float sl[SPLIT_TARGET];
    const long long grow = blockIdx.x;
    const long long np = *p.n_prefix;
    const bool ok = np >= 0 && np <= p.max_prefix && np + p.T <= p.kv_rows;
    int S = 0, bps = 0;
    if (ok) split_plan(np, p.n_qtiles, S, bps);
    const size_t nr = (size_t)p.n_rows;
    for (int s = threadIdx.x; s < S; s += blockDim.x) sl[s] = p.lse_part[(size_t)s * nr + grow];
    __syncthreads();
    const int c4 = threadIdx.x * 4;
    /* 8 splits' rows in flight: 32 (fewer dependent rounds for a K2.6 token's 67
       splits at N = 4096) measured slower on the H200, 9.5 against 8.2 us at n = 1
       and 11.4 against 6.0 at n = 16 (registers: fewer blocks resident) */
    combine_row<8>(p, S, ok, grow, c4, threadIdx.x == 0, sl, 1,
                [&](int s) { return *(const float4 *)(p.o_part + ((size_t)s * nr + grow) * DV + c4); });
}


/* ---- global-path merge of many splits: one CTA per query row and 128 output columns ---- */

/* Every split's 128 columns of the row and its lse staged into shared memory by cp.async, all in
 * flight at once (one round trip to L2 for any S), then one column a thread merged in split order:
 * per column the arithmetic of combine_row (the cluster path's), hence the same bits.  The one
 * CTA a row above reads 8 splits' rows a round: 3 dependent rounds at T = 1 and N = 4096 (22
 * splits), 17 at N = 65536 (129).  Taken when the grid has more than 8 splits (one round of the
 * kernel above), i.e. at few query tiles: on an H100 (thirty-first session, cuda_bench_mla, T =
 * 1) N = 4096 18.3 -> 17.3 us, N = 65536 59.1 -> 53.2; at T = 16 (8 splits, 1024 rows: four times
 * the CTAs, each with little to stage) it was 13% slower, so there the kernel above stays. */
constexpr int MC_COLS = 128;        /* output columns of a merge CTA (its threads) */
constexpr int MC_STAGED_ABOVE = 8;  /* grid splits past which the global path merges staged */

__host__ __device__ inline int merge_lse_pad(int sgrid) { return (sgrid + 3) & ~3; }
__host__ __device__ inline size_t merge_smem_bytes(int sgrid) {
    return ((size_t)merge_lse_pad(sgrid) + (size_t)sgrid * MC_COLS) * 4;
}

__global__ void __launch_bounds__(MC_COLS) mla_combine_staged_kernel(const Params p) {
    DDT_GRID_DEP_WAIT();
    extern __shared__ __align__(16) float mc_smem[];
    const long long grow = blockIdx.x;
    const int col = blockIdx.y * MC_COLS + threadIdx.x;
    const long long np = *p.n_prefix;
    const bool ok = np >= 0 && np <= p.max_prefix && np + p.T <= p.kv_rows;
    int S = 0, bps = 0;
    if (ok) split_plan(np, p.n_qtiles, S, bps);
    const size_t nr = (size_t)p.n_rows;
    float *const sl = mc_smem;                              /* [S] lse */
    float *const sv = mc_smem + merge_lse_pad(p.s_grid);    /* [S][MC_COLS] */
    const uint32_t slb = smem_u32(sl), svb = smem_u32(sv);
    for (int s = threadIdx.x; s < S; s += MC_COLS) cp_async_ca4(slb + s * 4, p.lse_part + (size_t)s * nr + grow);
    const float *const src = p.o_part + grow * DV + blockIdx.y * MC_COLS;
    for (int i = threadIdx.x; i < S * (MC_COLS / 4); i += MC_COLS) {
        const int s = i / (MC_COLS / 4), q = i - s * (MC_COLS / 4);
        cp_async_cg16(svb + (uint32_t)(s * MC_COLS + q * 4) * 4, src + (size_t)s * nr * DV + q * 4);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float res, lse_out;
    if (!ok) {
        res = NAN;
        lse_out = NAN;
    }
    else {
        float M = -INFINITY;
        for (int s = 0; s < S; s++) M = fmaxf(M, sl[s]);
        if (M == -INFINITY) { /* no visible row (padding rows only) */
            res = 0.f;
            lse_out = -INFINITY;
        } else {
            float W = 0.f, acc = 0.f;
            for (int s = 0; s < S; s++) {
                const float w = ex2(sl[s] - M);
                W += w;
                acc += w * sv[s * MC_COLS + threadIdx.x];
            }
            res = acc / W;
            lse_out = (M + log2f(W)) * 0.69314718055994531f;
        }
    }
    if (p.out_fp32) {
        ((float *)p.out)[grow * p.out_ld + col] = res;
        if (p.ph) { /* W_UV's activations, head-major: its split launch's planes, bitwise */
            const long long t = grow / p.H, h = grow - t * p.H, r = (h * p.T + t) * p.ppitch + col;
            __nv_bfloat16 hv, lv;
            bf16_split(res, hv, lv);
            p.ph[r] = hv;
            p.pl[r] = lv;
        }
    } else {
        ((__nv_bfloat16 *)p.out)[grow * p.out_ld + col] = __float2bfloat16_rn(res);
    }
    if (col == 0 && p.lse) p.lse[grow] = lse_out;
}

/* ---- host side ---- */

/* A [rows][576] bf16 matrix with a row pitch, read in 64x64 boxes, 128-byte swizzle. */
bool encode_rows(encode_tiled_fn enc, CUtensorMap *map, const void *base, long long rows, long long ld) {
    cuuint64_t dims[2] = {(cuuint64_t)DK, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)ld * 2};
    cuuint32_t box[2] = {64, 64};
    cuuint32_t estr[2] = {1, 1};
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base), dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* How many clusters of C CTAs can be resident at once, per C (0: not measured yet). */
int g_cluster_cap[MAX_CLUSTER + 1];
bool g_prepared = false;

/* Kernel attributes and the cluster occupancy, once per process (outside any
 * graph capture when the caller asked for the workspace size at load time). */
cudaError_t prepare_kernels() {
    if (g_prepared) return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute(mla_attn_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(mla_attn_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(mla_combine_staged_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)merge_smem_bytes(SPLIT_TARGET));
    if (e != cudaSuccess) return e;
    for (int C = 1; C <= MAX_CLUSTER; C++) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr;
        cfg.gridDim = dim3(1, (unsigned)C, 1);
        cfg.blockDim = dim3(NTHREADS, 1, 1);
        cfg.dynamicSmemBytes = SMEM_BYTES;
        ddt_cuda_set_cluster(&cfg, &attr, 1, (unsigned)C);
        int n = 0;
        if (cudaOccupancyMaxActiveClusters(&n, mla_attn_kernel<true>, &cfg) != cudaSuccess) {
            (void)cudaGetLastError();
            n = 0;
        }
        g_cluster_cap[C] = n;
    }
    g_prepared = true;
    return cudaSuccess;
}

/* Can all n_qtiles clusters of C CTAs be resident at once? */
bool clusters_fit(int C, int n_qtiles) { return g_prepared && g_cluster_cap[C] >= n_qtiles; }

/* DDT_MLA_PATH_AUTO's choice: the cluster path when its clusters are all resident at
 * once, one a query tile up to 8 grid splits. */
bool auto_cluster(int sgrid, int n_qtiles) {
    return sgrid <= MAX_CLUSTER && clusters_fit(sgrid, n_qtiles);
}

} /* namespace */

extern "C" size_t ddt_cuda_mla_verify_workspace(int32_t n_tokens, int32_t n_heads, int64_t max_prefix) {
    if (n_tokens < 1 || n_heads < 1 || max_prefix < 0) return 0;
    (void)prepare_kernels(); /* errors surface again in run() */
    /* fewer tokens can mean more splits (T = 1 takes up to 132): the largest over T' <= n_tokens */
    size_t best = 0;
    for (int t = 1; t <= n_tokens; t++) {
        const long long n_rows = (long long)t * n_heads;
        const int n_qtiles = (int)((n_rows + BM - 1) / BM);
        const size_t b = (size_t)grid_splits(max_prefix, n_qtiles) * (size_t)n_rows * (DV + 1) * 4;
        if (b > best) best = b;
    }
    return best + 256;
}

extern "C" void ddt_cuda_mla_verify_plan(int32_t n_tokens, int32_t n_heads, int64_t n_prefix, int32_t *splits,
                                         int32_t *blocks_per_split) {
    const long long n_rows = (long long)n_tokens * n_heads;
    const int n_qtiles = (int)((n_rows + BM - 1) / BM);
    int S = 0, b = 0;
    split_plan(n_prefix, n_qtiles > 0 ? n_qtiles : 1, S, b);
    if (splits) *splits = S;
    if (blocks_per_split) *blocks_per_split = b;
}

extern "C" int32_t ddt_cuda_mla_verify_grid_splits(int32_t n_tokens, int32_t n_heads, int64_t max_prefix) {
    if (n_tokens < 1 || n_heads < 1 || max_prefix < 0) return 0;
    const long long n_rows = (long long)n_tokens * n_heads;
    return grid_splits(max_prefix, (int)((n_rows + BM - 1) / BM));
}

extern "C" int32_t ddt_cuda_mla_verify_auto_path(int32_t n_tokens, int32_t n_heads, int64_t max_prefix) {
    const long long n_rows = (long long)n_tokens * n_heads;
    const int n_qtiles = (int)((n_rows + BM - 1) / BM);
    if (n_qtiles < 1 || max_prefix < 0) return DDT_MLA_PATH_GLOBAL;
    const int sgrid = grid_splits(max_prefix, n_qtiles);
    if (prepare_kernels() != cudaSuccess) return DDT_MLA_PATH_GLOBAL;
    return auto_cluster(sgrid, n_qtiles) ? DDT_MLA_PATH_CLUSTER : DDT_MLA_PATH_GLOBAL;
}

extern "C" ddt_status ddt_cuda_mla_verify_run(const ddt_cuda_mla_verify *a, ddt_cuda_stream stream, ddt_error *err) {
    if (!a || !a->q || !a->kv || !a->n_prefix || !a->vis || !a->out || !a->workspace)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_mla_verify_run: NULL argument");
    if (a->n_tokens < 1 || a->n_tokens > DDT_MLA_MAX_TOKENS || a->n_heads < 1 || a->n_heads > 4096)
        return ddt_fail(err, DDT_ERR_RANGE, "MLA verify: %d tokens x %d heads (tokens 1..%d, heads 1..4096)",
                        a->n_tokens, a->n_heads, DDT_MLA_MAX_TOKENS);
    if (a->kv_ld < DK || a->kv_ld % 8 || a->kv_rows < 1 || a->kv_rows > (1ll << 31) - 1 || a->max_prefix < 0 ||
        a->max_prefix > (1ll << 31) - 1 - DDT_MLA_MAX_TOKENS)
        return ddt_fail(err, DDT_ERR_RANGE,
                        "MLA verify: cache of %lld rows at pitch %lld, max prefix %lld (pitch >= 576 and a multiple "
                        "of 8, rows and prefix below 2^31)",
                        (long long)a->kv_rows, (long long)a->kv_ld, (long long)a->max_prefix);
    if (a->out_ld < DV || a->out_ld % 8)
        return ddt_fail(err, DDT_ERR_RANGE, "MLA verify: output pitch %lld (>= 512, a multiple of 8)", (long long)a->out_ld);
    if (!(a->scale > 0.f) || !isfinite(a->scale))
        return ddt_fail(err, DDT_ERR_INVALID, "MLA verify: scale %g must be positive and finite", (double)a->scale);
    if (((uintptr_t)a->q | (uintptr_t)a->kv | (uintptr_t)a->out | (uintptr_t)a->workspace) & 15u)
        return ddt_fail(err, DDT_ERR_INVALID, "MLA verify: q, kv, out and workspace must be 16-byte aligned");
    if (a->path < DDT_MLA_PATH_AUTO || a->path > DDT_MLA_PATH_GLOBAL_STAGED)
        return ddt_fail(err, DDT_ERR_INVALID, "MLA verify: unknown path %d", a->path);

    encode_tiled_fn enc = get_encoder();
    if (!enc) return ddt_fail(err, DDT_ERR_UNSUPPORTED, "MLA verify: cuTensorMapEncodeTiled is not available");

    const int n_rows = a->n_tokens * a->n_heads;
    const int n_qtiles = (n_rows + BM - 1) / BM;
    const int sgrid = grid_splits(a->max_prefix, n_qtiles);

    CUtensorMap tmq, tmkv;
    if (!encode_rows(enc, &tmq, a->q, n_rows, DK) || !encode_rows(enc, &tmkv, a->kv, a->kv_rows, a->kv_ld))
        return ddt_fail(err, DDT_ERR_INVALID, "MLA verify: cuTensorMapEncodeTiled refused the q or cache layout");

    Params p;
    memset(&p, 0, sizeof p);
    p.n_prefix = a->n_prefix;
    p.vis = a->vis;
    p.T = a->n_tokens;
    p.H = a->n_heads;
    p.n_rows = n_rows;
    p.n_qtiles = n_qtiles;
    p.s_grid = sgrid;
    p.max_prefix = a->max_prefix;
    p.kv_rows = a->kv_rows;
    p.scale_log2 = a->scale * 1.4426950408889634f;
    p.o_part = (float *)a->workspace;
    p.lse_part = p.o_part + (size_t)sgrid * n_rows * DV;
    p.out = a->out;
    p.out_fp32 = a->out_fp32 ? 1 : 0;
    p.out_ld = a->out_ld;
    p.lse = a->lse;
    if (a->out_planes.hi) {
        if (!a->out_fp32 || !a->out_planes.lo || a->out_planes.pitch < DV)
            return ddt_fail(err, DDT_ERR_INVALID, "MLA verify: split planes of the output need fp32 output and a pitch "
                            ">= %d (%s, pitch %lld)", DV, a->out_fp32 ? "fp32" : "bf16",
                            (long long)a->out_planes.pitch);
        p.ph = (__nv_bfloat16 *)a->out_planes.hi;
        p.pl = (__nv_bfloat16 *)a->out_planes.lo;
        p.ppitch = a->out_planes.pitch;
    }

    DDT_CUDA_TRY(prepare_kernels(), err);
    bool cluster;
    if (a->path == DDT_MLA_PATH_GLOBAL || a->path == DDT_MLA_PATH_GLOBAL_STAGED)
        cluster = false;
    else if (a->path == DDT_MLA_PATH_CLUSTER) /* forced: one cluster resident at a time will do */
        cluster = sgrid <= MAX_CLUSTER;
    else
        cluster = auto_cluster(sgrid, n_qtiles);
    if (a->path == DDT_MLA_PATH_CLUSTER && !cluster)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "MLA verify: %d splits do not fit a cluster of %d", sgrid, MAX_CLUSTER);

    cudaStream_t s = (cudaStream_t)stream;
    if (cluster) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr;
        cfg.gridDim = dim3((unsigned)n_qtiles, (unsigned)sgrid, 1);
        cfg.blockDim = dim3(NTHREADS, 1, 1);
        cfg.dynamicSmemBytes = SMEM_BYTES;
        cfg.stream = s;
        ddt_cuda_set_cluster(&cfg, &attr, 1, (unsigned)sgrid);
        DDT_CUDA_TRY(cudaLaunchKernelEx(&cfg, mla_attn_kernel<true>, tmq, tmkv, p), err);
        DDT_CUDA_LAUNCHED("mla_attn_cluster", s, err);
    } else {
        mla_attn_kernel<false><<<dim3((unsigned)n_qtiles, (unsigned)sgrid, 1), NTHREADS, SMEM_BYTES, s>>>(tmq, tmkv, p);
        DDT_CUDA_LAUNCHED("mla_attn", s, err);
        if (sgrid > MC_STAGED_ABOVE || a->path == DDT_MLA_PATH_GLOBAL_STAGED) {
            mla_combine_staged_kernel<<<dim3((unsigned)n_rows, DV / MC_COLS), MC_COLS, merge_smem_bytes(sgrid), s>>>(p);
            DDT_CUDA_LAUNCHED("mla_combine_staged", s, err);
        } else {
            mla_combine_kernel<<<(unsigned)n_rows, 128, 0, s>>>(p);
            DDT_CUDA_LAUNCHED("mla_combine", s, err);
        }
    }
    return DDT_OK;
}
