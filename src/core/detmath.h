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

/*
 * log(x) in the same spirit: x = m * 2^e with m in [sqrt(1/2), sqrt(2)], s = (m - 1) / (m + 1)
 * (IEEE division: correctly rounded on both sides), log m = 2 s (1 + s^2/3 + ... + s^8/9) in
 * Horner form (|s| <= 0.1716: the next term is below 2^-28 of the sum), then e * ln2 with the
 * two-constant split.  -inf at 0 (either sign), +inf at +inf, NaN below 0 and for NaN.  Used by
 * the draft calibration (core/calibration.h), whose CPU and GPU weights must agree bit for bit.
 */
DDT_DETMATH_HD static inline float ddt_log_det_inline(float x) {
    uint32_t b;
    if (x != x) return x;
    if (x == 0.0f) return -ddt_pow2i(127) * 2.0f;
    if (x < 0.0f) {
        b = 0x7fc00000u;
        memcpy(&x, &b, sizeof x);
        return x;
    }
    if (x > 3.40282347e38f) return x; /* +inf */
    int32_t e = 0;
    memcpy(&b, &x, sizeof b);
    if (b < 0x00800000u) { /* subnormal: scale into the normal range first */
        x = x * 8388608.0f;
        memcpy(&b, &x, sizeof b);
        e = -23;
    }
    e += (int32_t)(b >> 23) - 127;
    b = (b & 0x007fffffu) | 0x3f800000u;
    float m;
    memcpy(&m, &b, sizeof m);
    if (m > 1.41421356f) {
        m = m * 0.5f;
        e += 1;
    }
    const float s = (m - 1.0f) / (m + 1.0f);
    const float s2 = s * s;
    float p = 1.0f / 9.0f;
    p = p * s2 + 1.0f / 7.0f;
    p = p * s2 + 1.0f / 5.0f;
    p = p * s2 + 1.0f / 3.0f;
    p = p * s2 + 1.0f;
    const float lm = (2.0f * s) * p;
    const float ef = (float)e;
    const float ln2_hi = 0.693145751953125f;
    const float ln2_lo = 1.42860682030941723e-6f;
    return ef * ln2_hi + (lm + ef * ln2_lo);
}

#ifdef __CUDACC__
#define ddt_exp_det ddt_exp_det_inline
#define ddt_log_det ddt_log_det_inline
#else
/* Out-of-line version for callers that want a plain function. */
float ddt_exp_det(float x);
float ddt_log_det(float x);
#endif

#endif
