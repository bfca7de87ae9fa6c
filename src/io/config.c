/*
 * config.c — reader of a Hugging Face config.json for DeepSeek-V3-architecture
 * targets (DeepSeek-V3, Kimi K2, Kimi K2.5/K2.6 with text_config), including
 * rope_scaling (YaRN) and quantization_config (FP8 block, compressed-tensors INT4).
 *
 * Every field is checked for presence, JSON type and range before the engine
 * sizes buffers from it, so a wrong config fails here with the field and file
 * named rather than later as a shape mismatch deep in the model.  Defaults are
 * those of DeepSeek's own configuration_deepseek.py (the remote code these
 * checkpoints are loaded with), where they differ from transformers' native
 * DeepseekV3Config: n_group/topk_group 1, first_k_dense_replace 0,
 * moe_layer_freq 1, norm_topk_prob false, routed_scaling_factor 1.
 * Architecture dimensions have no default: a checkpoint without them is broken.
 */
#include "io/config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/error.h"

/* Generous caps that keep every later size product far from overflow. */
#define DIM_MAX (1 << 24)
#define LAYERS_MAX (1 << 16)
#define CONFIG_FILE_MAX (16u << 20)

/* Compiled matching state, hung off cfg->priv. */
typedef struct cfg_priv {
    regex_t *ignore_re;   /* [n_ignore], valid where ignore_is_re[i] */
    bool *ignore_is_re;   /* [n_ignore] */
    int32_t n_targets;
    char **targets;       /* [n_targets] compressed-tensors config_groups targets */
    regex_t *target_re;   /* [n_targets] */
    bool *target_is_re;   /* [n_targets] */
} cfg_priv;

/* Where a lookup happens: file name and the JSON section ("" or "text_config."). */
typedef struct cfg_ctx {
    const char *where;
    const char *sec;
    ddt_error *err;
} cfg_ctx;

enum { OPTIONAL = 0, REQUIRED = 1 };

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

static ddt_status missing(cfg_ctx *c, const char *key) {
    return ddt_fail(c->err, DDT_ERR_FORMAT, "file %s: field %s%s is missing", c->where, c->sec, key);
}

static ddt_status wrong_type(cfg_ctx *c, const char *key, const char *want, const json_t *v) {
    return ddt_fail(c->err, DDT_ERR_FORMAT, "file %s: field %s%s: expected %s, found %s", c->where,
                    c->sec, key, want, json_type_name(v));
}

/*
 * Integer field in [lo, hi].  Absent: an error when REQUIRED, else *out = def.
 * null: *out = null_def when null_ok (HF writes null for "none", e.g. q_lora_rank),
 * else a type error.  An integral real (2.0) is accepted, as Python would.
 */
static ddt_status get_int(cfg_ctx *c, json_t *obj, const char *key, int required, bool null_ok,
                          int32_t def, int32_t null_def, int64_t lo, int64_t hi, int32_t *out) {
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required) return missing(c, key);
        *out = def;
        return DDT_OK;
    }
    if (json_is_null(v)) {
        if (!null_ok) return wrong_type(c, key, "an integer", v);
        *out = null_def;
        return DDT_OK;
    }
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (!(d == floor(d)) || d < -9e18 || d > 9e18) return wrong_type(c, key, "an integer", v);
        x = (int64_t)d;
    } else {
        return wrong_type(c, key, "an integer", v);
    }
    if (x < lo || x > hi)
        return ddt_fail(c->err, DDT_ERR_FORMAT, "file %s: field %s%s = %lld, must be in [%lld, %lld]",
                        c->where, c->sec, key, (long long)x, (long long)lo, (long long)hi);
    *out = (int32_t)x;
    return DDT_OK;
}

/* Real field, finite, in [lo, hi]; integers are accepted (50000 for rope_theta). */
static ddt_status get_real(cfg_ctx *c, json_t *obj, const char *key, int required, double def,
                           double lo, double hi, float *out) {
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required) return missing(c, key);
        *out = (float)def;
        return DDT_OK;
    }
    if (!json_is_number(v)) return wrong_type(c, key, "a number", v);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi)
        return ddt_fail(c->err, DDT_ERR_FORMAT, "file %s: field %s%s = %g, must be in [%g, %g]",
                        c->where, c->sec, key, d, lo, hi);
    *out = (float)d;
    return DDT_OK;
}

static ddt_status get_bool(cfg_ctx *c, json_t *obj, const char *key, bool def, bool *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return DDT_OK;
    }
    if (!json_is_boolean(v)) return wrong_type(c, key, "a boolean", v);
    *out = json_is_true(v);
    return DDT_OK;
}

/* String field copied into buf[cap]; absent or null -> def. */
static ddt_status get_str(cfg_ctx *c, json_t *obj, const char *key, int required, const char *def,
                          char *buf, size_t cap) {
    json_t *v = json_object_get(obj, key);
    const char *s = def;
    if (!v || json_is_null(v)) {
        if (required) return missing(c, key);
    } else if (!json_is_string(v)) {
        return wrong_type(c, key, "a string", v);
    } else {
        s = json_string_value(v);
    }
    if (strlen(s) >= cap)
        return ddt_fail(c->err, DDT_ERR_FORMAT, "file %s: field %s%s: \"%.40s...\" longer than %zu",
                        c->where, c->sec, key, s, cap - 1);
    memcpy(buf, s, strlen(s) + 1);
    return DDT_OK;
}

