/*
 * tree_cuda.cu — the DDTree round's tree kernels (see tree_cuda.h): top-K of the
 * drafter's logits, the best-first build, argmax per node, and the walk.
 *
 * The build is a warp-parallel equivalent of the CPU's best-first loop
 * (src/core/best_first.h): it pops the same nodes in the same order, and
 * tests/cuda/test_cuda_tree.c checks it against the CPU bitwise, node for node.
 * The surrounding work — checking the table, the visibility bitsets — is spread
 * over the block.  Compiled with --fmad=false so that no weight sum is ever
 * contracted into something the CPU does not compute.
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/tree_cuda.h"
#include "core/calibration.h"
#include "core/detmath.h"
#include "core/graft_merge.h"
#include "core/lookup.h"

#define TOPK_THREADS 1024
#define BUILD_THREADS 1024

static_assert(DDT_MAX_TOPK == TOPK_THREADS, "top-K sorts one candidate per thread");
static_assert(DDT_CUDA_TREE_MAX_BUCKETS <= 32, "the auto build's stop and cut hold one verify bucket a lane of a warp");

/* ------------------------------------------------------------------ helpers */

/* Order-preserving map of a float to an unsigned key (larger float, larger key). */
static __device__ __forceinline__ uint32_t float_key(float f) {
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The top-K's key: float_key with -0.0 mapped to +0.0's key, because the CPU
 * twin compares logits with `>` and `==` (core/zsort.c), under which the two
 * zeros are equal and the lower id comes first; distinct keys would order every
 * +0.0 before every -0.0.  key_float gives +0.0 back, and z - lse is the same
 * float for either zero. */
static __device__ __forceinline__ uint32_t topk_key(float f) {
    return float_key(f == 0.0f ? 0.0f : f);
}

static __device__ __forceinline__ float key_float(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    return __uint_as_float(u);
}

/* Block-wide reductions for blockDim.x a multiple of 32 (<= 1024). */
static __device__ float block_max(float v, float *scratch) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ float block_sum(float v, float *scratch) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Exclusive prefix count of `flag` over the block in thread order; *total gets the sum. */
static __device__ int block_exclusive_count(int flag, int *scratch, int *total) {
    unsigned ballot = __ballot_sync(0xffffffffu, flag);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    int in_warp = __popc(ballot & ((1u << lane) - 1u));
    __syncthreads();
    if (lane == 0) scratch[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, sum = 0;
    for (int w = 0; w < nw; w++) {
        if (w < warp) before += scratch[w];
        sum += scratch[w];
    }
    *total = sum;
    return before + in_warp;
}

/* ------------------------------------------------------------------ top-K */

/*
 * Vocabularies above TOPK_SMALL_VOCAB (the one-launch path below takes the
 * rest): two stages, so the whole GPU works on a few long rows:
 *  1. grid (chunks, rows): each block takes TOPK_CHUNK logits of a row into
 *     shared memory as order-preserving keys, writes the chunk's max and
 *     sum(exp(z - max)), and its own top-k sorted by (key desc, id asc);
 *  2. one block per row merges the chunks' log-sum-exps and selects the top-k
 *     of the chunks' candidates the same way.
 * Selection: radix select of the k-th largest key, 8 bits per pass from the
 * top; every key above it, then keys equal to it in position order until k are
 * held; bitonic sort.  Position order is id order in stage 1, and in stage 2
 * (chunks in id order, each sorted with ties by id) equal keys also come in id
 * order, so ties keep the lowest ids, as the CPU does.
 */
#define TOPK_CHUNK 8192

typedef struct chunk_src { /* stage 1: keys in shared memory, ids = base + position */
    const uint32_t *key;
    int32_t base;
    __device__ uint32_t k(int i) const { return key[i]; }
    __device__ int32_t id(int i) const { return base + i; }
} chunk_src;

typedef struct cand_src { /* stage 2: the chunks' candidates */
    const uint32_t *key;
    const int32_t *ids;
    __device__ uint32_t k(int i) const { return key[i]; }
    __device__ int32_t id(int i) const { return ids[i]; }
} cand_src;

/* The top min(k, n) of n keys into out_key/out_id [TOPK_THREADS], sorted; the
 * rest padded with (0, INT_MAX). Called by all threads of a TOPK_THREADS block. */
template <class Src>
static __device__ void select_topk(const Src &src, int n, int k, uint32_t *out_key,
                                   int32_t *out_id) {
    __shared__ unsigned hist[256];
    __shared__ unsigned s_bin, s_remaining;
    __shared__ int s_count;
    __shared__ int iscratch[32];
    const int tid = threadIdx.x;
    const int kk = k < n ? k : n;
    uint32_t prefix = 0, mask = 0;
    unsigned remaining = (unsigned)kk;
    __shared__ unsigned wtot[8];
    const int lane = tid & 31, warp = tid >> 5;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
        if (tid == 0) {
            s_bin = 0;
            s_remaining = remaining;
        }
        __syncthreads();
        /* Warp-aggregated histogram: the keys of a chunk share their top bytes, so
         * per-thread atomics would all hit one bin and serialise 32-fold; lanes
         * with the same bin elect one that adds the count. */
        for (int b0 = 0; b0 < n; b0 += blockDim.x) {
            const int i = b0 + tid;
            bool act = false;
            unsigned bin = 0xFFFFFFFFu;
            if (i < n) {
                const uint32_t key = src.k(i);
                act = (key & mask) == prefix;
                if (act) bin = (key >> shift) & 255u;
            }
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (act && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
        }
        __syncthreads();
        /* The bin holding the remaining-th largest key: a suffix scan over the bins
         * (thread t holds bin 255 - t), instead of one thread walking 256 bins. */
        unsigned h = 0, incl = 0;
        if (tid < 256) {
            h = hist[255 - tid];
            incl = h;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += v;
            }
            if (lane == 31) wtot[warp] = incl;
        }
        __syncthreads();
        if (tid < 256) {
            for (int w = 0; w < warp; w++) incl += wtot[w];
            const unsigned excl = incl - h;
            if (excl < remaining && incl >= remaining) {
                s_bin = 255u - (unsigned)tid;
                s_remaining = remaining - excl;
            }
        }
        __syncthreads();
        prefix |= (uint32_t)s_bin << shift;
        mask |= 255u << shift;
        remaining = s_remaining;
        __syncthreads();
    }
    const uint32_t thresh = prefix;
    if (tid == 0) s_count = 0;
    __syncthreads();
    for (int i = tid; i < n; i += blockDim.x) {
        uint32_t key = src.k(i);
        if (key > thresh) {
            int slot = atomicAdd(&s_count, 1);
            out_key[slot] = key;
            out_id[slot] = src.id(i);
        }
    }
    __syncthreads();
    const int gt = s_count;
    int taken = 0;
    for (int base = 0; base < n && taken < (int)remaining; base += blockDim.x) {
        int i = base + tid;
        int eq = i < n && src.k(i) == thresh;
        int total;
        int r = block_exclusive_count(eq, iscratch, &total);
        if (eq && taken + r < (int)remaining) {
            out_key[gt + taken + r] = thresh;
            out_id[gt + taken + r] = src.id(i);
        }
        taken += total;
    }
    __syncthreads();
    for (int i = kk + tid; i < TOPK_THREADS; i += blockDim.x) {
        out_key[i] = 0u;
        out_id[i] = INT_MAX;
    }
    __syncthreads();
    /* bitonic sort into "before" order: key desc, id asc — of the first P slots
     * only, P the smallest power of two >= k (the rest are padding, and callers
     * read k entries) */
    int P = 2;
    while (P < k) P <<= 1;
    for (int size = 2; size <= P; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            int i = tid, j = tid ^ stride;
            if (j > i && j < P) {
                uint32_t ki = out_key[i], kj = out_key[j];
                int32_t ii = out_id[i], ij = out_id[j];
                bool j_before = kj > ki || (kj == ki && ij < ii);
                bool up = (i & size) == 0;
                if (up == j_before) {
                    out_key[i] = kj;
                    out_key[j] = ki;
                    out_id[i] = ij;
                    out_id[j] = ii;
                }
            }
            __syncthreads();
        }
    }
}

