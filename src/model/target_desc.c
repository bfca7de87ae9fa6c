/*
 * target_desc.c — the target description shared by the CPU and CUDA targets
 * (see target_desc.h).
 */
#include "model/target_desc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/moe.h"
#include "core/alloc.h"
#include "core/error.h"

#define NAME_MAX_LEN 512

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

/* ------------------------------------------------------------------ weight views */

static uint64_t qweight_bytes(const ddt_qweight *w) {
    uint64_t n = (uint64_t)w->rows * (uint64_t)w->cols;
    switch (w->format) {
    case DDT_Q_DENSE: return n * ddt_dtype_size(w->dtype);
    case DDT_Q_FP8_BLOCK:
        return n + 4u * (uint64_t)((w->rows + w->block - 1) / w->block) * (uint64_t)((w->cols + w->block - 1) / w->block);
    case DDT_Q_INT4_GROUP: return n / 2 + 2u * (uint64_t)w->rows * (uint64_t)(w->cols / w->group) + 16u;
    }
    return 0;
}

/* The checks every weight view passes whatever its source (a 2-D tensor or a
 * slice of a fused expert stack), and its bytes. */
static ddt_status account_linear(ddt_target_desc *t, const char *name, const ddt_qweight *w, ddt_error *err) {
    if (w->format == DDT_Q_FP8_BLOCK && w->block <= 0)
        return ddt_fail(err, DDT_ERR_FORMAT, "tensor %s: FP8 block size %d", name, w->block);
    if (w->format == DDT_Q_INT4_GROUP && (w->group <= 0 || w->cols % 8 != 0 || w->cols % w->group != 0))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "tensor %s: INT4 group %d with %lld columns", name, w->group,
                        (long long)w->cols);
    t->weight_bytes += qweight_bytes(w);
    return DDT_OK;
}

static ddt_status load_linear(ddt_target_desc *t, const char *base, int64_t rows, int64_t cols, ddt_qweight *w,
                              ddt_error *err) {
    char name[NAME_MAX_LEN];
    int k = snprintf(name, sizeof name, "%s%s", t->cfg.tensor_prefix, base);
    if (k < 0 || (size_t)k >= sizeof name) return ddt_fail(err, DDT_ERR_RANGE, "tensor name too long: %s", base);
    ddt_status st = ddt_checkpoint_weight(t->ck, name, rows, cols, w, err);
    if (st != DDT_OK) return st;
    return account_linear(t, name, w, err);
}

/* A 1-D float vector of n values (norm weights, router bias). */
static ddt_status load_vec(ddt_target_desc *t, const char *base, int64_t n, ddt_cpu_vec *v, ddt_error *err) {
    char name[NAME_MAX_LEN];
    int k = snprintf(name, sizeof name, "%s%s", t->cfg.tensor_prefix, base);
    if (k < 0 || (size_t)k >= sizeof name) return ddt_fail(err, DDT_ERR_RANGE, "tensor name too long: %s", base);
    memset(v, 0, sizeof *v);
    const ddt_st_tensor *ts;
    int64_t shape[1] = {n};
    ddt_status st = ddt_checkpoint_tensor(t->ck, name, DDT_DTYPE_COUNT, 1, shape, &ts, err);
    if (st != DDT_OK) return st;
    if (ts->dtype != DDT_DTYPE_F32 && ts->dtype != DDT_DTYPE_BF16 && ts->dtype != DDT_DTYPE_F16)
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: tensor %s: expected F32, BF16 or F16, found %s",
                        ddt_checkpoint_file_name(t->ck, ts->file_index), name, ddt_dtype_name(ts->dtype));
    v->data = ts->data;
    v->dtype = ts->dtype;
    v->n = n;
    t->weight_bytes += (uint64_t)n * ddt_dtype_size(ts->dtype);
    return DDT_OK;
}

