/*
 * drafter_config.c — the DFlash drafter's config.json reader (see
 * drafter_config.h).
 */
#include "io/drafter_config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* head_dim <= DDT_DRAFTER_MAX_HEAD_DIM also bounds it by the RoPE code's
 * DDT_ROPE_MAX_DIM (a static assertion in model/drafter_desc.c). */

/* Integer field `key` of obj into *out (must be in [lo, hi]); absent: *found false. */
static ddt_status json_int_field(const json_t *obj, const char *key, const char *where, const char *label,
                                 int64_t lo, int64_t hi, int32_t *out, bool *found, ddt_error *err) {
    json_t *v = json_object_get(obj, key);
    if (found) *found = v != NULL && !json_is_null(v);
    if (!v || json_is_null(v)) {
        if (found) return DDT_OK;
        return ddt_fail(err, DDT_ERR_FORMAT, "%s: field %s is missing", where, label);
    }
    if (!json_is_integer(v))
        return ddt_fail(err, DDT_ERR_FORMAT, "%s: field %s is not an integer", where, label);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return ddt_fail(err, DDT_ERR_FORMAT, "%s: field %s = %lld outside %lld..%lld", where, label, (long long)x,
                        (long long)lo, (long long)hi);
    *out = (int32_t)x;
    return DDT_OK;
}

/* Number field (integer or real); absent: *found false (or an error when found == NULL). */
static ddt_status json_num_field(const json_t *obj, const char *key, const char *where, const char *label,
                                 double *out, bool *found, ddt_error *err) {
    json_t *v = json_object_get(obj, key);
    if (found) *found = v != NULL && !json_is_null(v);
    if (!v || json_is_null(v)) {
        if (found) return DDT_OK;
        return ddt_fail(err, DDT_ERR_FORMAT, "%s: field %s is missing", where, label);
    }
    if (!json_is_number(v)) return ddt_fail(err, DDT_ERR_FORMAT, "%s: field %s is not a number", where, label);
    double x = json_number_value(v);
    if (!isfinite(x)) return ddt_fail(err, DDT_ERR_FORMAT, "%s: field %s is not finite", where, label);
    *out = x;
    return DDT_OK;
}

/* The DFlash reference reads some keys from dflash_config first, then the top level. */
static const json_t *pick(const json_t *dfc, const json_t *root, const char *key, const char **label,
                          char *buf, size_t bufsz) {
    if (dfc && json_object_get(dfc, key)) {
        snprintf(buf, bufsz, "dflash_config.%s", key);
        *label = buf;
        return dfc;
    }
    *label = key;
    return root;
}

/* A field that must be absent or equal the plain behaviour this engine implements. */
static ddt_status check_default_num(const json_t *obj, const char *key, const char *where, const char *label,
                                    double want, bool zero_ok, ddt_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return DDT_OK;
    if (!json_is_number(v)) return ddt_fail(err, DDT_ERR_FORMAT, "%s: field %s is not a number", where, label);
    double x = json_number_value(v);
    if (x == want || (zero_ok && x == 0)) return DDT_OK;
    return ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s: field %s = %g is not supported (only %g)", where, label, x, want);
}

static ddt_status check_false(const json_t *obj, const char *key, const char *where, const char *label,
                              ddt_error *err) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v) || json_is_false(v)) return DDT_OK;
    if (!json_is_boolean(v)) return ddt_fail(err, DDT_ERR_FORMAT, "%s: field %s is not a boolean", where, label);
    return ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s: field %s = true is not supported", where, label);
}

