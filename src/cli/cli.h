/* cli.h — subcommand table. Each command returns the process exit code (0 ok, 1 runtime
 * failure such as a bad checkpoint, 2 bad usage). */
#ifndef DS_CLI_H
#define DS_CLI_H

typedef struct ds_cli_command {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
} ds_cli_command;

extern const ds_cli_command ds_cli_commands[];

#endif
