/*
 * simd16.h — the 16-lane fp32 vector layer of the CPU kernels (qmatmul.c's
 * matrix product, attn.c's attention): one definition of the lane layout and of
 * the reduction order that both kernels' bit-exact contracts (qmatmul.c's head
 * comment, attn.h) rest on, so that the two cannot drift apart.
 *
 * A v16 is 16 fp32 lanes: one zmm under AVX-512F + FMA (V16_SIMD 512), two ymm
 * under AVX2 + FMA (V16_SIMD 256; lanes 0-7 in lo, 8-15 in hi).  Without either,
 * V16_SIMD is 0 and only red16 is defined: the kernels then run their portable C.
 * Every v_ operation is lane-wise (lane i of the result is one IEEE operation on
 * lane i of the operands; an FMA rounds once, as C's fmaf), which is why a
 * kernel written with them gives, lane for lane, the bits of portable C doing
 * the same operation on that element.
 *
 * The reduction of 16 partial sums (lane = column mod 16) is red16's fixed tree
 *     s8[i] = l[i] + l[i+8],  s4[i] = s8[i] + s8[i+4],  s2[i] = s4[i] + s4[i+2],
 *     y = s2[0] + s2[1].
 * The v_red16x* functions reduce several outputs at once across registers: the
 * shuffles only move values, and each addition is one of red16's, lane for
 * lane, so each output gets red16's bits.
 *
 * Everything is static inline and, under GCC or clang, forced inline
 * (V16_INLINE): the kernels keep arrays of v16 accumulators that fit the
 * register file only when every call is expanded with constant counts.
 */
#ifndef DDT_BACKEND_CPU_SIMD16_H
#define DDT_BACKEND_CPU_SIMD16_H

#include <stdint.h>

#if defined(__AVX512F__) && defined(__FMA__)
#include <immintrin.h>
#define V16_SIMD 512
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define V16_SIMD 256
#else
#define V16_SIMD 0
#endif

#define V16_L 16 /* lanes; also the partial sums per dot product */

#if defined(__GNUC__)
#define V16_INLINE static inline __attribute__((always_inline))
#else
#define V16_INLINE static inline
#endif

/* The fixed reduction of one output's 16 partial sums (see the head comment);
 * the portable kernels' definition, which the SIMD trees below reproduce.
 * A plain static function, not inline: it runs once per output after a whole
 * dot product, and out of line it adds nothing to each of the kernels' many
 * expanded blocks ("unused": a file may take only the vector layer). */
#if defined(__GNUC__)
__attribute__((unused))
#endif
static float red16(const float *l) {
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++) s8[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

#if V16_SIMD == 512
typedef __m512 v16;
typedef __mmask16 v16m;
typedef __m512i v16i; /* 16 int32 lanes, for building floats from bits */
V16_INLINE v16 v_zero(void) { return _mm512_setzero_ps(); }
V16_INLINE v16 v_set1(float f) { return _mm512_set1_ps(f); }
V16_INLINE v16 v_ld(const float *p) { return _mm512_loadu_ps(p); }
V16_INLINE void v_st(float *p, v16 v) { _mm512_storeu_ps(p, v); }
/* lanes [0, k), 0 <= k <= 16 */
V16_INLINE v16m v_mask(int64_t k) { return (__mmask16)((1u << k) - 1u); }
/* masked-off lanes read as +0 and are never touched in memory */
V16_INLINE v16 v_ld_m(const float *p, v16m m) { return _mm512_maskz_loadu_ps(m, p); }
V16_INLINE void v_st_m(float *p, v16 v, v16m m) { _mm512_mask_storeu_ps(p, m, v); }
V16_INLINE v16 v_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
V16_INLINE v16 v_sub(v16 a, v16 b) { return _mm512_sub_ps(a, b); }
V16_INLINE v16 v_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
/* a b + c, one rounding: fmaf(a, b, c) */
V16_INLINE v16 v_fma(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
/* -(a b) + c, one rounding: fmaf(-a, b, c) */
V16_INLINE v16 v_fnma(v16 a, v16 b, v16 c) { return _mm512_fnmadd_ps(a, b, c); }
/* masked-off lanes keep c untouched: a tail adds nothing, not even +0 */
V16_INLINE v16 v_fma_m(v16 a, v16 b, v16 c, v16m m) { return _mm512_mask3_fmadd_ps(a, b, c, m); }
/* max(lo, x) and min(hi, x) that return x where x is NaN (MAXPS / MINPS
 * return their second operand when either is NaN) */
V16_INLINE v16 v_clamp_lo(v16 lo, v16 x) { return _mm512_max_ps(lo, x); }
V16_INLINE v16 v_clamp_hi(v16 hi, v16 x) { return _mm512_min_ps(hi, x); }
/* where m: a, elsewhere b */
V16_INLINE v16 v_sel(v16m m, v16 a, v16 b) { return _mm512_mask_blend_ps(m, b, a); }
V16_INLINE v16m v_and_m(v16m a, v16m b) { return (__mmask16)(a & b); }
V16_INLINE v16m v_notnan(v16 a) { return _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q); }
/* the largest lane (exact: any order gives it, up to the sign of a zero) */
V16_INLINE float v_hmax(v16 a) { return _mm512_reduce_max_ps(a); }
/* the int32 lanes: a float's bits and back, wrapping arithmetic, shifts
 * (logical) by a count that is a constant where the call is expanded */
V16_INLINE v16i v_bits(v16 a) { return _mm512_castps_si512(a); }
V16_INLINE v16 v_from_bits(v16i a) { return _mm512_castsi512_ps(a); }
V16_INLINE v16i vi_set1(int32_t i) { return _mm512_set1_epi32(i); }
V16_INLINE v16i vi_add(v16i a, v16i b) { return _mm512_add_epi32(a, b); }
V16_INLINE v16i vi_sub(v16i a, v16i b) { return _mm512_sub_epi32(a, b); }
V16_INLINE v16i vi_shr(v16i a, int n) { return _mm512_srli_epi32(a, n); }
V16_INLINE v16i vi_shl(v16i a, int n) { return _mm512_slli_epi32(a, n); }

/* s8 of two outputs: lanes 0-7 are a[i] + a[i+8], lanes 8-15 the same of b. */
V16_INLINE v16 v_red_s8x2(v16 a, v16 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}
/* s4 of four outputs from two v_red_s8x2: quarter q holds s8[i] + s8[i+4] of
 * output q (a, b of ab, then c, d of cd). */
V16_INLINE v16 v_red_s4x4(v16 ab, v16 cd) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
}

