/*
 * detmath.h — deterministic float math: exp written with plain IEEE adds and
 * multiplies in a fixed order (the build disables FMA contraction), so the CPU
 * and the CUDA backend compute the same bits, which sampling bit-for-bit
 * reproducibility and the cost-aware budget need.  libm's expf and CUDA's expf
 * differ in the last ulp.
 */
#ifndef DDT_CORE_DETMATH_H
#define DDT_CORE_DETMATH_H

/* exp(x) for x <= 0 (returns 0 below -87.3, 1 at 0); accurate to ~2 ulp.
 * Defined for x > 0 up to 88 as well. NaN in, NaN out. */
float ddt_exp_det(float x);

#endif
