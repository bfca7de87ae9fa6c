/*
 * dflash_cuda.cu — the DFlash drafter's own kernels (see dflash_cuda.h): the
 * per-head norms, RoPE from a cos/sin table and the K/V store into the context
 * cache (one kernel), the non-causal block attention and the device-side append
 * bookkeeping (folded into the append's last qkv_prep launch: the last block to
 * finish advances len).
 *
 * The per-head norm + RoPE + K/V store (ddt_dflash_qkv_prep; of one layer, or of
 * several layers' keys / values side by side) keeps a head in one warp's
 * registers: lane l holds the pairs (j, j + hd/2), j = l + 32 i, exactly
 * the values its rotation needs, so the norm's sum, the scaling and the rotation
 * take one read and one write of the head.  The rotation is the CPU's
 * ddt_cpu_rope_rotate arithmetic (a*c - b*s, b*c + a*s with --fmad=false, so no
 * contraction) on the CPU's own table values; only the norm's sum of squares is
 * in another order than the CPU's.
 *
 * Attention (ddt_dflash_attention, one launch): a block per (kv head, chunk of
 * its queries, split of rows).  It stages its rows' K and V a tile of 32 rows at
 * a time in shared memory with every load in flight, scores a row per lane
 * against the queries held in shared memory, and keeps an online softmax per
 * query taken a tile at a time (head_dim <= 128, attn_rows_kernel: the split's
 * tiles spread over the block's warps, each warp for all the block's queries,
 * merged in the block; larger head_dim, attn_kernel: every tile in all warps,
 * 2 queries a warp); a context within one split ends there, else the
 * splits' partials are merged in increasing split order by whichever split
 * finishes last (an arrival ticket per column in the scratch, back at 0 after
 * every launch).  The split length is fixed per drafter and every sum has a fixed
 * order, so the result never depends on the launch or on which block came last,
 * and a query's result depends only on that query and the cache.
 */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cp_async_dev.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dflash_cuda.h"

#define ATTN_T 32          /* rows per attention tile: one per lane when scoring */
#define ATTN_WARPS 4
#define ATTN_QB 2          /* queries per warp */
#define ATTN_QPB (ATTN_WARPS * ATTN_QB) /* queries per block */
#define ATTN_THREADS (ATTN_WARPS * 32)
#define ATTN_MAX_SPLITS 65535 /* grid.y */
#define PREP_WARPS 4       /* (row, head) items per qkv_prep block */

static __device__ __forceinline__ int read_count(const int32_t *count_dev, int count_host) {
    return count_dev ? *count_dev : count_host;
}

static __device__ __forceinline__ bool append_ok(int len, int count, int max_count, int limit) {
    return count >= 0 && count <= max_count && len >= 0 && (long long)len + count <= (long long)limit;
}

/* The append's bookkeeping (the last block of an append's qkv_prep): len
 * advances when the append is valid, else the status is set. */
static __device__ __forceinline__ void advance_one(int32_t *len_p, int32_t *status, int len, int count,
                                                   int max_count, int limit) {
    if (append_ok(len, count, max_count, limit))
        *len_p = len + count;
    else
        *status = DDT_DFLASH_BAD_APPEND;
}

/* ------------------------------------------------------------------ q/k norm + RoPE + K/V store */

/* One warp per (row t = blockIdx.y, head slot, layer blockIdx.z): slots [0, nq)
 * are query heads, [nq, nq + kv_heads) key/value heads.  NP = pairs per lane
 * (hd/2 <= 32 NP).  A layer of a several-layer launch changes only the pointers
 * its warps read and write, never the arithmetic, so its caches get the bits a
 * one-layer launch would store.  Every early return is uniform over the warp
 * (the butterfly needs all 32 lanes); it leaves this function only, so the
 * kernel's folded advance below still runs.  len is the kernel's one read of
 * *p.len. */
template <int NP>
static __device__ __forceinline__ void qkv_prep_item(const ddt_dflash_qkv &p, int len) {
    const int nq = p.q ? p.heads : 0, t = blockIdx.y;
    const int slot = blockIdx.x * PREP_WARPS + (threadIdx.x >> 5);
    if (slot >= nq + p.kv_heads) return;
    const int lane = threadIdx.x & 31, hd = p.hd, half = hd / 2;
    const long long pos = (long long)len + t;
    const float *src, *w;
    float *dst;
    bool rotate;
    if (slot < nq) {
        src = p.q + (int64_t)t * p.ldq + (int64_t)slot * hd;
        dst = p.qo + (int64_t)t * p.ldqo + (int64_t)slot * hd;
        w = p.q_norm;
        rotate = pos >= 0 && pos < p.limit;
    } else {
        const int count = read_count(p.count_dev, p.count_host);
        if (!append_ok(len, count, p.max_count, p.limit) || t >= count) return;
        const int g = slot - nq;
        const int64_t kvd = (int64_t)p.kv_heads * hd;
        /* the layer's slices of k | v, its weights and caches (blockIdx.z is 0 in
           a one-layer launch, whose pointers are the single fields); picked with
           constant indices, which read the parameters in place (an index by
           blockIdx.z copies the arrays to local memory first) */
        const int l = blockIdx.z;
        const int64_t lc = (int64_t)l * p.layer_cols;
        float *k_cache = p.k_cache, *v_cache = p.v_cache;
        w = p.k_norm;
#pragma unroll
        for (int i = 0; i < DDT_DFLASH_MAX_KV_LAYERS; i++)
            if (p.layers && i == l) k_cache = p.k_caches[i], v_cache = p.v_caches[i], w = p.k_norms[i];
        src = p.k + lc + (int64_t)t * p.ldk + (int64_t)g * hd;
        dst = k_cache + pos * kvd + (int64_t)g * hd;
        rotate = true; /* the append rule keeps pos < limit */
        const float *vs = p.v + lc + (int64_t)t * p.ldv + (int64_t)g * hd;
        float *vd = v_cache + pos * kvd + (int64_t)g * hd;
        for (int j = lane; j < hd; j += 32) vd[j] = vs[j];
    }
    float a[NP], b[NP], ss = 0.0f;
#pragma unroll
    for (int i = 0; i < NP; i++) {
        const int j = lane + 32 * i;
        a[i] = j < half ? src[j] : 0.0f;
        b[i] = j < half ? src[j + half] : 0.0f;
        ss += a[i] * a[i];
        ss += b[i] * b[i];
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const float inv = 1.0f / sqrtf(ss / (float)hd + p.eps);
#pragma unroll
    for (int i = 0; i < NP; i++) {
        const int j = lane + 32 * i;
        if (j >= half) continue;
        const float na = w[j] * (a[i] * inv), nb = w[j + half] * (b[i] * inv);
        if (rotate) {
            const float c = p.cos_t[pos * half + j], s = p.sin_t[pos * half + j];
            dst[j] = na * c - nb * s;
            dst[j + half] = nb * c + na * s;
        } else {
            dst[j] = na;
            dst[j + half] = nb;
        }
    }
}

/* The item, then (p.advance_ticket set) the append's advance by the last block
 * to finish: every block counts in once, after a __syncthreads that follows all
 * of its threads' read of *p.len, so no block can still be reading len when the
 * last one moves it; len and count are the same in every block, so the last
 * block decides exactly as a one-thread launch after this one would. */
template <int NP>
static __global__ void __launch_bounds__(PREP_WARPS * 32) qkv_prep_kernel(const ddt_dflash_qkv p) {
    DDT_GRID_DEP_WAIT();
    /* *p.len is read once, here: the last block rewrites it.  Thread 0 keeps its
       copy in shared memory for the advance (no register held across the item) */
    __shared__ int len0;
    const int len = *p.len;
    if (threadIdx.x == 0) len0 = len;
    qkv_prep_item<NP>(p, len);
    if (!p.advance_ticket) return;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence(); /* release: the block's read of len (and stores) before its count */
        const unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
        if (atomicAdd(p.advance_ticket, 1u) == blocks - 1) {
            __threadfence(); /* acquire: every block's count, hence its read, before the write */
            advance_one(p.advance_len, p.advance_status, len0, read_count(p.count_dev, p.count_host), p.max_count,
                        p.limit);
            *p.advance_ticket = 0u; /* every block has counted: back to 0 for the next launch */
        }
    }
}

