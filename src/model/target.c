/*
 * target.c — DeepSeek-V3 / Kimi K2.x target on the CPU backend (see target.h):
 * config -> borrowed weight views -> run state -> forward (prefill, tree
 * verify), commit and rollback of the latent cache.
 *
 * Per layer and token (HF DeepseekV3DecoderLayer):
 *   h  = rmsnorm(x, input_layernorm)
 *   q  = q_b(rmsnorm(q_a(h), q_a_layernorm, 1e-6))  or q_proj(h)  -> [heads][nope | rope]
 *   kv = kv_a_proj_with_mqa(h) -> c = rmsnorm(kv[:rank], kv_a_layernorm, 1e-6), k_rope = rope(kv[rank:])
 *   attention in the absorbed form: q_lat = q_nope W_UK (per head), MLA over (c, k_rope),
 *   out = W_UV(out_lat) per head, x += o_proj(out)
 *   x += mlp(rmsnorm(x, post_attention_layernorm))   (dense SiLU MLP, or MoE + shared experts)
 * then logits = lm_head(rmsnorm(x, norm)).
 * The latent norms use eps 1e-6 whatever rms_norm_eps says: HF (and DeepSeek's
 * reference code) build them with the default eps.
 */
#include "model/target.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/mla.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/nn.h"
#include "backend/cpu/pool.h"
#include "backend/cpu/qmatmul.h"
#include "backend/cpu/rope.h"
#include "core/alloc.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/target_desc.h"

#define LATENT_NORM_EPS 1e-6f
#define NAME_MAX_LEN 512

/* ------------------------------------------------------------------ weights */

/* ------------------------------------------------------------------ model */

struct ddt_target {
    ddt_model_config cfg;
    ddt_checkpoint *ck;
    ddt_cpu_pool *pool;
    int32_t max_ctx, max_tokens;

    ddt_target_dims dims;    /* target_desc.h */
    float rope_attn;

    ddt_qweight embed;       /* [vocab][hidden] */
    ddt_cpu_vec final_norm;  /* [hidden] */
    ddt_qweight lm_head;     /* [vocab][hidden] (the embedding when tied) */
    ddt_target_layer *layers;         /* [n_layers] */
    float *inv_freq;         /* [rope/2] */
    uint64_t weight_bytes;   /* every weight the model reads */
    uint64_t routed_bytes;   /* of which routed experts */
    uint64_t embed_bytes;    /* of which the embedding table */
    int32_t expert_layout;   /* expert_layout of the MoE layers loaded so far */
    int32_t expert_layout_layer; /* the last of them, for messages */
    uint64_t state_bytes;    /* run state + latent cache */
    ddt_moe_route_params route;

    ddt_kv_cache kv;

    /* run state, T = max_tokens */
    float *x;        /* [T][hidden] residual stream */
    float *xn;       /* [T][hidden] normed input of a block */
    float *qa;       /* [T][q_lora] */
    float *q;        /* [T][heads][nope+rope] */
    float *kva;      /* [T][rank+rope] */
    float *q_lat;    /* [T][heads][rank] */
    float *o_lat;    /* [T][heads][rank] */
    float *o_v;      /* [T][heads*v] */
    float *tmp;      /* [T][hidden] block output */
    float *acc;      /* [T][hidden] routed-expert sum */
    float *gx;       /* [T][hidden] tokens gathered for one expert */
    float *g, *u;    /* [T][inter_max] */
    float *cosv;     /* [T][rope/2] */
    float *sinv;     /* [T][rope/2] */
    float *rlogits;  /* [T][experts] */
    int32_t *ridx;   /* [T][top_k] */
    float *rw;       /* [T][top_k] */
    int32_t *ecount; /* [experts + 1] prefix offsets */
    int32_t *etok;   /* [T*top_k] token of each (expert, slot) entry, grouped by expert */
    float *ewt;      /* [T*top_k] its weight */
    int32_t *pos;    /* [T] positions of the current forward */

    int32_t n_capture;
    int32_t capture_layer[DDT_TARGET_MAX_CAPTURE];
    float *capture;  /* [n_capture][T][hidden] */
    int32_t n_last;  /* tokens of the last forward, 0 = none */

    /* the last verify, for commit */
    bool verify_valid;
    int32_t vis_words;
    int32_t *last_depth; /* [T] */
    uint64_t *last_vis;  /* [T][vis_words_max] */
    int32_t vis_words_max;
};

