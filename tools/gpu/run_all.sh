#!/bin/bash
# The ONE command of a GPU session (device tool, from the repository root, carry .carry/gpu made
# by tools/gpu/pack_carry.sh). Everything it writes is under $OUT, at most 8 files:
#   gpu.txt              nvidia-smi facts, tool versions, what ran and how long each part took
#   test_cuda_ops.log    every op vs the CPU backend + measurements (DS_CUDA_BENCH=1)
#   test_cuda_model.log  whole model vs the transformers fixtures, graph replay vs eager,
#                        dummy weights on the device
#   bench.jsonl          deltaserve bench, Qwen3.5-35B-A3B dummy weights, batch 1/4/8,
#                        graphs on then off (one JSON line per batch size and mode)
#   bench.log            the two bench runs' tables and start-up reports
#   profile.log          per-kernel event timings of eager decode steps (DS_CUDA_PROFILE=1)
#   ncu.csv              Nsight Compute metrics of one batch-1 decode step, if time is left
#   summary.md           the verdicts and tables, for docs/cuda_notes.md
# Time: about 4 minutes expected; each part has its own timeout and the whole stays under 9.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
T0=$SECONDS
BUDGET=${DS_GPU_BUDGET_S:-530}
log() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/gpu.txt"; }
left() { echo $((BUDGET - (SECONDS - T0))); }

# ---- binaries -------------------------------------------------------------------------------
BIN=/tmp/ds-gpu
rm -rf "$BIN" && mkdir -p "$BIN"
if ! tar -xJf .carry/gpu/bin.tar.xz -C "$BIN" 2>/dev/null; then
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        .carry/gpu/bin.tar.xz "$BIN" || { echo "cannot unpack .carry/gpu/bin.tar.xz" | tee "$OUT/gpu.txt"; exit 1; }
fi
# the carried libraries are for our binaries only (env per command): nvidia-smi, ncu and python
# keep the image's own
DSENV=(env "LD_LIBRARY_PATH=$BIN/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}")
export DS_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
{ echo "commit: $(git rev-parse --short HEAD 2>/dev/null) (dirty tree possible)"; uname -r; } >> "$OUT/gpu.txt"
for b in test_cuda_ops test_cuda_model deltaserve; do
    if "${DSENV[@]}" ldd "$BIN/$b" | grep -i "not found" >> "$OUT/gpu.txt"; then log "$b: missing libraries"; fi
done
rc_all=0

# ---- 1. ops ---------------------------------------------------------------------------------
log "test_cuda_ops (every op vs CPU + measurements)"
DS_CUDA_BENCH=1 timeout 150 "${DSENV[@]}" "$BIN/test_cuda_ops" > "$OUT/test_cuda_ops.log" 2>&1
rc=$?; log "test_cuda_ops rc=$rc"; [ $rc -eq 0 ] || rc_all=1

# ---- 2. whole model vs transformers, graphs, dummy weights -------------------------------------
log "test_cuda_model"
timeout 120 "${DSENV[@]}" "$BIN/test_cuda_model" > "$OUT/test_cuda_model.log" 2>&1
rc=$?; log "test_cuda_model rc=$rc"; [ $rc -eq 0 ] || rc_all=1

# ---- 3. bench, graphs on then off ----------------------------------------------------------------
BENCH=("${DSENV[@]}" "$BIN/deltaserve" bench -m configs/qwen3.5-35b-a3b --dummy-weights --device cuda
       --prompt-len 1024 --steps 512 --batch 1,4,8 --json-out "$OUT/bench.jsonl")
for g in 1 0; do
    t=$(left); [ "$t" -gt 150 ] && t=150
    if [ "$t" -lt 30 ]; then log "bench --graphs $g skipped (time)"; continue; fi
    log "bench --graphs $g (timeout $t s)"
    echo "### deltaserve bench ... --graphs $g" >> "$OUT/bench.log"
    timeout "$t" "${BENCH[@]}" --graphs $g >> "$OUT/bench.log" 2>&1
    rc=$?; log "bench --graphs $g rc=$rc"; [ $rc -eq 0 ] || rc_all=1
done

# ---- 4. per-kernel profile of eager decode steps (events) ---------------------------------------
t=$(left); [ "$t" -gt 90 ] && t=90
if [ "$t" -ge 30 ]; then
    log "profile (DS_CUDA_PROFILE=1, eager, batch 1 and 8)"
    DS_CUDA_PROFILE=1 timeout "$t" "${DSENV[@]}" "$BIN/deltaserve" bench -m configs/qwen3.5-35b-a3b --dummy-weights \
        --device cuda --prompt-len 1024 --steps 32 --warmup 4 --batch 1,8 --graphs 0 \
        > "$OUT/profile.log" 2>&1
    log "profile rc=$?"
fi

# ---- 5. Nsight Compute on one batch-1 decode step, if time is left ---------------------------------
t=$(($(left) - 15))
if command -v ncu > /dev/null && [ "$t" -ge 60 ]; then
    log "ncu (one decode step, timeout $t s)"
    DS_CUDA_PROFILER_STEP=6 timeout "$t" ncu --profile-from-start off --clock-control none --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size \
        "${DSENV[@]}" "$BIN/deltaserve" bench -m configs/qwen3.5-35b-a3b --dummy-weights --device cuda \
        --prompt-len 1024 --steps 8 --warmup 0 --batch 1 --graphs 0 > "$OUT/ncu.csv" 2>&1
    log "ncu rc=$?"
else
    log "ncu skipped ($(left) s left)"
fi

# ---- summary ---------------------------------------------------------------------------------------
{
    echo "# GPU run $(date -u +%F) on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    echo; echo "## Verdicts"; echo '```'
    grep -hE "^\[  (PASSED|FAILED) +\]|FAILED|skipped" "$OUT/test_cuda_ops.log" "$OUT/test_cuda_model.log" 2>/dev/null
    echo '```'; echo; echo "## Whole model vs transformers, graphs, dummy weights"; echo '```'
    grep -hE "worst sequence|decisive tokens|captures|dummy 4-layer|dummy seeds" "$OUT/test_cuda_model.log" 2>/dev/null
    echo '```'; echo; echo "## Op measurements"; echo '```'
    grep -hE "D2D|GEMV|lm_head|attention (decode|prefill)|gdn (decode|prefill)|moe decode" "$OUT/test_cuda_ops.log" 2>/dev/null
    echo '```'; echo; echo "## deltaserve bench (35B-A3B dummy weights)"; echo '```'
    grep -hE "^###|^prefill|^ *batch|^ *[0-9]+ +[0-9.]+ |bench: " "$OUT/bench.log" 2>/dev/null
    echo '```'; echo; echo "## Decode-step profile (eager, events)"; echo '```'
    grep -A40 "CUDA profile, decode" "$OUT/profile.log" 2>/dev/null | head -60
    echo '```'; echo; echo "## Timeline"; echo '```'; grep "^\[" "$OUT/gpu.txt"; echo '```'
} > "$OUT/summary.md"
log "done, rc=$rc_all"
exit $rc_all
