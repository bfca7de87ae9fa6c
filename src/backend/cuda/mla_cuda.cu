/*
 * mla_cuda.cu — RoPE + cache write and the exact absorbed MLA attention (see
 * mla_cuda.h).
 *
 * Attention: a (token, head)'s logical positions [0, P), P = len + depth + 1,
 * are cut into fixed slices of ATTN_SPLIT positions (slice s: [s ATTN_SPLIT,
 * (s + 1) ATTN_SPLIT)).  The grid is (n heads, G) with G from n and the
 * capacity only, never from len, which lives on the device (graph replay):
 * block y of a (token, head) takes slices y, y + G, ... below P and exits at
 * once when there is none.  For each slice a block lists the ancestors the
 * slice needs by depth (from the visibility row), so that logical position p
 * maps to cache row p (p < len) or len + anc[p - len], and computes the
 * slice's max m_s, sum l_s = sum exp(x - m_s) and acc_s[d] = sum exp(x - m_s)
 * c[d].  A context of one slice ends there (out = acc / l); else the blocks
 * write their slices' partials to the workspace and the last to finish (an
 * arrival counter per (token, head), back at 0 after every launch) merges
 * them.
 *
 * The arithmetic of every output element is fixed by the logical positions
 * alone, never by n, by which rows hold the ancestors, by the capacity or by
 * which block finishes last (the tree == ar invariant: a node of a tree gets
 * the bits of the same token in a prefill of its path):
 *   score p     lane l sums q[d] * kv[d] over d = l, l + 32, ... (d < rank +
 *               rope) in order, then a fixed xor-shuffle tree, times scale;
 *   slice max   fmaxf over the slice's scores (its value, NaNs dropped, does
 *               not depend on the order; only the sign of a zero could, and
 *               exp(x - m) is the same for m = +0 and m = -0);
 *   slice sum   lane l of one warp sums exp(x_j - m_s) over the slice's local
 *               positions j = l, l + 32, ... in order, then the xor tree;
 *   slice acc d sums exp(x_j - m_s) c_j[d] over j = 0, 1, ... in order;
 *   merge       M = fmaxf over the m_s, w_s = exp(m_s - M), L = sum_s l_s w_s
 *               and out[d] = (sum_s acc_s[d] w_s) * (1 / L), both sums over
 *               s = 0, 1, ... in order; one slice: out[d] = acc[d] * (1 / l).
 * A NaN in a visible row makes its slice's sum NaN, so the whole output of
 * that (token, head) is NaN, as in the single-block kernel this replaced.
 *
 * Within a block the slice's rows are streamed through shared memory in
 * chunks: all threads load the next chunk into registers (many independent
 * loads in flight) while the current one is computed, and each warp computes
 * SC_U scores at once (independent shuffle trees).  When the slice fits in one
 * chunk (the small targets) the output reads the staged rows again instead of
 * fetching their rank columns a second time.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/mla_cuda.h"
#include "backend/cuda/mla_rope_dev.cuh"
#include "backend/cuda/norm_dev.cuh"

#define ATTN_THREADS 256
#define ATTN_WARPS (ATTN_THREADS / 32)
#define ATTN_SPLIT 64       /* positions per slice: part of the arithmetic contract, unlike ATTN_THREADS */
#define MAX_SLICES 65535    /* grid.y */
#define STAGE_MAX 8192      /* floats of the chunk stage (32 KB) */
#define STAGE_PER (STAGE_MAX / ATTN_THREADS) /* stage elements a thread fetches */
#define SC_U 4              /* scores a warp computes at once */
#define RED_FLOATS 32       /* >= ATTN_WARPS + 1: the warps' maxima and the slice sum */
#define MERGE_CHUNK ATTN_THREADS /* slices whose merge weights are staged at once (a thread each) */
#define ATTN_GRID_TARGET 512 /* blocks a launch aims at: two waves of two blocks on each of 132 SMs */
/* 512: K2.6's 64 heads x 32 rope pairs are 4 pairs a thread, and the cache row's
   512 latents one; at 128 threads the launch waited ~20 dependent loads (6.8 us
   for one token on the H200) */
#define ROPE_THREADS 512

