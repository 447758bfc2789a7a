#!/usr/bin/env bash
# deltaserve generate --tensor-parallel-size N on the CPU backend: the greedy ids of N = 2 and
# N = 4 equal the plain single-rank run's (tiny MoE and dense checkpoints), and the refusals
# (indivisible N, CUDA, speculative decoding, out of range) exit 2 with a message naming why.
set -u
BIN=${DS_BIN:-build/deltaserve}
DATA=${DS_TEST_DATA:-tests/data}
pass=0; fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

for model in tiny-moe tiny-dense; do
  M=$DATA/models/$model
  if ! "$BIN" generate -m "$M" --tokens 3,14,15,92,65,35 -n 32 --print-ids --ignore-eos \
       --device cpu --threads 2 >"$tmp/ref" 2>"$tmp/err"; then
    fail=$((fail+1)); echo "FAIL: $model single-rank run: $(head -c 300 "$tmp/err")"; continue
  fi
  for n in 2 4; do
    if "$BIN" generate -m "$M" --tokens 3,14,15,92,65,35 -n 32 --print-ids --ignore-eos \
         --device cpu --threads 2 --tensor-parallel-size $n >"$tmp/tp" 2>"$tmp/err" &&
       [ -s "$tmp/ref" ] && cmp -s "$tmp/ref" "$tmp/tp" && grep -q "tensor parallel $n" "$tmp/err"; then
      pass=$((pass+1))
    else
      fail=$((fail+1))
      echo "FAIL: $model tp=$n ids $(cat "$tmp/tp") vs $(cat "$tmp/ref"): $(head -c 300 "$tmp/err")"
    fi
  done
done

# expect CODE PATTERN -- ARGS...
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
M=$DATA/models/tiny-moe
expect 2 "does not divide num_attention_heads" -- generate -m "$M" --tokens 1,2 --print-ids \
  --device cpu --tensor-parallel-size 3
expect 2 "not built yet" -- generate -m "$M" --tokens 1,2 --print-ids --device cuda \
  --tensor-parallel-size 2
expect 2 "num-speculative-tokens" -- generate -m "$M" --tokens 1,2 --print-ids --device cpu \
  --tensor-parallel-size 2 --num-speculative-tokens 2
expect 2 "outside" -- generate -m "$M" --tokens 1,2 --print-ids --tensor-parallel-size 0

echo "tp_generate: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
