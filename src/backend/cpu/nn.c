/*
 * nn.c — RMSNorm, the SiLU gate, residual add, row gather and the SiLU-gated MLP
 * (see nn.h).
 */
#include "backend/cpu/nn.h"

#include <math.h>
#include <string.h>

#include "backend/cpu/qmatmul.h"

typedef struct norm_job {
    const float *x;
    int64_t ldx, dim;
    const ddt_cpu_vec *w;
    float eps;
    float *y;
    int64_t ldy;
} norm_job;

static void norm_task(void *p, int64_t begin, int64_t end, int32_t thread) {
    (void)thread;
    const norm_job *jb = p;
    for (int64_t t = begin; t < end; t++) {
        const float *x = jb->x + t * jb->ldx;
        float *y = jb->y + t * jb->ldy;
        float a[8] = {0};
        int64_t j = 0;
        for (; j + 8 <= jb->dim; j += 8)
            for (int l = 0; l < 8; l++) a[l] += x[j + l] * x[j + l];
        for (; j < jb->dim; j++) a[j & 7] += x[j] * x[j];
        float ss = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        float inv = 1.0f / sqrtf(ss / (float)jb->dim + jb->eps);
        for (j = 0; j < jb->dim; j++) y[j] = ddt_cpu_vec_at(jb->w->data, jb->w->dtype, j) * (x[j] * inv);
    }
}

void ddt_cpu_rmsnorm(ddt_cpu_pool *pool, const float *x, int64_t ldx, int64_t n, int64_t dim,
                     const ddt_cpu_vec *w, float eps, float *y, int64_t ldy) {
    norm_job jb = {.x = x, .ldx = ldx, .dim = dim, .w = w, .eps = eps, .y = y, .ldy = ldy};
    ddt_cpu_pool_run(pool, norm_task, &jb, n);
}

typedef struct silu_job {
    float *g;
    int64_t ldg;
    const float *u;
    int64_t ldu, dim;
} silu_job;

static void silu_task(void *p, int64_t begin, int64_t end, int32_t thread) {
    (void)thread;
    const silu_job *jb = p;
    for (int64_t t = begin; t < end; t++) {
        float *g = jb->g + t * jb->ldg;
        const float *u = jb->u + t * jb->ldu;
        for (int64_t j = 0; j < jb->dim; j++) g[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
}

void ddt_cpu_silu_mul(ddt_cpu_pool *pool, float *g, int64_t ldg, const float *u, int64_t ldu,
                      int64_t n, int64_t dim) {
    silu_job jb = {.g = g, .ldg = ldg, .u = u, .ldu = ldu, .dim = dim};
    ddt_cpu_pool_run(pool, silu_task, &jb, n);
}

void ddt_cpu_add(float *x, const float *y, int64_t count) {
    for (int64_t i = 0; i < count; i++) x[i] = x[i] + y[i];
}

void ddt_cpu_gather_rows(float *dst, int64_t ldd, const float *src, int64_t lds, const int32_t *rows, int32_t m,
                         int64_t cols) {
    for (int32_t k = 0; k < m; k++)
        memcpy(dst + (size_t)k * (size_t)ldd, src + (size_t)rows[k] * (size_t)lds, sizeof(float) * (size_t)cols);
}

void ddt_cpu_mlp_forward(ddt_cpu_pool *pool, const ddt_cpu_mlp *m, const float *x, int64_t ldx, int64_t n,
                         float *g, float *u, float *out, int64_t ldo) {
    const int64_t inter = m->gate.rows;
    ddt_cpu_matmul(pool, &m->gate, x, ldx, n, g, inter);
    ddt_cpu_matmul(pool, &m->up, x, ldx, n, u, inter);
    ddt_cpu_silu_mul(pool, g, inter, u, inter, n, inter);
    ddt_cpu_matmul(pool, &m->down, g, inter, n, out, ldo);
}