/* ------------------------------------------------------------------ loading */

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
static ddt_status account_linear(ddt_target *t, const char *name, const ddt_qweight *w, ddt_error *err) {
    if (w->format == DDT_Q_FP8_BLOCK && w->block <= 0)
        return ddt_fail(err, DDT_ERR_FORMAT, "tensor %s: FP8 block size %d", name, w->block);
    if (w->format == DDT_Q_INT4_GROUP && (w->group <= 0 || w->cols % 8 != 0 || w->cols % w->group != 0))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "tensor %s: INT4 group %d with %lld columns", name, w->group,
                        (long long)w->cols);
    t->weight_bytes += qweight_bytes(w);
    return DDT_OK;
}

static ddt_status load_linear(ddt_target *t, const char *base, int64_t rows, int64_t cols, ddt_qweight *w,
                              ddt_error *err) {
    char name[NAME_MAX_LEN];
    int k = snprintf(name, sizeof name, "%s%s", t->cfg.tensor_prefix, base);
    if (k < 0 || (size_t)k >= sizeof name) return ddt_fail(err, DDT_ERR_RANGE, "tensor name too long: %s", base);
    ddt_status st = ddt_checkpoint_weight(t->ck, name, rows, cols, w, err);
    if (st != DDT_OK) return st;
    return account_linear(t, name, w, err);
}