extern "C" ddt_status ddt_dflash_qkv_prep(const ddt_dflash_qkv *p, ddt_cuda_stream stream, ddt_error *err) {
    if (!p || !p->k || !p->v || !p->len || !p->cos_t || !p->sin_t || (p->q && (!p->qo || !p->q_norm)) ||
        (!p->layers && (!p->k_norm || !p->k_cache || !p->v_cache)))
        return ddt_fail(err, DDT_ERR_INVALID, "dflash qkv_prep: NULL argument");
    if (p->layers < 0 || p->layers > DDT_DFLASH_MAX_KV_LAYERS || (p->layers && (p->q || p->layer_cols < 0)))
        return ddt_fail(err, DDT_ERR_INVALID,
                        "dflash qkv_prep: %d layers (0..%d, no queries with several) %lld columns apart", p->layers,
                        DDT_DFLASH_MAX_KV_LAYERS, (long long)p->layer_cols);
    for (int32_t i = 0; i < p->layers; i++)
        if (!p->k_norms[i] || !p->k_caches[i] || !p->v_caches[i])
            return ddt_fail(err, DDT_ERR_INVALID, "dflash qkv_prep: layer %d: NULL argument", i);
    if (p->advance_ticket && (!p->advance_status || p->advance_len != p->len))
        return ddt_fail(err, DDT_ERR_INVALID,
                        "dflash qkv_prep: a folded advance needs a status word and advance_len == len");
    const int32_t nq = p->q ? p->heads : 0;
    if (p->n < 1 || p->n > 65535 || p->kv_heads < 1 || (p->q && p->heads < 1) || p->hd < 2 || p->hd % 2 ||
        p->hd > DDT_DFLASH_MAX_HEAD_DIM || p->limit < 0 || p->max_count > p->n)
        return ddt_fail(err, DDT_ERR_INVALID, "dflash qkv_prep: %d rows of %d + %d heads x %d, max count %d", p->n,
                        nq, p->kv_heads, p->hd, p->max_count);
    const int64_t kvd = (int64_t)p->kv_heads * p->hd, qd = (int64_t)nq * p->hd;
    if (p->ldk < kvd || p->ldv < kvd || (p->q && (p->ldq < qd || p->ldqo < qd)))
        return ddt_fail(err, DDT_ERR_INVALID, "dflash qkv_prep: row strides %lld/%lld/%lld/%lld below %lld/%lld",
                        (long long)p->ldq, (long long)p->ldqo, (long long)p->ldk, (long long)p->ldv, (long long)qd,
                        (long long)kvd);
    cudaStream_t s = (cudaStream_t)stream;
    const dim3 grid((unsigned)((nq + p->kv_heads + PREP_WARPS - 1) / PREP_WARPS), (unsigned)p->n,
                    (unsigned)(p->layers ? p->layers : 1));
    /* the folded advance counts blocks in an unsigned ticket */
    if (p->advance_ticket && (uint64_t)grid.x * grid.y * grid.z > 0x7fffffffu)
        return ddt_fail(err, DDT_ERR_RANGE, "dflash qkv_prep: %u x %u x %u blocks, too many for a folded advance",
                        grid.x, grid.y, grid.z);
    const int np = (p->hd / 2 + 31) / 32;
    if (np <= 1)
        qkv_prep_kernel<1><<<grid, PREP_WARPS * 32, 0, s>>>(*p);
    else if (np <= 2)
        qkv_prep_kernel<2><<<grid, PREP_WARPS * 32, 0, s>>>(*p);
    else if (np <= 4)
        qkv_prep_kernel<4><<<grid, PREP_WARPS * 32, 0, s>>>(*p);
    else
        qkv_prep_kernel<8><<<grid, PREP_WARPS * 32, 0, s>>>(*p);
    DDT_CUDA_LAUNCHED("dflash_qkv_prep", s, err);
    return DDT_OK;
}

/* ------------------------------------------------------------------ attention */

