/*
 * norm_dev.cuh — one RMSNorm row on one block, with an optional residual added
 * first, for the kernels that end in a norm: nn_cuda.cu's rmsnorm / add_rmsnorm,
 * moe_cuda.cu's expert combine fused with the layer's residual add and the next
 * norm, the embedding gather's and MLA's latent norms.  One copy of the
 * arithmetic, so a fused kernel gives the bits of the launches it replaces as long
 * as its residual source returns the bits those launches would have stored (issue
 * 13).
 *
 * The row's result never depends on the other rows: NT threads (norm_threads of
 * the row's length: 256, or 512 past 2048 elements) each sum a fixed slice of
 * squares, then a fixed butterfly and the NT / 32 warp sums in order.  NT is a
 * function of the length only, so every kernel that norms a row of that length
 * sums in the same order.  Why more threads for long rows: a row of K2.6 (7168) at
 * 256 threads is 7 float4 a thread, each a dependent round of loads in the MoE
 * combine (8 expert rows a float4); 512, not 1024: at 1024 a thread has 64
 * registers and the combine's batch of rows spilled (25.7 us a token on the H200).
 * Every kernel that calls norm_row is bounded to one block an SM
 * (__launch_bounds__(NT, 1)): left to itself ptxas held the add + norm at 64
 * registers and spilled its row (seventeenth session), a round trip to local memory
 * on a latency-bound path.
 */
#ifndef DDT_CUDA_NORM_DEV_CUH
#define DDT_CUDA_NORM_DEV_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#include <type_traits>

#include "backend/cuda/bf16_split_dev.cuh"
#include "backend/cuda/cuda_types.h"
#include "ddtree.h"

/* The threads that norm a row of dim elements (see the top). */
#define NORM_THREADS_SHORT 256
#define NORM_THREADS_LONG 512
#define NORM_LONG_FROM 2049
static __host__ __device__ inline int norm_threads(int dim) {
    return dim >= NORM_LONG_FROM ? NORM_THREADS_LONG : NORM_THREADS_SHORT;
}
/* f(std::integral_constant<int, NT>{}) for nt (norm_threads of a launch's longest
 * row): the one place a launcher turns that count into its kernel's instance. */
template <class F>
static inline void norm_launch(int nt, F &&f) {
    if (nt == NORM_THREADS_LONG) f(std::integral_constant<int, NORM_THREADS_LONG>{});
    else f(std::integral_constant<int, NORM_THREADS_SHORT>{});
}

/* Rows of a multiple of 4 floats, 16-byte aligned and at most norm_vmax<NT> float4
 * per thread (8192 elements at 256 or 512 threads) stay in registers
 * between the sum of squares and the scaling (one read of x); other rows take the
 * strided loop. */
template <int NT> struct NormVmax { static constexpr int v = NT >= NORM_THREADS_LONG ? 4 : 8; };
static __host__ __device__ inline int norm_vmax(int nt) { return nt >= NORM_THREADS_LONG ? 4 : 8; }

/* Sum of one value per thread over threads 0..NT-1 of the block (threads past NT
 * pass 0 and are not counted), in a fixed order (xor butterfly in each warp, then
 * the NT / 32 warp sums in index order by every thread): the result is a function
 * of the row only. */
template <int NT>
static __device__ float norm_block_sum(float v, float *wsum) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0 && threadIdx.x < NT) wsum[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = wsum[0];
#pragma unroll
    for (int w = 1; w < NT / 32; w++) s += wsum[w];
    return s;
}

/* The output row's split planes (ddt_cuda_split_planes, resolved to the row; each
 * value by bf16_split, as the wgmma product's split pass writes it), or none (hi ==
 * NULL). */