/* A 1-D float vector of n values (norm weights, router bias). */
static ddt_status load_vec(ddt_target *t, const char *base, int64_t n, ddt_cpu_vec *v, ddt_error *err) {
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

static ddt_status load_mlp(ddt_target *t, const char *pre, int64_t inter, ddt_target_mlp *m, ddt_error *err) {
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
static ddt_status classify_experts(ddt_target *t, int32_t l, expert_layout *kind, ddt_error *err) {
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
static ddt_status load_fused_experts(ddt_target *t, int32_t l, ddt_target_mlp *experts, ddt_error *err) {
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
        ddt_target_mlp *m = &experts[e];
        if ((st = ddt_qweight_stack_view(&gu, e, 0, I, &m->gate, err)) != DDT_OK) return st;
        if ((st = account_linear(t, gname, &m->gate, err)) != DDT_OK) return st;
        if ((st = ddt_qweight_stack_view(&gu, e, I, I, &m->up, err)) != DDT_OK) return st;
        if ((st = account_linear(t, gname, &m->up, err)) != DDT_OK) return st;
        if ((st = ddt_qweight_stack_view(&dn, e, 0, H, &m->down, err)) != DDT_OK) return st;
        if ((st = account_linear(t, dname, &m->down, err)) != DDT_OK) return st;
    }
    return DDT_OK;
}

static ddt_status load_experts(ddt_target *t, int32_t l, ddt_target_mlp *experts, ddt_error *err) {
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

static ddt_status load_layer(ddt_target *t, int32_t l, ddt_error *err) {
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

static ddt_rope_params rope_params(const ddt_model_config *c) {
    return (ddt_rope_params){.dim = c->qk_rope_head_dim, .theta = c->rope_theta, .yarn = c->has_yarn,
                             .factor = c->yarn_factor, .original_max_position = c->yarn_original_max_position,
                             .beta_fast = c->yarn_beta_fast, .beta_slow = c->yarn_beta_slow,
                             .mscale = c->yarn_mscale, .mscale_all_dim = c->yarn_mscale_all_dim};
}

/* Allocate one run-state array of n x sz; records NOMEM via *ok. */
static void *state_alloc(ddt_target *t, size_t n, size_t sz, bool *ok) {
    void *p = ddt_calloc_array(n ? n : 1, sz);
    if (!p) *ok = false;
    else t->state_bytes += (uint64_t)(n ? n : 1) * sz;
    return p;
}

static ddt_status alloc_state(ddt_target *t, ddt_error *err) {
    ddt_status st;
    size_t T = (size_t)t->max_tokens;
    size_t th, tq, tl, ti;
    if (!ddt_mul_size(T, (size_t)t->dims.hidden, &th) ||
        !ddt_mul_size(T, (size_t)t->dims.heads * (size_t)t->dims.qdim, &tq) ||
        !ddt_mul_size(T, (size_t)t->dims.heads * (size_t)t->dims.rank, &tl) ||
        !ddt_mul_size(T, (size_t)t->dims.inter_max, &ti))
        return ddt_fail(err, DDT_ERR_RANGE, "run state for %d tokens per forward overflows", t->max_tokens);
    bool ok = true;
    t->x = state_alloc(t, th, sizeof(float), &ok);
    t->xn = state_alloc(t, th, sizeof(float), &ok);
    t->tmp = state_alloc(t, th, sizeof(float), &ok);
    t->acc = state_alloc(t, th, sizeof(float), &ok);
    t->gx = state_alloc(t, th, sizeof(float), &ok);
    t->qa = state_alloc(t, T * (size_t)(t->dims.q_lora > 0 ? t->dims.q_lora : 1), sizeof(float), &ok);
    t->q = state_alloc(t, tq, sizeof(float), &ok);
    t->kva = state_alloc(t, T * (size_t)(t->dims.rank + t->dims.rope), sizeof(float), &ok);
    t->q_lat = state_alloc(t, tl, sizeof(float), &ok);
    t->o_lat = state_alloc(t, tl, sizeof(float), &ok);
    t->o_v = state_alloc(t, T * (size_t)t->dims.heads * (size_t)t->dims.vdim, sizeof(float), &ok);
    t->g = state_alloc(t, ti, sizeof(float), &ok);
    t->u = state_alloc(t, ti, sizeof(float), &ok);
    t->cosv = state_alloc(t, T * (size_t)(t->dims.rope / 2), sizeof(float), &ok);
    t->sinv = state_alloc(t, T * (size_t)(t->dims.rope / 2), sizeof(float), &ok);
    t->pos = state_alloc(t, T, sizeof(int32_t), &ok);
    t->inv_freq = state_alloc(t, (size_t)(t->dims.rope / 2), sizeof(float), &ok);
    if (t->dims.n_experts > 0) {
        t->rlogits = state_alloc(t, T * (size_t)t->dims.n_experts, sizeof(float), &ok);
        t->ridx = state_alloc(t, T * (size_t)t->dims.top_k, sizeof(int32_t), &ok);
        t->rw = state_alloc(t, T * (size_t)t->dims.top_k, sizeof(float), &ok);
        t->ecount = state_alloc(t, (size_t)t->dims.n_experts + 1, sizeof(int32_t), &ok);
        t->etok = state_alloc(t, T * (size_t)t->dims.top_k, sizeof(int32_t), &ok);
        t->ewt = state_alloc(t, T * (size_t)t->dims.top_k, sizeof(float), &ok);
    }
    if (t->n_capture > 0) {
        size_t cap;
        if (!ddt_mul_size(th, (size_t)t->n_capture, &cap))
            return ddt_fail(err, DDT_ERR_RANGE, "hidden-state capture overflows");
        t->capture = state_alloc(t, cap, sizeof(float), &ok);
    }
    t->vis_words_max = (t->max_tokens + 63) / 64;
    t->last_depth = state_alloc(t, T, sizeof(int32_t), &ok);
    t->last_vis = state_alloc(t, T * (size_t)t->vis_words_max, sizeof(uint64_t), &ok);
    if (!ok) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory for the run state (%d tokens)", t->max_tokens);
    st = ddt_kv_cache_alloc(t->dims.n_layers, t->dims.rank + t->dims.rope, t->max_ctx, &t->kv, err);
    if (st == DDT_OK)
        t->state_bytes += (uint64_t)t->kv.n_layers * (uint64_t)t->kv.capacity * (uint64_t)t->kv.width * sizeof(float);
    return st;
}

ddt_status ddt_target_load(const char *dir, const ddt_target_options *opts, ddt_target **out, ddt_error *err) {
    if (!dir || !opts || !out) return ddt_fail(err, DDT_ERR_INVALID, "ddt_target_load: NULL argument");
    *out = NULL;
    if (opts->max_ctx < 1 || opts->max_tokens < 1)
        return ddt_fail(err, DDT_ERR_INVALID, "target options: max_ctx %d and max_tokens %d must be >= 1",
                        opts->max_ctx, opts->max_tokens);
    if (opts->n_capture < 0 || opts->n_capture > DDT_TARGET_MAX_CAPTURE || (opts->n_capture > 0 && !opts->capture_layers))
        return ddt_fail(err, DDT_ERR_INVALID, "target options: %d capture layers (at most %d)", opts->n_capture,
                        DDT_TARGET_MAX_CAPTURE);
    ddt_target *t = calloc(1, sizeof *t);
    if (!t) return ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
    ddt_status st = ddt_config_load(dir, &t->cfg, err);
    if (st != DDT_OK) goto fail;
    const ddt_model_config *c = &t->cfg;
    if ((st = check_config(c, dir, err)) != DDT_OK) goto fail;
    for (int32_t i = 0; i < opts->n_capture; i++) {
        if (opts->capture_layers[i] < 0 || opts->capture_layers[i] >= c->num_hidden_layers) {
            st = ddt_fail(err, DDT_ERR_INVALID, "target options: capture layer %d outside 0..%d",
                          opts->capture_layers[i], c->num_hidden_layers - 1);
            goto fail;
        }
        t->capture_layer[i] = opts->capture_layers[i];
    }
    t->n_capture = opts->n_capture;
    t->max_ctx = opts->max_ctx;
    t->max_tokens = opts->max_tokens;
    ddt_target_dims_fill(c, &t->dims);

    if ((st = ddt_checkpoint_open(dir, &t->ck, err)) != DDT_OK) goto fail;
    if ((st = load_linear(t, "model.embed_tokens", t->dims.vocab, t->dims.hidden, &t->embed, err)) != DDT_OK) goto fail;
    t->embed_bytes = t->weight_bytes;
    if ((st = load_vec(t, "model.norm.weight", t->dims.hidden, &t->final_norm, err)) != DDT_OK) goto fail;
    if (c->tie_word_embeddings) {
        t->lm_head = t->embed;
    } else if ((st = load_linear(t, "lm_head", t->dims.vocab, t->dims.hidden, &t->lm_head, err)) != DDT_OK) {
        goto fail;
    }
    t->layers = ddt_calloc_array((size_t)t->dims.n_layers, sizeof *t->layers);
    if (!t->layers) {
        st = ddt_fail(err, DDT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int32_t l = 0; l < t->dims.n_layers; l++)
        if ((st = load_layer(t, l, err)) != DDT_OK) goto fail;

    t->route = (ddt_moe_route_params){.n_experts = t->dims.n_experts, .top_k = t->dims.top_k,
                                      .n_group = c->n_group > 0 ? c->n_group : 1,
                                      .topk_group = c->topk_group > 0 ? c->topk_group : 1,
                                      .norm_topk_prob = c->norm_topk_prob,
                                      .routed_scaling_factor = c->routed_scaling_factor, .bias = NULL};
    if ((st = alloc_state(t, err)) != DDT_OK) goto fail;
    ddt_rope_params rp = rope_params(c);
    ddt_cpu_rope_freqs(&rp, t->inv_freq, &t->rope_attn);
    if ((st = ddt_cpu_pool_create(opts->n_threads, &t->pool, err)) != DDT_OK) goto fail;
    *out = t;
    return DDT_OK;
fail:
    ddt_error_prefix(err, "model %s: ", dir);
    ddt_target_free(t);
    return st;
}

void ddt_target_free(ddt_target *t) {
    if (!t) return;
    ddt_cpu_pool_destroy(t->pool);
    if (t->layers)
        for (int32_t l = 0; l < t->dims.n_layers; l++) free(t->layers[l].experts);
    free(t->layers);
    ddt_kv_cache_free(&t->kv);
    void *bufs[] = {t->x, t->xn, t->qa, t->q, t->kva, t->q_lat, t->o_lat, t->o_v, t->tmp, t->acc, t->gx,
                    t->g, t->u, t->cosv, t->sinv, t->rlogits, t->ridx, t->rw, t->ecount, t->etok, t->ewt,
                    t->pos, t->capture, t->last_depth, t->last_vis, t->inv_freq};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    ddt_checkpoint_close(t->ck);
    ddt_config_free(&t->cfg);
    free(t);
}

const ddt_model_config *ddt_target_config(const ddt_target *t) { return &t->cfg; }
int32_t ddt_target_vocab(const ddt_target *t) { return t->dims.vocab; }
int32_t ddt_target_len(const ddt_target *t) { return t->kv.len; }
int32_t ddt_target_max_ctx(const ddt_target *t) { return t->max_ctx; }
int32_t ddt_target_max_tokens(const ddt_target *t) { return t->max_tokens; }
int32_t ddt_target_threads(const ddt_target *t) { return ddt_cpu_pool_threads(t->pool); }
const ddt_qweight *ddt_target_embed(const ddt_target *t) { return &t->embed; }
const ddt_target_layer *ddt_target_layer_at(const ddt_target *t, int32_t l) {
    return l >= 0 && l < t->dims.n_layers ? &t->layers[l] : NULL;
}
const ddt_cpu_vec *ddt_target_final_norm(const ddt_target *t) { return &t->final_norm; }
ddt_status ddt_target_rope_table(const ddt_model_config *c, int32_t pos0, int32_t n, float *cos_out,
                                 float *sin_out, ddt_error *err) {
    const int32_t half = c->qk_rope_head_dim / 2;
    if (c->qk_rope_head_dim % 2 != 0 || c->qk_rope_head_dim > DDT_ROPE_MAX_DIM || half < 1)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "qk_rope_head_dim %d must be even, 2..%d", c->qk_rope_head_dim,
                        DDT_ROPE_MAX_DIM);
    float inv_freq[DDT_ROPE_MAX_DIM / 2], attn;
    ddt_rope_params rp = rope_params(c);
    ddt_cpu_rope_freqs(&rp, inv_freq, &attn);
    for (int32_t i = 0; i < n; i++)
        ddt_cpu_rope_cos_sin(inv_freq, half, (int64_t)pos0 + i, attn, cos_out + (size_t)i * half,
                             sin_out + (size_t)i * half);
    return DDT_OK;
}

const ddt_qweight *ddt_target_lm_head(const ddt_target *t) { return &t->lm_head; }
ddt_cpu_pool *ddt_target_pool(ddt_target *t) { return t->pool; }
const ddt_kv_cache *ddt_target_cache(const ddt_target *t) { return &t->kv; }
uint64_t ddt_target_weight_bytes(const ddt_target *t) { return t->weight_bytes; }
uint64_t ddt_target_decode_bytes(const ddt_target *t) {
    uint64_t b = t->weight_bytes;
    /* an untied embedding table is read one row per token */
    if (!t->cfg.tie_word_embeddings) b = b - t->embed_bytes + t->embed_bytes / (uint64_t)t->dims.vocab;
    /* routed experts are equal in size: a token reads top_k of n_experts per layer */
    if (t->dims.n_experts > 0)
        b = b - t->routed_bytes + t->routed_bytes / (uint64_t)t->dims.n_experts * (uint64_t)t->dims.top_k;
    return b;
}
uint64_t ddt_target_state_bytes(const ddt_target *t) { return t->state_bytes; }

const float *ddt_target_hidden(const ddt_target *t, int32_t slot, int32_t *n_tokens) {
    if (n_tokens) *n_tokens = t->n_last;
    if (slot < 0 || slot >= t->n_capture || t->n_last == 0) return NULL;
    return t->capture + (size_t)slot * (size_t)t->max_tokens * (size_t)t->dims.hidden;
}

/* ------------------------------------------------------------------ forward */

/* out[n][hidden] = down(silu(gate(in)) * up(in)) for n rows of in [n][hidden]. */
static void mlp_forward(ddt_target *t, const ddt_target_mlp *m, const float *in, int64_t n, float *out) {
    int64_t inter = m->gate.rows;
    ddt_cpu_matmul(t->pool, &m->gate, in, t->dims.hidden, n, t->g, inter);
    ddt_cpu_matmul(t->pool, &m->up, in, t->dims.hidden, n, t->u, inter);
    ddt_cpu_silu_mul(t->pool, t->g, inter, t->u, inter, n, inter);
    ddt_cpu_matmul(t->pool, &m->down, t->g, inter, n, out, t->dims.hidden);
}

/* MoE block on t->xn [n][hidden] -> t->tmp [n][hidden]. */
static void moe_forward(ddt_target *t, const ddt_target_layer *L, int32_t n) {
    const int32_t H = t->dims.hidden, E = t->dims.n_experts, K = t->dims.top_k;
    ddt_cpu_matmul(t->pool, &L->router, t->xn, H, n, t->rlogits, E);
    ddt_moe_route_params rp = t->route;
    rp.bias = &L->router_bias;
    ddt_cpu_moe_route(t->rlogits, E, n, &rp, t->ridx, t->rw);
    /* Bucket (token, weight) entries by expert, tokens in increasing order. */
    memset(t->ecount, 0, sizeof(int32_t) * ((size_t)E + 1));
    for (int32_t i = 0; i < n * K; i++) t->ecount[t->ridx[i] + 1]++;
    for (int32_t e = 0; e < E; e++) t->ecount[e + 1] += t->ecount[e];
    /* place entries at ecount[e]++ (which ends at the next expert's start), then shift back */
    for (int32_t i = 0; i < n * K; i++) {
        int32_t slot = t->ecount[t->ridx[i]]++;
        t->etok[slot] = i / K;
        t->ewt[slot] = t->rw[i];
    }
    for (int32_t e = E; e > 0; e--) t->ecount[e] = t->ecount[e - 1];
    t->ecount[0] = 0;
    memset(t->acc, 0, sizeof(float) * (size_t)n * H);
    /* Experts in increasing index order, as HF accumulates them. */
    for (int32_t e = 0; e < E; e++) {
        int32_t b = t->ecount[e], m = t->ecount[e + 1] - b;
        if (m == 0) continue;
        for (int32_t j = 0; j < m; j++)
            memcpy(t->gx + (size_t)j * H, t->xn + (size_t)t->etok[b + j] * H, sizeof(float) * H);
        mlp_forward(t, &L->experts[e], t->gx, m, t->tmp);
        for (int32_t j = 0; j < m; j++) {
            float w = t->ewt[b + j];
            float *dst = t->acc + (size_t)t->etok[b + j] * H;
            const float *src = t->tmp + (size_t)j * H;
            for (int32_t d = 0; d < H; d++) dst[d] += w * src[d];
        }
    }
    if (L->has_shared) {
        mlp_forward(t, &L->shared, t->xn, n, t->tmp);
        for (size_t i = 0; i < (size_t)n * H; i++) t->tmp[i] = t->acc[i] + t->tmp[i];
    } else {
        memcpy(t->tmp, t->acc, sizeof(float) * (size_t)n * H);
    }
}

static void capture_store(ddt_target *t, int32_t layer, const float *src, int32_t n) {
    for (int32_t s = 0; s < t->n_capture; s++)
        if (t->capture_layer[s] == layer)
            memcpy(t->capture + (size_t)s * t->max_tokens * t->dims.hidden, src, sizeof(float) * (size_t)n * t->dims.hidden);
}

/*
 * One forward over n tokens whose positions are in t->pos; their cache rows are
 * len..len+n-1; vis NULL = causal.  Leaves the final-normed states in t->xn and
 * writes logits for rows [logit_row0, n) when logits is not NULL.
 */
static void forward(ddt_target *t, const int32_t *ids, int32_t n, const uint64_t *vis, int32_t vis_words,
                    float *logits, int32_t logit_row0) {
    const int32_t H = t->dims.hidden, heads = t->dims.heads, nope = t->dims.nope, rope = t->dims.rope, rank = t->dims.rank;
    const int32_t half = rope / 2, qd = t->dims.qdim, len = t->kv.len;
    for (int32_t i = 0; i < n; i++) {
        ddt_cpu_dequant(&t->embed, ids[i], 0, H, t->x + (size_t)i * H);
        ddt_cpu_rope_cos_sin(t->inv_freq, half, t->pos[i], t->rope_attn, t->cosv + (size_t)i * half,
                             t->sinv + (size_t)i * half);
    }
    for (int32_t l = 0; l < t->dims.n_layers; l++) {
        const ddt_target_layer *L = &t->layers[l];
        ddt_cpu_rmsnorm(t->pool, t->x, H, n, H, &L->attn_norm, t->dims.eps, t->xn, H);
        /* queries [n][heads][nope | rope] */
        if (t->dims.q_lora > 0) {
            ddt_cpu_matmul(t->pool, &L->q_a, t->xn, H, n, t->qa, t->dims.q_lora);
            ddt_cpu_rmsnorm(t->pool, t->qa, t->dims.q_lora, n, t->dims.q_lora, &L->q_a_norm, LATENT_NORM_EPS, t->qa, t->dims.q_lora);
            ddt_cpu_matmul(t->pool, &L->q_b, t->qa, t->dims.q_lora, n, t->q, (int64_t)heads * qd);
        } else {
            ddt_cpu_matmul(t->pool, &L->q_proj, t->xn, H, n, t->q, (int64_t)heads * qd);
        }
        /* latent KV of the new tokens straight into their cache rows */
        ddt_cpu_matmul(t->pool, &L->kv_a, t->xn, H, n, t->kva, rank + rope);
        float *rows = ddt_kv_cache_row(&t->kv, l, len);
        const int64_t kw = t->kv.width;
        ddt_cpu_rmsnorm(t->pool, t->kva, rank + rope, n, rank, &L->kv_a_norm, LATENT_NORM_EPS, rows, kw);
        for (int32_t i = 0; i < n; i++) {
            const float *cs = t->cosv + (size_t)i * half, *sn = t->sinv + (size_t)i * half;
            float *kr = rows + i * kw + rank;
            memcpy(kr, t->kva + (size_t)i * (rank + rope) + rank, sizeof(float) * rope);
            ddt_cpu_rope_rotate(kr, rope, t->cfg.rope_interleave, cs, sn);
            for (int32_t h = 0; h < heads; h++)
                ddt_cpu_rope_rotate(t->q + ((size_t)i * heads + h) * qd + nope, rope, t->cfg.rope_interleave, cs, sn);
        }
        /* absorbed attention */
        ddt_cpu_groups uk = {.count = heads, .w_row_stride = nope + t->dims.vdim, .w_row_offset = 0, .rows = nope,
                             .x_stride = qd, .y_stride = rank};
        ddt_cpu_matmul_t_grouped(t->pool, &L->kv_b, &uk, t->q, (int64_t)heads * qd, n, t->q_lat,
                                 (int64_t)heads * rank);
        ddt_mla_attn a = {.n = n, .n_heads = heads, .rank = rank, .rope_dim = rope, .q_lat = t->q_lat,
                          .q_lat_ld_t = (int64_t)heads * rank, .q_lat_ld_h = rank, .q_rope = t->q + nope,
                          .q_rope_ld_t = (int64_t)heads * qd, .q_rope_ld_h = qd,
                          .kv = ddt_kv_cache_row(&t->kv, l, 0), .kv_ld = kw, .n_prefix = len, .vis = vis,
                          .vis_words = vis_words, .scale = t->dims.softmax_scale, .out = t->o_lat,
                          .out_ld_t = (int64_t)heads * rank, .out_ld_h = rank};
        ddt_cpu_mla_attention(t->pool, &a);
        ddt_cpu_groups uv = {.count = heads, .w_row_stride = nope + t->dims.vdim, .w_row_offset = nope, .rows = t->dims.vdim,
                             .x_stride = rank, .y_stride = t->dims.vdim};
        ddt_cpu_matmul_grouped(t->pool, &L->kv_b, &uv, t->o_lat, (int64_t)heads * rank, n, t->o_v,
                               (int64_t)heads * t->dims.vdim);
        ddt_cpu_matmul(t->pool, &L->o_proj, t->o_v, (int64_t)heads * t->dims.vdim, n, t->tmp, H);
        for (size_t i = 0; i < (size_t)n * H; i++) t->x[i] = t->x[i] + t->tmp[i];
        /* MLP */
        ddt_cpu_rmsnorm(t->pool, t->x, H, n, H, &L->mlp_norm, t->dims.eps, t->xn, H);
        if (L->moe) moe_forward(t, L, n);
        else mlp_forward(t, &L->mlp, t->xn, n, t->tmp);
        for (size_t i = 0; i < (size_t)n * H; i++) t->x[i] = t->x[i] + t->tmp[i];
        if (l < t->dims.n_layers - 1) capture_store(t, l, t->x, n);
    }
    ddt_cpu_rmsnorm(t->pool, t->x, H, n, H, &t->final_norm, t->dims.eps, t->xn, H);
    capture_store(t, t->dims.n_layers - 1, t->xn, n); /* HF hidden_states[L] is the normed state */
    t->n_last = n;
    if (logits)
        ddt_cpu_matmul(t->pool, &t->lm_head, t->xn + (size_t)logit_row0 * H, H, n - logit_row0, logits, t->dims.vocab);
}

static ddt_status check_tokens(const ddt_target *t, const int32_t *ids, int32_t n, const char *what,
                               ddt_error *err) {
    if (!ids) return ddt_fail(err, DDT_ERR_INVALID, "%s: NULL token array", what);
    if (n < 1 || n > t->max_tokens)
        return ddt_fail(err, DDT_ERR_RANGE, "%s: %d tokens, allowed 1..%d per forward", what, n, t->max_tokens);
    if ((int64_t)t->kv.len + n > t->max_ctx)
        return ddt_fail(err, DDT_ERR_RANGE, "%s: %d committed + %d new tokens exceed the context of %d", what,
                        t->kv.len, n, t->max_ctx);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->dims.vocab)
            return ddt_fail(err, DDT_ERR_INVALID, "%s: token %d (index %d) outside the vocabulary 0..%d", what, ids[i],
                            i, t->dims.vocab - 1);
    return DDT_OK;
}

ddt_status ddt_target_prefill(ddt_target *t, const int32_t *ids, int32_t n, float *logits, bool all_logits,
                              ddt_error *err) {
    ddt_status st = check_tokens(t, ids, n, "prefill", err);
    if (st != DDT_OK) return st;
    t->verify_valid = false;
    for (int32_t i = 0; i < n; i++) t->pos[i] = t->kv.len + i;
    forward(t, ids, n, NULL, 0, logits, all_logits ? 0 : n - 1);
    t->kv.len += n;
    return DDT_OK;
}

ddt_status ddt_target_verify(ddt_target *t, const int32_t *tokens, const int32_t *depth, const uint64_t *vis,
                             int32_t vis_words, int32_t n, float *logits, ddt_error *err) {
    ddt_status st = check_tokens(t, tokens, n, "verify", err);
    if (st != DDT_OK) return st;
    if (!depth || !vis) return ddt_fail(err, DDT_ERR_INVALID, "verify: NULL depth or visibility");
    if (vis_words < (n + 63) / 64)
        return ddt_fail(err, DDT_ERR_INVALID, "verify: %d visibility words per row cannot hold %d nodes", vis_words, n);
    for (int32_t i = 0; i < n; i++) {
        if (depth[i] < 0 || depth[i] >= n)
            return ddt_fail(err, DDT_ERR_INVALID, "verify: node %d: depth %d outside 0..%d", i, depth[i], n - 1);
        const uint64_t *row = vis + (size_t)i * vis_words;
        if (!((row[i / 64] >> (i % 64)) & 1u))
            return ddt_fail(err, DDT_ERR_INVALID, "verify: node %d does not see itself", i);
        for (int32_t w = 0; w < vis_words; w++) {
            uint64_t beyond = w * 64 >= n ? ~0ull : (n - w * 64 >= 64 ? 0 : ~0ull << (n - w * 64));
            if (row[w] & beyond)
                return ddt_fail(err, DDT_ERR_INVALID, "verify: node %d sees a node beyond the %d nodes", i, n);
        }
    }
    t->verify_valid = false;
    for (int32_t i = 0; i < n; i++) t->pos[i] = t->kv.len + depth[i];
    /* keep the tree for commit, compacted to vis_words_max words per row */
    int32_t keep = t->vis_words_max;
    for (int32_t i = 0; i < n; i++) {
        t->last_depth[i] = depth[i];
        memset(t->last_vis + (size_t)i * keep, 0, sizeof(uint64_t) * keep);
        memcpy(t->last_vis + (size_t)i * keep, vis + (size_t)i * vis_words,
               sizeof(uint64_t) * (size_t)((n + 63) / 64));
    }
    forward(t, tokens, n, t->last_vis, keep, logits, 0);
    t->vis_words = keep;
    t->verify_valid = true;
    return DDT_OK;
}

ddt_status ddt_target_commit(ddt_target *t, const int32_t *path, int32_t m, ddt_error *err) {
    if (!t->verify_valid) return ddt_fail(err, DDT_ERR_INVALID, "commit: no tree verify to commit from");
    int32_t n = t->n_last;
    if (m < 0 || m > n || (m > 0 && !path))
        return ddt_fail(err, DDT_ERR_INVALID, "commit: path of %d nodes for a tree of %d", m, n);
    for (int32_t k = 0; k < m; k++) {
        int32_t v = path[k];
        if (v < 0 || v >= n) return ddt_fail(err, DDT_ERR_INVALID, "commit: path[%d] = %d outside 0..%d", k, v, n - 1);
        if (t->last_depth[v] != k)
            return ddt_fail(err, DDT_ERR_INVALID, "commit: path[%d] = node %d has depth %d, expected %d", k, v,
                            t->last_depth[v], k);
        /* node v must see exactly path[0..k] */
        const uint64_t *row = t->last_vis + (size_t)v * t->vis_words;
        int32_t seen = 0;
        for (int32_t w = 0; w < t->vis_words; w++) seen += __builtin_popcountll(row[w]);
        bool ok = seen == k + 1;
        for (int32_t j = 0; ok && j <= k; j++) ok = (row[path[j] / 64] >> (path[j] % 64)) & 1u;
        if (!ok)
            return ddt_fail(err, DDT_ERR_INVALID,
                            "commit: path[%d] = node %d does not see exactly the path before it: not a root-to-node path",
                            k, v);
    }
    ddt_status st = ddt_kv_cache_commit(&t->kv, path, m, err);
    if (st != DDT_OK) return st;
    t->verify_valid = false;
    return DDT_OK;
}

ddt_status ddt_target_rollback(ddt_target *t, int32_t new_len, ddt_error *err) {
    ddt_status st = ddt_kv_cache_truncate(&t->kv, new_len, err);
    if (st == DDT_OK) t->verify_valid = false;
    return st;
}
