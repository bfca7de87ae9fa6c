/*
 * test_sampler.c — Philox4x32-10 known answers, the deterministic exp, greedy
 * argmax ties, reproducibility, top-k / top-p supports, and sample frequencies
 * against softmax (src/core/sampler.c, src/core/detmath.c).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/detmath.h"
#include "ddtree.h"

/* Known-answer vectors of Random123 (kat_vectors, philox4x32 with 10 rounds). */
static void test_philox_known_answers(void **state) {
    (void)state;
    const uint32_t ctr0[4] = {0, 0, 0, 0}, key0[2] = {0, 0};
    const uint32_t want0[4] = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
    const uint32_t ctr1[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    const uint32_t key1[2] = {0xffffffffu, 0xffffffffu};
    const uint32_t want1[4] = {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu};
    const uint32_t ctr2[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
    const uint32_t key2[2] = {0xa4093822u, 0x299f31d0u};
    const uint32_t want2[4] = {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u};
    uint32_t out[4];
    ddt_philox4x32_10(ctr0, key0, out);
    assert_memory_equal(out, want0, sizeof out);
    ddt_philox4x32_10(ctr1, key1, out);
    assert_memory_equal(out, want1, sizeof out);
    ddt_philox4x32_10(ctr2, key2, out);
    assert_memory_equal(out, want2, sizeof out);
}

static void test_exp_det(void **state) {
    (void)state;
    double worst = 0.0;
    for (int i = 0; i <= 200000; i++) {
        float x = -87.0f + 87.0f * (float)i / 200000.0f;
        double ref = exp((double)x);
        double rel = fabs((double)ddt_exp_det(x) - ref) / ref;
        if (rel > worst) worst = rel;
    }
    assert_true(worst < 4e-7); /* a few ulp */
    assert_true(ddt_exp_det(0.0f) == 1.0f);
    assert_true(ddt_exp_det(-100.0f) == 0.0f);
    assert_true(isnan(ddt_exp_det(NAN)));
}

static void test_greedy(void **state) {
    (void)state;
    float z[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, -INFINITY};
    ddt_sampling s = {0.0f, 0, 1.0f, 1};
    int32_t tok;
    assert_int_equal(ddt_sample_token(NULL, z, 6, &s, 0, 0, &tok, NULL), DDT_OK);
    assert_int_equal(tok, 1); /* lowest id among the tied maxima */
    ddt_error err;
    z[4] = NAN;
    assert_int_equal(ddt_sample_token(NULL, z, 6, &s, 0, 0, &tok, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "token 4"));
    s.temperature = -1.0f;
    assert_int_equal(ddt_sample_token(NULL, z, 6, &s, 0, 0, &tok, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "temperature"));
    s = (ddt_sampling){1.0f, 0, 0.0f, 1};
    assert_int_equal(ddt_sampling_check(&s, &err), DDT_ERR_INVALID);
    s.top_p = 1.5f;
    assert_int_equal(ddt_sampling_check(&s, &err), DDT_ERR_INVALID);
    s = (ddt_sampling){1.0f, -2, 1.0f, 1};
    assert_int_equal(ddt_sampling_check(&s, &err), DDT_ERR_INVALID);
}

static void test_sampling_frequencies(void **state) {
    (void)state;
    enum { V = 7, N = 60000 };
    float z[V] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -3.0f, 1.5f};
    ddt_sampler *smp;
    assert_int_equal(ddt_sampler_create(V, &smp, NULL), DDT_OK);
    for (int mode = 0; mode < 3; mode++) {
        ddt_sampling s = {0.7f, 0, 1.0f, 1234};
        if (mode == 1) s.top_k = 3;
        if (mode == 2) s.top_p = 0.8f;
        double p[V], total = 0.0;
        int keep[V];
        int order[V] = {3, 6, 0, 1, 4, 2, 5}; /* ids by logit, descending */
        for (int i = 0; i < V; i++) keep[i] = mode == 0;
        for (int i = 0; i < V; i++) p[i] = exp((double)z[i] / 0.7);
        if (mode == 1)
            for (int i = 0; i < 3; i++) keep[order[i]] = 1;
        if (mode == 2) {
            double all = 0.0, cum = 0.0;
            for (int i = 0; i < V; i++) all += p[i];
            for (int i = 0; i < V && cum < 0.8 * all; i++) {
                keep[order[i]] = 1;
                cum += p[order[i]];
            }
        }
        for (int i = 0; i < V; i++) {
            if (!keep[i]) p[i] = 0.0;
            total += p[i];
        }
        int count[V] = {0};
        for (uint32_t n = 0; n < N; n++) {
            int32_t tok;
            assert_int_equal(ddt_sample_token(smp, z, V, &s, 5, n, &tok, NULL), DDT_OK);
            assert_true(tok >= 0 && tok < V);
            count[tok]++;
        }
        double chi = 0.0;
        int dof = -1;
        for (int i = 0; i < V; i++) {
            if (!keep[i]) {
                assert_int_equal(count[i], 0); /* outside the support: never drawn */
                continue;
            }
            double e = N * p[i] / total;
            chi += (count[i] - e) * (count[i] - e) / e;
            dof++;
        }
        /* chi-square with <= 6 degrees of freedom: 30 is far out in the tail (p < 1e-4) */
        assert_true(chi < 30.0);
        (void)dof;
    }
    ddt_sampler_destroy(smp);
}

static void test_reproducible(void **state) {
    (void)state;
    enum { V = 3001 };
    float *z = malloc(V * sizeof(float));
    for (int i = 0; i < V; i++) z[i] = (float)((i * 7919) % 1000) / 250.0f;
    ddt_sampler *a, *b;
    assert_int_equal(ddt_sampler_create(V, &a, NULL), DDT_OK);
    assert_int_equal(ddt_sampler_create(V, &b, NULL), DDT_OK);
    ddt_sampling s = {1.0f, 50, 0.9f, 99};
    int differ = 0;
    for (uint32_t node = 0; node < 200; node++) {
        int32_t t1, t2, t3;
        assert_int_equal(ddt_sample_token(a, z, V, &s, 3, node, &t1, NULL), DDT_OK);
        assert_int_equal(ddt_sample_token(b, z, V, &s, 3, node, &t2, NULL), DDT_OK);
        assert_int_equal(t1, t2);
        s.seed = 100;
        assert_int_equal(ddt_sample_token(a, z, V, &s, 3, node, &t3, NULL), DDT_OK);
        s.seed = 99;
        differ += t3 != t1;
    }
    assert_true(differ > 20); /* another seed gives other samples */
    ddt_sampler_destroy(a);
    ddt_sampler_destroy(b);
    free(z);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_exp_det),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_sampling_frequencies),
        cmocka_unit_test(test_reproducible),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
