/*
 * qmatmul.c — y = x W^T and y = x W over borrowed weights in any checkpoint format
 * (see qmatmul.h).  Work is split over blocks of MM_RB output rows (x W^T) or
 * output column chunks (x W), so a decode step (one row of x) reads every weight
 * byte exactly once.
 *
 * The arithmetic order of y = x W^T, which is the batch-invariance contract of
 * qmatmul.h: output y[t][o] keeps 16 fp32 partial sums, lane = column mod 16,
 * each starting at +0 and updated in increasing column order by a fused
 * multiply-add (one rounding, as C's fmaf), then reduced by the fixed tree
 *     s8[i] = l[i] + l[i+8],  s4[i] = s8[i] + s8[i+4],  s2[i] = s4[i] + s4[i+2],
 *     y = s2[0] + s2[1]
 * (simd16.h's red16, whose lane layout and vector trees attn.c shares).
 * That order depends on the column count only.  Which rows of x are computed
 * together (register blocks of tokens, tiles of MM_TB rows), the column chunks
 * and the thread change nothing: every accumulator sees the same operations.
 * Why this order: a fused multiply-add is one instruction where a multiply then
 * an add is two on the same ports, so the compute-bound multi-token products
 * (tree verify, the drafter) run up to twice as fast, and it rounds once; 16
 * lanes are one AVX-512 register per output.
 *
 * Three kernels implement it and give the same bits:
 *  - AVX-512F + FMA: one zmm per output, blocks of 4 weight rows x up to 6 tokens
 *    (24 accumulators); BF16 and F16 weights are widened in registers from the
 *    checkpoint, F32 read in place; the reduction of 4 rows of one token is done
 *    across registers (the same tree, lane for lane).
 *  - AVX2 + FMA: two ymm per output, blocks of 2 rows x 2 tokens.
 *  - portable C (no intrinsics; also ddt_cpu_matmul_portable, which the tests
 *    compare bitwise with the SIMD kernels): fmaf, which C11 7.12.13.1 defines
 *    as one correctly rounded operation, so it gives the SIMD kernels' bits.  A
 *    build without hardware FMA therefore calls libm per term: slower, but the
 *    same results on every machine and build, which a separate multiply and add
 *    would not give.
 * FP8 and INT4 weights (and every format in the portable kernel) are first
 * dequantised a chunk of MM_CH columns at a time into a stack buffer that serves
 * all the tokens of the tile.
 */
#include "backend/cpu/qmatmul.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "backend/cpu/simd16.h"

#define MM_SIMD V16_SIMD
#if MM_SIMD == 512
#define MM_RK 4   /* weight rows per register block */
#define MM_TK 6   /* tokens per register block: 4 x 6 accumulators + 4 weights + x < 32 zmm */
#define MM_F16 1  /* F16 widened in registers (vcvtph2ps is AVX-512F) */
#elif MM_SIMD == 256
#define MM_RK 2   /* 2 x 2 outputs of two ymm each + 4 weights + 2 x: 14 of 16 ymm */
#define MM_TK 2
#if defined(__F16C__)
#define MM_F16 1
#else
#define MM_F16 0
#endif
#endif

#define MM_RB 4     /* weight rows per work item */
#define MM_TB 64    /* activation rows per tile (bounds the in-memory sums) */
#define MM_L V16_L  /* partial sums per output: lane = column mod 16 */
#define MM_CH 256   /* columns dequantised per chunk into the buffer (multiple of MM_L) */
#define MM_CHF 1024 /* columns per chunk read in place by the SIMD kernels (multiple of MM_L) */
#define MT_CH 64    /* output columns per work item of the transposed product */

/* ------------------------------------------------------------------ scalars */

static float bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float g_fp8_lut[256];
static pthread_once_t g_fp8_once = PTHREAD_ONCE_INIT;

static void fp8_lut_init(void) {
    for (int i = 0; i < 256; i++) g_fp8_lut[i] = ddt_fp8_e4m3_to_f32((uint8_t)i);
}

float ddt_cpu_vec_at(const void *data, ddt_dtype dtype, int64_t i) {
    switch (dtype) {
    case DDT_DTYPE_F32: return ((const float *)data)[i];
    case DDT_DTYPE_BF16: return ddt_bf16_to_f32(((const uint16_t *)data)[i]);
    case DDT_DTYPE_F16: return ddt_f16_to_f32(((const uint16_t *)data)[i]);
    default: return NAN; /* the loader only hands over float vectors */
    }
}

/* ------------------------------------------------------------------ dequant */

