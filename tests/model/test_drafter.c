/*
 * test_drafter.c — the CPU DFlash drafter against the PyTorch reference of
 * tests/fixtures/drafter/<variant>/reference.json (make_drafter_fixtures.py),
 * the append/rollback paths of its context cache, its use with the CPU target's
 * hidden-state capture, and loading errors that must name the tensor or field.
 *
 * Logits are compared with the normalised error ||a - b|| / ||b|| (bound 1e-4:
 * the reference is fp32 compute on the stored values, fp32 vs float64 ~3e-7).
 * Paths that must give the same floats (one append vs many, rollback and redo)
 * are compared bit for bit: every CPU op computes a row from that row alone in a
 * fixed order (qmatmul.h, pool.h), so any difference is a bug.
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

#include "model/drafter.h"
#include "model/target.h"
#include "test_files.h"

#define TOL 1e-4

static double norm_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - b[i];
        num += e * e;
        den += (double)b[i] * b[i];
    }
    return sqrt(num) / (sqrt(den) + 1e-30);
}

static void fixture_dir(char *buf, size_t n, const char *kind, const char *variant) {
    snprintf(buf, n, "%s/tests/fixtures/%s/%s", DDT_SOURCE_DIR, kind, variant);
}

/* ------------------------------------------------------------------ reference */

typedef struct reference {
    json_t *root;
    int32_t n_tokens, F, V, L;
    int32_t *tokens;    /* [n_tokens] */
    float *features;    /* [n_tokens][F] */
    int32_t ctx_len[2], bonus[2], block_start[2];
    float *logits[2];   /* [L-1][V] */
} reference;

static float *json_matrix(const json_t *m, size_t rows, size_t cols, const char *what) {
    if (!json_is_array(m) || json_array_size(m) != rows) fail_msg("%s: expected %zu rows", what, rows);
    float *out = malloc(sizeof(float) * rows * cols);
    for (size_t r = 0; r < rows; r++) {
        const json_t *row = json_array_get(m, r);
        if (!json_is_array(row) || json_array_size(row) != cols)
            fail_msg("%s: row %zu: expected %zu values", what, r, cols);
        for (size_t c = 0; c < cols; c++) out[r * cols + c] = (float)json_number_value(json_array_get(row, c));
    }
    return out;
}

static void reference_load(const char *variant, int32_t F, int32_t V, int32_t L, reference *r) {
    char path[1200];
    fixture_dir(path, sizeof path, "drafter", variant);
    strcat(path, "/reference.json");
    json_error_t jerr;
    memset(r, 0, sizeof *r);
    r->root = json_load_file(path, 0, &jerr);
    if (!r->root) fail_msg("%s: %s (line %d)", path, jerr.text, jerr.line);
    const char *cd = json_string_value(json_object_get(json_object_get(r->root, "model"), "compute_dtype"));
    if (!cd || strcmp(cd, "float32") != 0) fail_msg("%s: compute_dtype is not float32", path);
    json_t *toks = json_object_get(r->root, "tokens");
    r->n_tokens = (int32_t)json_array_size(toks);
    assert_true(r->n_tokens > 0);
    r->F = F;
    r->V = V;
    r->L = L;
    r->tokens = malloc(sizeof(int32_t) * (size_t)r->n_tokens);
    for (int32_t i = 0; i < r->n_tokens; i++) r->tokens[i] = (int32_t)json_integer_value(json_array_get(toks, (size_t)i));
    r->features = json_matrix(json_object_get(r->root, "features"), (size_t)r->n_tokens, (size_t)F, "features");
    json_t *rounds = json_object_get(r->root, "rounds");
    assert_int_equal(json_array_size(rounds), 2);
    for (int k = 0; k < 2; k++) {
        json_t *rd = json_array_get(rounds, (size_t)k);
        r->ctx_len[k] = (int32_t)json_integer_value(json_object_get(rd, "context_len"));
        r->bonus[k] = (int32_t)json_integer_value(json_object_get(rd, "bonus"));
        r->block_start[k] = (int32_t)json_integer_value(json_object_get(rd, "block_start"));
        r->logits[k] = json_matrix(json_object_get(rd, "logits"), (size_t)L - 1, (size_t)V, "round logits");
    }
    assert_true(r->ctx_len[0] > 0 && r->ctx_len[0] < r->ctx_len[1] && r->ctx_len[1] <= r->n_tokens);
}

static void reference_free(reference *r) {
    free(r->tokens);
    free(r->features);
    free(r->logits[0]);
    free(r->logits[1]);
    json_decref(r->root);
}

