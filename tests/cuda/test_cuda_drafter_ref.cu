/*
 * test_cuda_drafter_ref.cu — the two launches the drafter's append ran before
 * their work was folded into its other launches (fourth session of 2026-12-04),
 * kept as test_cuda_drafter.c's references:
 *   - ref_dflash_clamp_rows: out[k] = rows[min(k, m - 1)] for k < max_m (0 when
 *     m < 1), the accepted path's rows with the slots past m (whatever the caller
 *     left there) replaced by a row that exists; now inside the gather
 *     (ddt_cuda_gather_rows_multi_clamped);
 *   - ref_dflash_advance: one thread applies the append rule (dflash_cuda.h):
 *     len += count when count is in [0, max_count] and len + count <= limit, else
 *     *status = DDT_DFLASH_BAD_APPEND; now done by the last block of the append's
 *     last qkv_prep (advance_ticket).
 * Test code: nothing in the library calls it.  Each returns the launch's error.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dflash_cuda.h"

static __global__ void ref_clamp_rows_kernel(const int32_t *__restrict__ rows, const int32_t *__restrict__ m_p,
                                             int max_m, int32_t *__restrict__ out) {
    DDT_GRID_DEP_WAIT();
    int m = *m_p;
    if (m > max_m) m = max_m;
    for (int k = threadIdx.x; k < max_m; k += blockDim.x) out[k] = m >= 1 ? rows[k < m ? k : m - 1] : 0;
}

extern "C" cudaError_t ref_dflash_clamp_rows(const int32_t *rows, const int32_t *m, int32_t max_m, int32_t *out,
                                             cudaStream_t s) {
    ref_clamp_rows_kernel<<<1, 64, 0, s>>>(rows, m, max_m, out);
    return cudaGetLastError();
}

static __global__ void ref_advance_kernel(int32_t *len_p, int32_t *status, const int32_t *count_dev, int count_host,
                                          int max_count, int limit) {
    DDT_GRID_DEP_WAIT();
    const int len = *len_p, count = count_dev ? *count_dev : count_host;
    if (count >= 0 && count <= max_count && len >= 0 && (long long)len + count <= (long long)limit)
        *len_p = len + count;
    else
        *status = DDT_DFLASH_BAD_APPEND;
}

extern "C" cudaError_t ref_dflash_advance(int32_t *len, int32_t *status, const int32_t *count_dev, int32_t count_host,
                                          int32_t max_count, int32_t limit, cudaStream_t s) {
    ref_advance_kernel<<<1, 1, 0, s>>>(len, status, count_dev, count_host, max_count, limit);
    return cudaGetLastError();
}