/* bos/eos: an integer, a list of integers (first is used) or null/absent (-1). */
static ddt_status get_token_id(cfg_ctx *c, json_t *obj, const char *key, int32_t *out) {
    json_t *v = json_object_get(obj, key);
    if (json_is_array(v)) {
        if (json_array_size(v) == 0) {
            *out = -1;
            return DDT_OK;
        }
        json_t *wrap = json_object();
        if (!wrap || json_object_set(wrap, key, json_array_get(v, 0)) != 0) {
            json_decref(wrap);
            return ddt_fail(c->err, DDT_ERR_NOMEM, "file %s: out of memory", c->where);
        }
        ddt_status st = get_int(c, wrap, key, OPTIONAL, true, -1, -1, 0, INT32_MAX, out);
        json_decref(wrap);
        return st;
    }
    return get_int(c, obj, key, OPTIONAL, true, -1, -1, 0, INT32_MAX, out);
}

/* ---- ignore lists and targets ------------------------------------------- */

static void priv_free(cfg_priv *p, int32_t n_ignore) {
    if (!p) return;
    for (int32_t i = 0; p->ignore_is_re && i < n_ignore; i++)
        if (p->ignore_is_re[i]) regfree(&p->ignore_re[i]);
    for (int32_t i = 0; p->target_is_re && i < p->n_targets; i++)
        if (p->target_is_re[i]) regfree(&p->target_re[i]);
    for (int32_t i = 0; p->targets && i < p->n_targets; i++) free(p->targets[i]);
    free(p->ignore_re);
    free(p->ignore_is_re);
    free(p->targets);
    free(p->target_re);
    free(p->target_is_re);
    free(p);
}

void ddt_config_free(ddt_model_config *cfg) {
    if (!cfg) return;
    priv_free(cfg->priv, cfg->n_ignore);
    for (int32_t i = 0; cfg->ignore && i < cfg->n_ignore; i++) free(cfg->ignore[i]);
    free(cfg->ignore);
    cfg->priv = NULL;
    cfg->ignore = NULL;
    cfg->n_ignore = 0;
}

/* A pattern glibc's regcomp can compile in bounded memory: it copies the operand of
 * every repetition ("a+" becomes "aa*", "a{n}" n copies), so stacked repetitions
 * ("a*++++", "(a+)+" nested deeply) or big intervals blow up exponentially; a
 * hostile config.json once took 2 GB this way (found by fuzz_config).  The
 * modules_to_not_convert patterns of real checkpoints (".*lm_head", ".*mlp.gate$")
 * need none of that.  NULL when acceptable, else why not. */
#define DDT_RE_MAX_LEN 512
#define DDT_RE_MAX_REPEATS 16
#define DDT_RE_MAX_INTERVAL 64
#define DDT_RE_MAX_EXPANSION 4096
static const char *regex_too_complex(const char *p) {
    size_t len = strlen(p);
    if (len > DDT_RE_MAX_LEN) return "longer than 512 characters";
    int repeats = 0;
    long expansion = 1;
    bool prev_repeat = false;
    for (size_t i = 0; i < len; i++) {
        const char ch = p[i];
        if (ch == '\\' && i + 1 < len) { /* an escaped character is a literal */
            i++;
            prev_repeat = false;
            continue;
        }
        const bool repeat = ch == '*' || ch == '+' || ch == '?' || ch == '{';
        if (repeat) {
            if (prev_repeat) return "a repetition of a repetition";
            if (++repeats > DDT_RE_MAX_REPEATS) return "more than 16 repetition operators";
            long copies = ch == '+' ? 2 : 1; /* copies of the operand regcomp makes */
            if (ch == '{') { /* {m}, {m,}, {m,n}: every bound small */
                size_t j = i + 1;
                long v = 0, top = 0;
                for (; j < len && p[j] != '}'; j++) {
                    if (p[j] >= '0' && p[j] <= '9') {
                        v = v * 10 + (p[j] - '0');
                        if (v > DDT_RE_MAX_INTERVAL) return "an interval bound over 64";
                        if (v > top) top = v;
                    } else {
                        v = 0;
                    }
                }
                copies = top + 1;
                i = j; /* past the interval (regcomp reports a malformed one) */
            }
            /* as if every repetition were nested in the next: a bound whatever the groups */
            expansion *= copies;
            if (expansion > DDT_RE_MAX_EXPANSION) return "repetitions that expand it over 4096 times";
        }
        prev_repeat = repeat;
    }
    return NULL;
}

/* Compile "re:<pat>" as POSIX ERE anchored at the start ("^(pat)"), Python re.match
 * semantics; *is_re false for plain names. */
static ddt_status compile_entry(cfg_ctx *c, const char *field, const char *s, regex_t *re,
                                bool *is_re) {
    *is_re = false;
    if (strncmp(s, "re:", 3) != 0) return DDT_OK;
    const char *why_not = regex_too_complex(s + 3);
    if (why_not)
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "file %s: field %s: pattern \"%.80s\" is too complex (%s)",
                        c->where, field, s, why_not);
    size_t n = strlen(s + 3), cap;
    if (!ddt_add_size(n, 4, &cap)) return ddt_fail(c->err, DDT_ERR_NOMEM, "file %s: out of memory", c->where);
    char *pat = malloc(cap);
    if (!pat) return ddt_fail(c->err, DDT_ERR_NOMEM, "file %s: out of memory", c->where);
    snprintf(pat, cap, "^(%s)", s + 3);
    int rc = regcomp(re, pat, REG_EXTENDED | REG_NOSUB);
    free(pat);
    if (rc != 0) {
        char why[128];
        regerror(rc, re, why, sizeof why);
        return ddt_fail(c->err, DDT_ERR_FORMAT,
                        "file %s: field %s: pattern \"%.80s\" is not a POSIX extended regex: %s",
                        c->where, field, s, why);
    }
    *is_re = true;
    return DDT_OK;
}

