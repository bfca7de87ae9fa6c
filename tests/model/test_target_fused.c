/*
 * test_target_fused.c — routed experts in transformers 5's fused layout
 * (mlp.experts.gate_up_proj [E, 2I, H], gate rows first, + mlp.experts.down_proj
 * [E, H, I]) load on the CPU target and compute exactly what the per-expert
 * layout computes: tests/fixtures/fused/<v> (make_fused_fixtures.py) holds the
 * same bytes as tests/fixtures/target/<v> rearranged, so the logits must be
 * bitwise equal, and within the reference tolerance of transformers (the
 * target fixture's reference.json).  fp8_experts / fp8_fused are one synthetic
 * FP8 model in both layouts (128-row experts, so each half has its own scale
 * blocks).
 *
 * The error cases rebuild a checkpoint from the committed ones (tensors kept,
 * dropped, renamed, reshaped, retyped or assembled from two folders) and expect
 * a load error naming the culprit: both layouts in one layer, a half-fused pair,
 * layers in different layouts, shapes against the config, packed-integer stacks,
 * tensors the engine would not read, FP8 stacks without (or with misshapen) scales,
 * FP8 experts whose gate/up halves share scale blocks.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "io/safetensors.h"
#include "model/target.h"
#include "test_files.h"

#define REF_TOL 1e-4

static char g_root[1024];

/* ------------------------------------------------------------------ checkpoint builder */

typedef struct entry {
    char name[256];
    const char *dtype;   /* safetensors dtype name */
    int32_t ndim;
    int64_t shape[4];
    const void *data;    /* borrowed from an open checkpoint or from builder.owned */
    size_t nbytes;
} entry;

typedef struct builder {
    entry e[512];
    int32_t n;
    void *owned[64];     /* buffers made by the test, freed with the builder */
    int32_t n_owned;
} builder;

static entry *b_find(builder *b, const char *name) {
    for (int32_t i = 0; i < b->n; i++)
        if (!strcmp(b->e[i].name, name)) return &b->e[i];
    return NULL;
}

static entry *b_get(builder *b, const char *name) {
    entry *e = b_find(b, name);
    if (!e) fail_msg("builder: no tensor %s", name);
    return e;
}

static void b_add(builder *b, const char *name, const char *dtype, int32_t ndim, const int64_t *shape,
                  const void *data, size_t nbytes) {
    assert_true(b->n < (int32_t)(sizeof b->e / sizeof b->e[0]));
    entry *e = &b->e[b->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int32_t d = 0; d < ndim; d++) e->shape[d] = shape[d];
    e->data = data;
    e->nbytes = nbytes;
}

/* Every tensor of ck whose name starts with `prefix` ("" = all). */
static void b_copy(builder *b, const ddt_checkpoint *ck, const char *prefix) {
    for (int32_t i = 0; i < ddt_checkpoint_count(ck); i++) {
        const ddt_st_tensor *t = ddt_checkpoint_at(ck, i);
        if (strncmp(t->name, prefix, strlen(prefix)) != 0) continue;
        b_add(b, t->name, ddt_dtype_name(t->dtype), t->ndim, t->shape, t->data, (size_t)t->nbytes);
    }
}

/* Remove every tensor whose name starts with prefix; returns how many. */
static int32_t b_drop(builder *b, const char *prefix) {
    int32_t k = 0, dropped = 0;
    for (int32_t i = 0; i < b->n; i++) {
        if (!strncmp(b->e[i].name, prefix, strlen(prefix))) {
            dropped++;
            continue;
        }
        b->e[k++] = b->e[i];
    }
    b->n = k;
    return dropped;
}

static void *b_own(builder *b, size_t n) {
    assert_true(b->n_owned < 64);
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    b->owned[b->n_owned++] = p;
    return p;
}

static void b_free(builder *b) {
    for (int32_t i = 0; i < b->n_owned; i++) free(b->owned[i]);
    b->n_owned = 0;
    b->n = 0;
}

