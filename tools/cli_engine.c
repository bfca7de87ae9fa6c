/*
 * cli_engine.c — see cli_engine.h.
 */
#include "cli_engine.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/draft_calibration.h"

const char cli_engine_usage[] =
    "  --model DIR          target model folder (required)\n"
    "  --draft DIR          DFlash drafter folder (needed by --mode chain and tree)\n"
    "  --chat-template FILE a Jinja chat template to use instead of the model folder's own\n"
    "  --mode MODE          ar (default), chain (DFlash; alias dflash) or tree (DDTree; alias ddtree)\n"
    "  --backend B          cpu (default), cuda (the whole round on the GPU; builds with nvcc only)\n"
    "                       or auto (cuda when this build has it and a GPU is present, else cpu)\n"
    "  --fast-attention     cuda: bf16 latent cache + tensor-core MLA attention (kv_lora_rank 512 and\n"
    "                       rope 64 models, budget <= 63); faster at long contexts, not bitwise ar\n"
    "  --tensor-cores       cuda: matmuls, experts and LM head on the tensor cores (bf16 mma with\n"
    "                       split-bf16 activations), the drafter's bf16 products too; greedy tree\n"
    "                       == ar still holds\n"
    "  --host-sampler       cuda: sample at T > 0 on the host (logits copied every round) instead of\n"
    "                       on the device; the same tokens, for comparison\n"
    "  --no-pdl             cuda: plain kernel-to-kernel edges in the round graphs instead of\n"
    "                       programmatic dependent launch; the same tokens, for comparison\n"
    "  --pdl-edges SET      cuda: which round-graph edges are programmatic: default (every edge of\n"
    "                       a chain / tree round, the edges into the x W products in an ar step),\n"
    "                       all, or products (only into the x W products, which load weights\n"
    "                       before their wait); the same tokens, for comparison\n"
    "  --no-phase-times     cuda: no timing events inside the round graph (the per-phase seconds\n"
    "                       read 0); the same tokens, for measuring what the timing costs\n"
    "  --gpus N             cuda: split the target over N GPUs of this host over NCCL (attention\n"
    "                       heads, routed experts, dense MLPs and shared experts; default 1)\n"
    "  --budget N|auto      tree nodes per round, 1..1024 (default 20); auto = cost-aware (CaDDTree),\n"
    "                       capped at --max-budget (default 32), with a verify-cost table measured at start\n"
    "  --max-budget N       cap of the auto budget, 1..1024\n"
    "  --temperature T      0 = greedy (default); > 0 samples (sample-and-match: output is the target's)\n"
    "  --top-k K            sampling: keep the K most likely tokens (0 = off, default)\n"
    "  --top-p P            sampling: nucleus mass in (0, 1] (1 = off, default)\n"
    "  --seed S             sampling seed (default 0)\n"
    "  --calibration FILE   the draft calibration the greedy trees are built with (ddtree calibrate);\n"
    "                       default: the drafter folder's draft_calibration.json when it has one;\n"
    "                       none: the drafter's own q\n"
    "  --no-lookup          graft no context-lookup path onto the greedy trees (the calibration rates\n"
    "                       the lookup; for comparison)\n"
    "  --ctx N              context length (default: the model's maximum, at most 8192)\n"
    "  --threads N          CPU threads (default: every core)\n";

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ddtree %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see 'ddtree %s --help')\n", cmd);
    va_end(ap);
    return 2;
}

const char *cli_read_text_file(const char *path, size_t max, const char *limit, char **out, size_t *len, char *buf) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return strerror(errno);
    char *text = malloc(max + 1);
    size_t got = text ? fread(text, 1, max + 1, f) : 0;
    bool rerr = ferror(f) != 0;
    fclose(f);
    const char *why = NULL;
    if (!text) why = "out of memory";
    else if (rerr) why = "read error";
    else if (got > max) why = (snprintf(buf, 64, "larger than %s", limit), buf);
    else if (memchr(text, '\0', got)) why = "holds a NUL byte";
    if (why) {
        free(text);
        return why;
    }
    text[got] = '\0';
    *out = text;
    *len = got;
    return NULL;
}

