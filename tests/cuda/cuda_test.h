/*
 * cuda_test.h — what the GPU test programs share: a failure counter with CHECK,
 * which records and goes on, and CU / OK, which stop at a CUDA or library error
 * (nothing useful can follow one).  Each test is one translation unit.
 */
#ifndef DDT_TESTS_CUDA_TEST_H
#define DDT_TESTS_CUDA_TEST_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddtree.h"
#include "text/tokenizer.h"

/* The tests' random numbers: xorshift64 on a state each test seeds itself (so
 * each test draws the data it always drew), its high bits as one 32-bit draw
 * (>> 16; two tests take >> 11). */
static inline uint32_t ct_xorshift(uint64_t *state, int shift) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return (uint32_t)(x >> shift);
}

/* Host-side poison: a NaN whose payload no kernel produces (theirs are
 * 0x7FFFFFFF), so an element a kernel should not have written is recognised. */
#define CT_POISON 0x7FC0DEADu
static inline void ct_poison(float *p, size_t n) {
    const uint32_t u = CT_POISON;
    for (size_t i = 0; i < n; i++) memcpy(&p[i], &u, 4);
}
static inline int ct_is_poison(const float *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return u == CT_POISON;
}

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

/* The shipped pair's held-out prompt (examples/heldout_prompt.py) as token ids, at
 * most cap of them; false (with a message) when the file is not there. */
static inline bool cuda_test_heldout_ids(int32_t *ids, size_t cap, size_t *n_ids) {
    ddt_tokenizer *tok;
    OK(ddt_tokenizer_load("models/pystdlib-target", &tok, &err_));
    FILE *f = fopen("examples/heldout_prompt.py", "rb");
    if (!f) {
        fprintf(stderr, "cannot open examples/heldout_prompt.py (run from the repository root)\n");
        ddt_tokenizer_free(tok);
        return false;
    }
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    OK(ddt_tokenizer_encode(tok, text, len, 0, ids, cap, n_ids, &err_));
    ddt_tokenizer_free(tok);
    return true;
}

#endif
