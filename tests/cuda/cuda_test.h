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
#include "io/safetensors.h"
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

/* A uniform draw in [-1, 1) from the high bits (the tests' frand). */
static inline float ct_frand(uint64_t *rng) {
    return (float)(ct_xorshift(rng, 16) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
}

/* A random host weight of format f (0 F32, 1 BF16, 2 F16, 3 FP8 with 128-blocks,
 * 4 INT4 group 32) [rows][cols], drawn from *rng in a fixed order; the value
 * ranges are the test's own (ct_weight_values).  FP8 never NaN, F16 finite. */
typedef struct ct_weight_values {
    float dense;       /* F32 / BF16: dense * frand */
    int f16_exponents; /* F16: biased exponent 0 (subnormal) .. f16_exponents - 1 */
    float fp8_scale;   /* FP8 block scales: fp8_scale * (1.5 + frand) */
    float int4_scale;  /* INT4 group scales: int4_scale * (1.5 + frand) */
} ct_weight_values;

typedef struct ct_weight {
    ddt_qweight w;
    void *data, *scale;
} ct_weight;

static inline ct_weight ct_make_weight(uint64_t *rng, int f, int64_t rows, int64_t cols, const ct_weight_values *v) {
    ct_weight h;
    memset(&h, 0, sizeof h);
    ddt_qweight *w = &h.w;
    w->rows = rows;
    w->cols = cols;
    w->block = DDT_FP8_BLOCK;
    w->group = DDT_INT4_GROUP;
    const size_t n = (size_t)rows * (size_t)cols;
    if (f == 0) {
        w->format = DDT_Q_DENSE, w->dtype = DDT_DTYPE_F32;
        float *d = malloc(n * 4);
        for (size_t i = 0; i < n; i++) d[i] = v->dense * ct_frand(rng);
        h.data = d;
    } else if (f == 1) {
        w->format = DDT_Q_DENSE, w->dtype = DDT_DTYPE_BF16;
        uint16_t *d = malloc(n * 2);
        for (size_t i = 0; i < n; i++) d[i] = ddt_f32_to_bf16(v->dense * ct_frand(rng));
        h.data = d;
    } else if (f == 2) {
        w->format = DDT_Q_DENSE, w->dtype = DDT_DTYPE_F16;
        uint16_t *d = malloc(n * 2);
        for (size_t i = 0; i < n; i++) { /* random sign and mantissa */
            const uint32_t r = ct_xorshift(rng, 16);
            d[i] = (uint16_t)(((r & 1u) << 15) | (((r >> 1) % (uint32_t)v->f16_exponents) << 10) | ((r >> 8) & 0x3FFu));
        }
        h.data = d;
    } else if (f == 3) {
        w->format = DDT_Q_FP8_BLOCK, w->dtype = DDT_DTYPE_F8_E4M3;
        uint8_t *d = malloc(n);
        for (size_t i = 0; i < n; i++) {
            uint8_t b = (uint8_t)ct_xorshift(rng, 16);
            if ((b & 0x7Fu) == 0x7Fu) b ^= 1u; /* no NaN */
            d[i] = b;
        }
        const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
        float *s = malloc((size_t)(sr * sc) * 4);
        for (int64_t i = 0; i < sr * sc; i++) s[i] = v->fp8_scale * (1.5f + ct_frand(rng));
        h.data = d, h.scale = s;
        w->scale_inv = s;
    } else {
        w->format = DDT_Q_INT4_GROUP, w->dtype = DDT_DTYPE_I32;
        const int64_t words = (cols + 7) / 8, groups = (cols + 31) / 32;
        uint32_t *d = malloc((size_t)(rows * words) * 4);
        for (int64_t i = 0; i < rows * words; i++) {
            const uint32_t lo = ct_xorshift(rng, 16); /* in the order the tests always drew them */
            d[i] = lo ^ (ct_xorshift(rng, 16) << 16);
        }
        uint16_t *s = malloc((size_t)(rows * groups) * 2);
        for (int64_t i = 0; i < rows * groups; i++) s[i] = ddt_f32_to_bf16(v->int4_scale * (1.5f + ct_frand(rng)));
        h.data = d, h.scale = s;
        w->scale = s;
    }
    w->data = h.data;
    return h;
}

static inline void ct_free_weight(ct_weight *h) {
    free(h->data);
    free(h->scale);
    h->data = h->scale = NULL;
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
/* The program's last word: "<name>: all passed" and 0, or the failure count
 * (on stderr) and 1. */
#define ct_report(name) ct_report_(name, g_failures)
static inline int ct_report_(const char *name, int failures) {
    if (failures) {
        fprintf(stderr, "%s: %d failures\n", name, failures);
        return 1;
    }
    printf("%s: all passed\n", name);
    return 0;
}
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

/* A device copy of `bytes` host bytes (a 1-byte allocation for none, so the
 * pointer is never NULL); the caller cudaFrees it. */
static inline void *ct_dev_copy(const void *h, size_t bytes) {
    void *d;
    CU(cudaMalloc(&d, bytes ? bytes : 1));
    if (bytes) CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* The device's copy bandwidth in bytes per second (read + written), the
 * benchmarks' roofline: the mean of 5 device-to-device copies of 2 GiB after
 * one warm-up. */
static inline double ct_copy_bandwidth(void) {
    const size_t bytes = (size_t)2 << 30;
    void *a, *b;
    CU(cudaMalloc(&a, bytes));
    CU(cudaMalloc(&b, bytes));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    CU(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    CU(cudaEventRecord(e0, 0));
    for (int i = 0; i < 5; i++) CU(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    CU(cudaEventRecord(e1, 0));
    CU(cudaEventSynchronize(e1));
    float ms;
    CU(cudaEventElapsedTime(&ms, e0, e1));
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    CU(cudaFree(a));
    CU(cudaFree(b));
    return 5.0 * 2.0 * (double)bytes / (ms * 1e-3);
}

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