void ddt_cpu_dequant(const ddt_qweight *w, int64_t row, int64_t c0, int64_t len, float *out) {
    switch (w->format) {
    case DDT_Q_DENSE:
        if (w->dtype == DDT_DTYPE_F32) {
            memcpy(out, (const float *)w->data + row * w->cols + c0, (size_t)len * sizeof(float));
        } else if (w->dtype == DDT_DTYPE_BF16) {
            const uint16_t *s = (const uint16_t *)w->data + row * w->cols + c0;
            for (int64_t j = 0; j < len; j++) out[j] = bits_to_f32((uint32_t)s[j] << 16);
        } else {
            const uint16_t *s = (const uint16_t *)w->data + row * w->cols + c0;
            for (int64_t j = 0; j < len; j++) out[j] = ddt_f16_to_f32(s[j]);
        }
        return;
    case DDT_Q_FP8_BLOCK: {
        pthread_once(&g_fp8_once, fp8_lut_init);
        const uint8_t *s = (const uint8_t *)w->data + row * w->cols;
        int64_t blk = w->block;
        int64_t scols = (w->cols + blk - 1) / blk;
        const float *srow = w->scale_inv + (row / blk) * scols;
        int64_t j = c0, end = c0 + len;
        while (j < end) {
            int64_t b = j / blk;
            int64_t stop = (b + 1) * blk < end ? (b + 1) * blk : end;
            float sc = srow[b];
            for (; j < stop; j++) out[j - c0] = g_fp8_lut[s[j]] * sc;
        }
        return;
    }
    case DDT_Q_INT4_GROUP: {
        int64_t words = (w->cols + 7) / 8;
        int64_t groups = (w->cols + w->group - 1) / w->group;
        const uint32_t *p = (const uint32_t *)w->data + row * words;
        const uint16_t *sc = w->scale + row * groups;
        int64_t j = c0, end = c0 + len, gsz = w->group;
        while (j < end) {
            int64_t gi = j / gsz;
            int64_t stop = (gi + 1) * gsz < end ? (gi + 1) * gsz : end;
            float s = bits_to_f32((uint32_t)sc[gi] << 16);
            for (; j < stop; j++) {
                int32_t q = (int32_t)((p[j >> 3] >> (4 * (j & 7))) & 0xF) - 8;
                out[j - c0] = (float)q * s;
            }
        }
        return;
    }
    }
}

/* ------------------------------------------------------------------ y = x W^T */

/* How the SIMD kernels read a weight row: in place as F32, BF16 or F16, or
 * (WK_BUF) not at all: dequantised into the float buffer, read as F32. */
enum { WK_F32 = 0, WK_BF16 = 1, WK_F16 = 2, WK_BUF = 3 };

static int weight_kind(const ddt_qweight *w) {
    if (w->format != DDT_Q_DENSE) return WK_BUF;
    if (w->dtype == DDT_DTYPE_F32) return WK_F32;
    if (w->dtype == DDT_DTYPE_BF16) return WK_BF16;
#if MM_SIMD && MM_F16
    if (w->dtype == DDT_DTYPE_F16) return WK_F16;
#endif
    return WK_BUF;
}

/* The portable kernel on one chunk: rows [0, R) of a block over tokens [0, tc),
 * weights already fp32 (wf[r][0 .. len)).  acc is [tc][MM_RB][MM_L], zeroed here
 * on the first chunk; on the last the sums are reduced into y[t * ldy + r]. */
static void mm_chunk_portable(int64_t R, const float *const *wf, const float *x, int64_t ldx, int64_t tc,
                              int64_t len, float *acc, int first, int last, float *y, int64_t ldy) {
    for (int64_t t = 0; t < tc; t++) {
        const float *xr = x + t * ldx;
        for (int64_t r = 0; r < R; r++) {
            float *a = acc + (t * MM_RB + r) * MM_L;
            const float *wr = wf[r];
            if (first) memset(a, 0, MM_L * sizeof(float));
            int64_t j = 0;
            for (; j + MM_L <= len; j += MM_L)
                for (int l = 0; l < MM_L; l++) a[l] = fmaf(wr[j + l], xr[j + l], a[l]);
            for (; j < len; j++) a[j & (MM_L - 1)] = fmaf(wr[j], xr[j], a[j & (MM_L - 1)]);
            if (last) y[t * ldy + r] = red16(a);
        }
    }
}

#if MM_SIMD

/* The widening of 16 BF16 / F16 weights; the rest of the vector vocabulary,
 * and the reduction tree, are simd16.h's. */
