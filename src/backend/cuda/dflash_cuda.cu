/*
 * dflash_cuda.cu — the DFlash drafter's own kernels (see dflash_cuda.h): RoPE
 * from a cos/sin table, the K/V store into the context cache, the non-causal
 * block attention and the device-side append bookkeeping.
 *
 * RoPE does the CPU's ddt_cpu_rope_rotate arithmetic (a*c - b*s, b*c + a*s with
 * --fmad=false, so no contraction) on the CPU's own table values: a rotated key
 * is bitwise what the CPU computes from the same input.
 *
 * Attention: one warp per query, its head_dim spread over the 32 lanes
 * (j = lane + 32 i), the dot product summed per lane in i order and then by a
 * xor butterfly, which leaves the same bits in every lane.  Rows are cut into
 * fixed splits; each keeps an online softmax over its rows in increasing order
 * (the CPU's update rule), and a second kernel merges the splits in increasing
 * order.  The split length is fixed per drafter, so the result never depends on
 * the launch, and a query's result depends only on that query and the cache.
 */
#include <cuda_runtime.h>
#include <math.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dflash_cuda.h"

#define EW_THREADS 256
#define ATTN_WARPS 8
#define ATTN_QPB 16        /* queries per attention block (2 per warp) */
#define COMBINE_THREADS 128
#define MAX_SPLITS 4096    /* combine weights live in shared memory */

static __device__ __forceinline__ int read_count(const int32_t *count_dev, int count_host) {
    return count_dev ? *count_dev : count_host;
}

static __device__ __forceinline__ bool append_ok(int len, int count, int max_count, int limit) {
    return count >= 0 && count <= max_count && len >= 0 && (long long)len + count <= (long long)limit;
}

/* ------------------------------------------------------------------ rows */

static __global__ void clamp_rows_kernel(const int32_t *__restrict__ rows, const int32_t *__restrict__ m_p,
                                         int max_m, int32_t *__restrict__ out) {
    int m = *m_p;
    if (m > max_m) m = max_m;
    for (int k = threadIdx.x; k < max_m; k += blockDim.x) out[k] = m >= 1 ? rows[k < m ? k : m - 1] : 0;
}

extern "C" ddt_status ddt_dflash_clamp_rows(const int32_t *rows, const int32_t *m, int32_t max_m, int32_t *out,
                                            ddt_cuda_stream stream, ddt_error *err) {
    if (!rows || !m || !out) return ddt_fail(err, DDT_ERR_INVALID, "dflash clamp_rows: NULL argument");
    if (max_m < 1 || max_m > 1024) return ddt_fail(err, DDT_ERR_RANGE, "dflash clamp_rows: max_m %d", max_m);
    cudaStream_t s = (cudaStream_t)stream;
    clamp_rows_kernel<<<1, 64, 0, s>>>(rows, m, max_m, out);
    DDT_CUDA_LAUNCHED("dflash_clamp_rows", s, err);
    return DDT_OK;
}

/* ------------------------------------------------------------------ rope */

/* The rotation of one (a, b) pair, as ddt_cpu_rope_rotate (not interleaved). */
static __device__ __forceinline__ void rotate_pair(float *x, int half, int i, float c, float s) {
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
}

static __global__ void rope_kernel(float *x, int nh, int hd, const int32_t *__restrict__ len_p,
                                   const float *__restrict__ cos_t, const float *__restrict__ sin_t, int table_rows) {
    const int t = blockIdx.y, half = hd / 2;
    const long long pos = (long long)*len_p + t;
    if (pos < 0 || pos >= table_rows) return;
    const int idx = blockIdx.x * EW_THREADS + threadIdx.x;
    if (idx >= nh * half) return;
    const int h = idx / half, i = idx % half;
    rotate_pair(x + ((size_t)t * nh + h) * hd, half, i, cos_t[pos * half + i], sin_t[pos * half + i]);
}

extern "C" ddt_status ddt_dflash_rope(float *x, int32_t n, int32_t nh, int32_t hd, const int32_t *len,
                                      const float *cos_t, const float *sin_t, int32_t table_rows,
                                      ddt_cuda_stream stream, ddt_error *err) {
    if (!x || !len || !cos_t || !sin_t) return ddt_fail(err, DDT_ERR_INVALID, "dflash rope: NULL argument");
    if (n < 1 || n > 65535 || nh < 1 || hd < 2 || hd % 2 || (int64_t)nh * hd > INT32_MAX)
        return ddt_fail(err, DDT_ERR_INVALID, "dflash rope: %d rows of %d heads x %d", n, nh, hd);
    cudaStream_t s = (cudaStream_t)stream;
    const int pairs = nh * (hd / 2);
    rope_kernel<<<dim3((pairs + EW_THREADS - 1) / EW_THREADS, n), EW_THREADS, 0, s>>>(x, nh, hd, len, cos_t, sin_t,
                                                                                     table_rows);
    DDT_CUDA_LAUNCHED("dflash_rope", s, err);
    return DDT_OK;
}