static __global__ void __launch_bounds__(TOPK_THREADS)
topk_chunk_kernel(const float *__restrict__ logits, int vocab, int k, int chunks,
                  float *__restrict__ part_max, float *__restrict__ part_sum,
                  uint32_t *__restrict__ cand_key, int32_t *__restrict__ cand_id) {
    DDT_GRID_DEP_WAIT();
    __shared__ uint32_t s_key[TOPK_CHUNK];
    __shared__ uint32_t o_key[TOPK_THREADS];
    __shared__ int32_t o_id[TOPK_THREADS];
    __shared__ float fscratch[32];
    const int chunk = blockIdx.x, row = blockIdx.y, tid = threadIdx.x;
    const int base = chunk * TOPK_CHUNK;
    const int len = vocab - base < TOPK_CHUNK ? vocab - base : TOPK_CHUNK;
    const float *z = logits + (size_t)row * (size_t)vocab + base;
    float m = -INFINITY;
    for (int i = tid; i < len; i += blockDim.x) {
        float v = z[i];
        s_key[i] = topk_key(v);
        m = fmaxf(m, v);
    }
    m = block_max(m, fscratch);
    /* a chunk of only -inf logits weighs 0 in the sum (exp(-inf - -inf) would
       be NaN and spoil the whole row's normaliser) */
    const float ms = m == -INFINITY ? 0.0f : m;
    float s = 0.0f;
    for (int i = tid; i < len; i += blockDim.x) s += expf(key_float(s_key[i]) - ms);
    s = block_sum(s, fscratch);
    const size_t slot = (size_t)row * (size_t)chunks + (size_t)chunk;
    if (tid == 0) {
        part_max[slot] = m;
        part_sum[slot] = s;
    }
    chunk_src src = {s_key, base};
    select_topk(src, len, k, o_key, o_id);
    for (int j = tid; j < k; j += blockDim.x) {
        cand_key[slot * (size_t)k + j] = o_key[j];
        cand_id[slot * (size_t)k + j] = o_id[j];
    }
}

static __global__ void __launch_bounds__(TOPK_THREADS)
topk_merge_kernel(int k, int chunks, const float *__restrict__ part_max,
                  const float *__restrict__ part_sum, const uint32_t *__restrict__ cand_key,
                  const int32_t *__restrict__ cand_id, float *__restrict__ logq,
                  int32_t *__restrict__ token) {
    DDT_GRID_DEP_WAIT();
    __shared__ uint32_t o_key[TOPK_THREADS];
    __shared__ int32_t o_id[TOPK_THREADS];
    __shared__ float fscratch[32];
    const int row = blockIdx.x, tid = threadIdx.x;
    const float *pm = part_max + (size_t)row * (size_t)chunks;
    const float *ps = part_sum + (size_t)row * (size_t)chunks;
    float m = -INFINITY;
    for (int c = tid; c < chunks; c += blockDim.x) m = fmaxf(m, pm[c]);
    m = block_max(m, fscratch);
    float s = 0.0f;
    for (int c = tid; c < chunks; c += blockDim.x) s += ps[c] * expf(pm[c] - m);
    s = block_sum(s, fscratch);
    const float lse = m + logf(s);
    const size_t off = (size_t)row * (size_t)chunks * (size_t)k;
    cand_src src = {cand_key + off, cand_id + off};
    select_topk(src, chunks * k, k, o_key, o_id);
    for (int j = tid; j < k; j += blockDim.x) {
        logq[(size_t)row * (size_t)k + j] = key_float(o_key[j]) - lse;
        token[(size_t)row * (size_t)k + j] = o_id[j];
    }
}

/*
 * Small vocabularies (vocab <= TOPK_SMALL_VOCAB, the shipped drafter's 4352):
 * one launch, one block per row, where the two stages above cost ~30 us a round
 * at 4352 in two launches and ~60 barriers.  Every thread holds its logits
 * i = tid + j * TOPK_THREADS in registers, so the row is read once, with all
 * of a thread's loads in flight.  Then, all in the block:
 *  - the row's max (warp shuffles, one barrier) and sum(exp(z - max)) in fp32,
 *    log-sum-exp = max + log(sum), the math of the chunked path;
 *  - the k-th largest key by radix select, 8 bits a pass from the top, with two
 *    histograms in turn so clearing the next one needs no barrier of its own
 *    (two barriers a pass); the select stops at the first pass whose chosen bin
 *    is taken whole, so only tied keys need all four;
 *  - the k kept (key, id) into shared memory: keys above the threshold in any
 *    order, keys equal to it (ties after four passes) by an id-order prefix
 *    count so the lowest ids are kept, as the CPU keeps them;
 *  - each of the k threads counts the kept pairs that come before its own
 *    (key desc, id asc: ids are unique, so the ranks are a permutation) and
 *    writes its output at that rank; no sort, no barrier.
 * Ids and order are the chunked path's and the CPU's; the log-probabilities
 * agree with the CPU to fp32 rounding of the sum, as the chunked path's do.
 */
#define TOPK_SMALL_VOCAB 16384
#define TOPK_SMALL_PER (TOPK_SMALL_VOCAB / TOPK_THREADS) /* logits a thread holds, at most */

/* A kept pair as one 64-bit word whose unsigned order is the output order: the
 * key above, the complement of the id below (lower id, larger word). */
static __device__ __forceinline__ unsigned long long pair_word(uint32_t key, int32_t id) {
    return ((unsigned long long)key << 32) | (unsigned long long)(~(uint32_t)id);
}

static __global__ void __launch_bounds__(TOPK_THREADS)
topk_small_kernel(const float *__restrict__ logits, int vocab, int k, float *__restrict__ logq,
                  int32_t *__restrict__ token) {
    DDT_GRID_DEP_WAIT();
    __shared__ unsigned hist[2][256];
    __shared__ unsigned long long kept[TOPK_THREADS];
    __shared__ int eq_before[TOPK_SMALL_PER * 32]; /* tied keys per (j, warp), then their prefix */
    __shared__ float s_wmax[32], s_wsum[32];
    __shared__ unsigned s_bin, s_rem, s_cnt;
    __shared__ int s_kept;
    __shared__ float s_lse;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int per = (vocab + TOPK_THREADS - 1) / TOPK_THREADS; /* the same in every thread */
    const unsigned lt_mask = (1u << lane) - 1u;
    const float *z = logits + (size_t)blockIdx.x * (size_t)vocab;

    if (tid < 256) hist[0][tid] = 0;
    if (tid == 0) s_kept = 0;
    /* every load issued before any is used */
    float v[TOPK_SMALL_PER];
#pragma unroll
    for (int j = 0; j < TOPK_SMALL_PER; j++) {
        const int i = tid + j * TOPK_THREADS;
        v[j] = i < vocab ? __ldg(z + i) : -INFINITY; /* -inf: neutral for the max */
    }
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < TOPK_SMALL_PER; j++) m = fmaxf(m, v[j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) s_wmax[warp] = m;
    __syncthreads();
    /* every thread reduces the 32 warp maxima in the same order: the same m everywhere */
    m = s_wmax[lane];
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s = 0.0f;
    uint32_t key[TOPK_SMALL_PER];
#pragma unroll
    for (int j = 0; j < TOPK_SMALL_PER; j++) {
        if (tid + j * TOPK_THREADS < vocab) s += expf(v[j] - m);
        key[j] = topk_key(v[j]);
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) s_wsum[warp] = s; /* summed by warp 0 after the first pass's barrier */

    uint32_t prefix = 0, mask = 0;
    unsigned remaining = (unsigned)k;
    bool take_all = false; /* every key in the chosen bin is kept */
    for (int pass = 0; pass < 4; pass++) {
        const int shift = 24 - 8 * pass;
        unsigned *h = hist[pass & 1];
        /* Warp-aggregated histogram: a row's keys share their top bytes, so
         * per-lane atomics would pile onto a few bins; lanes of one bin elect
         * one that adds their count. */
#pragma unroll
        for (int j = 0; j < TOPK_SMALL_PER; j++) {
            if (j < per) {
                unsigned bin = 0xFFFFFFFFu;
                if (tid + j * TOPK_THREADS < vocab && (key[j] & mask) == prefix)
                    bin = (key[j] >> shift) & 255u;
                const unsigned peers = __match_any_sync(0xffffffffu, bin);
                if (bin != 0xFFFFFFFFu && lane == __ffs(peers) - 1) atomicAdd(&h[bin], (unsigned)__popc(peers));
            }
        }
        __syncthreads();
        if (warp == 0) {
            /* The bin holding the remaining-th largest key: lane l sums bins
             * 255 - 8l .. 248 - 8l (the top first), a warp scan gives each lane
             * the count above its bins, and the one lane where the running count
             * crosses `remaining` walks its eight. */
            unsigned c[8], sum = 0;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                c[q] = h[255 - 8 * lane - q];
                sum += c[q];
            }
            unsigned incl = sum;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned up = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += up;
            }
            unsigned acc = incl - sum;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                if (acc < remaining && acc + c[q] >= remaining) {
                    s_bin = 255u - 8u * (unsigned)lane - (unsigned)q;
                    s_rem = remaining - acc;
                    s_cnt = c[q];
                }
                acc += c[q];
            }
            /* the other histogram was last read before the previous barrier */
            unsigned *next = hist[(pass + 1) & 1];
