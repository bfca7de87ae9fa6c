/*
 * sample_cuda.cu — the tree nodes' target samples on the GPU (see sample_cuda.h),
 * the twin of core/sampler.c: one block of 1024 threads per node.
 *
 *  1. max m (lowest id on ties) and the NaN / inf checks: a block reduction
 *     (order-free: max is exact).
 *  2. No top-k: the candidates are all ids in ascending order, cut into the CPU's
 *     chunks of 1024; warp c sums chunk c sequentially, its lanes computing 32
 *     weights at a time (ddt_exp_det, recomputed where needed: the same bits each
 *     time; up to 6 chunks they are computed once into shared memory and replaced
 *     by the running sums), thread 0 adds the chunk totals sequentially, and the
 *     first position whose cumulative sum exceeds u * mass is the block minimum
 *     of each chunk's first.
 *  3. Top-k (k <= 1024): a 4-pass 8-bit radix select on an order-preserving key
 *     (-0.0 folded into +0.0, as the CPU's comparisons see them) finds the k-th
 *     largest logit; the larger ones are gathered in any order, the equal ones in
 *     increasing id (an ordered ballot pass when some must be left out); a
 *     bitonic sort puts the k in the CPU's canonical order ((z desc, id asc)
 *     with top-p, id asc without); thread 0 then runs the CPU's loop over them
 *     (one chunk: k <= 1024).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/sample_cuda.h"
#include "core/detmath.h"

#define SMP_THREADS 1024
#define SMP_CHUNK 1024 /* the CPU's DDT_SAMPLE_CHUNK */
#define SMP_MAX_VOCAB (SMP_CHUNK * SMP_THREADS)
#define SMP_SMALL_CHUNKS 6 /* 24 KB of weights in shared memory: vocabularies up to 6144 */

struct SampleArgs {
    const float *logits;
    int64_t ld;
    int32_t vocab;
    float temperature, top_p;
    int32_t top_k;
    uint64_t seed;
    const uint64_t *round_dev;
    uint64_t round;
    const ddt_cuda_sample_params *params_dev; /* when set: every setting and the round from here */
    uint32_t node0;
    int32_t *tokens;
};

