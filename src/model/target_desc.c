/*
 * target_desc.c — the target description shared by the CPU and CUDA targets
 * (see target_desc.h).
 */
#include "model/target_desc.h"

#include <string.h>

void ddt_target_dims_fill(const ddt_model_config *c, ddt_target_dims *d) {
    memset(d, 0, sizeof *d);
    d->hidden = c->hidden_size;
    d->heads = c->num_attention_heads;
    d->nope = c->qk_nope_head_dim;
    d->rope = c->qk_rope_head_dim;
    d->vdim = c->v_head_dim;
    d->rank = c->kv_lora_rank;
    d->qdim = d->nope + d->rope;
    d->q_lora = c->q_lora_rank;
    d->vocab = c->vocab_size;
    d->n_layers = c->num_hidden_layers;
    d->eps = c->rms_norm_eps;
    d->softmax_scale = ddt_config_softmax_scale(c);
    d->inter_max = 1;
    for (int32_t l = 0; l < d->n_layers; l++) {
        bool moe = ddt_config_layer_is_moe(c, l);
        int32_t need = moe ? c->moe_intermediate_size * (c->n_shared_experts > 1 ? c->n_shared_experts : 1)
                           : c->intermediate_size;
        if (moe) {
            d->n_experts = c->n_routed_experts;
            d->top_k = c->num_experts_per_tok;
        }
        if (need > d->inter_max) d->inter_max = need;
    }
}