#pragma unroll
            for (int q = 0; q < 8; q++) next[8 * lane + q] = 0;
            if (pass == 0) {
                float t = s_wsum[lane];
                for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
                if (lane == 0) s_lse = m + logf(t);
            }
        }
        __syncthreads();
        prefix |= s_bin << shift;
        mask |= 255u << shift;
        remaining = s_rem;
        if (s_cnt == remaining) { /* the same in every thread: all leave together */
            take_all = true;
            break;
        }
    }

    /* Keep every key above the threshold bin (and the bin itself when it is
     * taken whole): one shared atomic per warp and j; slots in any order. */
#pragma unroll
    for (int j = 0; j < TOPK_SMALL_PER; j++) {
        if (j < per) {
            const uint32_t km = key[j] & mask;
            const bool in = tid + j * TOPK_THREADS < vocab && (km > prefix || (take_all && km == prefix));
            const unsigned ballot = __ballot_sync(0xffffffffu, in);
            if (ballot) {
                int base = 0;
                if (lane == 0) base = atomicAdd(&s_kept, __popc(ballot));
                base = __shfl_sync(0xffffffffu, base, 0);
                if (in) kept[base + __popc(ballot & lt_mask)] = pair_word(key[j], tid + j * TOPK_THREADS);
            }
        }
    }
    if (!take_all) {
        /* All four passes ran: the bin is one key value, held by more ids than
         * remain to keep.  Id order is (j, warp, lane), so a prefix over the
         * per-(j, warp) counts in that order plus the lanes below gives each
         * tied id its place among them; the first `remaining` are kept, after
         * the k - remaining larger keys. */
        unsigned eqb[TOPK_SMALL_PER];
#pragma unroll
        for (int j = 0; j < TOPK_SMALL_PER; j++) {
            eqb[j] = 0;
            if (j < per) {
                eqb[j] = __ballot_sync(0xffffffffu, tid + j * TOPK_THREADS < vocab && key[j] == prefix);
                if (lane == 0) eq_before[j * 32 + warp] = __popc(eqb[j]);
            }
        }
        __syncthreads();
        if (warp == 0) { /* exclusive scan of per * 32 counts: lane l takes per of them */
            int cnt[TOPK_SMALL_PER], sum = 0;
#pragma unroll
            for (int q = 0; q < TOPK_SMALL_PER; q++) {
                cnt[q] = q < per ? eq_before[lane * per + q] : 0;
                sum += cnt[q];
            }
            int incl = sum;
            for (int o = 1; o < 32; o <<= 1) {
                const int up = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += up;
            }
            int acc = incl - sum;
#pragma unroll
            for (int q = 0; q < TOPK_SMALL_PER; q++) {
                if (q < per) eq_before[lane * per + q] = acc;
                acc += cnt[q];
            }
        }
        __syncthreads();
        const int first = k - (int)remaining;
#pragma unroll
        for (int j = 0; j < TOPK_SMALL_PER; j++) {
            if (j < per && ((eqb[j] >> lane) & 1u)) {
                const int r = eq_before[j * 32 + warp] + __popc(eqb[j] & lt_mask);
                if (r < (int)remaining) kept[first + r] = pair_word(key[j], tid + j * TOPK_THREADS);
            }
        }
    }
    __syncthreads();
    if (tid < k) {
        const unsigned long long mine = kept[tid];
        int rank = 0;
#pragma unroll 8
        for (int j = 0; j < k; j++) rank += kept[j] > mine;
        const size_t o = (size_t)blockIdx.x * (size_t)k + (size_t)rank;
        logq[o] = key_float((uint32_t)(mine >> 32)) - s_lse;
        token[o] = (int32_t)~(uint32_t)mine;
    }
}

/* ------------------------------------------------------------------ build */

/*
 * The best-first loop, warp-parallel.  The CPU's heap (best_first.h) holds
 * exactly one entry per built node: that node's next child to try, rank r at
 * depth depth + 1 with weight fp32(logw + logq[depth][r]), alive while r < K and
 * depth < D.  So here every node keeps that candidate in shared memory, and
 * each lane of the warp keeps the best candidate among the nodes it owns
 * (node i belongs to lane i % 32).  A step:
 *  1. the lanes' bests are reduced to the maximum weight; when it is held by
 *     more than one candidate (exact ties, rare) the lowest rank tuple wins,
 *     found by walking parents — the heap's own order, so the winner is the
 *     entry the heap would pop;
 *  2. a run of the winner's siblings is popped at once: ranks r, r+1, ... of
 *     the same parent while each is strictly heavier than every other
 *     candidate and than the first child of rank r (every child the run
 *     creates weighs at most that); each is the heap's next pop by the same
 *     argument, so the run only saves steps, never changes the order;
 *  3. the nodes are appended, the parent's candidate moves past the run, each
 *     new node gets its rank-0 child as candidate, and the owning lanes update
 *     their bests (the winner's lane re-reduces its nodes with one warp op).
 * Weights are formed exactly as on the CPU: fp32(parent logw + logq) for every
 * node, the root's children included; no FMA is involved.
 */

/* A padding row i of tree t: the root's token under the root, seeing the root and
 * itself (a valid tree row; its logits are never read).  The auto build pads up to
 * its verify bucket with it and the graft the rows it freed. */
static __device__ __forceinline__ void pad_row(const ddt_cuda_tree &t, int i, int32_t root) {
    t.token[i] = root;
    t.parent[i] = 0;
    t.depth[i] = 1;
    t.rank[i] = -1;
    t.logw[i] = -INFINITY;
    uint64_t *vrow = t.vis + (size_t)i * (size_t)t.vis_words;
    for (int w = 0; w < t.vis_words; w++)
        vrow[w] = (w == 0 ? 1ull : 0ull) | (w == (i >> 6) ? 1ull << (i & 63) : 0ull);
}

/* One built node; 16 bytes, so one shared load fetches all of it. */
typedef struct build_node {
    float logw;
    int32_t parent, depth, rank;
} build_node;

/* Order key of a candidate weight; 0 means no candidate.  -0 and +0 get one key
 * because the CPU's `!=` treats them as equal (a tie, broken by the tuple). */
static __device__ __forceinline__ uint32_t weight_key(float w) {
    return w == 0.0f ? 0x80000000u : float_key(w);
}

/* For two candidates of equal weight, (a, ra) and (b, rb) — node and the rank of
 * its next child — true when the first pops first: the lower rank tuple
 * (root-down ranks of the node, then the candidate's rank), a prefix first. */
static __device__ bool tuple_before(const build_node *nd, int a, int ra, int b, int rb) {
    if (a == b) return ra < rb;
    int xa = a, xb = b, ca = ra, cb = rb;
    int da = nd[a].depth, db = nd[b].depth;
    for (; da > db; da--) {
        ca = nd[xa].rank;
        xa = nd[xa].parent;
    }
    for (; db > da; db--) {
        cb = nd[xb].rank;
        xb = nd[xb].parent;
    }
    while (xa != xb) { /* below the common ancestor, ca and cb are the ranks that differ */
        ca = nd[xa].rank;
        xa = nd[xa].parent;
        cb = nd[xb].rank;
        xb = nd[xb].parent;
    }
    if (ca != cb) return ca < cb;
    return nd[a].depth < nd[b].depth; /* not reached for distinct candidates */
}

/* Slow path of a step: the candidate of key `key` with the lowest tuple.
 * Called by the whole warp; every lane returns the same node. */