static __device__ __forceinline__ int rows_to_read(const int32_t *len_p, int n_block, int max_rows) {
    long long n = (long long)*len_p + n_block;
    if (n > max_rows) n = max_rows;
    if (n < 0) n = 0;
    return (int)n;
}

/* xor butterflies: every lane ends with the same bits (max and + commute). */
static __device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

static __device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

static __device__ __forceinline__ float f4_at(const float4 v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

static_assert(ATTN_T == 32, "a tile row per lane; the merge keeps 32 split weights per query in Ps");

/* Everything the attention kernel reads besides the device length. */
struct attn_args {
    const float *q, *kc, *vc;
    const int32_t *len;
    float *o;
    float *part_ml;      /* [splits][n_block * heads][2]: a split's running max and sum */
    float *part_acc;     /* [splits][n_block * heads][hd]: its unnormalised output */
    unsigned *arrivals;  /* [kv_heads * qchunks]: splits finished in this launch, 0 between launches */
    int n_block, heads, kv_heads, hd, max_rows, split;
    int hd4;             /* hd rounded up to whole float4 (the pad is zero in Qs and Ks) */
    int ks;              /* Ks row stride: hd4 plus 4 when hd4 / 4 is even (see attn_kernel) */
    int vec;             /* K/V rows start 16-byte aligned: stage them as float4 */
    float scale;
};

/* Offset of query qi (0 <= qi < n_block * group) of kv head g in q and o: query
 * t = qi / group of head g * group + qi % group, rows of heads * hd floats. */
static __device__ __forceinline__ size_t query_offset(const attn_args &p, int g, int qi) {
    const int group = p.heads / p.kv_heads;
    return ((size_t)(qi / group) * p.heads + (size_t)g * group + qi % group) * p.hd;
}

/* Stage cache rows [rt, rt + nt) of kv head g into Ks / Vs, rows nt..ATTN_T-1 as
 * zeros (p = 0 multiplies them, and 0 * NaN would not vanish).  Every thread
 * issues U loads per matrix before its first store, so a tile costs about one
 * memory latency instead of one per row. */
template <int U>
static __device__ __forceinline__ void stage_tile(const attn_args &p, int g, int rt, int nt, float *Ks, float *Vs) {
    const size_t kvd = (size_t)p.kv_heads * p.hd;
    const float *kb = p.kc + (size_t)rt * kvd + (size_t)g * p.hd;
    const float *vb = p.vc + (size_t)rt * kvd + (size_t)g * p.hd;
    if (p.vec) {
        const int c4 = p.hd >> 2, n_e = ATTN_T * c4; /* hd4 == hd here */
        for (int e0 = threadIdx.x; e0 < n_e; e0 += U * ATTN_THREADS) {
            float4 kx[U], vx[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int e = e0 + u * ATTN_THREADS, r = e / c4, c = e - r * c4;
                kx[u] = vx[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (e < n_e && r < nt) {
                    kx[u] = reinterpret_cast<const float4 *>(kb + (size_t)r * kvd)[c];
                    vx[u] = reinterpret_cast<const float4 *>(vb + (size_t)r * kvd)[c];
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int e = e0 + u * ATTN_THREADS, r = e / c4, c = e - r * c4;
                if (e < n_e) {
                    reinterpret_cast<float4 *>(Ks + r * p.ks)[c] = kx[u];
                    reinterpret_cast<float4 *>(Vs + r * p.hd4)[c] = vx[u];
                }
            }
        }
    } else {
        const int n_e = ATTN_T * p.hd4;
        for (int e0 = threadIdx.x; e0 < n_e; e0 += 4 * U * ATTN_THREADS) {
            float kx[4 * U], vx[4 * U];
#pragma unroll
            for (int u = 0; u < 4 * U; u++) {
                const int e = e0 + u * ATTN_THREADS, r = e / p.hd4, j = e - r * p.hd4;
                kx[u] = vx[u] = 0.0f;
                if (e < n_e && r < nt && j < p.hd) {
                    kx[u] = kb[(size_t)r * kvd + j];
                    vx[u] = vb[(size_t)r * kvd + j];
                }
            }
#pragma unroll
            for (int u = 0; u < 4 * U; u++) {
                const int e = e0 + u * ATTN_THREADS, r = e / p.hd4, j = e - r * p.hd4;
                if (e < n_e) {
                    Ks[r * p.ks + j] = kx[u];
                    Vs[r * p.hd4 + j] = vx[u];
                }
            }
        }
    }
}

/* One staged tile of nt rows (Ks [ATTN_T][ks], Vs [ATTN_T][hd4]) for B queries
 * (Qw [B][hd4], zero past hd) by the calling warp: scores with lane = row (the
 * dot over float4 columns of the lane's K row, the row stride an odd number of
 * float4 so the 8 lanes of a 16-byte phase hit distinct banks), the tile's max and
 * sum by butterflies merged into the running (m, l) -- the online rule a tile at
 * a time -- p written to the warp's Pw [B][ATTN_T], then P V with lanes over head
 * dims (j = lane + 32 i), p broadcast four rows at a time.  attn_kernel (B = 2
 * queries a warp) and attn_rows_kernel (B = 8) share it: one arithmetic. */
template <int B, int NI>
static __device__ __forceinline__ void attn_tile(const float *Ks, int ks, const float *Vs, int hd4, int hd,
                                                 const float *Qw, float *Pw, int nt, float scale, float (&m)[B],
                                                 float (&l)[B], float (&acc)[B][NI]) {
    const int lane = threadIdx.x & 31, c4 = hd4 >> 2;
    float s[B];
#pragma unroll
    for (int b = 0; b < B; b++) s[b] = 0.0f;
    const float4 *k4 = reinterpret_cast<const float4 *>(Ks + lane * ks);
    const float4 *q4 = reinterpret_cast<const float4 *>(Qw);
    for (int c = 0; c < c4; c++) {
        const float4 kv = k4[c];
#pragma unroll
        for (int b = 0; b < B; b++) {
            const float4 qv = q4[b * c4 + c];
            s[b] = fmaf(qv.x, kv.x, s[b]);
            s[b] = fmaf(qv.y, kv.y, s[b]);
            s[b] = fmaf(qv.z, kv.z, s[b]);
            s[b] = fmaf(qv.w, kv.w, s[b]);
        }
    }
#pragma unroll
    for (int b = 0; b < B; b++) {
        const float sc = lane < nt ? s[b] * scale : -INFINITY;
        const float mn = fmaxf(m[b], warp_max(sc)); /* finite: lane 0 holds a row */
        const float c = expf(m[b] - mn);            /* 0 on the first tile (m = -inf) */
        const float pr = expf(sc - mn);             /* 0 past the tile's rows */
        l[b] = l[b] * c + warp_sum(pr);
#pragma unroll
        for (int i = 0; i < NI; i++) acc[b][i] *= c;
        m[b] = mn;
        Pw[b * ATTN_T + lane] = pr;
    }
    __syncwarp();
    /* rows past nt up to the next multiple of 4 have p = 0 and zero V */
    for (int r = 0; r < nt; r += 4) {
        float4 pw[B];
#pragma unroll
        for (int b = 0; b < B; b++) pw[b] = *reinterpret_cast<const float4 *>(Pw + b * ATTN_T + r);
#pragma unroll
        for (int rr = 0; rr < 4; rr++) {
            const float *vr = Vs + (r + rr) * hd4;
#pragma unroll
            for (int i = 0; i < NI; i++) {
                const int j = lane + 32 * i;
                if (j >= hd) continue;
                const float v = vr[j];
#pragma unroll
                for (int b = 0; b < B; b++) acc[b][i] = fmaf(f4_at(pw[b], rr), v, acc[b][i]);
            }
        }
    }
}

/* The splits' merge, by NT threads of a block that has written its split's
 * partials (m, l, acc of each of its n_qb queries) to the scratch: the last split
 * of the column to arrive merges all n_used of them in increasing split order and
 * writes the output (the ticket back at 0).  Ps: shared [ATTN_QPB][32]. */
template <int NI, int NT>
static __device__ __forceinline__ void merge_if_last(const attn_args &p, int col, int g, int q0, int n_qb,
                                                     int n_used, float *Ps, int &is_last, float *mrg_max,
                                                     float *mrg_inv) {
    constexpr int U = (ATTN_QPB * 32 * NI + NT - 1) / NT; /* outputs a thread merges: ATTN_QPB * hd at most */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, hd = p.hd;
    const size_t n_all = (size_t)p.n_block * p.heads;
    /* release: each thread's partials reach device scope before the block's ticket */
    __threadfence();
    __syncthreads();
    if (tid == 0) is_last = atomicAdd(p.arrivals + col, 1u) == (unsigned)(n_used - 1);
    __syncthreads();
    if (!is_last) return;
    /* acquire: the other splits' partials, read below past L1 (__ldcg) */
    __threadfence();
    if (tid == 0) atomicExch(p.arrivals + col, 0u); /* every live split has arrived */

    /* merge: per query the max M over splits and 1 / sum_s l_s exp(m_s - M) ... */
    for (int lq = warp; lq < n_qb; lq += NT / 32) {
        const float *ml = p.part_ml + query_offset(p, g, q0 + lq) / hd * 2;
        float mx = -INFINITY;
        for (int s = lane; s < n_used; s += 32) mx = fmaxf(mx, __ldcg(ml + (size_t)s * n_all * 2));
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int s = lane; s < n_used; s += 32)
            sum += __ldcg(ml + (size_t)s * n_all * 2 + 1) * expf(__ldcg(ml + (size_t)s * n_all * 2) - mx);
        sum = warp_sum(sum);
        if (lane == 0) {
            mrg_max[lq] = mx;
            mrg_inv[lq] = 1.0f / sum;
        }
    }
    /* ... then sum_s exp(m_s - M) acc_s in increasing s, 32 splits at a time: their
     * weights in Ps ([ATTN_QPB][32]), the block's n_qb * hd outputs spread over
     * the threads (e = tid + u * NT), so each thread has many loads in flight */
    float out[U];
    int off[U]; /* within one split's [n_block * heads][hd] (< 2^31, checked) */
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int e = tid + u * NT, lq = e / hd;
        out[u] = 0.0f;
        off[u] = lq < n_qb ? (int)query_offset(p, g, q0 + lq) + (e - lq * hd) : 0;
    }
    const size_t acc_stride = n_all * hd;
    for (int s0 = 0; s0 < n_used; s0 += 32) {
        const int cnt = n_used - s0 < 32 ? n_used - s0 : 32;
        __syncthreads(); /* mrg_max is written; the previous chunk's weights are read */
        for (int e = tid; e < ATTN_QPB * 32; e += NT) {
            const int lq = e >> 5, k = e & 31;
            float w = 0.0f;
            if (lq < n_qb && k < cnt) {
                const size_t slot = (size_t)(s0 + k) * n_all + query_offset(p, g, q0 + lq) / hd;
                w = expf(__ldcg(p.part_ml + slot * 2) - mrg_max[lq]);
            }
            Ps[e] = w;
        }
        __syncthreads();
        const float *pa = p.part_acc + (size_t)s0 * acc_stride;
#pragma unroll 4
        for (int k = 0; k < cnt; k++) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int e = tid + u * NT, lq = e / hd;
                if (lq < n_qb) out[u] = fmaf(Ps[lq * 32 + k], __ldcg(pa + (size_t)k * acc_stride + off[u]), out[u]);
            }
        }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int e = tid + u * NT, lq = e / hd;
        if (lq < n_qb) p.o[off[u]] = out[u] * mrg_inv[lq];
    }
}

