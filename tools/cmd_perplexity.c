/*
 * cmd_perplexity.c — `ddtree perplexity`: the target's perplexity on a text, the
 * first check of a checkpoint (a wrong dequantisation or a broken conversion
 * shows here before it shows anywhere else).  The text's tokens are cut into
 * consecutive windows of the context length; each window is scored from an
 * empty context (ddt_engine_score), every token after its window's first one
 * counting.  With --stride S < the window, windows start every S tokens and each
 * counts only the tokens the window before it did not reach (the sliding window
 * of Hugging Face's perplexity guide: every token but the first counts, most with
 * a long context).  Perplexity = exp(mean negative log-likelihood).  --json adds
 * each token's log-probability (null where none counts).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_engine.h"
#include "commands.h"
#include "ddtree.h"
#include "engine/engine.h"
#include "engine/round.h"
#include "text/tokenizer.h"

#define MAX_FILE_BYTES (64u << 20)
#define MAX_IDS (1 << 24)

static const char k_usage_head[] =
    "usage: ddtree perplexity --model DIR (--file PATH | --text TEXT | --ids ID,...) [options]\n"
    "\n"
    "The target model's perplexity on a text: its tokens in consecutive windows of --ctx tokens\n"
    "(default: the model's context, at most 8192), each scored from an empty context; every token\n"
    "after a window's first counts.  CPU backend, or one GPU (--backend cuda).\n"
    "Options:\n";
static const char k_usage_tail[] =
    "  --file PATH          the text (UTF-8, at most 64 MiB; needs the model's tokenizer)\n"
    "  --text TEXT          the text itself\n"
    "  --ids LIST           comma-separated token ids instead of text\n"
    "  --max-tokens N       score only the first N tokens of the text\n"
    "  --stride S           start a window every S tokens (1..the window; default: the window), each\n"
    "                       counting the tokens the one before did not reach\n"
    "  --json               print {\"tokens\", \"scored\", \"windows\", \"window\", \"stride\", \"nll\",\n"
    "                       \"perplexity\", \"seconds\", \"ids\", \"logprobs\": [null or each token's\n"
    "                       log-probability]} instead\n"
    "  --help               this text\n"
    "Exit status: 0 done, 2 bad arguments, model or text, 1 other failure.\n";

typedef struct ppl_args {
    cli_engine_args eng;
    const char *file, *text, *ids_arg;
    long long max_tokens, stride;
    bool json;
} ppl_args;

static int parse_args(int argc, char **argv, ppl_args *a) {
    cli_engine_defaults(&a->eng, "perplexity");
    a->max_tokens = -1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int common = cli_engine_common_flag(&a->eng, k_usage_head, k_usage_tail, argc, argv, &i);
        if (common == 0 || common == 2) return common;
        if (common == 1) continue;
        if (!strcmp(f, "--json")) {
            a->json = true;
            continue;
        }
        static const char *const valued[] = {"--file", "--text", "--ids", "--max-tokens", "--stride"};
        const char *v = NULL;
        int has = cli_flag_value("perplexity", valued, sizeof valued / sizeof valued[0], argc, argv, &i, &v);
        if (has == 2) return 2;
        if (!has) return cli_usage_error("perplexity", "unknown option '%s'", f);
        if (!strcmp(f, "--file")) a->file = v;
        else if (!strcmp(f, "--text")) a->text = v;
        else if (!strcmp(f, "--ids")) a->ids_arg = v;
        else if (!strcmp(f, "--stride")) {
            if (!cli_parse_ll(v, 1, MAX_IDS, &a->stride))
                return cli_usage_error("perplexity", "--stride '%s': expected a positive integer", v);
        } else if (!cli_parse_ll(v, 2, MAX_IDS, &a->max_tokens))
            return cli_usage_error("perplexity", "--max-tokens '%s': expected an integer in 2..%d", v, MAX_IDS);
    }
    if (!a->eng.model) return cli_usage_error("perplexity", "--model is required");
    int sources = (a->file != NULL) + (a->text != NULL) + (a->ids_arg != NULL);
    if (sources == 0) return cli_usage_error("perplexity", "a text is required: --file PATH, --text TEXT or --ids LIST");
    if (sources > 1) return cli_usage_error("perplexity", "give one of --file, --text and --ids");
    return cli_engine_check(&a->eng);
}

int ddt_cmd_perplexity(int argc, char **argv) {
    ppl_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    ddt_error err = {0};
    ddt_tokenizer *tok = NULL;
    ddt_engine *eng = NULL;
    int32_t *ids = NULL, n = 0;
    char *text = NULL;
    ddt_token_logprobs *lp = NULL;
    double *nll_of = NULL;
    json_t *o = NULL;
    ddt_status st;
    if (a.ids_arg) {
        if (!cli_parse_ids(a.ids_arg, MAX_IDS, &ids, &n)) {
            rc = cli_usage_error("perplexity", "--ids '%s': expected comma-separated integers", a.ids_arg);
            goto done;
        }
    } else {
        if ((rc = cli_engine_load_tokenizer(&a.eng, &tok)) >= 0) goto done;
        if (!tok) {
            fprintf(stderr, "ddtree perplexity: text needs a tokenizer: %s has no tiktoken.model or tokenizer.json "
                            "(use --ids)\n",
                    a.eng.model);
            rc = 2;
            goto done;
        }
        size_t len = 0;
        const char *t = a.text;
        if (a.file) {
            char why_buf[64];
            const char *why = cli_read_text_file(a.file, MAX_FILE_BYTES, "64 MiB", &text, &len, why_buf);
            if (why) {
                fprintf(stderr, "ddtree perplexity: --file %s: %s\n", a.file, why);
                rc = 2;
                goto done;
            }
            t = text;
        } else {
            len = strlen(t);
        }
        size_t cap = len + 64, got = 0;
        ids = malloc(cap * sizeof(int32_t));
        if (!ids) {
            fprintf(stderr, "ddtree perplexity: out of memory for %zu tokens\n", cap);
            rc = 1;
            goto done;
        }
        if ((st = ddt_tokenizer_encode(tok, t, len, 0, ids, cap, &got, &err)) != DDT_OK) {
            fprintf(stderr, "ddtree perplexity: text: %s\n", err.msg);
            rc = cli_status_exit(st);
            goto done;
        }
        if (got > MAX_IDS) {
            fprintf(stderr, "ddtree perplexity: the text has %zu tokens, more than %d\n", got, MAX_IDS);
            rc = 2;
            goto done;
        }
        n = (int32_t)got;
    }
    if (a.max_tokens > 0 && n > a.max_tokens) n = (int32_t)a.max_tokens;
    if (n < 2) {
        fprintf(stderr, "ddtree perplexity: the text has %d token%s: at least 2 are needed\n", n, n == 1 ? "" : "s");
        rc = 2;
        goto done;
    }
    ddt_engine_options eo;
    cli_engine_options(&a.eng, &eo);
    eo.mode = DDT_MODE_AR;
    eo.draft_dir = NULL;
    if ((st = ddt_engine_create(a.eng.model, &eo, &eng, &err)) != DDT_OK) {
        fprintf(stderr, "ddtree perplexity: %s\n", err.msg);
        rc = cli_status_exit(st);
        goto done;
    }
    const int32_t window = ddt_engine_max_ctx(eng);
    if (a.stride > window) {
        fprintf(stderr, "ddtree perplexity: --stride %lld is longer than the window of %d tokens\n", a.stride, window);
        rc = 2;
        goto done;
    }
    const int32_t stride = a.stride > 0 ? (int32_t)a.stride : window;
    lp = malloc((size_t)(n < window ? n : window) * sizeof *lp);
    nll_of = a.json ? malloc((size_t)n * sizeof *nll_of) : NULL;
    if (!lp || (a.json && !nll_of)) {
        fprintf(stderr, "ddtree perplexity: out of memory\n");
        rc = 1;
        goto done;
    }
    double nll = 0.0, t0 = ddt_engine_now();
    int64_t scored = 0;
    int32_t windows = 0;
    if (a.json)
        for (int32_t i = 0; i < n; i++) nll_of[i] = NAN;
    /* window at i covers [i, i + w); it counts from `reached` (the end of the window
       before it) on, and never its own first token, which nothing in it predicts */
    for (int32_t i = 0, reached = 0; reached < n; i += stride) {
        const int32_t w = n - i < window ? n - i : window;
        windows++;
        const int32_t from = reached > i + 1 ? reached : i + 1;
        reached = i + w;
        if (from >= i + w) continue; /* a last window of one token: nothing predicts it */
        if ((st = ddt_engine_score(eng, ids + i, w, 0, lp, &err)) != DDT_OK) {
            fprintf(stderr, "ddtree perplexity: tokens %d..%d: %s\n", i, i + w - 1, err.msg);
            rc = cli_status_exit(st);
            goto done;
        }
        for (int32_t k = from - i; k < w; k++) {
            nll -= (double)lp[k].logprob;
            if (a.json) nll_of[i + k] = (double)lp[k].logprob;
        }
        scored += i + w - from;
    }
    const double seconds = ddt_engine_now() - t0, mean = nll / (double)scored, ppl = exp(mean);
    if (a.json) {
        json_t *arr = json_array();
        for (int32_t i = 0; arr && i < n; i++)
            json_array_append_new(arr, isfinite(nll_of[i]) ? json_real(nll_of[i]) : json_null());
        json_t *id_arr = json_array();
        for (int32_t i = 0; id_arr && i < n; i++) json_array_append_new(id_arr, json_integer(ids[i]));
        o = json_pack("{s:i, s:I, s:i, s:i, s:i, s:f, s:f, s:f, s:o, s:o}", "tokens", n, "scored", (json_int_t)scored,
                      "windows", windows, "window", window, "stride", stride, "nll", mean, "perplexity", ppl,
                      "seconds", seconds, "ids", id_arr, "logprobs", arr);
        char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (!s) {
            fprintf(stderr, "ddtree perplexity: out of memory (or a non-finite value) for the JSON\n");
            rc = 1;
            goto done;
        }
        puts(s);
        free(s);
    } else {
        printf("perplexity %.4f\n", ppl);
    }
    fprintf(stderr,
            "ddtree perplexity: %d tokens in %d window%s of up to %d (%lld scored): perplexity %.4f (mean negative "
            "log-likelihood %.4f nats), %.1f tokens/s\n",
            n, windows, windows == 1 ? "" : "s", window, (long long)scored, ppl, mean,
            seconds > 0 ? (double)scored / seconds : 0.0);
    rc = 0;
done:
    json_decref(o);
    ddt_engine_free(eng);
    ddt_tokenizer_free(tok);
    free(ids);
    free(text);
    free(lp);
    free(nll_of);
    return rc;
}
