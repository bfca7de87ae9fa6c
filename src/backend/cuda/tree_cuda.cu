/*
 * tree_cuda.cu — the DDTree round's tree kernels (see tree_cuda.h): top-K of the
 * drafter's logits, the best-first build, argmax per node, and the walk.
 *
 * The build runs the very loop the CPU runs (src/core/best_first.h, compiled for
 * the device) in one thread, because a best-first pop depends on every previous
 * pop; the surrounding work — checking the table, the visibility bitsets — is
 * spread over the block.  Compiled with --fmad=false so the deterministic exp of
 * the cost-aware budget gives the CPU's bits.
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/tree_cuda.h"
#include "core/best_first.h"

#define TOPK_THREADS 1024
#define BUILD_THREADS 256

static_assert(DDT_MAX_TOPK == TOPK_THREADS, "top-K sorts one candidate per thread");

/* ------------------------------------------------------------------ helpers */

/* Order-preserving map of a float to an unsigned key (larger float, larger key). */
static __device__ __forceinline__ uint32_t float_key(float f) {
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
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
 * Two stages, so the whole GPU works on a few long rows:
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
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        for (int i = tid; i < n; i += blockDim.x) {
            uint32_t key = src.k(i);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            unsigned cum = 0;
            s_bin = 0;
            s_remaining = remaining;
            for (int b = 255; b >= 0; b--) {
                if (cum + hist[b] >= remaining) {
                    s_bin = (unsigned)b;
                    s_remaining = remaining - cum;
                    break;
                }
                cum += hist[b];
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
    /* bitonic sort into "before" order: key desc, id asc */
    for (int size = 2; size <= TOPK_THREADS; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            int i = tid, j = tid ^ stride;
            if (j > i) {
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
        s_key[i] = float_key(v);
        m = fmaxf(m, v);
    }
    m = block_max(m, fscratch);
    float s = 0.0f;
    for (int i = tid; i < len; i += blockDim.x) s += expf(key_float(s_key[i]) - m);
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

/* ------------------------------------------------------------------ build */

typedef struct build_params {
    const float *logq;
    const int32_t *tok;
    int32_t depth, k, want, vocab;
    int32_t stage_cols; /* columns of the table staged in shared memory, 0 = read from global */
    ddt_cuda_tree t;
} build_params;

/* Dynamic shared memory the build may use for the staged table (opted in at alloc). */
#define BUILD_STAGE_BYTES (160 * 1024)

/*
 * One block.  Thread 0 runs the best-first loop with the heap and the node
 * arrays in shared memory (a pop is a chain of dependent loads, so their latency
 * is the whole cost); the block checks the table before and writes the node
 * arrays and the visibility bitsets out in parallel after.
 */
static __global__ void __launch_bounds__(BUILD_THREADS) tree_build_kernel(build_params p) {
    __shared__ int s_bad, s_n;
    __shared__ ddt_bf_entry s_heap[DDT_MAX_NODES + 1];
    __shared__ int32_t s_token[DDT_MAX_NODES], s_parent[DDT_MAX_NODES], s_depth[DDT_MAX_NODES],
        s_rank[DDT_MAX_NODES], s_maxrank[DDT_MAX_DEPTH];
    __shared__ float s_logw[DDT_MAX_NODES];
    extern __shared__ float s_stage[]; /* [depth][stage_cols] logq, then [depth][stage_cols] tokens */
    const int tid = threadIdx.x;
    const int sc = p.stage_cols;
    int32_t *s_stage_tok = (int32_t *)(s_stage + (size_t)p.depth * (size_t)sc);
    if (tid == 0) s_bad = 0;
    __syncthreads();
    const int32_t root = *p.t.root_token;
    int bad = tid == 0 && (root < 0 || (p.vocab > 0 && root >= p.vocab));
    const int cells = p.depth * p.k;
    for (int e = tid; e < cells; e += blockDim.x) {
        int r = e % p.k;
        float v = p.logq[e];
        bad |= !(v < INFINITY) || v != v;
        if (r > 0) bad |= !(v <= p.logq[e - 1]);
        bad |= p.tok[e] < 0 || (p.vocab > 0 && p.tok[e] >= p.vocab);
        /* the best-first loop is a chain of dependent loads: give it the table's
         * leading columns (all it can ever read) from shared memory */
        if (r < sc) {
            s_stage[(e / p.k) * sc + r] = v;
            s_stage_tok[(e / p.k) * sc + r] = p.tok[e];
        }
    }
    if (bad) atomicOr(&s_bad, 1);
    __syncthreads();
    if (tid == 0) {
        if (s_bad) {
            /* never hand a bad table's tree to verify: a root-only tree */
            *p.t.status = DDT_CUDA_TREE_BAD_TABLE;
            s_token[0] = root;
            s_parent[0] = -1;
            s_depth[0] = 0;
            s_rank[0] = -1;
            s_logw[0] = 0.0f;
            s_n = 1;
        } else {
            ddt_bf_args a;
            a.logq = sc ? s_stage : p.logq;
            a.token = sc ? s_stage_tok : p.tok;
            a.depth = p.depth;
            a.k = p.k;
            a.ld = sc ? sc : p.k;
            a.want = p.want;
            a.root_token = root;
            a.vcost = NULL;
            a.draft_cost = 0.0f;
            a.heap = s_heap;
            a.out_token = s_token;
            a.out_parent = s_parent;
            a.out_depth = s_depth;
            a.out_rank = s_rank;
            a.out_logw = s_logw;
            a.max_rank = s_maxrank;
            s_n = ddt_best_first(&a);
            *p.t.status = DDT_CUDA_TREE_OK;
        }
        *p.t.n_nodes = s_n;
    }
    __syncthreads();
    const int n = s_n, words = p.t.vis_words;
    for (int i = tid; i < n; i += blockDim.x) {
        p.t.token[i] = s_token[i];
        p.t.parent[i] = s_parent[i];
        p.t.depth[i] = s_depth[i];
        p.t.rank[i] = s_rank[i];
        p.t.logw[i] = s_logw[i];
        /* visibility: each node's row is the set of its ancestors and itself */
        uint64_t *row = p.t.vis + (size_t)i * (size_t)words;
        for (int w = 0; w < words; w++) row[w] = 0;
        for (int a = i; a >= 0; a = s_parent[a]) row[a >> 6] |= 1ull << (a & 63);
    }
}

/* ------------------------------------------------------------------ argmax */

static __global__ void argmax_rows_kernel(const float *__restrict__ logits, const int32_t *n_rows,
                                          int vocab, int32_t *__restrict__ out) {
    __shared__ float sv[32];
    __shared__ int si[32];
    if ((int)blockIdx.x >= *n_rows) return;
    const float *z = logits + (size_t)blockIdx.x * (size_t)vocab;
    float best = -INFINITY;
    int bi = INT_MAX;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = z[i];
        if (v > best || (v == best && i < bi)) { /* NaN never wins */
            best = v;
            bi = i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, best, o);
        int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
        if (v2 > best || (v2 == best && i2 < bi)) {
            best = v2;
            bi = i2;
        }
    }
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        best = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : INT_MAX;
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_xor_sync(0xffffffffu, best, o);
            int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            if (v2 > best || (v2 == best && i2 < bi)) {
                best = v2;
                bi = i2;
            }
        }
        if (lane == 0) out[blockIdx.x] = bi == INT_MAX ? -1 : bi; /* all NaN: -1, the walk rejects it */
    }
}

/* ------------------------------------------------------------------ accept */

/*
 * One warp.  The lanes check the whole tree in parallel (parents below their
 * children, depths consistent and capped, tokens and targets in range); then
 * each step searches the current node's children with all lanes and takes the
 * lowest matching index, so the walk is bounded by the depth cap and the node
 * count whatever the input.
 */
static __global__ void tree_accept_kernel(ddt_cuda_tree t, const int32_t *__restrict__ target_next,
                                          int vocab) {
    const int lane = threadIdx.x;
    const unsigned full = 0xffffffffu;
    const int n = *t.n_nodes;
    int bad_tree = n < 1 || n > t.capacity, bad_target = 0;
    if (!bad_tree) {
        for (int i = lane; i < n; i += 32) {
            int32_t tok = t.token[i], tn = target_next[i];
            bad_tree |= tok < 0 || (vocab > 0 && tok >= vocab);
            bad_target |= tn < 0 || (vocab > 0 && tn >= vocab);
            if (i == 0) {
                bad_tree |= t.parent[0] != -1 || t.depth[0] != 0;
            } else {
                int32_t p = t.parent[i];
                if (p < 0 || p >= i) bad_tree = 1;
                else bad_tree |= t.depth[i] != t.depth[p] + 1 || t.depth[i] > DDT_MAX_DEPTH;
            }
        }
    }
    bad_tree = __any_sync(full, bad_tree);
    bad_target = __any_sync(full, bad_target);
    if (bad_tree || bad_target) {
        if (lane == 0) {
            *t.status = bad_tree ? DDT_CUDA_TREE_BAD_TREE : DDT_CUDA_TREE_BAD_TARGET;
            *t.path_len = 0;
            *t.bonus = -1;
        }
        return;
    }
    int cur = 0, len = 1;
    if (lane == 0) t.path[0] = 0;
    for (;;) {
        const int32_t want = target_next[cur];
        int found = INT_MAX;
        for (int j = cur + 1 + lane; j < n; j += 32)
            if (t.parent[j] == cur && t.token[j] == want) {
                found = j;
                break;
            }
        found = __reduce_min_sync(full, found);
        if (found == INT_MAX || len >= DDT_MAX_PATH) break;
        if (lane == 0) t.path[len] = found;
        len++;
        cur = found;
    }
    if (lane == 0) {
        *t.path_len = len;
        *t.bonus = target_next[cur];
        *t.root_token = target_next[cur];
        *t.status = DDT_CUDA_TREE_OK;
    }
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
    DDT_CUDA_TRY(cudaFuncSetAttribute(tree_build_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
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
                                               ddt_stream stream, ddt_error *err) {
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
    topk_chunk_kernel<<<dim3(chunks, rows), TOPK_THREADS, 0, st>>>(logits, vocab, k, chunks,
                                                                  part_max, part_sum, cand_key,
                                                                  cand_id);
    DDT_CUDA_LAUNCHED("topk_chunk", st, err);
    topk_merge_kernel<<<rows, TOPK_THREADS, 0, st>>>(k, chunks, part_max, part_sum, cand_key,
                                                     cand_id, logq, token);
    DDT_CUDA_LAUNCHED("topk_merge", st, err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_tree_build(ddt_cuda_tree *t, const float *logq,
                                          const int32_t *token, int32_t depth, int32_t k,
                                          int32_t budget, int32_t vocab, ddt_stream stream,
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
    /* ranks 0..want can be read (a sibling push reads rank + 1) */
    int32_t cols = p.want + 1 < k ? p.want + 1 : k;
    size_t stage = (size_t)depth * (size_t)cols * 8;
    p.stage_cols = stage <= BUILD_STAGE_BYTES ? cols : 0;
    tree_build_kernel<<<1, BUILD_THREADS, p.stage_cols ? stage : 0, (cudaStream_t)stream>>>(p);
    DDT_CUDA_LAUNCHED("tree_build", (cudaStream_t)stream, err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_argmax_rows(const float *logits, int32_t max_rows,
                                           const int32_t *n_rows, int32_t vocab,
                                           int32_t *target_next, ddt_stream stream,
                                           ddt_error *err) {
    if (!logits || !n_rows || !target_next)
        return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_argmax_rows: NULL argument");
    if (max_rows < 1 || vocab < 1)
        return ddt_fail(err, DDT_ERR_RANGE, "argmax: %d rows of %d", max_rows, vocab);
    argmax_rows_kernel<<<max_rows, 256, 0, (cudaStream_t)stream>>>(logits, n_rows, vocab,
                                                                   target_next);
    DDT_CUDA_LAUNCHED("argmax_rows", (cudaStream_t)stream, err);
    return DDT_OK;
}

extern "C" ddt_status ddt_cuda_tree_accept(ddt_cuda_tree *t, const int32_t *target_next,
                                           int32_t vocab, ddt_stream stream, ddt_error *err) {
    if (!t || !target_next) return ddt_fail(err, DDT_ERR_INVALID, "ddt_cuda_tree_accept: NULL argument");
    tree_accept_kernel<<<1, 32, 0, (cudaStream_t)stream>>>(*t, target_next, vocab);
    DDT_CUDA_LAUNCHED("tree_accept", (cudaStream_t)stream, err);
    return DDT_OK;
}