/*
 * Block (col, split) = (kv head g and ATTN_QPB of its queries, rows
 * [split * p.split, + p.split) of the live rows).  NI = ceil(hd / 32) rounded to
 * a power of two: registers per lane for a query's output (j = lane + 32 i).
 *
 * Per tile of ATTN_T rows: the block stages K and V (and, once, its queries) in
 * shared memory; warp w owns queries w * ATTN_QB + b.  Scores: lane = row, the
 * dot over float4 columns of the lane's K row (row stride an odd number of
 * float4, so the 8 lanes of a 16-byte phase hit distinct banks) against the
 * queries' float4, broadcast.  Softmax: the tile's max and sum by butterflies
 * merged into the warp's running (m, l) -- the online rule taken a tile at a
 * time -- and p written to Ps.  Output: lanes over head dims, p broadcast from
 * Ps four rows at a time.
 *
 * A context that fits one split finishes in its block.  Otherwise every split
 * writes (m, l, acc) to the scratch; the last split of a column to arrive (an
 * atomic ticket after a fence) merges all splits in increasing split order --
 * the same order whichever block arrives last, so the result is deterministic --
 * and puts the ticket back to 0 for the next launch (graph replays included).
 */
template <int NI>
static __global__ void __launch_bounds__(ATTN_THREADS) attn_kernel(const attn_args p) {
    DDT_GRID_DEP_WAIT();
    extern __shared__ float4 attn_smem4[];
    __shared__ int is_last;
    __shared__ float mrg_max[ATTN_QPB], mrg_inv[ATTN_QPB];
    float *const Ks = reinterpret_cast<float *>(attn_smem4); /* [ATTN_T][ks] */
    float *const Vs = Ks + ATTN_T * p.ks;                     /* [ATTN_T][hd4] */
    float *const Qs = Vs + ATTN_T * p.hd4;                    /* [ATTN_QPB][hd4] */
    float *const Ps = Qs + ATTN_QPB * p.hd4;                  /* [ATTN_QPB][ATTN_T] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hd = p.hd, hd4 = p.hd4, n_q = p.n_block * (p.heads / p.kv_heads);
    const int qchunks = (n_q + ATTN_QPB - 1) / ATTN_QPB;
    const int col = blockIdx.x, g = col / qchunks, q0 = (col % qchunks) * ATTN_QPB;
    const int n_qb = n_q - q0 < ATTN_QPB ? n_q - q0 : ATTN_QPB; /* this block's queries */
    const size_t n_all = (size_t)p.n_block * p.heads;
    const int n_rows = rows_to_read(p.len, p.n_block, p.max_rows);
    const int r0 = blockIdx.y * p.split;
    if (n_rows == 0) { /* no rows: 0 / 0, as the CPU twin's empty softmax */
        if (blockIdx.y == 0)
            for (int e = tid; e < n_qb * hd; e += ATTN_THREADS)
                p.o[query_offset(p, g, q0 + e / hd) + e % hd] = NAN;
        return;
    }
    if (r0 >= n_rows) return;
    const int r1 = r0 + p.split < n_rows ? r0 + p.split : n_rows;

    /* the queries' loads go out first; they land while the first tile loads */
    float qreg[2 * NI]; /* ATTN_QPB * hd4 <= ATTN_THREADS * 2 * NI */
#pragma unroll
    for (int u = 0; u < 2 * NI; u++) {
        const int e = tid + u * ATTN_THREADS, lq = e / hd4, j = e - lq * hd4;
        qreg[u] = lq < n_qb && j < hd ? p.q[query_offset(p, g, q0 + lq) + j] : 0.0f;
    }

    const bool live = warp * ATTN_QB < n_qb; /* the warp owns at least one query */
    float m[ATTN_QB], l[ATTN_QB], acc[ATTN_QB][NI];
#pragma unroll
    for (int b = 0; b < ATTN_QB; b++) {
        m[b] = -INFINITY;
        l[b] = 0.0f;
#pragma unroll
        for (int i = 0; i < NI; i++) acc[b][i] = 0.0f;
    }
    for (int rt = r0; rt < r1; rt += ATTN_T) {
        const int nt = r1 - rt < ATTN_T ? r1 - rt : ATTN_T;
        __syncthreads(); /* the previous tile's Ks / Vs / Ps reads are done */
        stage_tile<4>(p, g, rt, nt, Ks, Vs);
        if (rt == r0) {
#pragma unroll
            for (int u = 0; u < 2 * NI; u++) {
                const int e = tid + u * ATTN_THREADS;
                if (e < ATTN_QPB * hd4) Qs[e] = qreg[u];
            }
        }
        __syncthreads();
        if (!live) continue;
        attn_tile<ATTN_QB, NI>(Ks, p.ks, Vs, hd4, hd, Qs + warp * ATTN_QB * hd4, Ps + warp * ATTN_QB * ATTN_T, nt,
                               p.scale, m, l, acc);
    }

    const int n_used = (n_rows + p.split - 1) / p.split;
    if (n_used == 1) { /* this block saw every row */
        if (live)
#pragma unroll
            for (int b = 0; b < ATTN_QB; b++) {
                const int lq = warp * ATTN_QB + b;
                if (lq >= n_qb) continue;
                const float inv = 1.0f / l[b];
                float *orow = p.o + query_offset(p, g, q0 + lq);
#pragma unroll
                for (int i = 0; i < NI; i++) {
                    const int j = lane + 32 * i;
                    if (j < hd) orow[j] = acc[b][i] * inv;
                }
            }
        return;
    }

    if (live)
#pragma unroll
        for (int b = 0; b < ATTN_QB; b++) {
            const int lq = warp * ATTN_QB + b;
            if (lq >= n_qb) continue;
            const size_t slot = (size_t)blockIdx.y * n_all + query_offset(p, g, q0 + lq) / hd;
            if (lane == 0) {
                p.part_ml[slot * 2] = m[b];
                p.part_ml[slot * 2 + 1] = l[b];
            }
#pragma unroll
            for (int i = 0; i < NI; i++) {
                const int j = lane + 32 * i;
                if (j < hd) p.part_acc[slot * hd + j] = acc[b][i];
            }
        }
    merge_if_last<NI, ATTN_THREADS>(p, col, g, q0, n_qb, n_used, Ps, is_last, mrg_max, mrg_inv);
}