static ddt_status parse_rope(const json_t *root, const json_t *dfc, const char *where, ddt_drafter_config *c,
                             ddt_error *err) {
    ddt_status st;
    double x;
    bool found;
    /* transformers 5 writes rope_parameters {rope_type, rope_theta, ...}; older files
     * write rope_theta + rope_scaling. */
    const json_t *rp = json_object_get(root, "rope_parameters");
    const char *sec = "rope_parameters";
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp)) return ddt_fail(err, DDT_ERR_FORMAT, "%s: field rope_parameters is not an object", where);
        if ((st = json_num_field(rp, "rope_theta", where, "rope_parameters.rope_theta", &x, &found, err)) != DDT_OK)
            return st;
        if (!found && (st = json_num_field(root, "rope_theta", where, "rope_theta", &x, NULL, err)) != DDT_OK) return st;
    } else {
        if ((st = json_num_field(root, "rope_theta", where, "rope_theta", &x, NULL, err)) != DDT_OK) return st;
        rp = json_object_get(root, "rope_scaling");
        sec = "rope_scaling";
        if (rp && !json_is_null(rp) && !json_is_object(rp))
            return ddt_fail(err, DDT_ERR_FORMAT, "%s: field rope_scaling is not an object", where);
        if (rp && json_is_null(rp)) rp = NULL;
    }
    if (!(x > 1.0) || x > 1e30) return ddt_fail(err, DDT_ERR_FORMAT, "%s: field rope_theta = %g must be > 1", where, x);
    c->rope_theta = (float)x;

    json_t *lg = dfc ? json_object_get(dfc, "legacy_yarn_attention_factor") : NULL;
    if (lg && !json_is_null(lg)) {
        if (!json_is_boolean(lg))
            return ddt_fail(err, DDT_ERR_FORMAT, "%s: field dflash_config.legacy_yarn_attention_factor is not a boolean",
                            where);
        c->legacy_yarn_attention_factor = json_is_true(lg);
    }
    const char *type = "default";
    if (rp) {
        json_t *t = json_object_get(rp, "rope_type");
        if (!t) t = json_object_get(rp, "type");
        if (t && !json_is_string(t)) return ddt_fail(err, DDT_ERR_FORMAT, "%s: field %s.rope_type is not a string", where, sec);
        if (t) type = json_string_value(t);
    }
    if (strcmp(type, "default") == 0) {
        if (c->legacy_yarn_attention_factor)
            return ddt_fail(err, DDT_ERR_FORMAT,
                            "%s: dflash_config.legacy_yarn_attention_factor is set but %s is not yarn", where, sec);
        return DDT_OK;
    }
    if (strcmp(type, "yarn") != 0)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s: field %s.rope_type \"%.32s\" is not supported (default or yarn)",
                        where, sec, type);
    char lab[64];
    c->has_yarn = true;
    snprintf(lab, sizeof lab, "%s.factor", sec);
    if ((st = json_num_field(rp, "factor", where, lab, &x, NULL, err)) != DDT_OK) return st;
    if (!(x >= 1.0) || x > 1e6) return ddt_fail(err, DDT_ERR_FORMAT, "%s: field %s = %g must be in 1..1e6", where, lab, x);
    c->yarn_factor = (float)x;
    snprintf(lab, sizeof lab, "%s.original_max_position_embeddings", sec);
    if ((st = json_num_field(rp, "original_max_position_embeddings", where, lab, &x, NULL, err)) != DDT_OK) return st;
    if (!(x >= 1.0) || x > 1e12) return ddt_fail(err, DDT_ERR_FORMAT, "%s: field %s = %g must be >= 1", where, lab, x);
    c->yarn_original_max_position = (float)x;
    static const char *const opt[] = {"beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor"};
    float *dst[] = {&c->yarn_beta_fast, &c->yarn_beta_slow, &c->yarn_mscale, &c->yarn_mscale_all_dim,
                    &c->yarn_attention_factor};
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++) {
        snprintf(lab, sizeof lab, "%s.%s", sec, opt[i]);
        if ((st = json_num_field(rp, opt[i], where, lab, &x, &found, err)) != DDT_OK) return st;
        if (!found) continue;
        if (x < 0 || x > 1e6) return ddt_fail(err, DDT_ERR_FORMAT, "%s: field %s = %g out of range", where, lab, x);
        *dst[i] = (float)x;
    }
    json_t *tr = json_object_get(rp, "truncate");
    if (tr && !json_is_null(tr) && !json_is_true(tr))
        return ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s: field %s.truncate must be true (the only supported YaRN ramp)",
                        where, sec);
    if (c->legacy_yarn_attention_factor && c->yarn_attention_factor > 0)
        return ddt_fail(err, DDT_ERR_FORMAT,
                        "%s: dflash_config.legacy_yarn_attention_factor conflicts with %s.attention_factor", where, sec);
    return DDT_OK;
}

