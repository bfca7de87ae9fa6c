/*
 * test_cuda_qmatmul_ref.cu — the references for test_cuda_qmatmul.c, kept so
 * that the test can require the new kernels to give the same bits.  Built with
 * the library's flags (--fmad=false).  Test code: nothing in the library calls it.
 *   - the x W kernel as it was before the latency rework (commit b04003a,
 *     src/backend/cuda/qmatmul_cuda.cu: one thread per column, 4 tokens, one
 *     dependent weight load per row), unchanged but for its name;
 *   - the tensor-core x W^T before the activations were split once per product:
 *     wstream_ref.cuh's ws_kernel with qmatmul_cuda.cu's launch code of that
 *     commit (ws_ksplit, ws_dense_launch, ws_dense, tc_matmul), unchanged but
 *     for namespace ref_ws and a cudaError_t instead of a ddt_status.
 */
#include <cuda_runtime.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/qmatmul_cuda.h"
#include "backend/cuda/qmatmul_dev.cuh"
#include "wstream_ref.cuh"

#define OLD_MT_THREADS 128
#define OLD_MT_TB 4

/* OLD mt_kernel, verbatim */
static __global__ void __launch_bounds__(OLD_MT_THREADS)
old_mt_kernel(const ddt_qweight w, const ddt_row_groups g, const float *__restrict__ x, int64_t ldx, int32_t n,
              float *__restrict__ y, int64_t ldy) {
    DDT_GRID_DEP_WAIT();
    const int64_t j = (int64_t)blockIdx.x * OLD_MT_THREADS + threadIdx.x;
    const int64_t grp = blockIdx.y;
    const int32_t t0 = (int32_t)blockIdx.z * OLD_MT_TB;
    if (j >= w.cols) return;
    const int ntok = n - t0 < OLD_MT_TB ? n - t0 : OLD_MT_TB;
    float acc[OLD_MT_TB];
#pragma unroll
    for (int t = 0; t < OLD_MT_TB; t++) acc[t] = 0.0f;
    const int64_t wrow0 = grp * g.w_row_stride + g.w_row_offset;
    const float *xb = x + (int64_t)t0 * ldx + grp * g.x_stride;
    for (int64_t i = 0; i < g.rows; i++) {
        const float wv = qdeq_elem(w, wrow0 + i, j);
#pragma unroll
        for (int t = 0; t < OLD_MT_TB; t++)
            if (t < ntok) acc[t] = acc[t] + xb[t * ldx + i] * wv;
    }
#pragma unroll
    for (int t = 0; t < OLD_MT_TB; t++)
        if (t < ntok) y[(int64_t)(t0 + t) * ldy + grp * g.y_stride + j] = acc[t];
}

/* Launch the old kernel with the old grid on a device weight; the launch's error. */
extern "C" int ref_old_matmul_t_grouped(const ddt_qweight *w, const ddt_row_groups *g, const float *x, int64_t ldx,
                                        int32_t n, float *y, int64_t ldy) {
    dim3 grid((unsigned)((w->cols + OLD_MT_THREADS - 1) / OLD_MT_THREADS), (unsigned)g->count,
              (unsigned)((n + OLD_MT_TB - 1) / OLD_MT_TB));
    old_mt_kernel<<<grid, OLD_MT_THREADS>>>(*w, *g, x, ldx, n, y, ldy);
    return (int)cudaGetLastError();
}

/* OLD tensor-core launch code (qmatmul_cuda.cu), verbatim but for the namespace
 * and the tail of tc_matmul, which returns the launch's cudaError_t */
