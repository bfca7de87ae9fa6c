/*
 * rope.c — RoPE / YaRN tables and rotation (see rope.h for the formulas, which
 * follow transformers' DeepSeek-V3 code step by step, fp32 where it is fp32 and
 * double where it computes with Python floats).
 */
#include "backend/cpu/rope.h"

#include <math.h>
#include <string.h>

/* Python's math.pi; M_PI is not part of C11. */
#define ROPE_PI 3.141592653589793

static double yarn_mscale(double scale, double k) {
    if (scale <= 1.0) return 1.0;
    return 0.1 * k * log(scale) + 1.0;
}

/* Dimension at which a wavelength makes `rot` turns over max_pos positions. */
static double correction_dim(double rot, int32_t dim, double base, double max_pos) {
    return (dim * log(max_pos / (rot * 2.0 * ROPE_PI))) / (2.0 * log(base));
}

void ddt_cpu_rope_freqs(const ddt_rope_params *p, float *inv_freq, float *attn_factor) {
    int32_t half = p->dim / 2;
    float pos_freq[DDT_ROPE_MAX_DIM / 2];
    for (int32_t i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)p->dim;
        pos_freq[i] = powf(p->theta, e);
    }
    if (!p->yarn) {
        for (int32_t i = 0; i < half; i++) inv_freq[i] = 1.0f / pos_freq[i];
        *attn_factor = 1.0f;
        return;
    }
    double factor = p->factor;
    double beta_fast = p->beta_fast != 0.0f ? p->beta_fast : 32.0;
    double beta_slow = p->beta_slow != 0.0f ? p->beta_slow : 1.0;
    double low = floor(correction_dim(beta_fast, p->dim, p->theta, p->original_max_position));
    double high = ceil(correction_dim(beta_slow, p->dim, p->theta, p->original_max_position));
    if (low < 0) low = 0;
    if (high > p->dim - 1) high = p->dim - 1;
    if (low == high) high += 0.001; /* HF: avoid a zero-width ramp */
    float flow = (float)low, fspan = (float)(high - low);
    for (int32_t i = 0; i < half; i++) {
        float ramp = ((float)i - flow) / fspan;
        if (ramp < 0.0f) ramp = 0.0f;
        if (ramp > 1.0f) ramp = 1.0f;
        float extrap_w = 1.0f - ramp;
        float inv_extrap = 1.0f / pos_freq[i];
        float inv_interp = 1.0f / ((float)factor * pos_freq[i]);
        inv_freq[i] = inv_interp * (1.0f - extrap_w) + inv_extrap * extrap_w;
    }
    double af;
    if (p->mscale != 0.0f && p->mscale_all_dim != 0.0f)
        af = yarn_mscale(factor, p->mscale) / yarn_mscale(factor, p->mscale_all_dim);
    else
        af = yarn_mscale(factor, 1.0);
    *attn_factor = (float)af;
}

void ddt_cpu_rope_cos_sin(const float *inv_freq, int32_t half, int64_t pos, float attn_factor,
                          float *cos_out, float *sin_out) {
    for (int32_t i = 0; i < half; i++) {
        float a = (float)pos * inv_freq[i];
        cos_out[i] = cosf(a) * attn_factor;
        sin_out[i] = sinf(a) * attn_factor;
    }
}

void ddt_cpu_rope_rotate(float *v, int32_t dim, bool interleaved, const float *cos_v, const float *sin_v) {
    int32_t half = dim / 2;
    float tmp[DDT_ROPE_MAX_DIM];
    if (interleaved) {
        for (int32_t i = 0; i < half; i++) {
            float a = v[2 * i], b = v[2 * i + 1];
            tmp[i] = a * cos_v[i] - b * sin_v[i];
            tmp[i + half] = b * cos_v[i] + a * sin_v[i];
        }
    } else {
        for (int32_t i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            tmp[i] = a * cos_v[i] - b * sin_v[i];
            tmp[i + half] = b * cos_v[i] + a * sin_v[i];
        }
    }
    memcpy(v, tmp, (size_t)dim * sizeof(float));
}
