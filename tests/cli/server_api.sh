#!/usr/bin/env bash
# End-to-end tests of `deltaserve serve` over real HTTP on loopback (an ephemeral port), with
# curl: endpoints, greedy results equal to `deltaserve generate`, streaming equal to
# non-streaming for the same seed, chat prompts equal to the tokenised Qwen3.5 template, stop
# handling, and every bad-input case (status, error type, param, code). Every wait is bounded;
# the servers are killed on exit. JSON is read with node (a test dependency already).
set -u
BIN=${DS_BIN:-build/deltaserve}
DATA=${DS_TEST_DATA:-tests/data}
# The trained demo model when present (real text), else the tiny test model with a cut-down
# Qwen3 tokenizer.
if [ -z "${DS_SERVER_TEST_MODEL:-}" ]; then
  if [ -f models/qwen35-demo/config.json ] && [ -f models/qwen35-demo/tokenizer.json ]; then
    DS_SERVER_TEST_MODEL=models/qwen35-demo
  else
    DS_SERVER_TEST_MODEL=$DATA/models/tiny-moe-tok
  fi
fi
MODEL=$DS_SERVER_TEST_MODEL
command -v curl >/dev/null && command -v node >/dev/null || { echo "SKIP: needs curl and node"; exit 0; }
[ -f "$MODEL/config.json" ] || { echo "SKIP: no model at $MODEL"; exit 0; }

