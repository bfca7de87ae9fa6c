/*
 * commands.h — the subcommands of the `ddtree` command-line program.  Each takes
 * the arguments after its name (argv[0] is the subcommand) and returns the
 * process exit status: 0 success, 2 bad input or usage, 1 other failure.
 */
#ifndef DDT_TOOLS_COMMANDS_H
#define DDT_TOOLS_COMMANDS_H

int ddt_cmd_tree(int argc, char **argv);
int ddt_cmd_generate(int argc, char **argv);
int ddt_cmd_serve(int argc, char **argv);
int ddt_cmd_perplexity(int argc, char **argv);
int ddt_cmd_chat(int argc, char **argv);
int ddt_cmd_calibrate(int argc, char **argv);
int ddt_cmd_inspect(int argc, char **argv);

#endif