static __device__ int resolve_tie(const build_node *nd, const uint2 *cand, int n, uint32_t key) {
    const unsigned full = 0xffffffffu;
    int bi = -1, br = 0;
    for (int i = (int)(threadIdx.x & 31); i < n; i += 32) {
        uint2 c = cand[i];
        if (c.x == key && (bi < 0 || tuple_before(nd, i, (int)c.y, bi, br))) {
            bi = i;
            br = (int)c.y;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        int oi = __shfl_xor_sync(full, bi, o), orank = __shfl_xor_sync(full, br, o);
        if (oi >= 0 && (bi < 0 || tuple_before(nd, oi, orank, bi, br))) {
            bi = oi;
            br = orank;
        }
    }
    return bi;
}

/* A lane's best candidate: key, node, and whether another of its nodes has the
 * same key.  (Caching the node's fields here too, to save a shared load per
 * step, measured slower on the H200: one warp hides no latency, so the step
 * costs what its instruction count costs, and the cache adds shuffles.) */
static __device__ __forceinline__ void lane_merge(uint32_t key, int idx, uint32_t *bkey, int *bidx,
                                                  bool *btie) {
    if (key > *bkey) {
        *bkey = key;
        *bidx = idx;
        *btie = false;
    } else if (key == *bkey && key != 0u) {
        *btie = true;
    }
}

/*
 * The auto budget's early stop.  The cut (bucket_cut below) keeps a prefix of
 * the pop order, so the build may stop as soon as no bucket still short of its
 * end can win, and the cut over the shorter build is the cut over the full one.
 * While it builds, the warp keeps phi over nodes 1..n-1 in bucket_cut's order
 * and doubles, and `best` = bucket_cut's theta over the complete buckets (end
 * <= n - 1; these come first, as the buckets rise).  Stop when every
 * incomplete bucket j (end b, den = draft + vcost[b] > 0) has
 *     (1 + phi + (b - (n - 1)) * w) * (1 + 1e-9) <= best * den,
 * w = exp_det(logw of the last node) * (1 + 1e-6).  Why that is exact:
 *  - with logq <= 0 (checked on every depth's rank 0; rows are sorted) the pop
 *    order's logw never rises: children and next siblings weigh no more than
 *    the node popped;
 *  - exp_det is not monotone to the ulp: over every float <= 0 a lower x gives
 *    at most 1.00000008x the value at a higher one (exhaustive CPU check,
 *    tests/core/test_budget.c), so w bounds every later node's term;
 *  - rounding is monotone, and the sequential sum of up to 1024 terms differs
 *    from the real one by < 2e-13 relative; the 1e-9 margin takes that, so j's
 *    theta with the full build, and its theta clamped to the n built (what
 *    bucket_cut computes for it after the stop), are both <= best;
 *  - a bucket wins only when strictly greater than every earlier one, and best
 *    belongs to an earlier bucket, so j cannot win, ties included.
 * Not stopping (a positive logq, den <= 0, NaN) only costs the full build.
 */
typedef struct auto_stop {
    double phi, best, den; /* den: this lane's bucket's draft + vcost */
    int bend;              /* this lane's bucket end, INT_MAX past the buckets */
    int jc, next;          /* first incomplete bucket, and its end */
    int bj;                /* the first of the highest theta among the complete buckets */
    bool on;               /* the stop is allowed at all */
} auto_stop;

static __device__ void auto_stop_init(auto_stop *s, const ddt_cuda_tree_auto *a, const float *sq,
                                      int ld, int D) {
    const unsigned full = 0xffffffffu;
    const int lane = (int)(threadIdx.x & 31);
    const int nb = a->n_buckets;
    s->bend = lane < nb ? a->bucket[lane] : INT_MAX;
    s->den = lane < nb ? (double)a->draft_cost + (double)a->vcost[s->bend] : 0.0;
    s->phi = 0.0;
    s->best = 0.0;
    s->jc = 0;
    s->bj = 0;
    s->on = __all_sync(full, lane >= D || sq[(size_t)lane * (size_t)ld] <= 0.0f) && nb > 1;
    if (__shfl_sync(full, s->bend, 0) == 0) { /* a bucket of the root alone: complete already */
        s->best = (1.0 + s->phi) / __shfl_sync(full, s->den, 0);
        s->jc = 1;
    }
    s->next = __shfl_sync(full, s->bend, s->jc);
}

/* After a step that appended nodes n0..n0+m-1, lane l < m holding node n0+l's
 * logw in w: phi over the new nodes one at a time (bucket_cut's order), the
 * theta of each bucket this completes, then the test above.  Warp-uniform. */
static __device__ bool auto_stop_step(auto_stop *s, const ddt_cuda_tree_auto *a, float w, int n0, int m) {
    const unsigned full = 0xffffffffu;
    const int lane = (int)(threadIdx.x & 31);
    const float e = lane < m ? ddt_exp_det(w) : 0.0f;
    for (int i = 0; i < m; i++) {
        s->phi = s->phi + (double)__shfl_sync(full, e, i);
        if (n0 + i == s->next) { /* buckets rise: at most one ends at a node */
            const double th = (1.0 + s->phi) / __shfl_sync(full, s->den, s->jc);
            if (s->jc == 0 || th > s->best) {
                s->best = th;
                s->bj = s->jc;
            }
            s->jc++;
            s->next = __shfl_sync(full, s->bend, s->jc & 31);
        }
    }
    if (s->jc == 0 || s->jc >= a->n_buckets) return false; /* nothing to compare, or nothing left */
    const int last = n0 + m - 1;
    const double wl = (double)__shfl_sync(full, e, m - 1) * (1.0 + 1e-6);
    bool lose = true;
    if (lane >= s->jc && lane < a->n_buckets) {
        const double num = 1.0 + s->phi + (double)(s->bend - last) * wl;
        lose = s->den > 0.0 && num * (1.0 + 1e-9) <= s->best * s->den;
    }
    return __all_sync(full, lose);
}

/*
 * Runs the loop in one warp.  sq: the table's logq staged in shared memory,
 * [depth][ld] with ld = min(want + 1, K) (no rank above `want` is ever read).
 * AUTO (a: the cost table) adds the early stop above; the fixed budget's
 * instance has none of it.  Returns the node count including the root, in
 * every lane.
 */
template <bool AUTO>
static __device__ int build_warp(const float *sq, int ld, int D, int want, build_node *nd,
                                 uint2 *cand, const ddt_cuda_tree_auto *a, auto_stop &st) {
    const unsigned full = 0xffffffffu;
    const int lane = (int)(threadIdx.x & 31);
    if (AUTO) auto_stop_init(&st, a, sq, ld, D);
    uint32_t bkey = 0u;
    int bidx = -1;
    bool btie = false;
    if (lane == 0) {
        build_node root = {0.0f, -1, 0, -1};
        nd[0] = root;
        bkey = want > 0 ? weight_key(0.0f + sq[0]) : 0u;
        bidx = 0;
        cand[0] = make_uint2(bkey, 0u);
    }
    int n = 1;
    __syncwarp();
    while (n - 1 < want) {
        /* 1. the heaviest candidate; ties go to the slow path */
        const uint32_t top = __reduce_max_sync(full, bkey);
        if (top == 0u) break; /* frontier empty */
        const unsigned hold = __ballot_sync(full, bkey == top);
        const unsigned tied = __ballot_sync(full, bkey == top && btie);
        const int p = (__popc(hold) == 1 && !tied) ? __shfl_sync(full, bidx, __ffs(hold) - 1)
                                                   : resolve_tie(nd, cand, n, top);
        const int owner = p & 31;
        const build_node pn = nd[p];
        const int r = (int)cand[p].y;
        const int d = pn.depth + 1; /* depth of the nodes this step adds */
        /* the owner's other candidates; the best candidate anywhere but p's */
        const int q = owner + 32 * lane;
        const uint32_t kq = (q < n && q != p) ? cand[q].x : 0u;
        const uint32_t own_best = __reduce_max_sync(full, kq);
        const uint32_t others = __reduce_max_sync(full, max(lane == owner ? 0u : bkey, kq));
        const unsigned own_at = __ballot_sync(full, own_best != 0u && kq == own_best);
        /* 2. lane k looks at sibling rank r + k and its first child */
        const float *row = sq + (size_t)(d - 1) * (size_t)ld;
        const int rk = r + lane;
        const bool have = rk < ld; /* ld <= K; and r + run <= want < ld whenever r + run < K */
        float w = 0.0f;
        if (have) w = pn.logw + row[rk];
        const uint32_t wkey = have ? weight_key(w) : 0u;
        const bool leaf = d >= D;
        const float next0 = leaf ? 0.0f : sq[(size_t)d * (size_t)ld];
        const float c0 = (pn.logw + row[r]) + next0; /* first child of rank r (lane 0's w) */
        const bool more = have && lane < 31 && n - 1 + lane < want && wkey > others &&
                          (leaf || w > c0);
        const unsigned run = __ballot_sync(full, lane == 0 || more);
        const int m = __ffs(~run) - 1; /* leading pops, 1..31 */
        __syncwarp();                  /* this step's reads before its writes */
        /* 3. append; the parent's candidate moves to rank r + m */
        const uint32_t ckey = leaf ? 0u : weight_key(w + next0);
        if (lane < m) {
            build_node v = {w, p, d, rk};
            nd[n + lane] = v;
            cand[n + lane] = make_uint2(ckey, 0u);
        }
        const uint32_t pkey = __shfl_sync(full, wkey, m); /* 0 when r + m >= K */
        if (lane == m) cand[p] = make_uint2(pkey, (uint32_t)rk);
        if (lane == owner) {
            bkey = own_best;
            bidx = own_best ? owner + 32 * (__ffs(own_at) - 1) : -1;
            btie = __popc(own_at) > 1;
            lane_merge(pkey, p, &bkey, &bidx, &btie);
        }
        const int k = (lane - n) & 31; /* the new node this lane owns, if k < m */
        const uint32_t nkey = __shfl_sync(full, ckey, k);
        if (k < m) lane_merge(nkey, n + k, &bkey, &bidx, &btie);
        n += m;
        __syncwarp();
        if (AUTO && st.on && auto_stop_step(&st, a, w, n - m, m)) break;
    }
    return n;
}

typedef struct build_params {
    const float *logq;
    const int32_t *tok;
    int32_t depth, k, want, vocab;
    int32_t ld; /* staged columns: min(want + 1, k) */
    ddt_cuda_tree t;
    ddt_cuda_tree_auto a; /* a.vcost NULL: a fixed budget */
} build_params;

/*
 * The auto budget's cut over the built nodes (pop order = index order), run by
 * one warp: the device twin of ddt_cost_bucket_cut (src/core/budget.c), same
 * doubles: exp_det of each node's logw (lanes in parallel), phi accumulated in
 * node order by one lane, then theta at each bucket end, the first of the
 * highest winning.  `phi` is scratch of n doubles.  Returns the nodes kept,
 * root included, and the bucket in *index, in every lane.
 */
static __device__ int bucket_cut(const ddt_cuda_tree_auto *a, const build_node *nd, double *phi, int n,
                                 int *index) {
    const unsigned full = 0xffffffffu;
    const int lane = (int)(threadIdx.x & 31);
    for (int i = 1 + lane; i < n; i += 32) phi[i] = (double)ddt_exp_det(nd[i].logw);
    __syncwarp();
    int keep = 1, bj = 0;
    if (lane == 0) {
        double acc = 0.0;
        phi[0] = 0.0;
        for (int i = 1; i < n; i++) {
            acc = acc + phi[i];
            phi[i] = acc;
        }
        double best = 0.0;
        for (int j = 0; j < a->n_buckets; j++) {
            const int m = a->bucket[j] < n - 1 ? a->bucket[j] : n - 1;
            const double th = (1.0 + phi[m]) / ((double)a->draft_cost + (double)a->vcost[a->bucket[j]]);
            if (j == 0 || th > best) {
                best = th;
                keep = m + 1;
                bj = j;
            }
        }
    }
    *index = __shfl_sync(full, bj, 0);
    return __shfl_sync(full, keep, 0);
}


/*
 * bucket_cut's result from the early stop's scan (auto_stop), without a second pass
 * over the nodes: the scan holds theta's best over the complete buckets (those that
 * end at or before the last node built, in order, the first of the highest) and phi
 * over every node built, which is phi[n - 1] of bucket_cut.  The buckets left end
 * past the last node (m = n - 1), so each is (1 + phi) / den, one lane each; the
 * first of the highest over them wins only above the complete buckets' best, so the
 * pick is bucket_cut's, same doubles, same bits.  Warp-uniform.
 */
static __device__ int stop_cut(const auto_stop *s, const ddt_cuda_tree_auto *a, int n, int *index) {
    const unsigned full = 0xffffffffu;
    const int lane = (int)(threadIdx.x & 31);
    const bool mine = lane >= s->jc && lane < a->n_buckets;
    const double th = mine ? (1.0 + s->phi) / s->den : -INFINITY;
    double top = th;
    for (int o = 16; o > 0; o >>= 1) top = fmax(top, __shfl_xor_sync(full, top, o));
    const unsigned at = __ballot_sync(full, mine && th == top);
    if (at && (s->jc == 0 || top > s->best)) {
        *index = __ffs(at) - 1;
        return n;
    }
    *index = s->bj;
    return __shfl_sync(full, s->bend, s->bj) + 1;
}

/* Shared memory for the staged table at the largest D x K (opted in at alloc). */
#define BUILD_STAGE_BYTES (DDT_MAX_DEPTH * DDT_MAX_TOPK * 4)

/*
 * The draft calibration over the staged table (rows of `ld` columns), the bits of
 * ddt_cal_apply (core/calibration.c): each cell through ddt_cal_cell (detmath,
 * no FMA: the library builds with --fmad=false), then each row's running minimum
 * as a warp's min-scan, 32 ranks at a time with the carry (a minimum is exact in
 * any order).  Warps take rows in turn; called by every thread of the block, and
 * ends with a barrier.
 */
static __device__ void calibrate_stage(const ddt_draft_calibration *c, float *s_logq, int depth, int ld) {
    const unsigned full = 0xffffffffu;
    const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5), nw = (int)(blockDim.x >> 5);
    for (int d = warp; d < depth; d += nw) {
        float carry = 0.0f;
        for (int c0 = 0; c0 < ld; c0 += 32) {
            const int r = c0 + lane;
            float v = r < ld ? ddt_cal_cell(c, s_logq[d * ld + r], d, r) : INFINITY;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float u = __shfl_up_sync(full, v, o);
                if (lane >= o) v = fminf(v, u);
            }
            if (c0 > 0) v = fminf(v, carry);
            if (r < ld) s_logq[d * ld + r] = v;
            carry = __shfl_sync(full, v, 31);
        }
    }
    __syncthreads();
}

