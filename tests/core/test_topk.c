/*
 * test_topk.c — ddt_topk_logsoftmax (src/core/topk.c, the CPU twin of
 * ddt_cuda_topk_logsoftmax) against a qsort + double logsumexp reference on
 * random rows with many equal logits (ids and values exactly), k = 1 and k = v,
 * and the NaN error.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/error.h"
#include "core/topk.h"

static int cmp_ref(const void *pa, const void *pb) {
    const ddt_zid *a = pa, *b = pb;
    if (a->z != b->z) return a->z > b->z ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static void test_topk_matches_reference(void **state) {
    (void)state;
    srand(11);
    static float z[3000], logq[3000];
    static int32_t tok[3000];
    static ddt_zid scratch[3000], ref[3000];
    for (int it = 0; it < 200; it++) {
        int32_t v = 1 + rand() % 3000;
        int32_t k = it % 3 == 0 ? 1 : it % 3 == 1 ? v : 1 + rand() % v;
        for (int32_t i = 0; i < v; i++) {
            z[i] = (float)(rand() % 33) * 0.25f - 4.0f;
            ref[i] = (ddt_zid){z[i], i};
        }
        qsort(ref, (size_t)v, sizeof *ref, cmp_ref);
        double s = 0.0;
        for (int32_t i = 0; i < v; i++) s += exp((double)z[i] - (double)ref[0].z);
        float lse = (float)((double)ref[0].z + log(s));
        ddt_error err = {0};
        assert_int_equal(ddt_topk_logsoftmax(z, v, k, scratch, logq, tok, 0, &err), DDT_OK);
        for (int32_t i = 0; i < k; i++) {
            assert_int_equal(tok[i], ref[i].id);
            assert_true(logq[i] == ref[i].z - lse);
        }
    }
}

static void test_topk_nan(void **state) {
    (void)state;
    float z[5] = {0.0f, 1.0f, NAN, 2.0f, 3.0f}, logq[2];
    int32_t tok[2];
    ddt_zid scratch[5];
    ddt_error err = {0};
    assert_int_equal(ddt_topk_logsoftmax(z, 5, 2, scratch, logq, tok, 7, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "[7][2]"));
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_topk_matches_reference),
                                       cmocka_unit_test(test_topk_nan)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
