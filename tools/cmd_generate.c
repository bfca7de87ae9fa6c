/*
 * cmd_generate.c — `ddtree generate`: decode with a target (and a DFlash drafter
 * for the chain and tree modes) on the CPU.  The prompt is text (--prompt), a
 * chat message in the model's chat template (--chat; text/chat.h), or token ids (--prompt-ids).
 * Text streams to stdout as rounds accept it (ids when the model has no
 * tokenizer); a summary goes to stderr; --json prints {"ids", "text", "stats"}
 * at the end instead.  Bad flags, files or prompts: a message and exit 2.
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
#include <sys/stat.h>

#include "cli_chat.h"
#include "cli_engine.h"
#include "commands.h"
#include "ddtree.h"
#include "engine/engine.h"
#include "text/chat.h"
#include "text/json_vocab.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

#define MAX_NEW_TOKENS 1000000 /* sanity bound on --max-tokens */
#define MAX_PROMPT_IDS (1 << 20)

static const char k_usage_head[] =
    "usage: ddtree generate --model DIR (--prompt TEXT | --chat TEXT | --prompt-ids ID,...)\n"
    "                       --max-tokens N [options]\n"
    "\n"
    "Decodes with the target model in DIR (config.json + safetensors [+ tiktoken.model or\n"
    "tokenizer.json]) on the CPU or, with --backend cuda, on the GPU.\n"
    "Options:\n";
static const char k_usage_tail[] =
    "  --prompt TEXT        prompt text (needs the model's tokenizer)\n"
    "  --prompt-file PATH   prompt text read from a file (at most 1 MiB)\n"
    "  --chat TEXT          a user message in the model's chat template (its own, else Kimi K2's)\n"
    "  --system TEXT        system message for --chat (default: the template's)\n"
    "  --prompt-ids LIST    comma-separated prompt token ids\n"
    "  --max-tokens N       tokens to generate, 0..1000000 (required)\n"
    "  --stop-at-eos        stop after the config's eos_token_id (and <|im_end|> with --chat)\n"
    "  --json-object        JSON mode: the answer is one JSON object (grammar-constrained decoding, the\n"
    "                       mask on every token the target chooses; needs the tokenizer; implies\n"
    "                       --stop-at-eos)\n"
    "  --presence-penalty X, --frequency-penalty X\n"
    "                       OpenAI's penalties on tokens generated so far, -2..2\n"
    "  --repetition-penalty X  vLLM's, on prompt and generated tokens, (0, 10], 1 = none\n"
    "  --json               print {\"ids\": [...], \"text\": \"...\", \"stats\": {...}} at the end\n"
    "  --logprobs N         with --json: each token's log-probability under the target and its N most\n"
    "                       likely alternatives, 0..20 (\"logprobs\": [{\"id\", \"logprob\", \"top\": [[id, lp]]}];\n"
    "                       CPU backend or one GPU)\n"
    "  --help               this text\n"
    "Exit status: 0 done, 2 bad arguments, model or prompt, 1 other failure.\n";

typedef struct gen_args {
    cli_engine_args eng;
    const char *prompt_text, *chat, *system;
    char *file_text; /* owned: --prompt-file contents */
    int n_text;      /* --prompt and --prompt-file flags given */
    int32_t *prompt;
    int32_t n_prompt;
    long long max_new;
    bool have_max_new;
    long long logprobs; /* -1: none */
    bool json;
    bool stop_eos;
    bool json_object; /* --json-object */
    float presence, frequency, repetition; /* the logit rules' penalties (0: none) */
} gen_args;

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static int usage_error(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cli_usage_error("generate", "%s", msg);
}

