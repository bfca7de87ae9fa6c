/*
 * cmd_serve.c — `ddtree serve`: the engine behind an OpenAI-compatible HTTP
 * API (src/server/server.h).  Takes generate's engine options (cli_engine.h)
 * plus where to listen; runs until SIGINT or SIGTERM, then cancels what is in
 * flight and exits 0.  Bad flags, folders or an address in use: a message and
 * exit 2.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_engine.h"
#include "commands.h"

#ifdef DDT_HAVE_SERVER
#include <pthread.h>

#include "server/server.h"

static const char k_usage_head[] =
    "usage: ddtree serve --model DIR [--draft DIR] [engine options] [--host H] [--port P] [--api-key KEY]\n"
    "\n"
    "Serves the model over HTTP with an OpenAI-compatible API: POST /v1/chat/completions and\n"
    "/v1/completions (streaming with \"stream\": true), POST /tokenize and /detokenize, GET /v1/models,\n"
    "/health and /metrics.\n"
    "Requests are queued and decoded one at a time, in arrival order.  The sampling options below are\n"
    "the defaults for requests that leave them out; a request's \"speculative\": {\"mode\", \"budget\"}\n"
    "overrides --mode and --budget (CPU backend; budgets up to --max-budget).\n"
    "Engine options (as for generate):\n";
static const char k_usage_tail[] =
    "Server options:\n"
    "  --host ADDR          numeric address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)\n"
    "  --port N             TCP port (default 8000; 0 = any free port, printed at start)\n"
    "  --api-key KEY        require 'Authorization: Bearer KEY' on /v1/* (401 otherwise)\n"
    "  --served-model-name NAME  the model id of /v1/models and responses (default: the folder's name)\n"
    "  --max-body-bytes N   request body limit (default 1048576; 413 above)\n"
    "  --max-queue N        requests waiting for the engine (default 64; 503 above)\n"
    "  --no-prefix-cache    start every request from an empty context (by default the CPU engine\n"
    "                       reuses the previous request's context up to the first token where the\n"
    "                       prompts differ: the same output, less prefill; usage reports it as\n"
    "                       prompt_tokens_details.cached_tokens)\n"
    "  --help               this text\n"
    "Stops on SIGINT / SIGTERM.  Exit status: 0 stopped by a signal, 2 bad arguments, model or\n"
    "address, 1 other failure.\n";

typedef struct serve_args {
    cli_engine_args eng;
    const char *host, *api_key, *name;
    long long port, max_body, max_queue;
    bool no_prefix_cache;
} serve_args;

static int parse_args(int argc, char **argv, serve_args *a) {
    cli_engine_defaults(&a->eng, "serve");
    a->port = 8000;
    a->max_body = DDT_SERVER_DEFAULT_MAX_BODY;
    a->max_queue = DDT_SERVER_DEFAULT_QUEUE;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int common = cli_engine_common_flag(&a->eng, k_usage_head, k_usage_tail, argc, argv, &i);
        if (common == 0 || common == 2) return common;
        if (common == 1) continue;
        if (!strcmp(f, "--no-prefix-cache")) {
            a->no_prefix_cache = true;
            continue;
        }
        static const char *const valued[] = {"--host", "--port", "--api-key", "--served-model-name",
                                             "--max-body-bytes", "--max-queue"};
        const char *v = NULL;
        int got = cli_flag_value("serve", valued, sizeof valued / sizeof valued[0], argc, argv, &i, &v);
        if (got == 2) return 2;
        if (!got) return cli_usage_error("serve", "unknown option '%s'", f);
        if (!strcmp(f, "--host")) {
            a->host = v;
        } else if (!strcmp(f, "--api-key")) {
            if (!*v) return cli_usage_error("serve", "--api-key: the key is empty");
            a->api_key = v;
        } else if (!strcmp(f, "--served-model-name")) {
            if (!*v) return cli_usage_error("serve", "--served-model-name: the name is empty");
            a->name = v;
        } else if (!strcmp(f, "--port")) {
            if (!cli_parse_ll(v, 0, 65535, &a->port)) return cli_usage_error("serve", "--port '%s': expected 0..65535", v);
        } else if (!strcmp(f, "--max-body-bytes")) {
            if (!cli_parse_ll(v, 1024, 1LL << 30, &a->max_body))
                return cli_usage_error("serve", "--max-body-bytes '%s': expected 1024..1073741824", v);
        } else if (!strcmp(f, "--max-queue")) {
            if (!cli_parse_ll(v, 1, 1 << 20, &a->max_queue))
                return cli_usage_error("serve", "--max-queue '%s': expected 1..1048576", v);
        }
    }
    return cli_engine_check(&a->eng);
}

/* The folder's last path component, for the default model id. */
static const char *base_name(const char *path, char *buf, size_t n) {
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && path[start - 1] != '/') start--;
    snprintf(buf, n, "%.*s", (int)(len - start), path + start);
    return buf;
}