/* Append the strings of array `arr` (null or absent = nothing) to cfg->ignore. */
static ddt_status add_ignores(cfg_ctx *c, json_t *qc, const char *key, ddt_model_config *cfg) {
    json_t *arr = json_object_get(qc, key);
    if (!arr || json_is_null(arr)) return DDT_OK;
    char field[96];
    snprintf(field, sizeof field, "%squantization_config.%s", c->sec, key);
    if (!json_is_array(arr))
        return ddt_fail(c->err, DDT_ERR_FORMAT, "file %s: field %s: expected an array, found %s",
                        c->where, field, json_type_name(arr));
    size_t n = json_array_size(arr);
    if (n > (size_t)(INT32_MAX / 2) - (size_t)cfg->n_ignore)
        return ddt_fail(c->err, DDT_ERR_FORMAT, "file %s: field %s: too many entries", c->where, field);
    char **grown = realloc(cfg->ignore, ((size_t)cfg->n_ignore + n + 1) * sizeof *grown);
    if (!grown) return ddt_fail(c->err, DDT_ERR_NOMEM, "file %s: out of memory", c->where);
    cfg->ignore = grown;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_string(v))
            return ddt_fail(c->err, DDT_ERR_FORMAT, "file %s: field %s[%zu]: expected a string, found %s",
                            c->where, field, i, json_type_name(v));
        char *copy = strdup(json_string_value(v));
        if (!copy) return ddt_fail(c->err, DDT_ERR_NOMEM, "file %s: out of memory", c->where);
        cfg->ignore[cfg->n_ignore++] = copy;
    }
    return DDT_OK;
}

static ddt_status compile_ignores(cfg_ctx *c, ddt_model_config *cfg, cfg_priv *p) {
    if (cfg->n_ignore == 0) return DDT_OK;
    p->ignore_re = ddt_calloc_array((size_t)cfg->n_ignore, sizeof *p->ignore_re);
    p->ignore_is_re = ddt_calloc_array((size_t)cfg->n_ignore, sizeof *p->ignore_is_re);
    if (!p->ignore_re || !p->ignore_is_re)
        return ddt_fail(c->err, DDT_ERR_NOMEM, "file %s: out of memory", c->where);
    for (int32_t i = 0; i < cfg->n_ignore; i++) {
        ddt_status st = compile_entry(c, "quantization_config ignore list", cfg->ignore[i],
                                      &p->ignore_re[i], &p->ignore_is_re[i]);
        if (st != DDT_OK) return st;
    }
    return DDT_OK;
}

/* ---- quantization_config ------------------------------------------------- */

static ddt_status parse_fp8(cfg_ctx *c, json_t *qc, ddt_model_config *cfg) {
    char fmt[16];
    ddt_status st;
    cfg_ctx q = *c;
    char sec[64];
    snprintf(sec, sizeof sec, "%squantization_config.", c->sec);
    q.sec = sec;
    if ((st = get_str(&q, qc, "fmt", OPTIONAL, "e4m3", fmt, sizeof fmt)) != DDT_OK) return st;
    if (strcmp(fmt, "e4m3") != 0)
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED, "file %s: field %sfmt = \"%s\": only e4m3 is supported",
                        c->where, sec, fmt);
    json_t *bs = json_object_get(qc, "weight_block_size");
    if (!bs || json_is_null(bs))
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED,
                        "file %s: field %sweight_block_size is missing: only block-scaled FP8 is "
                        "supported",
                        c->where, sec);
    if (!json_is_array(bs) || json_array_size(bs) != 2)
        return ddt_fail(c->err, DDT_ERR_FORMAT,
                        "file %s: field %sweight_block_size: expected an array of 2 integers",
                        c->where, sec);
    for (int i = 0; i < 2; i++) {
        json_t *v = json_array_get(bs, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) != 128)
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED,
                            "file %s: field %sweight_block_size[%d]: only 128 is supported", c->where,
                            sec, i);
        cfg->fp8_block[i] = 128;
    }
    cfg->quant = DDT_QUANT_FP8_BLOCK;
    if ((st = add_ignores(c, qc, "modules_to_not_convert", cfg)) != DDT_OK) return st;
    return add_ignores(c, qc, "ignored_layers", cfg);
}

