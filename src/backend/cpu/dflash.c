/*
 * dflash.c — the DFlash block attention on the CPU (see dflash.h); the CPU twin
 * of ddt_dflash_attention in backend/cuda/dflash_cuda.cu.  Moved here from
 * model/drafter.c, same arithmetic.
 */
#include "backend/cpu/dflash.h"

#include <math.h>

#include "backend/cpu/rope.h"

static void attn_task(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    (void)thread;
    const ddt_cpu_dflash_attn *a = ctx;
    const int32_t hd = a->hd, group = a->heads / a->kv_heads, kvd = a->kv_heads * a->hd;
    const int64_t qd = (int64_t)a->heads * a->hd;
    float acc[DDT_CPU_DFLASH_MAX_HEAD_DIM];
    for (int64_t it = begin; it < end; it++) {
        const int64_t t = it / a->heads, h = it % a->heads, g = h / group;
        const float *q = a->q + t * qd + h * hd;
        /* online softmax in fp32, rows in increasing order */
        float m = -INFINITY, sum = 0.0f;
        for (int32_t j = 0; j < hd; j++) acc[j] = 0.0f;
        for (int64_t r = 0; r < a->n_rows; r++) {
            const float *kr = a->k + r * kvd + g * hd, *vr = a->v + r * kvd + g * hd;
            float s = 0.0f;
            for (int32_t j = 0; j < hd; j++) s += q[j] * kr[j];
            s *= a->scale;
            if (s > m) {
                float c = expf(m - s); /* 0 on the first row (m = -inf) */
                sum *= c;
                for (int32_t j = 0; j < hd; j++) acc[j] *= c;
                m = s;
            }
            float p = expf(s - m);
            sum += p;
            for (int32_t j = 0; j < hd; j++) acc[j] += p * vr[j];
        }
        float *o = a->o + t * qd + h * hd;
        float inv = 1.0f / sum;
        for (int32_t j = 0; j < hd; j++) o[j] = acc[j] * inv;
    }
}

void ddt_cpu_dflash_attention(ddt_cpu_pool *pool, const ddt_cpu_dflash_attn *a) {
    ddt_cpu_pool_run(pool, attn_task, (void *)a, (int64_t)a->n_block * a->heads);
}

void ddt_cpu_dflash_norm_rope(ddt_cpu_pool *pool, const float *x, int64_t ldx, int32_t n, int32_t nh, int32_t hd,
                              const ddt_cpu_vec *w, float eps, const float *cos_v, const float *sin_v, float *y,
                              int64_t ldy) {
    const int32_t half = hd / 2;
    const int64_t width = (int64_t)nh * hd;
    /* packed rows are one norm over n * nh heads; strided ones one per row */
    if (ldx == width && ldy == width)
        ddt_cpu_rmsnorm(pool, x, hd, (int64_t)n * nh, hd, w, eps, y, hd);
    else
        for (int32_t t = 0; t < n; t++) ddt_cpu_rmsnorm(pool, x + t * ldx, hd, nh, hd, w, eps, y + t * ldy, hd);
    for (int32_t t = 0; t < n; t++)
        for (int32_t h = 0; h < nh; h++)
            ddt_cpu_rope_rotate(y + t * ldy + (int64_t)h * hd, hd, false, cos_v + (size_t)t * half,
                                sin_v + (size_t)t * half);
}