static __global__ void __launch_bounds__(ROPE_THREADS)
rope_write_kernel(ddt_cuda_mla_rope_args a) {
    DDT_GRID_DEP_WAIT();
    const int i = blockIdx.x, half = a.rope / 2;
    int pos, row;
    bool bad;
    if (!mla_rope_where(a.len, a.depth, i, a.max_pos, a.capacity, &pos, &row, &bad))
        return; /* nowhere to write; the caller checked capacity */
    const float *cs = a.cos_t + (int64_t)(bad ? 0 : pos) * half;
    const float *sn = a.sin_t + (int64_t)(bad ? 0 : pos) * half;
    mla_rope_k_row(a, i, threadIdx.x, ROPE_THREADS);
    /* queries: rotate every (head, pair) into shared memory, then write back;
       interleaved pairs are read from where other pairs are written */
    extern __shared__ float stage[]; /* [heads][rope] */
#pragma unroll 4
    for (int it = threadIdx.x; it < a.heads * half; it += ROPE_THREADS) {
        const int h = it / half, p = it % half;
        const float *qr = a.q + ((int64_t)i * a.heads + h) * a.qdim + a.nope;
        float x0, x1;
        if (a.interleave) { x0 = qr[2 * p]; x1 = qr[2 * p + 1]; }
        else { x0 = qr[p]; x1 = qr[p + half]; }
        float r0, r1;
        mla_rope_rotate(x0, x1, cs[p], sn[p], r0, r1);
        stage[h * a.rope + p] = bad ? NAN : r0;
        stage[h * a.rope + p + half] = bad ? NAN : r1;
    }
    __syncthreads();
    for (int it = threadIdx.x; it < a.heads * a.rope; it += ROPE_THREADS) {
        const int h = it / a.rope, d = it % a.rope;
        a.q[((int64_t)i * a.heads + h) * a.qdim + a.nope + d] = stage[it];
        if (a.q16) /* pack_q's copy of the same value */
            ((__nv_bfloat16 *)a.q16)[((int64_t)i * a.heads + h) * (a.rank + a.rope) + a.rank + d] =
                __float2bfloat16(stage[it]);
    }
}

extern "C" ddt_status ddt_cuda_mla_rope_write(const ddt_cuda_mla_rope_args *a, ddt_cuda_stream stream,
                                              ddt_error *err) {
    if (a->n < 1 || a->rope < 2 || a->rope % 2 || a->heads < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "mla rope: %d tokens, rope dim %d, %d heads", a->n, a->rope, a->heads);
    size_t smem = sizeof(float) * (size_t)a->heads * (size_t)a->rope;
    if (smem > 48 * 1024) return ddt_fail(err, DDT_ERR_UNSUPPORTED, "mla rope: %d heads x %d rope dims", a->heads, a->rope);
    if (a->rope / 2 > ROPE_THREADS) /* a thread a pair of the cache row (mla_k_row_store) */
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "mla rope: rope dim %d (at most %d)", a->rope, 2 * ROPE_THREADS);
    rope_write_kernel<<<a->n, ROPE_THREADS, smem, (cudaStream_t)stream>>>(*a);
    DDT_CUDA_LAUNCHED("mla_rope_write", (cudaStream_t)stream, err);
    return DDT_OK;
}

/* ddt_cuda_mla_norm_write: blockIdx.y picks the norm (0: q_a, 1: kv_a), blockIdx.x
 * the token; the kv_a blocks then write their token's cache row from the row they
 * normed (visible to the block after the barrier).  The row's place and its k_rope
 * pairs are loaded before the norm, so their round trips (the position, then the
 * pair and its table entries) run beside the norm's instead of after it: the kv
 * block was four dependent round trips on the layer's path. */
struct MlaNormPair {
    ddt_cuda_norm_job job[2];
    bool vec[2];
    ddt_cuda_split_planes sp0; /* job 0's output planes, or none */
};

/* NT: norm_threads of the longer row; each row is normed by its own count */
template <int NT>
static __global__ void __launch_bounds__(NT, 1)
mla_norm_write_kernel(const MlaNormPair p, float eps, const ddt_cuda_mla_rope_args a) {
    DDT_GRID_DEP_WAIT();
    const ddt_cuda_norm_job &j = p.job[blockIdx.y];
    MlaKRow k = {};
    if (blockIdx.y == 1) k = mla_k_row_load(a, blockIdx.x, threadIdx.x);
    norm_row<NT>((float *)j.x + (int64_t)blockIdx.x * j.ldx, j.dim, NormNoResid{}, j.w, eps,
                 j.out + (int64_t)blockIdx.x * j.ldo, p.vec[blockIdx.y],
                 blockIdx.y == 0 ? norm_split_row(p.sp0, blockIdx.x) : NormSplitRow{nullptr, nullptr});
    if (blockIdx.y == 1) {
        __syncthreads(); /* kvn: the row the block normed */
        mla_k_row_store(a, blockIdx.x, k, threadIdx.x, NT);
    }
}

