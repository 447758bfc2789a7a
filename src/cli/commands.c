#include "cli/cli.h"
#include "cli/cli_cmds.h"

const ds_cli_command ds_cli_commands[] = {
    {"score", ds_cmd_score},
    {0, 0},
};