bool cli_parse_ids(const char *s, size_t max, int32_t **out, int32_t *n) {
    size_t count = 1;
    for (const char *p = s; *p; p++) count += *p == ',';
    if (count > max || count > INT32_MAX) return false;
    int32_t *ids = malloc(count * sizeof(int32_t));
    if (!ids) return false;
    const char *p = s;
    for (size_t i = 0; i < count; i++) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            free(ids);
            return false;
        }
        ids[i] = (int32_t)v;
        p = end + (*end == ',');
    }
    *out = ids;
    *n = (int32_t)count;
    return true;
}

bool cli_parse_ll(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_float(const char *s, float *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || v != v) return false;
    *out = v;
    return true;
}

int cli_status_exit(ddt_status st) { return st == DDT_ERR_NOMEM || st == DDT_ERR_INTERNAL ? 1 : 2; }

void cli_engine_defaults(cli_engine_args *a, const char *cmd) {
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    a->mode = "ar";
    a->backend = "cpu";
    a->gpus = 1;
    a->top_p = 1.0f;
    /* the shipped pair's best fixed budget on the GPU at T = 0 with the calibrated trees (H100,
       nineteenth session: 20 1.98x ar, 16 1.93x, 24 1.90x, 32 1.83x; at T = 1, 16 and 32 tie) */
    a->budget = 20;
    /* the auto budget's cap, and its top-K's K: on the shipped pair (H100, nineteenth session) auto
       never picks past 24, and a cap of 64 cost ~1% (a K of 64 in every round's top-K and build) */
    a->max_budget = 32;
}