static ddt_status load_mlp(ddt_target_desc *t, const char *pre, int64_t inter, ddt_cpu_mlp *m, ddt_error *err) {
    char b[NAME_MAX_LEN];
    ddt_status st;
    snprintf(b, sizeof b, "%s.gate_proj", pre);
    if ((st = load_linear(t, b, inter, t->dims.hidden, &m->gate, err)) != DDT_OK) return st;
    snprintf(b, sizeof b, "%s.up_proj", pre);
    if ((st = load_linear(t, b, inter, t->dims.hidden, &m->up, err)) != DDT_OK) return st;
    snprintf(b, sizeof b, "%s.down_proj", pre);
    return load_linear(t, b, t->dims.hidden, inter, &m->down, err);
}

/* How a MoE layer stores its routed experts. */
typedef enum expert_layout {
    EXPERTS_UNSEEN = 0,  /* no MoE layer loaded yet */
    EXPERTS_PER_EXPERT,  /* DeepSeek's names: mlp.experts.{e}.{gate,up,down}_proj.* */
    EXPERTS_FUSED        /* transformers 5's module layout: mlp.experts.gate_up_proj [E, 2I, H] + down_proj [E, H, I] */
} expert_layout;

static const char *layout_words(expert_layout k) {
    return k == EXPERTS_FUSED ? "fused (mlp.experts.gate_up_proj / down_proj)" : "per expert (mlp.experts.{e}.*_proj)";
}

/* The tensor names of the fused layout, after "<layer>.mlp.experts.". */
static bool is_fused_name(const char *rest) {
    return !strcmp(rest, "gate_up_proj") || !strcmp(rest, "down_proj") || !strcmp(rest, "gate_up_proj_scale_inv") ||
           !strcmp(rest, "down_proj_scale_inv");
}

/*
 * Classify layer l's routed-expert tensors (every name under
 * "<prefix>model.layers.<l>.mlp.experts.") and refuse what cannot be loaded
 * faithfully: both layouts in one layer, a fused pair with one half missing, or
 * a tensor beside the fused pair that the engine would not read (a bias, a packed
 * INT4 stack, a `.weight`-suffixed variant): ignoring it would change the model.
 */
static ddt_status classify_experts(ddt_target_desc *t, int32_t l, expert_layout *kind, ddt_error *err) {
    char pre[NAME_MAX_LEN];
    int k = snprintf(pre, sizeof pre, "%smodel.layers.%d.mlp.experts.", t->cfg.tensor_prefix, l);
    if (k < 0 || (size_t)k >= sizeof pre) return ddt_fail(err, DDT_ERR_RANGE, "layer %d: tensor prefix too long", l);
    const size_t plen = (size_t)k;
    int32_t first = 0, n = ddt_checkpoint_prefix_range(t->ck, pre, &first);
    const char *per_expert = NULL, *gate_up = NULL, *down = NULL, *odd = NULL;
    for (int32_t i = 0; i < n; i++) {
        const char *name = ddt_checkpoint_at(t->ck, first + i)->name, *rest = name + plen;
        if (rest[0] >= '0' && rest[0] <= '9') {
            if (!per_expert) per_expert = name;
        } else if (!strcmp(rest, "gate_up_proj")) {
            gate_up = name;
        } else if (!strcmp(rest, "down_proj")) {
            down = name;
        } else if (!is_fused_name(rest) && !odd) {
            odd = name;
        }
    }
    if (!gate_up && !down) {
        /* A per-expert layer has only ever been read by expert number; a name under
         * experts. that starts like a fused tensor is a fused variant this engine
         * does not know, and would otherwise end as "experts.0.gate_proj is missing". */
        if (odd && (!strncmp(odd + plen, "gate_up_proj", 12) || !strncmp(odd + plen, "down_proj", 9)))
            return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                            "layer %d: tensor %s is not a supported routed-expert layout (fused experts are "
                            "%sgate_up_proj [E, 2I, H] and %sdown_proj [E, H, I], no suffix, plus _scale_inv for FP8)",
                            l, odd, pre, pre);
        *kind = EXPERTS_PER_EXPERT;
        return DDT_OK;
    }
    if (per_expert)
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "layer %d: routed experts stored in both layouts: fused tensor %s and per-expert tensor %s; "
                        "a layer must use one",
                        l, gate_up ? gate_up : down, per_expert);
    if (!gate_up || !down)
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "layer %d: half-fused routed experts: tensor %s is present but tensor %s%s is missing "
                        "(the fused layout needs both gate_up_proj and down_proj)",
                        l, gate_up ? gate_up : down, pre, gate_up ? "down_proj" : "gate_up_proj");
    if (odd)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "layer %d: tensor %s beside the fused experts is not supported (only gate_up_proj, "
                        "down_proj and their _scale_inv are read)",
                        l, odd);
    *kind = EXPERTS_FUSED;
    return DDT_OK;
}

