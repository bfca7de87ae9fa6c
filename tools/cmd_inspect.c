/*
 * cmd_inspect.c — `ddtree inspect`: what a target checkpoint is and what each GPU
 * must hold to run it, read from config.json and the safetensors headers alone
 * (no weight is read, no GPU needed): the architecture, the weight formats and
 * bytes by part, the KV cache a position, and for --gpus N each rank's heads,
 * experts and bytes (model/shard.h, the split the CUDA target uploads).  With
 * --gpu-memory it checks each rank against that much free memory the way the CUDA
 * target does before its upload, and says what would fit where it does not.  The
 * question a user with a 590 GB Kimi K2.6 checkpoint asks first: how many GPUs.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_engine.h"
#include "commands.h"
#include "ddtree.h"
#include "model/drafter_desc.h"
#include "model/shard.h"
#include "model/target_desc.h"

#define DEFAULT_CTX 8192 /* generate's default: the model's maximum, at most this (engine.c) */

static const char k_usage[] =
    "usage: ddtree inspect --model DIR [--draft DIR] [--gpus N] [--ctx N] [--fast-attention] [--gpu-memory GIB]\n"
    "                      [--json]\n"
    "\n"
    "What a target checkpoint holds and what each GPU must hold to run it, from config.json and the\n"
    "safetensors headers alone (no weight is read, no GPU is needed).\n"
    "Options:\n"
    "  --model DIR          the target's folder (config.json + safetensors)\n"
    "  --draft DIR          a DFlash drafter for it: its own weights and cache on every GPU (it shares\n"
    "                       the target's embedding and LM head)\n"
    "  --gpus N             split over N GPUs as `generate --gpus N` does (default 1)\n"
    "  --ctx N              context length the KV cache holds (default: the model's maximum, at\n"
    "                       most 8192, as generate)\n"
    "  --fast-attention     a bf16 KV cache (generate --fast-attention) instead of fp32\n"
    "  --gpu-memory GIB     check each GPU's share against this much free memory (GiB), as the\n"
    "                       CUDA backend does before it uploads, and say what would fit\n"
    "  --json               print one JSON object instead of text\n"
    "  --help               this text\n"
    "Weights count as the checkpoint stores them (values + scales); with the KV cache that is a lower\n"
    "bound of a GPU's need (the backend adds workspaces and, with --tensor-cores, repacked copies).\n"
    "Exit status: 0 done (and every GPU fits, with --gpu-memory), 1 a GPU does not fit, 2 bad\n"
    "arguments or model.\n";

typedef struct inspect_args {
    const char *model, *draft;
    long long gpus, ctx;
    bool fast, json, have_mem;
    double mem_gib;
} inspect_args;

static int parse_args(int argc, char **argv, inspect_args *a) {
    a->gpus = 1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(k_usage, stdout);
            return 0;
        }
        if (!strcmp(f, "--json")) {
            a->json = true;
            continue;
        }
        if (!strcmp(f, "--fast-attention")) {
            a->fast = true;
            continue;
        }
        static const char *const valued[] = {"--model", "--draft", "--gpus", "--ctx", "--gpu-memory"};
        const char *v = NULL;
        int has = cli_flag_value("inspect", valued, sizeof valued / sizeof valued[0], argc, argv, &i, &v);
        if (has == 2) return 2;
        if (!has) return cli_usage_error("inspect", "unknown option '%s'", f);
        if (!strcmp(f, "--model")) {
            a->model = v;
        } else if (!strcmp(f, "--draft")) {
            a->draft = v;
        } else if (!strcmp(f, "--gpus")) {
            if (!cli_parse_ll(v, 1, DDT_SHARD_MAX_WORLD, &a->gpus))
                return cli_usage_error("inspect", "--gpus '%s': expected an integer in 1..%d", v, DDT_SHARD_MAX_WORLD);
        } else if (!strcmp(f, "--ctx")) {
            if (!cli_parse_ll(v, 1, INT32_MAX, &a->ctx))
                return cli_usage_error("inspect", "--ctx '%s': expected an integer >= 1", v);
        } else {
            char *end = NULL;
            a->mem_gib = strtod(v, &end);
            if (!end || end == v || *end || !(a->mem_gib > 0) || a->mem_gib > 1e9)
                return cli_usage_error("inspect", "--gpu-memory '%s': expected a positive number of GiB", v);
            a->have_mem = true;
        }
    }
    if (!a->model) return cli_usage_error("inspect", "--model is required");
    return -1;
}

