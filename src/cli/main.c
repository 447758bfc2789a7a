/* deltaserve — command-line entry point: dispatches to one subcommand per file. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static void print_usage(FILE *f) {
    fprintf(f,
            "usage: deltaserve <command> [options]\n"
            "commands:\n"
            "  generate    generate text from a prompt (or token ids)\n"
            "  score       teacher-forced logits summary per position\n"
            "  tokenize    text -> token ids\n"
            "  detokenize  token ids -> text\n"
            "  info        model shape, parameter count and memory needs\n"
            "  render-chat render a conversation with the model's chat template\n"
            "  serve       OpenAI-compatible HTTP server\n"
            "  bench       offline engine benchmark (prefill, decode step at batch sizes)\n"
            "  bench serve load generator against a running server (vllm bench serve style)\n"
            "run 'deltaserve <command> --help' for the options of a command\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        print_usage(stdout);
        return 0;
    }
    for (const ds_cli_command *c = ds_cli_commands; c->name; c++)
        if (!strcmp(c->name, cmd)) return c->run(argc - 1, argv + 1);
    fprintf(stderr, "deltaserve: unknown command '%s'\n", cmd);
    print_usage(stderr);
    return 2;
}
