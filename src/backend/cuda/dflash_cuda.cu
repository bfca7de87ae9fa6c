/*
 * dflash_cuda.cu — the DFlash drafter's own kernels (see dflash_cuda.h): the
 * per-head norms, RoPE from a cos/sin table and the K/V store into the context
 * cache (one kernel), the non-causal block attention and the device-side append
 * bookkeeping.
 *
 * The per-head norm + RoPE + K/V store (ddt_dflash_qkv_prep) keeps a head in one
 * warp's registers: lane l holds the pairs (j, j + hd/2), j = l + 32 i, exactly
 * the values its rotation needs, so the norm's sum, the scaling and the rotation
 * take one read and one write of the head.  The rotation is the CPU's
 * ddt_cpu_rope_rotate arithmetic (a*c - b*s, b*c + a*s with --fmad=false, so no
 * contraction) on the CPU's own table values; only the norm's sum of squares is
 * in another order than the CPU's.
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

#define ATTN_WARPS 8
#define ATTN_QPB 16        /* queries per attention block (2 per warp) */
#define COMBINE_THREADS 128
#define MAX_SPLITS 4096    /* combine weights live in shared memory */
#define PREP_WARPS 4       /* (row, head) items per qkv_prep block */

static __device__ __forceinline__ int read_count(const int32_t *count_dev, int count_host) {
    return count_dev ? *count_dev : count_host;
}

static __device__ __forceinline__ bool append_ok(int len, int count, int max_count, int limit) {
    return count >= 0 && count <= max_count && len >= 0 && (long long)len + count <= (long long)limit;
}

/* ------------------------------------------------------------------ rows */

static __global__ void clamp_rows_kernel(const int32_t *__restrict__ rows, const int32_t *__restrict__ m_p,
                                         int max_m, int32_t *__restrict__ out) {
    DDT_GRID_DEP_WAIT();
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

/* ------------------------------------------------------------------ q/k norm + RoPE + K/V store */

/* One warp per (row t = blockIdx.y, head slot): slots [0, nq) are query heads,
 * [nq, nq + kv_heads) key/value heads.  NP = pairs per lane (hd/2 <= 32 NP).
 * Every early return is uniform over the warp (the butterfly needs all 32 lanes). */
template <int NP>
static __global__ void __launch_bounds__(PREP_WARPS * 32) qkv_prep_kernel(const ddt_dflash_qkv p) {
    DDT_GRID_DEP_WAIT();
    const int nq = p.q ? p.heads : 0, t = blockIdx.y;
    const int slot = blockIdx.x * PREP_WARPS + (threadIdx.x >> 5);
    if (slot >= nq + p.kv_heads) return;
    const int lane = threadIdx.x & 31, hd = p.hd, half = hd / 2;
    const long long pos = (long long)*p.len + t;
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
        if (!append_ok(*p.len, count, p.max_count, p.limit) || t >= count) return;
        const int g = slot - nq;
        const int64_t kvd = (int64_t)p.kv_heads * hd;
        src = p.k + (int64_t)t * p.ldk + (int64_t)g * hd;
        dst = p.k_cache + pos * kvd + (int64_t)g * hd;
        w = p.k_norm;
        rotate = true; /* the append rule keeps pos < limit */
        const float *vs = p.v + (int64_t)t * p.ldv + (int64_t)g * hd;
        float *vd = p.v_cache + pos * kvd + (int64_t)g * hd;
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

extern "C" ddt_status ddt_dflash_qkv_prep(const ddt_dflash_qkv *p, ddt_cuda_stream stream, ddt_error *err) {
    if (!p || !p->k || !p->v || !p->k_norm || !p->len || !p->cos_t || !p->sin_t || !p->k_cache || !p->v_cache ||
        (p->q && (!p->qo || !p->q_norm)))
        return ddt_fail(err, DDT_ERR_INVALID, "dflash qkv_prep: NULL argument");
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
    const dim3 grid((unsigned)((nq + p->kv_heads + PREP_WARPS - 1) / PREP_WARPS), (unsigned)p->n);
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

/* ------------------------------------------------------------------ advance */

static __global__ void advance_kernel(int32_t *len_p, int32_t *status, const int32_t *count_dev, int count_host,
                                      int max_count, int limit) {
    DDT_GRID_DEP_WAIT();
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
    DDT_GRID_DEP_WAIT();
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
    DDT_GRID_DEP_WAIT();
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
