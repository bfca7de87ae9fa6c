/*
 * cmd_generate.c — `ddtree generate`: decode with the target model on the CPU
 * from a prompt given as token ids.  Only --mode ar (plain autoregressive
 * decoding, one prefill of one token per step) exists for now; the speculative
 * modes report "not implemented yet".  Generated ids go to stdout (a JSON
 * object with --json), timing to stderr.  Bad flags or input: exit 2.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "commands.h"
#include "ddtree.h"
#include "io/config.h"
#include "model/target.h"

#define PREFILL_CHUNK 512      /* prompt tokens per forward */
#define MAX_NEW_TOKENS 1000000 /* sanity bound on --max-tokens */

static const char k_usage[] =
    "usage: ddtree generate --model DIR --prompt-ids ID,ID,... --max-tokens N [options]\n"
    "\n"
    "Decodes with the target model in DIR (config.json + safetensors) on the CPU.\n"
    "Options:\n"
    "  --model DIR          model folder (required)\n"
    "  --prompt-ids LIST    comma-separated prompt token ids (required)\n"
    "  --max-tokens N       tokens to generate, 0..1000000 (required)\n"
    "  --mode MODE          ar (default); dflash and ddtree are not implemented yet\n"
    "  --temperature T      0 = greedy (default); > 0 samples\n"
    "  --top-k K            sampling: keep the K most likely tokens (0 = off, default)\n"
    "  --top-p P            sampling: nucleus mass in (0, 1] (1 = off, default)\n"
    "  --seed S             sampling seed (default 0)\n"
    "  --ctx N              context length (default: the model's max_position_embeddings)\n"
    "  --threads N          CPU threads (default: every core)\n"
    "  --stop-at-eos        stop after generating the config's eos_token_id\n"
    "  --json               print {\"ids\": [...]} (the generated ids) instead of plain ids\n"
    "  --help               this text\n"
    "Exit status: 0 done, 2 bad arguments or model, 1 other failure.\n";

typedef struct gen_args {
    const char *model;
    const char *mode;
    int32_t *prompt;
    int32_t n_prompt;
    long long max_new;
    bool have_max_new;
    float temperature;
    long long top_k;
    float top_p;
    unsigned long long seed;
    long long ctx;   /* 0 = from the config */
    long long threads;
    bool json;
    bool stop_eos;
} gen_args;

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ddtree generate: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see 'ddtree generate --help')\n");
    va_end(ap);
    return 2;
}

static bool parse_ll(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_float(const char *s, float *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || v != v) return false;
    *out = v;
    return true;
}

/* "1,2,3" -> ids; false on an empty list or a malformed entry. */
static bool parse_ids(const char *s, gen_args *a) {
    size_t n = 1;
    for (const char *p = s; *p; p++) n += *p == ',';
    if (n > (size_t)INT32_MAX / sizeof(int32_t)) return false;
    a->prompt = malloc(n * sizeof(int32_t));
    if (!a->prompt) return false;
    const char *p = s;
    for (size_t i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX || (*end != ',' && *end != '\0')) return false;
        a->prompt[i] = (int32_t)v;
        p = end + (*end == ',');
    }
    a->n_prompt = (int32_t)n;
    return true;
}

