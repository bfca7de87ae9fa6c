/*
 * rope.h — rotary position embedding with optional YaRN scaling, computed the
 * way Hugging Face transformers does for DeepSeek-V3 (modeling_rope_utils.py
 * _compute_yarn_parameters, modeling_deepseek_v3.py):
 *
 *   inv_freq[i] = 1 / theta^(2i/dim)                       (fp32 pow, i < dim/2)
 *   YaRN: low/high = floor/ceil of the correction dims of beta_fast/beta_slow
 *         over original_max_position, clamped to [0, dim-1];
 *         ramp[i] = clamp((i - low) / (high - low), 0, 1);
 *         inv_freq[i] = inv[i]/factor * ramp[i] + inv[i] * (1 - ramp[i])
 *   attention factor (multiplies cos and sin):
 *         mscale and mscale_all_dim both non-zero: m(factor, mscale) / m(factor, mscale_all_dim)
 *         else m(factor, 1), with m(s, k) = s <= 1 ? 1 : 0.1*k*ln(s) + 1
 *   angle = (float)pos * inv_freq[i];  cos, sin in fp32, times the attention factor.
 *
 * Rotation of a vector v of `dim` values:
 *   interleaved (HF rope_interleave, the DeepSeek checkpoint layout): pairs
 *     (v[2i], v[2i+1]) are rotated by angle i and the result is written
 *     de-interleaved: out[i] = v[2i] c - v[2i+1] s, out[i + dim/2] = v[2i+1] c + v[2i] s;
 *   not interleaved (rotate_half): out[i] = v[i] c - v[i+h] s, out[i+h] = v[i+h] c + v[i] s.
 * Query and key use the same layout, so their dot products are those of HF.
 */
#ifndef DDT_BACKEND_CPU_ROPE_H
#define DDT_BACKEND_CPU_ROPE_H

#include <stdbool.h>
#include <stdint.h>

#define DDT_ROPE_MAX_DIM 1024

typedef struct ddt_rope_params {
    int32_t dim;                 /* rotary dims (qk_rope_head_dim), even, <= DDT_ROPE_MAX_DIM */
    float theta;                 /* rope_theta */
    bool yarn;                   /* rope_scaling type yarn */
    float factor;                /* YaRN factor */
    float original_max_position; /* original_max_position_embeddings */
    float beta_fast;             /* 0 = HF default 32 */
    float beta_slow;             /* 0 = HF default 1 */
    float mscale;                /* 0 = absent */
    float mscale_all_dim;        /* 0 = absent */
} ddt_rope_params;

/* Fill inv_freq[dim/2] and the cos/sin attention factor. */
void ddt_cpu_rope_freqs(const ddt_rope_params *p, float *inv_freq, float *attn_factor);

/* cos[i], sin[i] for i < half at position pos, times attn_factor. */
void ddt_cpu_rope_cos_sin(const float *inv_freq, int32_t half, int64_t pos, float attn_factor,
                          float *cos_out, float *sin_out);

/* Rotate v[dim] in place with cos/sin[dim/2]; layout per `interleaved` (see above). */
void ddt_cpu_rope_rotate(float *v, int32_t dim, bool interleaved, const float *cos_v, const float *sin_v);

#endif