extern "C" ddt_status ddt_cuda_mla_norm_write(const ddt_cuda_norm_job jobs[2], float eps,
                                              const ddt_cuda_mla_rope_args *a, const ddt_cuda_split_planes *sp0,
                                              ddt_cuda_stream stream, ddt_error *err) {
    if (!jobs || !a) return ddt_fail(err, DDT_ERR_INVALID, "mla norm_write: NULL argument");
    if (a->n < 1 || a->n > 65535 || a->rope < 2 || a->rope % 2 || a->rank < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "mla norm_write: %d tokens, rope dim %d, rank %d", a->n, a->rope,
                        a->rank);
    if (jobs[1].out != a->kvn || jobs[1].ldo != a->rank || jobs[1].dim != a->rank)
        return ddt_fail(err, DDT_ERR_INVALID,
                        "mla norm_write: the kv norm must write the rows the cache write reads (kvn, %d wide)",
                        a->rank);
    MlaNormPair p;
    const ddt_status sst = norm_split_check("mla norm_write", sp0, jobs[0].dim, &p.sp0, err);
    if (sst != DDT_OK) return sst;
    for (int i = 0; i < 2; i++) {
        const ddt_cuda_norm_job &j = jobs[i];
        if (j.dim < 1 || !j.x || !j.w || !j.out)
            return ddt_fail(err, DDT_ERR_INVALID, "mla norm_write: job %d: %d rows of %d", i, a->n, j.dim);
        p.job[i] = j;
        const void *ptrs[3] = {j.x, j.w, j.out};
        const int64_t lds[3] = {j.ldx, 0, j.ldo};
        p.vec[i] = norm_vec_ok(j.dim, ptrs, lds, 3);
    }
    const int nt_launch = max(norm_threads(jobs[0].dim), norm_threads(jobs[1].dim));
    if (a->rope / 2 > nt_launch) /* a thread a pair of the cache row (mla_k_row_store) */
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "mla norm_write: rope dim %d (at most %d here)", a->rope,
                        2 * nt_launch);
    norm_launch(nt_launch, [&](auto nt) {
        constexpr int NT = decltype(nt)::value;
        mla_norm_write_kernel<NT><<<dim3((unsigned)a->n, 2), NT, 0, (cudaStream_t)stream>>>(p, eps, *a);
    });
    DDT_CUDA_LAUNCHED("mla_norm_write", (cudaStream_t)stream, err);
    return DDT_OK;
}

/* One (token, head, slice) attention's view of the cache: the slice's local
 * position j is logical position p = s0 + j (j < cnt), at cache row p (p < len)
 * or len + anc[j] (anc: the slice's window of the token's ancestors by depth). */
struct slice_rows {
    const float *cache;
    int width, len, s0, cnt;
    const int *anc;
};

static __device__ __forceinline__ int64_t slice_row(const slice_rows &r, int j) {
    const int p = r.s0 + j;
    return p < r.len ? (int64_t)p : (int64_t)r.len + r.anc[j];
}

/* Registers <- local positions [c0, c0 + C) x columns [0, cols) of the slice,
 * element e = threadIdx.x + k * ATTN_THREADS being position c0 + e / cols,
 * column e % cols (0 past the slice or past the chunk).  No load depends on
 * another, so a thread has all STAGE_PER of them in flight at once. */
static __device__ __forceinline__ void chunk_fetch(float (&v)[STAGE_PER], const slice_rows &r, int c0, int C,
                                                   int cols) {
    /* e's (position, column) stepped by ATTN_THREADS elements: one carry is
       enough, as the column step ATTN_THREADS % cols (or ATTN_THREADS, when
       cols > ATTN_THREADS) is below cols */
    int j = threadIdx.x / cols, c = threadIdx.x % cols;
    const int dj = ATTN_THREADS / cols, dc = ATTN_THREADS % cols;
#pragma unroll
    for (int k = 0; k < STAGE_PER; k++) {
        const int p = c0 + j;
        v[k] = (j < C && p < r.cnt) ? r.cache[slice_row(r, p) * r.width + c] : 0.0f;
        j += dj;
        c += dc;
        if (c >= cols) {
            c -= cols;
            j++;
        }
    }
}

/* stage[e] <- the element chunk_fetch put in v (row-major [C][cols]), e < total */
static __device__ __forceinline__ void chunk_store(const float (&v)[STAGE_PER], float *stage, int total) {
#pragma unroll
    for (int k = 0; k < STAGE_PER; k++) {
        const int e = threadIdx.x + k * ATTN_THREADS;
        if (e < total) stage[e] = v[k];
    }
}

