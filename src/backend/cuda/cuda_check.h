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

#endif
