/*
 * cmd_calibrate.c — `ddtree calibrate`: fit a drafter's draft calibration for a
 * target (core/calibration.h) and write it as the drafter folder's
 * draft_calibration.json, which generate / chat / serve then load by default.
 * Each prompt is decoded greedily for --max-tokens tokens with a draft at every
 * step (ddt_engine_calibration_data); the rank buckets' weights are fitted on all
 * of them (ddt_cal_fit), with the context lookup's rating (core/lookup.h), and
 * the fit's per-bucket report goes to stderr.  Use
 * prompts like the ones the pair will serve, and not the ones it is evaluated on.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_engine.h"
#include "commands.h"
#include "core/calibration.h"
#include "ddtree.h"
#include "engine/engine.h"
#include "io/draft_calibration.h"
#include "text/tokenizer.h"

#define MAX_PROMPTS_BYTES (16u << 20)
#define MAX_PROMPT_TOKENS (1 << 20)

static const char k_usage_head[] =
    "usage: ddtree calibrate --model DIR --draft DIR --prompts FILE [options]\n"
    "\n"
    "Fits the draft calibration of the drafter in --draft for the target in --model: each prompt is\n"
    "decoded greedily with a draft at every step, and the drafter's top-16 log-probabilities per\n"
    "depth are mapped to how often the target accepted those tokens (a logistic fit per rank\n"
    "bucket), and the context lookup is rated: how often the continuation of an earlier occurrence of\n"
    "the context's last 2-8 tokens is accepted.  Greedy trees built from calibrated weights, with the\n"
    "lookup's path grafted where it weighs more, hold more accepted tokens for the same budget; the\n"
    "output is the target's either way.  CPU backend.\n"
    "Options (of the engine's, --model, --draft, --ctx and --threads apply):\n";
static const char k_usage_tail[] =
    "  --prompts FILE       the prompts: a JSON array of strings, or {\"prompts\": [{\"text\": ...}, ...]}\n"
    "                       (the shape of models/heldout_prompts.json)\n"
    "  --max-tokens N       tokens to decode per prompt, 2..100000 (default 128)\n"
    "  --out FILE           where to write (default: the drafter folder's draft_calibration.json)\n"
    "  --help               this text\n"
    "Exit status: 0 written, 2 bad arguments, model or prompts, 1 other failure.\n";

typedef struct cal_args {
    cli_engine_args eng;
    const char *prompts, *out;
    long long max_new;
} cal_args;

static int parse_args(int argc, char **argv, cal_args *a) {
    cli_engine_defaults(&a->eng, "calibrate");
    a->max_new = 128;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int common = cli_engine_common_flag(&a->eng, k_usage_head, k_usage_tail, argc, argv, &i);
        if (common == 0 || common == 2) return common;
        if (common == 1) continue;
        static const char *const valued[] = {"--prompts", "--max-tokens", "--out"};
        const char *v = NULL;
        int has = cli_flag_value("calibrate", valued, sizeof valued / sizeof valued[0], argc, argv, &i, &v);
        if (has == 2) return 2;
        if (!has) return cli_usage_error("calibrate", "unknown option '%s'", f);
        if (!strcmp(f, "--prompts")) a->prompts = v;
        else if (!strcmp(f, "--out")) a->out = v;
        else if (!cli_parse_ll(v, 2, 100000, &a->max_new))
            return cli_usage_error("calibrate", "--max-tokens '%s': expected an integer in 2..100000", v);
    }
    if (!a->eng.model) return cli_usage_error("calibrate", "--model is required");
    if (!a->eng.draft) return cli_usage_error("calibrate", "--draft is required");
    if (!a->prompts) return cli_usage_error("calibrate", "--prompts FILE is required");
    if (a->eng.temperature != 0.0f)
        return cli_usage_error("calibrate", "--temperature: the calibration is fitted on greedy decodes (0 only)");
    if (strcmp(a->eng.backend, "cpu") != 0)
        return cli_usage_error("calibrate", "--backend %s: calibration data is gathered on the CPU backend only",
                               a->eng.backend);
    a->eng.mode = "tree";
    a->eng.budget = DDT_CAL_RANKS; /* the table's K covers the ranks the fit sees */
    a->eng.budget_auto = false;
    a->eng.calibration = "none"; /* the data is the drafter's own q */
    return cli_engine_check(&a->eng);
}

/* The prompts file's texts: *texts points into *root (json_decref it); -1 when
 * fine, else 2 after a message. */
