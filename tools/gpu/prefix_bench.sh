#!/bin/bash
# Prefix caching measured (tools/gpu/run_all.sh part prefix_bench; runnable alone): serve_bench.sh
# (no offline part) with bench serve --multi-turn 4 --turn-input-len 64 — conversations whose
# every later turn sends the last turn's prompt + output + 64 new ids — first with prefix caching
# (the default), then with --no-enable-prefix-caching; then a table of TTFT for first and later
# turns, TPOT and the later turns' cached tokens per (setting, concurrency).
# Model: the 35B-A3B shape with dummy weights (PB_MODEL / PB_DUMMY=0 for a checkpoint), 2048-token
# first prompts, 128 output tokens, concurrency 1 and 4.
# Needs BIN and OUT; writes $OUT/prefix_bench.log and $OUT/pb-{on,off}/serve_bench.*. The whole
# stays under DS_PART_BUDGET_S (default 170) seconds. A CPU check of the plumbing:
#   BIN=build OUT=/tmp/pb PB_MODEL=models/qwen35-demo PB_DUMMY=0 PB_IN=256 PB_MAX_LEN=2048 DS_SB_DEVICE=cpu \
#     bash tools/gpu/prefix_bench.sh
set -uo pipefail
BIN=${BIN:?} OUT=${OUT:?}
budget=${DS_PART_BUDGET_S:-170}
mkdir -p "$OUT"
log="$OUT/prefix_bench.log"
rc_all=0
for setting in on off; do
    args=""; [ $setting = off ] && args=--no-enable-prefix-caching
    echo "### prefix caching $setting" >> "$log"
    OUT="$OUT/pb-$setting" DS_PART_BUDGET_S=$(( (budget - 10) / 2 )) \
        DS_SB_MODEL=${PB_MODEL:-configs/qwen3.5-35b-a3b} DS_SB_DUMMY=${PB_DUMMY:-1} DS_SB_OFFLINE=0 \
        DS_SB_LEVELS="1 4" DS_SB_IN=${PB_IN:-2048} DS_SB_OUT_LEN=128 DS_SB_MAX_LEN=${PB_MAX_LEN:-8192} \
        DS_SB_BENCH_ARGS="--multi-turn 4 --turn-input-len 64" DS_SB_SERVE_ARGS="$args" \
        BIN=$BIN bash tools/gpu/serve_bench.sh >> "$log" 2>&1 || rc_all=1
done
python3 - "$OUT" >> "$log" 2>&1 <<'PY' || rc_all=1
import json, os, sys
out = sys.argv[1]
print("\nprefix caching  concurrency  ttft_first_turn_ms  ttft_later_turns_ms  median_tpot_ms  later_cached/input")
for s in ("on", "off"):
    p = os.path.join(out, f"pb-{s}", "serve_bench.jsonl")
    if not os.path.exists(p):
        print(f"{s:>14}  (no results)")
        continue
    for line in open(p):
        for r in json.loads(line).get("runs", []):
            print(f"{s:>14}  {r.get('max_concurrency')!s:>11}  {r.get('mean_ttft_first_turn_ms', 0):18.2f}"
                  f"  {r.get('mean_ttft_later_turns_ms', 0):19.2f}  {r.get('median_tpot_ms', 0):14.3f}"
                  f"  {r.get('later_turn_cached_tokens', 0):.0f}/{r.get('later_turn_input_tokens', 0):.0f}")
PY
cat "$log"
exit $rc_all