/* {red16(a), red16(b), red16(c), red16(d)} */
V16_INLINE __m128 v_red16x4(v16 a, v16 b, v16 c, v16 d) {
    v16 ab = v_red_s8x2(a, b), cd = v_red_s8x2(c, d);
    v16 v = v_red_s4x4(ab, cd);
    /* s2 in lanes 0-1 of each quarter, then s2[0] + s2[1] in lane 0 */
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
    v = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v);
    return _mm512_castps512_ps128(v);
}

/* red16 of 16 outputs a[0 .. 16): lane r of the result is red16(a[r]). */
V16_INLINE v16 v_red16x16(const v16 *a) {
    /* s8: lanes 0-7 of b[i] are output 2i's, lanes 8-15 output 2i+1's */
    v16 b[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) b[i] = v_red_s8x2(a[2 * i], a[2 * i + 1]);
    /* s4: quarter j of c[i] is output 4i+j's */
    v16 c[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) c[i] = v_red_s4x4(b[2 * i], b[2 * i + 1]);
    /* s2: quarter j of e[i] is {s2 of output 8i+j, s2 of output 8i+4+j} */
    v16 e0 = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x44), _mm512_shuffle_ps(c[0], c[1], 0xEE));
    v16 e1 = _mm512_add_ps(_mm512_shuffle_ps(c[2], c[3], 0x44), _mm512_shuffle_ps(c[2], c[3], 0xEE));
    /* s2[0] + s2[1]: lane 4j+i is output 4i+j; put output r in lane r */
    v16 y = _mm512_add_ps(_mm512_shuffle_ps(e0, e1, 0x88), _mm512_shuffle_ps(e0, e1, 0xDD));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), y);
}

