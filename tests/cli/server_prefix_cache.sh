#!/usr/bin/env bash
# Prefix caching through the server (runtime/prefix_cache.h): a request whose prompt continues an
# earlier request's prompt + output resumes from its caches, and says so in
# usage.prompt_tokens_details.cached_tokens (non-streaming and in the streamed usage chunk);
# /metrics counts it (vllm:prefix_cache_queries_total / _hits_total, deltaserve:prefix_cache_*);
# a two-turn chat whose template renders the first answer as it was generated (the demo model's
# ChatML) resumes too; --no-enable-prefix-caching turns it off. The exactness of resumed tokens
# is test_prefix_cache.c's (forced token-by-token GDN there; the server's CPU GDN chunks prompts).
set -u
BIN=${DS_BIN:-build/deltaserve}
MODEL=${DS_SERVER_TEST_MODEL:-models/qwen35-demo}
command -v curl >/dev/null && command -v node >/dev/null || { echo "SKIP: needs curl and node"; exit 0; }
[ -f "$MODEL/config.json" ] && [ -f "$MODEL/tokenizer.json" ] || { echo "SKIP: no model at $MODEL"; exit 0; }

source "$(dirname "${BASH_SOURCE[0]}")/lib/server_test.sh"

metric() { curl -s "http://127.0.0.1:$PORT/metrics" | sed -n "s/^$1{[^}]*} //p"; }

launch_server cached serve -m "$MODEL" --port 0 --device cpu --threads 2 --max-model-len 512 \
  --max-num-seqs 4
P="7,99,256,31,400,12,5,77,1000,23"
post_json /v1/completions "{\"prompt\":[$P],\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true,\"return_token_ids\":true}"
check "turn 1 → 200" [ "$CODE" = 200 ]
OUT1=$(js 'd.choices[0].token_ids.join(",")' <"$tmp/out")
check "turn 1: nothing cached" [ "$(js 'd.usage.prompt_tokens_details.cached_tokens' <"$tmp/out")" = 0 ]
# turn 2 continues turn 1's 10 + 12 tokens: the first 21 are in the entry's caches
post_json /v1/completions "{\"prompt\":[$P,$OUT1,41,42,43],\"max_tokens\":8,\"temperature\":0,\"return_token_ids\":true}"
check "turn 2 → 200" [ "$CODE" = 200 ]
check "turn 2: 21 of 25 prompt tokens cached" \
  [ "$(js 'd.usage.prompt_tokens+"/"+d.usage.prompt_tokens_details.cached_tokens' <"$tmp/out")" = "25/21" ]
OUT2=$(js 'd.choices[0].token_ids.join(",")' <"$tmp/out")
check "metrics: hits" [ "$(metric vllm:prefix_cache_hits_total)" = 21 ]
check "metrics: queries" [ "$(metric vllm:prefix_cache_queries_total)" = 35 ]
check "metrics: one entry (turn 1's went on with turn 2)" [ "$(metric deltaserve:prefix_cache_entries)" = 1 ]
check "metrics: entries' blocks not counted as used" [ "$(metric deltaserve:kv_cache_blocks_used)" = 0 ]
# streamed turn 3 with include_usage: the usage chunk carries the cached count
curl -s --max-time 120 -N -H 'Content-Type: application/json' \
  --data-binary "{\"prompt\":[$P,$OUT1,41,42,43,$OUT2,50],\"max_tokens\":4,\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" \
  "http://127.0.0.1:$PORT/v1/completions" >"$tmp/sse"
USAGE=$(grep '"usage":{' "$tmp/sse" | tail -1 | sed 's/^data: //')
check "streamed usage: cached 32 of 34" \
  [ "$(echo "$USAGE" | js 'd.usage.prompt_tokens+"/"+d.usage.prompt_tokens_details.cached_tokens')" = "34/32" ]

# a chat of two turns: ChatML renders the first answer as generated, so turn 2 resumes
M1='[{"role":"user","content":"Who was Moses?"}]'
post_json /v1/chat/completions "{\"messages\":$M1,\"max_tokens\":16,\"temperature\":0}"
check "chat turn 1 → 200" [ "$CODE" = 200 ]
ANSWER=$(js 'd.choices[0].message.content' <"$tmp/out")
FIN=$(js 'd.choices[0].finish_reason' <"$tmp/out")
N1=$(js 'd.usage.prompt_tokens+d.usage.completion_tokens' <"$tmp/out")
BODY=$(node -e 'console.log(JSON.stringify({messages:[{role:"user",content:"Who was Moses?"},
  {role:"assistant",content:process.argv[1]},{role:"user",content:"And Aaron?"}],max_tokens:8,temperature:0}))' "$ANSWER")
post_json /v1/chat/completions "$BODY"
CACHED=$(js 'd.usage.prompt_tokens_details.cached_tokens' <"$tmp/out")
# turn 1's prompt + answer, the answer's last token (<|im_end|> at a stop, else its 16th) not fed
check "chat turn 2 resumes turn 1 ($FIN; cached $CACHED of $N1 − 1)" [ "$CACHED" = $((N1 - 1)) ]
stop_server "$SPID"

launch_server off serve -m "$MODEL" --port 0 --device cpu --threads 2 --max-model-len 512 \
  --max-num-seqs 4 --no-enable-prefix-caching
post_json /v1/completions "{\"prompt\":[$P],\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}"
post_json /v1/completions "{\"prompt\":[$P,$OUT1,41,42,43],\"max_tokens\":8,\"temperature\":0}"
check "off: nothing cached" [ "$(js 'd.usage.prompt_tokens_details.cached_tokens' <"$tmp/out")" = 0 ]
check "off: no entries" [ "$(metric deltaserve:prefix_cache_entries)" = 0 ]
check "off: no hits" [ "$(metric vllm:prefix_cache_hits_total)" = 0 ]
stop_server "$SPID"

echo "server_prefix_cache: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
