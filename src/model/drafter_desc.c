/*
 * drafter_desc.c — the drafter description shared by the CPU and CUDA drafters
 * (see drafter_desc.h).
 */
#include "model/drafter_desc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/rope.h"
#include "core/alloc.h"
#include "core/error.h"
#include "model/shard.h"

#define NAME_MAX_LEN 512

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

/* ------------------------------------------------------------------ weight views */

static ddt_status load_linear(ddt_drafter_desc *d, const char *base, int64_t rows, int64_t cols, ddt_qweight *w,
                              ddt_error *err) {
    char name[NAME_MAX_LEN];
    int k = snprintf(name, sizeof name, "%s%s", d->prefix, base);
    if (k < 0 || (size_t)k >= sizeof name) return ddt_fail(err, DDT_ERR_RANGE, "tensor name too long: %s", base);
    ddt_status st = ddt_checkpoint_weight(d->ck, name, rows, cols, w, err);
    if (st != DDT_OK) return st;
    if (w->format == DDT_Q_INT4_GROUP && (w->group <= 0 || w->cols % 8 != 0 || w->cols % w->group != 0))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "tensor %s: INT4 group %d with %lld columns", name, w->group,
                        (long long)w->cols);
    return DDT_OK;
}

static ddt_status load_vec(ddt_drafter_desc *d, const char *base, int64_t n, ddt_cpu_vec *v, ddt_error *err) {
    char name[NAME_MAX_LEN];
    int k = snprintf(name, sizeof name, "%s%s", d->prefix, base);
    if (k < 0 || (size_t)k >= sizeof name) return ddt_fail(err, DDT_ERR_RANGE, "tensor name too long: %s", base);
    const ddt_st_tensor *ts;
    int64_t shape[1] = {n};
    ddt_status st = ddt_checkpoint_tensor(d->ck, name, DDT_DTYPE_COUNT, 1, shape, &ts, err);
    if (st != DDT_OK) return st;
    if (ts->dtype != DDT_DTYPE_F32 && ts->dtype != DDT_DTYPE_BF16 && ts->dtype != DDT_DTYPE_F16)
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: tensor %s: expected F32, BF16 or F16, found %s",
                        ddt_checkpoint_file_name(d->ck, ts->file_index), name, ddt_dtype_name(ts->dtype));
    *v = (ddt_cpu_vec){.data = ts->data, .dtype = ts->dtype, .n = n};
    return DDT_OK;
}

static ddt_status load_layer(ddt_drafter_desc *d, int32_t l, ddt_error *err) {
    ddt_drafter_layer *Y = &d->layers[l];
    char b[NAME_MAX_LEN];
    ddt_status st;
#define LN(s) snprintf(b, sizeof b, "layers.%d." s, l)
    LN("input_layernorm.weight");
    if ((st = load_vec(d, b, d->dims.H, &Y->attn_norm, err)) != DDT_OK) return st;
    LN("post_attention_layernorm.weight");
    if ((st = load_vec(d, b, d->dims.H, &Y->mlp_norm, err)) != DDT_OK) return st;
    LN("self_attn.q_proj");
    if ((st = load_linear(d, b, d->dims.qd, d->dims.H, &Y->q_proj, err)) != DDT_OK) return st;
    LN("self_attn.k_proj");
    if ((st = load_linear(d, b, d->dims.kvd, d->dims.H, &Y->k_proj, err)) != DDT_OK) return st;
    LN("self_attn.v_proj");
    if ((st = load_linear(d, b, d->dims.kvd, d->dims.H, &Y->v_proj, err)) != DDT_OK) return st;
    LN("self_attn.o_proj");
    if ((st = load_linear(d, b, d->dims.H, d->dims.qd, &Y->o_proj, err)) != DDT_OK) return st;
    LN("self_attn.q_norm.weight");
    if ((st = load_vec(d, b, d->dims.hd, &Y->q_norm, err)) != DDT_OK) return st;
    LN("self_attn.k_norm.weight");
    if ((st = load_vec(d, b, d->dims.hd, &Y->k_norm, err)) != DDT_OK) return st;
    LN("mlp.gate_proj");
    if ((st = load_linear(d, b, d->dims.inter, d->dims.H, &Y->gate, err)) != DDT_OK) return st;
    LN("mlp.up_proj");
    if ((st = load_linear(d, b, d->dims.inter, d->dims.H, &Y->up, err)) != DDT_OK) return st;
    LN("mlp.down_proj");
    return load_linear(d, b, d->dims.H, d->dims.inter, &Y->down, err);
#undef LN
}