/* ------------------------------------------------------------------ setup */

static ddt_drafter_head *open_head(void) {
    char dir[1100];
    fixture_dir(dir, sizeof dir, "target", "fp32");
    ddt_drafter_head *h = NULL;
    ddt_error err = {0};
    if (ddt_drafter_head_open(dir, &h, &err) != DDT_OK) fail_msg("target head: %s", err.msg);
    return h;
}

static ddt_drafter *load_drafter_dir(const char *dir, const ddt_drafter_head *h, int32_t max_ctx, int32_t threads) {
    ddt_drafter_options o = {.max_ctx = max_ctx, .n_threads = threads};
    ddt_drafter *d = NULL;
    ddt_error err = {0};
    if (ddt_drafter_load(dir, ddt_drafter_head_target(h), &o, &d, &err) != DDT_OK) fail_msg("load %s: %s", dir, err.msg);
    assert_non_null(d);
    return d;
}

static ddt_drafter *load_drafter(const char *variant, const ddt_drafter_head *h, int32_t max_ctx, int32_t threads) {
    char dir[1100];
    fixture_dir(dir, sizeof dir, "drafter", variant);
    return load_drafter_dir(dir, h, max_ctx, threads);
}

/* Append tokens [a, b) of the reference, in calls of at most `step` tokens. */
static void append_range(ddt_drafter *d, const reference *r, int32_t a, int32_t b, int32_t step) {
    int32_t pos[64];
    for (int32_t i = a; i < b; i += step) {
        int32_t n = b - i < step ? b - i : step;
        assert_true(n <= 64);
        for (int32_t k = 0; k < n; k++) pos[k] = i + k;
        ddt_error err = {0};
        if (ddt_drafter_append_context(d, r->features + (size_t)i * r->F, pos, n, &err) != DDT_OK)
            fail_msg("append: %s", err.msg);
    }
}

static float *draft(ddt_drafter *d, int32_t bonus) {
    const int32_t L = ddt_drafter_block_size(d), V = ddt_drafter_vocab(d);
    float *out = malloc(sizeof(float) * (size_t)(L - 1) * V);
    for (size_t i = 0; i < (size_t)(L - 1) * V; i++) out[i] = NAN; /* every row must be written */
    ddt_error err = {0};
    if (ddt_drafter_draft(d, bonus, out, &err) != DDT_OK) fail_msg("draft: %s", err.msg);
    return out;
}

static void expect_close(const float *got, const float *want, size_t n, const char *what) {
    double e = norm_err(got, want, n);
    printf("  %-34s normalised error %.3g (bound %g)\n", what, e, TOL);
    if (!(e <= TOL)) fail_msg("%s: normalised error %g > %g", what, e, TOL);
}

static void expect_same(const float *a, const float *b, size_t n, const char *what) {
    if (memcmp(a, b, sizeof(float) * n) != 0) {
        size_t i = 0;
        while (i < n && memcmp(a + i, b + i, sizeof(float)) == 0) i++;
        fail_msg("%s: differs at element %zu: %.9g vs %.9g", what, i, a[i], b[i]);
    }
}

/* ------------------------------------------------------------------ fixtures */

static void run_variant(const char *variant) {
    ddt_drafter_head *h = open_head();
    ddt_drafter *d = load_drafter(variant, h, 16, 2);
    const ddt_drafter_config *c = ddt_drafter_get_config(d);
    assert_int_equal(c->n_target_layers, 2);
    assert_int_equal(ddt_drafter_feature_dim(d), 2 * c->hidden_size);
    reference r;
    reference_load(variant, ddt_drafter_feature_dim(d), ddt_drafter_vocab(d), ddt_drafter_block_size(d), &r);
    const size_t n = (size_t)(r.L - 1) * r.V;
    char what[128];

    append_range(d, &r, 0, r.ctx_len[0], r.ctx_len[0]);
    assert_int_equal(ddt_drafter_len(d), r.ctx_len[0]);
    assert_int_equal(ddt_drafter_next_position(d), r.block_start[0]);
    float *l0 = draft(d, r.bonus[0]);
    snprintf(what, sizeof what, "%s round 0", variant);
    expect_close(l0, r.logits[0], n, what);
    /* the second round's context arrives in two appends */
    int32_t mid = (r.ctx_len[0] + r.ctx_len[1]) / 2;
    append_range(d, &r, r.ctx_len[0], mid, 64);
    append_range(d, &r, mid, r.ctx_len[1], 64);
    assert_int_equal(ddt_drafter_next_position(d), r.block_start[1]);
    float *l1 = draft(d, r.bonus[1]);
    snprintf(what, sizeof what, "%s round 1", variant);
    expect_close(l1, r.logits[1], n, what);
    /* a draft leaves the cache as it was: drafting again gives the same floats */
    float *l1b = draft(d, r.bonus[1]);
    expect_same(l1, l1b, n, "second draft of the same round");
    free(l0);
    free(l1);
    free(l1b);
    reference_free(&r);
    ddt_drafter_free(d);
    ddt_drafter_head_close(h);
}