struct NormSplitRow {
    __nv_bfloat16 *hi, *lo;
    __device__ void store4(int i, float4 o) const {
        if (!hi) return;
        __nv_bfloat16 h[4], l[4];
        bf16_split(o.x, h[0], l[0]);
        bf16_split(o.y, h[1], l[1]);
        bf16_split(o.z, h[2], l[2]);
        bf16_split(o.w, h[3], l[3]);
        __nv_bfloat162 h01 = {h[0], h[1]}, h23 = {h[2], h[3]}, l01 = {l[0], l[1]}, l23 = {l[2], l[3]};
        uint2 hv, lv;
        hv.x = *(const uint32_t *)&h01, hv.y = *(const uint32_t *)&h23;
        lv.x = *(const uint32_t *)&l01, lv.y = *(const uint32_t *)&l23;
        ((uint2 *)hi)[i] = hv; /* elements 4i..4i+3: 8-byte aligned (the pitch is a multiple of 8) */
        ((uint2 *)lo)[i] = lv;
    }
    __device__ void store1(int i, float o) const {
        if (!hi) return;
        bf16_split(o, hi[i], lo[i]);
    }
};

/* The row's planes from ddt_cuda_split_planes p (none when p.hi is NULL). */
static __device__ __forceinline__ NormSplitRow norm_split_row(const ddt_cuda_split_planes &p, int64_t row) {
    if (!p.hi) return NormSplitRow{nullptr, nullptr};
    return NormSplitRow{(__nv_bfloat16 *)p.hi + row * p.pitch, (__nv_bfloat16 *)p.lo + row * p.pitch};
}

/* A norm launch's check of the split planes it was given (sp NULL or sp->hi NULL:
 * none, *out zero): present planes hold dim columns a row, 16-byte aligned with a
 * pitch of whole 8s (the register path's 8-byte stores; the products' layout). */
static inline ddt_status norm_split_check(const char *what, const ddt_cuda_split_planes *sp, int64_t dim,
                                          ddt_cuda_split_planes *out, ddt_error *err) {
    *out = ddt_cuda_split_planes{NULL, NULL, 0};
    if (!sp || !sp->hi) return DDT_OK;
    if (!sp->lo || sp->pitch < dim || sp->pitch % 8 != 0 || (uintptr_t)sp->hi % 16 != 0 || (uintptr_t)sp->lo % 16 != 0)
        return ddt_fail(err, DDT_ERR_INVALID, "%s: split planes of pitch %lld for rows of %lld (16-byte aligned "
                        "planes, a pitch of whole 8s needed)", what, (long long)sp->pitch, (long long)dim);
    *out = *sp;
    return DDT_OK;
}

