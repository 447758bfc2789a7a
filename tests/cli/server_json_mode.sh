#!/usr/bin/env bash
# JSON mode through the server (response_format {"type": "json_object"}, sampling/json_grammar.h)
# with the demo model, which knows nothing of JSON: whatever it wants to say, the content is one
# JSON object, or a prefix of one when max_tokens cuts it; logit_bias towards "{" and "}" gives
# "{}" and finish "stop"; streamed content equals the non-streamed content; with thinking
# enabled by the prompt the object comes after the reasoning; a json_schema (structured outputs)
# answer matches its schema; unsupported schemas, ignore_eos and min_tokens are refused with 400
# naming the field; with MTP speculation the outputs are objects (or prefixes) too.
set -u
BIN=${DS_BIN:-build/deltaserve}
MODEL=${DS_SERVER_TEST_MODEL:-models/qwen35-demo}
command -v curl >/dev/null && command -v node >/dev/null || { echo "SKIP: needs curl and node"; exit 0; }
[ -f "$MODEL/config.json" ] && [ -f "$MODEL/tokenizer.json" ] || { echo "SKIP: no model at $MODEL"; exit 0; }

source "$(dirname "${BASH_SOURCE[0]}")/lib/server_test.sh"

# is_json_object_prefix TEXT: the text is a JSON object or a prefix of one (node: complete it with the
# closers its open strings / containers need, or accept it whole)
is_json_object_prefix() {
  node -e 'const t=process.argv[1]; let st=[],inStr=false,esc=false;
    for (const ch of t) { if (inStr) { if (esc) esc=false; else if (ch==="\\") esc=true; else if (ch==="\"") inStr=false; continue; }
      if (ch==="\"") inStr=true; else if (ch==="{"||ch==="[") st.push(ch==="{"?"}":"]"); else if (ch==="}"||ch==="]") st.pop(); }
    if (!/^\s*\{/.test(t)) process.exit(1);
    let c=t; if (esc) c=c.slice(0,-1); if (inStr) c+="\""; c=c.replace(/[,:\s]*$/,"");
    c=c.replace(/(-|\.|[eE][+-]?)$/,"0"); c=c.replace(/\b(t|tr|tru)$/,"true").replace(/\b(f|fa|fal|fals)$/,"false").replace(/\b(n|nu|nul)$/,"null");
    const close=st.reverse().join("");
    /* a string that ends the text is a key (needs a value) or a value: try both */
    for (const tail of ["", ":null"]) {
      try { const o=JSON.parse(c+tail+close); if (o&&typeof o==="object"&&!Array.isArray(o)) process.exit(0); } catch (e) {} }
    process.exit(1);' "$1"
}

# check_answer LABEL: the chat answer in $tmp/out is a whole JSON object when it finished by
# "stop", else a JSON object's prefix
check_answer() {
  local c f
  c=$(js 'd.choices[0].message.content' <"$tmp/out")
  f=$(js 'd.choices[0].finish_reason' <"$tmp/out")
  if [ "$f" = stop ]; then
    check "$1: a whole JSON object: $c" node -e 'const o=JSON.parse(process.argv[1]); process.exit(o&&typeof o==="object"&&!Array.isArray(o)?0:1)' "$c"
  else
    check "$1: a JSON object's prefix ($f): $c" is_json_object_prefix "$c"
  fi
}

launch_server json serve -m "$MODEL" --port 0 --device cpu --threads 2 --max-model-len 1024
MSG='"messages":[{"role":"user","content":"List the sons of Noah as JSON."}]'
for t in 0 0.9; do
  post_json /v1/chat/completions "{$MSG,\"max_tokens\":80,\"temperature\":$t,\"seed\":5,\"response_format\":{\"type\":\"json_object\"}}"
  check "temperature $t → 200" [ "$CODE" = 200 ]
  check_answer "temperature $t"
done
# completions take it too (as vLLM)
post_json /v1/completions '{"prompt":"And God said","max_tokens":40,"temperature":0,"response_format":{"type":"json_object"}}'
check "completions → 200" [ "$CODE" = 200 ]
C=$(js 'd.choices[0].text' <"$tmp/out")
check "completions: a JSON object (prefix): $C" is_json_object_prefix "$C"

# streamed = non-streamed (greedy)
post_json /v1/chat/completions "{$MSG,\"max_tokens\":40,\"temperature\":0,\"response_format\":{\"type\":\"json_object\"}}"
WHOLE=$(js 'd.choices[0].message.content' <"$tmp/out")
curl -s --max-time 120 -N -H 'Content-Type: application/json' \
  --data-binary "{$MSG,\"max_tokens\":40,\"temperature\":0,\"stream\":true,\"response_format\":{\"type\":\"json_object\"}}" \
  "http://127.0.0.1:$PORT/v1/chat/completions" >"$tmp/sse"
STREAMED=$(node -e 'let s="";for (const l of require("fs").readFileSync(process.argv[1],"utf8").split("\n")) {
  if (!l.startsWith("data: {")) continue; const d=JSON.parse(l.slice(6));
  for (const c of d.choices||[]) if (c.delta&&c.delta.content) s+=c.delta.content; } process.stdout.write(s)' "$tmp/sse")
check "streamed content = non-streamed" [ "$STREAMED" = "$WHOLE" ]

# logit_bias towards "{" and "}" gives "{}" at once: "}" cannot come first, "{" not second
post_json /tokenize '{"prompt":"{"}'
OPEN=$(js 'd.tokens[0]' <"$tmp/out")
post_json /tokenize '{"prompt":"}"}'
CLOSE=$(js 'd.tokens[0]' <"$tmp/out")
post_json /v1/chat/completions "{$MSG,\"max_tokens\":20,\"temperature\":0,\"logit_bias\":{\"$OPEN\":100,\"$CLOSE\":100},\"response_format\":{\"type\":\"json_object\"}}"
check "biased to close: {} and stop" [ "$(js 'd.choices[0].message.content.trim()+"/"+d.choices[0].finish_reason' <"$tmp/out")" = "{}/stop" ]

# thinking: the object comes after the reasoning the prompt opened (when the template opens one)
post_json /v1/chat/completions "{$MSG,\"max_tokens\":60,\"temperature\":0,\"chat_template_kwargs\":{\"enable_thinking\":true},\"response_format\":{\"type\":\"json_object\"}}"
check "thinking → 200" [ "$CODE" = 200 ]
C=$(js 'd.choices[0].message.content' <"$tmp/out")
if [ -n "$C" ]; then check "thinking: content is a JSON object (prefix): $C" is_json_object_prefix "$C"; fi

# structured outputs (response_format json_schema, sampling/json_schema.h): a schema with every
# property required, in order; '"', ']' and '}' biased up so the Bible model's strings and
# lists end (no thinking block: the content is the object). Finished by "stop": the content
# matches the schema (keys in order, types, enum); cut by "length": a prefix.
SCHEMA='{"type":"object","properties":{"name":{"type":"string"},"sons":{"type":"array","items":{"type":"string"}},"count":{"type":"integer"},"kind":{"enum":["a","b",null]}},"required":["name","sons","count","kind"],"additionalProperties":false}'
post_json /tokenize '{"prompt":"\""}'
QUOTE=$(js 'd.tokens[0]' <"$tmp/out")
post_json /tokenize '{"prompt":"]"}'
CLOSEB=$(js 'd.tokens[0]' <"$tmp/out")
BIAS="{\"$QUOTE\":30,\"$CLOSEB\":30,\"$CLOSE\":30}"
matches_schema() {
  node -e 'const o=JSON.parse(process.argv[1]); const k=Object.keys(o).join(",");
    const ok=k==="name,sons,count,kind" && typeof o.name==="string" && Array.isArray(o.sons) &&
      o.sons.every(s=>typeof s==="string") && Number.isInteger(o.count) && ["a","b",null].includes(o.kind);
    process.exit(ok?0:1)' "$1"
}
n_stop=0
for t in 0 0.9; do
  for ep in chat completions; do
    if [ $ep = chat ]; then
      post_json /v1/chat/completions "{$MSG,\"max_tokens\":200,\"temperature\":$t,\"seed\":3,\"logit_bias\":$BIAS,\"chat_template_kwargs\":{\"enable_thinking\":false},\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"sons\",\"strict\":true,\"schema\":$SCHEMA}}}"
      C=$(js 'd.choices[0].message.content' <"$tmp/out")
    else
      post_json /v1/completions "{\"prompt\":\"And God said\",\"max_tokens\":200,\"temperature\":$t,\"seed\":3,\"logit_bias\":$BIAS,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"sons\",\"schema\":$SCHEMA}}}"
      C=$(js 'd.choices[0].text' <"$tmp/out")
    fi
    F=$(js 'd.choices[0].finish_reason' <"$tmp/out")
    check "schema, $ep, temperature $t → 200" [ "$CODE" = 200 ]
    if [ "$F" = stop ]; then
      n_stop=$((n_stop + 1))
      check "schema, $ep, temperature $t: matches the schema: $C" matches_schema "$C"
    else
      check "schema, $ep, temperature $t: a prefix ($F): $C" is_json_object_prefix "$C"
    fi
  done
done
check "schema: at least one answer finished and was checked whole ($n_stop of 4)" [ "$n_stop" -ge 1 ]

# refusals
expect400() {
  post_json /v1/chat/completions "$2"
  check "$1 → 400 ($(head -c 160 "$tmp/out"))" [ "$CODE" = 400 ]
  check "$1 names the field" grep -q "$3" "$tmp/out"
}
expect400 "json_schema without a type" "{$MSG,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{}}}}" response_format
expect400 "json_schema with a pattern" "{$MSG,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"x\"}}}}}}" "keyword 'pattern' is not supported"
expect400 "json_schema without schema" "{$MSG,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}}" response_format
expect400 "ignore_eos" "{$MSG,\"ignore_eos\":true,\"response_format\":{\"type\":\"json_object\"}}" ignore_eos
expect400 "min_tokens" "{$MSG,\"min_tokens\":3,\"response_format\":{\"type\":\"json_object\"}}" min_tokens
post_json /v1/chat/completions "{$MSG,\"max_tokens\":4}"
check "still serving" [ "$CODE" = 200 ]
stop_server "$SPID"

# with MTP speculation: the drafts (unconstrained) are verified against the masked rows
launch_server spec serve -m "$MODEL" --port 0 --device cpu --threads 2 --max-model-len 1024 \
  --num-speculative-tokens 2
for t in 0 0.8; do
  post_json /v1/chat/completions "{$MSG,\"max_tokens\":60,\"temperature\":$t,\"seed\":2,\"logit_bias\":{\"$OPEN\":100,\"$CLOSE\":8},\"response_format\":{\"type\":\"json_object\"}}"
  check_answer "speculative, temperature $t"
done
post_json /v1/chat/completions "{$MSG,\"max_tokens\":200,\"temperature\":0,\"logit_bias\":$BIAS,\"chat_template_kwargs\":{\"enable_thinking\":false},\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"sons\",\"schema\":$SCHEMA}}}"
C=$(js 'd.choices[0].message.content' <"$tmp/out")
if [ "$(js 'd.choices[0].finish_reason' <"$tmp/out")" = stop ]; then
  check "speculative, schema: matches the schema: $C" matches_schema "$C"
else
  check "speculative, schema: a prefix: $C" is_json_object_prefix "$C"
fi
check "speculative: drafts were verified" [ "$(curl -s "http://127.0.0.1:$PORT/metrics" | sed -n 's/^vllm:spec_decode_num_drafts_total{[^}]*} //p')" -gt 0 ]
stop_server "$SPID"

echo "server_json_mode: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