#if MM_SIMD == 512
V16_INLINE v16 v_bf16(const uint16_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
V16_INLINE v16 v_f16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}
#else
V16_INLINE v16 v_bf16(const uint16_t *p) {
    __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
    __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p + 8)));
    return (v16){_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16))};
}
#if MM_F16
V16_INLINE v16 v_f16(const uint16_t *p) {
    return (v16){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p)),
                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 8)))};
}
#endif
#endif

V16_INLINE v16 v_wload(const int kind, const void *p, int64_t j) {
    if (kind == WK_BF16) return v_bf16((const uint16_t *)p + j);
#if MM_F16
    if (kind == WK_F16) return v_f16((const uint16_t *)p + j);
#endif
    return v_ld((const float *)p + j);
}

/*
 * One register block: weight rows [0, R) x tokens [0, T) over the chunk's
 * columns [0, len).  wp[r]: row r's chunk as `kind`; wt[r]: the fp32 weights of
 * its column tail [len & ~15, len) (read only when len is not a multiple of 16).
 * x[t * ldx + j]: the activations.  acc[(t * MM_RB + r) * MM_L]: the running
 * sums, read unless first, written unless last; on the last chunk they are
 * reduced into y[t * ldy + r] instead.
 */
V16_INLINE void mm_block(const int R, const int T, const int kind, const void *const *wp,
                         const float *const *wt, const float *x, int64_t ldx, int64_t len, float *acc,
                         int first, int last, float *y, int64_t ldy) {
    v16 a[MM_RK][MM_TK];
    for (int t = 0; t < T; t++)
        for (int r = 0; r < R; r++) a[r][t] = first ? v_zero() : v_ld(acc + ((int64_t)t * MM_RB + r) * MM_L);
    const int64_t len16 = len & ~(int64_t)(MM_L - 1);
    for (int64_t j = 0; j < len16; j += MM_L) {
        v16 w[MM_RK];
        for (int r = 0; r < R; r++) w[r] = v_wload(kind, wp[r], j);
        for (int t = 0; t < T; t++) {
            v16 xv = v_ld(x + t * ldx + j);
            for (int r = 0; r < R; r++) a[r][t] = v_fma(w[r], xv, a[r][t]);
        }
    }
    if (len16 < len) {
        v16m m = v_mask(len - len16);
        v16 w[MM_RK];
        for (int r = 0; r < R; r++) w[r] = v_ld_m(wt[r], m);
        for (int t = 0; t < T; t++) {
            v16 xv = v_ld_m(x + t * ldx + len16, m);
            for (int r = 0; r < R; r++) a[r][t] = v_fma_m(w[r], xv, a[r][t], m);
        }
    }
    if (!last) {
        for (int t = 0; t < T; t++)
            for (int r = 0; r < R; r++) v_st(acc + ((int64_t)t * MM_RB + r) * MM_L, a[r][t]);
        return;
    }
    for (int t = 0; t < T; t++) {
#if MM_SIMD == 512
        if (R == 4) {
            _mm_storeu_ps(y + t * ldy, v_red16x4(a[0][t], a[1][t], a[2][t], a[3][t]));
            continue;
        }
#endif
        for (int r = 0; r < R; r++) {
            float l[MM_L];
            v_st(l, a[r][t]);
            y[t * ldy + r] = red16(l);
        }
    }
}

/* mm_block with (R, T, kind) as constants, so that each expansion keeps its
 * accumulators in registers. */
#define MM_BLOCK(R_, T_, K_) mm_block(R_, T_, K_, wp, wt, x, ldx, len, acc, first, last, y, ldy)
#if MM_TK == 6
#define MM_TCASES(R_, K_)                                                                                  \
    switch (T) {                                                                                           \
    case 1: MM_BLOCK(R_, 1, K_); break;                                                                    \
    case 2: MM_BLOCK(R_, 2, K_); break;                                                                    \
    case 3: MM_BLOCK(R_, 3, K_); break;                                                                    \
    case 4: MM_BLOCK(R_, 4, K_); break;                                                                    \
    case 5: MM_BLOCK(R_, 5, K_); break;                                                                    \
    default: MM_BLOCK(R_, 6, K_); break;                                                                   \
    }
#else
#define MM_TCASES(R_, K_)                                                                                  \
    switch (T) {                                                                                           \
    case 1: MM_BLOCK(R_, 1, K_); break;                                                                    \
    default: MM_BLOCK(R_, 2, K_); break;                                                                   \
    }
#endif
#define MM_KCASES(R_)                                                                                      \
    switch (kind) {                                                                                        \
    case WK_BF16: MM_TCASES(R_, WK_BF16) break;                                                            \
    case WK_F16: MM_TCASES(R_, WK_F16) break;                                                              \
    default: MM_TCASES(R_, WK_F32) break;                                                                  \
    }