int ddt_cmd_serve(int argc, char **argv) {
    /* SIGINT / SIGTERM wait for sigwait below: blocked before any thread starts, so every thread inherits it */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error return, not a signal */

    serve_args a;
    memset(&a, 0, sizeof a);
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    ddt_tokenizer *tok = NULL;
    ddt_chat_template *chat = NULL;
    ddt_engine *eng = NULL;
    ddt_server *srv = NULL;
    ddt_error err = {0};
    if ((rc = cli_engine_load_tokenizer(&a.eng, &tok)) >= 0) goto done;
    if (tok && (rc = cli_engine_load_chat_template(&a.eng, &chat)) >= 0) goto done;
    ddt_engine_options eo;
    cli_engine_options(&a.eng, &eo);
    eo.prefix_cache = !a.no_prefix_cache;
    const bool cpu = ddt_engine_backend(&eo) == DDT_BACKEND_CPU;
    int32_t reserve = eo.budget > a.eng.max_budget ? eo.budget : (int32_t)a.eng.max_budget;
    /* on the CPU, room for every request's mode and budget up to --max-budget */
    if (cpu && a.eng.draft) eo.reserve_budget = reserve;
    ddt_status st = ddt_engine_create(a.eng.model, &eo, &eng, &err);
    if (st != DDT_OK) {
        fprintf(stderr, "ddtree serve: %s\n", err.msg);
        rc = cli_status_exit(st);
        goto done;
    }
    char name[256];
    ddt_server_options so = {0};
    so.host = a.host;
    so.port = (int)a.port;
    so.api_key = a.api_key;
    so.model_name = a.name ? a.name : base_name(a.eng.model, name, sizeof name);
    so.max_body = (size_t)a.max_body;
    so.max_queue = (int)a.max_queue;
    so.sampling = eo.sampling;
    so.has_draft = a.eng.draft != NULL;
    so.can_switch = so.can_chain = so.can_auto = cpu;
    if (!cpu && a.eng.gpus <= 1 && a.eng.draft && eo.mode != DDT_MODE_AR) {
        /* one GPU switches within what it allocated: ask it what it takes, then restore */
        ddt_mode m0;
        int32_t b0;
        bool auto0;
        ddt_engine_speculation(eng, &m0, &b0, &auto0);
        so.can_switch = true;
        so.can_chain = ddt_engine_set_speculation(eng, DDT_MODE_CHAIN, b0, false, &err) == DDT_OK;
        so.can_auto = ddt_engine_set_speculation(eng, DDT_MODE_TREE, b0, true, &err) == DDT_OK;
        if ((st = ddt_engine_set_speculation(eng, m0, b0, auto0, &err)) != DDT_OK) {
            fprintf(stderr, "ddtree serve: %s\n", err.msg);
            rc = cli_status_exit(st);
            goto done;
        }
    }
    so.can_logprobs = true; /* every engine reports them and scores (several GPUs: rank 0's rows) */
    so.can_json = true; /* every engine takes the grammars and the rules (the GPUs' rounds walk on the host) */
    so.can_logit_rules = true;
    so.max_budget = cpu && a.eng.draft ? reserve : eo.budget;
    so.default_budget = (int32_t)a.eng.budget;
    so.chat_template = chat;
    if ((st = ddt_server_start(eng, tok, &so, &srv, &err)) != DDT_OK) {
        fprintf(stderr, "ddtree serve: %s\n", err.msg);
        rc = cli_status_exit(st);
        goto done;
    }
    fprintf(stderr, "ddtree serve: model %s (mode %s%s, %s backend, context %d) listening on http://%s:%d\n",
            so.model_name, a.eng.mode, a.eng.budget_auto ? ", auto budget" : "", ddt_backend_name(ddt_engine_backend(&eo)),
            ddt_engine_max_ctx(eng), a.host ? a.host : "127.0.0.1", ddt_server_port(srv));
    if (chat) fprintf(stderr, "ddtree serve: chat template: %s\n", ddt_chat_template_origin(chat));
    int sig = 0;
    sigwait(&stop, &sig);
    fprintf(stderr, "ddtree serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
done:
    ddt_server_stop(srv);
    ddt_engine_free(eng);
    ddt_tokenizer_free(tok);
    ddt_chat_template_free(chat);
    return rc;
}

#else /* built without libmicrohttpd */

int ddt_cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "ddtree serve: this build has no HTTP server: install libmicrohttpd-dev "
                    "(scripts/install-deps.sh) and rebuild\n");
    return 2;
}

#endif