source "$(dirname "${BASH_SOURCE[0]}")/lib/server_test.sh"
# sse FILE → {"text","reasoning","ids","finish","usage","n_chunks","done"} from an SSE stream
sse() { node -e 'const fs=require("fs");let o={text:"",reasoning:"",ids:[],finish:null,usage:null,n_chunks:0,done:false,error:null};
  for (const l of fs.readFileSync(process.argv[1],"utf8").split("\n")) {
    if (!l.startsWith("data: ")) continue; const p=l.slice(6);
    if (p==="[DONE]") { o.done=true; continue; }
    const d=JSON.parse(p); o.n_chunks++;
    if (d.error) o.error=d.error;
    if (d.usage) o.usage=d.usage;
    for (const c of d.choices||[]) {
      if (c.text) o.text+=c.text;
      if (c.delta&&c.delta.content) o.text+=c.delta.content;
      if (c.delta&&c.delta.reasoning_content) o.reasoning+=c.delta.reasoning_content;
      if (c.token_ids) o.ids.push(...c.token_ids);
      if (c.finish_reason) o.finish=c.finish_reason; } }
  process.stdout.write(JSON.stringify(o))' "$1"; }

# start_server NAME ARGS... → sets PORT and SPID (a server of $MODEL, read at the call)
start_server() { local name=$1; shift; launch_server "$name" serve -m "$MODEL" --port 0 --device cpu --threads 2 "$@"; }

# post PATH BODY [curl args...] → body in $tmp/out, status in $CODE
post() {
  local path=$1 body=$2; shift 2
  CODE=$(curl -s --max-time 120 -o "$tmp/out" -D "$tmp/hdr" -w '%{http_code}' \
         -H 'Content-Type: application/json' "$@" --data-binary "$body" "http://127.0.0.1:$PORT$path")
}
# expect_error STATUS PARAM CODE PATH BODY [curl args]: the OpenAI error object
expect_error() {
  local want=$1 param=$2 code=$3 path=$4 body=$5; shift 5
  post "$path" "$body" "$@"
  local got_param got_code got_msg got_type
  got_param=$(js 'd.error.param' <"$tmp/out" 2>/dev/null)
  got_code=$(js 'd.error.code' <"$tmp/out" 2>/dev/null)
  got_type=$(js 'typeof d.error.type' <"$tmp/out" 2>/dev/null)
  got_msg=$(js 'd.error.message' <"$tmp/out" 2>/dev/null)
  if [ "$CODE" = "$want" ] && [ "$got_param" = "$param" ] && [ "$got_code" = "$code" ] &&
     [ "$got_type" = "string" ] && [ -n "$got_msg" ]; then ok
  else bad "$path $body → $CODE param=$got_param code=$got_code (want $want $param $code): $(head -c 300 "$tmp/out")"; fi
}

# ---- command-line contract (exit 2 = usage, 1 = runtime failure; a message on stderr) ---------
cli() { local want=$1 pat=$2; shift 2
  timeout 60 "$BIN" serve "$@" >/dev/null 2>"$tmp/cli_err"; local rc=$?
  if [ "$rc" -eq "$want" ] && grep -Eq -- "$pat" "$tmp/cli_err"; then ok
  else bad "serve $* → rc=$rc (want $want): $(head -c 200 "$tmp/cli_err")"; fi; }
cli 2 "-m DIR is required"
cli 2 "unknown option" -m "$MODEL" --bogus
cli 2 "outside" -m "$MODEL" --port 70000
cli 2 "not a finite number" -m "$MODEL" --memory-fraction lots
cli 2 "max_position_embeddings" -m "$MODEL" --device cpu --max-model-len 1000000
cli 2 "must be >=" -m "$MODEL" --max-num-seqs 64 --max-num-batched-tokens 8
cli 1 "cannot resolve" -m "$MODEL" --device cpu --host no-such-host.invalid
cli 1 "no-model-here" -m "$tmp/no-model-here"
# vLLM command lines (cli/vllm_compat.h): what deltaserve cannot do is refused by name
cli 2 "method eagle is not supported" "$MODEL" --speculative-config '{"method":"eagle","num_speculative_tokens":2}'
cli 2 "integer in \[0, 4\]" "$MODEL" --speculative_config '{"method":"mtp","num_speculative_tokens":9}'
cli 2 "not valid JSON" "$MODEL" --speculative-config '{"method":'
cli 2 "must be a JSON object" "$MODEL" --speculative-config '[2]'
cli 2 "'deepseek_r1' is not supported" "$MODEL" --reasoning-parser deepseek_r1
cli 2 "'mistral' is not supported" "$MODEL" --tool-call-parser mistral
cli 2 "one device" "$MODEL" --tensor-parallel-size 2
cli 2 "'float16' is not supported" "$MODEL" --dtype float16
cli 2 "two models given" "$MODEL" -m "$tmp/other"
cli 2 "unknown option" "$MODEL" --enforce_eager

# a vLLM-style command line: positional model, underscores, MTP as --speculative-config, parser
# flags; the settings must arrive (served name, context length, k in the start-up line)
launch_server vllm serve "$MODEL" --port 0 --device cpu --threads 2 --served_model_name=vllm-name \
  --max_model_len 128 --speculative_config '{"method":"qwen3_next_mtp","num_speculative_tokens":2,"disable_padded_drafter_batch":false}' \
  --reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser qwen3_coder -tp 1 \
  --trust-remote-code --dtype auto --gpu_memory_utilization 0.5
curl -s "http://127.0.0.1:$PORT/v1/models" >"$tmp/models"
check "vLLM command line: served name" [ "$(js 'd.data[0].id' <"$tmp/models")" = vllm-name ]
check "vLLM command line: max_model_len" [ "$(js 'd.data[0].max_model_len' <"$tmp/models")" = 128 ]
check "vLLM command line: speculative k=2" grep -q "speculative decoding k=2" "$tmp/vllm.log"
check "vLLM command line: ignored key named" grep -q "'disable_padded_drafter_batch' has no meaning here" "$tmp/vllm.log"
stop_server "$SPID"

start_server main --served-model-name tiny --max-model-len 256 --max-num-seqs 4
MAIN_PID=$SPID
U="http://127.0.0.1:$PORT"

# ---- endpoints ------------------------------------------------------------------------------
check "/health" [ "$(curl -s -o /dev/null -w '%{http_code}' "$U/health")" = 200 ]
curl -s "$U/v1/models" >"$tmp/models"
check "/v1/models id" [ "$(js 'd.data[0].id' <"$tmp/models")" = tiny ]
check "/v1/models max_model_len" [ "$(js 'd.data[0].max_model_len' <"$tmp/models")" = 256 ]
curl -s "$U/metrics" >"$tmp/metrics"
for m in num_requests_running num_requests_waiting kv_cache_usage_perc state_slots_usage_perc \
         time_to_first_token_seconds_bucket inter_token_latency_seconds_count \
         e2e_request_latency_seconds_sum prompt_tokens_total generation_tokens_total; do
  check "/metrics has deltaserve:$m" grep -q "^deltaserve:$m{" "$tmp/metrics"
done

# ---- greedy = deltaserve generate -----------------------------------------------------------
PROMPT_IDS="7,99,256,31,400,12,5,77"
"$BIN" generate -m "$MODEL" --device cpu --tokens "$PROMPT_IDS" -n 24 --print-ids 2>/dev/null >"$tmp/gen_ids"
post /v1/completions "{\"model\":\"tiny\",\"prompt\":[$PROMPT_IDS],\"max_tokens\":24,\"temperature\":0,\"return_token_ids\":true}"
check "greedy ids (token prompt) = generate --tokens" [ "$(js 'd.choices[0].token_ids.join(",")' <"$tmp/out")" = "$(cat "$tmp/gen_ids")" ]
check "usage prompt_tokens" [ "$(js 'd.usage.prompt_tokens' <"$tmp/out")" = 8 ]
check "usage completion_tokens" [ "$(js 'd.usage.completion_tokens+"/"+d.usage.total_tokens' <"$tmp/out")" = "24/32" ]
check "finish length" [ "$(js 'd.choices[0].finish_reason' <"$tmp/out")" = length ]

TEXT="The quick brown fox jumps over the lazy dog."
"$BIN" generate -m "$MODEL" --device cpu -p "$TEXT" -n 20 --print-ids 2>/dev/null >"$tmp/gen_ids2"
"$BIN" generate -m "$MODEL" --device cpu -p "$TEXT" -n 20 2>/dev/null >"$tmp/gen_text2"
post /v1/completions "$(node -e 'console.log(JSON.stringify({prompt:process.argv[1],max_tokens:20,temperature:0,return_token_ids:true}))' "$TEXT")"
check "greedy ids (text prompt) = generate -p" [ "$(js 'd.choices[0].token_ids.join(",")' <"$tmp/out")" = "$(cat "$tmp/gen_ids2")" ]
js 'd.choices[0].text' <"$tmp/out" >"$tmp/srv_text2"; echo >>"$tmp/srv_text2"   # generate ends with \n
check "greedy text = generate -p text" cmp -s "$tmp/srv_text2" "$tmp/gen_text2"

# ---- streaming = non-streaming (seeded sampling), completions and chat -------------------------
for ep in completions chat; do
  if [ $ep = completions ]; then
    B='"prompt":"Once upon a time","max_tokens":40,"temperature":0.9,"top_p":0.95,"top_k":50,"seed":1234,"return_token_ids":true'
    path=/v1/completions
  else
    B='"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Tell me a story."}],"max_tokens":40,"temperature":0.9,"min_p":0.05,"seed":99,"return_token_ids":true'
    path=/v1/chat/completions
  fi
  post $path "{$B}"
  cp "$tmp/out" "$tmp/whole_$ep"
  CODE=$(curl -sN --max-time 120 -o "$tmp/stream_$ep" -w '%{http_code}' "$U$path" \
         -H 'Content-Type: application/json' -d "{$B,\"stream\":true,\"stream_options\":{\"include_usage\":true}}")
  check "$ep stream status" [ "$CODE" = 200 ]
  sse "$tmp/stream_$ep" >"$tmp/s_$ep"
  if [ $ep = completions ]; then
    check "$ep stream text = whole" [ "$(js 'd.text' <"$tmp/s_$ep")" = "$(js 'd.choices[0].text' <"$tmp/whole_$ep")" ]
  else
    check "$ep stream content = whole" [ "$(js 'd.text' <"$tmp/s_$ep")" = "$(js 'd.choices[0].message.content' <"$tmp/whole_$ep")" ]
    check "$ep stream reasoning = whole" [ "$(js 'd.reasoning' <"$tmp/s_$ep")" = "$(js 'd.choices[0].message.reasoning_content||""' <"$tmp/whole_$ep")" ]
  fi
  check "$ep stream ids = whole" [ "$(js 'd.ids.join(",")' <"$tmp/s_$ep")" = "$(js 'd.choices[0].token_ids.join(",")' <"$tmp/whole_$ep")" ]
  check "$ep stream usage = whole" [ "$(js 'JSON.stringify(d.usage)' <"$tmp/s_$ep")" = "$(js 'JSON.stringify(d.usage)' <"$tmp/whole_$ep")" ]
  check "$ep stream ends with [DONE]" [ "$(js 'd.done' <"$tmp/s_$ep")" = true ]
  check "$ep stream finish" [ "$(js 'd.finish' <"$tmp/s_$ep")" = "$(js 'd.choices[0].finish_reason' <"$tmp/whole_$ep")" ]
done
# a different seed gives different tokens (the seed is honoured)
post /v1/completions '{"prompt":"Once upon a time","max_tokens":40,"temperature":0.9,"top_p":0.95,"top_k":50,"seed":4321,"return_token_ids":true}'
check "another seed, other tokens" [ "$(js 'd.choices[0].token_ids.join(",")' <"$tmp/out")" != "$(js 'd.choices[0].token_ids.join(",")' <"$tmp/whole_completions")" ]

# ---- chat prompt = the tokenised chat template; greedy chat = generate on those ids -------------
# The server renders the checkpoint's own template; the expected text comes from Python's jinja2
# (an independent renderer, as transformers sets it up). A model without a template gets the
# built-in Qwen3.5 one, whose text is written out literally (also checked below on tiny-moe-tok).
has_template() { [ -f "$1/chat_template.jinja" ] || node -e 'process.exit(require(process.argv[1]+"/tokenizer_config.json").chat_template?0:1)' "$(cd "$1" && pwd)" 2>/dev/null; }
# expected_prompt DIR KWARGS_JSON → the user "hi" conversation rendered with add_generation_prompt
expected_prompt() {
  if has_template "$1"; then
    python3 - "$1" "$2" <<'PY'
import json, os, sys
import jinja2
d, kw = sys.argv[1], json.loads(sys.argv[2])
p = os.path.join(d, "chat_template.jinja")
if os.path.exists(p): src = open(p).read()
else: src = json.load(open(os.path.join(d, "tokenizer_config.json")))["chat_template"]
env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
sys.stdout.write(env.from_string(src).render(messages=[{"role": "user", "content": "hi"}],
                                             add_generation_prompt=True, **kw))
PY
  elif [ "$2" = '{}' ]; then printf '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n'
  else printf '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n'; fi; }
HAVE_JINJA=1
if has_template "$MODEL" && ! python3 -c 'import jinja2' 2>/dev/null; then HAVE_JINJA=0; echo "SKIP: chat template checks need python3 jinja2"; fi
post /v1/chat/completions '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":12,"temperature":0,"return_token_ids":true}'
if [ $HAVE_JINJA = 1 ]; then
  T=$(expected_prompt "$MODEL" '{}'; printf x)
  "$BIN" tokenize --tokenizer "$MODEL" --text "${T%x}" >"$tmp/tpl_ids"
  check "chat prompt ids = tokenize(template)" [ "$(js 'JSON.stringify(d.prompt_token_ids)' <"$tmp/out")" = "$(tr -d ' \n' <"$tmp/tpl_ids")" ]
fi
CHAT_IDS=$(js 'd.prompt_token_ids.join(",")' <"$tmp/out")
"$BIN" generate -m "$MODEL" --device cpu --tokens "$CHAT_IDS" -n 12 --print-ids 2>/dev/null >"$tmp/gen_chat"
check "greedy chat ids = generate" [ "$(js 'd.choices[0].token_ids.join(",")' <"$tmp/out")" = "$(cat "$tmp/gen_chat")" ]
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0,"return_token_ids":true,"chat_template_kwargs":{"enable_thinking":false}}'
if [ $HAVE_JINJA = 1 ]; then
  T=$(expected_prompt "$MODEL" '{"enable_thinking":false}'; printf x)
  "$BIN" tokenize --tokenizer "$MODEL" --text "${T%x}" >"$tmp/tpl_ids2"
  check "chat prompt ids, thinking off" [ "$(js 'JSON.stringify(d.prompt_token_ids)' <"$tmp/out")" = "$(tr -d ' \n' <"$tmp/tpl_ids2")" ]
