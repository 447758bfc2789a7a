#include "cli/cli.h"

const ds_cli_command ds_cli_commands[] = {
    {0, 0},
};