/* Tensors that say the checkpoint is not what the config describes: a layer
 * beyond num_hidden_layers (a config/checkpoint mismatch) or a bias (unsupported). */
static ddt_status scan_tensors(const ddt_drafter_desc *d, ddt_error *err) {
    size_t pl = strlen(d->prefix);
    for (int32_t i = 0; i < ddt_checkpoint_count(d->ck); i++) {
        const ddt_st_tensor *t = ddt_checkpoint_at(d->ck, i);
        const char *n = t->name;
        if (strncmp(n, d->prefix, pl) != 0) continue;
        n += pl;
        size_t nl = strlen(n);
        if (nl > 5 && strcmp(n + nl - 5, ".bias") == 0)
            return ddt_fail(err, DDT_ERR_UNSUPPORTED, "file %s: tensor %s: biases are not supported",
                            ddt_checkpoint_file_name(d->ck, t->file_index), t->name);
        if (strncmp(n, "layers.", 7) == 0) {
            char *end;
            long idx = strtol(n + 7, &end, 10);
            if (end != n + 7 && *end == '.' && (idx < 0 || idx >= d->dims.n_layers))
                return ddt_fail(err, DDT_ERR_FORMAT,
                                "file %s: tensor %s: layer %ld but config num_hidden_layers is %d",
                                ddt_checkpoint_file_name(d->ck, t->file_index), t->name, idx, d->dims.n_layers);
        }
    }
    return DDT_OK;
}

/* The config against the target it will serve. */
static ddt_status check_target(const ddt_drafter_config *c, const ddt_drafter_target *t, const char *where,
                               ddt_error *err) {
    if (!t->embed || !t->lm_head) return ddt_fail(err, DDT_ERR_INVALID, "drafter target: NULL embed or lm_head");
    if (t->hidden_size <= 0 || t->num_layers <= 0 || t->vocab_size <= 0)
        return ddt_fail(err, DDT_ERR_INVALID, "drafter target: hidden %d, layers %d, vocab %d must be positive",
                        t->hidden_size, t->num_layers, t->vocab_size);
    if (c->hidden_size != t->hidden_size)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s: field hidden_size %d differs from the target's hidden size %d", where,
                        c->hidden_size, t->hidden_size);
    if (c->num_target_layers >= 0 && c->num_target_layers != t->num_layers)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s: field num_target_layers %d but the target has %d layers", where,
                        c->num_target_layers, t->num_layers);
    for (int32_t i = 0; i < c->n_target_layers; i++)
        if (c->target_layer_ids[i] >= t->num_layers)
            return ddt_fail(err, DDT_ERR_FORMAT,
                            "%s: field dflash_config.target_layer_ids[%d] = %d outside the target's layers 0..%d",
                            where, i, c->target_layer_ids[i], t->num_layers - 1);
    if (c->vocab_size >= 0 && c->vocab_size != t->vocab_size)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s: field vocab_size %d differs from the target's vocab %d", where,
                        c->vocab_size, t->vocab_size);
    if (c->mask_token_id >= t->vocab_size)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s: field dflash_config.mask_token_id %d outside the target's vocab 0..%d",
                        where, c->mask_token_id, t->vocab_size - 1);
    const ddt_qweight *w[2] = {t->embed, t->lm_head};
    const char *wn[2] = {"embed_tokens", "lm_head"};
    for (int i = 0; i < 2; i++)
        if (w[i]->rows != t->vocab_size || w[i]->cols != t->hidden_size || !w[i]->data)
            return ddt_fail(err, DDT_ERR_INVALID, "drafter target: %s is [%lld, %lld], expected [%d, %d]", wn[i],
                            (long long)w[i]->rows, (long long)w[i]->cols, t->vocab_size, t->hidden_size);
    return DDT_OK;
}