namespace ref_ws {

/* k-splits of a dense product, from its shape alone: enough blocks of 64 rows to
 * cover the H200's 132 multiprocessors, each split at least 8 units long. */
static int32_t ws_ksplit(int64_t rows, int32_t count, int64_t nu) {
    const int64_t blocks = (rows + 63) / 64 * count;
    int32_t ks = 1;
    while (ks < 8 && blocks * ks < 132 && nu >= (int64_t)16 * ks) ks *= 2;
    return ks;
}

template <int F, int NT>
static cudaError_t ws_dense_launch(const WsArgs &a, cudaStream_t s) {
    constexpr int MT = ws_mt<F>(NT);
    const int64_t nrb = (a.rows + 16 * MT - 1) / (16 * MT), ntb = (a.n + NT * 8 - 1) / (NT * 8);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(ntb * a.count * nrb * a.ks));
    cfg.blockDim = dim3(ws_threads<F>(NT));
    WsArgs b = a;
    b.xcap = a.n < NT * 8 ? a.n : NT * 8;
    cfg.dynamicSmemBytes = ws_smem_bytes<F>(NT, b.xcap);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    if (a.ks > 1) {
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)a.ks;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, ws_kernel<F, WS_DENSE, NT>, b);
}

/* NT n-tiles by n (a block carries up to 64 tokens; more tokens take more token
 * blocks): the work split only, never the arithmetic. */
template <int F>
static cudaError_t ws_dense(const WsArgs &a, cudaStream_t s) {
    if (a.n <= 8) return ws_dense_launch<F, 1>(a, s);
    if (a.n <= 16) return ws_dense_launch<F, 2>(a, s);
    if (a.n <= 32) return ws_dense_launch<F, 4>(a, s);
    return ws_dense_launch<F, 8>(a, s);
}

/* set_io's assignments (qmatmul_cuda.cu), for WsArgs */
static void set_io(WsArgs &a, const ddt_row_groups *g, const float *x, int64_t ldx, int32_t n, float *y, int64_t ldy) {
    a.count = g->count;
    a.x = x;
    a.ldx = ldx;
    a.x_stride = g->x_stride;
    a.n = n;
    a.y = y;
    a.ldy = ldy;
    a.y_stride = g->y_stride;
    a.xvec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0 && g->x_stride % 4 == 0;
}

static cudaError_t tc_matmul(const ddt_qweight *w, const ddt_row_groups *g, const float *x, int64_t ldx, int32_t n,
                             float *y, int64_t ldy, cudaStream_t s) {
    WsArgs a;
    memset(&a, 0, sizeof a);
    const int F = qfmt_of(*w);
    a.rows = g->rows;
    a.cols = w->cols;
    a.nu = (w->cols + 31) / 32;
    a.mtiles = (w->rows + 15) / 16;
    a.fp8_block = w->block;
    a.fp8_scols = (int32_t)((w->cols + w->block - 1) / (w->block > 0 ? w->block : 1));
    a.ks = ws_ksplit(g->rows, g->count, a.nu);
    const int64_t kw = F == QF_INT4 ? ws_kw<QF_INT4>() : ws_kw<QF_BF16>(); /* k-slices: splits hold whole stages */
    a.units_per_split = ((a.nu + a.ks - 1) / a.ks + kw - 1) / kw * kw;
    a.wd = (const uint8_t *)w->mma;
    a.wsc = F == QF_INT4 ? w->mma_scale : F == QF_FP8 ? (const void *)w->scale_inv : NULL;
    a.mt_stride = g->w_row_stride / 16;
    a.mt_offset = g->w_row_offset / 16;
    set_io(a, g, x, ldx, n, y, ldy);
    a.xvec = a.xvec && w->cols % 4 == 0;
    switch (F) {
    case QF_BF16: return ws_dense<QF_BF16>(a, s);
    case QF_FP8: return ws_dense<QF_FP8>(a, s);
    default: return ws_dense<QF_INT4>(a, s);
    }
}

} /* namespace ref_ws */

/* The old tensor-core x W^T (grouped; a packed weight whose groups start on
 * 16-row tiles, as ddt_cuda_matmul_grouped_mode requires for that path) on the
 * default stream; the launch's error. */
extern "C" int ref_old_tc_matmul_grouped(const ddt_qweight *w, const ddt_row_groups *g, const float *x, int64_t ldx,
                                         int32_t n, float *y, int64_t ldy) {
    cudaError_t e = ref_ws::ws_set_smem<ref_ws::WS_DENSE, 1, 2, 4, 8>();
    if (e != cudaSuccess) return (int)e;
    e = ref_ws::tc_matmul(w, g, x, ldx, n, y, ldy, NULL);
    return (int)(e != cudaSuccess ? e : cudaGetLastError());
}
