#!/usr/bin/env bash
# Load tests of `deltaserve serve` on loopback (ephemeral ports), with curl:
#  - 16 concurrent streaming requests of mixed prompt/output lengths, each identical to the same
#    request run alone (greedy) — continuous batching must not change results;
#  - a client that disconnects mid-stream: its request is cancelled and its KV blocks and state
#    slot are freed (checked via /metrics);
#  - a burst beyond the queue limit: the excess gets 503 + Retry-After with an OpenAI error
#    body, everything accepted completes correctly, and the server keeps serving;
#  - SIGTERM with requests in flight: a clean, bounded shutdown.
# All loops are bounded; servers are killed on exit.
set -u
BIN=${DS_BIN:-build/deltaserve}
DATA=${DS_TEST_DATA:-tests/data}
if [ -z "${DS_SERVER_TEST_MODEL:-}" ]; then
  if [ -f models/qwen35-demo/config.json ] && [ -f models/qwen35-demo/tokenizer.json ]; then
    DS_SERVER_TEST_MODEL=models/qwen35-demo
  else
    DS_SERVER_TEST_MODEL=$DATA/models/tiny-moe-tok
  fi
fi
MODEL=$DS_SERVER_TEST_MODEL
# The 16-stream batching check runs 32 generations: on the tiny model, so that it stays quick in
# the Debug + ASan build too (the engine and server code paths are the same).
CONC_MODEL=${DS_SERVER_CONC_MODEL:-$DATA/models/tiny-moe-tok}
[ -f "$CONC_MODEL/config.json" ] || CONC_MODEL=$MODEL
command -v curl >/dev/null && command -v node >/dev/null || { echo "SKIP: needs curl and node"; exit 0; }
[ -f "$MODEL/config.json" ] || { echo "SKIP: no model at $MODEL"; exit 0; }

