/*
 * drafter_desc.c — the drafter description shared by the CPU and CUDA drafters
 * (see drafter_desc.h).
 */
#include "model/drafter_desc.h"

#include <math.h>
#include <string.h>

#include "backend/cpu/rope.h"

_Static_assert(DDT_DRAFTER_MAX_HEAD_DIM <= DDT_ROPE_MAX_DIM,
               "io/drafter_config.c bounds head_dim by DDT_DRAFTER_MAX_HEAD_DIM only: RoPE must cover it");

void ddt_drafter_dims_fill(const ddt_drafter_config *c, ddt_drafter_dims *d) {
    memset(d, 0, sizeof *d);
    d->H = c->hidden_size;
    d->heads = c->num_attention_heads;
    d->kv_heads = c->num_key_value_heads;
    d->hd = c->head_dim;
    d->qd = d->heads * d->hd;
    d->kvd = d->kv_heads * d->hd;
    d->inter = c->intermediate_size;
    d->L = c->block_size;
    d->n_tl = c->n_target_layers;
    d->F = d->n_tl * d->H;
    d->n_layers = c->num_hidden_layers;
    d->eps = c->rms_norm_eps;
    d->scale = 1.0f / sqrtf((float)d->hd);
}
