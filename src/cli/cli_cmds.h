/* cli_cmds.h — the subcommands (one file each). */
#ifndef DS_CLI_CMDS_H
#define DS_CLI_CMDS_H

int ds_cmd_generate(int argc, char **argv);
int ds_cmd_score(int argc, char **argv);
int ds_cmd_tokenize(int argc, char **argv);
int ds_cmd_detokenize(int argc, char **argv);
int ds_cmd_info(int argc, char **argv);
int ds_cmd_serve(int argc, char **argv);
/* argv[0] = "serve": `deltaserve bench serve` (cmd_bench.c forwards). */
int ds_cmd_bench_serve(int argc, char **argv);
int ds_cmd_bench(int argc, char **argv);
int ds_cmd_render_chat(int argc, char **argv);

#endif