ddt_status ddt_drafter_desc_load(const char *dir, const ddt_drafter_target *target, ddt_drafter_desc *d,
                                 ddt_error *err) {
    memset(d, 0, sizeof *d);
    char where[1100];
    snprintf(where, sizeof where, "%s/config.json", dir);
    ddt_status st = ddt_drafter_config_load(dir, &d->cfg, err);
    if (st != DDT_OK) return st;
    const ddt_drafter_config *c = &d->cfg;
    if ((st = check_target(c, target, where, err)) != DDT_OK) return st;
    ddt_drafter_dims_fill(c, &d->dims);
    if ((int64_t)d->dims.heads * d->dims.hd > INT32_MAX / 2 || (int64_t)c->n_target_layers * d->dims.H > INT32_MAX / 2)
        return ddt_fail(err, DDT_ERR_RANGE, "%s: attention or feature width overflows", where);

    if ((st = ddt_checkpoint_open(dir, &d->ck, err)) != DDT_OK) return st;
    /* Released checkpoints name tensors "fc.weight"...; some exports add "model.". */
    if (ddt_checkpoint_find(d->ck, "fc.weight") || ddt_checkpoint_find(d->ck, "fc.weight_packed")) {
        d->prefix[0] = '\0';
    } else if (ddt_checkpoint_find(d->ck, "model.fc.weight") || ddt_checkpoint_find(d->ck, "model.fc.weight_packed")) {
        strcpy(d->prefix, "model.");
    } else {
        return ddt_fail(err, DDT_ERR_FORMAT, "checkpoint %s: tensor fc.weight (or model.fc.weight) is missing", dir);
    }
    if ((st = scan_tensors(d, err)) != DDT_OK) return st;
    if ((st = load_linear(d, "fc", d->dims.H, d->dims.F, &d->fc, err)) != DDT_OK) return st;
    if ((st = load_vec(d, "hidden_norm.weight", d->dims.H, &d->hidden_norm, err)) != DDT_OK) return st;
    if ((st = load_vec(d, "norm.weight", d->dims.H, &d->final_norm, err)) != DDT_OK) return st;
    d->layers = ddt_calloc_array((size_t)d->dims.n_layers, sizeof *d->layers);
    if (!d->layers) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    for (int32_t l = 0; l < d->dims.n_layers; l++)
        if ((st = load_layer(d, l, err)) != DDT_OK) return st;
    return DDT_OK;
}

void ddt_drafter_desc_free(ddt_drafter_desc *d) {
    if (!d) return;
    free(d->layers);
    ddt_checkpoint_close(d->ck);
    memset(d, 0, sizeof *d);
}

uint64_t ddt_drafter_desc_weight_bytes(const ddt_drafter_desc *d) {
    uint64_t b = ddt_shard_stored_bytes(&d->fc) + ddt_shard_vec_bytes(&d->hidden_norm) + ddt_shard_vec_bytes(&d->final_norm);
    for (int32_t l = 0; l < d->dims.n_layers; l++) {
        const ddt_drafter_layer *L = &d->layers[l];
        const ddt_cpu_vec *v[4] = {&L->attn_norm, &L->mlp_norm, &L->q_norm, &L->k_norm};
        const ddt_qweight *w[7] = {&L->q_proj, &L->k_proj, &L->v_proj, &L->o_proj, &L->gate, &L->up, &L->down};
        for (int i = 0; i < 4; i++) b += ddt_shard_vec_bytes(v[i]);
        for (int i = 0; i < 7; i++) b += ddt_shard_stored_bytes(w[i]);
    }
    return b;
}

uint64_t ddt_drafter_desc_cache_bytes(const ddt_drafter_desc *d, int64_t max_ctx) {
    return (uint64_t)d->dims.n_layers * 2u * (uint64_t)d->dims.kvd * sizeof(float) * (uint64_t)(max_ctx + d->dims.L);
}
