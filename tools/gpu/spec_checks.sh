#!/bin/bash
# MTP speculative decoding on the GPU machine (device tool, from the repository root, carry
# .carry/gpu made by tools/gpu/pack_carry.sh, which packs test_cuda_spec when the tree has it).
# Writes two files under $OUT, nothing else:
#   spec_checks.log  test_cuda_spec's output, the bench tables, every generate run's stderr,
#                    and a summary (timeline, TPOT / acceptance table) at the end
#   spec.jsonl       deltaserve bench --json-out lines (plain decode per batch; verify_ms /
#                    draft_ms per batch and K; the batch-1 speculative generation per K) plus one
#                    line per generate run ({"kind":"generate", ...}: TPOT, acceptance, and
#                    whether the ids equal the plain run's)
# Parts, each under `timeout`, the whole within DS_SPEC_BUDGET_S (default 150 s):
#   1. test_cuda_spec (MTP head vs CPU, greedy spec = plain greedy for k = 1..4 on three models)
#   2. deltaserve bench, Qwen3.5-35B-A3B dummy weights, --num-speculative-tokens K, K = 1..4
#      (bench takes one K a run): verify and draft step times at batch 1/4/8
#   3. deltaserve generate on models/qwen35-demo, greedy 256 tokens, 3 prompts, plain and K = 1, 3:
#      TPOT (ms per token after the first) and acceptance from stderr, ids compared with plain
# Overrides (for a dry plumbing run on the CPU, see the end of this header): BIN (directory of
# deltaserve + test_cuda_spec; default /tmp/ds-gpu, unpacked from .carry/gpu/bin.tar.xz when it
# holds no deltaserve), DEVICE (cuda), OUT (/tmp/out), DS_SPEC_BUDGET_S, BENCH_MODEL
# (configs/qwen3.5-35b-a3b), BENCH_DUMMY (1), BENCH_PROMPT_LEN (1024), BENCH_STEPS (64),
# BENCH_BATCH (1,4,8), SPEC_KS ("1 2 3 4"), DEMO (models/qwen35-demo), GEN_N (256),
# GEN_KS ("1 3"), SPEC_TEST_ENV (extra VAR=VALUE words for test_cuda_spec), DRY_RUN=1 (print
# the commands, run nothing).
#   CPU plumbing check:  BIN=build-spec DEVICE=cpu SPEC_TEST_ENV=DS_CUDA_SPEC_ON_CPU=1 \
#     BENCH_MODEL=tests/data/models/tiny-moe-mtp BENCH_DUMMY=0 BENCH_PROMPT_LEN=64 BENCH_STEPS=8 \
#     GEN_N=24 OUT=/tmp/spec-out bash tools/gpu/spec_checks.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG=$OUT/spec_checks.log
JSONL=$OUT/spec.jsonl
: > "$LOG"
: > "$JSONL"
T0=$SECONDS
BUDGET=${DS_SPEC_BUDGET_S:-150}
DEVICE=${DEVICE:-cuda}
BENCH_MODEL=${BENCH_MODEL:-configs/qwen3.5-35b-a3b}
BENCH_DUMMY=${BENCH_DUMMY:-1}
BENCH_PROMPT_LEN=${BENCH_PROMPT_LEN:-1024}
BENCH_STEPS=${BENCH_STEPS:-64}
BENCH_BATCH=${BENCH_BATCH:-1,4,8}
SPEC_KS=${SPEC_KS:-1 2 3 4}
DEMO=${DEMO:-models/qwen35-demo}
GEN_N=${GEN_N:-256}
GEN_KS=${GEN_KS:-1 3}
DRY=${DRY_RUN:-0}
TL=()  # timeline lines, repeated in the summary
log() { local l="[$((SECONDS - T0)) s] $*"; TL+=("$l"); echo "$l" | tee -a "$LOG"; }
left() { echo $((BUDGET - (SECONDS - T0))); }
# timeout for a part: at most $1 seconds, never past the budget (0: no time left)
part_t() { local t; t=$(left); [ "$t" -gt "$1" ] && t=$1; [ "$t" -lt 5 ] && t=0; echo "$t"; }
run_t() { # run_t SECONDS CMD...: the command under timeout (DRY_RUN: print it)
    local t=$1; shift
    if [ "$DRY" = 1 ]; then echo "DRY: timeout $t $*" >> "$LOG"; return 0; fi
    timeout "$t" "$@"
}

