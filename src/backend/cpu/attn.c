/*
 * attn.c — the per-query-row attention kernel and the exp of the CPU attention
 * (see attn.h for the arithmetic order, which every kernel here follows).
 *
 * Three implementations give the same bits:
 *  - AVX-512F + FMA: a chunk's 16 dot products are 16 zmm accumulators (one per
 *    row, lane = column mod 16), reduced together by a transposing tree that
 *    does red16's additions lane for lane and leaves score j in lane j; the
 *    softmax of the chunk is then one vector, and the value accumulation keeps
 *    up to 8 zmm of the output in registers across the chunk's rows.
 *  - AVX2 + FMA: the same on pairs of ymm (rows in groups of 4 for the dots).
 *  - portable C: fmaf (one rounding, C11 7.12.13.1) where the SIMD kernels use
 *    an FMA, a plain operation where they use one.
 * Every SIMD step is either lane-wise (the same operation on each lane as the
 * portable code does on that element) or exact (the max, the reduction tree's
 * additions being red16's own), which is why the bits agree.
 */
#include "backend/cpu/attn.h"

#include <math.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__FMA__)
#include <immintrin.h>
#define AT_SIMD 512
#define AT_VB 8 /* output blocks of 16 held in registers by the value loop */
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define AT_SIMD 256
#define AT_VB 4
#else
#define AT_SIMD 0
#endif

#define AT_L DDT_CPU_ATTN_CHUNK /* 16: chunk rows, and the lanes of a dot product */

#if defined(__GNUC__)
#define AT_INLINE static inline __attribute__((always_inline))
#else
#define AT_INLINE static inline
#endif

/* ------------------------------------------------------------------ exp */

/* The constants of attn.h's exp. */
#define EXP_LO (-104.0f)
#define EXP_HI 89.0f
#define EXP_LOG2E 0x1.715476p+0f
#define EXP_SHIFT 0x1.8p23f
#define EXP_LN2_HI 0x1.62e430p-1f
#define EXP_LN2_LO (-0x1.05c610p-29f)
#define EXP_C5 1.9875691500e-4f
#define EXP_C4 1.3981999507e-3f
#define EXP_C3 8.3334519073e-3f
#define EXP_C2 4.1665795894e-2f
#define EXP_C1 1.6666665459e-1f
#define EXP_C0 5.0000001201e-1f

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float ddt_cpu_expf(float x) {
    /* comparisons are false for a NaN, which so passes through */
    if (x < EXP_LO) x = EXP_LO;
    if (x > EXP_HI) x = EXP_HI;
    float t = fmaf(x, EXP_LOG2E, EXP_SHIFT);
    float kf = t - EXP_SHIFT;
    float r = fmaf(-kf, EXP_LN2_HI, x);
    r = fmaf(-kf, EXP_LN2_LO, r);
    float p = EXP_C5;
    p = fmaf(p, r, EXP_C4);
    p = fmaf(p, r, EXP_C3);
    p = fmaf(p, r, EXP_C2);
    p = fmaf(p, r, EXP_C1);
    p = fmaf(p, r, EXP_C0);
    float y = fmaf(p, r * r, r) + 1.0f;
    /* k in [-150, 128]; unsigned so that a NaN's meaningless k stays defined */
    uint32_t k = f2u(t) - f2u(EXP_SHIFT);
    uint32_t k1 = ((k + 256u) >> 1) - 128u, k2 = k - k1;
    return (y * u2f((k1 + 127u) << 23)) * u2f((k2 + 127u) << 23);
}