/* Parse argv; returns -1 to continue, else an exit status. */
static int parse_args(int argc, char **argv, gen_args *a) {
    a->mode = "ar";
    a->top_p = 1.0f;
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
        if (!strcmp(f, "--stop-at-eos")) {
            a->stop_eos = true;
            continue;
        }
        static const char *const valued[] = {"--model", "--mode", "--prompt-ids", "--max-tokens", "--temperature",
                                             "--top-k", "--top-p", "--seed", "--ctx", "--threads"};
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(f, valued[k]);
        if (!known) return usage_error("unknown option '%s'", f);
        if (i + 1 >= argc) return usage_error("option %s needs a value", f);
        const char *v = argv[++i];
        long long ll;
        if (!strcmp(f, "--model")) {
            a->model = v;
        } else if (!strcmp(f, "--mode")) {
            a->mode = v;
        } else if (!strcmp(f, "--prompt-ids")) {
            free(a->prompt);
            a->prompt = NULL;
            if (!parse_ids(v, a)) return usage_error("--prompt-ids '%s': expected comma-separated integers", v);
        } else if (!strcmp(f, "--max-tokens")) {
            if (!parse_ll(v, 0, MAX_NEW_TOKENS, &a->max_new))
                return usage_error("--max-tokens '%s': expected an integer in 0..1000000", v);
            a->have_max_new = true;
        } else if (!strcmp(f, "--temperature")) {
            if (!parse_float(v, &a->temperature) || a->temperature < 0)
                return usage_error("--temperature '%s': expected a number >= 0", v);
        } else if (!strcmp(f, "--top-k")) {
            if (!parse_ll(v, 0, INT32_MAX, &a->top_k)) return usage_error("--top-k '%s': expected an integer >= 0", v);
        } else if (!strcmp(f, "--top-p")) {
            if (!parse_float(v, &a->top_p) || !(a->top_p > 0 && a->top_p <= 1))
                return usage_error("--top-p '%s': expected a number in (0, 1]", v);
        } else if (!strcmp(f, "--seed")) {
            if (!parse_ll(v, 0, INT64_MAX, &ll)) return usage_error("--seed '%s': expected an integer >= 0", v);
            a->seed = (unsigned long long)ll;
        } else if (!strcmp(f, "--ctx")) {
            if (!parse_ll(v, 1, INT32_MAX, &a->ctx)) return usage_error("--ctx '%s': expected an integer >= 1", v);
        } else if (!strcmp(f, "--threads")) {
            if (!parse_ll(v, 1, 256, &a->threads)) return usage_error("--threads '%s': expected an integer in 1..256", v);
        }
    }
    if (!a->model) return usage_error("--model is required");
    if (!a->prompt) return usage_error("--prompt-ids is required");
    if (!a->have_max_new) return usage_error("--max-tokens is required");
    if (!strcmp(a->mode, "dflash") || !strcmp(a->mode, "ddtree"))
        return usage_error("--mode %s: not implemented yet (only ar)", a->mode);
    if (strcmp(a->mode, "ar") != 0) return usage_error("--mode '%s': unknown (ar, dflash, ddtree)", a->mode);
    return -1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Exit status for a library failure: bad input 2, resources or bugs 1. */
static int status_exit(ddt_status st) { return st == DDT_ERR_NOMEM || st == DDT_ERR_INTERNAL ? 1 : 2; }