/* The idx-th chunk of a block's sequence: ns score chunks of cs positions (all
 * width columns), then no output chunks of co positions (the rank columns;
 * none when the slice fits in one score chunk, whose stage the output reuses). */
static __device__ __forceinline__ void slice_fetch(float (&v)[STAGE_PER], const slice_rows &r, int idx, int ns,
                                                   int no, int cs, int co, int rank) {
    if (idx < ns) chunk_fetch(v, r, idx * cs, cs, r.width);
    else if (idx - ns < no) chunk_fetch(v, r, (idx - ns) * co, co, rank);
}

/* The workspace (ddt_cuda_mla_attn_workspace): its layout depends only on the
 * sizes it was made for, never on a launch's n, so counters stay counters. */
struct attn_ws {
    unsigned *ctr; /* [max_tokens * heads] slices of a (token, head) finished in this launch; 0 between launches */
    float *pm;     /* [max_tokens * heads][max_slices] slice maxima m_s */
    float *pl;     /* [max_tokens * heads][max_slices] slice sums l_s = sum exp(score - m_s) */
    float *pacc;   /* [max_tokens * heads][max_slices][rank] acc_s[d] = sum exp(score - m_s) c[d] */
    int max_slices;
};

static __host__ __device__ __forceinline__ int64_t attn_ws_ctr_words(int64_t th) {
    return (th + 3) / 4 * 4; /* the partials start 16-byte aligned */
}