/* Write the builder's tensors as dir/model.safetensors and copy cfg_dir/config.json. */
static void b_write(const builder *b, const char *dir, const char *cfg_dir) {
    json_t *hdr = json_object();
    json_object_set_new(hdr, "__metadata__", json_pack("{ss}", "format", "pt"));
    size_t off = 0;
    for (int32_t i = 0; i < b->n; i++) {
        const entry *e = &b->e[i];
        json_t *shape = json_array();
        for (int32_t d = 0; d < e->ndim; d++) json_array_append_new(shape, json_integer(e->shape[d]));
        json_object_set_new(hdr, e->name,
                            json_pack("{ss so s[II]}", "dtype", e->dtype, "shape", shape, "data_offsets",
                                      (json_int_t)off, (json_int_t)(off + e->nbytes)));
        off += e->nbytes;
    }
    char *text = json_dumps(hdr, JSON_COMPACT);
    json_decref(hdr);
    /* padded to 8 bytes so the tensors stay aligned, as safetensors writers do */
    size_t tl = strlen(text), hl = (tl + 7) / 8 * 8;
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (uint8_t)((uint64_t)hl >> (8 * k));
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    assert_int_equal(fwrite(text, 1, tl, f), tl);
    for (size_t k = tl; k < hl; k++) fputc(' ', f);
    for (int32_t i = 0; i < b->n; i++)
        if (b->e[i].nbytes) assert_int_equal(fwrite(b->e[i].data, 1, b->e[i].nbytes, f), b->e[i].nbytes);
    fclose(f);
    free(text);
    size_t clen;
    snprintf(path, sizeof path, "%s/config.json", cfg_dir);
    uint8_t *cfg = read_all(path, &clen);
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(cfg, 1, clen, f), clen);
    fclose(f);
    free(cfg);
}

static void fixture_dir(char *out, size_t cap, const char *kind, const char *variant) {
    snprintf(out, cap, "%s/tests/fixtures/%s/%s", g_root, kind, variant);
}

static ddt_checkpoint *open_ck(const char *dir) {
    ddt_checkpoint *ck = NULL;
    ddt_error err = {0};
    if (ddt_checkpoint_open(dir, &ck, &err) != DDT_OK) fail_msg("%s: %s", dir, err.msg);
    return ck;
}

/* Load b (config from cfg_dir); expect failure with status `want` and both needles in the message. */
static void expect_failure(const builder *b, const char *cfg_dir, ddt_status want, const char *needle1,
                           const char *needle2) {
    char dir[] = "/tmp/ddt_fused_err_XXXXXX";
    assert_non_null(mkdtemp(dir));
    b_write(b, dir, cfg_dir);
    ddt_target_options o = {.max_ctx = 8, .max_tokens = 4, .n_threads = 1};
    ddt_target *t = NULL;
    ddt_error err = {0};
    ddt_status st = ddt_target_load(dir, &o, &t, &err);
    remove_checkpoint_dir(dir);
    if (st == DDT_OK) {
        ddt_target_free(t);
        fail_msg("checkpoint loaded without error (expected one naming '%s')", needle1);
    }
    assert_null(t);
    printf("  error: %s\n", err.msg);
    if (st != want) fail_msg("status %d, expected %d: %s", (int)st, (int)want, err.msg);
    if (needle1 && !strstr(err.msg, needle1)) fail_msg("message does not name '%s': %s", needle1, err.msg);
    if (needle2 && !strstr(err.msg, needle2)) fail_msg("message does not name '%s': %s", needle2, err.msg);
}

/* ------------------------------------------------------------------ identical logits */

static ddt_target *load_target(const char *dir, int32_t max_tokens) {
    ddt_target_options o = {.max_ctx = 64, .max_tokens = max_tokens, .n_threads = 2};
    ddt_target *t = NULL;
    ddt_error err = {0};
    if (ddt_target_load(dir, &o, &t, &err) != DDT_OK) fail_msg("%s: load failed: %s", dir, err.msg);
    return t;
}

/* Prefill ids on both targets (from an empty cache): every logit bitwise equal. */
static float *prefill_both(ddt_target *a, ddt_target *b, const int32_t *ids, int32_t n, const char *what) {
    const int32_t V = ddt_target_vocab(a);
    assert_int_equal(ddt_target_vocab(b), V);
    float *la = malloc(sizeof(float) * (size_t)n * V), *lb = malloc(sizeof(float) * (size_t)n * V);
    ddt_error err = {0};
    assert_int_equal(ddt_target_rollback(a, 0, &err), DDT_OK);
    assert_int_equal(ddt_target_rollback(b, 0, &err), DDT_OK);
    if (ddt_target_prefill(a, ids, n, la, true, &err) != DDT_OK) fail_msg("%s: prefill: %s", what, err.msg);
    if (ddt_target_prefill(b, ids, n, lb, true, &err) != DDT_OK) fail_msg("%s: prefill: %s", what, err.msg);
    if (memcmp(la, lb, sizeof(float) * (size_t)n * V) != 0) {
        for (size_t i = 0; i < (size_t)n * V; i++)
            if (memcmp(&la[i], &lb[i], sizeof(float)) != 0)
                fail_msg("%s: logit %zu differs between the layouts: %.9g vs %.9g", what, i, la[i], lb[i]);
    }
    free(lb);
    return la;
}