fi
check "thinking off: no reasoning_content" [ "$(js 'd.choices[0].message.reasoning_content' <"$tmp/out")" = null ]

# ---- n > 1: choice i is the request alone with seed + i; streamed = whole; usage sums ------------
NB="\"prompt\":[$PROMPT_IDS],\"max_tokens\":8,\"temperature\":1,\"return_token_ids\":true"
post /v1/completions "{$NB,\"seed\":5,\"n\":3}"
cp "$tmp/out" "$tmp/n3"
check "n=3: three choices, indices 0..2" [ "$(js 'd.choices.map(c=>c.index).join(",")' <"$tmp/n3")" = "0,1,2" ]
check "n=3: usage sums the completions, prompt once" [ "$(js 'd.usage.prompt_tokens+"/"+d.usage.completion_tokens' <"$tmp/n3")" = "8/$(js 'd.choices.reduce((a,c)=>a+c.token_ids.length,0)' <"$tmp/n3")" ]
for i in 0 1 2; do
  post /v1/completions "{$NB,\"seed\":$((5 + i))}"
  check "n=3: choice $i = the request alone with seed $((5 + i))" [ "$(js "d.choices[$i].token_ids.join(',')" <"$tmp/n3")" = "$(js 'd.choices[0].token_ids.join(",")' <"$tmp/out")" ]