/* The fixed reduction of 16 partial sums (attn.h, qmatmul.c's red16). */
static float red16(const float *l) {
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++) s8[i] = l[i] + l[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

/* ------------------------------------------------------------------ portable kernel */

static void chunk_portable(const ddt_cpu_attn_spec *s, ddt_cpu_attn_row *st, const float *const *keys,
                           const float *const *val, int32_t c) {
    float sc[AT_L], p[AT_L];
    for (int32_t j = 0; j < c; j++) {
        float a[AT_L] = {0};
        const float *key = keys[j];
        for (int32_t k = 0; k < s->d0; k++) a[k & (AT_L - 1)] = fmaf(s->q0[k], key[k], a[k & (AT_L - 1)]);
        for (int32_t k = 0; k < s->d1; k++) a[k & (AT_L - 1)] = fmaf(s->q1[k], key[s->d0 + k], a[k & (AT_L - 1)]);
        sc[j] = red16(a) * s->scale;
    }
    float mc = -INFINITY;
    for (int32_t j = 0; j < c; j++)
        if (sc[j] > mc) mc = sc[j];
    mc = mc + 0.0f;
    const bool rescale = mc > st->m;
    float f = 0.0f;
    if (rescale) {
        f = ddt_cpu_expf(st->m - mc);
        st->m = mc;
        for (int i = 0; i < AT_L; i++) st->l[i] = st->l[i] * f;
    }
    for (int32_t j = 0; j < c; j++) {
        p[j] = ddt_cpu_expf(sc[j] - st->m);
        st->l[j] = st->l[j] + p[j];
    }
    for (int32_t k = 0; k < s->dv; k++) {
        float o = st->out[k];
        if (rescale) o = o * f;
        for (int32_t j = 0; j < c; j++) o = fmaf(p[j], val[j][k], o);
        st->out[k] = o;
    }
}

/* ------------------------------------------------------------------ SIMD kernels */

#if AT_SIMD == 512
typedef __m512 v16;
typedef __mmask16 v16m;
AT_INLINE v16 v_zero(void) { return _mm512_setzero_ps(); }
AT_INLINE v16 v_set1(float f) { return _mm512_set1_ps(f); }
AT_INLINE v16 v_ld(const float *p) { return _mm512_loadu_ps(p); }
AT_INLINE void v_st(float *p, v16 v) { _mm512_storeu_ps(p, v); }
/* lanes [0, k), 0 <= k <= 16 */
AT_INLINE v16m v_mask(int64_t k) { return (__mmask16)(k >= 16 ? 0xFFFFu : (1u << k) - 1u); }
AT_INLINE v16 v_ld_m(const float *p, v16m m) { return _mm512_maskz_loadu_ps(m, p); }
AT_INLINE void v_st_m(float *p, v16 v, v16m m) { _mm512_mask_storeu_ps(p, m, v); }
AT_INLINE v16 v_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
AT_INLINE v16 v_sub(v16 a, v16 b) { return _mm512_sub_ps(a, b); }
AT_INLINE v16 v_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
AT_INLINE v16 v_fma(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
/* -(a b) + c, one rounding: fmaf(-a, b, c) */
AT_INLINE v16 v_fnma(v16 a, v16 b, v16 c) { return _mm512_fnmadd_ps(a, b, c); }
/* masked-off lanes keep c untouched */
AT_INLINE v16 v_fma_m(v16 a, v16 b, v16 c, v16m m) { return _mm512_mask3_fmadd_ps(a, b, c, m); }
/* max(lo, x) and min(hi, x) that return x where x is NaN (MAXPS / MINPS
 * return their second operand when either is NaN) */
AT_INLINE v16 v_clamp_lo(v16 lo, v16 x) { return _mm512_max_ps(lo, x); }
AT_INLINE v16 v_clamp_hi(v16 hi, v16 x) { return _mm512_min_ps(hi, x); }
/* where m: a, elsewhere b */
AT_INLINE v16 v_sel(v16m m, v16 a, v16 b) { return _mm512_mask_blend_ps(m, b, a); }
AT_INLINE v16m v_and_m(v16m a, v16m b) { return (__mmask16)(a & b); }
AT_INLINE v16m v_notnan(v16 a) { return _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q); }
/* the largest lane (exact: any order gives it, up to the sign of a zero) */
AT_INLINE float v_hmax(v16 a) { return _mm512_reduce_max_ps(a); }
/* 2^k1 2^k2 scaling of the exp from t's bits, attn.h */
AT_INLINE v16 v_exp_scale(v16 y, v16 t) {
    __m512i k = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32((int)f2u(EXP_SHIFT)));
    __m512i k1 = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_add_epi32(k, _mm512_set1_epi32(256)), 1),
                                  _mm512_set1_epi32(128));
    __m512i k2 = _mm512_sub_epi32(k, k1);
    __m512i b = _mm512_set1_epi32(127);
    v16 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, b), 23));
    v16 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k2, b), 23));
    return v_mul(v_mul(y, s1), s2);
}