/*
 * The attention with a split's tiles spread over the block's warps (head_dim <=
 * 128: ATTNR_MAX_NI registers a lane): block (col, split) as attn_kernel's, NW
 * warps, warp w taking the split's 32-row tiles w, w + NW, ... in increasing
 * order, each for every one of the block's ATTN_QPB queries (attn_kernel keeps
 * every tile in all of its warps, 2 queries a warp, so a split of T tiles is T
 * dependent steps; here it is ceil(T / NW)).  A warp stages its tile's K and V in
 * its own shared region with every load in flight, scores a row per lane against
 * the queries in shared memory, and keeps its online softmax per query; then the
 * warps' (m, l, acc) are merged in the block in increasing warp order, and the
 * split's result goes out as attn_kernel's does (the output, or a partial and the
 * splits' merge).  The drafter takes splits of 32 NW rows
 * (ddt_dflash_attn_split_hint), so a context of up to 32 NW rows is one block a
 * column and needs no merge through the scratch.  Every sum has a fixed order
 * given the split and the length: the result depends on neither the launch nor
 * which block comes last.
 */
#define ATTNR_MAX_NI 4 /* the launcher's switch: NI 1, 2, 4 here, 8, 16 on attn_kernel */

static __host__ __device__ constexpr int attnr_warps(int ni) { return ni <= 2 ? 8 : 4; }