/*
 * One block.  All threads check the table and stage its first `ld` columns of
 * logq in shared memory (and calibrate them: t.cal_on); warp 0 runs the loop; all threads write the nodes and
 * the visibility rows.  AUTO: p.a.vcost is set (the cost-aware cut); two
 * instances so that the fixed budget's carries none of the auto code.  One
 * block an SM (__launch_bounds__'s 1): at the default 32 registers ptxas spilled
 * 20 bytes of the fixed budget's instance, two reloads inside warp 0's pop loop;
 * with the bound it takes 40 and spills none.
 */
template <bool AUTO>
static __global__ void __launch_bounds__(BUILD_THREADS, 1) tree_build_kernel(build_params p) {
    DDT_GRID_DEP_WAIT();
    __shared__ int s_bad, s_n, s_rows, s_bucket;
    __shared__ build_node s_node[DDT_MAX_NODES];
    __shared__ uint2 s_cand[DDT_MAX_NODES]; /* (candidate key, its rank) per node */
    extern __shared__ float s_logq[];        /* [depth][ld] */
    const int tid = threadIdx.x;
    const int ld = p.ld;
    if (tid == 0) s_bad = 0;
    __syncthreads();
    const int32_t root = *p.t.root_token;
    int bad = tid == 0 && (root < 0 || (p.vocab > 0 && root >= p.vocab));
    /* four cells per thread per pass, loads issued together: the check is a
     * latency-bound read of a table that may be 31 x 1024 */
    const int cells = p.depth * p.k, nt = blockDim.x;
    for (int base = 0; base < cells; base += 4 * nt) {
        float v[4], prev[4];
        int32_t tk[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int e = base + u * nt + tid;
            v[u] = e < cells ? __ldg(p.logq + e) : 0.0f;
            prev[u] = e < cells && e % p.k ? __ldg(p.logq + e - 1) : INFINITY;
            tk[u] = e < cells ? __ldg(p.tok + e) : 0;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int e = base + u * nt + tid;
            if (e >= cells) continue;
            const int d = e / p.k, r = e - d * p.k;
            bad |= !(v[u] < INFINITY); /* NaN or +inf */
            if (r > 0) bad |= !(v[u] <= prev[u]); /* sorted descending; NaN fails too */
            bad |= tk[u] < 0 || (p.vocab > 0 && tk[u] >= p.vocab);
            if (r < ld) s_logq[d * ld + r] = v[u];
        }
    }
    if (bad) atomicOr(&s_bad, 1);
    __syncthreads();
    if (p.t.cal_on && !s_bad) calibrate_stage(&p.t.cal, s_logq, p.depth, ld); /* uniform: every thread */
    if (s_bad) {
        /* never hand a bad table's tree to verify: a root-only tree */
        if (tid == 0) {
            build_node v = {0.0f, -1, 0, -1};
            s_node[0] = v;
            s_n = 1;
            *p.t.status = DDT_CUDA_TREE_BAD_TABLE;
            *p.t.n_nodes = 1;
        }
    } else if (tid < 32) {
        auto_stop st;
        int n = build_warp<AUTO>(s_logq, ld, p.depth, p.want, s_node, s_cand, AUTO ? &p.a : NULL, st);
        /* the candidates are spent: their slots hold the cut's phi (8 bytes each) */
        int bj = 0;
        if (AUTO) {
            if (p.a.built && tid == 0) *p.a.built = n;
            const int n_built = n;
            /* the stop's scan has every complete bucket's theta: only the rest are left */
            n = st.on ? stop_cut(&st, &p.a, n, &bj) : bucket_cut(&p.a, s_node, (double *)s_cand, n, &bj);
            if (p.a.choice && tid == 0) *p.a.choice = bj;
            if (p.a.capped && bj > p.a.cap) { /* this graph verifies bucket cap: its prefix (pop order) */
                bj = p.a.cap;
                n = (p.a.bucket[bj] < n_built - 1 ? p.a.bucket[bj] : n_built - 1) + 1;
            }
        }
        if (tid == 0) {
            s_bucket = bj;
            s_n = n;
            *p.t.status = DDT_CUDA_TREE_OK;
            *p.t.n_nodes = n;
        }
    }
    __syncthreads();
    if (tid == 0) {
        int rows = s_n;
        if (AUTO) {
            const int j = s_bad ? 0 : s_bucket; /* a bad table: the root alone, in the first bucket */
            rows = p.a.bucket[p.a.capped ? p.a.cap : j] + 1; /* capped: the graph's verify size */
        }
        s_rows = rows;
    }
    __syncthreads();
    const int n = s_n, words = p.t.vis_words;
    /* padding up to the verify bucket (pad_row) */
    for (int i = n + tid; i < s_rows; i += blockDim.x) pad_row(p.t, i, root);
    for (int i = tid; i < n; i += blockDim.x) {
        const build_node v = s_node[i];
        p.t.token[i] = i == 0 ? root : p.tok[(size_t)(v.depth - 1) * (size_t)p.k + v.rank];
        p.t.parent[i] = v.parent;
        p.t.depth[i] = v.depth;
        p.t.rank[i] = v.rank;
        p.t.logw[i] = v.logw;
        /* visibility: the row of node i holds its ancestors and itself; they come
         * in falling index order, so each word is written once, high to low */
        uint64_t *vrow = p.t.vis + (size_t)i * (size_t)words;
        int cur = i >> 6;
        for (int w = words - 1; w > cur; w--) vrow[w] = 0;
        uint64_t mask = 0;
        for (int a = i; a >= 0; a = s_node[a].parent) {
            for (; cur > (a >> 6); cur--) {
                vrow[cur] = mask;
                mask = 0;
            }
            mask |= 1ull << (a & 63);
        }
        for (; cur >= 0; cur--) {
            vrow[cur] = mask;
            mask = 0;
        }
    }
}