/* ------------------------------------------------------------------ K/V store */

static __global__ void kv_store_kernel(const float *__restrict__ k_src, const float *__restrict__ v_src,
                                       const int32_t *__restrict__ count_dev, int count_host, int max_count,
                                       const int32_t *__restrict__ len_p, int limit, const float *__restrict__ cos_t,
                                       const float *__restrict__ sin_t, int nkv, int hd, float *__restrict__ k_cache,
                                       float *__restrict__ v_cache) {
    const int t = blockIdx.y, len = *len_p, count = read_count(count_dev, count_host);
    if (!append_ok(len, count, max_count, limit) || t >= count) return;
    const int kvd = nkv * hd, half = hd / 2;
    const int idx = blockIdx.x * EW_THREADS + threadIdx.x;
    if (idx >= kvd) return;
    const size_t r = (size_t)len + t;
    v_cache[r * kvd + idx] = v_src[(size_t)t * kvd + idx];
    if (idx < nkv * half) {
        const int h = idx / half, i = idx % half;
        const float *src = k_src + (size_t)t * kvd + (size_t)h * hd;
        float *dst = k_cache + r * kvd + (size_t)h * hd;
        const float a = src[i], b = src[i + half], c = cos_t[r * half + i], s = sin_t[r * half + i];
        dst[i] = a * c - b * s;
        dst[i + half] = b * c + a * s;
    }
}

extern "C" ddt_status ddt_dflash_kv_store(const float *k_src, const float *v_src, int32_t n, const int32_t *count_dev,
                                          int32_t count_host, int32_t max_count, const int32_t *len, int32_t limit,
                                          const float *cos_t, const float *sin_t, int32_t n_kv_heads, int32_t hd,
                                          float *k_cache, float *v_cache, ddt_cuda_stream stream, ddt_error *err) {
    if (!k_src || !v_src || !len || !cos_t || !sin_t || !k_cache || !v_cache)
        return ddt_fail(err, DDT_ERR_INVALID, "dflash kv_store: NULL argument");
    if (n < 1 || n > 65535 || n_kv_heads < 1 || hd < 2 || hd % 2 || (int64_t)n_kv_heads * hd > INT32_MAX)
        return ddt_fail(err, DDT_ERR_INVALID, "dflash kv_store: %d rows of %d heads x %d", n, n_kv_heads, hd);
    if (max_count > n) return ddt_fail(err, DDT_ERR_INVALID, "dflash kv_store: max count %d > %d rows", max_count, n);
    cudaStream_t s = (cudaStream_t)stream;
    const int kvd = n_kv_heads * hd;
    kv_store_kernel<<<dim3((kvd + EW_THREADS - 1) / EW_THREADS, n), EW_THREADS, 0, s>>>(
        k_src, v_src, count_dev, count_host, max_count, len, limit, cos_t, sin_t, n_kv_heads, hd, k_cache, v_cache);
    DDT_CUDA_LAUNCHED("dflash_kv_store", s, err);
    return DDT_OK;
}

/* ------------------------------------------------------------------ advance */

static __global__ void advance_kernel(int32_t *len_p, int32_t *status, const int32_t *count_dev, int count_host,
                                      int max_count, int limit) {
    const int len = *len_p, count = read_count(count_dev, count_host);
    if (append_ok(len, count, max_count, limit))
        *len_p = len + count;
    else
        *status = DDT_DFLASH_BAD_APPEND;
}

extern "C" ddt_status ddt_dflash_advance(int32_t *len, int32_t *status, const int32_t *count_dev, int32_t count_host,
                                         int32_t max_count, int32_t limit, ddt_cuda_stream stream, ddt_error *err) {
    if (!len || !status) return ddt_fail(err, DDT_ERR_INVALID, "dflash advance: NULL argument");
    cudaStream_t s = (cudaStream_t)stream;
    advance_kernel<<<1, 1, 0, s>>>(len, status, count_dev, count_host, max_count, limit);
    DDT_CUDA_LAUNCHED("dflash_advance", s, err);
    return DDT_OK;
}