static double norm_err(const float *a, const json_t *rows, int32_t n, int32_t V) {
    double num = 0, den = 0;
    if (!json_is_array(rows) || (int32_t)json_array_size(rows) != n) fail_msg("reference logits: expected %d rows", n);
    for (int32_t r = 0; r < n; r++) {
        const json_t *row = json_array_get(rows, (size_t)r);
        if ((int32_t)json_array_size(row) != V) fail_msg("reference logits: row %d: expected %d values", r, V);
        for (int32_t v = 0; v < V; v++) {
            double want = json_number_value(json_array_get(row, (size_t)v)), d = a[(size_t)r * V + v] - want;
            num += d * d;
            den += want * want;
        }
    }
    return sqrt(num) / (sqrt(den) + 1e-30);
}

static void same_as_per_expert(const char *variant) {
    char per_dir[1100], fused_dir[1100], path[1200];
    fixture_dir(per_dir, sizeof per_dir, "target", variant);
    fixture_dir(fused_dir, sizeof fused_dir, "fused", variant);
    snprintf(path, sizeof path, "%s/reference.json", per_dir);
    json_error_t jerr;
    json_t *ref = json_load_file(path, 0, &jerr);
    if (!ref) fail_msg("%s: %s", path, jerr.text);
    json_t *prompts = json_object_get(ref, "prompts");
    assert_true(json_array_size(prompts) >= 3);
    /* the fused file really is fused: no per-expert tensor, one pair per MoE layer */
    ddt_checkpoint *ck = open_ck(fused_dir);
    int32_t pairs = 0, per_expert = 0;
    for (int32_t i = 0; i < ddt_checkpoint_count(ck); i++) {
        const char *nm = ddt_checkpoint_at(ck, i)->name, *x = strstr(nm, ".mlp.experts.");
        if (!x) continue;
        x += strlen(".mlp.experts.");
        if (*x >= '0' && *x <= '9') per_expert++;
        else if (!strcmp(x, "gate_up_proj")) pairs++;
    }
    ddt_checkpoint_close(ck);
    assert_int_equal(per_expert, 0);

    ddt_target *a = load_target(per_dir, 44), *b = load_target(fused_dir, 44);
    const ddt_model_config *c = ddt_target_config(a);
    assert_int_equal(pairs, c->num_hidden_layers - c->first_k_dense_replace);
    assert_true(ddt_target_weight_bytes(a) == ddt_target_weight_bytes(b));
    assert_true(ddt_target_decode_bytes(a) == ddt_target_decode_bytes(b));
    const int32_t V = ddt_target_vocab(a);
    for (size_t p = 0; p < json_array_size(prompts); p++) {
        json_t *pr = json_array_get(prompts, p), *ids_j = json_object_get(pr, "ids");
        int32_t n = (int32_t)json_array_size(ids_j), ids[64];
        assert_true(n >= 1 && n <= 44);
        for (int32_t i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(ids_j, (size_t)i));
        char what[160];
        snprintf(what, sizeof what, "%s prompt %zu", variant, p);
        float *lg = prefill_both(a, b, ids, n, what);
        double e = norm_err(lg, json_object_get(pr, "logits"), n, V);
        printf("  %-6s prompt %zu: fused == per-expert bitwise; against transformers %.3g (bound %g)\n", variant, p, e,
               REF_TOL);
        if (!(e <= REF_TOL)) fail_msg("%s: fused logits differ from the reference by %g", what, e);
        free(lg);
    }
    ddt_target_free(a);
    ddt_target_free(b);
    json_decref(ref);
}