/* Parse argv; returns -1 to continue, else an exit status. */
static int parse_args(int argc, char **argv, gen_args *a) {
    cli_engine_defaults(&a->eng, "generate");
    a->logprobs = -1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int common = cli_engine_common_flag(&a->eng, k_usage_head, k_usage_tail, argc, argv, &i);
        if (common == 0 || common == 2) return common;
        if (common == 1) continue;
        if (!strcmp(f, "--json")) {
            a->json = true;
            continue;
        }
        if (!strcmp(f, "--stop-at-eos")) {
            a->stop_eos = true;
            continue;
        }
        if (!strcmp(f, "--json-object")) {
            a->json_object = a->stop_eos = true; /* a document ends at the stop id */
            continue;
        }
        static const char *const valued[] = {"--prompt-ids", "--max-tokens", "--prompt", "--chat", "--system",
                                             "--prompt-file", "--logprobs", "--presence-penalty",
                                             "--frequency-penalty", "--repetition-penalty"};
        const char *v = NULL;
        int has = cli_flag_value("generate", valued, sizeof valued / sizeof valued[0], argc, argv, &i, &v);
        if (has == 2) return 2;
        if (!has) return usage_error("unknown option '%s'", f);
        if (!strcmp(f, "--prompt")) {
            a->prompt_text = v;
            a->n_text++;
        } else if (!strcmp(f, "--prompt-file")) {
            free(a->file_text);
            size_t got;
            char why_buf[64];
            const char *why = cli_read_text_file(v, 1 << 20, "1 MiB", &a->file_text, &got, why_buf);
            if (why) return usage_error("--prompt-file %s: %s", v, why);
            a->prompt_text = a->file_text;
            a->n_text++;
        } else if (!strcmp(f, "--chat")) {
            a->chat = v;
        } else if (!strcmp(f, "--system")) {
            a->system = v;
        } else if (!strcmp(f, "--prompt-ids")) {
            free(a->prompt);
            a->prompt = NULL;
            if (!cli_parse_ids(v, MAX_PROMPT_IDS, &a->prompt, &a->n_prompt))
                return usage_error("--prompt-ids '%s': expected comma-separated integers", v);
        } else if (!strcmp(f, "--logprobs")) {
            if (!cli_parse_ll(v, 0, DDT_MAX_TOP_LOGPROBS, &a->logprobs))
                return usage_error("--logprobs '%s': expected an integer in 0..%d", v, DDT_MAX_TOP_LOGPROBS);
        } else if (!strcmp(f, "--presence-penalty") || !strcmp(f, "--frequency-penalty")) {
            float x;
            if (!cli_parse_float(v, &x) || !(x >= -2.0f && x <= 2.0f))
                return usage_error("%s '%s': expected a number in -2..2", f, v);
            *(f[2] == 'p' ? &a->presence : &a->frequency) = x;
        } else if (!strcmp(f, "--repetition-penalty")) {
            if (!cli_parse_float(v, &a->repetition) || !(a->repetition > 0.0f && a->repetition <= 10.0f))
                return usage_error("--repetition-penalty '%s': expected a number in (0, 10]", v);
        } else if (!strcmp(f, "--max-tokens")) {
            if (!cli_parse_ll(v, 0, MAX_NEW_TOKENS, &a->max_new))
                return usage_error("--max-tokens '%s': expected an integer in 0..1000000", v);
            a->have_max_new = true;
        }
    }
    if (!a->eng.model) return usage_error("--model is required");
    int sources = (a->prompt != NULL) + (a->prompt_text != NULL) + (a->chat != NULL);
    if (sources == 0)
        return usage_error("a prompt is required: --prompt TEXT, --prompt-file PATH, --chat TEXT or --prompt-ids");
    if (sources > 1 || a->n_text > 1)
        return usage_error("give one of --prompt, --prompt-file, --chat and --prompt-ids");
    if (!a->have_max_new) return usage_error("--max-tokens is required");
    if (a->logprobs >= 0 && !a->json) return usage_error("--logprobs prints with --json only");
    return cli_engine_check(&a->eng);
}

typedef struct stream_ctx {
    const ddt_tokenizer *tok;
    bool text;  /* stream decoded text; else ids */
    bool quiet; /* --json: print nothing until the end */
    const ddt_chat_markers *markers; /* --chat: these special tokens are printed, so the
                                        thinking and tool-call structure shows; else NULL */
    int64_t printed;
} stream_ctx;