static ddt_status parse_compressed(cfg_ctx *c, json_t *qc, ddt_model_config *cfg, cfg_priv *p) {
    char sec[64], field[160];
    snprintf(sec, sizeof sec, "%squantization_config.", c->sec);
    json_t *fmt = json_object_get(qc, "format");
    if (fmt && !json_is_null(fmt) && !json_is_string(fmt))
        return ddt_fail(c->err, DDT_ERR_FORMAT, "file %s: field %sformat: expected a string, found %s",
                        c->where, sec, json_type_name(fmt));
    json_t *groups = json_object_get(qc, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) == 0)
        return ddt_fail(c->err, DDT_ERR_FORMAT,
                        "file %s: field %sconfig_groups: missing or not a non-empty object", c->where,
                        sec);
    int32_t group_size = 0;
    const char *gname;
    json_t *g;
    json_object_foreach(groups, gname, g) {
        snprintf(field, sizeof field, "%sconfig_groups.%.40s", sec, gname);
        if (!json_is_object(g))
            return ddt_fail(c->err, DDT_ERR_FORMAT, "file %s: field %s: expected an object, found %s",
                            c->where, field, json_type_name(g));
        /* The format may sit at the top or (newer writers) in each group. */
        json_t *gf = json_object_get(g, "format");
        const char *f = json_is_string(gf) ? json_string_value(gf)
                        : json_is_string(fmt) ? json_string_value(fmt)
                                              : NULL;
        if (!f || strcmp(f, "pack-quantized") != 0)
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED,
                            "file %s: field %sformat = \"%s\": only pack-quantized is supported",
                            c->where, sec, f ? f : "(missing)");
        json_t *ia = json_object_get(g, "input_activations");
        if (ia && !json_is_null(ia))
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED,
                            "file %s: field %s.input_activations: only weight-only quantisation is "
                            "supported",
                            c->where, field);
        json_t *w = json_object_get(g, "weights");
        if (!json_is_object(w))
            return ddt_fail(c->err, DDT_ERR_FORMAT, "file %s: field %s.weights: missing or not an object",
                            c->where, field);
        cfg_ctx wc = *c;
        char wsec[200];
        snprintf(wsec, sizeof wsec, "%s.weights.", field);
        wc.sec = wsec;
        int32_t bits = 0, gs = 0;
        char type[16] = "", strategy[16] = "";
        bool sym = false;
        ddt_status st;
        if ((st = get_int(&wc, w, "num_bits", REQUIRED, false, 0, 0, 1, 64, &bits)) != DDT_OK) return st;
        if ((st = get_str(&wc, w, "type", REQUIRED, "", type, sizeof type)) != DDT_OK) return st;
        if ((st = get_bool(&wc, w, "symmetric", false, &sym)) != DDT_OK) return st;
        if ((st = get_str(&wc, w, "strategy", OPTIONAL, "group", strategy, sizeof strategy)) != DDT_OK)
            return st;
        if ((st = get_int(&wc, w, "group_size", REQUIRED, false, 0, 0, 1, DIM_MAX, &gs)) != DDT_OK)
            return st;
        if (bits != 4 || strcmp(type, "int") != 0 || !sym || strcmp(strategy, "group") != 0)
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED,
                            "file %s: field %s: %d-bit %s %s %s-wise weights; only 4-bit int "
                            "symmetric group-wise are supported",
                            c->where, wsec, (int)bits, type, sym ? "symmetric" : "asymmetric",
                            strategy);
        if (gs != 32)
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED,
                            "file %s: field %sgroup_size = %d: only 32 is supported", c->where, wsec,
                            (int)gs);
        if (group_size && gs != group_size)
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED,
                            "file %s: field %sgroup_size = %d differs from another group's %d",
                            c->where, wsec, (int)gs, (int)group_size);
        group_size = gs;

        json_t *tg = json_object_get(g, "targets");
        if (!json_is_array(tg))
            return ddt_fail(c->err, DDT_ERR_FORMAT, "file %s: field %s.targets: missing or not an array",
                            c->where, field);
        size_t nt = json_array_size(tg);
        if (nt > 4096)
            return ddt_fail(c->err, DDT_ERR_FORMAT, "file %s: field %s.targets: too many", c->where, field);
        size_t total = (size_t)p->n_targets + nt;
        char **t2 = realloc(p->targets, (total + 1) * sizeof *t2);
        if (!t2) return ddt_fail(c->err, DDT_ERR_NOMEM, "file %s: out of memory", c->where);
        p->targets = t2;
        for (size_t i = 0; i < nt; i++) {
            json_t *v = json_array_get(tg, i);
            if (!json_is_string(v))
                return ddt_fail(c->err, DDT_ERR_FORMAT,
                                "file %s: field %s.targets[%zu]: expected a string, found %s",
                                c->where, field, i, json_type_name(v));
            char *copy = strdup(json_string_value(v));
            if (!copy) return ddt_fail(c->err, DDT_ERR_NOMEM, "file %s: out of memory", c->where);
            p->targets[p->n_targets++] = copy;
        }
    }
    /* Compiled only once all are known: a regex_t must not move after regcomp. */
    if (p->n_targets > 0) {
        p->target_re = ddt_calloc_array((size_t)p->n_targets, sizeof *p->target_re);
        p->target_is_re = ddt_calloc_array((size_t)p->n_targets, sizeof *p->target_is_re);
        if (!p->target_re || !p->target_is_re)
            return ddt_fail(c->err, DDT_ERR_NOMEM, "file %s: out of memory", c->where);
        char tfield[96];
        snprintf(tfield, sizeof tfield, "%sconfig_groups.*.targets", sec);
        for (int32_t k = 0; k < p->n_targets; k++) {
            ddt_status st = compile_entry(c, tfield, p->targets[k], &p->target_re[k], &p->target_is_re[k]);
            if (st != DDT_OK) return st;
        }
    }
    cfg->quant = DDT_QUANT_INT4_PACK;
    cfg->int4_group = group_size;
    return add_ignores(c, qc, "ignore", cfg);
}

static ddt_status parse_quant(cfg_ctx *c, json_t *qc, ddt_model_config *cfg, cfg_priv *p) {
    cfg->quant = DDT_QUANT_NONE;
    if (!qc || json_is_null(qc)) return DDT_OK;
    if (!json_is_object(qc)) return wrong_type(c, "quantization_config", "an object", qc);
    char sec[64];
    snprintf(sec, sizeof sec, "%squantization_config.", c->sec);
    cfg_ctx q = *c;
    q.sec = sec;
    char method[32];
    ddt_status st = get_str(&q, qc, "quant_method", REQUIRED, "", method, sizeof method);
    if (st != DDT_OK) return st;
    if (strcmp(method, "fp8") == 0) st = parse_fp8(c, qc, cfg);
    else if (strcmp(method, "compressed-tensors") == 0) st = parse_compressed(c, qc, cfg, p);
    else
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED,
                        "file %s: field %squant_method = \"%s\": supported are \"fp8\" and "
                        "\"compressed-tensors\"",
                        c->where, sec, method);
    if (st != DDT_OK) return st;
    return compile_ignores(c, cfg, p);
}

