#!/usr/bin/env bash
# `deltaserve serve` options beyond the API tests (server_api.sh):
#  - --dummy-weights / --seed / --tokenizer: a config-only directory served with random weights
#    and another checkpoint's tokenizer answers completions; same seed → same tokens, another
#    seed → other tokens; no tokenizer, or a tokenizer with ids past the model's vocabulary, is
#    refused with a message;
#  - --num-speculative-tokens 2 on the demo model (MTP head): greedy ids equal the server without
#    speculation and `deltaserve generate`; /metrics has the vllm:spec_decode_* counters,
#    consistent (accepted ≤ draft tokens, per-position sum = accepted, drafts > 0); `bench serve`
#    reports the acceptance rate and puts it in its JSON;
#  - the greedy decode path (DS_SERVE_GRAPHS=force: ids-only steps, as with fused argmax/graphs
#    on a device): concurrent greedy requests equal `deltaserve generate`.
# Every wait is bounded; the servers are killed on exit.
set -u
BIN=${DS_BIN:-build/deltaserve}
DATA=${DS_TEST_DATA:-tests/data}
DEMO=$DATA/../../models/qwen35-demo
command -v curl >/dev/null && command -v node >/dev/null || { echo "SKIP: needs curl and node"; exit 0; }
[ -f "$DEMO/tokenizer.json" ] || { echo "SKIP: no demo model at $DEMO"; exit 0; }

source "$(dirname "${BASH_SOURCE[0]}")/lib/server_test.sh"

# start_server NAME ARGS... → PORT, SPID; its stop_server calls allow 30 s for a clean exit
# (as before the shared helpers: slow under the sanitizers)
start_server() {
  local name=$1; shift
  launch_server "$name" serve --port 0 --device cpu --threads 2 --max-model-len 512 --max-num-seqs 4 "$@"
}
# complete BODY → the response in $tmp/out
complete() {
  curl -s --max-time 120 -o "$tmp/out" -H 'Content-Type: application/json' \
    --data-binary "$1" "http://127.0.0.1:$PORT/v1/completions"
}
ids() { js 'd.choices[0].token_ids.join(",")' <"$tmp/out"; }
metric() { # metric NAME [LABEL-SUBSTRING] → value from $tmp/metrics
  grep "^$1{" "$tmp/metrics" | grep -F "${2:-}" | awk '{s+=$2} END {print s+0}'; }

# ---- --dummy-weights, --seed, --tokenizer ------------------------------------------------------
mkdir -p "$tmp/cfg"
cp "$DEMO/config.json" "$tmp/cfg/"   # vocab 6144 ≥ the demo tokenizer's 6005 ids; no tokenizer
"$BIN" serve -m "$tmp/cfg" --dummy-weights --port 0 --device cpu >/dev/null 2>"$tmp/err"; rc=$?
check "no tokenizer: rc 2 ($rc)" [ $rc -eq 2 ]
check "no tokenizer: message names --tokenizer" grep -q "has no tokenizer.json.*--tokenizer DIR" "$tmp/err"
"$BIN" serve -m "$DATA/models/tiny-moe" --dummy-weights --tokenizer "$DEMO" --port 0 --device cpu \
  >/dev/null 2>"$tmp/err"; rc=$?
check "tokenizer past the vocabulary: rc 2 ($rc)" [ $rc -eq 2 ]
check "tokenizer past the vocabulary: message" grep -q "token ids up to 6004 but the model's vocabulary.* is 512" "$tmp/err"