static void test_fp32_fused_equals_per_expert(void **state) {
    (void)state;
    same_as_per_expert("fp32");
}
static void test_bf16_fused_equals_per_expert(void **state) {
    (void)state;
    same_as_per_expert("bf16");
}
/* the language_model. prefix of a Kimi K2.5 checkpoint, and its vision tensors beside */
static void test_kimi_fused_equals_per_expert(void **state) {
    (void)state;
    same_as_per_expert("kimi");
}

static void test_fp8_fused_equals_per_expert(void **state) {
    (void)state;
    char per_dir[1100], fused_dir[1100];
    fixture_dir(per_dir, sizeof per_dir, "fused", "fp8_experts");
    fixture_dir(fused_dir, sizeof fused_dir, "fused", "fp8_fused");
    ddt_checkpoint *ck = open_ck(fused_dir);
    const ddt_st_tensor *gu = ddt_checkpoint_find(ck, "model.layers.1.mlp.experts.gate_up_proj");
    assert_non_null(gu);
    assert_int_equal(gu->dtype, DDT_DTYPE_F8_E4M3);
    assert_non_null(ddt_checkpoint_find(ck, "model.layers.1.mlp.experts.down_proj_scale_inv"));
    ddt_checkpoint_close(ck);
    ddt_target *a = load_target(per_dir, 16), *b = load_target(fused_dir, 16);
    assert_true(ddt_target_weight_bytes(a) == ddt_target_weight_bytes(b));
    /* the views into the stack carry each half's own scale grid */
    const ddt_target_layer *la = ddt_target_layer_at(a, 1), *lb = ddt_target_layer_at(b, 1);
    assert_true(la->moe && lb->moe);
    const int32_t E = ddt_target_config(a)->n_routed_experts;
    for (int32_t e = 0; e < E; e++) {
        const ddt_qweight *w[3][2] = {{&la->experts[e].gate, &lb->experts[e].gate},
                                      {&la->experts[e].up, &lb->experts[e].up},
                                      {&la->experts[e].down, &lb->experts[e].down}};
        for (int k = 0; k < 3; k++) {
            assert_int_equal(w[k][1]->format, DDT_Q_FP8_BLOCK);
            assert_true(w[k][0]->rows == w[k][1]->rows && w[k][0]->cols == w[k][1]->cols);
            size_t sc = (size_t)((w[k][0]->rows + 127) / 128) * (size_t)((w[k][0]->cols + 127) / 128);
            assert_memory_equal(w[k][0]->data, w[k][1]->data, (size_t)(w[k][0]->rows * w[k][0]->cols));
            assert_memory_equal(w[k][0]->scale_inv, w[k][1]->scale_inv, sc * sizeof(float));
        }
    }
    int32_t ids[16];
    for (int32_t i = 0; i < 16; i++) ids[i] = 3 + (i * 37) % 290;
    float *lg = prefill_both(a, b, ids, 16, "fp8 pair");
    /* the synthetic model must be one whose logits say something */
    const int32_t V = ddt_target_vocab(a);
    double mean = 0, var = 0;
    for (size_t i = 0; i < (size_t)16 * V; i++) {
        assert_true(isfinite(lg[i]));
        mean += lg[i];
    }
    mean /= 16.0 * V;
    for (size_t i = 0; i < (size_t)16 * V; i++) var += (lg[i] - mean) * (lg[i] - mean);
    assert_true(var / (16.0 * V) > 1e-4);
    free(lg);
    ddt_target_free(a);
    ddt_target_free(b);
}

/* ------------------------------------------------------------------ refused checkpoints */

/* b = the fused bf16 fixture, ck kept open (its data backs the entries); the
 * config is the per-expert fixture's (the same file). */
static ddt_checkpoint *start_fused(builder *b, char *cfg_dir, size_t cap) {
    char dir[1100];
    fixture_dir(dir, sizeof dir, "fused", "bf16");
    snprintf(cfg_dir, cap, "%s", dir);
    ddt_checkpoint *ck = open_ck(dir);
    memset(b, 0, sizeof *b);
    b_copy(b, ck, "");
    return ck;
}

static void test_intact_rebuild_loads(void **state) {
    (void)state;
    builder b;
    char cfg[1100];
    ddt_checkpoint *ck = start_fused(&b, cfg, sizeof cfg);
    char dir[] = "/tmp/ddt_fused_ok_XXXXXX";
    assert_non_null(mkdtemp(dir));
    b_write(&b, dir, cfg);
    ddt_target *t = load_target(dir, 4);
    ddt_target_free(t);
    remove_checkpoint_dir(dir);
    ddt_checkpoint_close(ck);
    b_free(&b);
}

