/*
 * zsort.h — in-place sorts that never allocate (glibc's qsort may call malloc for
 * large arrays, and nothing may allocate inside a decoding round): heapsort of
 * (logit, id) pairs into (logit desc, id asc) order, and of int32 ascending.
 * Ids are unique, so the order is total and the result does not depend on the
 * algorithm.
 */
#ifndef DDT_CORE_ZSORT_H
#define DDT_CORE_ZSORT_H

#include <stdint.h>

typedef struct ddt_zid {
    float z;
    int32_t id;
} ddt_zid;

/* Sort a[0..n) by z descending, then id ascending. NaN must not occur. */
void ddt_zid_sort_desc(ddt_zid *a, int32_t n);
/* The top k of z[0..v) (1 <= k <= v) in (z desc, id asc) order into out[0..k):
 * a bounded heap over the values, then a sort of the k kept; O(v log k). */
void ddt_zid_top_k(const float *z, int32_t v, int32_t k, ddt_zid *out);
/* Sort a[0..n) ascending. */
void ddt_i32_sort_asc(int32_t *a, int32_t n);

#endif