/* Floats of one warp's region: K [ATTN_T][ks], V [ATTN_T][hd4], P [ATTN_QPB][ATTN_T]. */
static __host__ __device__ constexpr int attnr_warp_floats(int hd4, int ks) {
    return ATTN_T * ks + ATTN_T * hd4 + ATTN_QPB * ATTN_T;
}

/* One warp's tile of rows rt.. (nt of them) of kv head g into Ks / Vs by cp.async,
 * 16 bytes a copy with every copy in flight and no registers held: rows past nt
 * are zero-filled (source size 0).  The float4 path only (hd % 4 == 0, aligned
 * caches: hd4 == hd); the caller waits (cp.async.wait_all) and syncs the warp. */
static __device__ __forceinline__ void attnr_tile_async(const attn_args &p, int g, int rt, int nt, float *Ks,
                                                        float *Vs) {
    const int lane = threadIdx.x & 31, c4 = p.hd >> 2;
    const size_t kvd = (size_t)p.kv_heads * p.hd;
    const float *kb = p.kc + (size_t)rt * kvd + (size_t)g * p.hd, *vb = p.vc + (size_t)rt * kvd + (size_t)g * p.hd;
    for (int e = lane; e < ATTN_T * c4; e += 32) {
        const int r = e / c4, c = e - r * c4;
        const unsigned bytes = r < nt ? 16u : 0u;
        const size_t src = r < nt ? (size_t)r * kvd + 4 * (size_t)c : 0; /* a valid address either way */
        const unsigned kd = (unsigned)__cvta_generic_to_shared(Ks + r * p.ks + 4 * c);
        const unsigned vd = (unsigned)__cvta_generic_to_shared(Vs + r * p.hd4 + 4 * c);
        cp_async_ca16_fill(kd, kb + src, (int)bytes);
        cp_async_ca16_fill(vd, vb + src, (int)bytes);
    }
}