static void test_half_fused(void **state) {
    (void)state;
    builder b;
    char cfg[1100];
    ddt_checkpoint *ck = start_fused(&b, cfg, sizeof cfg);
    assert_int_equal(b_drop(&b, "model.layers.2.mlp.experts.down_proj"), 1);
    expect_failure(&b, cfg, DDT_ERR_FORMAT, "half-fused", "model.layers.2.mlp.experts.down_proj is missing");
    ddt_checkpoint_close(ck);
    b_free(&b);
    /* and the other half */
    ck = start_fused(&b, cfg, sizeof cfg);
    assert_int_equal(b_drop(&b, "model.layers.1.mlp.experts.gate_up_proj"), 1);
    expect_failure(&b, cfg, DDT_ERR_FORMAT, "model.layers.1.mlp.experts.down_proj is present",
                   "model.layers.1.mlp.experts.gate_up_proj is missing");
    ddt_checkpoint_close(ck);
    b_free(&b);
}

/* Layer 1 takes tensors from the per-expert fixture as `what` says. */
static void test_mixed_layouts(void **state) {
    (void)state;
    char per_dir[1100], cfg[1100];
    fixture_dir(per_dir, sizeof per_dir, "target", "bf16");
    builder b;
    /* fused gate_up_proj with per-expert down_proj in one layer */
    ddt_checkpoint *ck = start_fused(&b, cfg, sizeof cfg), *per = open_ck(per_dir);
    assert_int_equal(b_drop(&b, "model.layers.1.mlp.experts.down_proj"), 1);
    for (int32_t e = 0; e < 6; e++) {
        char nm[128];
        snprintf(nm, sizeof nm, "model.layers.1.mlp.experts.%d.down_proj.", e);
        b_copy(&b, per, nm);
    }
    expect_failure(&b, cfg, DDT_ERR_FORMAT, "both layouts", "model.layers.1.mlp.experts.0.down_proj.weight");
    b_free(&b);
    ddt_checkpoint_close(ck);
    /* the fused pair and every per-expert tensor in one layer */
    ck = start_fused(&b, cfg, sizeof cfg);
    b_copy(&b, per, "model.layers.1.mlp.experts.");
    expect_failure(&b, cfg, DDT_ERR_FORMAT, "layer 1: routed experts stored in both layouts",
                   "model.layers.1.mlp.experts.gate_up_proj");
    b_free(&b);
    ddt_checkpoint_close(ck);
    /* layer 1 fused, layer 2 per expert */
    ck = start_fused(&b, cfg, sizeof cfg);
    assert_int_equal(b_drop(&b, "model.layers.2.mlp.experts."), 2);
    b_copy(&b, per, "model.layers.2.mlp.experts.");
    expect_failure(&b, cfg, DDT_ERR_FORMAT, "layer 2 stores its routed experts per expert",
                   "layer 1 fused");
    b_free(&b);
    ddt_checkpoint_close(ck);
    /* and the other way round: layer 1 per expert, layer 2 fused */
    ck = start_fused(&b, cfg, sizeof cfg);
    assert_int_equal(b_drop(&b, "model.layers.1.mlp.experts."), 2);
    b_copy(&b, per, "model.layers.1.mlp.experts.");
    expect_failure(&b, cfg, DDT_ERR_FORMAT, "layer 2 stores its routed experts fused", "layer 1 per expert");
    b_free(&b);
    ddt_checkpoint_close(ck);
    ddt_checkpoint_close(per);
}

