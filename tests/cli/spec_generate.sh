#!/usr/bin/env bash
# deltaserve generate --num-speculative-tokens K: greedy output identical to plain decoding for
# K = 1..4 on the MoE and dense fixtures with MTP heads and on the demo model; the acceptance
# line on stderr; bad values and a model without an MTP head are refused with a message.
set -u
BIN=${DS_BIN:-build/deltaserve}
DATA=${DS_TEST_DATA:-tests/data}
DEMO=$DATA/../../models/qwen35-demo
pass=0; fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }

for model in "$DATA/models/tiny-moe-mtp" "$DATA/models/tiny-dense-mtp" "$DEMO"; do
  [ -d "$model" ] || continue
  for prompt in 7 "3,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3,2,3,8,4,6,2,6,4,3,3,8,3,2,7,9,5,0,2,8,8,4,1,9,7"; do
    "$BIN" generate -m "$model" --tokens "$prompt" -n 40 --ignore-eos --print-ids --device cpu \
      >"$tmp/plain" 2>"$tmp/plain.err" || { bad "plain generate on $model: $(cat "$tmp/plain.err")"; continue; }
    for k in 1 2 3 4; do
      if "$BIN" generate -m "$model" --tokens "$prompt" -n 40 --ignore-eos --print-ids --device cpu \
           --num-speculative-tokens $k >"$tmp/spec" 2>"$tmp/spec.err"; then
        if cmp -s "$tmp/plain" "$tmp/spec"; then ok; else bad "$model k=$k: output differs"; fi
        if grep -Eq "^acceptance rate: [0-9.]+, mean accepted length: [0-9.]+ \(k=$k" "$tmp/spec.err"; then
          ok
        else
          bad "$model k=$k: no acceptance line: $(cat "$tmp/spec.err")"
        fi
      else
        bad "$model k=$k: exit $?: $(cat "$tmp/spec.err")"
      fi
    done
  done
done

# refused: out of range, and a checkpoint without mtp.* tensors
"$BIN" generate -m "$DATA/models/tiny-moe-mtp" --tokens 1,2 --print-ids --device cpu \
  --num-speculative-tokens 9 >/dev/null 2>"$tmp/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "num-speculative-tokens" "$tmp/err"; then ok; else bad "k=9: rc=$rc $(cat "$tmp/err")"; fi
"$BIN" generate -m "$DATA/models/tiny-moe" --tokens 1,2 --print-ids --device cpu \
  --num-speculative-tokens 2 >/dev/null 2>"$tmp/err"; rc=$?
if [ $rc -eq 1 ] && grep -q "MTP head" "$tmp/err"; then ok; else bad "no MTP head: rc=$rc $(cat "$tmp/err")"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