static __global__ void __launch_bounds__(ATTN_THREADS)
mla_attn_kernel(ddt_cuda_mla_attn_args a, attn_ws ws, int stage_floats) {
    DDT_GRID_DEP_WAIT();
    extern __shared__ float smem[];
    __shared__ unsigned is_last;
    const int width = a.rank + a.rope;
    float *q = smem;                           /* [width] */
    float *e = q + width;                      /* [ATTN_SPLIT] the slice's scores, then exponentials */
    float *accs = e + ATTN_SPLIT;              /* [rank] output sums carried across chunks / slices */
    float *red = accs + a.rank;                /* [RED_FLOATS] warp maxima, the slice sum */
    float *mw = red + RED_FLOATS;              /* [MERGE_CHUNK] merge weights exp(m_s - M) */
    float *mlw = mw + MERGE_CHUNK;             /* [MERGE_CHUNK] l_s exp(m_s - M) */
    int *anc = (int *)(mlw + MERGE_CHUNK);     /* [ATTN_SPLIT] */
    float *stage = (float *)(anc + ATTN_SPLIT); /* [stage_floats] the chunk being computed */
    const int ih = blockIdx.x, i = ih / a.heads, h = ih % a.heads, s = blockIdx.y;
    const int len = *a.len;
    const int d_i = a.depth[i];
    float *out = a.out + (int64_t)ih * a.rank;
    /* positions [0, P); a len or depth that puts them outside the cache gets a
       NaN row (the old kernel's answer to P < 1) rather than stray reads */
    const long long Pl = (long long)len + d_i + 1;
    if (Pl < 1 || Pl > a.capacity) {
        if (s == 0)
            for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) out[d] = NAN;
        return;
    }
    const int P = (int)Pl;
    const int n_sl = (P + ATTN_SPLIT - 1) / ATTN_SPLIT; /* slices: a function of P alone */
    if (s >= n_sl) return; /* the grid is the host's, for any P up to the capacity */
    /* live blocks: min(n_sl, gridDim.y); block s takes slices s, s + gridDim.y, ... */
    const int n_live = min(n_sl, (int)gridDim.y);
    for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) q[d] = a.q_lat[(int64_t)ih * a.rank + d];
    for (int d = threadIdx.x; d < a.rope; d += ATTN_THREADS)
        q[a.rank + d] = a.q_rope[(int64_t)i * a.q_rope_ld_t + (int64_t)h * a.q_rope_ld_h + d];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t slot = (int64_t)ih * ws.max_slices;

    for (int sl = s; sl < n_sl; sl += gridDim.y) {
        const int s0 = sl * ATTN_SPLIT;
        const int cnt = min(ATTN_SPLIT, P - s0);
        __syncthreads(); /* q is loaded / the previous slice is done with anc, e, red and stage */

        /* the slice's window of ancestors by depth: visible node j at depth
           depth[j] holds logical position len + depth[j], local len + depth[j] - s0;
           a slice of committed rows only needs none */
        if (s0 + cnt > len) {
            for (int j = threadIdx.x; j < a.n; j += ATTN_THREADS) {
                bool v = a.vis ? ((a.vis[(int64_t)i * a.vis_words + (j >> 6)] >> (j & 63)) & 1u) : j <= i;
                if (v) {
                    const int dj = a.depth[j];
                    if (dj >= 0 && dj <= d_i) {
                        const int k = len + dj - s0;
                        if (k >= 0 && k < cnt) anc[k] = j;
                    }
                }
            }
        }
        for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) accs[d] = 0.0f; /* its own entries */
        __syncthreads(); /* anc */

        const slice_rows r = {a.cache, width, len, s0, cnt, anc};
        const int cs = stage_floats / width, co = min(ATTN_SPLIT, stage_floats / a.rank);
        const int ns = (cnt + cs - 1) / cs;
        const bool whole = ns == 1; /* the stage keeps the slice's rows for the output */
        const int no = whole ? 0 : (cnt + co - 1) / co;
        float v[STAGE_PER];
        slice_fetch(v, r, 0, ns, no, cs, co, a.rank);

        /* scores: warp w takes the chunk's positions w, w + ATTN_WARPS, ..., SC_U at
           a time; a score is lane l's sum over d = l, l + 32, ... in order, a fixed
           xor-shuffle tree (every lane ends with the same bits), times scale */
        float mx = -INFINITY;
        for (int c = 0; c < ns; c++) {
            const int c0 = c * cs, cn = min(cs, cnt - c0);
            __syncthreads(); /* the previous chunk's scores are done with stage */
            chunk_store(v, stage, cn * width);
            __syncthreads();
            /* the next chunk (after the last score chunk: the first output chunk) */
            slice_fetch(v, r, c + 1, ns, no, cs, co, a.rank);
            for (int j0 = warp; j0 < cn; j0 += ATTN_WARPS * SC_U) {
                float sv[SC_U];
                const float *kv[SC_U];
#pragma unroll
                for (int u = 0; u < SC_U; u++) {
                    const int j = j0 + u * ATTN_WARPS;
                    kv[u] = stage + (j < cn ? j : j0) * width; /* past the chunk: a valid row, result unused */
                    sv[u] = 0.0f;
                }
                for (int d = lane; d < width; d += 32) {
                    const float qd = q[d];
#pragma unroll
                    for (int u = 0; u < SC_U; u++) sv[u] += qd * kv[u][d];
                }
                for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
                    for (int u = 0; u < SC_U; u++) sv[u] += __shfl_xor_sync(0xffffffffu, sv[u], o);
                }
#pragma unroll
                for (int u = 0; u < SC_U; u++) {
                    const int j = j0 + u * ATTN_WARPS;
                    if (j < cn) {
                        const float x = sv[u] * a.scale;
                        if (lane == 0) e[c0 + j] = x;
                        mx = fmaxf(mx, x);
                    }
                }
            }
        }
        /* the slice max: fmaxf in any order gives the same value (NaNs dropped; a
           zero's sign can differ, but exp(x - +0) == exp(x - -0)) */
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        if (lane == 0) red[warp] = mx;
        __syncthreads(); /* red and every score in e are written */
        float m = red[0];
        for (int w = 1; w < ATTN_WARPS; w++) m = fmaxf(m, red[w]);
        /* the slice sum: warp 0, lane l over local positions l, l + 32, ... in
           order, then the xor tree; a NaN score makes it (and the output) NaN */
        if (warp == 0) {
            float part = 0.0f;
            for (int j = lane; j < cnt; j += 32) {
                const float x = expf(e[j] - m);
                e[j] = x;
                part += x;
            }
            for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
            if (lane == 0) red[ATTN_WARPS] = part; /* beside the maxima the other warps read */
        }
        __syncthreads(); /* the exponentials and the sum */
        const float l = red[ATTN_WARPS];

        /* output: thread d's sum over the slice's positions in increasing order,
           from the stage when the slice fitted in one chunk, else chunk by chunk */
        if (!whole) {
            for (int c = 0; c < no; c++) {
                const int c0 = c * co, cn = min(co, cnt - c0);
                __syncthreads(); /* stage is free (the scores / the previous chunk are done) */
                chunk_store(v, stage, cn * a.rank);
                __syncthreads();
                slice_fetch(v, r, ns + c + 1, ns, no, cs, co, a.rank);
                for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) {
                    float acc = accs[d];
                    const float *col = stage + d;
#pragma unroll 8
                    for (int j = 0; j < cn; j++) acc += e[c0 + j] * col[j * a.rank];
                    accs[d] = acc;
                }
            }
        } else {
            for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) {
                float acc = 0.0f;
                const float *col = stage + d;
#pragma unroll 8
                for (int j = 0; j < cnt; j++) acc += e[j] * col[j * width];
                accs[d] = acc;
            }
        }
        /* (each thread reads back only the accs entries it wrote itself) */
        if (n_sl == 1) { /* the whole context in this block (s == 0, one pass): no partials, no counter */
            const float inv = 1.0f / l;
            for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) out[d] = accs[d] * inv;
            return;
        }

        for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) ws.pacc[(slot + sl) * a.rank + d] = accs[d];
        if (threadIdx.x == 0) {
            ws.pm[slot + sl] = m;
            ws.pl[slot + sl] = l;
        }
    } /* slices */

    /* release: every thread's partials reach device scope before the block's
       ticket; the last of the n_live blocks to take one merges */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(ws.ctr + ih, 1u) == (unsigned)(n_live - 1);
    __syncthreads();
    if (!is_last) return;
    /* acquire: the other blocks' partials, read below past L1 (__ldcg) */
    __threadfence();
    if (threadIdx.x == 0) atomicExch(ws.ctr + ih, 0u); /* all n_live have arrived: ready for the next launch */

    /* merge: M = the max of the m_s (any order: as above) ... */
    const float *pm = ws.pm + slot, *pl = ws.pl + slot, *pa = ws.pacc + slot * a.rank;
    float mm = -INFINITY;
    for (int t = threadIdx.x; t < n_sl; t += ATTN_THREADS) mm = fmaxf(mm, __ldcg(pm + t));
    for (int o = 16; o > 0; o >>= 1) mm = fmaxf(mm, __shfl_xor_sync(0xffffffffu, mm, o));
    if (lane == 0) red[warp] = mm; /* red's last readers passed the barriers above */
    __syncthreads();
    float M = red[0];
    for (int w = 1; w < ATTN_WARPS; w++) M = fmaxf(M, red[w]);
    /* ... then, in increasing slice order, L = sum l_s w_s and out[d] =
       sum acc_s[d] w_s with w_s = exp(m_s - M), MERGE_CHUNK slices' weights at a
       time; every thread sums L itself in that order (the same bits in all) */
    float L = 0.0f;
    for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) accs[d] = 0.0f;
    for (int c0 = 0; c0 < n_sl; c0 += MERGE_CHUNK) {
        const int cn = min(MERGE_CHUNK, n_sl - c0);
        __syncthreads(); /* M's reads of red / the previous chunk's weights are done */
        if ((int)threadIdx.x < cn) {
            const float w = expf(__ldcg(pm + c0 + threadIdx.x) - M);
            mw[threadIdx.x] = w;
            mlw[threadIdx.x] = __ldcg(pl + c0 + threadIdx.x) * w;
        }
        __syncthreads();
        for (int k = 0; k < cn; k++) L += mlw[k];
        for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) {
            float acc = accs[d];
            const float *col = pa + (int64_t)c0 * a.rank + d;
#pragma unroll 8
            for (int k = 0; k < cn; k++) acc += mw[k] * __ldcg(col + (int64_t)k * a.rank);
            accs[d] = acc;
        }
    }
    const float inv = 1.0f / L;
    for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) out[d] = accs[d] * inv;
}