/* core/sampler.c's Philox4x32-10 and uniform, the same integer operations */
static __device__ float smp_uniform(uint64_t seed, uint64_t round, uint32_t node) {
    uint32_t c0 = node, c1 = 0u, c2 = (uint32_t)round, c3 = (uint32_t)(round >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return (float)(c0 >> 8) * (1.0f / 16777216.0f);
}

/* top-k as the kernel takes it: 0 when off (k <= 0 or k >= vocab keeps every id) */
static __host__ __device__ __forceinline__ int32_t smp_topk(int32_t top_k, int32_t vocab) {
    return top_k > 0 && top_k < vocab ? top_k : 0;
}

/* The settings the device samples (one rule for the host's check and the kernel's):
 * argmax always; else top-k up to 1024, and top-p only with top-k on (top-p alone
 * needs a sort of the whole vocabulary, which the host does). */
static __host__ __device__ __forceinline__ bool smp_takes(float temperature, int32_t top_k, float top_p,
                                                          int32_t vocab) {
    if (vocab < 1 || vocab > SMP_MAX_VOCAB || !(temperature >= 0.0f)) return false;
    if (temperature == 0.0f) return true;
    const int32_t k = smp_topk(top_k, vocab);
    return k > 0 ? k <= DDT_CUDA_SAMPLE_MAX_TOPK : !(top_p < 1.0f);
}

/* larger key = larger logit; -0.0 and +0.0 share a key (they compare equal) */
static __device__ __forceinline__ uint32_t smp_key(float z) {
    const uint32_t u = z == 0.0f ? 0u : __float_as_uint(z);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ bool smp_before(uint32_t ka, int32_t ia, uint32_t kb, int32_t ib, bool by_key) {
    if (by_key && ka != kb) return ka > kb;
    return ia < ib;
}

/* One step of a chunk's running sum, by the whole warp: lane j holds weight w of
 * the step's id j; every lane adds the 32 weights to s in id order (the CPU's
 * chain), and lane j gets back the running sum after id j.  A lane past the
 * chunk's end holds w = +0.0, and s + 0.0 = s for the running sum (s >= +0). */
static __device__ __forceinline__ float smp_scan32(float w, int lane, float &s) {
    float mine = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; j++) {
        s += __shfl_sync(0xffffffffu, w, j);
        if (j == lane) mine = s;
    }
    return mine;
}

static __global__ void __launch_bounds__(SMP_THREADS) sample_kernel(SampleArgs a) {
    DDT_GRID_DEP_WAIT();
    if (a.params_dev) {
        const ddt_cuda_sample_params p = *a.params_dev;
        a.temperature = p.temperature;
        a.top_p = p.top_p;
        a.top_k = smp_topk(p.top_k, a.vocab);
        a.seed = p.seed;
        a.round = p.round;
        a.round_dev = nullptr;
        if (!smp_takes(p.temperature, p.top_k, p.top_p, a.vocab)) {
            if (threadIdx.x == 0) a.tokens[blockIdx.x] = -1; /* settings the device does not take */
            return;
        }
    }
    __shared__ float wmax[32];
    __shared__ int32_t wid[32], wflag[32];
    __shared__ uint32_t hist[256];
    __shared__ uint32_t ckey[SMP_CHUNK];
    __shared__ int32_t cid[SMP_CHUNK];
    __shared__ float ctot[SMP_THREADS], cpre[SMP_THREADS];
    __shared__ float cw[SMP_SMALL_CHUNKS * SMP_CHUNK]; /* the weights of a small vocabulary */
    __shared__ int32_t s_best, s_bad, s_pick, s_ngt, s_neq;
    __shared__ uint32_t s_prefix, s_want, s_counteq;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float *z = a.logits + (int64_t)blockIdx.x * a.ld;
    const int32_t V = a.vocab;
    const uint32_t node = a.node0 + blockIdx.x;

    /* ---- 1. argmax (lowest id on ties), NaN / +inf */
    float bv = -INFINITY;
    int32_t bi = -1, bad = 0;
    for (int32_t i = tid; i < V; i += SMP_THREADS) {
        const float v = z[i];
        if (v != v) bad = 1;
        if (bi < 0 || v > bv) bv = v, bi = i; /* strided: the first of equal ones in this thread */
    }
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
    bad = __any_sync(0xffffffffu, bad);
    if (lane == 0) wmax[warp] = bv, wid[warp] = bi, wflag[warp] = bad;
    __syncthreads();
    if (tid == 0) {
        float m = wmax[0];
        int32_t mi = wid[0], b = wflag[0];
        for (int w = 1; w < 32; w++) {
            b |= wflag[w];
            if (wid[w] >= 0 && (mi < 0 || wmax[w] > m || (wmax[w] == m && wid[w] < mi))) m = wmax[w], mi = wid[w];
        }
        s_best = mi;
        s_bad = b;
        wmax[0] = m;
    }
    __syncthreads();
    const float m = wmax[0];
    if (s_bad) { /* the CPU's "logit is NaN" */
        if (tid == 0) a.tokens[blockIdx.x] = -1;
        return;
    }
    if (a.temperature == 0.0f) {
        if (tid == 0) a.tokens[blockIdx.x] = s_best;
        return;
    }
    if (m == -INFINITY || m == INFINITY) { /* every logit -inf, or one +inf */
        if (tid == 0) a.tokens[blockIdx.x] = -1;
        return;
    }
    const float T = a.temperature;
    const uint64_t round = a.round_dev ? *a.round_dev : a.round;
    const float u = smp_uniform(a.seed, round, node);

    if (a.top_k <= 0 || a.top_k >= V) {
        /* ---- 2. every id, ascending, in chunks of 1024: one warp a chunk.  The
           chunk's running sum is one dependent chain of float adds whatever is done
           (the CPU's order), so the chain is all a warp waits on: its 32 lanes
           compute (or read) 32 weights at once and every lane adds them in id order
           through shuffles, lane j keeping the running sum after id j.  One thread
           a chunk reading each weight before adding it cost ~20 us a pass at 4352
           ids (the load's latency in every step of the chain). */
        const int nch = (V + SMP_CHUNK - 1) / SMP_CHUNK;
        /* a vocabulary of at most SMP_SMALL_CHUNKS chunks: every weight computed
           once into shared memory, then overwritten by its chunk's running sum, so
           the search below is one parallel pass */
        const bool small = nch <= SMP_SMALL_CHUNKS;
        if (small) {
            for (int32_t i = tid; i < V; i += SMP_THREADS) cw[i] = ddt_exp_det((z[i] - m) / T);
            __syncthreads();
        }
        for (int c = warp; c < nch; c += SMP_THREADS / 32) {
            const int32_t c0 = c * SMP_CHUNK, c1 = c0 + SMP_CHUNK < V ? c0 + SMP_CHUNK : V;
            float s = 0.0f;
            for (int32_t base = c0; base < c1; base += 32) {
                const int32_t i = base + lane;
                const float w = i < c1 ? (small ? cw[i] : ddt_exp_det((z[i] - m) / T)) : 0.0f;
                const float mine = smp_scan32(w, lane, s);
                if (small && i < c1) cw[i] = mine; /* this lane's weight was read above */
            }
            if (lane == 0) ctot[c] = s;
        }
        __syncthreads();
        if (tid == 0) {
            float prefix = 0.0f;
            for (int c = 0; c < nch; c++) {
                cpre[c] = prefix;
                prefix += ctot[c];
            }
            /* cum(n - 1) = the last chunk's prefix + its sum, as the CPU adds it */
            wmax[1] = cpre[nch - 1] + ctot[nch - 1];
            s_pick = 0x7FFFFFFF;
        }
        __syncthreads();
        const float target = u * wmax[1];
        /* the first id whose cum = its chunk's prefix + running sum exceeds target */
        if (small) {
            int32_t first = 0x7FFFFFFF;
            for (int32_t i = tid; i < V; i += SMP_THREADS)
                if (cpre[i / SMP_CHUNK] + cw[i] > target) {
                    first = i;
                    break; /* strided ascending: this thread's first */
                }
            for (int off = 16; off > 0; off >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, off));
            if (lane == 0 && first != 0x7FFFFFFF) atomicMin(&s_pick, first);
        } else {
            for (int c = warp; c < nch; c += SMP_THREADS / 32) {
                const int32_t c0 = c * SMP_CHUNK, c1 = c0 + SMP_CHUNK < V ? c0 + SMP_CHUNK : V;
                float s = 0.0f;
                for (int32_t base = c0; base < c1; base += 32) {
                    const int32_t i = base + lane;
                    const float w = i < c1 ? ddt_exp_det((z[i] - m) / T) : 0.0f;
                    const float mine = smp_scan32(w, lane, s);
                    const uint32_t hit = __ballot_sync(0xffffffffu, i < c1 && cpre[c] + mine > target);
                    if (hit) {
                        if (lane == 0) atomicMin(&s_pick, base + __ffs(hit) - 1);
                        break; /* this chunk's first; a later chunk's can only be larger */
                    }
                }
            }
        }
        __syncthreads();
        if (s_pick == 0x7FFFFFFF) { /* u * mass rounded up to the mass: the last weighted id */
            if (tid == 0) s_pick = 0;
            __syncthreads();
            for (int32_t i = tid; i < V; i += SMP_THREADS)
                if (ddt_exp_det((z[i] - m) / T) != 0.0f) atomicMax(&s_pick, i);
            __syncthreads();
        }
        if (tid == 0) a.tokens[blockIdx.x] = s_pick;
        return;
    }

    /* ---- 3. top-k: radix select of the k-th largest key */
    const int32_t k = a.top_k;
    if (tid == 0) s_prefix = 0u, s_want = (uint32_t)k;
    uint32_t mask = 0u;
    for (int shift = 24; shift >= 0; shift -= 8) {
        if (tid < 256) hist[tid] = 0u;
        __syncthreads();
        const uint32_t prefix = s_prefix;
        for (int32_t i = tid; i < V; i += SMP_THREADS) {
            const uint32_t key = smp_key(z[i]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            uint32_t above = 0u, want = s_want;
            int d = 255;
            for (; d > 0; d--) {
                if (above + hist[d] >= want) break;
                above += hist[d];
            }
            s_want = want - above;
            s_prefix = prefix | ((uint32_t)d << shift);
            s_counteq = hist[d];
        }
        mask |= 255u << shift;
        __syncthreads();
    }
    const uint32_t thr = s_prefix, want = s_want, counteq = s_counteq;
    /* gather: the k - want larger ones anywhere in [0, k - want), the equal ones after */
    if (tid == 0) s_ngt = 0, s_neq = 0;
    __syncthreads();
    for (int32_t i = tid; i < V; i += SMP_THREADS) {
        const uint32_t key = smp_key(z[i]);
        if (key > thr) {
            const int p = atomicAdd(&s_ngt, 1);
            ckey[p] = key, cid[p] = i;
        } else if (key == thr && counteq == want) {
            const int p = atomicAdd(&s_neq, 1);
            ckey[k - (int32_t)want + p] = key, cid[k - (int32_t)want + p] = i;
        }
    }
    if (counteq != want) { /* only the want lowest ids of the equal ones: an ordered pass */
        int32_t taken = 0;
        for (int32_t base = 0; base < V && taken < (int32_t)want; base += SMP_THREADS) {
            const int32_t i = base + tid;
            const bool eq = i < V && smp_key(z[i]) == thr;
            const uint32_t bal = __ballot_sync(0xffffffffu, eq);
            __syncthreads(); /* the previous iteration's readers of wid are done */
            if (lane == 0) wid[warp] = __popc(bal);
            __syncthreads();
            int32_t before = 0, total = 0;
            for (int w = 0; w < 32; w++) {
                if (w < warp) before += wid[w];
                total += wid[w];
            }
            const int32_t pos = taken + before + __popc(bal & ((1u << lane) - 1u));
            if (eq && pos < (int32_t)want) ckey[k - (int32_t)want + pos] = thr, cid[k - (int32_t)want + pos] = i;
            taken += total;
        }
    }
    __syncthreads();
    /* bitonic sort of the k into the canonical order (pads last) */
    const bool by_key = a.top_p < 1.0f;
    int P = 1;
    while (P < k) P <<= 1;
    if (tid >= k && tid < P) ckey[tid] = 0u, cid[tid] = 0x7FFFFFFF;
    __syncthreads();
    for (int size = 2; size <= P; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            if (tid < P) {
                const int j = tid ^ stride;
                if (j > tid) {
                    const bool up = (tid & size) == 0;
                    const bool jfirst = smp_before(ckey[j], cid[j], ckey[tid], cid[tid], by_key);
                    if (jfirst == up) {
                        const uint32_t tk = ckey[tid];
                        const int32_t ti = cid[tid];
                        ckey[tid] = ckey[j], cid[tid] = cid[j];
                        ckey[j] = tk, cid[j] = ti;
                    }
                }
            }
            __syncthreads();
        }
    /* the CPU's loop over the k (one chunk: cum(i) = 0 + s(i)) */
    if (tid == 0) {
        float *cum = ctot, *wt = cpre;
        float s = 0.0f;
        for (int32_t i = 0; i < k; i++) {
            wt[i] = ddt_exp_det((z[cid[i]] - m) / T);
            s += wt[i];
            cum[i] = 0.0f + s;
        }
        int32_t n = k;
        if (by_key) {
            const float limit = a.top_p * cum[n - 1];
            int32_t j = 0;
            while (j < n - 1 && !(cum[j] >= limit)) j++;
            n = j + 1;
        }
        const float target = u * cum[n - 1];
        int32_t pick = -1;
        for (int32_t i = 0; i < n; i++)
            if (cum[i] > target) {
                pick = i;
                break;
            }
        if (pick < 0) {
            pick = n - 1;
            while (pick > 0 && wt[pick] == 0.0f) pick--;
        }
        a.tokens[blockIdx.x] = cid[pick];
    }
}

extern "C" bool ddt_cuda_sample_supported(const ddt_sampling *s, int32_t vocab) {
    return s && smp_takes(s->temperature, s->top_k, s->top_p, vocab);
}

/* One block per node. */
static ddt_status sample_launch(const SampleArgs &a, int32_t n_nodes, cudaStream_t stream, ddt_error *err) {
    sample_kernel<<<(unsigned)n_nodes, SMP_THREADS, 0, stream>>>(a);
    DDT_CUDA_LAUNCHED("sample_nodes", stream, err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_sample_nodes(const float *logits, int64_t ld, int32_t n_nodes, int32_t vocab,
                                            const ddt_sampling *s, const uint64_t *round_dev, uint64_t round,
                                            uint32_t node0, int32_t *tokens, ddt_cuda_stream stream,
                                            ddt_error *err) {
    if (!logits || !tokens || !s || n_nodes < 1 || n_nodes > 65535 || ld < vocab)
        return ddt_fail(err, DDT_ERR_INVALID, "sample_nodes: missing arguments, %d nodes or row stride %lld < %d",
                        n_nodes, (long long)ld, vocab);
    ddt_status st = ddt_sampling_check(s, err);
    if (st != DDT_OK) return st;
    if (!ddt_cuda_sample_supported(s, vocab))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "sample_nodes: top_k %d / top_p %g over %d tokens is sampled on the host (the device takes "
                        "top-k <= %d, and top-p only with it)",
                        s->top_k, (double)s->top_p, vocab, DDT_CUDA_SAMPLE_MAX_TOPK);
    SampleArgs a;
    memset(&a, 0, sizeof a);
    a.logits = logits;
    a.ld = ld;
    a.vocab = vocab;
    a.temperature = s->temperature;
    a.top_p = s->top_p;
    a.top_k = smp_topk(s->top_k, vocab);
    a.seed = s->seed;
    a.round_dev = round_dev;
    a.round = round;
    a.node0 = node0;
    a.tokens = tokens;
    return sample_launch(a, n_nodes, (cudaStream_t)stream, err);
}

extern "C" ddt_status ddt_cuda_sample_nodes_dev(const float *logits, int64_t ld, int32_t n_nodes, int32_t vocab,
                                                const ddt_cuda_sample_params *params_dev, uint32_t node0,
                                                int32_t *tokens, ddt_cuda_stream stream, ddt_error *err) {
    if (!logits || !tokens || !params_dev || n_nodes < 1 || n_nodes > 65535 || ld < vocab || vocab < 1 ||
        vocab > SMP_MAX_VOCAB)
        return ddt_fail(err, DDT_ERR_INVALID, "sample_nodes_dev: missing arguments, %d nodes, %d tokens", n_nodes,
                        vocab);
    SampleArgs a;
    memset(&a, 0, sizeof a);
    a.logits = logits;
    a.ld = ld;
    a.vocab = vocab;
    a.params_dev = params_dev;
    a.node0 = node0;
    a.tokens = tokens;
    return sample_launch(a, n_nodes, (cudaStream_t)stream, err);
}