done
curl -s -N --max-time 120 -H 'Content-Type: application/json' --data-binary "{$NB,\"seed\":5,\"n\":3,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" "http://127.0.0.1:$PORT/v1/completions" >"$tmp/n3s"
node -e 'const fs=require("fs");const ids=[[],[],[]];let done=0,usage=null,fin=[];
  for (const l of fs.readFileSync(process.argv[1],"utf8").split("\n")) { if (!l.startsWith("data: ")) continue;
    const p=l.slice(6); if (p==="[DONE]") { done++; continue; } const d=JSON.parse(p); if (d.usage) usage=d.usage;
    for (const c of d.choices) { ids[c.index].push(...(c.token_ids||[])); if (c.finish_reason) fin.push(c.index); } }
  console.log(JSON.stringify({ids:ids.map(a=>a.join(",")),done,usage:usage&&usage.completion_tokens,fin:fin.sort().join(",")}))' "$tmp/n3s" >"$tmp/n3s.json"
check "n=3 streamed: each choice = the whole response's" [ "$(js 'd.ids.join(";")' <"$tmp/n3s.json")" = "$(js 'd.choices.map(c=>c.token_ids.join(",")).join(";")' <"$tmp/n3")" ]
check "n=3 streamed: one [DONE], a finish per choice, usage summed" [ "$(js 'd.done+"/"+d.fin+"/"+d.usage' <"$tmp/n3s.json")" = "1/0,1,2/$(js 'd.usage.completion_tokens' <"$tmp/n3")" ]
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0,"n":2}'
check "chat n=2 greedy: two equal choices" [ "$(js 'd.choices.length+"/"+(d.choices[0].message.content===d.choices[1].message.content)+"/"+d.choices[1].index' <"$tmp/out")" = "2/true/1" ]

# a batch of prompts with n = 2: choice k = prompt k / 2 with seed + k % 2; usage counts each
# prompt once
post /v1/completions "{\"prompt\":[[$PROMPT_IDS],\"The quick brown fox\"],\"max_tokens\":6,\"temperature\":1,\"seed\":5,\"n\":2,\"return_token_ids\":true}"
cp "$tmp/out" "$tmp/batch"
check "batch x n=2: four choices" [ "$(js 'd.choices.map(c=>c.index).join(",")' <"$tmp/batch")" = "0,1,2,3" ]
post /v1/completions "{\"prompt\":[$PROMPT_IDS],\"max_tokens\":6,\"temperature\":1,\"seed\":6,\"return_token_ids\":true}"
check "batch: choice 1 = prompt 0 alone with seed 6" [ "$(js 'd.choices[1].token_ids.join(",")' <"$tmp/batch")" = "$(js 'd.choices[0].token_ids.join(",")' <"$tmp/out")" ]
post /v1/completions '{"prompt":"The quick brown fox","max_tokens":6,"temperature":1,"seed":5,"return_token_ids":true}'
check "batch: choice 2 = prompt 1 alone with seed 5" [ "$(js 'd.choices[2].token_ids.join(",")' <"$tmp/batch")" = "$(js 'd.choices[0].token_ids.join(",")' <"$tmp/out")" ]
check "batch: usage counts each prompt once" [ "$(js 'd.usage.prompt_tokens' <"$tmp/batch")" = "$((8 + $(js 'd.usage.prompt_tokens' <"$tmp/out")))" ]

