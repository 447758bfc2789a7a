/* vllm_compat.h — `deltaserve serve` takes the command lines people already run vLLM with.
 *
 * Why: users move a working `vllm serve Qwen/Qwen3.5-35B-A3B --reasoning-parser qwen3
 * --speculative-config '{"method": "qwen3_next_mtp", "num_speculative_tokens": 2}' ...` over and
 * compare. The flags that mean the same thing here are taken (with the meaning stated in the
 * help); those whose behaviour deltaserve has anyway are accepted and do nothing; a value that
 * would mean something deltaserve cannot do (another reasoning format, tensor parallelism, an
 * EAGLE drafter) is an error naming the flag and what is supported, never silently ignored.
 *
 *   vllm                                   deltaserve
 *   serve MODEL (positional)               serve -m MODEL
 *   --speculative-config JSON              --num-speculative-tokens K (method must be MTP)
 *   --reasoning-parser qwen3               always on: reasoning_content from <think>
 *   --tool-call-parser qwen3_coder|qwen3_xml|hermes, --enable-auto-tool-choice
 *                                          always on: both Qwen3.5 tool-call forms parsed
 *   --tensor-parallel-size / -tp 1, --dtype auto|bfloat16, --trust-remote-code,
 *   --language-model-only                  what deltaserve does anyway
 *   --some_flag (underscores)              --some-flag (argparse-style spelling) */
#ifndef DS_CLI_VLLM_COMPAT_H
#define DS_CLI_VLLM_COMPAT_H

#include <stdbool.h>

/* A copy of argv whose long option names ("--a_b", "--a_b=v") are spelled with dashes; values
 * are left alone. NULL when out of memory. Free with ds_vllm_args_free. */
char **ds_vllm_normalize_args(int argc, char **argv);
void ds_vllm_args_free(int argc, char **args);

/* vLLM's --speculative-config JSON → the MTP draft count (0..max_k; absent: 1, the one MTP
 * layer of Qwen3.5 checkpoints, as vLLM defaults to the draft model's count). Accepts the MTP methods
 * ("mtp", "qwen3_next_mtp", "qwen3_5_mtp"; absent = MTP) and num_speculative_tokens; other keys
 * are vLLM tuning knobs without a meaning here and are named on stderr as ignored. False after
 * printing "deltaserve serve: --speculative-config: <why>". */
bool ds_vllm_spec_config(const char *json, int max_k, int *k);

/* Whether `value` is one of the accepted names of a vLLM parser option (--reasoning-parser,
 * --tool-call-parser); false after printing what is supported. */
bool ds_vllm_parser_ok(const char *opt, const char *value);

/* Flags without a value that deltaserve's behaviour already implies. */
bool ds_vllm_noop_flag(const char *arg);

#endif
