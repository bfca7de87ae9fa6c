/*
 * backend_ops.h — the backend-op harness of the GPU tests (issue 16, step 3):
 * one comparison of a GPU op's output with its CPU twin's output (NOTES.md,
 * "GPU kernels and their CPU twins", pairs them), so that a test states its
 * inputs, the two calls and the bound, and no test carries its own copy of a
 * CPU reference or of the error arithmetic.
 *
 * Users: test_cuda_tree.c (top-K vs ddt_topk_logsoftmax), test_cuda_kv.c (KV
 * commit vs ddt_cpu_kv_commit, bitwise), test_cuda_moe.c (routed experts vs
 * ddt_cpu_moe_experts), test_cuda_drafter.c (block attention vs
 * ddt_cpu_dflash_attention, and the drafter's logits).  Compiled everywhere nvcc
 * is; NOT yet run on a GPU (scripts/gpu-test.sh runs them).
 *
 * Convention: the GPU output buffer is poisoned with 0xFF bytes before the
 * launch (bo_poison), which reads back as NaN floats and -1 ints, so an element
 * the op never wrote shows as a NaN where the CPU has a number.
 */
#ifndef DDT_TESTS_BACKEND_OPS_H
#define DDT_TESTS_BACKEND_OPS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cuda_test.h"

/* How got must match ref. */
typedef struct bo_cmp {
    double bound;  /* normalised error ||got - ref|| / ||ref|| must stay below it (when not bitwise) */
    bool bitwise;  /* every element's 32 bits equal (NaN payloads and -0.0 included) */
} bo_cmp;

/* Poison device memory before a launch: 0xFF bytes (NaN floats, -1 ints). */
static inline void bo_poison(void *dev, size_t bytes) { CU(cudaMemset(dev, 0xFF, bytes)); }

/*
 * Compare n floats of got (the GPU's, host copy) with ref (the CPU twin's):
 *   - poison: an element that is NaN in got but not in ref was not written (or
 *     went wrong): each is a failure, the first one named;
 *   - bitwise: the first element whose bits differ is a failure;
 *   - otherwise sqrt(sum (got - ref)^2 / sum ref^2) < c.bound over the elements
 *     that are not NaN in both (a NaN on one side only is the poison failure).
 * Failures go through CHECK with `what` in the message.  Returns the normalised
 * error (computed in both modes, for the log).
 */
static inline double bo_compare(const char *what, const float *got, const float *ref, size_t n, bo_cmp c) {
    size_t poisoned = 0, first_poison = 0, first_diff = n;
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        const bool gn = isnan(got[i]), rn = isnan(ref[i]);
        if (gn && !rn) {
            if (!poisoned++) first_poison = i;
            continue;
        }
        if (c.bitwise && first_diff == n && memcmp(&got[i], &ref[i], sizeof(float)) != 0) first_diff = i;
        if (gn || rn) continue;
        const double d = (double)got[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    const double nerr = den > 0.0 ? sqrt(num / den) : sqrt(num);
    CHECK(poisoned == 0, "%s: %zu of %zu elements NaN on the GPU only (first [%zu], CPU %g)", what, poisoned, n,
          first_poison, poisoned ? (double)ref[first_poison] : 0.0);
    if (c.bitwise)
        CHECK(first_diff == n, "%s: not bitwise the CPU: first difference at [%zu]: GPU %.9g, CPU %.9g", what,
              first_diff, first_diff < n ? (double)got[first_diff] : 0.0, first_diff < n ? (double)ref[first_diff] : 0.0);
    else
        CHECK(nerr < c.bound, "%s: normalised error %.3g >= %.3g", what, nerr, c.bound);
    return nerr;
}

#endif