static bool on_emit(void *ctx, const int32_t *ids, int32_t n) {
    stream_ctx *s = ctx;
    if (s->quiet) return true;
    for (int32_t i = 0; i < n; i++) {
        if (s->text) {
            cli_print_tokens(s->tok, s->markers, ids + i, 1);
        } else {
            printf("%s%d", s->printed ? " " : "", ids[i]);
        }
        s->printed++;
    }
    fflush(stdout);
    return true;
}


/* The auto budget's cost model in use (seconds on this machine: what the stop rule
 * weighs), for comparing it with the measured round times. */
static json_t *cost_json(const ddt_cost_model *c) {
    json_t *nodes = json_array(), *verify = json_array();
    for (int32_t i = 0; i < c->n_nodes; i++) json_array_append_new(nodes, json_real(c->nodes[i]));
    for (int32_t i = 0; i < c->n_nodes * c->n_contexts; i++) json_array_append_new(verify, json_real(c->verify[i]));
    return json_pack("{s:f, s:o, s:o, s:i}", "draft", (double)c->draft, "nodes", nodes, "verify", verify,
                     "contexts", c->n_contexts);
}

static json_t *stats_json(const ddt_gen_stats *s, const char *mode, int32_t budget, bool autob) {
    return json_pack("{s:s, s:i, s:b, s:b, s:I, s:i, s:i, s:i, s:i, s:i, s:I, s:f, s:f, s:f, s:i, s:i, s:{s:f, s:f, s:f, s:f, s:f, s:f, s:f}}",
                     "mode", mode, "budget", budget, "budget_auto", autob, "draft_calibrated", s->draft_calibrated,
                     "lookup_nodes", (json_int_t)s->lookup_nodes,
                     "prompt_tokens", s->prompt_tokens,
                     "tokens", s->tokens, "rounds", s->rounds, "ar_rounds", s->ar_rounds,
                     "auto_capped_rounds", s->auto_capped_rounds, "nodes_verified",
                     (json_int_t)s->nodes_verified,
                     "mean_acceptance", s->mean_acceptance, "expected_acceptance", s->expected_acceptance,
                     "tokens_per_s", s->tokens_per_s, "round_kernels",
                     s->round_kernels, "round_pdl_edges", s->round_pdl_edges, "seconds",
                     "prefill", s->t_prefill, "draft", s->t_draft, "build", s->t_build, "verify", s->t_verify,
                     "walk", s->t_walk, "commit", s->t_commit, "total", s->t_total);
}