/* ---- rope_scaling -------------------------------------------------------- */

static ddt_status parse_rope_scaling(cfg_ctx *c, json_t *rs, const char *key, ddt_model_config *cfg) {
    cfg->has_yarn = false;
    if (!rs || json_is_null(rs)) return DDT_OK;
    if (!json_is_object(rs)) return wrong_type(c, key, "an object", rs);
    char sec[64];
    snprintf(sec, sizeof sec, "%s%s.", c->sec, key);
    cfg_ctx r = *c;
    r.sec = sec;
    char type[32];
    ddt_status st;
    const char *tkey = json_object_get(rs, "rope_type") ? "rope_type" : "type";
    if ((st = get_str(&r, rs, tkey, OPTIONAL, "default", type, sizeof type)) != DDT_OK) return st;
    if (strcmp(type, "default") == 0) return DDT_OK;
    if (strcmp(type, "yarn") != 0)
        return ddt_fail(c->err, DDT_ERR_UNSUPPORTED,
                        "file %s: field %s%s = \"%s\": only yarn rope scaling is supported", c->where,
                        sec, tkey, type);
    cfg->has_yarn = true;
    if ((st = get_real(&r, rs, "factor", REQUIRED, 0, 1.0, 1e6, &cfg->yarn_factor)) != DDT_OK) return st;
    if ((st = get_real(&r, rs, "original_max_position_embeddings", REQUIRED, 0, 1.0, 1e9,
                       &cfg->yarn_original_max_position)) != DDT_OK)
        return st;
    if ((st = get_real(&r, rs, "beta_fast", OPTIONAL, 32.0, -1e6, 1e6, &cfg->yarn_beta_fast)) != DDT_OK)
        return st;
    if ((st = get_real(&r, rs, "beta_slow", OPTIONAL, 1.0, -1e6, 1e6, &cfg->yarn_beta_slow)) != DDT_OK)
        return st;
    if ((st = get_real(&r, rs, "mscale", OPTIONAL, 1.0, -1e6, 1e6, &cfg->yarn_mscale)) != DDT_OK) return st;
    return get_real(&r, rs, "mscale_all_dim", OPTIONAL, 0.0, -1e6, 1e6, &cfg->yarn_mscale_all_dim);
}

/* ---- the model fields ---------------------------------------------------- */