/* Views of every expert's gate/up/down into the fused pair: expert e's gate is
 * rows [0, I) of gate_up_proj[e], its up rows [I, 2I) (transformers concatenates
 * gate then up, as its MoE forward chunks them), its down is down_proj[e]. */
static ddt_status load_fused_experts(ddt_target_desc *t, int32_t l, ddt_cpu_mlp *experts, ddt_error *err) {
    const int64_t E = t->dims.n_experts, I = t->cfg.moe_intermediate_size, H = t->dims.hidden;
    char gname[NAME_MAX_LEN], dname[NAME_MAX_LEN];
    int a = snprintf(gname, sizeof gname, "%smodel.layers.%d.mlp.experts.gate_up_proj", t->cfg.tensor_prefix, l);
    int b = snprintf(dname, sizeof dname, "%smodel.layers.%d.mlp.experts.down_proj", t->cfg.tensor_prefix, l);
    if (a < 0 || (size_t)a >= sizeof gname || b < 0 || (size_t)b >= sizeof dname)
        return ddt_fail(err, DDT_ERR_RANGE, "layer %d: tensor name too long", l);
    ddt_qweight_stack gu, dn;
    ddt_status st = ddt_checkpoint_weight_stack(t->ck, gname, E, 2 * I, H, &gu, err);
    if (st != DDT_OK) return st;
    if ((st = ddt_checkpoint_weight_stack(t->ck, dname, E, H, I, &dn, err)) != DDT_OK) return st;
    if (gu.format == DDT_Q_FP8_BLOCK && I % gu.block != 0)
        /* the up half would begin inside a scale block shared with the gate half:
         * a per-expert view cannot say that, and the forward runs gate and up apart */
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "tensor %s: FP8 fused gate_up_proj needs moe_intermediate_size (%lld) to be a multiple of "
                        "the %d-row scale block; store these experts per expert instead",
                        gname, (long long)I, gu.block);
    for (int64_t e = 0; e < E; e++) {
        ddt_cpu_mlp *m = &experts[e];
        if ((st = ddt_qweight_stack_view(&gu, e, 0, I, &m->gate, err)) != DDT_OK) return st;
        if ((st = account_linear(t, gname, &m->gate, err)) != DDT_OK) return st;
        if ((st = ddt_qweight_stack_view(&gu, e, I, I, &m->up, err)) != DDT_OK) return st;
        if ((st = account_linear(t, gname, &m->up, err)) != DDT_OK) return st;
        if ((st = ddt_qweight_stack_view(&dn, e, 0, H, &m->down, err)) != DDT_OK) return st;
        if ((st = account_linear(t, dname, &m->down, err)) != DDT_OK) return st;
    }
    return DDT_OK;
}

static ddt_status load_experts(ddt_target_desc *t, int32_t l, ddt_cpu_mlp *experts, ddt_error *err) {
    expert_layout kind = EXPERTS_UNSEEN;
    ddt_status st = classify_experts(t, l, &kind, err);
    if (st != DDT_OK) return st;
    /* transformers saves the whole model in one layout; layers in both mean the
     * folder mixes the files of two saves, which need not be the same model */
    if (t->expert_layout != EXPERTS_UNSEEN && t->expert_layout != (int32_t)kind)
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "layer %d stores its routed experts %s but layer %d %s: a checkpoint must use one layout",
                        l, layout_words(kind), t->expert_layout_layer, layout_words((expert_layout)t->expert_layout));
    t->expert_layout = (int32_t)kind;
    t->expert_layout_layer = l;
    if (kind == EXPERTS_FUSED) return load_fused_experts(t, l, experts, err);
    char b[NAME_MAX_LEN];
    for (int32_t e = 0; e < t->dims.n_experts; e++) {
        snprintf(b, sizeof b, "model.layers.%d.mlp.experts.%d", l, e);
        if ((st = load_mlp(t, b, t->cfg.moe_intermediate_size, &experts[e], err)) != DDT_OK) return st;
    }
    return DDT_OK;
}