static void test_fused_shapes_and_types(void **state) {
    (void)state;
    builder b;
    char cfg[1100];
    /* bf16 fixture: E 6, I 8, H 64.  Transposed halves ([E, H, 2I], Llama 4's order): same bytes, wrong shape */
    ddt_checkpoint *ck = start_fused(&b, cfg, sizeof cfg);
    entry *gu = b_get(&b, "model.layers.1.mlp.experts.gate_up_proj");
    assert_true(gu->ndim == 3 && gu->shape[0] == 6 && gu->shape[1] == 16 && gu->shape[2] == 64);
    gu->shape[1] = 64;
    gu->shape[2] = 16;
    expect_failure(&b, cfg, DDT_ERR_FORMAT, "model.layers.1.mlp.experts.gate_up_proj", "[6, 16, 64]");
    b_free(&b);
    ddt_checkpoint_close(ck);
    /* one expert fewer than the config's 6 (the bytes of 5, so the file is consistent) */
    ck = start_fused(&b, cfg, sizeof cfg);
    entry *dn = b_get(&b, "model.layers.2.mlp.experts.down_proj");
    dn->shape[0] = 5;
    dn->nbytes = dn->nbytes / 6 * 5;
    expect_failure(&b, cfg, DDT_ERR_FORMAT, "model.layers.2.mlp.experts.down_proj", "[6, 64, 8]");
    b_free(&b);
    ddt_checkpoint_close(ck);
    /* a 2-D [E*2I, H] matrix is not the layout either */
    ck = start_fused(&b, cfg, sizeof cfg);
    gu = b_get(&b, "model.layers.1.mlp.experts.gate_up_proj");
    gu->ndim = 2;
    gu->shape[0] = 96;
    gu->shape[1] = 64;
    expect_failure(&b, cfg, DDT_ERR_FORMAT, "model.layers.1.mlp.experts.gate_up_proj", "[96, 64]");
    b_free(&b);
    ddt_checkpoint_close(ck);
    /* a packed-integer stack (what a fused INT4 layer would look like): unsupported, named */
    ck = start_fused(&b, cfg, sizeof cfg);
    gu = b_get(&b, "model.layers.1.mlp.experts.gate_up_proj");
    gu->dtype = "I32";
    gu->shape[2] = 32; /* 64 bf16 columns = 32 int32 words */
    expect_failure(&b, cfg, DDT_ERR_UNSUPPORTED, "model.layers.1.mlp.experts.gate_up_proj", "I32");
    b_free(&b);
    ddt_checkpoint_close(ck);
    /* a byte count that disagrees with the shape is the reader's refusal, naming the tensor */
    ck = start_fused(&b, cfg, sizeof cfg);
    dn = b_get(&b, "model.layers.1.mlp.experts.down_proj");
    dn->nbytes -= 2;
    expect_failure(&b, cfg, DDT_ERR_FORMAT, "model.layers.1.mlp.experts.down_proj", NULL);
    b_free(&b);
    ddt_checkpoint_close(ck);
}

static void test_tensors_beside_the_pair(void **state) {
    (void)state;
    builder b;
    char cfg[1100];
    /* a bias the engine would not add: refused rather than ignored */
    ddt_checkpoint *ck = start_fused(&b, cfg, sizeof cfg);
    const int64_t bshape[2] = {6, 16};
    void *zeros = b_own(&b, 6 * 16 * 2);
    memset(zeros, 0, 6 * 16 * 2);
    b_add(&b, "model.layers.1.mlp.experts.gate_up_proj_bias", "BF16", 2, bshape, zeros, 6 * 16 * 2);
    expect_failure(&b, cfg, DDT_ERR_UNSUPPORTED, "model.layers.1.mlp.experts.gate_up_proj_bias", "not supported");
    b_free(&b);
    ddt_checkpoint_close(ck);
    /* the pair with a `.weight` suffix is not transformers' layout: refused by name, not "experts.0 missing" */
    ck = start_fused(&b, cfg, sizeof cfg);
    for (int32_t l = 1; l <= 2; l++) {
        char from[128];
        snprintf(from, sizeof from, "model.layers.%d.mlp.experts.gate_up_proj", l);
        entry *e = b_get(&b, from);
        snprintf(e->name, sizeof e->name, "%s.weight", from);
        snprintf(from, sizeof from, "model.layers.%d.mlp.experts.down_proj", l);
        e = b_get(&b, from);
        snprintf(e->name, sizeof e->name, "%s.weight", from);
    }
    expect_failure(&b, cfg, DDT_ERR_UNSUPPORTED, "model.layers.1.mlp.experts.down_proj.weight",
                   "not a supported routed-expert layout");
    b_free(&b);
    ddt_checkpoint_close(ck);
}

