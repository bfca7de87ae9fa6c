/*
 * attn.h — the CPU attention's per-query-row kernel, shared by the target's MLA
 * attention (mla.c) and the drafter's block attention (dflash.c), and the exp it
 * uses.  Both have one fixed arithmetic order, implemented by an AVX-512, an
 * AVX2 and a portable C version that give the same bits (the tests compare them).
 *
 * exp.  ddt_cpu_expf(x) / ddt_cpu_exp_n, every step one IEEE operation or one
 * fused multiply-add (C's fmaf, one rounding):
 *   x = min(max(x, -104), 89), a NaN passing through unchanged
 *       (below -104 the result is 0, above 89 +inf, so nothing is lost);
 *   t = fma(x, log2(e), 0x1.8p23): the shifter puts round-to-nearest-even of
 *       x log2(e) in t's low bits, k = bits(t) - bits(0x1.8p23), kf = t - 0x1.8p23;
 *   r = fma(-kf, ln2_hi, x), r = fma(-kf, ln2_lo, r)   (ln2_hi = (float)ln 2);
 *   p = c5; p = fma(p, r, c4) ... fma(p, r, c0)   (Cephes expf's minimax
 *       coefficients for |r| <= ln2/2), y = fma(p, r*r, r) + 1;
 *   result = (y * 2^k1) * 2^k2 with k1 = floor(k / 2), k2 = k - k1: the first
 *       product is exact, so the result is y 2^k rounded once, subnormals
 *       included; k = 128 overflows to +inf.
 * At most 1.02 ulp from exp over [-104, ln FLT_MAX] (checked once on every
 * float; the tests measure samples against double exp and allow 2), 0.99 ulp
 * on the softmax's x <= 0; exp(0) = 1 exactly, exp(-inf) = +0, exp(NaN) is
 * NaN.  Why not libm's expf: it has no vector form with defined bits, and the
 * attention calls it once per score.
 *
 * Attention of one query row over a sequence of visible rows j = 0, 1, ... (the
 * caller decides which cache rows are visible and feeds them in their logical
 * order: for a tree node that is the committed prefix then its path, the same
 * rows in the same order as a prefill of that path feeds).  The rows are taken
 * in chunks of DDT_CPU_ATTN_CHUNK = 16 consecutive visible rows; chunk
 * boundaries are positions in that sequence, so they, and everything below,
 * depend on the row's own visible sequence only: not on the batch, the mask
 * layout or the thread.
 *   score s_j = red16(a) * scale, where a is 16 fp32 lanes starting at +0,
 *       updated by a[k mod 16] = fma(q0[k], key_j[k], .) for k = 0 .. d0 - 1,
 *       then a[k mod 16] = fma(q1[k], key_j[d0 + k], .) for k = 0 .. d1 - 1,
 *       and red16 the matmul's fixed tree (simd16.h): s8[i] = a[i] + a[i+8],
 *       s4[i] = s8[i] + s8[i+4], s2[i] = s4[i] + s4[i+2], s2[0] + s2[1];
 *   per chunk of c rows: mc = the largest non-NaN score (-inf if none) + 0.0f
 *       (the add makes a -0 +0); if mc > m: f = exp(m - mc), m = mc, and every
 *       lane of l and every out[k] is multiplied by f (f = 0 on the first chunk,
 *       where l and out are still +0);
 *       p_j = exp(s_j - m); l[j mod 16] = l[j mod 16] + p_j;
 *       out[k] = fma(p_j, val_j[k], out[k]) for the c rows in order;
 *   at the end: L = red16(l); if L > 0, out[k] = out[k] * (1 / L).
 * m starts at -inf, l and out at +0.  A NaN score makes that row's output NaN.
 * Why this order: the dot products are 16-lane FMA chains like the matmul's, and
 * a chunk's 16 scores are reduced, exponentiated and compared as one vector,
 * where the former order took two scalar expf per row.
 */
#ifndef DDT_BACKEND_CPU_ATTN_H
#define DDT_BACKEND_CPU_ATTN_H

#include <stdbool.h>
#include <stdint.h>

#define DDT_CPU_ATTN_CHUNK 16

/* exp as above, the portable scalar version. */
float ddt_cpu_expf(float x);

/* y[i] = exp(x[i]) for i < n, by the SIMD kernel where one is compiled, or by
 * the portable one when `portable` (the same bits). */
void ddt_cpu_exp_n(const float *x, float *y, int64_t n, bool portable);

/* One query row's operands: the score of key row `key` is
 *   scale * (q0 . key[0, d0) + q1 . key[d0, d0 + d1)),
 * in the order of the head comment (d1 may be 0); values are val[0, dv). */
typedef struct ddt_cpu_attn_spec {
    const float *q0, *q1;
    int32_t d0, d1, dv;
    float scale;
    bool portable; /* the portable kernel even where a SIMD one is compiled */
} ddt_cpu_attn_spec;

/* The running state of one query row: begin, then the visible rows in order,
 * in chunks of DDT_CPU_ATTN_CHUNK (every chunk but the last full), then end.
 * out: dv floats, the row's output (written from begin on, so it must not
 * alias the query or the rows). */
typedef struct ddt_cpu_attn_row {
    float m;
    float l[DDT_CPU_ATTN_CHUNK];
    float *out;
} ddt_cpu_attn_row;

void ddt_cpu_attn_begin(const ddt_cpu_attn_spec *s, ddt_cpu_attn_row *st, float *out);
/* Fold the next c (1 .. 16) visible rows in: key rows key[0 .. c) and value
 * rows val[0 .. c) (a key and its value may be the same memory).  Several query
 * rows that see the same rows (the heads of a token) take one chunk in turn
 * while it is in cache; that changes no query row's arithmetic. */
void ddt_cpu_attn_chunk(const ddt_cpu_attn_spec *s, ddt_cpu_attn_row *st, const float *const *key,
                        const float *const *val, int32_t c);
void ddt_cpu_attn_end(const ddt_cpu_attn_spec *s, ddt_cpu_attn_row *st);

/* Most query rows (heads) a caller feeds one chunk to in turn: their states
 * are on its stack. */
#define DDT_CPU_ATTN_HEADS 8

/* How many of `heads` heads sharing rows one work item should take for n query
 * tokens on `threads` threads: as many as DDT_CPU_ATTN_HEADS allows (fewer
 * reads of the rows) while there are still at least `threads` items.  It
 * changes no query row's arithmetic, only which rows are in cache. */
int32_t ddt_cpu_attn_heads_per_item(int64_t n, int32_t heads, int32_t threads);

#endif