static void test_fixture_fp32(void **state) {
    (void)state;
    run_variant("fp32");
}

/* BF16 weights, "model." prefix, YaRN with the legacy attention factor. */
static void test_fixture_yarn_legacy(void **state) {
    (void)state;
    run_variant("yarn_legacy");
}

/* One append, token-by-token appends, chunked appends (> APPEND_CHUNK tokens is not
 * reachable with 11 fixture tokens, so a long synthetic context covers it) and the
 * per-layer row path all give the same cache, hence the same floats. */
static void test_append_paths_agree(void **state) {
    (void)state;
    ddt_drafter_head *h = open_head();
    ddt_drafter *a = load_drafter("fp32", h, 128, 2);
    ddt_drafter *b = load_drafter("fp32", h, 128, 1);
    ddt_drafter *c = load_drafter("fp32", h, 128, 3);
    reference r;
    reference_load("fp32", ddt_drafter_feature_dim(a), ddt_drafter_vocab(a), ddt_drafter_block_size(a), &r);
    const size_t n = (size_t)(r.L - 1) * r.V;
    const int32_t m = r.ctx_len[1], H = ddt_drafter_get_config(a)->hidden_size;

    append_range(a, &r, 0, m, m);
    append_range(b, &r, 0, m, 1);
    /* c: the features as two per-layer captures, rows given in order */
    float *lay0 = malloc(sizeof(float) * (size_t)m * H), *lay1 = malloc(sizeof(float) * (size_t)m * H);
    int32_t rows[64];
    for (int32_t i = 0; i < m; i++) {
        memcpy(lay0 + (size_t)i * H, r.features + (size_t)i * r.F, sizeof(float) * H);
        memcpy(lay1 + (size_t)i * H, r.features + (size_t)i * r.F + H, sizeof(float) * H);
        rows[i] = i;
    }
    const float *layers[2] = {lay0, lay1};
    ddt_error err = {0};
    assert_int_equal(ddt_drafter_append_rows(c, layers, m, rows, 3, &err), DDT_OK);
    assert_int_equal(ddt_drafter_append_rows(c, layers, m, rows + 3, m - 3, &err), DDT_OK);
    assert_int_equal(ddt_drafter_len(c), m);
    float *la = draft(a, r.bonus[1]), *lb = draft(b, r.bonus[1]), *lc = draft(c, r.bonus[1]);
    expect_close(la, r.logits[1], n, "fp32 round 1, one append");
    expect_same(la, lb, n, "one append vs token-by-token (1 vs 2 threads)");
    expect_same(la, lc, n, "features vs per-layer rows (2 vs 3 threads)");
    free(la);
    free(lb);
    free(lc);

    /* A long context: 100 rows (several append chunks) made of the fixture rows
     * cycled, appended at once vs in uneven pieces. */
    assert_int_equal(ddt_drafter_rollback(a, 0, &err), DDT_OK);
    assert_int_equal(ddt_drafter_rollback(b, 0, &err), DDT_OK);
    const int32_t big = 100;
    float *feat = malloc(sizeof(float) * (size_t)big * r.F);
    int32_t pos[100];
    for (int32_t i = 0; i < big; i++) {
        memcpy(feat + (size_t)i * r.F, r.features + (size_t)(i % m) * r.F, sizeof(float) * r.F);
        pos[i] = i;
    }
    assert_int_equal(ddt_drafter_append_context(a, feat, pos, big, &err), DDT_OK);
    const int32_t cuts[] = {0, 7, 40, 41, 100};
    for (int k = 0; k < 4; k++)
        assert_int_equal(ddt_drafter_append_context(b, feat + (size_t)cuts[k] * r.F, pos + cuts[k], cuts[k + 1] - cuts[k],
                                                    &err),
                         DDT_OK);
    la = draft(a, r.bonus[0]);
    lb = draft(b, r.bonus[0]);
    expect_same(la, lb, n, "100-token context, one append vs four");
    for (size_t i = 0; i < n; i++) assert_true(isfinite(la[i]));
    free(la);
    free(lb);
    free(feat);
    free(lay0);
    free(lay1);
    reference_free(&r);
    ddt_drafter_free(a);
    ddt_drafter_free(b);
    ddt_drafter_free(c);
    ddt_drafter_head_close(h);
}