/* The residual source of norm_row when there is none. */
struct NormNoResid {
    static constexpr bool on = false;
    __device__ float4 vec(int) const { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    __device__ float one(int) const { return 0.0f; }
};

/*
 * One row, the calling block's, normed by its first NT threads (NT =
 * norm_threads(dim); a block of more threads may call it, the rest hold no
 * elements): with R::on, x[i] = x[i] + r(i) first (stored back:
 * the layer's residual add), then orow[i] = w[i] * (x[i] * inv) with inv = 1 /
 * sqrt(mean of squares + eps).  r.vec(j) returns elements 4j..4j+3 (vec rows),
 * r.one(i) element i; each is called once per element, by the thread that owns it.
 * vec: the row qualifies for the register path (see NormVmax; the caller checks the
 * alignment of every pointer it reads).  orow may equal xr only without a residual.
 * sp: the output's split planes for a tensor-core product that reads them (or none).
 * Every thread of the block must call it (it holds a barrier).
 */
template <int NT, class R>
static __device__ __forceinline__ void norm_row_nt(float *xr, int dim, const R &r, const float *__restrict__ w,
                                                   float eps, float *orow, bool vec, const NormSplitRow &sp) {
    constexpr int VMAX = NormVmax<NT>::v;
    __shared__ float wsum[NT / 32];
    float s = 0.0f;
    const bool mine = threadIdx.x < NT; /* threads past NT hold no elements */
    if (vec) {
        /* the weights' float4 loaded with the row's, before the block sum: the scaling
           then waits for no global round trip after the reduction (same arithmetic) */
        float4 v[VMAX], g[VMAX];
        const int nv = mine ? dim / 4 : 0;
#pragma unroll
        for (int k = 0; k < VMAX; k++) {
            const int i = threadIdx.x + k * NT;
            if (i < nv) {
                g[k] = ((const float4 *)w)[i];
                v[k] = ((const float4 *)xr)[i];
                if (R::on) {
                    const float4 a = r.vec(i);
                    v[k].x = v[k].x + a.x, v[k].y = v[k].y + a.y, v[k].z = v[k].z + a.z, v[k].w = v[k].w + a.w;
                }
            }
        }
#pragma unroll
        for (int k = 0; k < VMAX; k++)
            if (threadIdx.x + k * NT < nv) {
                s += v[k].x * v[k].x;
                s += v[k].y * v[k].y;
                s += v[k].z * v[k].z;
                s += v[k].w * v[k].w;
            }
        const float inv = 1.0f / sqrtf(norm_block_sum<NT>(s, wsum) / (float)dim + eps);
#pragma unroll
        for (int k = 0; k < VMAX; k++) {
            const int i = threadIdx.x + k * NT;
            if (i < nv) {
                if (R::on) ((float4 *)xr)[i] = v[k];
                const float4 o = make_float4(g[k].x * (v[k].x * inv), g[k].y * (v[k].y * inv),
                                             g[k].z * (v[k].z * inv), g[k].w * (v[k].w * inv));
                ((float4 *)orow)[i] = o;
                sp.store4(i, o);
            }
        }
        return;
    }
    const int end = mine ? dim : 0;
    for (int i = threadIdx.x; i < end; i += NT) {
        float v = xr[i];
        if (R::on) {
            v = v + r.one(i);
            xr[i] = v; /* read and written by this thread only */
        }
        s += v * v;
    }
    const float inv = 1.0f / sqrtf(norm_block_sum<NT>(s, wsum) / (float)dim + eps);
    /* out may alias x: each element is read then written by the same thread */
    for (int i = threadIdx.x; i < end; i += NT) {
        const float o = w[i] * (xr[i] * inv);
        orow[i] = o;
        sp.store1(i, o);
    }
}

/* norm_row_nt with NT = norm_threads(dim), by a block of NTB >= that many threads
 * (a kernel launched with norm_threads of its longest row). */
template <int NTB, class R>
static __device__ __forceinline__ void norm_row(float *xr, int dim, const R &r, const float *__restrict__ w,
                                                float eps, float *orow, bool vec,
                                                const NormSplitRow &sp = NormSplitRow{nullptr, nullptr}) {
    if constexpr (NTB >= NORM_THREADS_LONG) {
        if (norm_threads(dim) == NORM_THREADS_LONG) {
            norm_row_nt<NORM_THREADS_LONG>(xr, dim, r, w, eps, orow, vec, sp);
            return;
        }
    }
    norm_row_nt<NORM_THREADS_SHORT>(xr, dim, r, w, eps, orow, vec, sp);
}

/* Whether a row set takes norm_row's register path: every pointer the kernel reads
 * or writes by float4 (NULL: not used) 16-byte aligned with a row stride (in floats)
 * a multiple of 4, and dim a multiple of 4 within norm_vmax float4 per thread. */
static inline bool norm_vec_ok(int32_t dim, const void *const *ptrs, const int64_t *lds, int count) {
    const int nt = norm_threads(dim);
    if (dim % 4 != 0 || dim / 4 > norm_vmax(nt) * nt) return false;
    for (int k = 0; k < count; k++)
        if (ptrs[k] && ((uintptr_t)ptrs[k] % 16 != 0 || lds[k] % 4 != 0)) return false;
    return true;
}

#endif
