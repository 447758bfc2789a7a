#!/usr/bin/env bash
# The CLI contract for bad input: every case exits non-zero with a message on stderr naming
# what is wrong, and never crashes (exit codes ≥ 128 would mean a signal).
set -u
BIN=${DS_BIN:-build/deltaserve}
DATA=${DS_TEST_DATA:-tests/data}
MODEL=$DATA/models/tiny-moe
pass=0; fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# expect CODE PATTERN -- ARGS...: exit code CODE and stderr matching PATTERN (grep -E).
expect() {
  local want=$1 pat=$2; shift 3
  "$BIN" "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [ "$rc" -eq "$want" ] && grep -Eq -- "$pat" "$tmp/err"; then
    pass=$((pass+1))
  else
    fail=$((fail+1))
    echo "FAIL: deltaserve $* → rc=$rc (want $want), stderr: $(head -c 300 "$tmp/err")"
  fi
}

expect 2 "usage" -- 
expect 2 "unknown command" -- frobnicate
expect 2 "-m DIR and --tokens are required" -- score --tokens 1,2
expect 2 "unknown option" -- score -m "$MODEL" --tokens 1 --bogus
expect 2 "needs a value" -- score -m "$MODEL" --tokens
expect 2 "bad token id list" -- score -m "$MODEL" --tokens 1,x,3
expect 2 "trailing comma" -- score -m "$MODEL" --tokens 1,2,
expect 2 "outside" -- score -m "$MODEL" --tokens -5
expect 2 "outside" -- score -m "$MODEL" --tokens 99999999999
expect 2 "not an integer" -- score -m "$MODEL" --tokens 1 --threads two
expect 1 "no-such-dir" -- score -m "$tmp/no-such-dir" --tokens 1
expect 1 "config.json" -- score -m "$tmp" --tokens 1
if [ -d "$MODEL" ]; then
  expect 2 "outside the vocabulary" -- score -m "$MODEL" --tokens 1,999999
  expect 1 "unknown device" -- score -m "$MODEL" --tokens 1 --device tpu
  # A config that is not JSON, and one with an unknown model_type.
  mkdir -p "$tmp/badjson" "$tmp/badtype"
  echo '{"model_type": ' >"$tmp/badjson/config.json"
  expect 1 "config.json" -- score -m "$tmp/badjson" --tokens 1
  sed 's/"model_type": *"qwen3_5_moe"/"model_type": "llama_llama"/' "$MODEL/config.json" \
    >"$tmp/badtype/config.json"
  cp "$MODEL"/*.safetensors* "$tmp/badtype/" 2>/dev/null
  expect 1 "llama_llama" -- score -m "$tmp/badtype" --tokens 1
  # Truncated weights file.
  mkdir -p "$tmp/trunc"; cp "$MODEL/config.json" "$tmp/trunc/"
  head -c 5000 "$MODEL/model.safetensors" >"$tmp/trunc/model.safetensors"
  expect 1 "model.safetensors" -- score -m "$tmp/trunc" --tokens 1
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