static ddt_status load_layer(ddt_target_desc *t, int32_t l, ddt_error *err) {
    const ddt_model_config *c = &t->cfg;
    ddt_target_layer *L = &t->layers[l];
    char b[NAME_MAX_LEN];
    ddt_status st;
#define LNAME(fmt) snprintf(b, sizeof b, "model.layers.%d." fmt, l)
    LNAME("input_layernorm.weight");
    if ((st = load_vec(t, b, t->dims.hidden, &L->attn_norm, err)) != DDT_OK) return st;
    LNAME("post_attention_layernorm.weight");
    if ((st = load_vec(t, b, t->dims.hidden, &L->mlp_norm, err)) != DDT_OK) return st;
    if (t->dims.q_lora > 0) {
        LNAME("self_attn.q_a_proj");
        if ((st = load_linear(t, b, t->dims.q_lora, t->dims.hidden, &L->q_a, err)) != DDT_OK) return st;
        LNAME("self_attn.q_a_layernorm.weight");
        if ((st = load_vec(t, b, t->dims.q_lora, &L->q_a_norm, err)) != DDT_OK) return st;
        LNAME("self_attn.q_b_proj");
        if ((st = load_linear(t, b, (int64_t)t->dims.heads * t->dims.qdim, t->dims.q_lora, &L->q_b, err)) != DDT_OK) return st;
    } else {
        LNAME("self_attn.q_proj");
        if ((st = load_linear(t, b, (int64_t)t->dims.heads * t->dims.qdim, t->dims.hidden, &L->q_proj, err)) != DDT_OK) return st;
    }
    LNAME("self_attn.kv_a_proj_with_mqa");
    if ((st = load_linear(t, b, t->dims.rank + t->dims.rope, t->dims.hidden, &L->kv_a, err)) != DDT_OK) return st;
    LNAME("self_attn.kv_a_layernorm.weight");
    if ((st = load_vec(t, b, t->dims.rank, &L->kv_a_norm, err)) != DDT_OK) return st;
    LNAME("self_attn.kv_b_proj");
    if ((st = load_linear(t, b, (int64_t)t->dims.heads * (t->dims.nope + t->dims.vdim), t->dims.rank, &L->kv_b, err)) != DDT_OK)
        return st;
    LNAME("self_attn.o_proj");
    if ((st = load_linear(t, b, t->dims.hidden, (int64_t)t->dims.heads * t->dims.vdim, &L->o_proj, err)) != DDT_OK) return st;

    L->moe = ddt_config_layer_is_moe(c, l);
    if (!L->moe) {
        LNAME("mlp");
        return load_mlp(t, b, c->intermediate_size, &L->mlp, err);
    }
    LNAME("mlp.gate");
    if ((st = load_linear(t, b, t->dims.n_experts, t->dims.hidden, &L->router, err)) != DDT_OK) return st;
    /* noaux_tc (the only method accepted) chooses with the correction bias */
    LNAME("mlp.gate.e_score_correction_bias");
    if ((st = load_vec(t, b, t->dims.n_experts, &L->router_bias, err)) != DDT_OK) return st;
    L->experts = ddt_calloc_array((size_t)t->dims.n_experts, sizeof *L->experts);
    if (!L->experts) return ddt_fail(err, DDT_ERR_NOMEM, "layer %d: out of memory for expert views", l);
    uint64_t before = t->weight_bytes;
    if ((st = load_experts(t, l, L->experts, err)) != DDT_OK) return st;
    t->routed_bytes += t->weight_bytes - before;
    L->has_shared = c->n_shared_experts > 0;
    if (L->has_shared) {
        LNAME("mlp.shared_experts");
        if ((st = load_mlp(t, b, (int64_t)c->moe_intermediate_size * c->n_shared_experts, &L->shared, err)) != DDT_OK)
            return st;
    }
#undef LNAME
    return DDT_OK;
}

