/*
 * mla_cuda.cu — RoPE + cache write and the exact absorbed MLA attention (see
 * mla_cuda.h).
 *
 * Attention: one block of ATTN_THREADS threads per (token, head).  The block
 * lists the token's ancestors by depth (from its visibility row), so that
 * logical position p maps to cache row p (p < len) or len + anc[p - len].
 *
 * The arithmetic of every output element is fixed by the logical positions
 * alone, never by n, by which rows hold the ancestors or by how the work is
 * spread over threads:
 *   score p     lane l sums q[d] * kv[d] over d = l, l + 32, ... (d < rank +
 *               rope) in order, then a fixed xor-shuffle tree; lane 0's sum
 *               times scale is the score;
 *   max         fmaxf over all scores (its value, NaNs dropped, does not depend
 *               on the order; only the sign of a zero could, and exp(s - m)
 *               is the same for m = +0 and m = -0);
 *   sum         "softmax thread" t < 128 sums exp(s_p - m) over p = t, t + 128,
 *               ... in order, then a fixed 128-wide block tree;
 *   output d    sums e_p * kv_p[d] over p = 0, 1, ... in order, times 1 / sum.
 *
 * The kernel is a chain of memory latencies at decode sizes (a few blocks, one
 * per head), so the rows are streamed through shared memory in chunks: all
 * threads load the next chunk into registers (many independent loads in
 * flight) while the current one is computed from shared memory, and the first
 * output chunk is fetched while the last scores and the softmax run.  In a
 * chunk each warp computes SC_U scores at once (independent shuffle trees).
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/mla_cuda.h"

#define ATTN_THREADS 256
#define ATTN_WARPS (ATTN_THREADS / 32)
#define SOFTMAX_THREADS 128 /* the sum's order: part of the contract, unlike ATTN_THREADS */
#define STAGE_MAX 8192      /* floats of the chunk stage (32 KB) */
#define STAGE_PER (STAGE_MAX / ATTN_THREADS) /* stage elements a thread fetches */
#define OUT_CHUNK_MAX 128   /* positions of an output chunk (<= SOFTMAX_THREADS: scs) */
#define SC_U 4              /* scores a warp computes at once */
#define SM_U 4              /* softmax positions a thread loads at once */
#define ROPE_THREADS 128

static __global__ void __launch_bounds__(ROPE_THREADS)
rope_write_kernel(ddt_cuda_mla_rope_args a) {
    DDT_GRID_DEP_WAIT();
    const int i = blockIdx.x, half = a.rope / 2;
    const int pos = *a.len + a.depth[i];
    const int row = *a.len + i;
    const bool bad = pos < 0 || pos >= a.max_pos || row < 0 || row >= a.capacity;
    if (row < 0 || row >= a.capacity) return; /* nowhere to write; the caller checked capacity */
    const float *cs = a.cos_t + (int64_t)(bad ? 0 : pos) * half;
    const float *sn = a.sin_t + (int64_t)(bad ? 0 : pos) * half;
    const int64_t base = (int64_t)row * (a.rank + a.rope);
    float *dst = a.bf16_cache ? NULL : (float *)a.cache + base;
    __nv_bfloat16 *dst16 = a.bf16_cache ? (__nv_bfloat16 *)a.cache + base : NULL;
    for (int d = threadIdx.x; d < a.rank; d += ROPE_THREADS) {
        float v = bad ? NAN : a.kvn[(int64_t)i * a.rank + d];
        if (dst16) dst16[d] = __float2bfloat16(v);
        else dst[d] = v;
    }
    /* k_rope: one thread per rotation pair */
    const float *kr = a.kva + (int64_t)i * a.kva_ld + a.rank;
    for (int p = threadIdx.x; p < half; p += ROPE_THREADS) {
        float x0, x1;
        if (a.interleave) { x0 = kr[2 * p]; x1 = kr[2 * p + 1]; }
        else { x0 = kr[p]; x1 = kr[p + half]; }
        float c = cs[p], s = sn[p];
        float r0 = bad ? NAN : x0 * c - x1 * s, r1 = bad ? NAN : x1 * c + x0 * s;
        if (dst16) {
            dst16[a.rank + p] = __float2bfloat16(r0);
            dst16[a.rank + p + half] = __float2bfloat16(r1);
        } else {
            dst[a.rank + p] = r0;
            dst[a.rank + p + half] = r1;
        }
    }
    /* queries: rotate every (head, pair) into shared memory, then write back;
       interleaved pairs are read from where other pairs are written */
    extern __shared__ float stage[]; /* [heads][rope] */
    for (int it = threadIdx.x; it < a.heads * half; it += ROPE_THREADS) {
        const int h = it / half, p = it % half;
        const float *qr = a.q + ((int64_t)i * a.heads + h) * a.qdim + a.nope;
        float x0, x1;
        if (a.interleave) { x0 = qr[2 * p]; x1 = qr[2 * p + 1]; }
        else { x0 = qr[p]; x1 = qr[p + half]; }
        float c = cs[p], s = sn[p];
        stage[h * a.rope + p] = bad ? NAN : x0 * c - x1 * s;
        stage[h * a.rope + p + half] = bad ? NAN : x1 * c + x0 * s;
    }
    __syncthreads();
    for (int it = threadIdx.x; it < a.heads * a.rope; it += ROPE_THREADS) {
        const int h = it / a.rope, d = it % a.rope;
        a.q[((int64_t)i * a.heads + h) * a.qdim + a.nope + d] = stage[it];
    }
}