/* ------------------------------------------------------------------ attention */

static __device__ __forceinline__ int rows_to_read(const int32_t *len_p, int n_block, int max_rows) {
    long long n = (long long)*len_p + n_block;
    if (n > max_rows) n = max_rows;
    if (n < 0) n = 0;
    return (int)n;
}

/* Partial attention of ATTN_QPB queries of one kv head over one split of rows.
 * NI = registers per lane (head_dim <= 32 NI). */
template <int NI>
static __global__ void __launch_bounds__(ATTN_WARPS * 32)
attn_partial_kernel(const float *__restrict__ q, const float *__restrict__ kc, const float *__restrict__ vc,
                    const int32_t *__restrict__ len_p, int n_block, int heads, int kv_heads, int hd, int max_rows,
                    int split, float scale, float *__restrict__ part_ml, float *__restrict__ part_acc) {
    const int group = heads / kv_heads, n_q = n_block * group;
    const int qchunks = (n_q + ATTN_QPB - 1) / ATTN_QPB;
    const int g = blockIdx.x / qchunks, qc = blockIdx.x % qchunks;
    const int n_rows = rows_to_read(len_p, n_block, max_rows);
    const int r0 = blockIdx.y * split;
    if (r0 >= n_rows) return;
    const int r1 = r0 + split < n_rows ? r0 + split : n_rows;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int qd = heads * hd, kvd = kv_heads * hd, n_all = n_block * heads;
    const int q_end = (qc + 1) * ATTN_QPB < n_q ? (qc + 1) * ATTN_QPB : n_q;
    for (int qi = qc * ATTN_QPB + warp; qi < q_end; qi += ATTN_WARPS) {
        const int t = qi / group, h = g * group + qi % group;
        const float *qr = q + (size_t)t * qd + (size_t)h * hd;
        float qv[NI], acc[NI];
#pragma unroll
        for (int i = 0; i < NI; i++) {
            const int j = lane + 32 * i;
            qv[i] = j < hd ? qr[j] : 0.0f;
            acc[i] = 0.0f;
        }
        float m = -INFINITY, l = 0.0f;
        for (int r = r0; r < r1; r++) {
            const float *kr = kc + (size_t)r * kvd + (size_t)g * hd;
            const float *vr = vc + (size_t)r * kvd + (size_t)g * hd;
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < NI; i++) {
                const int j = lane + 32 * i;
                if (j < hd) s += qv[i] * kr[j];
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
            s *= scale;
            if (s > m) {
                const float c = expf(m - s); /* 0 on the first row (m = -inf) */
                l *= c;
#pragma unroll
                for (int i = 0; i < NI; i++) acc[i] *= c;
                m = s;
            }
            const float p = expf(s - m);
            l += p;
#pragma unroll
            for (int i = 0; i < NI; i++) {
                const int j = lane + 32 * i;
                if (j < hd) acc[i] += p * vr[j];
            }
        }
        const size_t slot = (size_t)blockIdx.y * n_all + (size_t)t * heads + h;
        if (lane == 0) {
            part_ml[slot * 2] = m;
            part_ml[slot * 2 + 1] = l;
        }
#pragma unroll
        for (int i = 0; i < NI; i++) {
            const int j = lane + 32 * i;
            if (j < hd) part_acc[slot * hd + j] = acc[i];
        }
    }
}

/* Merge the splits of query (t, h) = blockIdx.x in increasing split order. */
static __global__ void __launch_bounds__(COMBINE_THREADS)
attn_combine_kernel(const int32_t *__restrict__ len_p, int n_block, int heads, int hd, int max_rows, int split,
                    const float *__restrict__ part_ml, const float *__restrict__ part_acc, float *__restrict__ o) {
    extern __shared__ float wsplit[]; /* [n_used] exp(m_s - M) */
    const int n_all = n_block * heads, qidx = blockIdx.x;
    const int n_rows = rows_to_read(len_p, n_block, max_rows);
    const int n_used = (n_rows + split - 1) / split;
    float M = -INFINITY;
    for (int s = 0; s < n_used; s++) {
        const float ms = part_ml[((size_t)s * n_all + qidx) * 2];
        if (ms > M) M = ms;
    }
    for (int s = threadIdx.x; s < n_used; s += COMBINE_THREADS)
        wsplit[s] = expf(part_ml[((size_t)s * n_all + qidx) * 2] - M);
    __syncthreads();
    float l = 0.0f;
    for (int s = 0; s < n_used; s++) l += part_ml[((size_t)s * n_all + qidx) * 2 + 1] * wsplit[s];
    const float inv = 1.0f / l;
    const int t = qidx / heads, h = qidx % heads;
    float *orow = o + (size_t)t * heads * hd + (size_t)h * hd;
    for (int j = threadIdx.x; j < hd; j += COMBINE_THREADS) {
        float acc = 0.0f;
        for (int s = 0; s < n_used; s++) acc += part_acc[((size_t)s * n_all + qidx) * hd + j] * wsplit[s];
        orow[j] = acc * inv;
    }
}