# ---- /tokenize, /detokenize (vLLM's extensions) ---------------------------------------------------
post /tokenize "$(node -e 'console.log(JSON.stringify({prompt:process.argv[1]}))' "$TEXT")"
"$BIN" tokenize --tokenizer "$MODEL" --text "$TEXT" >"$tmp/tok_ids"
check "/tokenize prompt = deltaserve tokenize" [ "$(js 'JSON.stringify(d.tokens)' <"$tmp/out")" = "$(tr -d ' \n' <"$tmp/tok_ids")" ]
check "/tokenize count, max_model_len" [ "$(js 'd.count===d.tokens.length&&d.max_model_len' <"$tmp/out")" = 256 ]
TOKS=$(js 'JSON.stringify(d.tokens)' <"$tmp/out")
post /detokenize "{\"tokens\":$TOKS}"
check "/detokenize round trip" [ "$(js 'd.prompt' <"$tmp/out")" = "$TEXT" ]
post /tokenize '{"messages":[{"role":"user","content":"hi"}]}'
check "/tokenize messages = the chat request's prompt ids" [ "$(js 'd.tokens.join(",")' <"$tmp/out")" = "$CHAT_IDS" ]
post /tokenize "{\"prompt\":[$PROMPT_IDS]}"
check "/tokenize token prompt: the ids" [ "$(js 'd.tokens.join(",")' <"$tmp/out")" = "$PROMPT_IDS" ]
expect_error 400 tokens null /detokenize '{"tokens":[1,100000]}'
expect_error 400 tokens null /detokenize '{"tokens":"1,2"}'
expect_error 400 prompt null /tokenize '{"prompt":[1,100000]}'
expect_error 400 prompt null /tokenize '{}'
CODE=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/tokenize")
check "GET /tokenize is 405" [ "$CODE" = 405 ]

# ---- stop_token_ids / stop strings ----------------------------------------------------------------
IDS=$(cat "$tmp/gen_ids")
STOP_ID=$(node -e 'const a=process.argv[1].split(",").map(Number);for(let i=3;i<a.length;i++)if(a.indexOf(a[i])===i){console.log(a[i]+" "+(i+1));break}' "$IDS")
set -- $STOP_ID
post /v1/completions "{\"prompt\":[$PROMPT_IDS],\"max_tokens\":24,\"temperature\":0,\"return_token_ids\":true,\"stop_token_ids\":[$1]}"
check "stop_token_ids: cut after the stop id" [ "$(js 'd.choices[0].token_ids.length' <"$tmp/out")" = "$2" ]
check "stop_token_ids: finish stop, stop_reason id" [ "$(js 'd.choices[0].finish_reason+"/"+d.choices[0].stop_reason' <"$tmp/out")" = "stop/$1" ]
# stop string: a piece of the greedy text that first occurs after its start
post /v1/completions "{\"prompt\":[$PROMPT_IDS],\"max_tokens\":24,\"temperature\":0}"
FULL=$(js 'd.choices[0].text' <"$tmp/out")
STOP=$(node -e 'const t=process.argv[1];for(let i=4;i+2<=t.length;i++){const s=t.slice(i,i+2);if(!/\uFFFD/.test(s)&&t.indexOf(s)===i){console.log(JSON.stringify({s,pre:t.slice(0,i)}));break}}' "$FULL")
if [ -n "$STOP" ]; then
  SS=$(echo "$STOP" | js 'JSON.stringify(d.s)')
  post /v1/completions "{\"prompt\":[$PROMPT_IDS],\"max_tokens\":24,\"temperature\":0,\"stop\":[\"zzzz\",$SS]}"
  check "stop string: text cut before it" [ "$(js 'd.choices[0].text' <"$tmp/out")" = "$(echo "$STOP" | js 'd.pre')" ]
  check "stop string: stop_reason" [ "$(js 'JSON.stringify(d.choices[0].stop_reason)' <"$tmp/out")" = "$SS" ]
  post /v1/completions "{\"prompt\":[$PROMPT_IDS],\"max_tokens\":24,\"temperature\":0,\"stop\":$SS,\"include_stop_str_in_output\":true}"
  check "stop string kept with include_stop_str_in_output" [ "$(js 'd.choices[0].text' <"$tmp/out")" = "$(echo "$STOP" | js 'd.pre+d.s')" ]