/* The launch's shape, shared by the workspace query, the preparation and the
 * launcher; false for a shape the kernel cannot run (*why says which). */
struct attn_geom {
    int max_slices;    /* slices of the capacity: slots per (token, head), grid.y's bound */
    int stage_floats;  /* the chunk stage */
    size_t smem;       /* dynamic shared memory */
    int64_t th;        /* max_tokens * heads: the workspace's (token, head) slots */
};

static bool attn_geometry(int32_t max_tokens, int32_t heads, int32_t rank, int32_t rope, int32_t capacity,
                          attn_geom *g, const char **why) {
    if (max_tokens < 1 || heads < 1 || rank < 1 || rope < 0 || capacity < 1) {
        *why = "invalid";
        return false;
    }
    const int64_t slices = ((int64_t)capacity + ATTN_SPLIT - 1) / ATTN_SPLIT;
    if (slices > MAX_SLICES) {
        *why = "capacity";
        return false;
    }
    if ((int64_t)max_tokens * heads > 0x7fffffff) {
        *why = "blocks";
        return false;
    }
    /* the chunk stage takes what the fixed parts leave of 48 KB, up to
       STAGE_MAX floats; it must hold one row (a chunk of one position) */
    const size_t width = (size_t)rank + (size_t)rope, limit = 48 * 1024;
    const size_t fixed = sizeof(float) * (width + ATTN_SPLIT + (size_t)rank + RED_FLOATS + 2 * MERGE_CHUNK) +
                         sizeof(int) * ATTN_SPLIT;
    if (fixed + sizeof(float) * width > limit) {
        *why = "smem";
        return false;
    }
    size_t stage = (limit - fixed) / sizeof(float);
    if (stage > STAGE_MAX) stage = STAGE_MAX;
    g->max_slices = (int)slices;
    g->stage_floats = (int)stage;
    g->smem = fixed + sizeof(float) * stage;
    g->th = (int64_t)max_tokens * heads;
    return true;
}