BODY='{"prompt":"Once upon a time","max_tokens":12,"temperature":0,"ignore_eos":true,"return_token_ids":true}'
declare -A DUMMY
for run in a:1 b:1 c:2; do
  name=${run%%:*}; seed=${run##*:}
  start_server "dummy_$name" -m "$tmp/cfg" --dummy-weights --seed "$seed" --tokenizer "$DEMO"
  check "dummy $name: DUMMY WEIGHTS in the banner" grep -q "DUMMY WEIGHTS" "$tmp/dummy_$name.log"
  complete "$BODY"
  n=$(js 'd.choices[0].token_ids.length' <"$tmp/out")
  check "dummy $name: 12 tokens ($n): $(head -c 300 "$tmp/out")" [ "$n" = 12 ]
  check "dummy $name: prompt tokenised by the demo tokenizer" \
    [ "$(js 'd.usage.prompt_tokens' <"$tmp/out")" = "$(js 'd.choices[0].prompt_token_ids.length' <"$tmp/out")" ]
  DUMMY[$name]=$(ids)
  stop_server "$SPID" 300
done
check "dummy: same seed, same tokens" [ "${DUMMY[a]}" = "${DUMMY[b]}" ]
check "dummy: other seed, other tokens" [ "${DUMMY[a]}" != "${DUMMY[c]}" ]

# ---- --num-speculative-tokens ----------------------------------------------------------------
PROMPT=3,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3
"$BIN" generate -m "$DEMO" --device cpu --tokens "$PROMPT" -n 40 --ignore-eos --print-ids \
  >"$tmp/gen" 2>/dev/null || bad "generate failed"
GBODY="{\"prompt\":[$PROMPT],\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true,\"return_token_ids\":true}"

start_server plain -m "$DEMO"
complete "$GBODY"; PLAIN=$(ids)
curl -s --max-time 10 "http://127.0.0.1:$PORT/metrics" >"$tmp/metrics"
check "k=0: no spec counters" [ "$(grep -c '^vllm:spec_decode' "$tmp/metrics")" = 0 ]
stop_server "$SPID" 300
check "k=0 server = generate" [ "$PLAIN" = "$(cat "$tmp/gen")" ]

"$BIN" serve -m "$DEMO" --num-speculative-tokens 5 --port 0 --device cpu >/dev/null 2>"$tmp/err"; rc=$?
check "k=5 refused with rc 2 ($rc)" [ $rc -eq 2 ]
start_server spec -m "$DEMO" --num-speculative-tokens 2
check "k=2 in the banner" grep -q "speculative decoding k=2" "$tmp/spec.log"
complete "$GBODY"; SPEC=$(ids)
check "k=2 server = k=0 server ($SPEC vs $PLAIN)" [ "$SPEC" = "$PLAIN" ]
curl -s --max-time 10 "http://127.0.0.1:$PORT/metrics" >"$tmp/metrics"
drafts=$(metric vllm:spec_decode_num_drafts_total 'model_name="')
dtok=$(metric vllm:spec_decode_num_draft_tokens_total 'model_name="')
acc=$(metric vllm:spec_decode_num_accepted_tokens_total 'model_name="')
p0=$(metric vllm:spec_decode_num_accepted_tokens_per_pos_total 'position="0"')
p1=$(metric vllm:spec_decode_num_accepted_tokens_per_pos_total 'position="1"')
check "drafts > 0 ($drafts)" [ "$drafts" -gt 0 ]
check "draft tokens <= 2 x drafts ($dtok, $drafts)" [ "$dtok" -le $((2 * drafts)) ]
check "accepted > 0 and <= draft tokens ($acc, $dtok)" [ "$acc" -gt 0 ] && [ "$acc" -le "$dtok" ]
check "per-position sum = accepted ($p0 + $p1 = $acc)" [ $((p0 + p1)) -eq "$acc" ]
check "position 0 accepts at least as often as 1 ($p0, $p1)" [ "$p0" -ge "$p1" ]
# 40 tokens: 1 from the prefill, the rest from drafts' steps (1 + accepted each) ± the last step
check "tokens emitted = steps + accepted ($drafts + $acc vs 39)" [ $((drafts + acc)) -le 39 ]
check "model_name label" grep -q '^vllm:spec_decode_num_drafts_total{model_name="' "$tmp/metrics"
"$BIN" bench serve --port "$PORT" --num-prompts 2 --random-input-len 16 --random-output-len 16 \
  --max-concurrency 2 --tokenizer "$DEMO" --result-json "$tmp/bench.json" >"$tmp/bench.out" 2>"$tmp/bench.err"
rc=$?
check "bench serve rc 0 ($rc): $(tail -3 "$tmp/bench.err")" [ $rc -eq 0 ]
check "bench serve prints the acceptance rate" grep -q "^Acceptance rate (%):" "$tmp/bench.out"
check "bench serve prints the acceptance length" grep -q "^Acceptance length:" "$tmp/bench.out"
rate=$(js 'd.spec_decode.acceptance_rate' <"$tmp/bench.json")
len=$(js 'd.spec_decode.mean_accepted_length' <"$tmp/bench.json")
check "bench JSON acceptance rate in (0, 1] ($rate)" node -e "process.exit($rate>0&&$rate<=1?0:1)"
check "bench JSON mean accepted length in [1, 3] ($len)" node -e "process.exit($len>=1&&$len<=3?0:1)"
stop_server "$SPID" 300

# ---- greedy decode path (ids only) -----------------------------------------------------------
DS_SERVE_GRAPHS=force start_server greedy -m "$DEMO"
P2=7,7,1,2
"$BIN" generate -m "$DEMO" --device cpu --tokens "$P2" -n 30 --ignore-eos --print-ids \
  >"$tmp/gen2" 2>/dev/null || bad "generate 2 failed"
B2="{\"prompt\":[$P2],\"max_tokens\":30,\"temperature\":0,\"ignore_eos\":true,\"return_token_ids\":true}"
SB='{"prompt":[1,2,3],"max_tokens":20,"temperature":0.9,"seed":5,"return_token_ids":true}'
CPIDS=()
for i in 1 2 3 4 5; do
  case $i in 4) b=$B2 ;; 5) b=$SB ;; *) b=$GBODY ;; esac
  curl -s --max-time 120 -o "$tmp/c$i" -H 'Content-Type: application/json' --data-binary "$b" \
    "http://127.0.0.1:$PORT/v1/completions" &
  CPIDS+=($!)
done
wait "${CPIDS[@]}"
for i in 1 2 3; do
  check "greedy path: request $i = generate" [ "$(js 'd.choices[0].token_ids.join(",")' <"$tmp/c$i")" = "$(cat "$tmp/gen")" ]
done
check "greedy path: other prompt = generate" [ "$(js 'd.choices[0].token_ids.join(",")' <"$tmp/c4")" = "$(cat "$tmp/gen2")" ]
check "greedy path: a sampled request alongside finishes" [ "$(js 'd.choices[0].token_ids.length' <"$tmp/c5")" -ge 1 ]
stop_server "$SPID" 300

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