fi
# logit_bias: +100 on one id takes every greedy choice (the request leaves the fused argmax
# path); the others' text is unchanged by a bias on an id they never pick
FORCED=$(node -e 'const a=process.argv[1].split(",").map(Number);let i=3;while(a.includes(i))i++;console.log(i)' "$IDS")
post /v1/completions "{\"prompt\":[$PROMPT_IDS],\"max_tokens\":4,\"temperature\":0,\"return_token_ids\":true,\"logit_bias\":{\"$FORCED\":100}}"
check "logit_bias +100 forces its id" [ "$(js 'd.choices[0].token_ids.join(",")' <"$tmp/out")" = "$FORCED,$FORCED,$FORCED,$FORCED" ]
post /v1/completions "{\"prompt\":[$PROMPT_IDS],\"max_tokens\":24,\"temperature\":0,\"logit_bias\":{}}"
check "empty logit_bias: greedy text unchanged" [ "$(js 'd.choices[0].text' <"$tmp/out")" = "$FULL" ]
# logprobs: chosen token's logprob is the max of the top-5 under greedy
post /v1/completions "{\"prompt\":[$PROMPT_IDS],\"max_tokens\":5,\"temperature\":0,\"logprobs\":5}"
check "completions logprobs shape" [ "$(js 'd.choices[0].logprobs.tokens.length+"/"+d.choices[0].logprobs.top_logprobs.length' <"$tmp/out")" = "5/5" ]
check "greedy token has the top logprob" [ "$(js 'd.choices[0].logprobs.top_logprobs.every((t,i)=>Math.max(...Object.values(t))===d.choices[0].logprobs.token_logprobs[i])' <"$tmp/out")" = true ]
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"temperature":0,"logprobs":true,"top_logprobs":2}'
check "chat logprobs shape" [ "$(js 'd.choices[0].logprobs.content.map(c=>c.top_logprobs.length+":"+Array.isArray(c.bytes)).join(",")' <"$tmp/out")" = "2:true,2:true,2:true" ]

# ---- bad input: each is an OpenAI error with the right status/param/code ---------------------------
C=/v1/completions; H=/v1/chat/completions
expect_error 400 null null $C '{"prompt": "x",'
expect_error 400 null null $C 'not json at all'
expect_error 400 null null $C '[1,2,3]'
expect_error 400 prompt null $C '{}'
expect_error 400 max_tokens null $C '{"prompt":"x","max_tokens":"5"}'
expect_error 400 temperature null $C '{"prompt":"x","temperature":"warm"}'
expect_error 400 stream null $C '{"prompt":"x","stream":"yes"}'
expect_error 400 messages null $H '{"messages":"hello"}'
expect_error 400 messages null $H '{"messages":[{"role":"robot","content":"x"}]}'
expect_error 400 max_tokens null $C '{"prompt":"x","max_tokens":-1}'
expect_error 400 max_completion_tokens null $H '{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":-3}'
expect_error 400 top_p null $C '{"prompt":"x","top_p":0}'
expect_error 400 top_p null $C '{"prompt":"x","top_p":1.01}'
expect_error 400 temperature null $C '{"prompt":"x","temperature":-0.1}'
expect_error 400 top_k null $C '{"prompt":"x","top_k":-5}'
expect_error 400 presence_penalty null $C '{"prompt":"x","presence_penalty":9}'
expect_error 400 logprobs null $C '{"prompt":"x","logprobs":50}'
expect_error 400 top_logprobs null $H '{"messages":[{"role":"user","content":"x"}],"top_logprobs":3}'
expect_error 400 n null $C '{"prompt":"x","n":17}'
expect_error 400 n null $C '{"prompt":"x","n":0}'
expect_error 400 stream_options null $C '{"prompt":"x","stream_options":{"include_usage":true}}'
expect_error 400 prompt null $C '{"prompt":[1,2,100000]}'
expect_error 400 stop_token_ids null $C '{"prompt":"x","stop_token_ids":[100000]}'
expect_error 400 logit_bias null $C '{"prompt":"x","logit_bias":{"100000":1}}'
expect_error 400 logit_bias null $C '{"prompt":"x","logit_bias":{"five":1}}'
expect_error 400 prompt context_length_exceeded $C "{\"prompt\":[$PROMPT_IDS],\"max_tokens\":249}"
check "context message names both lengths" grep -q "maximum context length is 256 tokens.*257 tokens (8 in the prompt, 249 in the completion)" "$tmp/out"
expect_error 400 messages context_length_exceeded $H '{"messages":[{"role":"user","content":"x"}],"max_tokens":100000}'
LONG=$(node -e 'console.log(JSON.stringify({messages:[{role:"user",content:"word ".repeat(400)}]}))')
expect_error 400 messages context_length_exceeded $H "$LONG"
post $C "{\"prompt\":[$PROMPT_IDS],\"max_tokens\":248,\"temperature\":0}"   # exactly fits
check "prompt + max_tokens = max_model_len is accepted" [ "$CODE" = 200 ]
expect_error 404 model model_not_found $C '{"model":"gpt-9","prompt":"x"}'
expect_error 404 model model_not_found $H '{"model":"nope","messages":[{"role":"user","content":"x"}]}'
check "GET on a POST route → 405" [ "$(curl -s -o /dev/null -w '%{http_code}' "$U/v1/completions")" = 405 ]
check "DELETE on a GET route → 405" [ "$(curl -s -X DELETE -o /dev/null -w "%{http_code}" "$U/v1/models")" = 405 ]
check "unknown path → 404" [ "$(curl -s -o /dev/null -w '%{http_code}' "$U/v2/nothing")" = 404 ]
# OpenAI's models.retrieve, vLLM's /version and /ping
curl -s -o "$tmp/out" -w '%{http_code}' "$U/v1/models/tiny" >"$tmp/code"
check "/v1/models/tiny → 200 and its object" [ "$(cat "$tmp/code") $(js 'd.id+" "+d.object+" "+d.max_model_len' <"$tmp/out")" = "200 tiny model 256" ]
curl -s -o "$tmp/out" -w '%{http_code}' "$U/v1/models/gpt-9" >"$tmp/code"
check "/v1/models/gpt-9 → 404 model_not_found" [ "$(cat "$tmp/code") $(js 'd.error.code' <"$tmp/out")" = "404 model_not_found" ]
curl -s -o "$tmp/out" -w '%{http_code}' "$U/version" >"$tmp/code"
check "/version → 200 with a version string" [ "$(cat "$tmp/code") $(js 'typeof d.version' <"$tmp/out")" = "200 string" ]
check "/ping → 200" [ "$(curl -s -o /dev/null -w '%{http_code}' "$U/ping")" = 200 ]
check "POST /version → 405" [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$U/version")" = 405 ]
check "server still healthy after bad input" [ "$(curl -s -o /dev/null -w '%{http_code}' "$U/health")" = 200 ]
curl -s "$U/metrics" >"$tmp/metrics2"
check "nothing left running or holding caches" grep -q '^deltaserve:kv_cache_blocks_used{model_name="tiny"} 0$' "$tmp/metrics2"
check "400s counted" grep -q '^deltaserve:http_requests_total{model_name="tiny",code="400"} [1-9]' "$tmp/metrics2"
TOOLS='[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]'
expect_error 400 tool_choice null $H "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}"
expect_error 400 tool_choice null $H "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":$TOOLS,\"tool_choice\":\"sometimes\"}"
expect_error 400 tools null $H '{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"description":"no name"}}]}'
expect_error 400 tools null $H '{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]}'
stop_server "$MAIN_PID"