/* ------------------------------------------------------------------ graft */

#define GRAFT_THREADS 256

typedef struct graft_params {
    ddt_cuda_tree t;
    const int32_t *prop; /* host memory the device reads: [0] length, [1] match length, [2..] tokens */
    int32_t budget;      /* use_n: the built tree's node count - 1 instead (the auto budget's cut) */
    int use_n;
    int32_t *count;      /* grafted nodes, summed (device [1]) */
} graft_params;

/*
 * The context lookup's path grafted onto the built tree, the device twin of
 * ddt_tree_graft (core/tree.c), same plan and same bits: the path's twins found
 * by one warp over the staged nodes (a node of the tree whose parent is the previous
 * twin and whose token is the path's), the merge by weight in one thread over the staged pop
 * order, the appended nodes and their visibility rows (parents first: one thread
 * a word), the rows the graft freed padded as the auto build pads (root token,
 * under the root, seeing it and itself), then the node count.  The proposal is
 * the host's (it knows the context), read from pinned host memory: the host wrote
 * it before launching the round and the device reads it once.  A length of 0 (no
 * match) leaves the tree.
 */
static __global__ void __launch_bounds__(GRAFT_THREADS) tree_graft_kernel(graft_params p) {
    DDT_GRID_DEP_LATER(); /* the proposal first: no kernel writes it (the wait follows) */
    __shared__ int32_t s_prop[2 + DDT_MAX_DEPTH], s_twin[DDT_MAX_DEPTH], s_len, s_keep, s_n;
    __shared__ int32_t s_par[DDT_MAX_NODES], s_tok[DDT_MAX_NODES];
    __shared__ float s_v[DDT_MAX_DEPTH], s_logw[DDT_MAX_NODES];
    __shared__ int32_t s_apar[DDT_MAX_DEPTH]; /* parent of each appended node */
    const int tid = threadIdx.x;
    /* The proposal is the host's, written before the round was launched: read
       before the wait on the build (its PCIe round trip overlaps the build), one
       word a thread, all in one trip (read by one thread, as before, each word
       was a round trip of its own) */
    if (tid < 2 + DDT_MAX_DEPTH) s_prop[tid] = ((const volatile int32_t *)p.prop)[tid];
    DDT_GRID_DEP_WAIT();
    __syncthreads();
    if (tid == 0) {
        int len = s_prop[0];
        const int ml = s_prop[1];
        if (len < 0 || len > DDT_MAX_DEPTH || ml < DDT_LOOKUP_MIN || ml > DDT_LOOKUP_MAX || !p.t.cal_on ||
            !p.t.cal.lookup)
            len = 0;
        s_len = len;
        if (len > 0) ddt_cal_lookup_weights(&p.t.cal, ml, len, s_v);
    }
    __syncthreads();
    const int len = s_len, n = *p.t.n_nodes;
    if (len == 0 || n < 1) return;
    const int32_t *s_path = s_prop + 2;
    const int budget = p.use_n ? n - 1 : p.budget;
    for (int i = tid; i < n; i += blockDim.x) {
        s_logw[i] = p.t.logw[i];
        s_par[i] = p.t.parent[i];
        s_tok[i] = p.t.token[i];
    }
    __syncthreads();
    /* the twins, prefix by prefix, by warp 0 over the staged nodes: at most one
       node matches (siblings' tokens differ), so the ballot has at most one bit */
    if (tid < 32) {
        int prev = 0;
        for (int j = 0; j < len; j++) {
            int found = -1;
            if (prev >= 0)
                for (int c0 = 1; c0 < n; c0 += 32) {
                    const int c = c0 + tid;
                    const unsigned hit =
                        __ballot_sync(0xffffffffu, c < n && s_par[c] == prev && s_tok[c] == s_path[j]);
                    if (hit) {
                        found = c0 + __ffs(hit) - 1;
                        break;
                    }
                }
            prev = found;
            if (tid == 0) s_twin[j] = prev;
        }
    }
    __syncthreads();
    if (tid == 0) {
        /* the merge by weight: the CPU's lines (core/graft_merge.h) over the staged nodes */
        int32_t i = 0;
        const int32_t j = ddt_graft_merge(s_logw, n, s_twin, s_v, len, budget, &i);
        /* the appended nodes: tokens, parents, depths, weights */
        int m = i, parent = 0;
        for (int q = 0; q < j; q++) {
            if (s_twin[q] >= 1 && s_twin[q] < i) {
                parent = s_twin[q];
                continue;
            }
            p.t.token[m] = s_path[q];
            p.t.parent[m] = parent;
            p.t.depth[m] = p.t.depth[parent] + 1;
            p.t.rank[m] = -1;
            p.t.logw[m] = s_v[q];
            s_apar[m - i] = parent;
            parent = m++;
        }
        s_keep = i;
        s_n = m;
        if (m > i) atomicAdd(p.count, m - i);
    }
    __syncthreads();
    const int keep = s_keep, m = s_n, words = p.t.vis_words;
    /* visibility of the appended nodes, in order (a node's parent may be one of them) */
    for (int w = tid; w < words; w += blockDim.x)
        for (int a = keep; a < m; a++) {
            const int par = s_apar[a - keep];
            p.t.vis[(size_t)a * words + w] =
                p.t.vis[(size_t)par * words + w] | (w == (a >> 6) ? 1ull << (a & 63) : 0ull);
        }
    /* the rows the graft freed, padded */
    const int32_t root = *p.t.root_token;
    for (int r = m + tid; r < n; r += blockDim.x) pad_row(p.t, r, root);
    __syncthreads();
    if (tid == 0) *p.t.n_nodes = m;
}

extern "C" ddt_status ddt_cuda_tree_graft(ddt_cuda_tree *t, const int32_t *prop, int32_t budget, bool use_n,
                                          int32_t *count, ddt_cuda_stream stream, ddt_error *err) {
    if (!t || !prop || !count) return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_tree_graft: NULL argument");
    if (!use_n && (budget < 0 || budget > t->capacity - 1))
        return ddt_fail(err, DDT_ERR_RANGE, "graft budget %d outside 0..%d", budget, t->capacity - 1);
    graft_params p;
    p.t = *t;
    p.prop = prop;
    p.budget = budget;
    p.use_n = use_n ? 1 : 0;
    p.count = count;
    tree_graft_kernel<<<1, GRAFT_THREADS, 0, (cudaStream_t)stream>>>(p);
    DDT_CUDA_LAUNCHED("tree_graft", (cudaStream_t)stream, err);
    return DDT_OK;
}

/* ------------------------------------------------------------------ argmax */

/*
 * One block per row; blocks past the live row count (*n_rows, on the device)
 * leave before reading.  A thread reads ARGMAX_UNROLL loads into registers
 * before comparing any, so they are all in flight at once; float4 loads when
 * every row starts 16-byte aligned (VEC: vocab % 4 == 0 and an aligned base,
 * chosen on the host from those shapes), single floats otherwise.  The rule
 * everywhere: the larger value wins, equal values (+0.0 and -0.0 included) go
 * to the lower id, NaN never wins; a row of NaN gives -1, which the walk rejects.
 */
#define ARGMAX_UNROLL 8

static __device__ __forceinline__ void argmax_take(float v, int i, float &best, int &bi) {
    if (v > best || (v == best && i < bi)) {
        best = v;
        bi = i;
    }
}