# ---- binaries -------------------------------------------------------------------------------
if [ -z "${BIN:-}" ]; then
    BIN=/tmp/ds-gpu
    if [ ! -x "$BIN/deltaserve" ]; then
        rm -rf "$BIN" && mkdir -p "$BIN"
        if ! tar -xJf .carry/gpu/bin.tar.xz -C "$BIN" 2>/dev/null; then
            python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
                .carry/gpu/bin.tar.xz "$BIN" || { log "cannot unpack .carry/gpu/bin.tar.xz"; exit 1; }
        fi
    fi
fi
BIN=$(cd "$BIN" && pwd)
# the carried libraries are for our binaries only (env per command)
# DS_CUDA_REQUIRED: test_cuda_spec fails if its CUDA backend does not start (on CI it skips)
DSENV=(env "LD_LIBRARY_PATH=$BIN/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" DS_CUDA_REQUIRED=1)
export DS_TEST_DATA=$PWD/tests/data
log "spec_checks: BIN=$BIN device=$DEVICE budget ${BUDGET} s"
for b in deltaserve test_cuda_spec; do
    [ -x "$BIN/$b" ] || log "$b: missing from $BIN"
done
rc_all=0

# ---- 1. test_cuda_spec ------------------------------------------------------------------------
t=$(part_t 60)
if [ -x "$BIN/test_cuda_spec" ] && [ "$t" -gt 0 ]; then
    log "test_cuda_spec (timeout $t s)"
    echo "### test_cuda_spec" >> "$LOG"
    # shellcheck disable=SC2086  # SPEC_TEST_ENV: words VAR=VALUE
    run_t "$t" "${DSENV[@]}" ${SPEC_TEST_ENV:-} "$BIN/test_cuda_spec" >> "$LOG" 2>&1
    rc=$?; log "test_cuda_spec rc=$rc"; [ $rc -eq 0 ] || rc_all=1
else
    log "test_cuda_spec skipped (missing binary or no time)"; rc_all=1
fi

# ---- 2. bench, one run per K -------------------------------------------------------------------
BENCH=("${DSENV[@]}" "$BIN/deltaserve" bench -m "$BENCH_MODEL" --device "$DEVICE"
       --prompt-len "$BENCH_PROMPT_LEN" --steps "$BENCH_STEPS" --batch "$BENCH_BATCH"
       --json-out "$JSONL")
[ "$BENCH_DUMMY" = 1 ] && BENCH+=(--dummy-weights)
n_ks=$(echo "$SPEC_KS" | wc -w)
i_k=0
for K in $SPEC_KS; do
    # a run takes ~15-20 s on the H200 (dummy weights, prefills of 1+4+8 prompts, timings);
    # keep 30 s for the generate runs and 15 s for each K still to run after this one
    i_k=$((i_k + 1))
    rest=$(( $(left) - 30 - 15 * (n_ks - i_k) ))
    t=$(part_t $((rest > 45 ? 45 : rest)))
    if [ "$t" -lt 10 ]; then log "bench K=$K skipped (time)"; rc_all=1; continue; fi
    log "bench --num-speculative-tokens $K (timeout $t s)"
    echo "### deltaserve bench -m $BENCH_MODEL --num-speculative-tokens $K" >> "$LOG"
    run_t "$t" "${BENCH[@]}" --num-speculative-tokens "$K" >> "$LOG" 2>&1
    rc=$?; log "bench K=$K rc=$rc"; [ $rc -eq 0 ] || rc_all=1
done