ddt_status ddt_drafter_config_parse(const char *text, size_t len, const char *where, ddt_drafter_config *c,
                                    ddt_error *err) {
    if (!text || !c) return ddt_fail(err, DDT_ERR_INVALID, "ddt_drafter_config_parse: NULL argument");
    if (!where) where = "config.json";
    memset(c, 0, sizeof *c);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return ddt_fail(err, DDT_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", where, jerr.text, jerr.line);
    ddt_status st = DDT_OK;
    char lb[96];
    const char *label;
    const json_t *src;
    bool found;
    if (!json_is_object(root)) {
        st = ddt_fail(err, DDT_ERR_FORMAT, "%s: not a JSON object", where);
        goto out;
    }
    json_t *arch = json_object_get(root, "architectures");
    bool is_dflash = false;
    if (json_is_array(arch))
        for (size_t i = 0; i < json_array_size(arch); i++) {
            const char *a = json_string_value(json_array_get(arch, i));
            if (a && strcmp(a, "DFlashDraftModel") == 0) is_dflash = true;
        }
    if (!is_dflash) {
        st = ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s: field architectures does not list \"DFlashDraftModel\"", where);
        goto out;
    }
    json_t *dfc = json_object_get(root, "dflash_config");
    if (dfc && json_is_null(dfc)) dfc = NULL;
    if (dfc && !json_is_object(dfc)) {
        st = ddt_fail(err, DDT_ERR_FORMAT, "%s: field dflash_config is not an object", where);
        goto out;
    }
#define INT_REQ(key, lo, hi, dst)                                                                  \
    if ((st = json_int_field(root, key, where, key, lo, hi, dst, NULL, err)) != DDT_OK) goto out
    INT_REQ("hidden_size", 1, 1 << 20, &c->hidden_size);
    INT_REQ("num_hidden_layers", 1, 1024, &c->num_hidden_layers);
    INT_REQ("num_attention_heads", 1, 4096, &c->num_attention_heads);
    INT_REQ("num_key_value_heads", 1, 4096, &c->num_key_value_heads);
    INT_REQ("head_dim", 2, DDT_DRAFTER_MAX_HEAD_DIM, &c->head_dim);
    INT_REQ("intermediate_size", 1, 1 << 22, &c->intermediate_size);
#undef INT_REQ
    if (c->num_attention_heads % c->num_key_value_heads != 0) {
        st = ddt_fail(err, DDT_ERR_FORMAT, "%s: field num_key_value_heads %d does not divide num_attention_heads %d",
                      where, c->num_key_value_heads, c->num_attention_heads);
        goto out;
    }
    if (c->head_dim % 2 != 0) {
        st = ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s: field head_dim %d must be even (RoPE over the whole head)", where,
                      c->head_dim);
        goto out;
    }
    double x;
    if ((st = json_num_field(root, "rms_norm_eps", where, "rms_norm_eps", &x, NULL, err)) != DDT_OK) goto out;
    if (!(x > 0) || x > 1) {
        st = ddt_fail(err, DDT_ERR_FORMAT, "%s: field rms_norm_eps = %g must be in (0, 1]", where, x);
        goto out;
    }
    c->rms_norm_eps = (float)x;

    src = pick(dfc, root, "block_size", &label, lb, sizeof lb);
    if ((st = json_int_field(src, "block_size", where, label, 2, DDT_DRAFTER_MAX_BLOCK, &c->block_size, NULL, err)) !=
        DDT_OK)
        goto out;
    src = pick(dfc, root, "mask_token_id", &label, lb, sizeof lb);
    if ((st = json_int_field(src, "mask_token_id", where, label, 0, INT32_MAX, &c->mask_token_id, NULL, err)) != DDT_OK)
        goto out;
    c->num_target_layers = -1;
    if ((st = json_int_field(root, "num_target_layers", where, "num_target_layers", 1, 1 << 20, &c->num_target_layers,
                             &found, err)) != DDT_OK)
        goto out;
    if (!found) c->num_target_layers = -1;
    c->vocab_size = -1;
    if ((st = json_int_field(root, "vocab_size", where, "vocab_size", 1, INT32_MAX, &c->vocab_size, &found, err)) !=
        DDT_OK)
        goto out;
    if (!found) c->vocab_size = -1;

    src = pick(dfc, root, "target_layer_ids", &label, lb, sizeof lb);
    json_t *ids = json_object_get(src, "target_layer_ids");
    if (!ids || json_is_null(ids)) {
        st = ddt_fail(err, DDT_ERR_FORMAT, "%s: field dflash_config.target_layer_ids is missing", where);
        goto out;
    }
    if (!json_is_array(ids) || json_array_size(ids) == 0 || json_array_size(ids) > DDT_DRAFTER_MAX_TARGET_LAYERS) {
        st = ddt_fail(err, DDT_ERR_FORMAT, "%s: field %s must be an array of 1..%d layer ids", where, label,
                      DDT_DRAFTER_MAX_TARGET_LAYERS);
        goto out;
    }
    c->n_target_layers = (int32_t)json_array_size(ids);
    for (int32_t i = 0; i < c->n_target_layers; i++) {
        json_t *v = json_array_get(ids, (size_t)i);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        int64_t hi = c->num_target_layers > 0 ? c->num_target_layers - 1 : (1 << 20);
        if (id < 0 || id > hi) {
            st = ddt_fail(err, DDT_ERR_FORMAT, "%s: field %s[%d] is not a layer id in 0..%lld", where, label, i,
                          (long long)hi);
            goto out;
        }
        c->target_layer_ids[i] = (int32_t)id;
    }

    /* Variants of the architecture this engine does not implement: refuse them by name. */
    json_t *act = json_object_get(root, "hidden_act");
    if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0)) {
        st = ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s: field hidden_act must be \"silu\"", where);
        goto out;
    }
    if ((st = check_false(root, "attention_bias", where, "attention_bias", err)) != DDT_OK) goto out;
    if ((st = check_false(root, "use_sliding_window", where, "use_sliding_window", err)) != DDT_OK) goto out;
    src = pick(dfc, root, "is_causal", &label, lb, sizeof lb);
    if ((st = check_false(src, "is_causal", where, label, err)) != DDT_OK) goto out;
    if ((st = check_default_num(root, "partial_rotary_factor", where, "partial_rotary_factor", 1.0, false, err)) !=
        DDT_OK)
        goto out;
    static const char *const unit_keys[] = {"input_embedding_scale", "output_multiplier"};
    for (size_t i = 0; i < 2; i++) {
        src = pick(dfc, root, unit_keys[i], &label, lb, sizeof lb);
        if ((st = check_default_num(src, unit_keys[i], where, label, 1.0, false, err)) != DDT_OK) goto out;
    }
    src = pick(dfc, root, "final_logit_softcapping", &label, lb, sizeof lb);
    if ((st = check_default_num(src, "final_logit_softcapping", where, label, 0.0, true, err)) != DDT_OK) goto out;
    json_t *lt = json_object_get(root, "layer_types");
    if (lt && !json_is_null(lt)) {
        bool ok = json_is_array(lt);
        for (size_t i = 0; ok && i < json_array_size(lt); i++) {
            const char *s = json_string_value(json_array_get(lt, i));
            ok = s && strcmp(s, "full_attention") == 0;
        }
        if (!ok) {
            st = ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s: field layer_types: only \"full_attention\" layers are supported",
                          where);
            goto out;
        }
    }
    st = parse_rope(root, dfc, where, c, err);