extern "C" ddt_status ddt_cuda_mla_rope_write(const ddt_cuda_mla_rope_args *a, ddt_cuda_stream stream,
                                              ddt_error *err) {
    if (a->n < 1 || a->rope < 2 || a->rope % 2 || a->heads < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "mla rope: %d tokens, rope dim %d, %d heads", a->n, a->rope, a->heads);
    size_t smem = sizeof(float) * (size_t)a->heads * (size_t)a->rope;
    if (smem > 48 * 1024) return ddt_fail(err, DDT_ERR_UNSUPPORTED, "mla rope: %d heads x %d rope dims", a->heads, a->rope);
    rope_write_kernel<<<a->n, ROPE_THREADS, smem, (cudaStream_t)stream>>>(*a);
    DDT_CUDA_LAUNCHED("mla_rope_write", (cudaStream_t)stream, err);
    return DDT_OK;
}

/* One (token, head) attention's view of the cache: logical position p is at
 * row p (p < len) or len + anc[p - len]; positions run over [0, P). */
struct attn_rows {
    const float *cache;
    int width, len, P;
    const int *anc;
};

static __device__ __forceinline__ int64_t attn_row(const attn_rows &r, int p) {
    return p < r.len ? p : r.len + r.anc[p - r.len];
}

/* Registers <- chunk [c0, c0 + C) x columns [0, cols) of the rows, element
 * e = threadIdx.x + k * ATTN_THREADS being position c0 + e / cols, column
 * e % cols (0 past P or past the chunk).  No load depends on another, so a
 * thread has all STAGE_PER of them in flight at once. */