#elif V16_SIMD == 256
typedef struct v16 {
    __m256 lo, hi;
} v16;
typedef struct v16m {
    __m256i lo, hi;
} v16m;
typedef struct v16i {
    __m256i lo, hi;
} v16i;
V16_INLINE v16 v_zero(void) { return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
V16_INLINE v16 v_set1(float f) { return (v16){_mm256_set1_ps(f), _mm256_set1_ps(f)}; }
V16_INLINE v16 v_ld(const float *p) { return (v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
V16_INLINE void v_st(float *p, v16 v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
/* lanes [0, k), 0 <= k <= 16 */
V16_INLINE v16m v_mask(int64_t k) {
    __m256i kk = _mm256_set1_epi32((int)k);
    return (v16m){_mm256_cmpgt_epi32(kk, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                  _mm256_cmpgt_epi32(kk, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15))};
}
V16_INLINE v16 v_ld_m(const float *p, v16m m) {
    return (v16){_mm256_maskload_ps(p, m.lo), _mm256_maskload_ps(p + 8, m.hi)};
}
V16_INLINE void v_st_m(float *p, v16 v, v16m m) {
    _mm256_maskstore_ps(p, m.lo, v.lo);
    _mm256_maskstore_ps(p + 8, m.hi, v.hi);
}
/* a two-operand operation on both halves */
#define V16_HALVES(type, name, op)                                                                         \
    V16_INLINE type name(type a, type b) { return (type){op(a.lo, b.lo), op(a.hi, b.hi)}; }
V16_HALVES(v16, v_add, _mm256_add_ps)
V16_HALVES(v16, v_sub, _mm256_sub_ps)
V16_HALVES(v16, v_mul, _mm256_mul_ps)
V16_HALVES(v16, v_clamp_lo, _mm256_max_ps) /* NaN in the second operand passes, as in the AVX-512 version */
V16_HALVES(v16, v_clamp_hi, _mm256_min_ps)
V16_HALVES(v16m, v_and_m, _mm256_and_si256)
V16_HALVES(v16i, vi_add, _mm256_add_epi32)
V16_HALVES(v16i, vi_sub, _mm256_sub_epi32)
#undef V16_HALVES
V16_INLINE v16 v_fma(v16 a, v16 b, v16 c) {
    return (v16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
V16_INLINE v16 v_fnma(v16 a, v16 b, v16 c) {
    return (v16){_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
V16_INLINE v16 v_sel(v16m m, v16 a, v16 b) {
    return (v16){_mm256_blendv_ps(b.lo, a.lo, _mm256_castsi256_ps(m.lo)),
                 _mm256_blendv_ps(b.hi, a.hi, _mm256_castsi256_ps(m.hi))};
}
V16_INLINE v16 v_fma_m(v16 a, v16 b, v16 c, v16m m) { return v_sel(m, v_fma(a, b, c), c); }
V16_INLINE v16m v_notnan(v16 a) {
    return (v16m){_mm256_castps_si256(_mm256_cmp_ps(a.lo, a.lo, _CMP_ORD_Q)),
                  _mm256_castps_si256(_mm256_cmp_ps(a.hi, a.hi, _CMP_ORD_Q))};
}
V16_INLINE float v_hmax(v16 a) {
    __m256 m = _mm256_max_ps(a.lo, a.hi);
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}
V16_INLINE v16i v_bits(v16 a) { return (v16i){_mm256_castps_si256(a.lo), _mm256_castps_si256(a.hi)}; }
V16_INLINE v16 v_from_bits(v16i a) { return (v16){_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)}; }
V16_INLINE v16i vi_set1(int32_t i) { return (v16i){_mm256_set1_epi32(i), _mm256_set1_epi32(i)}; }
V16_INLINE v16i vi_shr(v16i a, int n) { return (v16i){_mm256_srli_epi32(a.lo, n), _mm256_srli_epi32(a.hi, n)}; }
V16_INLINE v16i vi_shl(v16i a, int n) { return (v16i){_mm256_slli_epi32(a.lo, n), _mm256_slli_epi32(a.hi, n)}; }

/* s8 of one output: lane i is a[i] + a[i+8]. */
V16_INLINE __m256 v_red_s8(v16 a) { return _mm256_add_ps(a.lo, a.hi); }

/* red16 of 8 outputs given their s8 (v_red_s8): lane r of the result is
 * red16 of output r. */
V16_INLINE __m256 v_red16x8(const __m256 *s8) {
    __m256 b[4], c[2];
    /* s4: low half of b[i] output 2i's, high half output 2i+1's */
    for (int i = 0; i < 4; i++)
        b[i] = _mm256_add_ps(_mm256_permute2f128_ps(s8[2 * i], s8[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(s8[2 * i], s8[2 * i + 1], 0x31));
    /* s2: low half of c[i] {output 4i, 4i+2}, high half {output 4i+1, 4i+3} */
    for (int i = 0; i < 2; i++)
        c[i] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                             _mm256_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
    /* lanes: outputs 0, 2, 4, 6 | 1, 3, 5, 7 */
    __m256 y = _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], 0x88), _mm256_shuffle_ps(c[0], c[1], 0xDD));
    return _mm256_permutevar8x32_ps(y, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif /* V16_SIMD */

#endif /* DDT_BACKEND_CPU_SIMD16_H */