template <bool VEC>
static __global__ void __launch_bounds__(1024) argmax_rows_kernel(const float *__restrict__ logits, const int32_t *n_rows,
                                          int vocab, int32_t *__restrict__ out) {
    DDT_GRID_DEP_WAIT();
    __shared__ float sv[32];
    __shared__ int si[32];
    if ((int)blockIdx.x >= *n_rows) return;
    const float *z = logits + (size_t)blockIdx.x * (size_t)vocab;
    const int nt = (int)blockDim.x, tid = (int)threadIdx.x;
    float best = -INFINITY;
    int bi = INT_MAX;
    if (VEC) {
        const float4 *z4 = (const float4 *)z;
        const int n4 = vocab >> 2;
        for (int base = tid; base < n4; base += ARGMAX_UNROLL * nt) {
            float4 q[ARGMAX_UNROLL];
#pragma unroll
            for (int u = 0; u < ARGMAX_UNROLL; u++) {
                const int i = base + u * nt;
                if (i < n4) q[u] = __ldg(z4 + i);
            }
#pragma unroll
            for (int u = 0; u < ARGMAX_UNROLL; u++) {
                const int i = base + u * nt;
                if (i < n4) {
                    argmax_take(q[u].x, 4 * i, best, bi);
                    argmax_take(q[u].y, 4 * i + 1, best, bi);
                    argmax_take(q[u].z, 4 * i + 2, best, bi);
                    argmax_take(q[u].w, 4 * i + 3, best, bi);
                }
            }
        }
    } else {
        for (int base = tid; base < vocab; base += ARGMAX_UNROLL * nt) {
            float q[ARGMAX_UNROLL];
#pragma unroll
            for (int u = 0; u < ARGMAX_UNROLL; u++) {
                const int i = base + u * nt;
                if (i < vocab) q[u] = __ldg(z + i);
            }
#pragma unroll
            for (int u = 0; u < ARGMAX_UNROLL; u++) {
                const int i = base + u * nt;
                if (i < vocab) argmax_take(q[u], i, best, bi);
            }
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, best, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
        argmax_take(v2, i2, best, bi);
    }
    const int warp = tid >> 5, lane = tid & 31, nw = nt >> 5;
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        best = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : INT_MAX;
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, best, o);
            const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            argmax_take(v2, i2, best, bi);
        }
        if (lane == 0) out[blockIdx.x] = bi == INT_MAX ? -1 : bi;
    }
}

/* ------------------------------------------------------------------ accept */

#define ACCEPT_THREADS 256

/*
 * One block.  The threads check the whole tree in parallel (parents below their
 * children, depths consistent and capped, tokens and targets in range) and, in
 * the same pass, record for every node the lowest-index child whose token is
 * the node's target (shared-memory atomicMin); thread 0 then follows those
 * links from the root, so the walk is a chain of at most DDT_MAX_PATH - 1
 * shared loads, bounded whatever the input.  Same result as searching each
 * node's children for the lowest matching index, as the CPU walk does.
 */
static __global__ void __launch_bounds__(ACCEPT_THREADS)
tree_accept_kernel(ddt_cuda_tree t, const int32_t *__restrict__ target_next, int vocab) {
    DDT_GRID_DEP_WAIT();
    __shared__ int32_t s_child[DDT_MAX_NODES]; /* lowest matching child, INT_MAX if none */
    __shared__ int s_bad_tree, s_bad_target;
    const int tid = threadIdx.x;
    const int n = *t.n_nodes;
    const int bad_n = n < 1 || n > t.capacity || n > DDT_MAX_NODES;
    if (tid == 0) {
        s_bad_tree = bad_n;
        s_bad_target = 0;
    }
    for (int i = tid; i < DDT_MAX_NODES; i += blockDim.x) s_child[i] = INT_MAX;
    __syncthreads();
    if (!bad_n) {
        int bad_tree = 0, bad_target = 0;
        for (int i = tid; i < n; i += blockDim.x) {
            const int32_t tok = t.token[i], tn = target_next[i];
            bad_tree |= tok < 0 || (vocab > 0 && tok >= vocab);
            bad_target |= tn < 0 || (vocab > 0 && tn >= vocab);
            if (i == 0) {
                bad_tree |= t.parent[0] != -1 || t.depth[0] != 0;
            } else {
                const int32_t pa = t.parent[i];
                if (pa < 0 || pa >= i) {
                    bad_tree = 1;
                } else {
                    bad_tree |= t.depth[i] != t.depth[pa] + 1 || t.depth[i] > DDT_MAX_DEPTH;
                    if (target_next[pa] == tok) atomicMin(&s_child[pa], i);
                }
            }
        }
        if (bad_tree) atomicOr(&s_bad_tree, 1);
        if (bad_target) atomicOr(&s_bad_target, 1);
    }
    __syncthreads();
    if (tid != 0) return;
    if (s_bad_tree || s_bad_target) {
        *t.status = s_bad_tree ? DDT_CUDA_TREE_BAD_TREE : DDT_CUDA_TREE_BAD_TARGET;
        *t.path_len = 0;
        *t.bonus = -1;
        return;
    }
    int cur = 0, len = 1;
    t.path[0] = 0;
    for (;;) {
        const int c = s_child[cur];
        if (c == INT_MAX || len >= DDT_MAX_PATH) break;
        t.path[len++] = c;
        cur = c;
    }
    const int32_t bonus = target_next[cur];
    *t.path_len = len;
    *t.bonus = bonus;
    *t.root_token = bonus;
    *t.status = DDT_CUDA_TREE_OK;
}

/* ------------------------------------------------------------------ launchers */