static __device__ __forceinline__ void chunk_fetch(float (&v)[STAGE_PER], const attn_rows &r, int c0, int C,
                                                   int cols) {
    int j = threadIdx.x / cols, c = threadIdx.x % cols;
    const int dj = ATTN_THREADS / cols, dc = ATTN_THREADS % cols;
#pragma unroll
    for (int k = 0; k < STAGE_PER; k++) {
        const int p = c0 + j;
        v[k] = (j < C && p < r.P) ? r.cache[attn_row(r, p) * r.width + c] : 0.0f;
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

/* The idx-th chunk of the kernel's sequence: ns score chunks of cs positions
 * (all width columns), then no output chunks of co positions (the rank
 * columns).  An output chunk after the first also brings its exponentials
 * (thread t < co: sc[c0 + t] into ev; the softmax has finished by then); the
 * first gets them from the softmax itself, as it is fetched before. */
static __device__ __forceinline__ void attn_fetch(float (&v)[STAGE_PER], float &ev, const attn_rows &r,
                                                  const float *sc, int idx, int ns, int no, int cs, int co,
                                                  int rank) {
    if (idx < ns) {
        chunk_fetch(v, r, idx * cs, cs, r.width);
    } else if (idx - ns < no) {
        const int c0 = (idx - ns) * co;
        chunk_fetch(v, r, c0, co, rank);
        if (idx > ns && (int)threadIdx.x < co && c0 + (int)threadIdx.x < r.P) ev = sc[c0 + threadIdx.x];
    }
}

static __global__ void __launch_bounds__(ATTN_THREADS)
mla_attn_kernel(ddt_cuda_mla_attn_args a, int stage_floats) {
    DDT_GRID_DEP_WAIT();
    extern __shared__ float smem[];
    const int width = a.rank + a.rope;
    float *q = smem;                          /* [width] */
    float *red = q + width;                   /* [SOFTMAX_THREADS] */
    float *scs = red + SOFTMAX_THREADS;       /* [OUT_CHUNK_MAX] exponentials of the output chunk */
    float *accs = scs + OUT_CHUNK_MAX;        /* [rank] output sums, carried across chunks */
    float *stage = accs + a.rank;             /* [stage_floats] the chunk being computed */
    int *anc = (int *)(stage + stage_floats); /* [n] */
    const int i = blockIdx.x / a.heads, h = blockIdx.x % a.heads;
    const int len = *a.len;
    const int d_i = a.depth[i];
    /* ancestors by depth: visible node j at depth depth[j] */
    for (int j = threadIdx.x; j < a.n; j += ATTN_THREADS) {
        bool v = a.vis ? ((a.vis[(int64_t)i * a.vis_words + (j >> 6)] >> (j & 63)) & 1u) : j <= i;
        if (v) {
            int dj = a.depth[j];
            if (dj >= 0 && dj <= d_i) anc[dj] = j;
        }
    }
    for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) {
        q[d] = a.q_lat[((int64_t)i * a.heads + h) * a.rank + d];
        accs[d] = 0.0f;
    }
    for (int d = threadIdx.x; d < a.rope; d += ATTN_THREADS)
        q[a.rank + d] = a.q_rope[(int64_t)i * a.q_rope_ld_t + (int64_t)h * a.q_rope_ld_h + d];
    __syncthreads();
    const int P = len + d_i + 1;
    float *sc = a.scores + ((int64_t)i * a.heads + h) * a.capacity;
    const attn_rows r = {a.cache, width, len, P, anc};
    const int cs = stage_floats / width, co = min(OUT_CHUNK_MAX, stage_floats / a.rank);
    const int ns = P > 0 ? (P + cs - 1) / cs : 0, no = P > 0 ? (P + co - 1) / co : 0;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float v[STAGE_PER], ev = 0.0f;
    attn_fetch(v, ev, r, sc, 0, ns, no, cs, co, a.rank);

    /* scores: warp w takes the chunk's positions w, w + ATTN_WARPS, ..., SC_U
       at a time; each one's sum and shuffle tree are the order above */
    float mx = -INFINITY;
    for (int c = 0; c < ns; c++) {
        const int c0 = c * cs, cn = min(cs, P - c0);
        __syncthreads(); /* the previous chunk's scores are done with stage */
        chunk_store(v, stage, cn * width);
        __syncthreads();
        /* the next chunk (after the last score chunk: the first output chunk) */
        attn_fetch(v, ev, r, sc, c + 1, ns, no, cs, co, a.rank);
        for (int j0 = warp; j0 < cn; j0 += ATTN_WARPS * SC_U) {
            float s[SC_U];
            const float *kv[SC_U];
#pragma unroll
            for (int u = 0; u < SC_U; u++) {
                const int j = j0 + u * ATTN_WARPS;
                kv[u] = stage + (j < cn ? j : j0) * width; /* past the chunk: a valid row, result unused */
                s[u] = 0.0f;
            }
            for (int d = lane; d < width; d += 32) {
                const float qd = q[d];
#pragma unroll
                for (int u = 0; u < SC_U; u++) s[u] += qd * kv[u][d];
            }
            for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
                for (int u = 0; u < SC_U; u++) s[u] += __shfl_xor_sync(0xffffffffu, s[u], o);
            }
#pragma unroll
            for (int u = 0; u < SC_U; u++) {
                const int j = j0 + u * ATTN_WARPS;
                if (j < cn) {
                    const float sv = s[u] * a.scale;
                    if (lane == 0) sc[c0 + j] = sv;
                    mx = fmaxf(mx, sv);
                }
            }
        }
    }
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < ATTN_WARPS; w++) m = fmaxf(m, red[w]);
    __syncthreads();
    /* softmax: thread t < SOFTMAX_THREADS, SM_U of its positions' loads at once;
       the first output chunk's exponentials also go to scs */
    if (threadIdx.x < SOFTMAX_THREADS) {
        float part = 0.0f;
        for (int p0 = threadIdx.x; p0 < P; p0 += SOFTMAX_THREADS * SM_U) {
            float x[SM_U];
#pragma unroll
            for (int u = 0; u < SM_U; u++) {
                const int p = p0 + u * SOFTMAX_THREADS;
                x[u] = p < P ? sc[p] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < SM_U; u++) {
                const int p = p0 + u * SOFTMAX_THREADS;
                if (p < P) {
                    float e = expf(x[u] - m);
                    sc[p] = e;
                    if (p < co) scs[p] = e;
                    part += e;
                }
            }
        }
        red[threadIdx.x] = part;
    }
    __syncthreads();
    for (int step = SOFTMAX_THREADS / 2; step > 0; step >>= 1) {
        if (threadIdx.x < step) red[threadIdx.x] += red[threadIdx.x + step];
        __syncthreads();
    }
    const float inv = 1.0f / red[0];

    /* output: thread d's sum runs over the chunks in position order */
    for (int c = 0; c < no; c++) {
        const int c0 = c * co, cn = min(co, P - c0);
        __syncthreads(); /* stage and scs are free (the scores / the previous chunk are done) */
        chunk_store(v, stage, cn * a.rank);
        if (c > 0 && (int)threadIdx.x < cn) scs[threadIdx.x] = ev;
        __syncthreads();
        attn_fetch(v, ev, r, sc, ns + c + 1, ns, no, cs, co, a.rank);
        for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) {
            float acc = accs[d];
            const float *col = stage + d;
#pragma unroll 8
            for (int j = 0; j < cn; j++) acc += scs[j] * col[j * a.rank];
            accs[d] = acc;
        }
    }
    float *out = a.out + ((int64_t)i * a.heads + h) * a.rank;
    for (int d = threadIdx.x; d < a.rank; d += ATTN_THREADS) out[d] = accs[d] * inv;
}

