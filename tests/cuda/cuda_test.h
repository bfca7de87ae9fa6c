/*
 * cuda_test.h — what the GPU test programs share: a failure counter with CHECK,
 * which records and goes on, and CU / OK, which stop at a CUDA or library error
 * (nothing useful can follow one).  Each test is one translation unit.
 */
#ifndef DDT_TESTS_CUDA_TEST_H
#define DDT_TESTS_CUDA_TEST_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "ddtree.h"

static int g_failures = 0;
#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            g_failures++;                                                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                          \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fputc('\n', stderr);                                                          \
        }                                                                                 \
    } while (0)
#define CU(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", #call, __FILE__, __LINE__,    \
                    cudaGetErrorString(e_));                                              \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)
#define OK(call)                                                                          \
    do {                                                                                  \
        ddt_error err_;                                                                   \
        if ((call) != DDT_OK) {                                                           \
            fprintf(stderr, "error at %s:%d: %s\n", __FILE__, __LINE__, err_.msg);       \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#endif