template <int NI>
static __global__ void __launch_bounds__(attnr_warps(NI) * 32) attn_rows_kernel(const attn_args p) {
    DDT_GRID_DEP_WAIT();
    constexpr int NW = attnr_warps(NI), NT = NW * 32, Q = ATTN_QPB;
    extern __shared__ float4 attn_smem4[];
    __shared__ int is_last;
    __shared__ float mrg_max[Q], mrg_inv[Q], Pm[Q * 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hd = p.hd, hd4 = p.hd4, ks = p.ks;
    float *const Qs = reinterpret_cast<float *>(attn_smem4); /* [Q][hd4] */
    float *const Ks = Qs + Q * hd4 + warp * attnr_warp_floats(hd4, ks);
    float *const Vs = Ks + ATTN_T * ks, *const Ps = Vs + ATTN_T * hd4;
    const int n_q = p.n_block * (p.heads / p.kv_heads), qchunks = (n_q + Q - 1) / Q;
    const int col = blockIdx.x, g = col / qchunks, q0 = (col % qchunks) * Q;
    const int n_qb = n_q - q0 < Q ? n_q - q0 : Q;
    const int n_rows = rows_to_read(p.len, p.n_block, p.max_rows);
    const int r0 = blockIdx.y * p.split;
    if (n_rows == 0) { /* no rows: 0 / 0, as the CPU twin's empty softmax */
        if (blockIdx.y == 0)
            for (int e = tid; e < n_qb * hd; e += NT) p.o[query_offset(p, g, q0 + e / hd) + e % hd] = NAN;
        return;
    }
    if (r0 >= n_rows) return;
    const int r1 = r0 + p.split < n_rows ? r0 + p.split : n_rows;
    const int ntiles = (r1 - r0 + ATTN_T - 1) / ATTN_T;
    /* the float4 path: the warp's first tile in flight before the queries' loads */
    if (p.vec && warp < ntiles) {
        const int rt = r0 + warp * ATTN_T;
        attnr_tile_async(p, g, rt, r1 - rt < ATTN_T ? r1 - rt : ATTN_T, Ks, Vs);
    }
    for (int e = tid; e < Q * hd4; e += NT) { /* the queries, zero past n_qb and hd */
        const int lq = e / hd4, j = e - lq * hd4;
        Qs[e] = lq < n_qb && j < hd ? p.q[query_offset(p, g, q0 + lq) + j] : 0.0f;
    }
    const size_t kvd = (size_t)p.kv_heads * hd;
    float m[Q], l[Q], acc[Q][NI];
#pragma unroll
    for (int b = 0; b < Q; b++) {
        m[b] = -INFINITY;
        l[b] = 0.0f;
#pragma unroll
        for (int i = 0; i < NI; i++) acc[b][i] = 0.0f;
    }
    __syncthreads(); /* Qs */
    for (int ti = warp; ti < ntiles; ti += NW) {
        const int rt = r0 + ti * ATTN_T, nt = r1 - rt < ATTN_T ? r1 - rt : ATTN_T;
        __syncwarp(); /* the previous tile's reads of Ks / Vs / Ps are done */
        /* stage rows rt.. of kv head g: zeros past nt (p = 0 multiplies them, and
           0 * NaN would not vanish) and past hd */
        const float *kb = p.kc + (size_t)rt * kvd + (size_t)g * hd, *vb = p.vc + (size_t)rt * kvd + (size_t)g * hd;
        if (p.vec) { /* hd4 == hd; the warp's first tile was issued before the queries */
            if (ti != warp) attnr_tile_async(p, g, rt, nt, Ks, Vs);
            cp_async_wait_all();
        } else {
            for (int e0 = lane; e0 < ATTN_T * hd4; e0 += 16 * 32) {
                float kx[16], vx[16];
#pragma unroll
                for (int u = 0; u < 16; u++) {
                    const int e = e0 + u * 32, r = e / hd4, j = e - r * hd4;
                    kx[u] = vx[u] = 0.0f;
                    if (e < ATTN_T * hd4 && r < nt && j < hd) {
                        kx[u] = kb[(size_t)r * kvd + j];
                        vx[u] = vb[(size_t)r * kvd + j];
                    }
                }
#pragma unroll
                for (int u = 0; u < 16; u++) {
                    const int e = e0 + u * 32, r = e / hd4, j = e - r * hd4;
                    if (e < ATTN_T * hd4) {
                        Ks[r * ks + j] = kx[u];
                        Vs[r * hd4 + j] = vx[u];
                    }
                }
            }
        }
        __syncwarp();
        /* queries past n_qb are zeros: unused */
        attn_tile<Q, NI>(Ks, ks, Vs, hd4, hd, Qs, Ps, nt, p.scale, m, l, acc);
    }

    /* the warps' states through shared memory (each in its own region: m, l, then
       acc [Q][hd4]); a warp without tiles holds m = -inf, l = 0, acc = 0 */
    __syncwarp();
    if (lane < Q) {
        float mv = m[0], lv = l[0];
#pragma unroll
        for (int b = 1; b < Q; b++)
            if (lane == b) mv = m[b], lv = l[b];
        Ks[lane] = mv;
        Ks[Q + lane] = lv;
    }
#pragma unroll
    for (int b = 0; b < Q; b++)
#pragma unroll
        for (int i = 0; i < NI; i++) {
            const int j = lane + 32 * i;
            if (j < hd) Ks[2 * Q + b * hd4 + j] = acc[b][i];
        }
    __syncthreads();
    /* per query: M = max over warps, L = sum_w l_w exp(m_w - M) in increasing w;
       every thread computes its queries' weights itself, in the same order */
    const float *W0 = Qs + Q * hd4;
    const int wf = attnr_warp_floats(hd4, ks);
    const int n_used = (n_rows + p.split - 1) / p.split;
    const size_t n_all = (size_t)p.n_block * p.heads;
    for (int e = tid; e < n_qb * hd; e += NT) {
        const int lq = e / hd, j = e - lq * hd;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < NW; w++) mx = fmaxf(mx, W0[w * wf + lq]);
        float sum = 0.0f, a = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            const float f = expf(W0[w * wf + lq] - mx);
            sum = sum + W0[w * wf + Q + lq] * f;
            a = fmaf(W0[w * wf + 2 * Q + lq * hd4 + j], f, a);
        }
        const size_t qo = query_offset(p, g, q0 + lq);
        if (n_used == 1) {
            p.o[qo + j] = a * (1.0f / sum);
        } else {
            const size_t slot = (size_t)blockIdx.y * n_all + qo / hd;
            if (j == 0) {
                p.part_ml[slot * 2] = mx;
                p.part_ml[slot * 2 + 1] = sum;
            }
            p.part_acc[slot * hd + j] = a;
        }
    }
    if (n_used == 1) return;
    merge_if_last<NI, NT>(p, col, g, q0, n_qb, n_used, Pm, is_last, mrg_max, mrg_inv);
}

/* Launch shape, shared by the launcher, the scratch size and the preparation. */
struct attn_geom {
    int cols;     /* kv_heads * query chunks: grid.x, one arrival ticket each */
    int splits;   /* grid.y */
    int ctr;      /* scratch floats holding the tickets (whole float4) */
    int hd4, ks;  /* see attn_args */
    int ni;       /* attn_kernel<NI> / attn_rows_kernel<NI> */
    bool rows;    /* attn_rows_kernel (NI <= ATTNR_MAX_NI) */
    size_t smem;  /* dynamic shared bytes */
};

static size_t attn_smem_bytes(int hd4, int ks) {
    return sizeof(float) * ((size_t)ATTN_T * ks + (size_t)ATTN_T * hd4 + (size_t)ATTN_QPB * hd4 +
                            (size_t)ATTN_QPB * ATTN_T);
}

static int attn_ks(int hd4) { return (hd4 / 4) % 2 ? hd4 : hd4 + 4; }

/* Registers a lane holds for a query's output, ceil(hd / 32) rounded up to the
 * kernels' instances (1, 2, 4: attn_rows_kernel; 8, 16: attn_kernel). */
static int attn_ni(int hd) {
    const int ni = (hd + 31) / 32;
    return ni <= 1 ? 1 : ni <= 2 ? 2 : ni <= 4 ? 4 : ni <= 8 ? 8 : 16;
}

static size_t attnr_smem_bytes(int ni, int hd4, int ks) {
    return sizeof(float) * ((size_t)ATTN_QPB * hd4 + (size_t)attnr_warps(ni) * attnr_warp_floats(hd4, ks));
}

static bool attn_geometry(const ddt_dflash_attn *a, attn_geom *gm) {
    if (a->n_block < 1 || a->heads < 1 || a->kv_heads < 1 || a->heads % a->kv_heads || a->hd < 1 ||
        a->hd > DDT_DFLASH_MAX_HEAD_DIM || a->split < 1 || a->max_rows < a->n_block || !(a->scale > 0.0f))
        return false;
    const int64_t n_q = (int64_t)a->n_block * (a->heads / a->kv_heads);
    const int64_t cols = (int64_t)a->kv_heads * ((n_q + ATTN_QPB - 1) / ATTN_QPB);
    const int64_t splits = ((int64_t)a->max_rows + a->split - 1) / a->split;
    if (cols > INT32_MAX - 3 || splits > ATTN_MAX_SPLITS || (int64_t)a->n_block * a->heads * a->hd > INT32_MAX)
        return false;
    gm->cols = (int)cols;
    gm->splits = (int)splits;
    gm->ctr = (int)((cols + 3) / 4 * 4);
    gm->hd4 = (a->hd + 3) / 4 * 4;
    gm->ks = attn_ks(gm->hd4);
    gm->ni = attn_ni(a->hd);
    gm->rows = gm->ni <= ATTNR_MAX_NI;
    gm->smem = gm->rows ? attnr_smem_bytes(gm->ni, gm->hd4, gm->ks) : attn_smem_bytes(gm->hd4, gm->ks);
    return true;
}