int cli_engine_parse_flag(cli_engine_args *a, int argc, char **argv, int *i) {
    const char *f = argv[*i];
    if (!strcmp(f, "--fast-attention")) {
        a->fast_attention = true;
        return 1;
    }
    if (!strcmp(f, "--tensor-cores")) {
        a->tensor_cores = true;
        return 1;
    }
    if (!strcmp(f, "--host-sampler")) {
        a->host_sampler = true;
        return 1;
    }
    if (!strcmp(f, "--no-pdl")) {
        a->no_pdl = true;
        return 1;
    }
    if (!strcmp(f, "--no-phase-times")) {
        a->no_phase_times = true;
        return 1;
    }
    if (!strcmp(f, "--no-lookup")) {
        a->no_lookup = true;
        return 1;
    }
    static const char *const valued[] = {"--model", "--draft", "--mode", "--backend", "--gpus", "--budget",
                                         "--max-budget", "--temperature", "--top-k", "--top-p", "--seed",
                                         "--ctx", "--threads", "--pdl-edges", "--chat-template", "--calibration"};
    const char *v = NULL;
    int got = cli_flag_value(a->cmd, valued, sizeof valued / sizeof valued[0], argc, argv, i, &v);
    if (got != 1) return got;
    const char *c = a->cmd;
    long long ll;
    if (!strcmp(f, "--model")) {
        a->model = v;
    } else if (!strcmp(f, "--chat-template")) {
        a->chat_template = v;
    } else if (!strcmp(f, "--calibration")) {
        if (!*v) return cli_usage_error(c, "--calibration: expected a file or none");
        a->calibration = v;
    } else if (!strcmp(f, "--draft")) {
        a->draft = v;
    } else if (!strcmp(f, "--mode")) {
        a->mode = v;
    } else if (!strcmp(f, "--backend")) {
        a->backend = v;
    } else if (!strcmp(f, "--budget")) {
        if (!strcmp(v, "auto")) a->budget_auto = true;
        else if (!cli_parse_ll(v, 1, DDT_MAX_BUDGET, &a->budget))
            return cli_usage_error(c, "--budget '%s': expected 1..%d or auto", v, DDT_MAX_BUDGET);
    } else if (!strcmp(f, "--max-budget")) {
        if (!cli_parse_ll(v, 1, DDT_MAX_BUDGET, &a->max_budget))
            return cli_usage_error(c, "--max-budget '%s': expected 1..%d", v, DDT_MAX_BUDGET);
    } else if (!strcmp(f, "--temperature")) {
        if (!cli_parse_float(v, &a->temperature) || a->temperature < 0)
            return cli_usage_error(c, "--temperature '%s': expected a number >= 0", v);
    } else if (!strcmp(f, "--top-k")) {
        if (!cli_parse_ll(v, 0, INT32_MAX, &a->top_k))
            return cli_usage_error(c, "--top-k '%s': expected an integer >= 0", v);
    } else if (!strcmp(f, "--top-p")) {
        if (!cli_parse_float(v, &a->top_p) || !(a->top_p > 0 && a->top_p <= 1))
            return cli_usage_error(c, "--top-p '%s': expected a number in (0, 1]", v);
    } else if (!strcmp(f, "--seed")) {
        if (!cli_parse_ll(v, 0, INT64_MAX, &ll)) return cli_usage_error(c, "--seed '%s': expected an integer >= 0", v);
        a->seed = (unsigned long long)ll;
    } else if (!strcmp(f, "--ctx")) {
        if (!cli_parse_ll(v, 1, INT32_MAX, &a->ctx)) return cli_usage_error(c, "--ctx '%s': expected an integer >= 1", v);
    } else if (!strcmp(f, "--gpus")) {
        if (!cli_parse_ll(v, 1, DDT_ENGINE_MAX_GPUS, &a->gpus))
            return cli_usage_error(c, "--gpus '%s': expected an integer in 1..%d", v, DDT_ENGINE_MAX_GPUS);
    } else if (!strcmp(f, "--pdl-edges")) {
        if (!strcmp(v, "default")) a->pdl_edges = DDT_PDL_EDGES_DEFAULT;
        else if (!strcmp(v, "all")) a->pdl_edges = DDT_PDL_EDGES_ALL;
        else if (!strcmp(v, "products")) a->pdl_edges = DDT_PDL_EDGES_PRODUCTS;
        else return cli_usage_error(c, "--pdl-edges '%s': expected default, all or products", v);
    } else if (!strcmp(f, "--threads")) {
        if (!cli_parse_ll(v, 1, 256, &a->threads))
            return cli_usage_error(c, "--threads '%s': expected an integer in 1..256", v);
    }
    return 1;
}

int cli_flag_value(const char *cmd, const char *const *names, size_t n, int argc, char **argv, int *i,
                   const char **value) {
    const char *f = argv[*i];
    bool known = false;
    for (size_t k = 0; k < n; k++) known |= !strcmp(f, names[k]);
    if (!known) return 0;
    if (*i + 1 >= argc) return cli_usage_error(cmd, "option %s needs a value", f);
    *value = argv[++*i];
    return 1;
}

int cli_engine_common_flag(cli_engine_args *a, const char *head, const char *tail, int argc, char **argv, int *i) {
    const char *f = argv[*i];
    if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
        printf("%s%s%s", head, cli_engine_usage, tail);
        return 0;
    }
    int taken = cli_engine_parse_flag(a, argc, argv, i);
    return taken ? taken : -1;
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* --calibration, or else the drafter folder's file when it has one: -1 when
 * fine (a->have_cal says whether one was loaded), else 2 after a message. */
static int load_calibration(cli_engine_args *a) {
    a->have_cal = false;
    char path[4096];
    const char *file = a->calibration;
    if (file && !strcmp(file, "none")) return -1;
    if (!file) {
        struct stat sb;
        if (!a->draft) return -1;
        int k = snprintf(path, sizeof path, "%s/%s", a->draft, DDT_CALIBRATION_FILE);
        if (k < 0 || (size_t)k >= sizeof path || stat(path, &sb) != 0) return -1;
        file = path;
    }
    ddt_error err = {0};
    if (ddt_calibration_load(file, &a->cal, &err) != DDT_OK) {
        if (a->calibration)
            fprintf(stderr, "ddtree %s: --calibration: %s\n", a->cmd, err.msg);
        else /* the drafter folder's own, which the user did not name */
            fprintf(stderr, "ddtree %s: the drafter's draft calibration: %s (--calibration none runs without it)\n",
                    a->cmd, err.msg);
        return 2;
    }
    a->have_cal = true;
    return -1;
}

