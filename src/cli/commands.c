#include "cli/cli.h"
#include "cli/cli_cmds.h"

const ds_cli_command ds_cli_commands[] = {
    {"generate", ds_cmd_generate},
    {"score", ds_cmd_score},
    {"tokenize", ds_cmd_tokenize},
    {"detokenize", ds_cmd_detokenize},
    {"info", ds_cmd_info},
    {"serve", ds_cmd_serve},
    {"bench", ds_cmd_bench},
    {"render-chat", ds_cmd_render_chat},
    {0, 0},
};
