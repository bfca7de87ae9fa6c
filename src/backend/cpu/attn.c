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
 * additions being red16's own), which is why the bits agree.  The vector layer
 * (v16, its lane-wise operations and red16's trees) is simd16.h's, shared with
 * the matmul, whose 16-lane dot products the scores repeat.
 */
#include "backend/cpu/attn.h"

#include <math.h>
#include <string.h>

#include "backend/cpu/simd16.h"

#define AT_SIMD V16_SIMD
#if AT_SIMD == 512
#define AT_VB 8 /* output blocks of 16 held in registers by the value loop */
#elif AT_SIMD == 256
#define AT_VB 4
#endif

#define AT_L DDT_CPU_ATTN_CHUNK /* 16: chunk rows, and the lanes of a dot product */
_Static_assert(AT_L == V16_L, "a chunk's scores are one v16, lane r = row r");

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

/* The vector vocabulary and the reduction trees are simd16.h's. */

#if AT_SIMD
/* a[r] += the dot product of q with row key[r]'s columns, for rows [0, N),
 * as attn.h orders it: the q0 segment, then q1, 16 columns at a time, a last
 * partial block masked.  The rows of a group share each load of q. */
V16_INLINE void dots(const int N, v16 *a, const ddt_cpu_attn_spec *s, const float *const *key) {
    for (int seg = 0; seg < 2; seg++) {
        const float *q = seg ? s->q1 : s->q0;
        const int64_t d = seg ? s->d1 : s->d0, off = seg ? s->d0 : 0;
        int64_t k = 0;
        for (; k + AT_L <= d; k += AT_L) {
            v16 qv = v_ld(q + k);
#pragma GCC unroll 8
            for (int r = 0; r < N; r++) a[r] = v_fma(qv, v_ld(key[r] + off + k), a[r]);
        }
        if (k < d) {
            v16m m = v_mask(d - k);
            v16 qv = v_ld_m(q + k, m);
#pragma GCC unroll 8
            for (int r = 0; r < N; r++) a[r] = v_fma_m(qv, v_ld_m(key[r] + off + k, m), a[r], m);
        }
    }
}
#endif

#if AT_SIMD == 512
/* The 16 dot products of a chunk, lane r = row r: 16 accumulators as attn.h
 * orders them, then red16 of all 16 at once. */
V16_INLINE v16 scores16(const ddt_cpu_attn_spec *s, const float *const *key) {
    v16 a[AT_L];
#pragma GCC unroll 16
    for (int r = 0; r < AT_L; r++) a[r] = v_zero();
    /* rows in two groups of 8, so that a group's row pointers stay in registers */
    for (int g = 0; g < AT_L; g += 8) dots(8, a + g, s, key + g);
    return v_red16x16(a);
}
#elif AT_SIMD == 256
/* The 16 dot products of a chunk, lane r = row r; rows in groups of 4 (8 ymm of
 * accumulators), each row's sums folded to s8 as its group ends. */
V16_INLINE v16 scores16(const ddt_cpu_attn_spec *s, const float *const *key) {
    __m256 s8[AT_L];
    for (int g = 0; g < AT_L; g += 4) {
        v16 a[4];
        for (int r = 0; r < 4; r++) a[r] = v_zero();
        dots(4, a, s, key + g);
        for (int r = 0; r < 4; r++) s8[g + r] = v_red_s8(a[r]);
    }
    return (v16){v_red16x8(s8), v_red16x8(s8 + 8)};
}
#endif

#if AT_SIMD
/* 2^k1 2^k2 scaling of the exp from t's bits, attn.h */
V16_INLINE v16 v_exp_scale(v16 y, v16 t) {
    v16i k = vi_sub(v_bits(t), vi_set1((int32_t)f2u(EXP_SHIFT)));
    v16i k1 = vi_sub(vi_shr(vi_add(k, vi_set1(256)), 1), vi_set1(128));
    v16i k2 = vi_sub(k, k1);
    v16i b = vi_set1(127);
    v16 s1 = v_from_bits(vi_shl(vi_add(k1, b), 23));
    v16 s2 = v_from_bits(vi_shl(vi_add(k2, b), 23));
    return v_mul(v_mul(y, s1), s2);
}

V16_INLINE v16 v_exp(v16 x) {
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
V16_INLINE void values_block(const int NB, float *out, const float *const *val, int64_t k0, int64_t len,
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
