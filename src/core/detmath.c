/*
 * detmath.c — out-of-line deterministic exp (the algorithm is in detmath.h,
 * inline, so the CUDA backend compiles the same operations).
 */
#include "core/detmath.h"

float ddt_exp_det(float x) { return ddt_exp_det_inline(x); }