int ddt_cmd_generate(int argc, char **argv) {
    gen_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) {
        free(a.prompt);
        free(a.file_text);
        return rc;
    }
    ddt_error err = {0};
    ddt_tokenizer *tok = NULL;
    ddt_chat_template *chat = NULL;
    ddt_engine *eng = NULL;
    int32_t *out = NULL;
    ddt_token_logprobs *lp = NULL;
    ddt_json_vocab *jv = NULL;
    char *text = NULL;
    ddt_status st;
    if ((rc = cli_engine_load_tokenizer(&a.eng, &tok)) >= 0) goto done;
    if (!tok && (a.prompt_text || a.chat)) {
        fprintf(stderr, "ddtree generate: --prompt and --chat need a tokenizer: %s has no tiktoken.model or "
                        "tokenizer.json\n",
                a.eng.model);
        rc = 2;
        goto done;
    }
    if (a.chat && (rc = cli_engine_load_chat_template(&a.eng, &chat)) >= 0) goto done;
    if (a.prompt_text || a.chat) {
        size_t cap = (a.prompt_text ? strlen(a.prompt_text) : strlen(a.chat) + (a.system ? strlen(a.system) : 0) +
                      (1u << 16)) + 64, n = 0;
        a.prompt = malloc(cap * sizeof(int32_t));
        if (!a.prompt) {
            fprintf(stderr, "ddtree generate: out of memory\n");
            rc = 1;
            goto done;
        }
        st = a.prompt_text ? ddt_tokenizer_encode(tok, a.prompt_text, strlen(a.prompt_text), 0, a.prompt, cap, &n, &err)
                           : ddt_chat_encode_prompt(chat, tok, a.system, a.chat, a.prompt, cap, &n, &err);
        if (st != DDT_OK) {
            fprintf(stderr, "ddtree generate: prompt: %s\n", err.msg);
            rc = cli_status_exit(st);
            goto done;
        }
        if (n == 0) {
            fprintf(stderr, "ddtree generate: the prompt is empty\n");
            rc = 2;
            goto done;
        }
        a.n_prompt = (int32_t)n;
    }
    ddt_engine_options eo;
    cli_engine_options(&a.eng, &eo);
    if ((st = ddt_engine_create(a.eng.model, &eo, &eng, &err)) != DDT_OK) {
        fprintf(stderr, "ddtree generate: %s\n", err.msg);
        rc = cli_status_exit(st);
        goto done;
    }
    /* the engine checks the context against the model and the prompt against the context */
    int32_t eos = ddt_engine_model_config(eng)->eos_token_id;
    long long ctx = ddt_engine_max_ctx(eng);
    int32_t stop[2], n_stop = 0;
    if (a.stop_eos && eos >= 0) stop[n_stop++] = eos;
    if (a.stop_eos && a.chat && tok) {
        int32_t im_end = ddt_tokenizer_token_id(tok, "<|im_end|>");
        if (im_end >= 0) stop[n_stop++] = im_end;
    }
    out = malloc((size_t)(a.max_new > 0 ? a.max_new : 1) * sizeof(int32_t));
    if (!out) {
        fprintf(stderr, "ddtree generate: out of memory\n");
        rc = 1;
        goto done;
    }
    if (a.logprobs >= 0) {
        lp = malloc((size_t)(a.max_new > 0 ? a.max_new : 1) * sizeof *lp);
        if (!lp) {
            fprintf(stderr, "ddtree generate: out of memory\n");
            rc = 1;
            goto done;
        }
        if ((st = ddt_engine_set_logprobs(eng, lp, (int32_t)a.max_new, (int32_t)a.logprobs, &err)) != DDT_OK) {
            fprintf(stderr, "ddtree generate: --logprobs: %s\n", err.msg);
            rc = cli_status_exit(st);
            goto done;
        }
    }
    if (a.json_object) {
        if (!tok) {
            fprintf(stderr, "ddtree generate: --json-object needs a tokenizer: %s has no tiktoken.model or "
                            "tokenizer.json\n",
                    a.eng.model);
            rc = 2;
            goto done;
        }
        if (n_stop == 0) {
            fprintf(stderr, "ddtree generate: --json-object: the model's config names no eos_token_id to end the "
                    "document with\n");
            rc = 2;
            goto done;
        }
        ddt_json_constraint c = {.vocab = NULL, .object_only = true};
        if ((st = ddt_json_vocab_create(tok, ddt_engine_vocab(eng), &jv, &err)) == DDT_OK) {
            c.vocab = jv;
            st = ddt_engine_set_constraint(eng, &c, &err);
        }
        if (st != DDT_OK) {
            fprintf(stderr, "ddtree generate: --json-object: %s\n", err.msg);
            rc = cli_status_exit(st);
            goto done;
        }
    }
    if (a.presence != 0.0f || a.frequency != 0.0f || a.repetition != 0.0f) {
        const ddt_logit_rules rules = {NULL, NULL, 0, a.presence, a.frequency, a.repetition};
        if ((st = ddt_engine_set_logit_rules(eng, &rules, &err)) != DDT_OK) {
            fprintf(stderr, "ddtree generate: the penalties: %s\n", err.msg);
            rc = cli_status_exit(st);
            goto done;
        }
    }
    ddt_chat_markers markers;
    if (a.chat && tok) ddt_chat_markers_find(tok, &markers);
    stream_ctx sc = {tok, tok != NULL, a.json, a.chat && tok ? &markers : NULL, 0};
    ddt_gen_stats gs;
    int32_t n_out = 0;
    st = ddt_engine_generate(eng, a.prompt, a.n_prompt, (int32_t)a.max_new, stop, n_stop, out, &n_out, on_emit,
                             &sc, &gs, &err);
    if (st != DDT_OK) {
        fprintf(stderr, "\nddtree generate: %s\n", err.msg);
        rc = cli_status_exit(st);
        goto done;
    }
    if (tok) {
        size_t cap = (size_t)n_out * 64 + 1, len = 0;
        text = malloc(cap);
        if (!text || ddt_tokenizer_decode(tok, out, (size_t)n_out, text, cap, &len, &err) != DDT_OK) {
            fprintf(stderr, "ddtree generate: decode: %s\n", text ? err.msg : "out of memory");
            rc = 1;
            goto done;
        }
        text[len < cap ? len : cap - 1] = '\0';
    }
    const char *why = ddt_stop_reason_name(gs.stop_reason);
    if (a.json) {
        json_t *o = json_object();
        json_t *ids = json_array();
        for (int32_t i = 0; i < n_out; i++) json_array_append_new(ids, json_integer(out[i]));
        json_object_set_new(o, "ids", ids);
        if (text) json_object_set_new(o, "text", ddt_utf8_json_string(text, strlen(text)));
        json_t *sj = stats_json(&gs, a.eng.mode, eo.budget, a.eng.budget_auto);
        if (sj) json_object_set_new(sj, "backend", json_string(ddt_backend_name(ddt_engine_backend(&eo))));
        const ddt_cost_model *cm = ddt_engine_cost(eng);
        if (sj && cm) json_object_set_new(sj, "cost_model", cost_json(cm));
        json_object_set_new(o, "stats", sj);
        json_object_set_new(o, "stop_reason", json_string(why));
        if (a.chat && tok) {
            json_t *m = cli_chat_message(tok, a.prompt, a.n_prompt, out, n_out);
            if (!m) {
                json_decref(o);
                fprintf(stderr, "ddtree generate: out of memory\n");
                rc = 1;
                goto done;
            }
            json_object_set_new(o, "message", m);
        }
        if (lp) {
            json_t *arr = json_array();
            for (int32_t i = 0; i < n_out; i++) {
                json_t *top = json_array();
                for (int32_t j = 0; j < lp[i].n_top; j++)
                    json_array_append_new(top, json_pack("[i, f]", lp[i].top_id[j], (double)lp[i].top_logprob[j]));
                /* a -inf (or NaN) value has no JSON number: null */
                json_array_append_new(arr, json_pack("{s:i, s:o, s:o}", "id", out[i], "logprob",
                                                     isfinite(lp[i].logprob) ? json_real(lp[i].logprob) : json_null(),
                                                     "top", top));
            }
            json_object_set_new(o, "logprobs", arr);
        }
        char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
        json_decref(o);
        if (!s) {
            fprintf(stderr, "ddtree generate: out of memory\n");
            rc = 1;
            goto done;
        }
        puts(s);
        free(s);
    } else {
        putchar('\n');
        fflush(stdout); /* before the summary on stderr */
    }
    if (gs.stop_reason == DDT_STOP_CONTEXT)
        fprintf(stderr, "ddtree generate: stopped after %d tokens: the context of %lld tokens is full\n", n_out, ctx);
    fprintf(stderr,
            "ddtree generate: mode %s%s%s on %s, %d prompt tokens, %d generated (%s) in %d rounds: %.2f tokens/s, "
            "mean acceptance %.2f tokens/round, %lld nodes verified\n"
            "  time: prefill %.3f s, draft %.3f s, build %.3f s, verify %.3f s, walk %.3f s, commit %.3f s\n",
            a.eng.mode, a.eng.budget_auto ? " (auto budget)" : "", gs.draft_calibrated ? " (calibrated)" : "",
            ddt_backend_name(ddt_engine_backend(&eo)), gs.prompt_tokens, gs.tokens, why, gs.rounds,
            gs.tokens_per_s, gs.mean_acceptance, (long long)gs.nodes_verified, gs.t_prefill, gs.t_draft,
            gs.t_build, gs.t_verify, gs.t_walk, gs.t_commit);
    rc = 0;
done:
    ddt_engine_free(eng);
    ddt_json_vocab_free(jv); /* after the engine, which held it */
    ddt_tokenizer_free(tok);
    ddt_chat_template_free(chat);
    free(out);
    free(lp);
    free(text);
    free(a.prompt);
    free(a.file_text);
    return rc;
}