/* The 16 dot products of a chunk, lane r = row r: 16 accumulators as attn.h
 * orders them, then red16 of all 16 at once. */
AT_INLINE v16 scores16(const ddt_cpu_attn_spec *s, const float *const *key) {
    v16 a[AT_L];
#pragma GCC unroll 16
    for (int r = 0; r < AT_L; r++) a[r] = v_zero();
    /* rows in two groups of 8, so that a group's row pointers stay in registers */
    for (int g = 0; g < AT_L; g += 8)
        for (int seg = 0; seg < 2; seg++) {
            const float *q = seg ? s->q1 : s->q0;
            const int64_t d = seg ? s->d1 : s->d0, off = seg ? s->d0 : 0;
            int64_t k = 0;
            for (; k + AT_L <= d; k += AT_L) {
                v16 qv = v_ld(q + k);
#pragma GCC unroll 8
                for (int r = 0; r < 8; r++) a[g + r] = v_fma(qv, v_ld(key[g + r] + off + k), a[g + r]);
            }
            if (k < d) {
                v16m m = v_mask(d - k);
                v16 qv = v_ld_m(q + k, m);
#pragma GCC unroll 8
                for (int r = 0; r < 8; r++) a[g + r] = v_fma_m(qv, v_ld_m(key[g + r] + off + k, m), a[g + r], m);
            }
        }
    /* s8: lanes 0-7 of b[i] are row 2i's a[i] + a[i+8], lanes 8-15 row 2i+1's */
    v16 b[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        b[i] = v_add(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                     _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
    /* s4: quarter j of c[i] is row 4i+j's s8[i] + s8[i+4] */
    v16 c[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        c[i] = v_add(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                     _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD));
    /* s2: quarter j of e[i] is {s2 of row 8i+j, s2 of row 8i+4+j} */
    v16 e0 = v_add(_mm512_shuffle_ps(c[0], c[1], 0x44), _mm512_shuffle_ps(c[0], c[1], 0xEE));
    v16 e1 = v_add(_mm512_shuffle_ps(c[2], c[3], 0x44), _mm512_shuffle_ps(c[2], c[3], 0xEE));
    /* s2[0] + s2[1]: lane 4j+i is row 4i+j; put row r in lane r */
    v16 y = v_add(_mm512_shuffle_ps(e0, e1, 0x88), _mm512_shuffle_ps(e0, e1, 0xDD));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), y);
}
#elif AT_SIMD == 256
typedef struct v16 {
    __m256 lo, hi;
} v16;
typedef struct v16m {
    __m256i lo, hi;
} v16m;
AT_INLINE v16 v_zero(void) { return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
AT_INLINE v16 v_set1(float f) { return (v16){_mm256_set1_ps(f), _mm256_set1_ps(f)}; }
AT_INLINE v16 v_ld(const float *p) { return (v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
AT_INLINE void v_st(float *p, v16 v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
AT_INLINE v16m v_mask(int64_t k) {
    __m256i kk = _mm256_set1_epi32((int)k);
    return (v16m){_mm256_cmpgt_epi32(kk, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                  _mm256_cmpgt_epi32(kk, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15))};
}
AT_INLINE v16 v_ld_m(const float *p, v16m m) {
    return (v16){_mm256_maskload_ps(p, m.lo), _mm256_maskload_ps(p + 8, m.hi)};
}
AT_INLINE void v_st_m(float *p, v16 v, v16m m) {
    _mm256_maskstore_ps(p, m.lo, v.lo);
    _mm256_maskstore_ps(p + 8, m.hi, v.hi);
}
#define AT_V2(name, op)                                                                                    \
    AT_INLINE v16 name(v16 a, v16 b) { return (v16){op(a.lo, b.lo), op(a.hi, b.hi)}; }
AT_V2(v_add, _mm256_add_ps)
AT_V2(v_sub, _mm256_sub_ps)
AT_V2(v_mul, _mm256_mul_ps)
AT_V2(v_clamp_lo, _mm256_max_ps) /* NaN in the second operand passes, as in the AVX-512 version */
AT_V2(v_clamp_hi, _mm256_min_ps)
AT_INLINE v16 v_fma(v16 a, v16 b, v16 c) {
    return (v16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
AT_INLINE v16 v_fnma(v16 a, v16 b, v16 c) {
    return (v16){_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
AT_INLINE v16 v_sel(v16m m, v16 a, v16 b) {
    return (v16){_mm256_blendv_ps(b.lo, a.lo, _mm256_castsi256_ps(m.lo)),
                 _mm256_blendv_ps(b.hi, a.hi, _mm256_castsi256_ps(m.hi))};
}
AT_INLINE v16 v_fma_m(v16 a, v16 b, v16 c, v16m m) { return v_sel(m, v_fma(a, b, c), c); }
AT_INLINE v16m v_and_m(v16m a, v16m b) {
    return (v16m){_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)};
}
AT_INLINE v16m v_notnan(v16 a) {
    return (v16m){_mm256_castps_si256(_mm256_cmp_ps(a.lo, a.lo, _CMP_ORD_Q)),
                  _mm256_castps_si256(_mm256_cmp_ps(a.hi, a.hi, _CMP_ORD_Q))};
}
AT_INLINE float v_hmax(v16 a) {
    __m256 m = _mm256_max_ps(a.lo, a.hi);
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}
AT_INLINE __m256 exp_scale8(__m256 y, __m256 t) {
    __m256i k = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32((int)f2u(EXP_SHIFT)));
    __m256i k1 = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(256)), 1),
                                  _mm256_set1_epi32(128));
    __m256i k2 = _mm256_sub_epi32(k, k1);
    __m256i b = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, b), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, b), 23));
    return _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
}
AT_INLINE v16 v_exp_scale(v16 y, v16 t) { return (v16){exp_scale8(y.lo, t.lo), exp_scale8(y.hi, t.hi)}; }

