/*
 * cmd_chat.c — `ddtree chat`: a conversation on the terminal.  Each line read
 * from stdin is a user turn; the whole conversation goes through the model's
 * chat template (text/chat.h), the answer streams to stdout as it is decoded
 * (thinking and tool-call markers shown, cli_chat.h) and joins the history as
 * the assistant message serve would return.  On the CPU the engine's prefix
 * cache keeps the conversation's context, so a turn prefills only what it
 * adds.  Lines "/reset" (forget the conversation) and "/exit"; end of input
 * ends it.  A per-turn summary goes to stderr.  Exit status 0, or 2 for bad
 * flags or a model that cannot be loaded.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_chat.h"
#include "cli_engine.h"
#include "commands.h"
#include "core/error.h"
#include "ddtree.h"
#include "engine/engine.h"
#include "text/chat.h"
#include "text/tokenizer.h"

#define CHAT_MAX_LINE (1 << 20)

static const char k_usage_head[] =
    "usage: ddtree chat --model DIR [--draft DIR] [engine options] [--system TEXT] [--max-tokens N]\n"
    "                   [--template-kwargs JSON]\n"
    "\n"
    "A conversation on the terminal: every line of stdin is a user turn, answered through the model's\n"
    "chat template (its own, --chat-template's, or Kimi K2's).  Lines /reset and /exit; end of input ends.\n"
    "Engine options (as for generate):\n";
static const char k_usage_tail[] =
    "Chat options:\n"
    "  --system TEXT        the conversation's system message (default: the template's)\n"
    "  --max-tokens N       at most N tokens an answer (default 512)\n"
    "  --template-kwargs J  a JSON object of chat-template variables, e.g. '{\"thinking\": false}'\n"
    "  --help               this text\n";

typedef struct chat_args {
    cli_engine_args eng;
    const char *system, *kwargs;
    long long max_new;
} chat_args;

static int parse_args(int argc, char **argv, chat_args *a) {
    cli_engine_defaults(&a->eng, "chat");
    a->max_new = 512;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int common = cli_engine_common_flag(&a->eng, k_usage_head, k_usage_tail, argc, argv, &i);
        if (common == 0 || common == 2) return common;
        if (common == 1) continue;
        static const char *const valued[] = {"--system", "--max-tokens", "--template-kwargs"};
        const char *v = NULL;
        int has = cli_flag_value("chat", valued, sizeof valued / sizeof valued[0], argc, argv, &i, &v);
        if (has == 2) return 2;
        if (!has) return cli_usage_error("chat", "unknown option '%s'", f);
        if (!strcmp(f, "--system")) {
            a->system = v;
        } else if (!strcmp(f, "--template-kwargs")) {
            a->kwargs = v;
        } else if (!cli_parse_ll(v, 1, 1000000, &a->max_new)) {
            return cli_usage_error("chat", "--max-tokens '%s': expected an integer in 1..1000000", v);
        }
    }
    return cli_engine_check(&a->eng);
}

typedef struct turn_ctx {
    const ddt_tokenizer *tok;
    const ddt_chat_markers *markers;
} turn_ctx;

static bool on_emit(void *ctx, const int32_t *ids, int32_t n) {
    const turn_ctx *t = ctx;
    cli_print_tokens(t->tok, t->markers, ids, n);
    fflush(stdout);
    return true;
}

/* The conversation so far: the system message (when given) and nothing else. */
static json_t *fresh_history(const char *system) {
    json_t *h = json_array();
    if (h && system) json_array_append_new(h, json_pack("{s:s, s:s}", "role", "system", "content", system));
    return h;
}