source "$(dirname "${BASH_SOURCE[0]}")/lib/server_test.sh"
# sse_ids FILE → the concatenated token_ids of an SSE stream, or "ERR:..." when incomplete
sse_ids() { node -e 'const fs=require("fs");let ids=[],done=false,fin=null;
  for (const l of fs.readFileSync(process.argv[1],"utf8").split("\n")) {
    if (!l.startsWith("data: ")) continue; const p=l.slice(6);
    if (p==="[DONE]") { done=true; continue; }
    const d=JSON.parse(p);
    for (const c of d.choices||[]) { if (c.token_ids) ids.push(...c.token_ids); if (c.finish_reason) fin=c.finish_reason; } }
  process.stdout.write(done&&fin ? ids.join(",") : "ERR:incomplete")' "$1"; }
start_server() {
  local name=$1; shift
  launch_server "$name" serve -m "${SERVER_MODEL:-$MODEL}" --port 0 --device cpu --threads 2 "$@"
}
metric() { curl -s --max-time 10 "http://127.0.0.1:$PORT/metrics" | sed -n "s/^deltaserve:$1{[^}]*} //p" | head -1; }
# wait_idle: bounded wait until nothing runs and no cache is held
wait_idle() {
  for _ in $(seq 1 100); do
    [ "$(metric num_requests_running)" = 0 ] && [ "$(metric num_requests_waiting)" = 0 ] &&
      [ "$(metric kv_cache_blocks_used)" = 0 ] && [ "$(metric state_slots_used)" = 0 ] && return 0
    sleep 0.1
  done
  return 1
}
# body I → request I of the mixed set: prompt of 3+11·I token ids, 6+7·I output tokens
body() {
  node -e 'const i=+process.argv[1];const n=3+11*i,m=6+7*i,p=[];for(let k=0;k<n;k++)p.push((k*37+i*101+5)%500+1);
    console.log(JSON.stringify({prompt:p,max_tokens:m,temperature:0,ignore_eos:true,return_token_ids:true,...(process.argv[2]?{stream:true}:{})}))' "$1" "${2:-}"
}

# ---- 16 concurrent streams, each equal to its solo greedy run -------------------------------------
SERVER_MODEL=$CONC_MODEL start_server conc --max-model-len 512 --max-num-seqs 16 --max-num-batched-tokens 256
U="http://127.0.0.1:$PORT"
for i in $(seq 0 15); do
  curl -s --max-time 120 -H 'Content-Type: application/json' -d "$(body "$i")" "$U/v1/completions" >"$tmp/solo$i"
  js 'd.choices[0].token_ids.join(",")' <"$tmp/solo$i" >"$tmp/solo_ids$i"
done
# two of the solo runs against the single-sequence generator
for i in 0 9; do
  P=$(body "$i" | js 'd.prompt.join(",")'); N=$(body "$i" | js 'd.max_tokens')
  "$BIN" generate -m "$CONC_MODEL" --device cpu --tokens "$P" -n "$N" --ignore-eos --print-ids 2>/dev/null >"$tmp/gen$i"
  check "solo request $i = deltaserve generate" [ "$(cat "$tmp/solo_ids$i")" = "$(cat "$tmp/gen$i")" ]
done
for i in $(seq 0 15); do body "$i" stream >"$tmp/cbody$i"; done   # ready before the burst
STEPS0=$(metric engine_steps_total)
CPIDS=()
for i in $(seq 0 15); do
  curl -sN --max-time 120 -H 'Content-Type: application/json' -d @"$tmp/cbody$i" "$U/v1/completions" >"$tmp/conc$i" &
  CPIDS+=($!)
done
for p in "${CPIDS[@]}"; do wait "$p"; done
for i in $(seq 0 15); do
  check "concurrent stream $i = solo greedy" [ "$(sse_ids "$tmp/conc$i")" = "$(cat "$tmp/solo_ids$i")" ]
done
# alone, the 16 requests need one step per output token (936); batched, about as many as the
# longest one (111) plus prefill chunks
STEPS=$(( $(metric engine_steps_total) - STEPS0 ))
echo "concurrency: $STEPS engine steps for 936 output tokens of 16 requests"
check "the concurrent requests were batched ($STEPS steps for 936 tokens)" [ "$STEPS" -lt 400 ]
check "idle after the concurrent run" wait_idle
stop_server "$SPID"

# ---- a client that disconnects mid-stream frees its caches ----------------------------------------
start_server disc --max-model-len 2048 --max-num-seqs 4
U="http://127.0.0.1:$PORT"

GEN0=$(metric generation_tokens_total); ABORT0=$(curl -s "$U/metrics" | sed -n 's/^deltaserve:request_success_total{.*finished_reason="abort"} //p')
BODY='{"prompt":[5,6,7,8],"max_tokens":2000,"temperature":0,"ignore_eos":true,"stream":true}'
# head closes the pipe after the first bytes; curl then fails its next write and hangs up
curl -sN --max-time 60 -H 'Content-Type: application/json' -d "$BODY" "$U/v1/completions" | head -c 300 >"$tmp/cut"
check "the stream started before the disconnect" grep -q '^data: {' "$tmp/cut"
check "caches freed after the disconnect" wait_idle
GEN1=$(metric generation_tokens_total)
ABORT1=$(curl -s "$U/metrics" | sed -n 's/^deltaserve:request_success_total{.*finished_reason="abort"} //p')
echo "disconnect: $((GEN1-GEN0)) of 2000 tokens generated before the cancel took effect"
check "the disconnected request was cut short ($((GEN1-GEN0)) of 2000 tokens)" [ $((GEN1-GEN0)) -lt 2000 ]
check "counted as aborted" [ "$ABORT1" -gt "$ABORT0" ]
# the same for a non-streaming request whose client gives up
GEN0=$(metric generation_tokens_total)
curl -s --max-time 0.3 -H 'Content-Type: application/json' \
  -d '{"prompt":[9,10,11],"max_tokens":2000,"temperature":0,"ignore_eos":true}' "$U/v1/completions" >/dev/null
check "caches freed after a non-streaming client left" wait_idle
GEN1=$(metric generation_tokens_total)
echo "non-streaming disconnect: $((GEN1-GEN0)) of 2000 tokens generated"
check "the non-streaming request was cut short ($((GEN1-GEN0)) of 2000 tokens)" [ $((GEN1-GEN0)) -lt 2000 ]
check "server healthy after disconnects" [ "$(curl -s -o /dev/null -w '%{http_code}' "$U/health")" = 200 ]
stop_server "$SPID"

# ---- a burst beyond the queue limit ---------------------------------------------------------------
start_server burst --max-model-len 512 --max-num-seqs 2 --max-queue 2
U="http://127.0.0.1:$PORT"
BB='{"prompt":[3,1,4,1,5,9,2,6],"max_tokens":150,"temperature":0,"ignore_eos":true,"return_token_ids":true}'
curl -s --max-time 60 -H 'Content-Type: application/json' -d "$BB" "$U/v1/completions" | js 'd.choices[0].token_ids.join(",")' >"$tmp/burst_solo"
BPIDS=()
for i in $(seq 1 40); do
  curl -s --max-time 120 -D "$tmp/bh$i" -o "$tmp/bo$i" -w '%{http_code}' -H 'Content-Type: application/json' \
       -d "$BB" "$U/v1/completions" >"$tmp/bc$i" &
  BPIDS+=($!)
done
for p in "${BPIDS[@]}"; do wait "$p"; done
n200=0; n503=0; nother=0
for i in $(seq 1 40); do
  case "$(cat "$tmp/bc$i")" in
    200) n200=$((n200+1))
         [ "$(js 'd.choices[0].token_ids.join(",")' <"$tmp/bo$i")" = "$(cat "$tmp/burst_solo")" ] || bad "burst request $i: wrong output";;
    503) n503=$((n503+1))
         grep -qi '^Retry-After: [0-9]' "$tmp/bh$i" || bad "burst 503 $i without Retry-After"
         [ "$(js 'd.error.code' <"$tmp/bo$i")" = queue_full ] || bad "burst 503 $i: error body $(cat "$tmp/bo$i")";;
    *)   nother=$((nother+1)); bad "burst request $i: status $(cat "$tmp/bc$i")";;
  esac
done
echo "burst: $n200 accepted, $n503 refused with 503"
check "burst: some accepted ($n200) and some refused ($n503)" [ "$n200" -ge 2 ] && [ "$n503" -ge 1 ] && [ "$nother" -eq 0 ]
check "idle after the burst" wait_idle
curl -s --max-time 60 -H 'Content-Type: application/json' -d "$BB" "$U/v1/completions" | js 'd.choices[0].token_ids.join(",")' >"$tmp/after"
check "serving normally after the burst" [ "$(cat "$tmp/after")" = "$(cat "$tmp/burst_solo")" ]
check "rejections counted" [ "$(metric request_rejected_total)" -ge "$n503" ]

# ---- SIGTERM with requests in flight ----------------------------------------------------------------
for i in 1 2 3; do
  curl -sN --max-time 60 -H 'Content-Type: application/json' \
    -d '{"prompt":[1,2,3],"max_tokens":400,"temperature":0,"ignore_eos":true,"stream":true}' "$U/v1/completions" >/dev/null &
done
sleep 0.2
stop_server "$SPID"
wait

echo "server_load: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