/* The register block for R (MM_RK or 1) rows and T (1 .. MM_TK) tokens. */
static void mm_block_any(int R, int T, int kind, const void *const *wp, const float *const *wt, const float *x,
                         int64_t ldx, int64_t len, float *acc, int first, int last, float *y, int64_t ldy) {
    if (R == MM_RK) {
        MM_KCASES(MM_RK)
    } else {
        MM_KCASES(1)
    }
}

/* The SIMD kernel on one chunk: rows [0, R) of a block over tokens [0, tc), in
 * register blocks; arguments as mm_chunk_portable's, weights as mm_block's. */
static void mm_chunk_simd(int64_t R, int kind, const void *const *wp, const float *const *wt, const float *x,
                          int64_t ldx, int64_t tc, int64_t len, float *acc, int first, int last, float *y,
                          int64_t ldy) {
    for (int64_t r = 0; r < R;) {
        int rk = R - r >= MM_RK ? MM_RK : 1;
        for (int64_t t = 0; t < tc;) {
            int tk = tc - t < MM_TK ? (int)(tc - t) : MM_TK;
            mm_block_any(rk, tk, kind, wp + r, wt + r, x + t * ldx, ldx, len, acc + (t * MM_RB + r) * MM_L, first,
                         last, y + t * ldy + r, ldy);
            t += tk;
        }
        r += rk;
    }
}
#endif /* MM_SIMD */

typedef struct mm_job {
    const ddt_qweight *w;
    ddt_row_groups g;
    const float *x;
    int64_t ldx, n;
    float *y;
    int64_t ldy;
    int64_t row_blocks; /* per group */
    int portable;       /* the portable kernel even where a SIMD one is compiled */
} mm_job;

static void mm_task(void *p, int64_t begin, int64_t end, int32_t thread) {
    (void)thread;
    const mm_job *jb = p;
    const ddt_qweight *w = jb->w;
    const int64_t cols = w->cols;
    const int simd = MM_SIMD && !jb->portable;
    const int kind = simd ? weight_kind(w) : WK_BUF;
    const int in_place = kind != WK_BUF;
    const int64_t esize = kind == WK_F32 ? 4 : 2; /* bytes per weight read in place */
    const int64_t chunk = in_place ? MM_CHF : MM_CH;
    /* the sums between chunks: [MM_TB][MM_RB][MM_L] */
    _Alignas(64) float acc[MM_TB * MM_RB * MM_L];
    _Alignas(64) float wbuf[MM_RB][MM_CH];
    float wtail[MM_RB][MM_L];
    for (int64_t item = begin; item < end; item++) {
        int64_t g = item / jb->row_blocks;
        int64_t r0 = (item % jb->row_blocks) * MM_RB;
        int64_t rc = jb->g.rows - r0 < MM_RB ? jb->g.rows - r0 : MM_RB;
        int64_t wrow0 = g * jb->g.w_row_stride + jb->g.w_row_offset + r0;
        for (int64_t t0 = 0; t0 < jb->n; t0 += MM_TB) {
            int64_t tc = jb->n - t0 < MM_TB ? jb->n - t0 : MM_TB;
            const float *xt = jb->x + t0 * jb->ldx + g * jb->g.x_stride;
            float *yt = jb->y + t0 * jb->ldy + g * jb->g.y_stride + r0;
            if (cols <= 0) /* no columns: the empty sum, which the chunk loop below never writes */
                for (int64_t t = 0; t < tc; t++)
                    for (int64_t r = 0; r < rc; r++) yt[t * jb->ldy + r] = 0.0f;
            for (int64_t c0 = 0; c0 < cols; c0 += chunk) {
                int64_t len = cols - c0 < chunk ? cols - c0 : chunk;
                int64_t len16 = len & ~(int64_t)(MM_L - 1);
                int first = c0 == 0, last = c0 + len == cols;
                const void *wp[MM_RB];
                const float *wf[MM_RB], *wt[MM_RB];
                for (int64_t r = 0; r < rc; r++) {
                    if (in_place) {
                        const char *row = (const char *)w->data + ((wrow0 + r) * cols + c0) * esize;
                        wp[r] = row;
                        if (kind == WK_F32) {
                            wt[r] = (const float *)(const void *)row + len16;
                        } else {
                            if (len16 < len) ddt_cpu_dequant(w, wrow0 + r, c0 + len16, len - len16, wtail[r]);
                            wt[r] = wtail[r];
                        }
                    } else {
                        ddt_cpu_dequant(w, wrow0 + r, c0, len, wbuf[r]);
                        wp[r] = wf[r] = wbuf[r];
                        wt[r] = wbuf[r] + len16;
                    }
                }
#if MM_SIMD
                if (simd) {
                    mm_chunk_simd(rc, in_place ? kind : WK_F32, wp, wt, xt + c0, jb->ldx, tc, len, acc, first, last,
                                  yt, jb->ldy);
                    continue;
                }
#else
                (void)wp; /* the weights read in place, for the SIMD kernels only */
                (void)wt;
#endif
                mm_chunk_portable(rc, wf, xt + c0, jb->ldx, tc, len, acc, first, last, yt, jb->ldy);
            }
        }
    }
}

