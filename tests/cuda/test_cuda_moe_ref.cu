/*
 * test_cuda_moe_ref.cu — the reference for test_cuda_moe.c's tensor-core experts:
 * the expert kernels as they were before the activations were split once per
 * launch (wstream_ref.cuh's ws_kernel, every block splitting its staged fp32 x
 * and h), set up as moe_cuda.cu's tc_experts_launch<F, 1> of that commit set
 * them up (items of at most 8 entries), so that the test can require the new
 * path to give the same bits.  The sort and the combine are rebuilt here, not
 * copied: the host groups the entries by expert in increasing index (items of
 * at most 8), and a plain kernel sums a token's entries in increasing expert
 * index from 0.0f, acc = acc + w * out (moe_combine_kernel's arithmetic; built
 * with the library's --fmad=false).  The old kernel's bits per token do not
 * depend on which entries share an item or an item class (the batch-invariance
 * contract, tested alone vs in batch), so this is the old path's output.  Test
 * code: nothing in the library calls it.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/moe_cuda.h"
#include "backend/cuda/qmatmul_dev.cuh"
#include "wstream_ref.cuh"

#define REF_TOPK 16

/* out[t][d] = sum over the token's entries (increasing expert) of w * o[pos][d] */
static __global__ void ref_combine_kernel(const int32_t *pos, const float *wt, const int32_t *cnt, int K,
                                          const float *o, int hidden, float *out, int64_t ldo) {
    DDT_GRID_DEP_WAIT();
    const int t = blockIdx.x;
    for (int d = threadIdx.x; d < hidden; d += blockDim.x) {
        float acc = 0.0f;
        for (int k = 0; k < cnt[t]; k++) acc = acc + wt[t * K + k] * o[(int64_t)pos[t * K + k] * hidden + d];
        out[(int64_t)t * ldo + d] = acc;
    }
}

/* the old gate/up and down launches (tc_experts_launch<F, 1>), verbatim but for
 * the namespace and the items / rows they are given */
