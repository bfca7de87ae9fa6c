/*
 * dflash.c — the DFlash block attention on the CPU (see dflash.h); the CPU twin
 * of ddt_dflash_attention in backend/cuda/dflash_cuda.cu.  The attention of
 * one (query row, head) is attn.h's row kernel over the cache rows in order;
 * the query heads of one kv head take each chunk of its rows in turn.
 */
#include "backend/cpu/dflash.h"

#include <stdbool.h>

#include "backend/cpu/attn.h"
#include "backend/cpu/rope.h"

typedef struct dflash_job {
    const ddt_cpu_dflash_attn *a;
    int32_t hg;     /* query heads per work item, <= DDT_CPU_ATTN_HEADS */
    int32_t groups; /* work items per (query row, kv head) */
    bool portable;
} dflash_job;

/* One (query row, kv head, group of the query heads that share it) per item:
 * each chunk of that kv head's rows goes to the item's heads in turn. */
static void attn_task(void *ctx, int64_t begin, int64_t end, int32_t thread) {
    (void)thread;
    const dflash_job *jb = ctx;
    const ddt_cpu_dflash_attn *a = jb->a;
    const int32_t hd = a->hd, group = a->heads / a->kv_heads, kvd = a->kv_heads * a->hd;
    const int64_t qd = (int64_t)a->heads * a->hd;
    ddt_cpu_attn_spec s[DDT_CPU_ATTN_HEADS];
    ddt_cpu_attn_row st[DDT_CPU_ATTN_HEADS];
    const float *kr[DDT_CPU_ATTN_CHUNK], *vr[DDT_CPU_ATTN_CHUNK];
    for (int64_t it = begin; it < end; it++) {
        const int64_t t = it / ((int64_t)a->kv_heads * jb->groups), rest = it % ((int64_t)a->kv_heads * jb->groups);
        const int64_t g = rest / jb->groups, h0 = g * group + (rest % jb->groups) * jb->hg;
        const int32_t nh = g * group + group - h0 < jb->hg ? (int32_t)(g * group + group - h0) : jb->hg;
        for (int32_t i = 0; i < nh; i++) {
            const int64_t h = h0 + i;
            s[i] = (ddt_cpu_attn_spec){.q0 = a->q + t * qd + h * hd, .q1 = NULL, .d0 = hd, .d1 = 0, .dv = hd,
                                       .scale = a->scale, .portable = jb->portable};
            ddt_cpu_attn_begin(&s[i], &st[i], a->o + t * qd + h * hd);
        }
        for (int64_t r0 = 0; r0 < a->n_rows; r0 += DDT_CPU_ATTN_CHUNK) {
            int32_t c = a->n_rows - r0 < DDT_CPU_ATTN_CHUNK ? (int32_t)(a->n_rows - r0) : DDT_CPU_ATTN_CHUNK;
            for (int32_t j = 0; j < c; j++) {
                kr[j] = a->k + (r0 + j) * kvd + g * hd;
                vr[j] = a->v + (r0 + j) * kvd + g * hd;
            }
            for (int32_t i = 0; i < nh; i++) ddt_cpu_attn_chunk(&s[i], &st[i], kr, vr, c);
        }
        for (int32_t i = 0; i < nh; i++) ddt_cpu_attn_end(&s[i], &st[i]);
    }
}

static void dflash_run(ddt_cpu_pool *pool, const ddt_cpu_dflash_attn *a, bool portable) {
    if (a->n_block <= 0) return;
    const int32_t group = a->heads / a->kv_heads;
    dflash_job jb = {.a = a, .portable = portable};
    jb.hg = ddt_cpu_attn_heads_per_item((int64_t)a->n_block * a->kv_heads, group, ddt_cpu_pool_threads(pool));
    jb.groups = (group + jb.hg - 1) / jb.hg;
    ddt_cpu_pool_run(pool, attn_task, &jb, (int64_t)a->n_block * a->kv_heads * jb.groups);
}

void ddt_cpu_dflash_attention(ddt_cpu_pool *pool, const ddt_cpu_dflash_attn *a) { dflash_run(pool, a, false); }

void ddt_cpu_dflash_attention_portable(ddt_cpu_pool *pool, const ddt_cpu_dflash_attn *a) {
    dflash_run(pool, a, true);
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