static void test_rollback(void **state) {
    (void)state;
    ddt_drafter_head *h = open_head();
    ddt_drafter *d = load_drafter("fp32", h, 16, 2);
    reference r;
    reference_load("fp32", ddt_drafter_feature_dim(d), ddt_drafter_vocab(d), ddt_drafter_block_size(d), &r);
    const size_t n = (size_t)(r.L - 1) * r.V;
    ddt_error err = {0};

    append_range(d, &r, 0, r.ctx_len[0], 64);
    float *first = draft(d, r.bonus[0]);
    append_range(d, &r, r.ctx_len[0], r.ctx_len[1], 64);
    float *second = draft(d, r.bonus[1]);
    /* back to round 0: the same floats as before the second append */
    assert_int_equal(ddt_drafter_rollback(d, r.ctx_len[0], &err), DDT_OK);
    assert_int_equal(ddt_drafter_len(d), r.ctx_len[0]);
    assert_int_equal(ddt_drafter_next_position(d), r.block_start[0]);
    float *again = draft(d, r.bonus[0]);
    expect_same(first, again, n, "round 0 after rollback");
    /* positions must continue after the kept rows: reusing position 2 fails */
    int32_t bad_pos[1] = {2};
    assert_int_equal(ddt_drafter_append_context(d, r.features, bad_pos, 1, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "position"));
    assert_int_equal(ddt_drafter_len(d), r.ctx_len[0]);
    /* a rejected (wrong) continuation, rolled back, then the right one */
    int32_t wrong_pos[2] = {r.ctx_len[0], r.ctx_len[0] + 1};
    assert_int_equal(ddt_drafter_append_context(d, r.features, wrong_pos, 2, &err), DDT_OK);
    float *wrong = draft(d, r.bonus[1]);
    assert_true(norm_err(wrong, second, n) > 1e-3); /* the context matters */
    assert_int_equal(ddt_drafter_rollback(d, r.ctx_len[0], &err), DDT_OK);
    append_range(d, &r, r.ctx_len[0], r.ctx_len[1], 2);
    float *redo = draft(d, r.bonus[1]);
    expect_same(second, redo, n, "round 1 after rollback and re-append");
    expect_close(redo, r.logits[1], n, "fp32 round 1 after rollback");
    /* rollback to 0 gives the context-free draft at position 0 */
    assert_int_equal(ddt_drafter_rollback(d, 0, &err), DDT_OK);
    assert_int_equal(ddt_drafter_next_position(d), 0);
    assert_int_equal(ddt_drafter_rollback(d, 1, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "rollback"));
    free(first);
    free(second);
    free(again);
    free(wrong);
    free(redo);
    reference_free(&r);
    ddt_drafter_free(d);
    ddt_drafter_head_close(h);
}

/* The round as the engine runs it: the CPU target's capture of target_layer_ids
 * feeds the drafter (prefill of the committed tokens, then append_rows). */