/* Workspace bytes (counters, then per (token, head) slot and slice m, l, acc); 0 on overflow. */
static size_t attn_ws_bytes(const attn_geom *g, int32_t rank) {
    const uint64_t cells = (uint64_t)g->th * (uint64_t)g->max_slices; /* < 2^31 * 2^16 */
    const uint64_t per = 2 + (uint64_t)rank;                          /* m, l, acc[rank] */
    if (cells > UINT64_MAX / 4 / per) return 0;
    const uint64_t floats = (uint64_t)attn_ws_ctr_words(g->th) + cells * per;
    if (floats > (uint64_t)SIZE_MAX / 4) return 0;
    return (size_t)(floats * 4);
}

static attn_ws attn_ws_layout(void *base, const attn_geom *g) {
    attn_ws w;
    const int64_t cells = g->th * g->max_slices;
    w.ctr = (unsigned *)base;
    w.pm = (float *)base + attn_ws_ctr_words(g->th);
    w.pl = w.pm + cells;
    w.pacc = w.pl + cells;
    w.max_slices = g->max_slices;
    return w;
}

static ddt_status attn_bad_shape(const char *what, int32_t max_tokens, int32_t heads, int32_t rank, int32_t rope,
                                 int32_t capacity, const char *why, ddt_error *err) {
    if (why[0] == 'c')
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "mla %s: %d cache rows need more than %d slices of %d", what,
                        capacity, MAX_SLICES, ATTN_SPLIT);
    if (why[0] == 'b')
        return ddt_fail(err, DDT_ERR_RANGE, "mla %s: %d x %d blocks", what, max_tokens, heads);
    if (why[0] == 's')
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "mla %s: rank %d + rope %d does not fit in 48 KB of shared memory",
                        what, rank, rope);
    return ddt_fail(err, DDT_ERR_INVALID, "mla %s: %d tokens, %d heads, rank %d, rope %d, %d cache rows", what,
                    max_tokens, heads, rank, rope, capacity);
}

extern "C" size_t ddt_cuda_mla_attn_workspace(int32_t max_tokens, int32_t heads, int32_t rank, int32_t rope,
                                              int32_t capacity) {
    attn_geom g;
    const char *why;
    if (!attn_geometry(max_tokens, heads, rank, rope, capacity, &g, &why)) return 0;
    return attn_ws_bytes(&g, rank);
}

