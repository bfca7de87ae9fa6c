/*
 * cli_engine.h — the engine options that `ddtree generate` and `ddtree serve`
 * share (model, drafter, mode, budget, backend, sampling, context, threads):
 * one parser, one usage text and one translation to ddt_engine_options, so the
 * two commands accept the same flags with the same checks and messages.
 */
#ifndef DDT_TOOLS_CLI_ENGINE_H
#define DDT_TOOLS_CLI_ENGINE_H

#include <stdbool.h>

#include "core/calibration.h"
#include "ddtree.h"
#include "engine/engine.h"
#include "text/chat.h"
#include "text/tokenizer.h"

/* The usage lines of the shared options, for a command's --help. */
extern const char cli_engine_usage[];

typedef struct cli_engine_args {
    const char *cmd; /* "generate", "serve": named in messages */
    const char *model, *draft, *mode, *backend;
    const char *chat_template; /* --chat-template: a file replacing the folder's template */
    long long budget, max_budget;
    bool budget_auto;
    float temperature;
    long long top_k;
    float top_p;
    unsigned long long seed;
    long long ctx, threads, gpus;
    int pdl_edges; /* DDT_PDL_EDGES_* */
    bool fast_attention, tensor_cores, host_sampler, no_pdl, no_phase_times, no_lookup;
    const char *calibration; /* --calibration FILE|none; NULL: the drafter folder's own, where it applies */
    bool have_cal;           /* cli_engine_check loaded one into cal */
    ddt_draft_calibration cal;
} cli_engine_args;

/* The defaults (mode ar, backend cpu, budget 32, auto cap 64, greedy). */
void cli_engine_defaults(cli_engine_args *a, const char *cmd);

/* argv[*i] (with its value argv[*i + 1]): 0 when it is not a shared option,
 * 1 when taken (*i moved past the value), 2 after printing a usage error. */
int cli_engine_parse_flag(cli_engine_args *a, int argc, char **argv, int *i);

/* The start of a command's option loop, shared: --help / -h prints head, the
 * engine options and tail (returns 0); a shared option is taken (1); a usage
 * error was printed (2); -1: argv[*i] is for the command itself. */
int cli_engine_common_flag(cli_engine_args *a, const char *head, const char *tail, int argc, char **argv, int *i);

/* When argv[*i] is one of names[0..n): its value in *value, *i moved past it,
 * returns 1; 0 when it is none of them; 2 after a usage error (no value). */
int cli_flag_value(const char *cmd, const char *const *names, size_t n, int argc, char **argv, int *i,
                   const char **value);

/* Checks across options (a model given, mode and backend known, a drafter for
 * chain / tree) and that the folders exist, and loads the draft calibration
 * (--calibration FILE; by default the drafter folder's draft_calibration.json
 * when there is one): -1 when fine, else 2 after a message. */
int cli_engine_check(cli_engine_args *a);

/* The engine options these arguments ask for. */
void cli_engine_options(const cli_engine_args *a, ddt_engine_options *o);

/* The model folder's tokenizer when it has tiktoken.model or tokenizer.json (*tok
 * NULL when it has neither): -1 when fine, else an exit status after a message. */
int cli_engine_load_tokenizer(const cli_engine_args *a, ddt_tokenizer **tok);
/* The chat template (chat.h): --chat-template's file, else the model folder's
 * own, else the built-in Kimi K2 one: -1 when loaded, else the exit code after
 * printing the error. */
int cli_engine_load_chat_template(const cli_engine_args *a, ddt_chat_template **t);

/* Print "ddtree CMD: <message>" and the --help hint to stderr; returns 2. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
int cli_usage_error(const char *cmd, const char *fmt, ...);

/* A comma-separated list of integers (token ids; range checks are the caller's),
 * at most max of them: a malloc'd array in *out, its length in *n; false when
 * malformed, too long or out of memory. */
bool cli_parse_ids(const char *s, size_t max, int32_t **out, int32_t *n);

/* Read a text file of at most max bytes (limit names max in a message, e.g. "1 MiB")
 * into a malloc'd NUL-terminated *out of *len bytes.  NULL when done; else why not,
 * in words (the system's error, "read error", "larger than <limit>", "holds a NUL
 * byte", "out of memory"), with nothing allocated.  buf, [64]: room for the words. */
const char *cli_read_text_file(const char *path, size_t max, const char *limit, char **out, size_t *len, char *buf);

/* Strict number parsing: the whole string, within [lo, hi]. */
bool cli_parse_ll(const char *s, long long lo, long long hi, long long *out);
bool cli_parse_float(const char *s, float *out);

/* Exit status for a library failure: bad input 2, resources or bugs 1. */
int cli_status_exit(ddt_status st);

#endif
