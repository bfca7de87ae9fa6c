/*
 * ddtree.c — entry point of the `ddtree` command: dispatches to a subcommand.
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} subcommand;

static const subcommand k_commands[] = {
    {"tree", ddt_cmd_tree, "build and walk a DDTree draft tree from a JSON problem on stdin"},
    {"generate", ddt_cmd_generate, "decode with a target model from a prompt (CPU or GPU)"},
    {"chat", ddt_cmd_chat, "a conversation on the terminal, through the model's chat template"},
    {"serve", ddt_cmd_serve, "serve the model over an OpenAI-compatible HTTP API"},
    {"perplexity", ddt_cmd_perplexity, "the target model's perplexity on a text (checks a checkpoint)"},
    {"calibrate", ddt_cmd_calibrate, "fit a drafter's draft calibration for a target (better greedy trees)"},
    {"inspect", ddt_cmd_inspect, "what a checkpoint holds and what each GPU must hold to run it"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: ddtree <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(f, "  %-10s %s\n", k_commands[i].name, k_commands[i].summary);
    fprintf(f, "\n'ddtree <command> --help' describes a command.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (!strcmp(argv[1], k_commands[i].name)) return k_commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ddtree: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
