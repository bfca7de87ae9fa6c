/*
 * test_cuda_qmatmul_ref.cu — the reference for test_cuda_qmatmul.c's x W sweep:
 * the x W kernel as it was before the latency rework (commit b04003a,
 * src/backend/cuda/qmatmul_cuda.cu: one thread per column, 4 tokens, one
 * dependent weight load per row), unchanged but for its name, so that the test
 * can require the new kernel to give the same bits.  Built with the library's
 * flags (--fmad=false).  Test code: nothing in the library calls it.
 */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/qmatmul_cuda.h"
#include "backend/cuda/qmatmul_dev.cuh"

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