out:
    json_decref(root);
    return st;
}

ddt_status ddt_drafter_config_load(const char *path, ddt_drafter_config *cfg, ddt_error *err) {
    if (!path || !cfg) return ddt_fail(err, DDT_ERR_INVALID, "ddt_drafter_config_load: NULL argument");
    size_t pl = strlen(path);
    char file[4096];
    const char *tail = "config.json";
    bool is_file = pl >= strlen(tail) && strcmp(path + pl - strlen(tail), tail) == 0;
    int k = is_file ? snprintf(file, sizeof file, "%s", path) : snprintf(file, sizeof file, "%s/config.json", path);
    if (k < 0 || (size_t)k >= sizeof file) return ddt_fail(err, DDT_ERR_RANGE, "path too long: %s", path);
    FILE *f = fopen(file, "rb");
    if (!f) return ddt_fail(err, DDT_ERR_IO, "%s: cannot open", file);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            if (cap >= (size_t)16 << 20) {
                fclose(f);
                free(buf);
                return ddt_fail(err, DDT_ERR_RANGE, "%s: larger than 16 MiB", file);
            }
            size_t nc = cap ? cap * 2 : 4096;
            char *nb = realloc(buf, nc);
            if (!nb) {
                fclose(f);
                free(buf);
                return ddt_fail(err, DDT_ERR_NOMEM, "%s: out of memory", file);
            }
            buf = nb;
            cap = nc;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    bool bad = ferror(f) != 0;
    fclose(f);
    if (bad) {
        free(buf);
        return ddt_fail(err, DDT_ERR_IO, "%s: read error", file);
    }
    ddt_status st = ddt_drafter_config_parse(buf, n, file, cfg, err);
    free(buf);
    return st;
}

