/*
 * qmatmul.c — y = x W^T and y = x W over borrowed weights in any checkpoint format
 * (see qmatmul.h).  Work is split over blocks of output rows (x W^T) or output
 * column chunks (x W); each block dequantises its weight chunk once per tile of
 * up to MM_TB activation rows and reuses it for the whole tile, so a decode step
 * (one row) reads every weight byte exactly once.
 *
 * Accumulation for x W^T uses 8 interleaved fp32 partial sums per output (lane =
 * column mod 8) reduced in a fixed tree at the end: this lets the compiler use
 * SIMD without -ffast-math while keeping a fixed, documented order.
 */
#include "backend/cpu/qmatmul.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#define MM_RB 4    /* weight rows per work item */
#define MM_TB 64   /* activation rows per tile */
#define MM_CH 256  /* columns dequantised per chunk (multiple of 8) */
#define MT_CH 64   /* output columns per work item of the transposed product */

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

typedef struct mm_job {
    const ddt_qweight *w;
    ddt_row_groups g;
    const float *x;
    int64_t ldx, n;
    float *y;
    int64_t ldy;
    int64_t row_blocks; /* per group */
} mm_job;

static void mm_task(void *p, int64_t begin, int64_t end, int32_t thread) {
    (void)thread;
    const mm_job *jb = p;
    const ddt_qweight *w = jb->w;
    const int64_t cols = w->cols;
    const int direct = w->format == DDT_Q_DENSE && w->dtype == DDT_DTYPE_F32;
    float wbuf[MM_RB][MM_CH];
    float acc[MM_TB][MM_RB][8];
    for (int64_t item = begin; item < end; item++) {
        int64_t g = item / jb->row_blocks;
        int64_t r0 = (item % jb->row_blocks) * MM_RB;
        int64_t rc = jb->g.rows - r0 < MM_RB ? jb->g.rows - r0 : MM_RB;
        int64_t wrow0 = g * jb->g.w_row_stride + jb->g.w_row_offset + r0;
        for (int64_t t0 = 0; t0 < jb->n; t0 += MM_TB) {
            int64_t tc = jb->n - t0 < MM_TB ? jb->n - t0 : MM_TB;
            memset(acc, 0, (size_t)tc * sizeof acc[0]); /* only the rows in use */
            for (int64_t c0 = 0; c0 < cols; c0 += MM_CH) {
                int64_t len = cols - c0 < MM_CH ? cols - c0 : MM_CH;
                const float *wr[MM_RB];
                for (int64_t r = 0; r < rc; r++) {
                    if (direct) {
                        wr[r] = (const float *)w->data + (wrow0 + r) * cols + c0;
                    } else {
                        ddt_cpu_dequant(w, wrow0 + r, c0, len, wbuf[r]);
                        wr[r] = wbuf[r];
                    }
                }
                int64_t t = 0;
                /* Two tokens x four rows per pass: each weight and activation vector
                 * loaded once feeds several products (the plain loop loads two vectors
                 * per product).  Every accumulator still adds its terms in the same
                 * order, lane by lane, so results are bit-identical to the plain loop. */
                if (rc == MM_RB) {
                    const int64_t len8 = len & ~(int64_t)7;
                    for (; t + 2 <= tc; t += 2) {
                        const float *xa = jb->x + (t0 + t) * jb->ldx + g * jb->g.x_stride + c0;
                        const float *xb = xa + jb->ldx;
                        float *a0 = acc[t][0], *a1 = acc[t][1], *a2 = acc[t][2], *a3 = acc[t][3];
                        float *b0 = acc[t + 1][0], *b1 = acc[t + 1][1], *b2 = acc[t + 1][2],
                              *b3 = acc[t + 1][3];
                        const float *w0 = wr[0], *w1 = wr[1], *w2 = wr[2], *w3 = wr[3];
                        float ra0[8], ra1[8], ra2[8], ra3[8], rb0[8], rb1[8], rb2[8], rb3[8];
                        for (int l = 0; l < 8; l++) {
                            ra0[l] = a0[l], ra1[l] = a1[l], ra2[l] = a2[l], ra3[l] = a3[l];
                            rb0[l] = b0[l], rb1[l] = b1[l], rb2[l] = b2[l], rb3[l] = b3[l];
                        }
                        for (int64_t j = 0; j < len8; j += 8)
                            for (int l = 0; l < 8; l++) {
                                float x1 = xa[j + l], x2 = xb[j + l];
                                float v0 = w0[j + l], v1 = w1[j + l], v2 = w2[j + l], v3 = w3[j + l];
                                ra0[l] += v0 * x1, ra1[l] += v1 * x1, ra2[l] += v2 * x1, ra3[l] += v3 * x1;
                                rb0[l] += v0 * x2, rb1[l] += v1 * x2, rb2[l] += v2 * x2, rb3[l] += v3 * x2;
                            }
                        for (int64_t j = len8; j < len; j++) {
                            ra0[j & 7] += w0[j] * xa[j], ra1[j & 7] += w1[j] * xa[j];
                            ra2[j & 7] += w2[j] * xa[j], ra3[j & 7] += w3[j] * xa[j];
                            rb0[j & 7] += w0[j] * xb[j], rb1[j & 7] += w1[j] * xb[j];
                            rb2[j & 7] += w2[j] * xb[j], rb3[j & 7] += w3[j] * xb[j];
                        }
                        for (int l = 0; l < 8; l++) {
                            a0[l] = ra0[l], a1[l] = ra1[l], a2[l] = ra2[l], a3[l] = ra3[l];
                            b0[l] = rb0[l], b1[l] = rb1[l], b2[l] = rb2[l], b3[l] = rb3[l];
                        }
                    }
                }
                for (; t < tc; t++) {
                    const float *xr = jb->x + (t0 + t) * jb->ldx + g * jb->g.x_stride + c0;
                    for (int64_t r = 0; r < rc; r++) {
                        const float *ww = wr[r];
                        float *a = acc[t][r];
                        int64_t j = 0;
                        for (; j + 8 <= len; j += 8)
                            for (int l = 0; l < 8; l++) a[l] += ww[j + l] * xr[j + l];
                        for (; j < len; j++) a[j & 7] += ww[j] * xr[j];
                    }
                }
            }
            for (int64_t t = 0; t < tc; t++) {
                float *yr = jb->y + (t0 + t) * jb->ldy + g * jb->g.y_stride + r0;
                for (int64_t r = 0; r < rc; r++) {
                    const float *a = acc[t][r];
                    yr[r] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
                }
            }
        }
    }
}

void ddt_cpu_matmul_grouped(ddt_cpu_pool *pool, const ddt_qweight *w, const ddt_row_groups *g,
                            const float *x, int64_t ldx, int64_t n, float *y, int64_t ldy) {
    if (n <= 0 || g->rows <= 0 || g->count <= 0) return;
    mm_job jb = {.w = w, .g = *g, .x = x, .ldx = ldx, .n = n, .y = y, .ldy = ldy};
    jb.row_blocks = (g->rows + MM_RB - 1) / MM_RB;
    ddt_cpu_pool_run(pool, mm_task, &jb, jb.row_blocks * g->count);
}

void ddt_cpu_matmul(ddt_cpu_pool *pool, const ddt_qweight *w, const float *x, int64_t ldx, int64_t n,
                    float *y, int64_t ldy) {
    ddt_row_groups g = {.count = 1, .w_row_stride = 0, .w_row_offset = 0, .rows = w->rows,
                        .x_stride = 0, .y_stride = 0};
    ddt_cpu_matmul_grouped(pool, w, &g, x, ldx, n, y, ldy);
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