# ---- 3. generate on the demo model, plain vs speculative ----------------------------------------
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PROMPTS=("In the beginning God created" "The LORD is my shepherd;" "And Jesus answered and said unto them,")
SUMMARY=()
for p in 0 1 2; do
    for K in 0 $GEN_KS; do
        t=$(part_t 20)
        if [ "$t" -lt 8 ]; then log "generate prompt $p K=$K skipped (time)"; rc_all=1; continue; fi
        args=("${DSENV[@]}" "$BIN/deltaserve" generate -m "$DEMO" --device "$DEVICE"
              -p "${PROMPTS[$p]}" -n "$GEN_N" --ignore-eos --print-ids)
        [ "$K" -gt 0 ] && args+=(--num-speculative-tokens "$K")
        echo "### generate prompt $p ('${PROMPTS[$p]}') K=$K" >> "$LOG"
        run_t "$t" "${args[@]}" > "$TMP/ids.$p.$K" 2> "$TMP/err.$p.$K"
        rc=$?
        cat "$TMP/err.$p.$K" >> "$LOG"
        [ "$DRY" = 1 ] && continue
        [ $rc -eq 0 ] || { log "generate prompt $p K=$K rc=$rc"; rc_all=1; continue; }
        # "generated N tokens in T ms (R tok/s)": the rate is over N-1 tokens (after the first)
        read -r n ms < <(sed -nE 's/.*generated ([0-9]+) tokens in ([0-9.]+) ms.*/\1 \2/p' "$TMP/err.$p.$K")
        read -r acc mal < <(sed -nE 's/^acceptance rate: ([0-9.]+), mean accepted length: ([0-9.]+).*/\1 \2/p' "$TMP/err.$p.$K")
        tpot=$(awk -v n="${n:-0}" -v ms="${ms:-0}" 'BEGIN { printf("%.4f", (n > 1) ? ms / (n - 1) : 0) }')
        same=null
        if [ "$K" -gt 0 ] && [ -s "$TMP/ids.$p.0" ]; then
            cmp -s "$TMP/ids.$p.0" "$TMP/ids.$p.$K" && same=true || same=false
            # first differing token index, if any
            first=$(paste -d' ' <(tr ',' '\n' < "$TMP/ids.$p.0") <(tr ',' '\n' < "$TMP/ids.$p.$K") |
                    awk '$1 != $2 { print NR - 1; exit }')
        else
            first=""
        fi
        echo "{\"kind\":\"generate\",\"model\":\"$DEMO\",\"device\":\"$DEVICE\",\"prompt\":$p,\"num_speculative_tokens\":$K,\"generated\":${n:-0},\"decode_ms\":${ms:-0},\"tpot_ms\":$tpot,\"acceptance_rate\":${acc:-null},\"mean_accepted_length\":${mal:-null},\"ids_equal_plain\":$same,\"date\":$(date +%s)}" >> "$JSONL"
        SUMMARY+=("$(printf '%6s %3s %9s %8s %8s %s' "$p" "$K" "$tpot" "${acc:--}" "${mal:--}" \
                  "$([ "$same" = false ] && echo "DIFFERS from token ${first:-?}" || echo "${same/null/-}")")")
    done
done

# ---- summary (built aside: grep must not read the file it appends to) -------------------------------
{
    echo
    echo "## summary"
    echo '```'
    grep -hE "^\[  (PASSED|FAILED) +\]|skipped|totals:|k=[0-9]: acceptance rate|rows: target|MTP head alone:|end to end: |FAIL" "$LOG" 2>/dev/null
    echo '```'
    echo "bench (verify/draft per batch and K; batch-1 speculative generation):"
    echo '```'
    grep -hE "^### deltaserve bench|^speculative decoding|^ *batch +verify|^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$|^batch 1 greedy generation|^acceptance per position" "$LOG" 2>/dev/null
    echo '```'
    echo "generate on $DEMO, $GEN_N tokens greedy (TPOT = decode ms / (n-1)):"
    echo '```'
    printf '%6s %3s %9s %8s %8s %s\n' prompt K tpot_ms accept mean_len ids_vs_plain
    for l in "${SUMMARY[@]}"; do echo "$l"; done
    echo '```'
    echo "timeline:"
    for l in "${TL[@]}"; do echo "$l"; done
    echo "[$((SECONDS - T0)) s] done, rc=$rc_all"
} > "$TMP/summary"
cat "$TMP/summary" >> "$LOG"
echo "[$((SECONDS - T0)) s] spec_checks done, rc=$rc_all"
exit $rc_all
