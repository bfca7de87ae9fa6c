/*
 * detmath.h — deterministic float math: exp written with plain IEEE adds and
 * multiplies in a fixed order (the build disables FMA contraction: -ffp-contract=off
 * for C, --fmad=false for the CUDA files that include this), so the CPU and the
 * CUDA backend compute the same bits, which bit-for-bit reproducible sampling and
 * the cost-aware budget need.  libm's expf and CUDA's expf differ in the last ulp.
 *
 * exp(x) = 2^k * exp(r), k = round(x / ln 2), r = x - k*ln2 with a two-constant
 * Cody–Waite split (ln2_hi has few enough bits that k*ln2_hi is exact), a
 * degree-6 Taylor polynomial in Horner form on |r| <= ln2/2, and 2^k built from
 * exponent bits.  Accurate to a few ulp.
 */
#ifndef DDT_CORE_DETMATH_H
#define DDT_CORE_DETMATH_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DDT_DETMATH_HD __host__ __device__
#else
#define DDT_DETMATH_HD
#endif

DDT_DETMATH_HD static inline float ddt_pow2i(int32_t k) {
    /* 2^k for k in [-126, 127] */
    uint32_t bits = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* exp(x): 0 below -87.3, +inf above 88.7, NaN for NaN. */
DDT_DETMATH_HD static inline float ddt_exp_det_inline(float x) {
    if (x != x) return x;
    if (x < -87.3f) return 0.0f;
    if (x > 88.7f) return ddt_pow2i(127) * 2.0f;
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693145751953125f;
    const float ln2_lo = 1.42860682030941723e-6f;
    float t = x * log2e;
    int32_t k = (int32_t)(t < 0.0f ? t - 0.5f : t + 0.5f);
    float kf = (float)k;
    float r = (x - kf * ln2_hi) - kf * ln2_lo;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    if (k > 127) return (p * ddt_pow2i(k - 1)) * 2.0f;
    if (k < -125) return (p * ddt_pow2i(k + 64)) * ddt_pow2i(-64);
    return p * ddt_pow2i(k);
}

#ifdef __CUDACC__
#define ddt_exp_det ddt_exp_det_inline
#else
/* Out-of-line version for callers that want a plain function. */
float ddt_exp_det(float x);
#endif

#endif