/* The formats of a part's weights, as one string ("INT4 g32", "BF16", "FP8 b128 + BF16"). */
typedef struct fmt_set {
    char s[96];
} fmt_set;

static void fmt_add(fmt_set *f, const ddt_qweight *w) {
    char one[32];
    if (w->format == DDT_Q_INT4_GROUP) snprintf(one, sizeof one, "INT4 g%d", w->group);
    else if (w->format == DDT_Q_FP8_BLOCK) snprintf(one, sizeof one, "FP8 b%d", w->block);
    else snprintf(one, sizeof one, "%s", ddt_dtype_name(w->dtype));
    /* whole entries only: "BF16" must not match inside another name */
    const size_t n = strlen(one);
    for (const char *p = f->s; (p = strstr(p, one)) != NULL; p += n)
        if ((p == f->s || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' ')) return;
    const size_t used = strlen(f->s);
    snprintf(f->s + used, sizeof f->s - used, "%s%s", used ? " + " : "", one);
}

static void fmt_mlp(fmt_set *f, const ddt_cpu_mlp *m) {
    fmt_add(f, &m->gate);
    fmt_add(f, &m->up);
    fmt_add(f, &m->down);
}

typedef struct parts_fmt {
    fmt_set embed, attention, router, dense, routed;
} parts_fmt;

static void formats_of(const ddt_target_desc *d, parts_fmt *p) {
    memset(p, 0, sizeof *p);
    fmt_add(&p->embed, &d->embed);
    if (!d->cfg.tie_word_embeddings) fmt_add(&p->embed, &d->lm_head);
    for (int32_t l = 0; l < d->dims.n_layers; l++) {
        const ddt_target_layer *L = &d->layers[l];
        if (d->dims.q_lora > 0) {
            fmt_add(&p->attention, &L->q_a);
            fmt_add(&p->attention, &L->q_b);
        } else {
            fmt_add(&p->attention, &L->q_proj);
        }
        fmt_add(&p->attention, &L->kv_a);
        fmt_add(&p->attention, &L->kv_b);
        fmt_add(&p->attention, &L->o_proj);
        if (!L->moe) {
            fmt_mlp(&p->dense, &L->mlp);
            continue;
        }
        fmt_add(&p->router, &L->router);
        for (int32_t e = 0; e < d->dims.n_experts; e++) fmt_mlp(&p->routed, &L->experts[e]);
        if (L->has_shared) fmt_mlp(&p->dense, &L->shared);
    }
}

/* bytes in words for the tables: two decimals */
static const char *human(char *buf, size_t cap, uint64_t b) { return ddt_shard_fmt_bytes(buf, cap, b, 2); }

/* What one token's forward reads on rank s of the split (NULL: one GPU) whose bytes are
 * b: an embedding row of an untied table, the rank's vocabulary rows of the LM head
 * where the logits are split (model/shard.h ddt_shard_vocab_slice), its expected share
 * of the token's routed experts (top_k of n_experts spread evenly: a token's real count
 * on a GPU varies), the rest whole.  With one GPU: the whole model's decode step. */