static ddt_status attn_bad_shape(const ddt_dflash_attn *a, const char *who, ddt_error *err) {
    return ddt_fail(err, DDT_ERR_INVALID,
                    "dflash %s: block %d, heads %d/%d, head_dim %d (1..%d), rows %d, split %d (at most %d splits), "
                    "scale %g",
                    who, a->n_block, a->heads, a->kv_heads, a->hd, DDT_DFLASH_MAX_HEAD_DIM, a->max_rows, a->split,
                    ATTN_MAX_SPLITS, (double)a->scale);
}

extern "C" uint64_t ddt_dflash_attn_scratch_floats(const ddt_dflash_attn *a) {
    attn_geom gm;
    if (!a || !attn_geometry(a, &gm)) return 0;
    return (uint64_t)gm.ctr + (uint64_t)gm.splits * (uint64_t)a->n_block * (uint64_t)a->heads * (uint64_t)(a->hd + 2);
}

/* Shared memory above the default 48 KB must be granted per kernel (and device);
 * granting each instance the bytes of its widest head_dim keeps the grant the
 * same whatever head_dim asked first. */
template <int NI> static cudaError_t attn_grant_smem() {
    const int hd4 = 32 * NI;
    if constexpr (NI <= ATTNR_MAX_NI) {
        const size_t bytes = attnr_smem_bytes(NI, hd4, attn_ks(hd4));
        if (bytes <= 48 * 1024) return cudaSuccess;
        return cudaFuncSetAttribute(attn_rows_kernel<NI>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    } else {
        const size_t bytes = attn_smem_bytes(hd4, attn_ks(hd4));
        if (bytes <= 48 * 1024) return cudaSuccess;
        return cudaFuncSetAttribute(attn_kernel<NI>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    }
}

extern "C" int32_t ddt_dflash_attn_split_hint(int32_t hd) {
    const int ni = attn_ni(hd);
    return ni <= ATTNR_MAX_NI ? ATTN_T * attnr_warps(ni) : ATTN_T;
}

extern "C" ddt_status ddt_dflash_attn_prepare(const ddt_dflash_attn *a, float *scratch, ddt_cuda_stream stream,
                                              ddt_error *err) {
    if (!a || !scratch) return ddt_fail(err, DDT_ERR_INVALID, "dflash attention prepare: NULL argument");
    attn_geom gm;
    if (!attn_geometry(a, &gm)) return attn_bad_shape(a, "attention prepare", err);
    int dev, optin;
    DDT_CUDA_TRY(cudaGetDevice(&dev), err);
    DDT_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), err);
    if (gm.smem > (size_t)optin)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "dflash attention: head_dim %d needs %zu bytes of shared memory (%d here)",
                        a->hd, gm.smem, optin);
    switch (gm.ni) {
    case 1: DDT_CUDA_TRY(attn_grant_smem<1>(), err); break;
    case 2: DDT_CUDA_TRY(attn_grant_smem<2>(), err); break;
    case 4: DDT_CUDA_TRY(attn_grant_smem<4>(), err); break;
    case 8: DDT_CUDA_TRY(attn_grant_smem<8>(), err); break;
    default: DDT_CUDA_TRY(attn_grant_smem<16>(), err); break;
    }
    DDT_CUDA_TRY(cudaMemsetAsync(scratch, 0, (size_t)gm.ctr * sizeof(float), (cudaStream_t)stream), err);
    return DDT_OK;
}

extern "C" ddt_status ddt_dflash_attention(const ddt_dflash_attn *a, const float *q, const float *k_cache,
                                           const float *v_cache, const int32_t *len, float *scratch, float *o,
                                           ddt_cuda_stream stream, ddt_error *err) {
    if (!a || !q || !k_cache || !v_cache || !len || !scratch || !o)
        return ddt_fail(err, DDT_ERR_INVALID, "dflash attention: NULL argument");
    attn_geom gm;
    if (!attn_geometry(a, &gm)) return attn_bad_shape(a, "attention", err);
    attn_args p;
    p.q = q;
    p.kc = k_cache;
    p.vc = v_cache;
    p.len = len;
    p.o = o;
    p.arrivals = reinterpret_cast<unsigned *>(scratch);
    p.part_ml = scratch + gm.ctr;
    p.part_acc = p.part_ml + (size_t)gm.splits * a->n_block * a->heads * 2;
    p.n_block = a->n_block;
    p.heads = a->heads;
    p.kv_heads = a->kv_heads;
    p.hd = a->hd;
    p.max_rows = a->max_rows;
    p.split = a->split;
    p.hd4 = gm.hd4;
    p.ks = gm.ks;
    p.vec = a->hd % 4 == 0 && (uintptr_t)k_cache % 16 == 0 && (uintptr_t)v_cache % 16 == 0;
    p.scale = a->scale;
    cudaStream_t s = (cudaStream_t)stream;
    const dim3 grid((unsigned)gm.cols, (unsigned)gm.splits);
    switch (gm.ni) {
    case 1: attn_rows_kernel<1><<<grid, attnr_warps(1) * 32, gm.smem, s>>>(p); break;
    case 2: attn_rows_kernel<2><<<grid, attnr_warps(2) * 32, gm.smem, s>>>(p); break;
    case 4: attn_rows_kernel<4><<<grid, attnr_warps(4) * 32, gm.smem, s>>>(p); break;
    case 8: attn_kernel<8><<<grid, ATTN_THREADS, gm.smem, s>>>(p); break;
    default: attn_kernel<16><<<grid, ATTN_THREADS, gm.smem, s>>>(p); break;
    }
    DDT_CUDA_LAUNCHED("dflash_attention", s, err);
    return DDT_OK;
}
