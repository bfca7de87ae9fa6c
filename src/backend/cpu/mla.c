/*
 * mla.c — absorbed MLA attention over the latent cache (see mla.h).  One work
 * item per (query token, group of heads); the heads of an item take each chunk
 * of the shared latent rows in turn while it is in L1, so the rows come from
 * further away once per token, not once per head.  Each (token, head) is
 * attn.h's row kernel (16-row chunks, 16-lane FMA dot products, vector exp),
 * which fixes its arithmetic whatever the grouping.  Also the rope half of a
 * forward's cache-row write (moved from model/target.c).  The CPU twin of
 * backend/cuda/mla_cuda.cu and mla_verify_cuda.cu.
 */
#include "backend/cpu/mla.h"

#include <stdbool.h>
#include <string.h>

#include "backend/cpu/attn.h"
#include "backend/cpu/rope.h"

typedef struct mla_job {
    const ddt_mla_attn *a;
    int32_t hg;     /* heads per work item, <= DDT_CPU_ATTN_HEADS */
    int32_t groups; /* work items per token */
    bool portable;
} mla_job;

/* The heads of one item, all fed the same chunk of rows. */
typedef struct mla_heads {
    int32_t nh;
    ddt_cpu_attn_spec s[DDT_CPU_ATTN_HEADS];
    ddt_cpu_attn_row st[DDT_CPU_ATTN_HEADS];
    const float *rows[DDT_CPU_ATTN_CHUNK];
    int32_t c;
} mla_heads;

static void mla_flush(mla_heads *w) {
    /* a row is its own key (latent then rope) and its value (the latent) */
    for (int32_t i = 0; i < w->nh; i++) ddt_cpu_attn_chunk(&w->s[i], &w->st[i], w->rows, w->rows, w->c);
    w->c = 0;
}

static void mla_feed(mla_heads *w, const float *row) {
    w->rows[w->c++] = row;
    if (w->c == DDT_CPU_ATTN_CHUNK) mla_flush(w);
}

/* One (query token, group of heads) per item: the token's visible rows fed to
 * attn.h's row kernel in increasing row order, the committed prefix first, so a
 * tree node and a prefill of its path feed the same rows in the same order. */
static void attn_task(void *p, int64_t begin, int64_t end, int32_t thread) {
    (void)thread;
    const mla_job *jb = p;
    const ddt_mla_attn *a = jb->a;
    mla_heads w;
    for (int64_t item = begin; item < end; item++) {
        const int64_t t = item / jb->groups, h0 = (item % jb->groups) * jb->hg;
        w.nh = a->n_heads - h0 < jb->hg ? (int32_t)(a->n_heads - h0) : jb->hg;
        w.c = 0;
        for (int32_t i = 0; i < w.nh; i++) {
            const int64_t h = h0 + i;
            w.s[i] = (ddt_cpu_attn_spec){.q0 = a->q_lat + t * a->q_lat_ld_t + h * a->q_lat_ld_h,
                                         .q1 = a->q_rope + t * a->q_rope_ld_t + h * a->q_rope_ld_h,
                                         .d0 = a->rank, .d1 = a->rope_dim, .dv = a->rank, .scale = a->scale,
                                         .portable = jb->portable};
            ddt_cpu_attn_begin(&w.s[i], &w.st[i], a->out + t * a->out_ld_t + h * a->out_ld_h);
        }
        for (int64_t j = 0; j < a->n_prefix; j++) mla_feed(&w, a->kv + j * a->kv_ld);
        const float *new_rows = a->kv + a->n_prefix * a->kv_ld;
        if (a->vis) {
            const uint64_t *vr = a->vis + t * a->vis_words;
            for (int64_t j = 0; j < a->n; j++)
                if ((vr[j >> 6] >> (j & 63)) & 1u) mla_feed(&w, new_rows + j * a->kv_ld);
        } else {
            for (int64_t j = 0; j <= t; j++) mla_feed(&w, new_rows + j * a->kv_ld);
        }
        if (w.c > 0) mla_flush(&w);
        for (int32_t i = 0; i < w.nh; i++) ddt_cpu_attn_end(&w.s[i], &w.st[i]);
    }
}

static void mla_run(ddt_cpu_pool *pool, const ddt_mla_attn *a, bool portable) {
    if (a->n <= 0 || a->n_heads <= 0) return;
    mla_job jb = {.a = a, .portable = portable};
    jb.hg = ddt_cpu_attn_heads_per_item(a->n, a->n_heads, ddt_cpu_pool_threads(pool));
    jb.groups = (a->n_heads + jb.hg - 1) / jb.hg;
    ddt_cpu_pool_run(pool, attn_task, &jb, (int64_t)a->n * jb.groups);
}

void ddt_cpu_mla_attention(ddt_cpu_pool *pool, const ddt_mla_attn *a) { mla_run(pool, a, false); }

void ddt_cpu_mla_attention_portable(ddt_cpu_pool *pool, const ddt_mla_attn *a) { mla_run(pool, a, true); }

void ddt_cpu_mla_rope_write(const ddt_mla_rope *a) {
    const int32_t half = a->rope_dim / 2, rank = a->rank, rope = a->rope_dim, heads = a->n_heads, qd = a->qdim;
    for (int32_t i = 0; i < a->n; i++) {
        const float *cs = a->cos_v + (size_t)i * half, *sn = a->sin_v + (size_t)i * half;
        float *kr = a->rows + i * a->rows_ld + rank;
        memcpy(kr, a->kva + (size_t)i * (rank + rope) + rank, sizeof(float) * rope);
        ddt_cpu_rope_rotate(kr, rope, a->interleave, cs, sn);
        for (int32_t h = 0; h < heads; h++)
            ddt_cpu_rope_rotate(a->q + ((size_t)i * heads + h) * qd + a->nope, rope, a->interleave, cs, sn);
    }
}