static uint64_t token_bytes(const ddt_target_desc *d, const ddt_shard *s, const ddt_shard_bytes *b) {
    uint64_t step = b->total;
    const uint64_t vocab = (uint64_t)d->dims.vocab;
    if (!d->cfg.tie_word_embeddings) step = step - d->embed_bytes + d->embed_bytes / vocab;
    int64_t v0, n;
    bool split;
    ddt_shard_vocab_slice(s, d->dims.vocab, &v0, &n, &split);
    if (split) {
        const uint64_t head = d->cfg.tie_word_embeddings ? d->embed_bytes : ddt_shard_stored_bytes(&d->lm_head);
        step = step - head + head / (uint64_t)s->world;
    }
    const int32_t ne = s ? s->n_experts : d->dims.n_experts;
    if (d->dims.n_experts > 0 && ne > 0) {
        const uint64_t per = b->routed / (uint64_t)ne; /* an expert's bytes */
        step = step - b->routed + per * (uint64_t)d->dims.top_k * (uint64_t)ne / (uint64_t)d->dims.n_experts;
    }
    return step;
}

static json_t *bytes_json(const ddt_shard_bytes *b) {
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "embed", (json_int_t)b->embed, "attention",
                     (json_int_t)b->attention, "router", (json_int_t)b->router, "dense", (json_int_t)b->dense,
                     "routed", (json_int_t)b->routed, "total", (json_int_t)b->total);
}