int ddt_cmd_chat(int argc, char **argv) {
    chat_args a;
    memset(&a, 0, sizeof a);
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0) return rc;
    ddt_tokenizer *tok = NULL;
    ddt_chat_template *tmpl = NULL;
    ddt_engine *eng = NULL;
    json_t *history = NULL, *kwargs = NULL;
    int32_t *out = NULL, *prompt = NULL;
    char *line = NULL;
    ddt_error err = {0};
    if ((rc = cli_engine_load_tokenizer(&a.eng, &tok)) >= 0) goto done;
    if (!tok) {
        fprintf(stderr, "ddtree chat: %s has no tokenizer (tiktoken.model or tokenizer.json)\n", a.eng.model);
        rc = 2;
        goto done;
    }
    if ((rc = cli_engine_load_chat_template(&a.eng, &tmpl)) >= 0) goto done;
    if (a.kwargs) {
        json_error_t je;
        kwargs = json_loads(a.kwargs, 0, &je);
        if (!json_is_object(kwargs)) {
            fprintf(stderr, "ddtree chat: --template-kwargs: expected a JSON object (%s)\n",
                    kwargs ? "not an object" : je.text);
            rc = 2;
            goto done;
        }
    }
    ddt_engine_options eo;
    cli_engine_options(&a.eng, &eo);
    eo.prefix_cache = true; /* each turn re-sends the conversation: its context is reused */
    ddt_status st = ddt_engine_create(a.eng.model, &eo, &eng, &err);
    if (st != DDT_OK) {
        fprintf(stderr, "ddtree chat: %s\n", err.msg);
        rc = cli_status_exit(st);
        goto done;
    }
    out = malloc((size_t)a.max_new * sizeof *out);
    history = fresh_history(a.system);
    if (!out || !history) {
        fprintf(stderr, "ddtree chat: out of memory\n");
        rc = 1;
        goto done;
    }
    int32_t stop[2], n_stop = 0;
    int32_t eos = ddt_engine_model_config(eng)->eos_token_id, im_end = ddt_tokenizer_token_id(tok, "<|im_end|>");
    if (eos >= 0) stop[n_stop++] = eos;
    if (im_end >= 0 && im_end != eos) stop[n_stop++] = im_end;
    ddt_chat_markers markers;
    ddt_chat_markers_find(tok, &markers);
    turn_ctx tc = {tok, &markers};
    const bool tty = isatty(0) && isatty(2);
    size_t cap = 0;
    for (;;) {
        if (tty) fputs("> ", stderr);
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
        if (got == 0) continue;
        if (got > CHAT_MAX_LINE) {
            fprintf(stderr, "ddtree chat: a line of %zd bytes is over the limit of %d\n", got, CHAT_MAX_LINE);
            continue;
        }
        if (!strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            json_decref(history);
            if (!(history = fresh_history(a.system))) break;
            fprintf(stderr, "ddtree chat: the conversation starts afresh\n");
            continue;
        }
        json_t *user = json_pack("{s:s, s:s%}", "role", "user", "content", line, (size_t)got);
        if (!user) {
            fprintf(stderr, "ddtree chat: the line is not valid UTF-8: not sent\n");
            continue;
        }
        json_array_append_new(history, user);
        ddt_chat_input in = {history, NULL, kwargs, true};
        size_t n_prompt = 0;
        free(prompt);
        prompt = NULL;
        st = ddt_chat_encode(tmpl, tok, &in, &prompt, &n_prompt, &err);
        int32_t n_out = 0;
        ddt_gen_stats gs;
        if (st == DDT_OK && (n_prompt == 0 || n_prompt >= (size_t)ddt_engine_max_ctx(eng)))
            st = ddt_fail(&err, DDT_ERR_RANGE, "the conversation has %zu tokens, the context holds %d: /reset",
                          n_prompt, ddt_engine_max_ctx(eng));
        if (st == DDT_OK)
            st = ddt_engine_generate(eng, prompt, (int32_t)n_prompt, (int32_t)a.max_new, stop, n_stop, out, &n_out,
                                     on_emit, &tc, &gs, &err);
        if (st != DDT_OK) {
            fprintf(stderr, "\nddtree chat: %s\n", err.msg);
            json_array_remove(history, json_array_size(history) - 1); /* the turn did not happen */
            continue;
        }
        putchar('\n');
        fflush(stdout);
        /* the answer without its stop token joins the conversation */
        int32_t n_answer = n_out > 0 && gs.stop_reason == DDT_STOP_TOKEN ? n_out - 1 : n_out;
        json_t *reply = cli_chat_message(tok, prompt, (int32_t)n_prompt, out, n_answer);
        if (!reply || json_array_append_new(history, reply)) {
            fprintf(stderr, "ddtree chat: out of memory\n");
            rc = 1;
            goto done;
        }
        fprintf(stderr, "ddtree chat: %d prompt tokens (%d from the previous turn), %d generated (%s), "
                "%.1f tokens/s, mean acceptance %.2f\n", gs.prompt_tokens, gs.cached_tokens, n_out,
                ddt_stop_reason_name(gs.stop_reason), gs.tokens_per_s, gs.mean_acceptance);
    }
    rc = 0;
done:
    free(line);
    free(prompt);
    free(out);
    if (history) json_decref(history);
    if (kwargs) json_decref(kwargs);
    ddt_engine_free(eng);
    ddt_chat_template_free(tmpl);
    ddt_tokenizer_free(tok);
    return rc;
}