static void matmul_run(ddt_cpu_pool *pool, const ddt_qweight *w, const ddt_row_groups *g, const float *x,
                       int64_t ldx, int64_t n, float *y, int64_t ldy, int portable) {
    if (n <= 0 || g->rows <= 0 || g->count <= 0) return;
    mm_job jb = {.w = w, .g = *g, .x = x, .ldx = ldx, .n = n, .y = y, .ldy = ldy, .portable = portable};
    jb.row_blocks = (g->rows + MM_RB - 1) / MM_RB;
    ddt_cpu_pool_run(pool, mm_task, &jb, jb.row_blocks * g->count);
}

void ddt_cpu_matmul_grouped(ddt_cpu_pool *pool, const ddt_qweight *w, const ddt_row_groups *g,
                            const float *x, int64_t ldx, int64_t n, float *y, int64_t ldy) {
    matmul_run(pool, w, g, x, ldx, n, y, ldy, 0);
}

void ddt_cpu_matmul(ddt_cpu_pool *pool, const ddt_qweight *w, const float *x, int64_t ldx, int64_t n,
                    float *y, int64_t ldy) {
    ddt_row_groups g = {.count = 1, .w_row_stride = 0, .w_row_offset = 0, .rows = w->rows,
                        .x_stride = 0, .y_stride = 0};
    matmul_run(pool, w, &g, x, ldx, n, y, ldy, 0);
}

void ddt_cpu_matmul_portable(ddt_cpu_pool *pool, const ddt_qweight *w, const float *x, int64_t ldx, int64_t n,
                             float *y, int64_t ldy) {
    ddt_row_groups g = {.count = 1, .w_row_stride = 0, .w_row_offset = 0, .rows = w->rows,
                        .x_stride = 0, .y_stride = 0};
    matmul_run(pool, w, &g, x, ldx, n, y, ldy, 1);
}

/* ------------------------------------------------------------------ y = x W */

typedef struct mt_job {
    const ddt_qweight *w;
    ddt_row_groups g;
    const float *x;
    int64_t ldx, n;
    float *y;
    int64_t ldy;
    int64_t col_blocks; /* per group */
} mt_job;

static void mt_task(void *p, int64_t begin, int64_t end, int32_t thread) {
    (void)thread;
    const mt_job *jb = p;
    const ddt_qweight *w = jb->w;
    float buf[MT_CH];
    for (int64_t item = begin; item < end; item++) {
        int64_t g = item / jb->col_blocks;
        int64_t c0 = (item % jb->col_blocks) * MT_CH;
        int64_t len = w->cols - c0 < MT_CH ? w->cols - c0 : MT_CH;
        for (int64_t t = 0; t < jb->n; t++)
            memset(jb->y + t * jb->ldy + g * jb->g.y_stride + c0, 0, (size_t)len * sizeof(float));
        int64_t wrow0 = g * jb->g.w_row_stride + jb->g.w_row_offset;
        for (int64_t i = 0; i < jb->g.rows; i++) {
            ddt_cpu_dequant(w, wrow0 + i, c0, len, buf);
            for (int64_t t = 0; t < jb->n; t++) {
                float xi = jb->x[t * jb->ldx + g * jb->g.x_stride + i];
                float *yr = jb->y + t * jb->ldy + g * jb->g.y_stride + c0;
                for (int64_t j = 0; j < len; j++) yr[j] += xi * buf[j];
            }
        }
    }
}

void ddt_cpu_matmul_t_grouped(ddt_cpu_pool *pool, const ddt_qweight *w, const ddt_row_groups *g,
                              const float *x, int64_t ldx, int64_t n, float *y, int64_t ldy) {
    if (n <= 0 || w->cols <= 0 || g->count <= 0) return;
    mt_job jb = {.w = w, .g = *g, .x = x, .ldx = ldx, .n = n, .y = y, .ldy = ldy};
    jb.col_blocks = (w->cols + MT_CH - 1) / MT_CH;
    ddt_cpu_pool_run(pool, mt_task, &jb, jb.col_blocks * g->count);
}
