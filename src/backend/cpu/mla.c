/*
 * mla.c — absorbed MLA attention over the latent cache (see mla.h).  One work
 * item per (query token, head); every item reads the shared latent rows, which
 * stay in cache across the heads of a token.  Also the rope half of a
 * forward's cache-row write (moved from model/target.c).  The CPU twin of
 * backend/cuda/mla_cuda.cu and mla_verify_cuda.cu.
 */
#include "backend/cpu/mla.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "backend/cpu/rope.h"

static float dot8(const float *a, const float *b, int64_t len) {
    float s[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= len; j += 8)
        for (int l = 0; l < 8; l++) s[l] += a[j + l] * b[j + l];
    for (; j < len; j++) s[j & 7] += a[j] * b[j];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

typedef struct attn_state {
    float m;   /* running max of the scores */
    float l;   /* running sum of exp(s - m) */
} attn_state;

/* Fold row j's latent values into the running softmax of one (token, head). */
static void attn_add(const ddt_mla_attn *a, const float *ql, const float *qr, const float *row,
                     attn_state *st, float *out) {
    float s = (dot8(ql, row, a->rank) + dot8(qr, row + a->rank, a->rope_dim)) * a->scale;
    if (s > st->m) {
        /* New maximum: rescale what was accumulated under the old one. */
        float f = expf(st->m - s);
        if (st->l > 0.0f) {
            for (int32_t k = 0; k < a->rank; k++) out[k] *= f;
            st->l *= f;
        }
        st->m = s;
    }
    float pj = expf(s - st->m);
    st->l += pj;
    for (int32_t k = 0; k < a->rank; k++) out[k] += pj * row[k];
}

static void attn_task(void *p, int64_t begin, int64_t end, int32_t thread) {
    (void)thread;
    const ddt_mla_attn *a = p;
    for (int64_t item = begin; item < end; item++) {
        int64_t t = item / a->n_heads, h = item % a->n_heads;
        const float *ql = a->q_lat + t * a->q_lat_ld_t + h * a->q_lat_ld_h;
        const float *qr = a->q_rope + t * a->q_rope_ld_t + h * a->q_rope_ld_h;
        float *out = a->out + t * a->out_ld_t + h * a->out_ld_h;
        memset(out, 0, (size_t)a->rank * sizeof(float));
        attn_state st = {.m = -INFINITY, .l = 0.0f};
        for (int64_t j = 0; j < a->n_prefix; j++) attn_add(a, ql, qr, a->kv + j * a->kv_ld, &st, out);
        const float *new_rows = a->kv + a->n_prefix * a->kv_ld;
        if (a->vis) {
            const uint64_t *vr = a->vis + t * a->vis_words;
            for (int64_t j = 0; j < a->n; j++)
                if ((vr[j >> 6] >> (j & 63)) & 1u) attn_add(a, ql, qr, new_rows + j * a->kv_ld, &st, out);
        } else {
            for (int64_t j = 0; j <= t; j++) attn_add(a, ql, qr, new_rows + j * a->kv_ld, &st, out);
        }
        if (st.l > 0.0f) {
            float inv = 1.0f / st.l;
            for (int32_t k = 0; k < a->rank; k++) out[k] *= inv;
        }
    }
}

void ddt_cpu_mla_attention(ddt_cpu_pool *pool, const ddt_mla_attn *a) {
    ddt_cpu_pool_run(pool, attn_task, (void *)a, (int64_t)a->n * a->n_heads);
}

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