static void test_with_cpu_target(void **state) {
    (void)state;
    ddt_drafter_head *h = open_head();
    ddt_drafter *d = load_drafter("fp32", h, 16, 2);
    const ddt_drafter_config *c = ddt_drafter_get_config(d);
    reference r;
    reference_load("fp32", ddt_drafter_feature_dim(d), ddt_drafter_vocab(d), ddt_drafter_block_size(d), &r);
    char dir[1100];
    fixture_dir(dir, sizeof dir, "target", "fp32");
    ddt_target_options to = {.max_ctx = 32, .max_tokens = 16, .n_threads = 2,
                             .capture_layers = c->target_layer_ids, .n_capture = c->n_target_layers};
    ddt_target *t = NULL;
    ddt_error err = {0};
    if (ddt_target_load(dir, &to, &t, &err) != DDT_OK) fail_msg("target: %s", err.msg);
    const int32_t H = c->hidden_size;
    for (int k = 0; k < 2; k++) {
        int32_t a = k == 0 ? 0 : r.ctx_len[0], b = r.ctx_len[k];
        if (ddt_target_prefill(t, r.tokens + a, b - a, NULL, false, &err) != DDT_OK) fail_msg("prefill: %s", err.msg);
        const float *layers[2];
        int32_t nt = 0, rows[32];
        for (int32_t s = 0; s < 2; s++) {
            layers[s] = ddt_target_hidden(t, s, &nt);
            assert_non_null(layers[s]);
            assert_int_equal(nt, b - a);
            /* the capture is the reference's feature slice */
            for (int32_t i = 0; i < nt; i++) {
                double e = norm_err(layers[s] + (size_t)i * H, r.features + (size_t)(a + i) * r.F + (size_t)s * H, H);
                if (!(e <= TOL)) fail_msg("target capture slot %d token %d: error %g", s, a + i, e);
            }
        }
        for (int32_t i = 0; i < nt; i++) rows[i] = i;
        if (ddt_drafter_append_rows(d, layers, nt, rows, nt, &err) != DDT_OK) fail_msg("append_rows: %s", err.msg);
        float *l = draft(d, r.bonus[k]);
        expect_close(l, r.logits[k], (size_t)(r.L - 1) * r.V, k == 0 ? "with CPU target, round 0" : "with CPU target, round 1");
        free(l);
    }
    ddt_target_free(t);
    reference_free(&r);
    ddt_drafter_free(d);
    ddt_drafter_head_close(h);
}

static void test_call_errors(void **state) {
    (void)state;
    ddt_drafter_head *h = open_head();
    ddt_drafter *d = load_drafter("fp32", h, 4, 1);
    ddt_error err = {0};
    const int32_t F = ddt_drafter_feature_dim(d), V = ddt_drafter_vocab(d), L = ddt_drafter_block_size(d);
    float *feat = calloc((size_t)5 * F, sizeof(float));
    float *logits = malloc(sizeof(float) * (size_t)(L - 1) * V);
    int32_t pos[5] = {0, 1, 2, 3, 4};
    assert_int_equal(ddt_drafter_append_context(d, feat, pos, 5, &err), DDT_ERR_RANGE);
    assert_non_null(strstr(err.msg, "exceed"));
    int32_t same[2] = {3, 3};
    assert_int_equal(ddt_drafter_append_context(d, feat, same, 2, &err), DDT_ERR_INVALID);
    assert_int_equal(ddt_drafter_len(d), 0);
    assert_int_equal(ddt_drafter_append_context(d, feat, pos, 4, &err), DDT_OK);
    assert_int_equal(ddt_drafter_draft(d, V, logits, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "bonus"));
    assert_int_equal(ddt_drafter_draft(d, -1, logits, &err), DDT_ERR_INVALID);
    assert_int_equal(ddt_drafter_draft(d, 0, NULL, &err), DDT_ERR_INVALID);
    const float *layers[2] = {feat, feat};
    int32_t rows[1] = {7};
    assert_int_equal(ddt_drafter_rollback(d, 2, &err), DDT_OK);
    assert_int_equal(ddt_drafter_append_rows(d, layers, 5, rows, 1, &err), DDT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "rows[0]"));
    /* zero-length appends are no-ops */
    assert_int_equal(ddt_drafter_append_context(d, NULL, NULL, 0, &err), DDT_OK);
    assert_int_equal(ddt_drafter_len(d), 2);
    free(feat);
    free(logits);
    ddt_drafter_free(d);
    /* a target folder that does not exist */
    ddt_drafter_head *none = NULL;
    assert_int_not_equal(ddt_drafter_head_open("/nonexistent/ddt_target", &none, &err), DDT_OK);
    assert_null(none);
    ddt_drafter_head_close(h);
}

/* ------------------------------------------------------------------ damaged folders */

typedef void (*config_edit)(json_t *cfg);

typedef struct damage {
    const char *variant;    /* fixture to copy */
    const char *drop;       /* tensor left out, or NULL */
    const char *reshape;    /* tensor whose shape becomes shape[2] (same bytes), or NULL */
    int64_t shape[2];
    config_edit edit;       /* change to config.json, or NULL */
} damage;

/* Copy the fixture into dir with `dm` applied: the safetensors file is rebuilt
 * from its header with the named tensor dropped or reshaped. */