int cli_engine_check(cli_engine_args *a) {
    const char *c = a->cmd;
    if (!a->model) return cli_usage_error(c, "--model is required");
    ddt_mode m;
    if (!ddt_mode_parse(a->mode, &m)) return cli_usage_error(c, "--mode '%s': unknown (ar, chain, tree)", a->mode);
    if (m != DDT_MODE_AR && !a->draft) return cli_usage_error(c, "--mode %s needs a drafter: --draft DIR", a->mode);
    ddt_backend b;
    if (!ddt_backend_parse(a->backend, &b))
        return cli_usage_error(c, "--backend '%s': unknown (cpu, cuda, auto)", a->backend);
    if (!is_dir(a->model)) {
        struct stat sb;
        fprintf(stderr, "ddtree %s: --model %s: not a model folder (%s)\n", c, a->model,
                stat(a->model, &sb) != 0 ? strerror(errno) : "not a directory");
        return 2;
    }
    if (a->draft && !is_dir(a->draft)) {
        fprintf(stderr, "ddtree %s: --draft %s: not a drafter folder\n", c, a->draft);
        return 2;
    }
    return load_calibration(a);
}

void cli_engine_options(const cli_engine_args *a, ddt_engine_options *o) {
    memset(o, 0, sizeof *o);
    ddt_mode_parse(a->mode, &o->mode);
    ddt_backend_parse(a->backend, &o->backend);
    o->fast_attention = a->fast_attention;
    o->tensor_cores = a->tensor_cores;
    o->cuda_host_sampler = a->host_sampler;
    o->cuda_no_pdl = a->no_pdl;
    o->cuda_pdl_edges = a->pdl_edges;
    o->cuda_no_phase_times = a->no_phase_times;
    o->gpus = (int32_t)a->gpus;
    o->draft_dir = a->draft;
    o->budget = (int32_t)(a->budget_auto ? a->max_budget : a->budget);
    o->budget_auto = a->budget_auto;
    o->sampling = (ddt_sampling){a->temperature, (int32_t)a->top_k, a->top_p, a->seed};
    o->max_ctx = (int32_t)a->ctx; /* 0: the engine's default */
    o->n_threads = (int32_t)a->threads;
    o->draft_calibration = a->have_cal ? &a->cal : NULL;
    o->no_lookup = a->no_lookup;
}

int cli_engine_load_tokenizer(const cli_engine_args *a, ddt_tokenizer **tok) {
    *tok = NULL;
    char p[4096];
    struct stat sb;
    bool found = false;
    for (int k = 0; k < 2 && !found; k++) { /* ddt_tokenizer_load picks tiktoken.model first */
        snprintf(p, sizeof p, "%s/%s", a->model, k == 0 ? "tiktoken.model" : "tokenizer.json");
        found = stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
    }
    if (!found) return -1;
    ddt_error err = {0};
    ddt_status st = ddt_tokenizer_load(a->model, tok, &err);
    if (st != DDT_OK) {
        fprintf(stderr, "ddtree %s: tokenizer: %s\n", a->cmd, err.msg);
        return cli_status_exit(st);
    }
    return -1;
}

int cli_engine_load_chat_template(const cli_engine_args *a, ddt_chat_template **t) {
    ddt_error err = {0};
    ddt_status st = ddt_chat_template_load(a->model, a->chat_template, t, &err);
    if (st != DDT_OK) {
        fprintf(stderr, "ddtree %s: chat template: %s\n", a->cmd, err.msg);
        return cli_status_exit(st);
    }
    return -1;
}
