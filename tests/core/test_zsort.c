/*
 * test_zsort.c — the non-allocating heapsorts against qsort on random arrays
 * with many equal logits, odd sizes included (src/core/zsort.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/zsort.h"

static int cmp_ref(const void *pa, const void *pb) {
    const ddt_zid *a = pa, *b = pb;
    if (a->z != b->z) return a->z > b->z ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static int cmp_i32(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

static void test_sorts_match_qsort(void **state) {
    (void)state;
    srand(5);
    static ddt_zid a[5000], b[5000];
    static int32_t x[5000], y[5000];
    for (int it = 0; it < 200; it++) {
        int32_t n = it < 10 ? it : 1 + rand() % 5000;
        for (int32_t i = 0; i < n; i++) {
            a[i] = (ddt_zid){(float)(rand() % 17) * 0.5f - 4.0f, i};
            x[i] = rand() % 1000 - 500;
        }
        /* shuffle ids so equal logits arrive in any order */
        for (int32_t i = n - 1; i > 0; i--) {
            int32_t j = rand() % (i + 1);
            ddt_zid t = a[i];
            a[i] = a[j];
            a[j] = t;
        }
        memcpy(b, a, (size_t)n * sizeof *a);
        memcpy(y, x, (size_t)n * sizeof *x);
        ddt_zid_sort_desc(a, n);
        qsort(b, (size_t)n, sizeof *b, cmp_ref);
        ddt_i32_sort_asc(x, n);
        qsort(y, (size_t)n, sizeof *y, cmp_i32);
        /* top-k: the first k of the full sort */
        if (n > 0) {
            static float z[5000];
            static ddt_zid top[5000];
            for (int32_t i = 0; i < n; i++) z[b[i].id] = b[i].z;
            int32_t k = 1 + rand() % n;
            ddt_zid_top_k(z, n, k, top);
            for (int32_t i = 0; i < k; i++) {
                assert_true(top[i].z == b[i].z);
                assert_int_equal(top[i].id, b[i].id);
            }
        }
        for (int32_t i = 0; i < n; i++) {
            assert_true(a[i].z == b[i].z);
            assert_int_equal(a[i].id, b[i].id);
            assert_int_equal(x[i], y[i]);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sorts_match_qsort)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