extern "C" ddt_status ddt_cuda_tree_alloc(int32_t max_budget, ddt_cuda_tree *t, ddt_error *err) {
    if (!t) return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_tree_alloc: tree is NULL");
    memset(t, 0, sizeof *t);
    if (max_budget < 0 || max_budget > DDT_MAX_BUDGET)
        return ddt_fail(err, DDT_ERR_RANGE, "max budget %d outside 0..%d", max_budget,
                        DDT_MAX_BUDGET);
    const size_t cap = (size_t)max_budget + 1;
    t->capacity = (int32_t)cap;
    t->vis_words = (int32_t)((cap + 63) / 64);
    DDT_CUDA_TRY(cudaMalloc((void **)&t->token, cap * sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMalloc((void **)&t->parent, cap * sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMalloc((void **)&t->depth, cap * sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMalloc((void **)&t->rank, cap * sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMalloc((void **)&t->logw, cap * sizeof(float)), err);
    DDT_CUDA_TRY(cudaMalloc((void **)&t->vis, cap * (size_t)t->vis_words * sizeof(uint64_t)), err);
    DDT_CUDA_TRY(cudaMalloc((void **)&t->n_nodes, sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMalloc((void **)&t->status, sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMalloc((void **)&t->root_token, sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMalloc((void **)&t->path, DDT_MAX_PATH * sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMalloc((void **)&t->path_len, sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMalloc((void **)&t->bonus, sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaFuncSetAttribute(tree_build_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      BUILD_STAGE_BYTES),
                 err);
    DDT_CUDA_TRY(cudaFuncSetAttribute(tree_build_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      BUILD_STAGE_BYTES),
                 err);
    DDT_CUDA_TRY(cudaMemset(t->n_nodes, 0, sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMemset(t->status, 0, sizeof(int32_t)), err);
    DDT_CUDA_TRY(cudaMemset(t->root_token, 0, sizeof(int32_t)), err);
    return DDT_OK;
}

extern "C" void ddt_cuda_tree_free(ddt_cuda_tree *t) {
    if (!t) return;
    void *ptrs[] = {t->token, t->parent, t->depth, t->rank, t->logw, t->vis, t->n_nodes,
                    t->status, t->root_token, t->path, t->path_len, t->bonus};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        if (ptrs[i]) cudaFree(ptrs[i]);
    memset(t, 0, sizeof *t);
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

extern "C" size_t ddt_cuda_topk_workspace_bytes(int32_t rows, int32_t vocab, int32_t k) {
    if (rows < 1 || vocab < 1 || k < 1) return 0;
    size_t chunks = ((size_t)vocab + TOPK_CHUNK - 1) / TOPK_CHUNK;
    size_t parts = (size_t)rows * chunks;
    return 2 * align256(parts * sizeof(float)) + align256(parts * (size_t)k * sizeof(uint32_t)) +
           align256(parts * (size_t)k * sizeof(int32_t));
}

extern "C" ddt_status ddt_cuda_topk_logsoftmax(const float *logits, int32_t rows, int32_t vocab,
                                               int32_t k, float *logq, int32_t *token,
                                               void *workspace, size_t workspace_bytes,
                                               ddt_cuda_stream stream, ddt_error *err) {
    if (!logits || !logq || !token || !workspace)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_topk_logsoftmax: NULL buffer");
    if (rows < 1 || vocab < 1 || k < 1 || k > DDT_MAX_TOPK || k > vocab)
        return ddt_fail(err, DDT_ERR_RANGE,
                        "top-K: rows %d, vocab %d, k %d (need rows >= 1, 1 <= k <= min(vocab, %d))",
                        rows, vocab, k, DDT_MAX_TOPK);
    size_t need = ddt_cuda_topk_workspace_bytes(rows, vocab, k);
    if (workspace_bytes < need)
        return ddt_fail(err, DDT_ERR_RANGE, "top-K workspace of %zu bytes, needs %zu",
                        workspace_bytes, need);
    const int chunks = (vocab + TOPK_CHUNK - 1) / TOPK_CHUNK;
    const size_t parts = (size_t)rows * (size_t)chunks;
    char *w = (char *)workspace;
    float *part_max = (float *)w;
    w += align256(parts * sizeof(float));
    float *part_sum = (float *)w;
    w += align256(parts * sizeof(float));
    uint32_t *cand_key = (uint32_t *)w;
    w += align256(parts * (size_t)k * sizeof(uint32_t));
    int32_t *cand_id = (int32_t *)w;
    cudaStream_t st = (cudaStream_t)stream;
    if (vocab <= TOPK_SMALL_VOCAB) { /* by shape only; the workspace goes unused */
        topk_small_kernel<<<rows, TOPK_THREADS, 0, st>>>(logits, vocab, k, logq, token);
        DDT_CUDA_LAUNCHED("topk_small", st, err);
        return DDT_OK;
    }
    topk_chunk_kernel<<<dim3(chunks, rows), TOPK_THREADS, 0, st>>>(logits, vocab, k, chunks,
                                                                  part_max, part_sum, cand_key,
                                                                  cand_id);
    DDT_CUDA_LAUNCHED("topk_chunk", st, err);
    topk_merge_kernel<<<rows, TOPK_THREADS, 0, st>>>(k, chunks, part_max, part_sum, cand_key,
                                                     cand_id, logq, token);
    DDT_CUDA_LAUNCHED("topk_merge", st, err);
    return DDT_OK;
}

static ddt_status build_launch(ddt_cuda_tree *t, const float *logq, const int32_t *token,
                               int32_t depth, int32_t k, int32_t budget, int32_t vocab,
                               const ddt_cuda_tree_auto *a, ddt_cuda_stream stream,
                               ddt_error *err) {
    if (!t || !logq || !token) return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_tree_build: NULL argument");
    if (depth < 1 || depth > DDT_MAX_DEPTH || k < 1 || k > DDT_MAX_TOPK)
        return ddt_fail(err, DDT_ERR_RANGE, "table %d x %d outside 1..%d x 1..%d", depth, k,
                        DDT_MAX_DEPTH, DDT_MAX_TOPK);
    if (budget < 0 || budget > t->capacity - 1)
        return ddt_fail(err, DDT_ERR_RANGE, "budget %d outside 0..%d", budget, t->capacity - 1);
    int64_t table_nodes = 0, level = 1;
    for (int32_t d = 0; d < depth && table_nodes < budget; d++) {
        level = level * k > DDT_MAX_NODES ? DDT_MAX_NODES : level * k;
        table_nodes += level;
    }
    build_params p;
    p.logq = logq;
    p.tok = token;
    p.depth = depth;
    p.k = k;
    p.want = (int32_t)(table_nodes < budget ? table_nodes : budget);
    p.vocab = vocab;
    p.t = *t;
    memset(&p.a, 0, sizeof p.a);
    if (a) p.a = *a;
    /* ranks 0..want can be read (the parent's next candidate after a pop of rank want - 1) */
    p.ld = p.want + 1 < k ? p.want + 1 : k;
    const size_t stage = (size_t)depth * (size_t)p.ld * sizeof(float);
    if (p.a.vcost)
        tree_build_kernel<true><<<1, BUILD_THREADS, stage, (cudaStream_t)stream>>>(p);
    else
        tree_build_kernel<false><<<1, BUILD_THREADS, stage, (cudaStream_t)stream>>>(p);
    DDT_CUDA_LAUNCHED("tree_build", (cudaStream_t)stream, err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_tree_build(ddt_cuda_tree *t, const float *logq,
                                          const int32_t *token, int32_t depth, int32_t k,
                                          int32_t budget, int32_t vocab, ddt_cuda_stream stream,
                                          ddt_error *err) {
    return build_launch(t, logq, token, depth, k, budget, vocab, NULL, stream, err);
}

extern "C" ddt_status ddt_cuda_tree_build_auto(ddt_cuda_tree *t, const float *logq,
                                               const int32_t *token, int32_t depth, int32_t k,
                                               int32_t budget, int32_t vocab,
                                               const ddt_cuda_tree_auto *a, ddt_cuda_stream stream,
                                               ddt_error *err) {
    if (!a || !a->vcost) return ddt_fail(err, DDT_ERR_INVALID, "auto build: no verify cost table");
    if (!(a->draft_cost >= 0.0f) || !isfinite(a->draft_cost))
        return ddt_fail(err, DDT_ERR_INVALID, "auto build: draft cost %g must be finite and >= 0",
                        (double)a->draft_cost);
    if (a->n_buckets < 1 || a->n_buckets > DDT_CUDA_TREE_MAX_BUCKETS)
        return ddt_fail(err, DDT_ERR_RANGE, "auto build: %d verify buckets, allowed 1..%d", a->n_buckets,
                        DDT_CUDA_TREE_MAX_BUCKETS);
    for (int32_t j = 0; j < a->n_buckets; j++)
        if (a->bucket[j] < 0 || (j > 0 && a->bucket[j] <= a->bucket[j - 1]))
            return ddt_fail(err, DDT_ERR_INVALID, "auto build: verify bucket %d = %d must be >= 0 and rising", j,
                            a->bucket[j]);
    if (a->bucket[a->n_buckets - 1] != budget)
        return ddt_fail(err, DDT_ERR_INVALID, "auto build: the last verify bucket %d must be the budget %d",
                        a->bucket[a->n_buckets - 1], budget);
    if (a->capped && (a->cap < 0 || a->cap >= a->n_buckets))
        return ddt_fail(err, DDT_ERR_INVALID, "auto build: cap at bucket %d of %d", a->cap, a->n_buckets);
    return build_launch(t, logq, token, depth, k, budget, vocab, a, stream, err);
}


extern "C" ddt_status ddt_cuda_argmax_rows(const float *logits, int32_t max_rows,
                                           const int32_t *n_rows, int32_t vocab,
                                           int32_t *target_next, ddt_cuda_stream stream,
                                           ddt_error *err) {
    if (!logits || !n_rows || !target_next)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_argmax_rows: NULL argument");
    if (max_rows < 1 || vocab < 1)
        return ddt_fail(err, DDT_ERR_RANGE, "argmax: %d rows of %d", max_rows, vocab);
    /* long rows get more threads, so more of the row is in flight per block */
    const int threads = vocab >= 65536 ? 1024 : 256;
    const bool vec = vocab % 4 == 0 && ((uintptr_t)logits & 15u) == 0;
    if (vec)
        argmax_rows_kernel<true><<<max_rows, threads, 0, (cudaStream_t)stream>>>(logits, n_rows, vocab,
                                                                                target_next);
    else
        argmax_rows_kernel<false><<<max_rows, threads, 0, (cudaStream_t)stream>>>(logits, n_rows, vocab,
                                                                                 target_next);
    DDT_CUDA_LAUNCHED("argmax_rows", (cudaStream_t)stream, err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_tree_accept(ddt_cuda_tree *t, const int32_t *target_next,
                                           int32_t vocab, ddt_cuda_stream stream, ddt_error *err) {
    if (!t || !target_next) return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_tree_accept: NULL argument");
    tree_accept_kernel<<<1, ACCEPT_THREADS, 0, (cudaStream_t)stream>>>(*t, target_next, vocab);
    DDT_CUDA_LAUNCHED("tree_accept", (cudaStream_t)stream, err);
    return DDT_OK;
}

static __global__ void tree_emit_kernel(ddt_cuda_tree t, int32_t *out) {
    DDT_GRID_DEP_WAIT();
    const int len = *t.path_len;
    if (len < 1 || len > DDT_MAX_PATH) {
        out[DDT_CUDA_EMIT_NODES] = *t.n_nodes;
        out[0] = 0;
        out[1] = *t.status ? *t.status : DDT_CUDA_TREE_BAD_TREE;
        return;
    }
    out[DDT_CUDA_EMIT_NODES] = *t.n_nodes;
    out[0] = len;
    out[1] = *t.status;
    for (int k = 1; k < len; k++) out[1 + k] = t.token[t.path[k]];
    out[1 + len] = *t.bonus;
}

extern "C" ddt_status ddt_cuda_tree_emit(const ddt_cuda_tree *t, int32_t *out, ddt_cuda_stream stream, ddt_error *err) {
    if (!t || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_tree_emit: NULL argument");
    tree_emit_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(*t, out);
    DDT_CUDA_LAUNCHED("tree_emit", (cudaStream_t)stream, err);
    return DDT_OK;
}