static void make_copy(const char *dir, const damage *dm) {
    char src[1100], path[1200];
    fixture_dir(src, sizeof src, "drafter", dm->variant);
    size_t len;
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    uint8_t *file = read_all(path, &len);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)file[i] << (8 * i);
    json_error_t jerr;
    json_t *hdr = json_loadb((const char *)file + 8, (size_t)hl, 0, &jerr);
    assert_non_null(hdr);
    const uint8_t *data = file + 8 + hl;
    json_t *nh = json_object();
    uint8_t *body = malloc(len);
    size_t used = 0;
    const char *key;
    json_t *val;
    json_object_foreach(hdr, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            json_object_set(nh, key, val);
            continue;
        }
        if (dm->drop && strcmp(key, dm->drop) == 0) continue;
        json_t *offs = json_object_get(val, "data_offsets");
        size_t b = (size_t)json_integer_value(json_array_get(offs, 0)), e = (size_t)json_integer_value(json_array_get(offs, 1));
        memcpy(body + used, data + b, e - b);
        json_t *entry = json_deep_copy(val);
        json_object_set_new(entry, "data_offsets", json_pack("[II]", (json_int_t)used, (json_int_t)(used + e - b)));
        if (dm->reshape && strcmp(key, dm->reshape) == 0)
            json_object_set_new(entry, "shape", json_pack("[II]", (json_int_t)dm->shape[0], (json_int_t)dm->shape[1]));
        json_object_set_new(nh, key, entry);
        used += e - b;
    }
    char *text = json_dumps(nh, JSON_COMPACT);
    size_t tl = strlen(text), padded = (tl + 7) / 8 * 8;
    uint8_t *out = malloc(8 + padded + used);
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memset(out + 8, ' ', padded);
    memcpy(out + 8, text, tl);
    memcpy(out + 8 + padded, body, used);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_all(path, out, 8 + padded + used);
    free(text);
    free(out);
    free(body);
    json_decref(nh);
    json_decref(hdr);
    free(file);

    snprintf(path, sizeof path, "%s/config.json", src);
    json_t *cfg = json_load_file(path, 0, &jerr);
    assert_non_null(cfg);
    if (dm->edit) dm->edit(cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(json_dump_file(cfg, path, JSON_INDENT(2)), 0);
    json_decref(cfg);
}