/* red16 of 8 rows given their s8 (ymm r = row r's a[i] + a[i+8]): returns the
 * 8 sums, lane r = row r, by red16's additions lane for lane. */
AT_INLINE __m256 reduce8(const __m256 *s8) {
    __m256 b[4], c[2];
    /* s4: low half of b[i] row 2i's, high half row 2i+1's */
    for (int i = 0; i < 4; i++)
        b[i] = _mm256_add_ps(_mm256_permute2f128_ps(s8[2 * i], s8[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(s8[2 * i], s8[2 * i + 1], 0x31));
    /* s2: low half of c[i] {row 4i, row 4i+2}, high half {row 4i+1, row 4i+3} */
    for (int i = 0; i < 2; i++)
        c[i] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                             _mm256_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
    /* lanes: rows 0, 2, 4, 6 | 1, 3, 5, 7 */
    __m256 y = _mm256_add_ps(_mm256_shuffle_ps(c[0], c[1], 0x88), _mm256_shuffle_ps(c[0], c[1], 0xDD));
    return _mm256_permutevar8x32_ps(y, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The 16 dot products of a chunk, lane r = row r; rows in groups of 4 (8 ymm of
 * accumulators), each row's sums folded to s8 as its group ends. */
AT_INLINE v16 scores16(const ddt_cpu_attn_spec *s, const float *const *key) {
    __m256 s8[AT_L];
    for (int g = 0; g < AT_L; g += 4) {
        v16 a[4];
        for (int r = 0; r < 4; r++) a[r] = v_zero();
        for (int seg = 0; seg < 2; seg++) {
            const float *q = seg ? s->q1 : s->q0;
            const int64_t d = seg ? s->d1 : s->d0, off = seg ? s->d0 : 0;
            int64_t k = 0;
            for (; k + AT_L <= d; k += AT_L) {
                v16 qv = v_ld(q + k);
                for (int r = 0; r < 4; r++) a[r] = v_fma(qv, v_ld(key[g + r] + off + k), a[r]);
            }
            if (k < d) {
                v16m m = v_mask(d - k);
                v16 qv = v_ld_m(q + k, m);
                for (int r = 0; r < 4; r++) a[r] = v_fma_m(qv, v_ld_m(key[g + r] + off + k, m), a[r], m);
            }
        }
        for (int r = 0; r < 4; r++) s8[g + r] = _mm256_add_ps(a[r].lo, a[r].hi);
    }
    return (v16){reduce8(s8), reduce8(s8 + 8)};
}
#endif

#if AT_SIMD
AT_INLINE v16 v_exp(v16 x) {
    x = v_clamp_lo(v_set1(EXP_LO), x);
    x = v_clamp_hi(v_set1(EXP_HI), x);
    v16 t = v_fma(x, v_set1(EXP_LOG2E), v_set1(EXP_SHIFT));
    v16 kf = v_sub(t, v_set1(EXP_SHIFT));
    v16 r = v_fnma(kf, v_set1(EXP_LN2_HI), x);
    r = v_fnma(kf, v_set1(EXP_LN2_LO), r);
    v16 p = v_set1(EXP_C5);
    p = v_fma(p, r, v_set1(EXP_C4));
    p = v_fma(p, r, v_set1(EXP_C3));
    p = v_fma(p, r, v_set1(EXP_C2));
    p = v_fma(p, r, v_set1(EXP_C1));
    p = v_fma(p, r, v_set1(EXP_C0));
    v16 y = v_add(v_fma(p, v_mul(r, r), r), v_set1(1.0f));
    return v_exp_scale(y, t);
}

/* out[0, len) (NB blocks of 16, the last masked to len) of one chunk: scaled
 * by f if rescale, then the c rows' p_j val_j added in order, in registers. */
AT_INLINE void values_block(const int NB, float *out, const float *const *val, int64_t k0, int64_t len,
                            const float *p, int32_t c, bool rescale, float f) {
    v16 acc[AT_VB];
    v16m last = v_mask(len - (int64_t)(NB - 1) * AT_L);
    for (int i = 0; i < NB; i++) acc[i] = i < NB - 1 ? v_ld(out + i * AT_L) : v_ld_m(out + i * AT_L, last);
    if (rescale)
        for (int i = 0; i < NB; i++) acc[i] = v_mul(acc[i], v_set1(f));
    for (int32_t j = 0; j < c; j++) {
        v16 pj = v_set1(p[j]);
        const float *v = val[j] + k0;
        for (int i = 0; i < NB; i++)
            acc[i] = v_fma(pj, i < NB - 1 ? v_ld(v + i * AT_L) : v_ld_m(v + i * AT_L, last), acc[i]);
    }
    for (int i = 0; i < NB; i++) {
        if (i < NB - 1)
            v_st(out + i * AT_L, acc[i]);
        else
            v_st_m(out + i * AT_L, acc[i], last);
    }
}

static void chunk_simd(const ddt_cpu_attn_spec *s, ddt_cpu_attn_row *st, const float *const *keys,
                       const float *const *val, int32_t c) {
    /* rows past c read row 0 again: their lanes are masked off below */
    const float *key[AT_L];
    for (int r = 0; r < AT_L; r++) key[r] = keys[r < c ? r : 0];
    v16 sc = v_mul(scores16(s, key), v_set1(s->scale));
    v16m act = v_mask(c);
    float mc = v_hmax(v_sel(v_and_m(act, v_notnan(sc)), sc, v_set1(-INFINITY))) + 0.0f;
    const bool rescale = mc > st->m;
    float f = 0.0f;
    v16 l = v_ld(st->l);
    if (rescale) {
        f = ddt_cpu_expf(st->m - mc);
        st->m = mc;
        l = v_mul(l, v_set1(f));
    }
    v16 p = v_exp(v_sub(sc, v_set1(st->m)));
    v_st(st->l, v_sel(act, v_add(l, p), l));
    float pb[AT_L];
    v_st(pb, p);
    for (int64_t k0 = 0; k0 < s->dv; k0 += AT_VB * AT_L) {
        int64_t len = s->dv - k0 < AT_VB * AT_L ? s->dv - k0 : AT_VB * AT_L;
        float *o = st->out + k0;
        switch ((len + AT_L - 1) / AT_L) {
        case 1: values_block(1, o, val, k0, len, pb, c, rescale, f); break;
        case 2: values_block(2, o, val, k0, len, pb, c, rescale, f); break;
        case 3: values_block(3, o, val, k0, len, pb, c, rescale, f); break;
#if AT_VB == 8
        case 4: values_block(4, o, val, k0, len, pb, c, rescale, f); break;
        case 5: values_block(5, o, val, k0, len, pb, c, rescale, f); break;
        case 6: values_block(6, o, val, k0, len, pb, c, rescale, f); break;
        case 7: values_block(7, o, val, k0, len, pb, c, rescale, f); break;
#endif
        default: values_block(AT_VB, o, val, k0, len, pb, c, rescale, f); break;
        }
    }
}
#endif /* AT_SIMD */

/* ------------------------------------------------------------------ entry points */

void ddt_cpu_exp_n(const float *x, float *y, int64_t n, bool portable) {
    int64_t i = 0;
#if AT_SIMD
    if (!portable) {
        for (; i + AT_L <= n; i += AT_L) v_st(y + i, v_exp(v_ld(x + i)));
        if (i < n) {
            v16m m = v_mask(n - i);
            v_st_m(y + i, v_exp(v_ld_m(x + i, m)), m);
        }
        return;
    }
#else
    (void)portable;
#endif
    for (; i < n; i++) y[i] = ddt_cpu_expf(x[i]);
}

void ddt_cpu_attn_begin(const ddt_cpu_attn_spec *s, ddt_cpu_attn_row *st, float *out) {
    st->m = -INFINITY;
    for (int i = 0; i < AT_L; i++) st->l[i] = 0.0f;
    st->out = out;
    memset(out, 0, (size_t)s->dv * sizeof(float));
}

void ddt_cpu_attn_chunk(const ddt_cpu_attn_spec *s, ddt_cpu_attn_row *st, const float *const *key,
                        const float *const *val, int32_t c) {
#if AT_SIMD
    if (!s->portable) {
        chunk_simd(s, st, key, val, c);
        return;
    }
#endif
    chunk_portable(s, st, key, val, c);
}

void ddt_cpu_attn_end(const ddt_cpu_attn_spec *s, ddt_cpu_attn_row *st) {
    float sum = red16(st->l);
    if (sum > 0.0f) {
        float inv = 1.0f / sum;
        for (int32_t k = 0; k < s->dv; k++) st->out[k] = st->out[k] * inv;
    }
}

int32_t ddt_cpu_attn_heads_per_item(int64_t n, int32_t heads, int32_t threads) {
    int32_t hg = heads < DDT_CPU_ATTN_HEADS ? heads : DDT_CPU_ATTN_HEADS;
    while (hg > 1 && n * ((heads + hg - 1) / hg) < threads) hg = (hg + 1) / 2;
    return hg > 0 ? hg : 1;
}