static int read_prompts(const char *path, json_t **root, const char ***texts, size_t *n) {
    char *data = NULL, why_buf[64];
    size_t len = 0;
    const char *why = cli_read_text_file(path, MAX_PROMPTS_BYTES, "16 MiB", &data, &len, why_buf);
    if (why) {
        fprintf(stderr, "ddtree calibrate: --prompts %s: %s\n", path, why);
        return 2;
    }
    json_error_t jerr;
    *root = json_loadb(data, len, JSON_REJECT_DUPLICATES, &jerr);
    free(data);
    if (!*root) {
        fprintf(stderr, "ddtree calibrate: --prompts %s: not valid JSON: %s (line %d)\n", path, jerr.text, jerr.line);
        return 2;
    }
    json_t *arr = json_is_object(*root) ? json_object_get(*root, "prompts") : *root;
    if (!json_is_array(arr) || json_array_size(arr) == 0) {
        fprintf(stderr, "ddtree calibrate: --prompts %s: expected a non-empty array of prompts (or an object with "
                        "one under \"prompts\")\n", path);
        return 2;
    }
    *n = json_array_size(arr);
    *texts = calloc(*n, sizeof **texts);
    if (!*texts) {
        fprintf(stderr, "ddtree calibrate: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < *n; i++) {
        json_t *p = json_array_get(arr, i);
        const char *t = json_is_string(p) ? json_string_value(p) : json_string_value(json_object_get(p, "text"));
        if (!t || !*t) {
            fprintf(stderr, "ddtree calibrate: --prompts %s: prompt %zu is neither a non-empty string nor an object "
                            "with a non-empty \"text\"\n", path, i);
            return 2;
        }
        (*texts)[i] = t;
    }
    return -1;
}

int ddt_cmd_calibrate(int argc, char **argv) {
    cal_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    ddt_error err = {0};
    ddt_tokenizer *tok = NULL;
    ddt_engine *eng = NULL;
    json_t *root = NULL;
    const char **texts = NULL;
    int32_t *ids = NULL;
    ddt_cal_stats *stats = NULL;
    size_t n_prompts = 0;
    ddt_status st;
    char out_path[4096];
    if ((rc = read_prompts(a.prompts, &root, &texts, &n_prompts)) >= 0) goto done;
    if ((rc = cli_engine_load_tokenizer(&a.eng, &tok)) >= 0) goto done;
    if (!tok) {
        fprintf(stderr, "ddtree calibrate: the prompts need a tokenizer: %s has no tiktoken.model or tokenizer.json\n",
                a.eng.model);
        rc = 2;
        goto done;
    }
    if (a.out) {
        snprintf(out_path, sizeof out_path, "%s", a.out);
    } else if (snprintf(out_path, sizeof out_path, "%s/%s", a.eng.draft, DDT_CALIBRATION_FILE) >=
               (int)sizeof out_path) {
        fprintf(stderr, "ddtree calibrate: --draft path too long\n");
        rc = 2;
        goto done;
    }
    ddt_engine_options eo;
    cli_engine_options(&a.eng, &eo);
    if ((st = ddt_engine_create(a.eng.model, &eo, &eng, &err)) != DDT_OK) {
        fprintf(stderr, "ddtree calibrate: %s\n", err.msg);
        rc = cli_status_exit(st);
        goto done;
    }
    ids = malloc(MAX_PROMPT_TOKENS * sizeof *ids);
    stats = malloc(sizeof *stats);
    if (!ids || !stats) {
        fprintf(stderr, "ddtree calibrate: out of memory\n");
        rc = 1;
        goto done;
    }
    ddt_cal_stats_clear(stats);
    long long decoded = 0;
    for (size_t i = 0; i < n_prompts; i++) {
        size_t n = 0;
        int32_t got = 0;
        if ((st = ddt_tokenizer_encode(tok, texts[i], strlen(texts[i]), 0, ids, MAX_PROMPT_TOKENS, &n, &err)) ||
            (st = ddt_engine_calibration_data(eng, ids, (int32_t)n, (int32_t)a.max_new, stats, &got, &err))) {
            fprintf(stderr, "ddtree calibrate: prompt %zu: %s\n", i, err.msg);
            rc = cli_status_exit(st);
            goto done;
        }
        decoded += got;
    }
    ddt_draft_calibration cal;
    ddt_cal_fit_info info;
    if ((st = ddt_cal_fit(stats, &cal, &info, &err)) != DDT_OK) {
        fprintf(stderr, "ddtree calibrate: %s\n", err.msg);
        rc = cli_status_exit(st);
        goto done;
    }
    char note[256];
    snprintf(note, sizeof note, "%zu prompts from %s, %lld greedy tokens, %lld draft tables", n_prompts, a.prompts,
             decoded, (long long)stats->tables);
    if ((st = ddt_calibration_save(out_path, &cal, &info, note, &err)) != DDT_OK) {
        fprintf(stderr, "ddtree calibrate: %s\n", err.msg);
        rc = cli_status_exit(st);
        goto done;
    }
    static const char *names[DDT_CAL_BUCKETS] = {"rank 0", "rank 1", "ranks 2-3", "ranks 4-7", "ranks 8+"};
    fprintf(stderr, "ddtree calibrate: %s; wrote %s\n", note, out_path);
    fprintf(stderr, "  bucket      cells     hit rate  log-lik (drafter's q -> calibrated)  weights\n");
    for (int b = 0; b < DDT_CAL_BUCKETS; b++)
        fprintf(stderr, "  %-10s %7.0f   %6.3f     %8.4f -> %8.4f%s   %.3f %.3f %.3f\n", names[b], info.cells[b],
                info.cells[b] > 0 ? info.hits[b] / info.cells[b] : 0.0, info.loglik_identity[b], info.loglik[b],
                info.identity[b] ? " (identity)" : "", (double)cal.w[b][0], (double)cal.w[b][1], (double)cal.w[b][2]);
    if (cal.lookup)
        fprintf(stderr, "  context lookup: %.0f proposals, first token accepted after a match of 2..8 tokens: %.2f %.2f "
                        "%.2f %.2f %.2f %.2f %.2f, each next one: %.3f\n", info.lookup_proposals,
                (double)cal.lookup_first[0], (double)cal.lookup_first[1], (double)cal.lookup_first[2],
                (double)cal.lookup_first[3], (double)cal.lookup_first[4], (double)cal.lookup_first[5],
                (double)cal.lookup_first[6], (double)cal.lookup_next);
    else
        fprintf(stderr, "  context lookup: %.0f proposals, too few to rate it (%d needed): no lookup path\n",
                info.lookup_proposals, DDT_CAL_MIN_LOOKUP);
    rc = 0;
done:
    ddt_engine_free(eng);
    ddt_tokenizer_free(tok);
    free(texts);
    json_decref(root);
    free(ids);
    free(stats);
    return rc;
}
