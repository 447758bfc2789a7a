#!/bin/bash
# Acceptance on the device (runner.h ds_runner_step_ahead) on and off, served with
# --num-speculative-tokens 2 (tools/gpu/run_all.sh part spec_accept_bench; runnable alone):
# for each model, serve_bench.sh (no offline part) with DS_OPT_SPEC_DEVICE_ACCEPT=1, then =0, twice
# (SAB_VAR=DS_OPT_SPEC_ASYNC compares chained verifications on / off instead, runner.h;
# SAB_VAR=DS_OPT_SPEC_DEVICE_SAMPLE with SAB_BENCH_ARGS="--temperature 0.8" sampled requests
# verified on the device (spec_sample) or on the host; SAB_BENCH_ARGS goes to bench serve)
# (rounds a, b: the spread between rounds shows the noise),
# at max concurrency 1 and 4, random prompts, ignore_eos; then one table of median TPOT, output
# throughput and the steps accepted on the device per (model, switch, concurrency).
#   - configs/qwen3.5-35b-a3b, dummy weights: nothing is accepted (random MTP head), so every
#     step emits one token and the difference is the host round trip between verify and draft;
#   - models/qwen35-demo (trained MTP head, tiny: its steps take well under a millisecond, so
#     host time weighs most there).
# Needs BIN and OUT; writes $OUT/spec_accept_bench.log (and a serve_bench.* per run under
# $OUT/sab-<model>-<switch><round>/). The whole stays under DS_PART_BUDGET_S (default 170) seconds.
# SAB_ONLY=demo (or 35b) runs one model; with DS_SB_DEVICE=cpu that checks the plumbing here:
#   BIN=build OUT=/tmp/sab SAB_ONLY=demo DS_SB_DEVICE=cpu bash tools/gpu/spec_accept_bench.sh
set -uo pipefail
BIN=${BIN:?} OUT=${OUT:?}
budget=${DS_PART_BUDGET_S:-170}
mkdir -p "$OUT"
log="$OUT/spec_accept_bench.log"
# four serve_bench runs a model (two rounds of the switch on and off), two models unless SAB_ONLY
runs=8; [ -n "${SAB_ONLY:-}" ] && runs=4
per=$(( (budget - 10) / runs ))
var=${SAB_VAR:-DS_OPT_SPEC_DEVICE_ACCEPT}
rc_all=0
run() { # name model dummy in out
    local name=$1 model=$2 dummy=$3 in_len=$4 out_len=$5 sw
    [ -n "${SAB_ONLY:-}" ] && [ "$SAB_ONLY" != "$name" ] && return
    for rep in a b; do for sw in 1 0; do
        echo "### $name $var=$sw (round $rep)" >> "$log"
        env "$var=$sw" OUT="$OUT/sab-$name-$sw$rep" DS_PART_BUDGET_S=$per \
            DS_SB_MODEL=$model DS_SB_DUMMY=$dummy DS_SB_SPEC=2 DS_SB_OFFLINE=0 \
            DS_SB_BENCH_ARGS="${SAB_BENCH_ARGS:-}" DS_SB_LEVELS="1 4" DS_SB_IN=$in_len DS_SB_OUT_LEN=$out_len DS_SB_MAX_LEN=1024 \
            BIN=$BIN bash tools/gpu/serve_bench.sh >> "$log" 2>&1 || rc_all=1
        grep -E '^(deltaserve:(engine_steps_total|spec_device_accepts_total|spec_chained_verifications_total|spec_sampled_verifications_total|generation_tokens_total)|vllm:spec_decode_num_(drafts|accepted_tokens)_total)' \
            "$OUT/sab-$name-$sw$rep/serve_bench.log" | sed "s/^/  $name $sw$rep: /" >> "$log"
    done; done
}
run 35b configs/qwen3.5-35b-a3b 1 256 256
run demo models/qwen35-demo 0 128 256
python3 - "$OUT" "$var" >> "$log" 2>&1 <<'PY'
import json, os, sys
out = sys.argv[1]
print(f"\n{sys.argv[2]}: 1 on, 0 off (a, b: rounds)")
print("model         switch  concurrency  median_tpot_ms  mean_tpot_ms  output_tok_s  mean_acc_len")
for name in ("35b", "demo"):
    for sw in ("1a", "0a", "1b", "0b"):
        p = os.path.join(out, f"sab-{name}-{sw}", "serve_bench.jsonl")
        if not os.path.exists(p):
            print(f"{name:6} {sw:>13}  (no results)")
            continue
        for line in open(p):
            top = json.loads(line)
            acc = top.get("spec_decode", {}).get("mean_accepted_length", 0)
            for r in top.get("runs", []):
                print(f"{name:6} {sw:>13}  {r.get('max_concurrency')!s:>11}  {r.get('median_tpot_ms', 0):14.3f}"
                      f"  {r.get('mean_tpot_ms', 0):12.3f}  {r.get('output_throughput', 0):12.1f}"
                      f"  {acc:12.2f}")
PY
cat "$log"
exit $rc_all