/* Bounded copy; only names already checked (or unused, for dense models) are cut. */
static void copy_name(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static ddt_status parse_model(cfg_ctx *c, json_t *m, ddt_model_config *cfg) {
    ddt_status st;
#define TRY(x)                          \
    do {                                \
        if ((st = (x)) != DDT_OK) return st; \
    } while (0)
    TRY(get_int(c, m, "hidden_size", REQUIRED, false, 0, 0, 1, DIM_MAX, &cfg->hidden_size));
    TRY(get_int(c, m, "num_hidden_layers", REQUIRED, false, 0, 0, 1, LAYERS_MAX, &cfg->num_hidden_layers));
    TRY(get_int(c, m, "num_attention_heads", REQUIRED, false, 0, 0, 1, DIM_MAX, &cfg->num_attention_heads));
    /* q_lora_rank must be written (null = no low-rank q): guessing 1536 when it is
     * absent would silently pick the wrong attention layout. */
    TRY(get_int(c, m, "q_lora_rank", REQUIRED, true, 0, 0, 0, DIM_MAX, &cfg->q_lora_rank));
    TRY(get_int(c, m, "kv_lora_rank", REQUIRED, false, 0, 0, 1, DIM_MAX, &cfg->kv_lora_rank));
    TRY(get_int(c, m, "qk_nope_head_dim", REQUIRED, false, 0, 0, 1, DIM_MAX, &cfg->qk_nope_head_dim));
    TRY(get_int(c, m, "qk_rope_head_dim", REQUIRED, false, 0, 0, 2, DIM_MAX, &cfg->qk_rope_head_dim));
    if (cfg->qk_rope_head_dim % 2 != 0)
        return ddt_fail(c->err, DDT_ERR_FORMAT,
                        "file %s: field %sqk_rope_head_dim = %d must be even (RoPE rotates pairs)",
                        c->where, c->sec, (int)cfg->qk_rope_head_dim);
    TRY(get_int(c, m, "v_head_dim", REQUIRED, false, 0, 0, 1, DIM_MAX, &cfg->v_head_dim));
    TRY(get_int(c, m, "vocab_size", REQUIRED, false, 0, 0, 1, INT32_MAX, &cfg->vocab_size));
    TRY(get_int(c, m, "intermediate_size", REQUIRED, false, 0, 0, 1, DIM_MAX, &cfg->intermediate_size));

    /* MLA has one shared latent KV; a num_key_value_heads, when written, must still
     * split the heads evenly or the file is inconsistent. */
    int32_t kv_heads;
    TRY(get_int(c, m, "num_key_value_heads", OPTIONAL, true, cfg->num_attention_heads,
                cfg->num_attention_heads, 1, DIM_MAX, &kv_heads));
    if (cfg->num_attention_heads % kv_heads != 0)
        return ddt_fail(c->err, DDT_ERR_FORMAT,
                        "file %s: field %snum_key_value_heads = %d does not divide "
                        "num_attention_heads = %d",
                        c->where, c->sec, (int)kv_heads, (int)cfg->num_attention_heads);

    TRY(get_int(c, m, "n_routed_experts", OPTIONAL, true, 0, 0, 0, 1 << 16, &cfg->n_routed_experts));
    TRY(get_int(c, m, "n_shared_experts", OPTIONAL, true, 0, 0, 0, 1 << 16, &cfg->n_shared_experts));
    TRY(get_int(c, m, "first_k_dense_replace", OPTIONAL, false, 0, 0, 0, cfg->num_hidden_layers,
                &cfg->first_k_dense_replace));
    TRY(get_int(c, m, "moe_layer_freq", OPTIONAL, false, 1, 1, 1, LAYERS_MAX, &cfg->moe_layer_freq));
    TRY(get_bool(c, m, "norm_topk_prob", false, &cfg->norm_topk_prob));
    TRY(get_real(c, m, "routed_scaling_factor", OPTIONAL, 1.0, 1e-6, 1e6, &cfg->routed_scaling_factor));
    /* Read wide so that a long unknown name is reported as unsupported, not cut. */
    char scoring[64], topk_method[64];
    TRY(get_str(c, m, "scoring_func", OPTIONAL, "sigmoid", scoring, sizeof scoring));
    TRY(get_str(c, m, "topk_method", OPTIONAL, "noaux_tc", topk_method, sizeof topk_method));
    copy_name(cfg->scoring_func, sizeof cfg->scoring_func, scoring);
    copy_name(cfg->topk_method, sizeof cfg->topk_method, topk_method);
    bool moe = cfg->n_routed_experts > 0;
    if (moe) {
        TRY(get_int(c, m, "moe_intermediate_size", REQUIRED, false, 0, 0, 1, DIM_MAX,
                    &cfg->moe_intermediate_size));
        TRY(get_int(c, m, "num_experts_per_tok", REQUIRED, false, 0, 0, 1, cfg->n_routed_experts,
                    &cfg->num_experts_per_tok));
        TRY(get_int(c, m, "n_group", OPTIONAL, true, 1, 1, 1, cfg->n_routed_experts, &cfg->n_group));
        if (cfg->n_routed_experts % cfg->n_group != 0)
            return ddt_fail(c->err, DDT_ERR_FORMAT,
                            "file %s: field %sn_group = %d does not divide n_routed_experts = %d",
                            c->where, c->sec, (int)cfg->n_group, (int)cfg->n_routed_experts);
        TRY(get_int(c, m, "topk_group", OPTIONAL, true, 1, 1, 1, cfg->n_group, &cfg->topk_group));
        /* Group-limited routing must leave at least k experts to choose from. */
        int64_t reachable = (int64_t)cfg->topk_group * (cfg->n_routed_experts / cfg->n_group);
        if (reachable < cfg->num_experts_per_tok)
            return ddt_fail(c->err, DDT_ERR_FORMAT,
                            "file %s: field %stopk_group = %d leaves %lld experts, fewer than "
                            "num_experts_per_tok = %d",
                            c->where, c->sec, (int)cfg->topk_group, (long long)reachable,
                            (int)cfg->num_experts_per_tok);
        if (strcmp(scoring, "sigmoid") != 0)
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED,
                            "file %s: field %sscoring_func = \"%s\": only sigmoid is supported",
                            c->where, c->sec, scoring);
        if (strcmp(topk_method, "noaux_tc") != 0 && strcmp(topk_method, "greedy") != 0)
            return ddt_fail(c->err, DDT_ERR_UNSUPPORTED,
                            "file %s: field %stopk_method = \"%s\": supported are noaux_tc and greedy",
                            c->where, c->sec, topk_method);
    } else {
        cfg->n_shared_experts = 0;
        cfg->n_group = 1;
        cfg->topk_group = 1;
    }

    TRY(get_real(c, m, "rms_norm_eps", OPTIONAL, 1e-6, 1e-30, 1.0, &cfg->rms_norm_eps));
    TRY(get_int(c, m, "max_position_embeddings", OPTIONAL, false, 4096, 0, 1, INT32_MAX,
                &cfg->max_position_embeddings));
    TRY(get_bool(c, m, "rope_interleave", true, &cfg->rope_interleave));

    /* Older files: rope_theta + rope_scaling; newer transformers: rope_parameters
     * holding both. */
    json_t *rs = json_object_get(m, "rope_scaling");
    json_t *rp = json_object_get(m, "rope_parameters");
    if ((!rs || json_is_null(rs)) && json_is_object(rp)) {
        cfg_ctx r = *c;
        char sec[64];
        snprintf(sec, sizeof sec, "%srope_parameters.", c->sec);
        r.sec = sec;
        json_t *th = json_object_get(rp, "rope_theta");
        TRY(get_real(th ? &r : c, th ? rp : m, "rope_theta", OPTIONAL, 10000.0, 1e-6, 1e12,
                     &cfg->rope_theta));
        TRY(parse_rope_scaling(c, rp, "rope_parameters", cfg));
    } else {
        TRY(get_real(c, m, "rope_theta", OPTIONAL, 10000.0, 1e-6, 1e12, &cfg->rope_theta));
        TRY(parse_rope_scaling(c, rs, "rope_scaling", cfg));
    }
#undef TRY
    return DDT_OK;
}

/* Architecture from `architectures`/`model_type`; *text is where the model
 * fields live (the root or text_config). */