int ddt_cmd_generate(int argc, char **argv) {
    gen_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) {
        free(a.prompt);
        return rc;
    }
    ddt_error err = {0};
    ddt_model_config cfg;
    ddt_target *t = NULL;
    ddt_sampler *smp = NULL;
    float *logits = NULL;
    int32_t *out = NULL;
    bool have_cfg = false;
    struct stat sb;
    if (stat(a.model, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "ddtree generate: --model %s: not a model folder (%s)\n", a.model,
                stat(a.model, &sb) != 0 ? strerror(errno) : "not a directory");
        rc = 2;
        goto done;
    }
    ddt_status st = ddt_config_load(a.model, &cfg, &err);
    if (st != DDT_OK) {
        fprintf(stderr, "ddtree generate: %s\n", err.msg);
        rc = status_exit(st);
        goto done;
    }
    have_cfg = true;
    const int32_t V = cfg.vocab_size;
    for (int32_t i = 0; i < a.n_prompt; i++)
        if (a.prompt[i] < 0 || a.prompt[i] >= V) {
            fprintf(stderr, "ddtree generate: prompt id %d (position %d) is outside the vocabulary 0..%d\n", a.prompt[i],
                    i, V - 1);
            rc = 2;
            goto done;
        }
    long long ctx = a.ctx > 0 ? a.ctx : cfg.max_position_embeddings;
    if (a.n_prompt > ctx) {
        fprintf(stderr, "ddtree generate: the prompt of %d tokens is longer than the context of %lld tokens\n",
                a.n_prompt, ctx);
        rc = 2;
        goto done;
    }
    /* cache rows: the prompt plus every generated token but the last, which is never fed back */
    long long want_rows = (long long)a.n_prompt + (a.max_new > 0 ? a.max_new - 1 : 0);
    int32_t rows = (int32_t)(want_rows < ctx ? want_rows : ctx);
    if (rows < 1) rows = 1;
    ddt_sampling sp = {.temperature = a.temperature, .top_k = (int32_t)a.top_k, .top_p = a.top_p, .seed = a.seed};
    if ((st = ddt_sampling_check(&sp, &err)) != DDT_OK) {
        fprintf(stderr, "ddtree generate: %s\n", err.msg);
        rc = 2;
        goto done;
    }
    ddt_target_options opts = {.max_ctx = rows,
                               .max_tokens = a.n_prompt < PREFILL_CHUNK ? a.n_prompt : PREFILL_CHUNK,
                               .n_threads = (int32_t)a.threads};
    double t0 = now_s();
    if ((st = ddt_target_load(a.model, &opts, &t, &err)) != DDT_OK) {
        fprintf(stderr, "ddtree generate: %s\n", err.msg);
        rc = status_exit(st);
        goto done;
    }
    double t1 = now_s();
    logits = malloc(sizeof(float) * (size_t)V);
    out = malloc(sizeof(int32_t) * (size_t)(a.max_new > 0 ? a.max_new : 1));
    if (!logits || !out || ddt_sampler_create(V, &smp, &err) != DDT_OK) {
        fprintf(stderr, "ddtree generate: out of memory\n");
        rc = 1;
        goto done;
    }
    for (int32_t i = 0; i < a.n_prompt; i += opts.max_tokens) {
        int32_t n = a.n_prompt - i < opts.max_tokens ? a.n_prompt - i : opts.max_tokens;
        bool last = i + n == a.n_prompt;
        if ((st = ddt_target_prefill(t, a.prompt + i, n, last ? logits : NULL, false, &err)) != DDT_OK) {
            fprintf(stderr, "ddtree generate: prompt: %s\n", err.msg);
            rc = status_exit(st);
            goto done;
        }
    }
    double t2 = now_s();
    long long n_out = 0;
    const char *why = "max tokens";
    while (n_out < a.max_new) {
        int32_t tok;
        if ((st = ddt_sample_token(smp, logits, V, &sp, (uint64_t)n_out, 0, &tok, &err)) != DDT_OK) {
            fprintf(stderr, "ddtree generate: sampling: %s\n", err.msg);
            rc = 1;
            goto done;
        }
        out[n_out++] = tok;
        if (a.stop_eos && tok == cfg.eos_token_id) {
            why = "eos";
            break;
        }
        if (n_out == a.max_new) break;
        if (ddt_target_len(t) >= ddt_target_max_ctx(t)) {
            why = "context full";
            fprintf(stderr, "ddtree generate: stopped after %lld tokens: the context of %lld tokens is full\n", n_out,
                    ctx);
            break;
        }
        if ((st = ddt_target_prefill(t, &tok, 1, logits, false, &err)) != DDT_OK) {
            fprintf(stderr, "ddtree generate: decode: %s\n", err.msg);
            rc = status_exit(st);
            goto done;
        }
    }
    double t3 = now_s();
    if (a.json) printf("{\"ids\": [");
    for (long long i = 0; i < n_out; i++) printf("%s%d", i ? (a.json ? ", " : " ") : "", out[i]);
    printf(a.json ? "]}\n" : "\n");
    /* the first token comes from the prompt's logits; each later one costs one forward */
    long long steps = n_out > 0 ? n_out - 1 : 0;
    fprintf(stderr,
            "ddtree generate: mode ar, %d threads: load %.3f s; prompt %d tokens in %.3f s (%.1f tokens/s); "
            "%lld tokens generated (%s), %lld decode steps in %.3f s: %.2f tokens/s\n",
            (int)ddt_target_threads(t), t1 - t0, a.n_prompt, t2 - t1, t2 > t1 ? a.n_prompt / (t2 - t1) : 0.0,
            n_out, why, steps, t3 - t2, t3 > t2 ? steps / (t3 - t2) : 0.0);
    rc = 0;
done:
    ddt_sampler_destroy(smp);
    ddt_target_free(t);
    if (have_cfg) ddt_config_free(&cfg);
    free(logits);
    free(out);
    free(a.prompt);
    return rc;
}