# ---- chat templates: the built-in fallback, a checkpoint's XML tool template, tool calls -------
# Model directories made from tiny-moe-tok (which has no chat template of its own).
TINY=$DATA/models/tiny-moe-tok
mkdir -p "$tmp/xml" "$tmp/broken"
cp "$TINY"/config.json "$TINY"/model.safetensors "$TINY"/tokenizer.json "$TINY"/tokenizer_config.json "$tmp/xml/"
cp "$tmp/xml"/* "$tmp/broken/"
cp "$DATA/server/xml_tools.jinja" "$tmp/xml/chat_template.jinja"
printf '{%% for m in messages %%}{{ m.content }' >"$tmp/broken/chat_template.jinja"
cli 1 "chat template" -m "$tmp/broken" --port 0 --device cpu
# fallback: no template → the built-in Qwen3.5 one (generation prompt opens <think>)
MODEL=$TINY start_server fallback --served-model-name tiny --max-model-len 256
check "fallback template announced" grep -q "chat template: built-in" "$tmp/fallback.log"
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"temperature":0,"return_token_ids":true}'
"$BIN" tokenize --tokenizer "$TINY" --text $'<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n' >"$tmp/fb_ids"
check "fallback prompt ids = Qwen3.5 ChatML" [ "$(js 'JSON.stringify(d.prompt_token_ids)' <"$tmp/out")" = "$(tr -d ' \n' <"$tmp/fb_ids")" ]
check "fallback: output is reasoning (prompt opened <think>)" [ "$(js 'd.choices[0].message.content' <"$tmp/out")" = "" ]
post /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"temperature":0,"return_token_ids":true,"chat_template_kwargs":{"enable_thinking":false}}'
"$BIN" tokenize --tokenizer "$TINY" --text $'<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n' >"$tmp/fb_ids2"
check "fallback prompt ids, thinking off" [ "$(js 'JSON.stringify(d.prompt_token_ids)' <"$tmp/out")" = "$(tr -d ' \n' <"$tmp/fb_ids2")" ]
stop_server "$SPID"
# XML tool template: a named tool_choice prefills "<tool_call>\n<function=get_weather>\n"; one
# generated token cannot complete a parameter, so whatever the (untrained) model emits, the
# response holds exactly that call with no arguments, cut off by max_tokens.
MODEL=$tmp/xml start_server xml --served-model-name tiny --max-model-len 512
check "XML tool form detected" grep -q "tool calls: XML form" "$tmp/xml.log"
NAMED="\"tools\":$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}"
post /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],$NAMED,\"max_tokens\":1,\"temperature\":0,\"return_token_ids\":true}"
check "named tool_choice: 200" [ "$CODE" = 200 ]
check "named tool_choice: one call" [ "$(js 'd.choices[0].message.tool_calls.map(c=>c.type+":"+c.function.name+":"+c.function.arguments).join()' <"$tmp/out")" = 'function:get_weather:{}' ]
check "named tool_choice: call id" [ "$(js '/^call_[A-Za-z0-9]{24}$/.test(d.choices[0].message.tool_calls[0].id)' <"$tmp/out")" = true ]
check "named tool_choice: content null" [ "$(js 'd.choices[0].message.content' <"$tmp/out")" = null ]
check "named tool_choice: cut by max_tokens" [ "$(js 'd.choices[0].finish_reason' <"$tmp/out")" = length ]
# the prompt = the tokenised template (rendered by jinja2) + the prefill
if python3 -c 'import jinja2' 2>/dev/null; then
  T=$(python3 - "$tmp/xml/chat_template.jinja" "$TOOLS" <<'PY'
import json, sys
import jinja2
env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
tools = json.loads(sys.argv[2])
sys.stdout.write(env.from_string(open(sys.argv[1]).read()).render(
    messages=[{"role": "user", "content": "weather?"}], tools=tools, add_generation_prompt=True))
sys.stdout.write("<tool_call>\n<function=get_weather>\n")
PY
  printf x)
  "$BIN" tokenize --tokenizer "$tmp/xml" --text "${T%x}" >"$tmp/xml_ids"
  check "named tool_choice: prompt = template + prefill" [ "$(js 'JSON.stringify(d.prompt_token_ids)' <"$tmp/out")" = "$(tr -d ' \n' <"$tmp/xml_ids")" ]
fi
CODE=$(curl -sN --max-time 60 -o "$tmp/xml_stream" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
       -d "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],$NAMED,\"max_tokens\":1,\"temperature\":0,\"stream\":true}")
check "stream named tool_choice: 200" [ "$CODE" = 200 ]
node -e 'const fs=require("fs");const calls=[];let fin=null;
  for (const l of fs.readFileSync(process.argv[1],"utf8").split("\n")) {
    if (!l.startsWith("data: ")||l==="data: [DONE]") continue; const c=JSON.parse(l.slice(6)).choices[0];
    for (const t of (c.delta.tool_calls||[])) { calls[t.index]=calls[t.index]||{id:"",name:"",args:""};
      if (t.id) calls[t.index].id=t.id; if (t.function&&t.function.name) calls[t.index].name+=t.function.name;
      if (t.function&&t.function.arguments) calls[t.index].args+=t.function.arguments; }
    if (c.finish_reason) fin=c.finish_reason; }
  process.stdout.write(calls.map(c=>c.name+":"+c.args+":"+/^call_/.test(c.id)).join()+"/"+fin)' "$tmp/xml_stream" >"$tmp/xml_s"
check "stream named tool_choice: deltas assemble the call" [ "$(cat "$tmp/xml_s")" = 'get_weather:{}:true/length' ]
# tool_choice none: no prefill, calls are not parsed (the text stays content)
post /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"tools\":$TOOLS,\"tool_choice\":\"none\",\"max_tokens\":2,\"temperature\":0}"
check "tool_choice none: no calls" [ "$(js 'd.choices[0].message.tool_calls.length' <"$tmp/out")" = 0 ]
# an assistant tool call in the history (arguments as JSON text) renders through the template
post /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"w\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"}],\"tools\":$TOOLS,\"max_tokens\":1,\"temperature\":0,\"return_token_ids\":true}"
check "tool history: 200" [ "$CODE" = 200 ]
"$BIN" detokenize --tokenizer "$tmp/xml" --tokens "$(js 'd.prompt_token_ids.join(",")' <"$tmp/out")" >"$tmp/hist_text" 2>/dev/null
check "tool history: arguments rendered as parameters" grep -q "<parameter=city>" "$tmp/hist_text"
# a template's raise_exception / bad conversation is the client's error
expect_error 400 continue_final_message null /v1/chat/completions '{"messages":[{"role":"user","content":"x"},{"role":"user","content":"y"}],"continue_final_message":true,"add_generation_prompt":false}'
stop_server "$SPID"

# ---- API key and body size limit (second server) ------------------------------------------------
start_server auth --api-key s3cret --max-body-bytes 4096 --max-model-len 128
U="http://127.0.0.1:$PORT"
expect_error 401 null invalid_api_key /v1/completions '{"prompt":"x","max_tokens":2}'
expect_error 401 null invalid_api_key /v1/completions '{"prompt":"x","max_tokens":2}' -H 'Authorization: Bearer wrong'
expect_error 401 null invalid_api_key /v1/completions '{"prompt":"x","max_tokens":2}' -H 'Authorization: s3cret'
check "401 on /v1/models without key" [ "$(curl -s -o /dev/null -w '%{http_code}' "$U/v1/models")" = 401 ]
check "401 on /v1/models/{id} without key" [ "$(curl -s -o /dev/null -w '%{http_code}' "$U/v1/models/tiny")" = 401 ]
post /v1/completions '{"prompt":"x","max_tokens":2}' -H 'Authorization: Bearer s3cret'
check "right key → 200" [ "$CODE" = 200 ]
check "/health needs no key" [ "$(curl -s -o /dev/null -w '%{http_code}' "$U/health")" = 200 ]
BIG=$(node -e 'console.log(JSON.stringify({prompt:"a".repeat(10000),max_tokens:2}))')
expect_error 413 null request_too_large /v1/completions "$BIG" -H 'Authorization: Bearer s3cret'
# chunked upload (no Content-Length) over the limit
node -e 'process.stdout.write(JSON.stringify({prompt:"b".repeat(20000),max_tokens:2}))' >"$tmp/big.json"
CODE=$(curl -s --max-time 30 -o "$tmp/out" -w '%{http_code}' -H 'Authorization: Bearer s3cret' \
       -H 'Transfer-Encoding: chunked' -H 'Content-Type: application/json' --data-binary @"$tmp/big.json" "$U/v1/completions")
check "413 for a chunked body over the limit" [ "$CODE" = 413 ]
post /v1/completions '{"prompt":"x","max_tokens":2}' -H 'Authorization: Bearer s3cret'
check "still serving after 413" [ "$CODE" = 200 ]
stop_server "$SPID"

echo "server_api: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
