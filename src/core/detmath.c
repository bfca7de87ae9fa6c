/*
 * detmath.c — deterministic exp (see detmath.h).
 *
 * exp(x) = 2^k * exp(r), k = round(x / ln 2), r = x - k*ln2 computed with a
 * two-constant Cody–Waite split (ln2_hi has few enough bits that k*ln2_hi is
 * exact), then a degree-6 Taylor/Horner polynomial on |r| <= ln2/2, and 2^k
 * applied by building the exponent bits.  Every operation is a single rounded
 * IEEE op, so any conforming machine gets the same result.
 */
#include "core/detmath.h"

#include <stdint.h>
#include <string.h>

static float pow2i(int32_t k) {
    /* 2^k for k in [-126, 127] */
    uint32_t bits = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

float ddt_exp_det(float x) {
    if (x != x) return x;
    if (x < -87.3f) return 0.0f;
    if (x > 88.7f) return pow2i(127) * 2.0f; /* +inf */
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693145751953125f; /* 12 significant bits */
    const float ln2_lo = 1.42860682030941723e-6f;
    float t = x * log2e;
    /* round half away from zero, without calling libm */
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
    /* k may reach -126 (x near -87.3): split the scaling to stay normal */
    if (k > 127) return (p * pow2i(k - 1)) * 2.0f;
    if (k < -125) return (p * pow2i(k + 64)) * pow2i(-64);
    return p * pow2i(k);
}
