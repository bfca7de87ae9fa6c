/*
 * cuda_check.h — error checking for the CUDA backend's host launchers: every
 * API call and every launch is checked, and failures become a ddt_status with
 * a message naming the call, the file and the line (never exit()).  Define
 * DDT_CUDA_SYNC_CHECK to synchronise after each launch (debug builds), so a
 * fault is reported at the kernel that caused it.
 */
#ifndef DDT_CUDA_CHECK_H
#define DDT_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "core/alloc.h"
#include "core/error.h"

#define DDT_CUDA_TRY(call, err)                                                              \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess)                                                               \
            return ddt_fail((err), DDT_ERR_INTERNAL, "CUDA: %s failed at %s:%d: %s", #call,   \
                            __FILE__, __LINE__, cudaGetErrorString(e_));                     \
    } while (0)

#ifdef DDT_CUDA_SYNC_CHECK
#define DDT_CUDA_LAUNCHED(name, stream, err)                                                 \
    do {                                                                                     \
        DDT_CUDA_TRY(cudaGetLastError(), err);                                               \
        DDT_CUDA_TRY(cudaStreamSynchronize(stream), err);                                    \
    } while (0)
#else
#define DDT_CUDA_LAUNCHED(name, stream, err) DDT_CUDA_TRY(cudaGetLastError(), err)
#endif

/* Programmatic dependent launch.  The engine turns the kernel-to-kernel edges of
 * its captured round graphs into programmatic edges (engine_cuda.c), so a kernel's
 * blocks are scheduled while its predecessor still runs; every kernel of the
 * backend therefore opens with this wait, which returns once every grid it
 * depends on has finished and its writes are visible.  Outside a programmatic
 * edge it returns at once.  tests/check_grid_wait.sh checks that no kernel lacks it. */
#if defined(__CUDACC__)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DDT_GRID_DEP_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define DDT_GRID_DEP_WAIT() \
    do {                    \
    } while (0)
#endif
/* The first statement of a kernel that waits later, after loads of the model's
 * weights (which no kernel of a round writes), so those loads overlap the
 * predecessor: the kernel must still wait before any other global access.  It
 * marks the kernel for the source check (tests/python/test_cuda_sources.py).
 * Such a kernel takes no __restrict__ pointer: ptxas reads a restrict const
 * pointer with ld.global.nc, which it may hoist above griddepcontrol.wait (seen
 * on sm_90a: a norm's residual row read before the wait), i.e. read a
 * predecessor's output before it is written.  Its early weight loads go through
 * __ldg, free to move. */
#define DDT_GRID_DEP_LATER() \
    do {                     \
    } while (0)
/* The first statement of a kernel that learns from flags in global memory, written
 * with release semantics by a kernel that did wait, that what it reads is written
 * (the wgmma experts' down launch, wgmma_experts.cuh: the gate/up launch's CTAs
 * publish each slot's h), and executes griddepcontrol.wait only at its end, so
 * that its end still implies its predecessors' ends.  Before the flag it may read
 * only the model's weights.  A marker for the source check too. */
#define DDT_GRID_DEP_FLAGS() \
    do {                     \
    } while (0)
#endif

/* A cudaLaunchKernelEx configuration's thread-block cluster of x * y * 1 CTAs (the
 * k-split and split-KV reductions through distributed shared memory): attr is the
 * caller's storage for the one attribute, alive until the launch. */
static inline void ddt_cuda_set_cluster(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *attr, unsigned x, unsigned y) {
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = x;
    attr->val.clusterDim.y = y;
    attr->val.clusterDim.z = 1;
    cfg->attrs = attr;
    cfg->numAttrs = 1;
}

/* The backend's one checked device allocation: *p = n elements of sz bytes (at
 * least one, so an empty buffer is still a valid pointer), the size product
 * overflow-checked; *counter (when not NULL) grows by the bytes taken. */
static inline ddt_status ddt_cuda_malloc_array(void **p, size_t n, size_t sz, uint64_t *counter, ddt_error *err) {
    size_t bytes;
    if (!ddt_mul_size(n ? n : 1, sz, &bytes))
        return ddt_fail(err, DDT_ERR_RANGE, "device buffer of %zu x %zu bytes overflows", n, sz);
    DDT_CUDA_TRY(cudaMalloc(p, bytes), err);
    if (counter) *counter += bytes;
    return DDT_OK;
}

#endif