/* Dimensions and limits the forward relies on; the config reader checked the rest. */
static ddt_status check_config(const ddt_model_config *c, const char *dir, ddt_error *err) {
    if (c->hidden_size <= 0 || c->num_hidden_layers <= 0 || c->num_attention_heads <= 0 || c->kv_lora_rank <= 0 ||
        c->qk_nope_head_dim <= 0 || c->qk_rope_head_dim <= 0 || c->v_head_dim <= 0 || c->vocab_size <= 0 ||
        c->q_lora_rank < 0)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s/config.json: a model dimension is not positive", dir);
    if (c->qk_rope_head_dim % 2 != 0 || c->qk_rope_head_dim > DDT_ROPE_MAX_DIM)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s/config.json: qk_rope_head_dim %d must be even and <= %d", dir,
                        c->qk_rope_head_dim, DDT_ROPE_MAX_DIM);
    bool any_moe = false, any_dense = false;
    for (int32_t l = 0; l < c->num_hidden_layers; l++) {
        bool moe = ddt_config_layer_is_moe(c, l);
        any_moe |= moe;
        any_dense |= !moe;
    }
    if (any_dense && c->intermediate_size <= 0)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s/config.json: intermediate_size %d", dir, c->intermediate_size);
    if (!any_moe) return DDT_OK;
    if (c->n_routed_experts <= 0 || c->n_routed_experts > DDT_MOE_MAX_EXPERTS)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s/config.json: n_routed_experts %d (1..%d supported)", dir,
                        c->n_routed_experts, DDT_MOE_MAX_EXPERTS);
    int32_t ng = c->n_group > 0 ? c->n_group : 1, kg = c->topk_group > 0 ? c->topk_group : 1;
    if (c->n_routed_experts % ng != 0 || kg > ng)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s/config.json: n_group %d / topk_group %d do not fit %d experts", dir,
                        c->n_group, c->topk_group, c->n_routed_experts);
    if (c->num_experts_per_tok <= 0 || c->num_experts_per_tok > (c->n_routed_experts / ng) * kg)
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "%s/config.json: num_experts_per_tok %d exceeds the experts of %d kept groups", dir,
                        c->num_experts_per_tok, kg);
    /* HF always routes with sigmoid + noaux_tc whatever the config says; reject a
     * config that asks for something else rather than silently run noaux_tc. */
    if (strcmp(c->topk_method, "noaux_tc") != 0 || strcmp(c->scoring_func, "sigmoid") != 0)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "%s/config.json: topk_method \"%s\" with scoring_func \"%s\": only noaux_tc with sigmoid is supported",
                        dir, c->topk_method, c->scoring_func);
    if (c->moe_intermediate_size <= 0 || c->n_shared_experts < 0 ||
        (int64_t)c->moe_intermediate_size * c->n_shared_experts > INT32_MAX)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s/config.json: moe_intermediate_size %d, n_shared_experts %d", dir,
                        c->moe_intermediate_size, c->n_shared_experts);
    return DDT_OK;
}

ddt_moe_route_params ddt_target_route_params(const ddt_model_config *c, const ddt_target_dims *d) {
    return (ddt_moe_route_params){.n_experts = d->n_experts, .top_k = d->top_k,
                                  .n_group = c->n_group > 0 ? c->n_group : 1,
                                  .topk_group = c->topk_group > 0 ? c->topk_group : 1,
                                  .norm_topk_prob = c->norm_topk_prob,
                                  .routed_scaling_factor = c->routed_scaling_factor, .bias = NULL};
}