static ddt_status pick_architecture(const char *where, json_t *root, ddt_model_config *cfg,
                                    json_t **text, const char **sec, ddt_error *err) {
    cfg_ctx c = {where, "", err};
    json_t *archs = json_object_get(root, "architectures");
    const char *arch = NULL;
    if (archs && !json_is_null(archs)) {
        if (!json_is_array(archs)) return wrong_type(&c, "architectures", "an array of strings", archs);
        if (json_array_size(archs) > 0) {
            json_t *a0 = json_array_get(archs, 0);
            if (!json_is_string(a0)) return wrong_type(&c, "architectures[0]", "a string", a0);
            arch = json_string_value(a0);
        }
    }
    char model_type[64];
    ddt_status st = get_str(&c, root, "model_type", OPTIONAL, "", model_type, sizeof model_type);
    if (st != DDT_OK) return st;
    if (!arch && model_type[0] == '\0')
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: field architectures (and model_type) is missing",
                        where);

    bool k25 = arch ? strcmp(arch, "KimiK25ForConditionalGeneration") == 0
                    : strcmp(model_type, "kimi_k25") == 0;
    bool v3 = arch ? strcmp(arch, "DeepseekV3ForCausalLM") == 0
                   : (strcmp(model_type, "deepseek_v3") == 0 || strcmp(model_type, "kimi_k2") == 0);
    if (v3 && model_type[0] && strcmp(model_type, "deepseek_v3") != 0 &&
        strcmp(model_type, "kimi_k2") != 0)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "file %s: architecture DeepseekV3ForCausalLM with model_type \"%s\" is not "
                        "supported (expected deepseek_v3 or kimi_k2)",
                        where, model_type);
    if (!k25 && !v3)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "file %s: architecture \"%s\" (model_type \"%s\") is not supported; supported: "
                        "DeepseekV3ForCausalLM (deepseek_v3, kimi_k2), "
                        "KimiK25ForConditionalGeneration",
                        where, arch ? arch : "(none)", model_type);
    const char *name = k25 ? "KimiK25ForConditionalGeneration" : "DeepseekV3ForCausalLM";
    snprintf(cfg->architecture, sizeof cfg->architecture, "%s", name);
    if (!k25) {
        cfg->tensor_prefix[0] = '\0';
        *text = root;
        *sec = "";
        return DDT_OK;
    }
    snprintf(cfg->tensor_prefix, sizeof cfg->tensor_prefix, "language_model.");
    json_t *tc = json_object_get(root, "text_config");
    if (!tc) return missing(&c, "text_config");
    if (!json_is_object(tc)) return wrong_type(&c, "text_config", "an object", tc);
    char tmt[64];
    cfg_ctx tcx = {where, "text_config.", err};
    if ((st = get_str(&tcx, tc, "model_type", OPTIONAL, "", tmt, sizeof tmt)) != DDT_OK) return st;
    if (tmt[0] && strcmp(tmt, "kimi_k2") != 0 && strcmp(tmt, "deepseek_v3") != 0)
        return ddt_fail(err, DDT_ERR_UNSUPPORTED,
                        "file %s: field text_config.model_type = \"%s\" is not supported (expected "
                        "kimi_k2 or deepseek_v3)",
                        where, tmt);
    *text = tc;
    *sec = "text_config.";
    return DDT_OK;
}