static void test_fp8_stacks(void **state) {
    (void)state;
    char dir[1100];
    fixture_dir(dir, sizeof dir, "fused", "fp8_fused");
    builder b;
    memset(&b, 0, sizeof b);
    ddt_checkpoint *ck = open_ck(dir);
    /* scales missing */
    b_copy(&b, ck, "");
    assert_int_equal(b_drop(&b, "model.layers.1.mlp.experts.gate_up_proj_scale_inv"), 1);
    expect_failure(&b, dir, DDT_ERR_FORMAT, "model.layers.1.mlp.experts.gate_up_proj is F8_E4M3",
                   "model.layers.1.mlp.experts.gate_up_proj_scale_inv is missing");
    b_free(&b);
    /* one scale grid for the whole stack instead of one per expert: [2, 2] for [4, 2, 2] */
    b_copy(&b, ck, "");
    entry *s = b_get(&b, "model.layers.1.mlp.experts.gate_up_proj_scale_inv");
    assert_true(s->ndim == 3 && s->shape[0] == 4 && s->shape[1] == 2 && s->shape[2] == 2);
    s->ndim = 2;
    s->shape[0] = 2;
    s->shape[1] = 2;
    s->nbytes = 2 * 2 * 4;
    expect_failure(&b, dir, DDT_ERR_FORMAT, "model.layers.1.mlp.experts.gate_up_proj_scale_inv", "[4, 2, 2]");
    b_free(&b);
    /* F16 scales */
    b_copy(&b, ck, "");
    s = b_get(&b, "model.layers.1.mlp.experts.down_proj_scale_inv");
    s->dtype = "F16";
    s->nbytes /= 2;
    expect_failure(&b, dir, DDT_ERR_FORMAT, "model.layers.1.mlp.experts.down_proj_scale_inv", "F16");
    b_free(&b);
    ddt_checkpoint_close(ck);

    /* target/fp8's experts (I = 16) fused: gate and up would share one 128-row scale
     * block, which per-expert views cannot express: refused, naming the tensor */
    fixture_dir(dir, sizeof dir, "target", "fp8");
    ck = open_ck(dir);
    b_copy(&b, ck, "");
    for (int32_t l = 1; l <= 2; l++) {
        char p[96], nm[160];
        snprintf(p, sizeof p, "model.layers.%d.mlp.experts.", l);
        const int32_t E = 4, I = 16, H = 160;
        uint8_t *gu = b_own(&b, (size_t)E * 2 * I * H), *dn = b_own(&b, (size_t)E * H * I);
        float *gs = b_own(&b, sizeof(float) * E * 2), *ds = b_own(&b, sizeof(float) * E * 2);
        for (int32_t e = 0; e < E; e++) {
            snprintf(nm, sizeof nm, "%s%d.gate_proj.weight", p, e);
            memcpy(gu + (size_t)e * 2 * I * H, b_get(&b, nm)->data, (size_t)I * H);
            snprintf(nm, sizeof nm, "%s%d.up_proj.weight", p, e);
            memcpy(gu + (size_t)e * 2 * I * H + (size_t)I * H, b_get(&b, nm)->data, (size_t)I * H);
            snprintf(nm, sizeof nm, "%s%d.down_proj.weight", p, e);
            memcpy(dn + (size_t)e * H * I, b_get(&b, nm)->data, (size_t)H * I);
            snprintf(nm, sizeof nm, "%s%d.gate_proj.weight_scale_inv", p, e);
            memcpy(gs + 2 * e, b_get(&b, nm)->data, sizeof(float) * 2); /* [1, 2]: the gate's grid stands in */
            snprintf(nm, sizeof nm, "%s%d.down_proj.weight_scale_inv", p, e);
            memcpy(ds + 2 * e, b_get(&b, nm)->data, sizeof(float) * 2); /* [2, 1] */
        }
        assert_int_equal(b_drop(&b, p), E * 6);
        const int64_t gshape[3] = {E, 2 * I, H}, dshape[3] = {E, H, I}, gsh[3] = {E, 1, 2}, dsh[3] = {E, 2, 1};
        snprintf(nm, sizeof nm, "%sgate_up_proj", p);
        b_add(&b, nm, "F8_E4M3", 3, gshape, gu, (size_t)E * 2 * I * H);
        snprintf(nm, sizeof nm, "%sdown_proj", p);
        b_add(&b, nm, "F8_E4M3", 3, dshape, dn, (size_t)E * H * I);
        snprintf(nm, sizeof nm, "%sgate_up_proj_scale_inv", p);
        b_add(&b, nm, "F32", 3, gsh, gs, sizeof(float) * E * 2);
        snprintf(nm, sizeof nm, "%sdown_proj_scale_inv", p);
        b_add(&b, nm, "F32", 3, dsh, ds, sizeof(float) * E * 2);
    }
    expect_failure(&b, dir, DDT_ERR_UNSUPPORTED, "model.layers.1.mlp.experts.gate_up_proj",
                   "moe_intermediate_size (16)");
    b_free(&b);
    ddt_checkpoint_close(ck);
}