template <int F>
static cudaError_t old_experts(const ddt_cuda_moe_layer *m, const float *x, int64_t ldx, bool xvec,
                               const ref_ws::WsItem *items, int slots, int n, const int32_t *sorted_tok, float *h,
                               float *o) {
    using namespace ref_ws;
    constexpr int NT = 1;
    constexpr int MT = ws_mt<F>(NT);
    const int H = m->hidden, I = m->inter;
    const ddt_qweight *gw = &m->host_copy[0], *dw = &m->host_copy[2 * m->n_experts];
    WsArgs a;
    memset(&a, 0, sizeof a);
    a.rows = I;
    a.cols = H;
    a.nu = (H + 31) / 32;
    a.mtiles = (I + 15) / 16;
    a.fp8_block = gw->block;
    a.fp8_scols = gw->block > 0 ? (int32_t)((H + gw->block - 1) / gw->block) : 0;
    a.ks = 1;
    a.xcap = n < 8 * NT ? n : 8 * NT; /* a token reaches an expert at most once: an item has <= n entries */
    a.units_per_split = a.nu;
    a.x = x;
    a.ldx = ldx;
    a.xvec = xvec && H % 4 == 0;
    a.items = items;
    a.sorted_tok = sorted_tok;
    a.y = h;
    ws_kernel<F, WS_GATEUP, NT><<<dim3((unsigned)slots, (unsigned)((I + 8 * MT - 1) / (8 * MT))), ws_threads<F>(NT),
                                  ws_smem_bytes<F>(NT, a.xcap)>>>(a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    WsArgs b = a;
    b.rows = H;
    b.cols = I;
    b.nu = (I + 31) / 32;
    b.mtiles = (H + 15) / 16;
    b.fp8_block = dw->block;
    b.fp8_scols = dw->block > 0 ? (int32_t)((I + dw->block - 1) / dw->block) : 0;
    b.units_per_split = b.nu;
    b.x = NULL;
    b.h = h;
    b.y = o;
    ws_kernel<F, WS_DOWN, NT><<<dim3((unsigned)slots, (unsigned)((H + 16 * MT - 1) / (16 * MT))), ws_threads<F>(NT),
                                ws_smem_bytes<F>(NT, b.xcap)>>>(b);
    return cudaGetLastError();
}

/*
 * The old tensor-core experts of a packed layer (whole: first_expert 0) for n
 * tokens: x device [n][ldx]; idx, w HOST arrays [n][K] (distinct experts per
 * token, all in range); out device [n][ldo], columns < hidden written.  Returns
 * a cudaError_t (synchronises).
 */
extern "C" int ref_old_moe_tc(const ddt_cuda_moe_layer *m, const float *x, int64_t ldx, int32_t n,
                              const int32_t *idx, const float *w, int32_t K, float *out, int64_t ldo) {
    const int E = m->n_experts, M = n * K, H = m->hidden, I = m->inter;
    if (K > REF_TOPK) return (int)cudaErrorInvalidValue;
    /* entries by expert, increasing; items of at most 8 */
    int32_t *sorted_tok = (int32_t *)malloc(sizeof(int32_t) * (size_t)M), *pos_of = (int32_t *)malloc(sizeof(int32_t) * (size_t)M);
    ref_ws::WsItem *items = (ref_ws::WsItem *)malloc(sizeof(ref_ws::WsItem) * (size_t)M);
    int32_t *tpos = (int32_t *)malloc(sizeof(int32_t) * (size_t)M), *tcnt = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    float *tw = (float *)malloc(sizeof(float) * (size_t)M);
    int slots = 0, pos = 0;
    for (int e = 0; e < E; e++) {
        const int first = pos;
        for (int i = 0; i < M; i++)
            if (idx[i] == e) sorted_tok[pos] = i / K, pos_of[i] = pos++;
        for (int j = first; j < pos; j += 8) {
            ref_ws::WsItem r;
            for (int k = 0; k < 3; k++) {
                const ddt_qweight &q = m->host_copy[k * E + e];
                r.d[k] = (const uint8_t *)q.mma;
                r.s[k] = q.format == DDT_Q_INT4_GROUP ? q.mma_scale
                         : q.format == DDT_Q_FP8_BLOCK ? (const void *)q.scale_inv
                                                       : (const void *)q.scale;
            }
            r.off = j;
            r.cnt = pos - j < 8 ? pos - j : 8;
            items[slots++] = r;
        }
    }
    /* each token's entries in increasing expert index (distinct experts) */
    for (int t = 0; t < n; t++) {
        int c = 0;
        for (int e = 0; e < E; e++)
            for (int k = 0; k < K; k++)
                if (idx[t * K + k] == e) tpos[t * K + c] = pos_of[t * K + k], tw[t * K + c] = w[t * K + k], c++;
        tcnt[t] = c;
    }
    ref_ws::WsItem *d_items = NULL;
    int32_t *d_sorted = NULL, *d_tpos = NULL, *d_tcnt = NULL;
    float *d_h = NULL, *d_o = NULL, *d_tw = NULL;
    cudaError_t e = cudaSuccess;
#define REF_TRY(call)                       \
    do {                                    \
        if (e == cudaSuccess) e = (call);   \
    } while (0)
    REF_TRY(cudaMalloc((void **)&d_items, sizeof(ref_ws::WsItem) * (size_t)(slots > 0 ? slots : 1)));
    REF_TRY(cudaMalloc((void **)&d_sorted, sizeof(int32_t) * (size_t)M));
    REF_TRY(cudaMalloc((void **)&d_tpos, sizeof(int32_t) * (size_t)M));
    REF_TRY(cudaMalloc((void **)&d_tcnt, sizeof(int32_t) * (size_t)n));
    REF_TRY(cudaMalloc((void **)&d_tw, sizeof(float) * (size_t)M));
    REF_TRY(cudaMalloc((void **)&d_h, sizeof(float) * (size_t)M * I));
    REF_TRY(cudaMalloc((void **)&d_o, sizeof(float) * (size_t)M * H));
    REF_TRY(cudaMemcpy(d_items, items, sizeof(ref_ws::WsItem) * (size_t)slots, cudaMemcpyHostToDevice));
    REF_TRY(cudaMemcpy(d_sorted, sorted_tok, sizeof(int32_t) * (size_t)M, cudaMemcpyHostToDevice));
    REF_TRY(cudaMemcpy(d_tpos, tpos, sizeof(int32_t) * (size_t)M, cudaMemcpyHostToDevice));
    REF_TRY(cudaMemcpy(d_tcnt, tcnt, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice));
    REF_TRY(cudaMemcpy(d_tw, tw, sizeof(float) * (size_t)M, cudaMemcpyHostToDevice));
    REF_TRY(cudaMemset(d_h, 0xFF, sizeof(float) * (size_t)M * I)); /* NaN: the old kernels wrote every value read */
    REF_TRY(cudaMemset(d_o, 0xFF, sizeof(float) * (size_t)M * H));
    REF_TRY((ref_ws::ws_set_smem<ref_ws::WS_GATEUP, 1>()));
    REF_TRY((ref_ws::ws_set_smem<ref_ws::WS_DOWN, 1>()));
    const bool xvec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
    if (e == cudaSuccess) {
        switch (qfmt_of(m->host_copy[0])) {
        case QF_BF16: e = old_experts<QF_BF16>(m, x, ldx, xvec, d_items, slots, n, d_sorted, d_h, d_o); break;
        case QF_FP8: e = old_experts<QF_FP8>(m, x, ldx, xvec, d_items, slots, n, d_sorted, d_h, d_o); break;
        case QF_INT4: e = old_experts<QF_INT4>(m, x, ldx, xvec, d_items, slots, n, d_sorted, d_h, d_o); break;
        default: e = cudaErrorInvalidValue; break;
        }
    }
    if (e == cudaSuccess) {
        ref_combine_kernel<<<(unsigned)n, 256>>>(d_tpos, d_tw, d_tcnt, K, d_o, H, out, ldo);
        e = cudaGetLastError();
    }
    REF_TRY(cudaDeviceSynchronize());
#undef REF_TRY
    cudaFree(d_items), cudaFree(d_sorted), cudaFree(d_tpos), cudaFree(d_tcnt), cudaFree(d_tw), cudaFree(d_h),
        cudaFree(d_o);
    free(sorted_tok), free(pos_of), free(items), free(tpos), free(tcnt), free(tw);
    return (int)e;
}