ddt_status ddt_config_parse(const char *text, size_t len, const char *where, ddt_model_config *cfg,
                            ddt_error *err) {
    if (!cfg) return ddt_fail(err, DDT_ERR_INVALID, "ddt_config_parse: cfg is NULL");
    memset(cfg, 0, sizeof *cfg);
    if (!where) where = "config.json";
    if (!text && len) return ddt_fail(err, DDT_ERR_INVALID, "file %s: NULL text", where);
    json_error_t jerr;
    json_t *root = json_loadb(text ? text : "", len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ddt_fail(err, DDT_ERR_FORMAT, "file %s: not valid JSON: %s (line %d)", where, jerr.text,
                        jerr.line);
    ddt_status st;
    cfg_priv *p = NULL;
    if (!json_is_object(root)) {
        st = ddt_fail(err, DDT_ERR_FORMAT, "file %s: top level is not a JSON object", where);
        goto done;
    }
    json_t *m = NULL;
    const char *sec = "";
    if ((st = pick_architecture(where, root, cfg, &m, &sec, err)) != DDT_OK) goto done;
    cfg_ctx c = {where, sec, err};
    cfg_ctx top = {where, "", err};
    if ((st = parse_model(&c, m, cfg)) != DDT_OK) goto done;

    /* These may sit at the top of a K2.5 file rather than in text_config. */
    json_t *src;
    src = json_object_get(m, "tie_word_embeddings") ? m : root;
    if ((st = get_bool(src == m ? &c : &top, src, "tie_word_embeddings", false,
                       &cfg->tie_word_embeddings)) != DDT_OK)
        goto done;
    src = json_object_get(m, "bos_token_id") ? m : root;
    if ((st = get_token_id(src == m ? &c : &top, src, "bos_token_id", &cfg->bos_token_id)) != DDT_OK)
        goto done;
    src = json_object_get(m, "eos_token_id") ? m : root;
    if ((st = get_token_id(src == m ? &c : &top, src, "eos_token_id", &cfg->eos_token_id)) != DDT_OK)
        goto done;

    p = calloc(1, sizeof *p);
    if (!p) {
        st = ddt_fail(err, DDT_ERR_NOMEM, "file %s: out of memory", where);
        goto done;
    }
    json_t *qc = json_object_get(m, "quantization_config");
    if (qc) st = parse_quant(&c, qc, cfg, p);
    else st = parse_quant(&top, json_object_get(root, "quantization_config"), cfg, p);

done:
    json_decref(root);
    if (st != DDT_OK) {
        priv_free(p, cfg->n_ignore);
        for (int32_t i = 0; cfg->ignore && i < cfg->n_ignore; i++) free(cfg->ignore[i]);
        free(cfg->ignore);
        memset(cfg, 0, sizeof *cfg);
        return st;
    }
    cfg->priv = p;
    return DDT_OK;
}

ddt_status ddt_config_load(const char *path, ddt_model_config *cfg, ddt_error *err) {
    if (!path || !cfg) return ddt_fail(err, DDT_ERR_INVALID, "ddt_config_load: NULL argument");
    memset(cfg, 0, sizeof *cfg);
    struct stat sb;
    if (stat(path, &sb) != 0) return ddt_fail(err, DDT_ERR_IO, "file %s: %s", path, strerror(errno));
    char *file = NULL;
    if (S_ISDIR(sb.st_mode)) {
        size_t n = strlen(path) + sizeof "/config.json";
        file = malloc(n);
        if (!file) return ddt_fail(err, DDT_ERR_NOMEM, "file %s: out of memory", path);
        snprintf(file, n, "%s/config.json", path);
    }
    const char *name = file ? file : path;
    ddt_status st = DDT_OK;
    char *text = NULL;
    FILE *f = fopen(name, "rb");
    if (!f) {
        st = ddt_fail(err, DDT_ERR_IO, "file %s: cannot open: %s", name, strerror(errno));
        goto out;
    }
    text = malloc(CONFIG_FILE_MAX);
    if (!text) {
        st = ddt_fail(err, DDT_ERR_NOMEM, "file %s: out of memory", name);
        goto out;
    }
    size_t len = fread(text, 1, CONFIG_FILE_MAX, f);
    if (ferror(f)) st = ddt_fail(err, DDT_ERR_IO, "file %s: read error", name);
    else if (len == CONFIG_FILE_MAX)
        st = ddt_fail(err, DDT_ERR_FORMAT, "file %s: larger than %u bytes, not a config", name,
                      CONFIG_FILE_MAX);
    if (st == DDT_OK) st = ddt_config_parse(text, len, name, cfg, err);
out:
    if (f) fclose(f);
    free(text);
    free(file);
    return st;
}

/* ---- queries --------------------------------------------------------------- */

static bool entry_matches(const char *entry, const regex_t *re, bool is_re, const char *name) {
    if (is_re) return regexec(re, name, 0, NULL, 0) == 0;
    return strcmp(entry, name) == 0;
}

/* Last dotted component of a module name. */
static const char *leaf(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Does any of (name, name without prefix, prefix + name) match the entry? */
static bool matches_any_form(const ddt_model_config *cfg, const char *entry, const regex_t *re,
                             bool is_re, const char *name, const char *bare, const char *full) {
    if (entry_matches(entry, re, is_re, name)) return true;
    if (!cfg->tensor_prefix[0]) return false;
    return entry_matches(entry, re, is_re, bare) || entry_matches(entry, re, is_re, full);
}

bool ddt_config_is_quantized(const ddt_model_config *cfg, const char *module) {
    if (!cfg || !module || cfg->quant == DDT_QUANT_NONE) return false;
    char name[512], full[600];
    int n = snprintf(name, sizeof name, "%s", module);
    if (n < 0 || (size_t)n >= sizeof name) return false;
    if (ends_with(name, ".weight")) name[strlen(name) - strlen(".weight")] = '\0';
    size_t plen = strlen(cfg->tensor_prefix);
    const char *bare = (plen && strncmp(name, cfg->tensor_prefix, plen) == 0) ? name + plen : name;
    snprintf(full, sizeof full, "%s%s", cfg->tensor_prefix, bare);

    const char *lf = leaf(bare);
    bool is_head = strcmp(bare, "lm_head") == 0;
    bool is_proj = ends_with(lf, "_proj") || strcmp(lf, "kv_a_proj_with_mqa") == 0;
    if (!is_proj && !is_head) return false; /* norms, embeddings, the router gate */
    if (cfg->quant == DDT_QUANT_FP8_BLOCK && is_head) return false;

    const cfg_priv *p = cfg->priv;
    for (int32_t i = 0; i < cfg->n_ignore; i++) {
        bool is_re = p && p->ignore_is_re && p->ignore_is_re[i];
        if (matches_any_form(cfg, cfg->ignore[i], is_re ? &p->ignore_re[i] : NULL, is_re, name, bare,
                             full))
            return false;
    }
    if (cfg->quant == DDT_QUANT_FP8_BLOCK) return true;

    /* compressed-tensors: only modules some group targets.  A target without a
     * dot and without "re:" is a class name; every module asked about here is a
     * Linear, so "Linear" matches it. */
    if (!p) return false;
    for (int32_t i = 0; i < p->n_targets; i++) {
        const char *t = p->targets[i];
        if (!p->target_is_re[i] && strchr(t, '.') == NULL && strcmp(t, "lm_head") != 0) {
            if (strcmp(t, "Linear") == 0) return true;
            continue;
        }
        if (matches_any_form(cfg, t, &p->target_re[i], p->target_is_re[i], name, bare, full))
            return true;
    }
    return false;
}

float ddt_config_softmax_scale(const ddt_model_config *cfg) {
    double scale = 1.0 / sqrt((double)(cfg->qk_nope_head_dim + cfg->qk_rope_head_dim));
    /* YaRN's attention-temperature correction, applied to the softmax scale when
     * mscale_all_dim is set (DeepSeek-V3 / HF yarn_get_mscale; 1 for factor <= 1). */
    if (cfg->has_yarn && cfg->yarn_mscale_all_dim != 0.0f && cfg->yarn_factor > 1.0f) {
        double m = 0.1 * (double)cfg->yarn_mscale_all_dim * log((double)cfg->yarn_factor) + 1.0;
        scale *= m * m;
    }
    return (float)scale;
}

bool ddt_config_layer_is_moe(const ddt_model_config *cfg, int32_t layer) {
    if (!cfg || layer < 0 || layer >= cfg->num_hidden_layers) return false;
    return cfg->n_routed_experts > 0 && layer >= cfg->first_k_dense_replace &&
           layer % cfg->moe_layer_freq == 0;
}