/* ------------------------------------------------------------------ io-level views */

static void test_stack_views(void **state) {
    (void)state;
    char dir[1100];
    fixture_dir(dir, sizeof dir, "fused", "fp8_fused");
    ddt_checkpoint *ck = open_ck(dir);
    ddt_qweight_stack s;
    ddt_error err = {0};
    assert_int_equal(ddt_checkpoint_weight_stack(ck, "model.layers.1.mlp.experts.gate_up_proj", 4, 256, 160, &s, &err),
                     DDT_OK);
    assert_int_equal(s.format, DDT_Q_FP8_BLOCK);
    ddt_qweight v;
    /* expert 3's up half: rows 128..255, scale rows 1 of its own [2][2] grid */
    assert_int_equal(ddt_qweight_stack_view(&s, 3, 128, 128, &v, &err), DDT_OK);
    assert_ptr_equal(v.data, (const uint8_t *)s.data + (size_t)(3 * 256 + 128) * 160);
    assert_ptr_equal(v.scale_inv, s.scale_inv + (3 * 2 + 1) * 2);
    assert_true(v.rows == 128 && v.cols == 160 && v.block == 128);
    /* a view that is not block aligned has no scale grid of its own */
    assert_int_equal(ddt_qweight_stack_view(&s, 0, 64, 128, &v, &err), DDT_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "model.layers.1.mlp.experts.gate_up_proj"));
    /* out of range */
    assert_int_equal(ddt_qweight_stack_view(&s, 4, 0, 128, &v, &err), DDT_ERR_RANGE);
    assert_int_equal(ddt_qweight_stack_view(&s, 0, 200, 128, &v, &err), DDT_ERR_RANGE);
    assert_int_equal(ddt_qweight_stack_view(&s, -1, 0, 1, &v, &err), DDT_ERR_RANGE);
    assert_int_equal(ddt_qweight_stack_view(&s, 0, 0, 0, &v, &err), DDT_ERR_RANGE);
    /* shape checks against the caller's dimensions */
    assert_int_equal(ddt_checkpoint_weight_stack(ck, "model.layers.1.mlp.experts.gate_up_proj", 4, 128, 160, &s, &err),
                     DDT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "[4, 128, 160]"));
    assert_int_equal(ddt_checkpoint_weight_stack(ck, "model.layers.1.mlp.experts.nope", 4, 128, 160, &s, &err),
                     DDT_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "is missing"));
    /* prefix ranges are the sorted table's contiguous runs */
    int32_t first = -1;
    int32_t n = ddt_checkpoint_prefix_range(ck, "model.layers.1.mlp.experts.", &first);
    assert_int_equal(n, 4);
    for (int32_t i = 0; i < n; i++)
        assert_int_equal(strncmp(ddt_checkpoint_at(ck, first + i)->name, "model.layers.1.mlp.experts.", 27), 0);
    assert_int_equal(ddt_checkpoint_prefix_range(ck, "model.layers.9.", &first), 0);
    assert_int_equal(ddt_checkpoint_prefix_range(ck, "", &first), ddt_checkpoint_count(ck));
    assert_int_equal(first, 0);
    ddt_checkpoint_close(ck);
}

int main(void) {
    snprintf(g_root, sizeof g_root, "%s", DDT_SOURCE_DIR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_fused_equals_per_expert),
        cmocka_unit_test(test_bf16_fused_equals_per_expert),
        cmocka_unit_test(test_kimi_fused_equals_per_expert),
        cmocka_unit_test(test_fp8_fused_equals_per_expert),
        cmocka_unit_test(test_intact_rebuild_loads),
        cmocka_unit_test(test_half_fused),
        cmocka_unit_test(test_mixed_layouts),
        cmocka_unit_test(test_fused_shapes_and_types),
        cmocka_unit_test(test_tensors_beside_the_pair),
        cmocka_unit_test(test_fp8_stacks),
        cmocka_unit_test(test_stack_views),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
