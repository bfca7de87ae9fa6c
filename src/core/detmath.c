/*
 * detmath.c — out-of-line deterministic exp and log (the algorithms are in detmath.h,
 * inline, so the CUDA backend compiles the same operations).
 */
#include "core/detmath.h"

float ddt_exp_det(float x) { return ddt_exp_det_inline(x); }
float ddt_log_det(float x) { return ddt_log_det_inline(x); }