extern "C" ddt_status ddt_cuda_mla_attn_prepare(void *workspace, int32_t max_tokens, int32_t heads, int32_t rank,
                                                int32_t rope, int32_t capacity, ddt_cuda_stream stream,
                                                ddt_error *err) {
    attn_geom g;
    const char *why;
    if (!attn_geometry(max_tokens, heads, rank, rope, capacity, &g, &why))
        return attn_bad_shape("attention prepare", max_tokens, heads, rank, rope, capacity, why, err);
    if (!workspace || attn_ws_bytes(&g, rank) == 0)
        return ddt_fail(err, DDT_ERR_INVALID, "mla attention prepare: no workspace");
    DDT_CUDA_TRY(cudaMemsetAsync(workspace, 0, sizeof(unsigned) * (size_t)g.th, (cudaStream_t)stream), err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_mla_attention(const ddt_cuda_mla_attn_args *a, ddt_cuda_stream stream,
                                             ddt_error *err) {
    if (a->n < 1 || a->n > a->max_tokens || a->capacity < a->n || !a->workspace || !a->out || !a->cache ||
        !a->len || !a->depth || !a->q_lat || (a->rope > 0 && !a->q_rope) || (a->vis && a->vis_words < (a->n + 63) / 64))
        return ddt_fail(err, DDT_ERR_INVALID,
                        "mla attention: %d tokens (workspace for %d), %d heads, rank %d, %d cache rows, or a NULL "
                        "pointer", a->n, a->max_tokens, a->heads, a->rank, a->capacity);
    attn_geom g;
    const char *why;
    if (!attn_geometry(a->max_tokens, a->heads, a->rank, a->rope, a->capacity, &g, &why))
        return attn_bad_shape("attention", a->max_tokens, a->heads, a->rank, a->rope, a->capacity, why, err);
    if (attn_ws_bytes(&g, a->rank) == 0)
        return ddt_fail(err, DDT_ERR_RANGE, "mla attention: the workspace's size overflows");
    /* grid.y: blocks per (token, head), each taking every grid.y-th slice; any
       value gives the same bits (a slice's arithmetic is its own, the merge is
       in slice order), so it follows n to keep about ATTN_GRID_TARGET blocks
       live when the contexts are long, without a sea of blocks that exit at once
       when they are short.  It never depends on len (graph replay). */
    const int64_t th = (int64_t)a->n * a->heads;
    int64_t gy = (ATTN_GRID_TARGET + th - 1) / th;
    if (gy > g.max_slices) gy = g.max_slices;
    const dim3 grid((unsigned)th, (unsigned)gy);
    mla_attn_kernel<<<grid, ATTN_THREADS, g.smem, (cudaStream_t)stream>>>(*a, attn_ws_layout(a->workspace, &g),
                                                                           g.stage_floats);
    DDT_CUDA_LAUNCHED("mla_attention", (cudaStream_t)stream, err);
    return DDT_OK;
}

static __global__ void pack_q_kernel(const float *__restrict__ q_lat, const float *__restrict__ q_rope,
                                     int64_t ld_t, int64_t ld_h, int heads, int rank, int rope,
                                     __nv_bfloat16 *__restrict__ q16) {
    DDT_GRID_DEP_WAIT();
    const int i = blockIdx.x / heads, h = blockIdx.x % heads, w = rank + rope;
    __nv_bfloat16 *dst = q16 + (int64_t)blockIdx.x * w;
    const float *ql = q_lat + (int64_t)blockIdx.x * rank, *qr = q_rope + (int64_t)i * ld_t + (int64_t)h * ld_h;
    for (int d = threadIdx.x; d < w; d += blockDim.x) dst[d] = __float2bfloat16(d < rank ? ql[d] : qr[d - rank]);
}

extern "C" ddt_status ddt_cuda_mla_pack_q(const float *q_lat, const float *q_rope, int64_t q_rope_ld_t,
                                          int64_t q_rope_ld_h, int32_t n, int32_t heads, int32_t rank, int32_t rope,
                                          uint16_t *q16, ddt_cuda_stream stream, ddt_error *err) {
    if (n < 1 || heads < 1 || rank < 1 || rope < 0)
        return ddt_fail(err, DDT_ERR_INVALID, "mla pack_q: %d tokens x %d heads", n, heads);
    pack_q_kernel<<<n * heads, 128, 0, (cudaStream_t)stream>>>(q_lat, q_rope, q_rope_ld_t, q_rope_ld_h, heads, rank,
                                                               rope, (__nv_bfloat16 *)q16);
    DDT_CUDA_LAUNCHED("mla_pack_q", (cudaStream_t)stream, err);
    return DDT_OK;
}

static __global__ void cache_fill_kernel(void *cache, int64_t per_layer, int64_t used, int64_t total, bool bf16,
                                         uint64_t seed) {
    DDT_GRID_DEP_WAIT();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        if (i % per_layer >= used) continue;
        uint64_t x = seed ^ ((uint64_t)i * 0x9E3779B97F4A7C15ull);
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        x ^= x >> 31;
        float u = (float)(uint32_t)(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
        if (bf16) ((__nv_bfloat16 *)cache)[i] = __float2bfloat16(u);
        else ((float *)cache)[i] = u;
    }
}

extern "C" ddt_status ddt_cuda_mla_cache_fill(void *cache, int32_t layers, int32_t capacity, int32_t width,
                                              int32_t rows, bool bf16, uint64_t seed, ddt_cuda_stream stream,
                                              ddt_error *err) {
    if (layers < 1 || capacity < 1 || width < 1 || rows < 0 || rows > capacity)
        return ddt_fail(err, DDT_ERR_INVALID, "mla cache_fill: %d rows of %d", rows, capacity);
    const int64_t per_layer = (int64_t)capacity * width;
    cache_fill_kernel<<<4096, 256, 0, (cudaStream_t)stream>>>(cache, per_layer, (int64_t)rows * width,
                                                              per_layer * layers, bf16, seed);
    DDT_CUDA_LAUNCHED("mla_cache_fill", (cudaStream_t)stream, err);
    return DDT_OK;
}