ddt_rope_params ddt_target_rope_params(const ddt_model_config *c) {
    return (ddt_rope_params){.dim = c->qk_rope_head_dim, .theta = c->rope_theta, .yarn = c->has_yarn,
                             .factor = c->yarn_factor, .original_max_position = c->yarn_original_max_position,
                             .beta_fast = c->yarn_beta_fast, .beta_slow = c->yarn_beta_slow,
                             .mscale = c->yarn_mscale, .mscale_all_dim = c->yarn_mscale_all_dim};
}

ddt_status ddt_target_rope_table(const ddt_model_config *c, int32_t pos0, int32_t n, float *cos_out,
                                 float *sin_out, ddt_error *err) {
    const int32_t half = c->qk_rope_head_dim / 2;
    if (c->qk_rope_head_dim % 2 != 0 || c->qk_rope_head_dim > DDT_ROPE_MAX_DIM || half < 1)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "qk_rope_head_dim %d must be even, 2..%d", c->qk_rope_head_dim,
                        DDT_ROPE_MAX_DIM);
    float inv_freq[DDT_ROPE_MAX_DIM / 2], attn;
    ddt_rope_params rp = ddt_target_rope_params(c);
    ddt_cpu_rope_freqs(&rp, inv_freq, &attn);
    for (int32_t i = 0; i < n; i++)
        ddt_cpu_rope_cos_sin(inv_freq, half, (int64_t)pos0 + i, attn, cos_out + (size_t)i * half,
                             sin_out + (size_t)i * half);
    return DDT_OK;
}


ddt_status ddt_target_capture_check(const int32_t *capture_layers, int32_t n_capture, ddt_error *err) {
    if (n_capture < 0 || n_capture > DDT_TARGET_MAX_CAPTURE || (n_capture > 0 && !capture_layers))
        return ddt_fail(err, DDT_ERR_INVALID, "target options: %d capture layers (at most %d)", n_capture,
                        DDT_TARGET_MAX_CAPTURE);
    return DDT_OK;
}

ddt_status ddt_target_desc_load(const char *dir, const int32_t *capture_layers, int32_t n_capture,
                                ddt_target_desc *t, ddt_error *err) {
    memset(t, 0, sizeof *t);
    ddt_status st = ddt_config_load(dir, &t->cfg, err);
    if (st != DDT_OK) return st;
    const ddt_model_config *c = &t->cfg;
    if ((st = check_config(c, dir, err)) != DDT_OK) return st;
    for (int32_t i = 0; i < n_capture; i++)
        if (capture_layers[i] < 0 || capture_layers[i] >= c->num_hidden_layers)
            return ddt_fail(err, DDT_ERR_INVALID, "target options: capture layer %d outside 0..%d", capture_layers[i],
                            c->num_hidden_layers - 1);
    ddt_target_dims_fill(c, &t->dims);
    if ((st = ddt_checkpoint_open(dir, &t->ck, err)) != DDT_OK) return st;
    if ((st = load_linear(t, "model.embed_tokens", t->dims.vocab, t->dims.hidden, &t->embed, err)) != DDT_OK) return st;
    t->embed_bytes = t->weight_bytes;
    if ((st = load_vec(t, "model.norm.weight", t->dims.hidden, &t->final_norm, err)) != DDT_OK) return st;
    if (c->tie_word_embeddings) {
        t->lm_head = t->embed;
    } else if ((st = load_linear(t, "lm_head", t->dims.vocab, t->dims.hidden, &t->lm_head, err)) != DDT_OK) {
        return st;
    }
    t->layers = ddt_calloc_array((size_t)t->dims.n_layers, sizeof *t->layers);
    if (!t->layers) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    for (int32_t l = 0; l < t->dims.n_layers; l++)
        if ((st = load_layer(t, l, err)) != DDT_OK) return st;
    return DDT_OK;
}

void ddt_target_desc_free(ddt_target_desc *t) {
    if (!t) return;
    if (t->layers)
        for (int32_t l = 0; l < t->dims.n_layers; l++) free(t->layers[l].experts);
    free(t->layers);
    ddt_checkpoint_close(t->ck);
    ddt_config_free(&t->cfg);
    memset(t, 0, sizeof *t);
}