int ddt_cmd_inspect(int argc, char **argv) {
    inspect_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    ddt_target_desc d;
    ddt_error err = {0};
    ddt_status st = ddt_target_desc_load(a.model, NULL, 0, &d, &err);
    if (st != DDT_OK) {
        fprintf(stderr, "ddtree inspect: model %s: %s\n", a.model, err.msg);
        ddt_target_desc_free(&d);
        return cli_status_exit(st);
    }
    const ddt_model_config *c = &d.cfg;
    const int32_t model_ctx = c->max_position_embeddings;
    if (a.ctx == 0) a.ctx = model_ctx > 0 && model_ctx < DEFAULT_CTX ? model_ctx : DEFAULT_CTX;
    if (model_ctx > 0 && a.ctx > model_ctx) {
        fprintf(stderr, "ddtree inspect: --ctx %lld is longer than the model's maximum %d\n", a.ctx, model_ctx);
        ddt_target_desc_free(&d);
        return 2;
    }
    const int32_t world = (int32_t)a.gpus, kv_elem = a.fast ? 2 : (int32_t)sizeof(float);
    /* every rank's plan first: an invalid split is a usage error before any output */
    ddt_shard *plans = calloc((size_t)world, sizeof *plans);
    if (!plans) {
        fprintf(stderr, "ddtree inspect: out of memory\n");
        ddt_target_desc_free(&d);
        return 1;
    }
    for (int32_t r = 0; r < world; r++)
        if ((st = ddt_shard_plan(c, r, world, &plans[r], &err)) != DDT_OK) {
            fprintf(stderr, "ddtree inspect: model %s: %s\n", a.model, err.msg);
            free(plans);
            ddt_target_desc_free(&d);
            return 2;
        }
    /* the drafter: on every GPU, its weights and its cache of ctx + one block */
    uint64_t draft_w = 0, draft_kv = 0, draft_need = 0;
    if (a.draft) {
        ddt_drafter_desc g;
        const ddt_drafter_target dt = {d.dims.hidden, d.dims.n_layers, d.dims.vocab, &d.embed, &d.lm_head};
        if ((st = ddt_drafter_desc_load(a.draft, &dt, &g, &err)) != DDT_OK) {
            fprintf(stderr, "ddtree inspect: drafter %s: %s\n", a.draft, err.msg);
            ddt_drafter_desc_free(&g);
            free(plans);
            ddt_target_desc_free(&d);
            return cli_status_exit(st);
        }
        draft_w = ddt_drafter_desc_weight_bytes(&g);
        draft_kv = ddt_drafter_desc_cache_bytes(&g, a.ctx);
        draft_need = draft_w + draft_kv;
        ddt_drafter_desc_free(&g);
    }
    ddt_shard_bytes whole;
    ddt_shard_weight_bytes(&d, NULL, &whole);
    parts_fmt pf;
    formats_of(&d, &pf);
    const uint64_t kv_pos = ddt_shard_kv_bytes(&d.dims, 1, kv_elem), kv = kv_pos * (uint64_t)a.ctx;
    const uint64_t mem = a.have_mem ? (uint64_t)(a.mem_gib * 1024.0 * 1024.0 * 1024.0) : 0;
    /* what one token's forward reads (ddt_target_decode_bytes' rule): one row of an
       untied embedding table, top_k of each MoE layer's routed experts, the rest whole */
    const uint64_t step = token_bytes(&d, NULL, &whole);
    int32_t n_moe = 0;
    for (int32_t l = 0; l < d.dims.n_layers; l++) n_moe += d.layers[l].moe;
    bool all_fit = true;
    json_t *o = NULL, *ranks = NULL;
    if (a.json) {
        o = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b}", "model", a.model, "architecture",
                      c->architecture, "layers", d.dims.n_layers, "moe_layers", n_moe, "hidden", d.dims.hidden, "heads",
                      c->num_attention_heads, "routed_experts", d.dims.n_experts, "experts_per_token", d.dims.top_k,
                      "shared_experts", c->n_shared_experts, "vocab", d.dims.vocab, "ctx", (int)a.ctx, "tied",
                      c->tie_word_embeddings);
        json_object_set_new(o, "weights", bytes_json(&whole));
        json_object_set_new(o, "formats",
                            json_pack("{s:s, s:s, s:s, s:s, s:s}", "embed", pf.embed.s, "attention", pf.attention.s,
                                      "router", pf.router.s, "dense", pf.dense.s, "routed", pf.routed.s));
        json_object_set_new(o, "decode_step_bytes", json_integer((json_int_t)step));
        json_object_set_new(o, "kv_bytes_per_position", json_integer((json_int_t)kv_pos));
        json_object_set_new(o, "kv_bytes", json_integer((json_int_t)kv));
        if (a.draft)
            json_object_set_new(o, "drafter", json_pack("{s:I, s:I}", "weights", (json_int_t)draft_w, "kv_bytes",
                                                        (json_int_t)draft_kv));
        json_object_set_new(o, "gpus", json_integer(world));
        ranks = json_array();
        json_object_set_new(o, "ranks", ranks);
    } else {
        printf("model %s: %s, %d layers (%d MoE), hidden %d, %d attention heads, ", a.model, c->architecture,
               d.dims.n_layers, n_moe, d.dims.hidden, c->num_attention_heads);
        if (d.dims.n_experts > 0)
            printf("%d routed experts (%d a token) + %d shared, ", d.dims.n_experts, d.dims.top_k, c->n_shared_experts);
        printf("vocabulary %d\n", d.dims.vocab);
        char h[32];
        printf("weights as stored: %s\n", human(h, sizeof h, whole.total));
        printf("  %-32s %12s  %s\n", "embedding, final norm, LM head", human(h, sizeof h, whole.embed), pf.embed.s);
        printf("  %-32s %12s  %s\n", "attention and norms", human(h, sizeof h, whole.attention), pf.attention.s);
        if (n_moe) printf("  %-32s %12s  %s\n", "routers", human(h, sizeof h, whole.router), pf.router.s);
        printf("  %-32s %12s  %s\n", "dense MLPs and shared experts", human(h, sizeof h, whole.dense), pf.dense.s);
        if (n_moe) printf("  %-32s %12s  %s\n", "routed experts", human(h, sizeof h, whole.routed), pf.routed.s);
        if (n_moe)
            printf("a decode step reads %s of them (one token: an embedding row, %d of %d routed experts a MoE "
                   "layer)\n", human(h, sizeof h, step), d.dims.top_k, d.dims.n_experts);
        else
            printf("a decode step reads %s of them (one token: an embedding row)\n", human(h, sizeof h, step));
        printf("KV cache: %llu bytes a position (%s), %lld positions: %s on every GPU\n", (unsigned long long)kv_pos,
               a.fast ? "bf16" : "fp32", a.ctx, human(h, sizeof h, kv));
        if (a.draft) {
            char h2[32];
            printf("drafter %s: weights %s as stored, cache %s (%lld + a block of positions), on every GPU\n",
                   a.draft, human(h, sizeof h, draft_w), human(h2, sizeof h2, draft_kv), a.ctx);
        }
        printf("\n--gpus %d (a token reads: what one token's forward reads on the GPU, its routed experts the "
               "expected share):\n\n| GPU | heads | routed experts | weights | + KV cache%s | a token reads |%s\n"
               "|---:|---|---|---:|---:|---:|%s\n",
               world, a.draft ? " + drafter" : "", a.have_mem ? " fits |" : "", a.have_mem ? "---|" : "");
    }
    char why[DDT_ERROR_MSG_MAX * 2] = "";
    for (int32_t r = 0; r < world; r++) {
        const ddt_shard *s = &plans[r];
        ddt_shard_bytes b;
        ddt_shard_weight_bytes(&d, world > 1 ? s : NULL, &b);
        bool fits = true;
        if (a.have_mem) {
            ddt_error e = {0};
            fits = ddt_shard_memory_check(&d, world > 1 ? s : NULL, a.ctx, kv_elem, draft_need, mem, r, &e) == DDT_OK;
            if (!fits && !why[0]) snprintf(why, sizeof why, "%s", e.msg);
            all_fit = all_fit && fits;
        }
        if (a.json) {
            json_t *x = json_pack("{s:i, s:i, s:i, s:i, s:i, s:I, s:I}", "rank", r, "head0", s->head0, "heads",
                                  s->n_heads, "expert0", s->expert0, "experts", s->n_experts,
                                  "need", (json_int_t)(b.total + kv + draft_need), "token_bytes",
                                  (json_int_t)token_bytes(&d, world > 1 ? s : NULL, &b));
            json_object_set_new(x, "bytes", bytes_json(&b));
            if (a.have_mem) json_object_set_new(x, "fits", json_boolean(fits));
            json_array_append_new(ranks, x);
        } else {
            char heads[32], experts[32];
            snprintf(heads, sizeof heads, "%d-%d%s", s->head0, s->head0 + s->n_heads - 1,
                     s->split_heads || world == 1 ? "" : " (all)");
            if (s->n_experts > 0) snprintf(experts, sizeof experts, "%d-%d", s->expert0, s->expert0 + s->n_experts - 1);
            else snprintf(experts, sizeof experts, "-");
            char w[32], n[32], tk[32];
            printf("| %d | %s | %s | %s | %s | %s |%s\n", r, heads, experts, human(w, sizeof w, b.total),
                   human(n, sizeof n, b.total + kv + draft_need),
                   human(tk, sizeof tk, token_bytes(&d, world > 1 ? s : NULL, &b)),
                   a.have_mem ? (fits ? " yes |" : " **no** |") : "");
        }
    }
    if (a.json) {
        if (a.have_mem) {
            json_object_set_new(o, "gpu_memory_bytes", json_integer((json_int_t)mem));
            json_object_set_new(o, "fits", json_boolean(all_fit));
            if (!all_fit) json_object_set_new(o, "advice", json_string(why));
        }
        char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (text) puts(text);
        free(text);
        json_decref(o);
    } else if (a.have_mem) {
        if (all_fit) printf("\nevery GPU fits %.1f GiB of free memory (weights and KV cache; workspaces come on top)\n",
                            a.mem_gib);
        else printf("\n%s\n", why);
    }
    free(plans);
    ddt_target_desc_free(&d);
    return a.have_mem && !all_fit ? 1 : 0;
}