extern "C" ddt_status ddt_cuda_mla_attention(const ddt_cuda_mla_attn_args *a, ddt_cuda_stream stream,
                                             ddt_error *err) {
    if (a->n < 1 || a->heads < 1 || a->rank < 1 || a->rope < 0 || a->capacity < a->n)
        return ddt_fail(err, DDT_ERR_INVALID, "mla attention: %d tokens, %d heads, rank %d, %d cache rows", a->n,
                        a->heads, a->rank, a->capacity);
    if ((int64_t)a->n * a->heads > 0x7fffffff)
        return ddt_fail(err, DDT_ERR_RANGE, "mla attention: %d x %d blocks", a->n, a->heads);
    /* the chunk stage takes what the fixed parts leave of 48 KB, up to STAGE_MAX
       floats; it must hold one row (a chunk of one position) */
    const size_t width = (size_t)a->rank + (size_t)a->rope, limit = 48 * 1024;
    const size_t fixed =
        sizeof(float) * (width + SOFTMAX_THREADS + OUT_CHUNK_MAX + (size_t)a->rank) + sizeof(int) * (size_t)a->n;
    if (fixed + sizeof(float) * width > limit)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "mla attention: %zu bytes of shared memory", fixed + 4 * width);
    size_t stage = (limit - fixed) / sizeof(float);
    if (stage > STAGE_MAX) stage = STAGE_MAX;
    const size_t smem = fixed + sizeof(float) * stage;
    mla_attn_kernel<<<a->n * a->heads, ATTN_THREADS, smem, (cudaStream_t)stream>>>(*a, (int)stage);
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