static void remove_copy(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

/* Load the damaged copy; it must fail with every non-NULL needle in the message. */
static void expect_load_failure(const damage *dm, const char *needle1, const char *needle2) {
    char dir[] = "/tmp/ddt_drafter_err_XXXXXX";
    assert_non_null(mkdtemp(dir));
    make_copy(dir, dm);
    ddt_drafter_head *h = open_head();
    ddt_drafter_options o = {.max_ctx = 8, .n_threads = 1};
    ddt_drafter *d = NULL;
    ddt_error err = {0};
    ddt_status st = ddt_drafter_load(dir, ddt_drafter_head_target(h), &o, &d, &err);
    remove_copy(dir);
    ddt_drafter_head_close(h);
    if (st == DDT_OK) {
        ddt_drafter_free(d);
        fail_msg("damaged drafter loaded without error");
    }
    assert_null(d);
    printf("  error: %s\n", err.msg);
    if (needle1 && !strstr(err.msg, needle1)) fail_msg("message does not name '%s': %s", needle1, err.msg);
    if (needle2 && !strstr(err.msg, needle2)) fail_msg("message does not name '%s': %s", needle2, err.msg);
}

static void edit_ids_beyond(json_t *c) {
    json_object_set_new(json_object_get(c, "dflash_config"), "target_layer_ids", json_pack("[ii]", 0, 3));
}
static void edit_ids_beyond_unchecked(json_t *c) {
    /* without num_target_layers only the target can reject the id */
    json_object_del(c, "num_target_layers");
    edit_ids_beyond(c);
}
static void edit_ids_negative(json_t *c) {
    json_object_set_new(json_object_get(c, "dflash_config"), "target_layer_ids", json_pack("[ii]", -1, 2));
}
static void edit_ids_missing(json_t *c) { json_object_del(json_object_get(c, "dflash_config"), "target_layer_ids"); }
static void edit_hidden(json_t *c) { json_object_set_new(c, "hidden_size", json_integer(48)); }
static void edit_num_target_layers(json_t *c) { json_object_set_new(c, "num_target_layers", json_integer(61)); }
static void edit_mask(json_t *c) {
    json_object_set_new(json_object_get(c, "dflash_config"), "mask_token_id", json_integer(300));
}
static void edit_arch(json_t *c) { json_object_set_new(c, "architectures", json_pack("[s]", "Qwen3ForCausalLM")); }
static void edit_layers(json_t *c) { json_object_set_new(c, "num_hidden_layers", json_integer(1)); }
static void edit_kv_heads(json_t *c) { json_object_set_new(c, "num_key_value_heads", json_integer(3)); }
static void edit_no_head_dim(json_t *c) { json_object_del(c, "head_dim"); }
static void edit_rope_type(json_t *c) {
    json_object_set_new(c, "rope_scaling", json_pack("{s:s,s:f}", "rope_type", "linear", "factor", 2.0));
}
static void edit_causal(json_t *c) { json_object_set_new(c, "is_causal", json_true()); }

static void test_load_errors(void **state) {
    (void)state;
    damage dm;
    /* missing tensors, with and without the "model." prefix */
    dm = (damage){.variant = "fp32", .drop = "layers.1.self_attn.k_norm.weight"};
    expect_load_failure(&dm, "layers.1.self_attn.k_norm.weight", NULL);
    dm = (damage){.variant = "fp32", .drop = "layers.0.mlp.down_proj.weight"};
    expect_load_failure(&dm, "layers.0.mlp.down_proj", "missing");
    dm = (damage){.variant = "yarn_legacy", .drop = "model.hidden_norm.weight"};
    expect_load_failure(&dm, "model.hidden_norm.weight", NULL);
    dm = (damage){.variant = "fp32", .drop = "fc.weight"};
    expect_load_failure(&dm, "fc.weight", "missing");
    /* wrong shapes (same byte count, so only the shape check can see them) */
    dm = (damage){.variant = "fp32", .reshape = "layers.0.self_attn.q_proj.weight", .shape = {64, 96}};
    expect_load_failure(&dm, "layers.0.self_attn.q_proj", NULL);
    dm = (damage){.variant = "fp32", .reshape = "fc.weight", .shape = {128, 64}};
    expect_load_failure(&dm, "fc.weight", NULL);
    dm = (damage){.variant = "fp32", .reshape = "layers.1.self_attn.k_proj.weight", .shape = {64, 48}};
    expect_load_failure(&dm, "layers.1.self_attn.k_proj", NULL);
    /* config against the target */
    dm = (damage){.variant = "fp32", .edit = edit_ids_beyond};
    expect_load_failure(&dm, "target_layer_ids", NULL);
    dm = (damage){.variant = "fp32", .edit = edit_ids_beyond_unchecked};
    expect_load_failure(&dm, "target_layer_ids[1] = 3", "target's layers");
    dm = (damage){.variant = "fp32", .edit = edit_ids_negative};
    expect_load_failure(&dm, "target_layer_ids[0]", NULL);
    dm = (damage){.variant = "fp32", .edit = edit_ids_missing};
    expect_load_failure(&dm, "target_layer_ids", "missing");
    dm = (damage){.variant = "fp32", .edit = edit_hidden};
    expect_load_failure(&dm, "hidden_size", "64");
    dm = (damage){.variant = "fp32", .edit = edit_num_target_layers};
    expect_load_failure(&dm, "num_target_layers", NULL);
    dm = (damage){.variant = "fp32", .edit = edit_mask};
    expect_load_failure(&dm, "mask_token_id", NULL);
    /* config on its own */
    dm = (damage){.variant = "fp32", .edit = edit_arch};
    expect_load_failure(&dm, "architectures", NULL);
    dm = (damage){.variant = "fp32", .edit = edit_layers};
    expect_load_failure(&dm, "layers.1.", "num_hidden_layers");
    dm = (damage){.variant = "fp32", .edit = edit_kv_heads};
    expect_load_failure(&dm, "num_key_value_heads", NULL);
    dm = (damage){.variant = "fp32", .edit = edit_no_head_dim};
    expect_load_failure(&dm, "head_dim", "missing");
    dm = (damage){.variant = "fp32", .edit = edit_rope_type};
    expect_load_failure(&dm, "rope_type", NULL);
    dm = (damage){.variant = "fp32", .edit = edit_causal};
    expect_load_failure(&dm, "is_causal", NULL);
}

/* An undamaged copy loads (so the copies above fail for their damage only), and
 * the yarn_legacy fixture without its flag computes different logits: the flag
 * is honoured, and the fixture can tell. */
static void edit_drop_legacy(json_t *c) { json_object_del(json_object_get(c, "dflash_config"), "legacy_yarn_attention_factor"); }

static void test_copy_and_legacy_flag(void **state) {
    (void)state;
    ddt_drafter_head *h = open_head();
    for (int k = 0; k < 2; k++) {
        char dir[] = "/tmp/ddt_drafter_ok_XXXXXX";
        assert_non_null(mkdtemp(dir));
        damage dm = {.variant = "yarn_legacy", .edit = k == 0 ? NULL : edit_drop_legacy};
        make_copy(dir, &dm);
        ddt_drafter *d = load_drafter_dir(dir, h, 16, 2);
        remove_copy(dir); /* the mapping stays valid after unlink */
        const ddt_drafter_config *c = ddt_drafter_get_config(d);
        float f = ddt_drafter_config_rope_attention_factor(c);
        float want = k == 0 ? 1.0f + 0.1f * logf(4.0f) : 1.0f;
        assert_true(fabsf(f - want) < 1e-6f);
        reference r;
        reference_load("yarn_legacy", ddt_drafter_feature_dim(d), ddt_drafter_vocab(d), ddt_drafter_block_size(d), &r);
        append_range(d, &r, 0, r.ctx_len[0], 64);
        float *l = draft(d, r.bonus[0]);
        double e = norm_err(l, r.logits[0], (size_t)(r.L - 1) * r.V);
        printf("  yarn_legacy copy %s the flag: error %.3g\n", k == 0 ? "with" : "without", e);
        if (k == 0) assert_true(e <= TOL);
        else assert_true(e > 1e-2);
        free(l);
        reference_free(&r);
        ddt_drafter_free(d);
    }
    ddt_drafter_head_close(h);
}

/* The RoPE attention factor each config layout gives (the parse itself:
 * tests/io/test_drafter_config.c). */
static void test_config_rope(void **state) {
    (void)state;
    ddt_drafter_config c;
    ddt_error err = {0};
    /* transformers 5 layout: an explicit attention_factor wins */
    const char *v5 = "{\"architectures\":[\"DFlashDraftModel\"],\"hidden_size\":64,\"num_hidden_layers\":1,"
                     "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":8,\"intermediate_size\":16,"
                     "\"rms_norm_eps\":1e-5,\"block_size\":16,\"mask_token_id\":5,\"target_layer_ids\":[1,2,3],"
                     "\"rope_parameters\":{\"rope_type\":\"yarn\",\"rope_theta\":50000,\"factor\":64,"
                     "\"original_max_position_embeddings\":4096,\"attention_factor\":1.25}}";
    assert_int_equal(ddt_drafter_config_parse(v5, strlen(v5), "v5.json", &c, &err), DDT_OK);
    assert_true(fabsf(ddt_drafter_config_rope_attention_factor(&c) - 1.25f) < 1e-7f);
    /* Kimi-style: mscale == mscale_all_dim gives 1.0; the legacy flag gives 0.1 ln 64 + 1 */
    const char *kimi = "{\"architectures\":[\"DFlashDraftModel\"],\"hidden_size\":64,\"num_hidden_layers\":1,"
                       "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"head_dim\":8,\"intermediate_size\":16,"
                       "\"rms_norm_eps\":1e-5,\"block_size\":8,\"rope_theta\":50000,"
                       "\"rope_scaling\":{\"type\":\"yarn\",\"factor\":64,\"original_max_position_embeddings\":4096,"
                       "\"beta_fast\":1,\"beta_slow\":1,\"mscale\":1,\"mscale_all_dim\":1},"
                       "\"dflash_config\":{\"mask_token_id\":7,\"target_layer_ids\":[1],\"block_size\":16%s}}";
    char buf[2048];
    snprintf(buf, sizeof buf, kimi, "");
    assert_int_equal(ddt_drafter_config_parse(buf, strlen(buf), "k.json", &c, &err), DDT_OK);
    assert_true(fabsf(ddt_drafter_config_rope_attention_factor(&c) - 1.0f) < 1e-7f);
    snprintf(buf, sizeof buf, kimi, ",\"legacy_yarn_attention_factor\":true");
    assert_int_equal(ddt_drafter_config_parse(buf, strlen(buf), "k.json", &c, &err), DDT_OK);
    assert_true(fabsf(ddt_drafter_config_rope_attention_factor(&c) - (1.0f + 0.1f * logf(64.0f))) < 1e-6f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_fp32),
        cmocka_unit_test(test_fixture_yarn_legacy),
        cmocka_unit_test(test_append_paths_agree),
        cmocka_unit_test(test_rollback),
        cmocka_unit_test(test_with_cpu_target),
        cmocka_unit_test(test_call_errors),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_copy_and_legacy_flag),
        cmocka_unit_test(test_config_rope),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