static int attn_splits(const ddt_dflash_attn *a) { return (a->max_rows + a->split - 1) / a->split; }

extern "C" uint64_t ddt_dflash_attn_scratch_floats(const ddt_dflash_attn *a) {
    if (a->split < 1 || a->max_rows < 1) return 0;
    return (uint64_t)attn_splits(a) * (uint64_t)a->n_block * (uint64_t)a->heads * (uint64_t)(a->hd + 2);
}

extern "C" ddt_status ddt_dflash_attention(const ddt_dflash_attn *a, const float *q, const float *k_cache,
                                           const float *v_cache, const int32_t *len, float *scratch, float *o,
                                           ddt_cuda_stream stream, ddt_error *err) {
    if (!a || !q || !k_cache || !v_cache || !len || !scratch || !o)
        return ddt_fail(err, DDT_ERR_INVALID, "dflash attention: NULL argument");
    if (a->n_block < 1 || a->heads < 1 || a->kv_heads < 1 || a->heads % a->kv_heads || a->hd < 1 ||
        a->hd > DDT_DFLASH_MAX_HEAD_DIM || a->split < 1 || a->max_rows < a->n_block || !(a->scale > 0.0f))
        return ddt_fail(err, DDT_ERR_INVALID, "dflash attention: block %d, heads %d/%d, head_dim %d, rows %d, split %d",
                        a->n_block, a->heads, a->kv_heads, a->hd, a->max_rows, a->split);
    const int splits = attn_splits(a);
    const int64_t n_q = (int64_t)a->n_block * (a->heads / a->kv_heads);
    const int64_t gx = (int64_t)a->kv_heads * ((n_q + ATTN_QPB - 1) / ATTN_QPB);
    if (splits > MAX_SPLITS || gx > INT32_MAX || (int64_t)a->n_block * a->heads > INT32_MAX)
        return ddt_fail(err, DDT_ERR_RANGE, "dflash attention: %d splits of %d rows (at most %d splits)", splits,
                        a->split, MAX_SPLITS);
    float *part_ml = scratch;
    float *part_acc = scratch + (size_t)splits * a->n_block * a->heads * 2;
    cudaStream_t s = (cudaStream_t)stream;
    const dim3 grid((unsigned)gx, (unsigned)splits);
    const int ni = (a->hd + 31) / 32;
#define ATTN_LAUNCH(NI)                                                                                           \
    attn_partial_kernel<NI><<<grid, ATTN_WARPS * 32, 0, s>>>(q, k_cache, v_cache, len, a->n_block, a->heads,     \
                                                             a->kv_heads, a->hd, a->max_rows, a->split, a->scale, \
                                                             part_ml, part_acc)
    if (ni <= 1)
        ATTN_LAUNCH(1);
    else if (ni <= 2)
        ATTN_LAUNCH(2);
    else if (ni <= 4)
        ATTN_LAUNCH(4);
    else if (ni <= 8)
        ATTN_LAUNCH(8);
    else
        ATTN_LAUNCH(16);
#undef ATTN_LAUNCH
    DDT_CUDA_LAUNCHED("dflash_attn_partial", s, err);
    /* the weights rounded up to whole float4: nvcc reads the combine loop's remainder
       with one 16-byte shared load, past the last split (compute-sanitizer caught it) */
    attn_combine_kernel<<<(unsigned)(a->n_block * a->heads), COMBINE_THREADS, (size_t)(splits + 3) / 4 * 4 * sizeof(float),
                          s>>>(
        len, a->n_block, a->heads, a->hd, a->max_rows, a->split, part_ml, part_acc, o);
    DDT_CUDA_LAUNCHED("dflash_attn_combine", s, err);
    return DDT_OK;
}
