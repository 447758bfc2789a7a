#!/bin/bash
# The ONE command of a GPU session (device tool, from the repository root, carry .carry/gpu made
# by tools/gpu/pack_carry.sh). Everything it writes is under $OUT, at most 8 files:
#   gpu.txt              nvidia-smi facts, tool versions, what ran and how long each part took
#   test_cuda_ops.log    every op vs the CPU backend + measurements (DS_CUDA_BENCH=1)
#   test_cuda_model.log  whole model vs the transformers fixtures, graph replay vs eager,
#                        dummy weights on the device
#   test_cuda_model_off.log  the same with every DS_OPT_* switch off
#   test_cuda_model_env.log  the same with DS_GPU_MODEL_ENV's switches (when set)
#   bench.jsonl          deltaserve bench, Qwen3.5-35B-A3B dummy weights, batch 1/4/8,
#                        graphs on then off (one JSON line per batch size and mode)
#   bench.log            the two bench runs' tables and start-up reports
#   prefill_long.{log,jsonl}  prefill of 8192 tokens per variant (part prefill_long, DS_GPU_LONG_*)
#   profile.log          per-kernel event timings of eager decode steps (DS_CUDA_PROFILE=1)
#   profile_spec.log     the same for speculative verify/draft steps (k = 1, 4)
#   ablation.{md,svg,jsonl}  deltaserve bench --ablation (issue 6), when the binary has it
#   serve_bench.*        tools/gpu/serve_bench.sh: bench serve against the server (issue 4)
#   spec_checks.*        tools/gpu/spec_checks.sh: MTP speculative decoding on CUDA (issue 5)
#   summary.md           the verdicts and tables, for docs/cuda_notes.md
# Parts can be chosen: DS_GPU_PARTS="ops model bench ..." (see PARTS below); bench variants with
# DS_GPU_BENCH_VARIANTS.
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
# DS_CUDA_REQUIRED: a CUDA test whose backend does not start fails here (on CI it skips)
DSENV=(env "LD_LIBRARY_PATH=$BIN/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" DS_CUDA_REQUIRED=1)
export DS_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
{ echo "commit: binaries built from $(cat .carry/gpu/COMMIT 2>/dev/null || echo unknown)"; uname -r; } >> "$OUT/gpu.txt"
for b in test_cuda_ops test_cuda_model deltaserve; do
    if "${DSENV[@]}" ldd "$BIN/$b" | grep -i "not found" >> "$OUT/gpu.txt"; then log "$b: missing libraries"; fi
done
rc_all=0
# which parts run (DS_GPU_PARTS, space-separated; default all): ops model bench ablation profile
# profile_spec ncu ncu_detail ncu_source ncu_prefill prefill_long serve_bench spec_checks
PARTS=" ${DS_GPU_PARTS:-ops model bench ablation profile profile_spec ncu serve_bench spec_checks} " # also: spec_test
want() { [[ "$PARTS" == *" $1 "* ]]; }
ALL_OFF="DS_OPT_MOE_FAST_ROUTE=0 DS_OPT_MOE_ROUTE_FUSED=0 DS_OPT_TC_GEMV=0 DS_OPT_SHARED_EXPERT=0 DS_OPT_PDL=0 DS_OPT_PREFETCH=0 DS_OPT_FUSED_ARGMAX=0 DS_OPT_FUSED_NORM=0 DS_OPT_MOE_GEMM=0 DS_OPT_GDN_PREFILL=0 DS_OPT_DEVICE_MASKS=0 DS_OPT_SPEC_GRAPHS=0"

# ---- 1. ops ---------------------------------------------------------------------------------
if want ops; then
    log "test_cuda_ops (every op vs CPU + measurements)"
    DS_CUDA_BENCH=1 timeout 150 "${DSENV[@]}" "$BIN/test_cuda_ops" > "$OUT/test_cuda_ops.log" 2>&1
    rc=$?; log "test_cuda_ops rc=$rc"; [ $rc -eq 0 ] || rc_all=1
fi

# ---- 2. whole model vs transformers, graphs, dummy weights -------------------------------------
# every optimisation switch on (the defaults), then every one off (issue 6: results identical)
if want model; then
    log "test_cuda_model (switches on)"
    timeout 120 "${DSENV[@]}" "$BIN/test_cuda_model" > "$OUT/test_cuda_model.log" 2>&1
    rc=$?; log "test_cuda_model rc=$rc"; [ $rc -eq 0 ] || rc_all=1
    read -ra offenv <<< "$ALL_OFF"
    log "test_cuda_model (switches off: $ALL_OFF)"
    timeout 120 env "${offenv[@]}" "${DSENV[@]}" "$BIN/test_cuda_model" > "$OUT/test_cuda_model_off.log" 2>&1
    rc=$?; log "test_cuda_model (off) rc=$rc"; [ $rc -eq 0 ] || rc_all=1
    # switches still off by default that a run must check (DS_GPU_MODEL_ENV, e.g.
    # "DS_CUDA_MOE_DOWN_COMBINE=1"): the whole model once more with them on
    if [ -n "${DS_GPU_MODEL_ENV:-}" ]; then
        read -ra menv <<< "$DS_GPU_MODEL_ENV"
        log "test_cuda_model ($DS_GPU_MODEL_ENV)"
        timeout 120 env "${menv[@]}" "${DSENV[@]}" "$BIN/test_cuda_model" > "$OUT/test_cuda_model_env.log" 2>&1
        rc=$?; log "test_cuda_model ($DS_GPU_MODEL_ENV) rc=$rc"; [ $rc -eq 0 ] || rc_all=1
    fi
fi

# MTP on CUDA alone (spec_checks.sh runs it too, with the speculative benches)
if want spec_test && [ -x "$BIN/test_cuda_spec" ]; then
    log "test_cuda_spec"
    timeout 60 "${DSENV[@]}" "$BIN/test_cuda_spec" > "$OUT/test_cuda_spec.log" 2>&1
    rc=$?; log "test_cuda_spec rc=$rc"; [ $rc -eq 0 ] || rc_all=1
fi

# ---- 3. bench: graphs, every switch on; then this session's switches off (before/after from
#         one run); then graphs off --------------------------------------------------------------
BENCH=("$BIN/deltaserve" bench -m configs/qwen3.5-35b-a3b --dummy-weights --device cuda
       --prompt-len 1024 --steps 512 --batch 1,4,8 --json-out "$OUT/bench.jsonl")
# variants "graphs|ENV=V ENV=V" (DS_GPU_BENCH_VARIANTS, ';'-separated): the defaults first, then
# this session's switches off (a before/after from one run), then graphs off
VARIANTS=${DS_GPU_BENCH_VARIANTS:-"1|;1|DS_OPT_PDL=0 DS_OPT_PREFETCH=0;1|DS_OPT_PREFETCH=0;0|"}
IFS=';' read -ra vlist <<< "$VARIANTS"
for variant in "${vlist[@]}"; do
    want bench || break
    t=$(left); [ "$t" -gt 150 ] && t=150
    if [ "$t" -lt 30 ]; then log "bench ($variant) skipped (time)"; continue; fi
    g=${variant%%|*}
    read -ra envs <<< "${variant#*|}"
    log "bench (graphs $g ${envs[*]}) (timeout $t s)"
    echo "### deltaserve bench ... --graphs $g ${envs[*]}" >> "$OUT/bench.log"
    read -ra extra <<< "${DS_GPU_BENCH_ARGS:-}" # e.g. --num-speculative-tokens 1
    timeout "$t" env "${envs[@]}" "${DSENV[@]}" "${BENCH[@]}" --steps "${DS_GPU_BENCH_STEPS:-512}" \
        --graphs "$g" "${extra[@]}" >> "$OUT/bench.log" 2>&1
    rc=$?; log "bench (graphs $g ${envs[*]}) rc=$rc"; [ $rc -eq 0 ] || rc_all=1
done

# ---- 3a. long prompts: the prefill of DS_GPU_LONG_TOKENS (default 8192) tokens under each of
#          DS_GPU_LONG_VARIANTS (';'-separated sets of ENV=V, default the defaults, then the tiled
#          expert GEMM) → prefill_long.log ------------------------------------------------------------
if want prefill_long; then
    IFS=';' read -ra lvlist <<< "${DS_GPU_LONG_VARIANTS:-;DS_CUDA_MOE_GEMM_TMA=0}"
    for lv in "${lvlist[@]}"; do
        t=$(left); [ "$t" -gt 90 ] && t=90
        if [ "$t" -lt 30 ]; then log "prefill_long ($lv) skipped (time)"; continue; fi
        read -ra envs <<< "$lv"
        log "prefill ${DS_GPU_LONG_TOKENS:-8192} tokens (${envs[*]}) (timeout $t s)"
        echo "### prefill ${DS_GPU_LONG_TOKENS:-8192} tokens ${envs[*]}" >> "$OUT/prefill_long.log"
        timeout "$t" env "${envs[@]}" "${DSENV[@]}" "$BIN/deltaserve" bench -m configs/qwen3.5-35b-a3b \
            --dummy-weights --device cuda --prompt-len "${DS_GPU_LONG_TOKENS:-8192}" --steps 16 --batch 1 \
            --json-out "$OUT/prefill_long.jsonl" >> "$OUT/prefill_long.log" 2>&1
        rc=$?; log "prefill ${DS_GPU_LONG_TOKENS:-8192} tokens (${envs[*]}) rc=$rc"; [ $rc -eq 0 ] || rc_all=1
    done
fi

# ---- 3b. the ablation report (issue 6), when this deltaserve has it ------------------------------
t=$(left); [ "$t" -gt 240 ] && t=240
if want ablation && "${DSENV[@]}" "$BIN/deltaserve" bench --help 2>&1 | grep -q -- --ablation && [ "$t" -ge 60 ]; then
    log "bench --ablation (timeout $t s)"
    mkdir -p "$OUT/ablation"
    timeout "$t" "${DSENV[@]}" "$BIN/deltaserve" bench --ablation -m configs/qwen3.5-35b-a3b \
        --dummy-weights --device cuda --prompt-len 1024 --steps "${DS_GPU_ABLATION_STEPS:-256}" \
        --batch 1,4,8 --ablation-out "$OUT/ablation" > "$OUT/ablation.log" 2>&1
    rc=$?; log "ablation rc=$rc"; [ $rc -eq 0 ] || rc_all=1
    cp "$OUT"/ablation/ablation.md "$OUT"/ablation/ablation.svg "$OUT"/ablation/ablation.jsonl "$OUT"/ 2>/dev/null
fi

# ---- 4. per-kernel profile of eager decode steps (events) ---------------------------------------
t=$(left)
if want profile && [ "$t" -ge 30 ]; then
    # DS_GPU_PROFILE_VARIANTS: ';'-separated "batch|ENV=V ..." (e.g. "8|;8|DS_CUDA_PREFER_SHARED=1"
    # for a kernel-by-kernel before/after); without it, batches DS_GPU_PROFILE_BATCHES (default
    # "1 8") under DS_GPU_PROFILE_ENV (e.g. a knob set to 0)
    if [ -n "${DS_GPU_PROFILE_VARIANTS:-}" ]; then
        IFS=';' read -ra plist <<< "$DS_GPU_PROFILE_VARIANTS"
    else
        plist=()
        for pb in ${DS_GPU_PROFILE_BATCHES:-1 8}; do plist+=("$pb|${DS_GPU_PROFILE_ENV:-}"); done
    fi
    [ "$t" -gt $((45 * ${#plist[@]})) ] && t=$((45 * ${#plist[@]}))
    log "profile (DS_CUDA_PROFILE=1, eager with a head start: ${plist[*]})"
    for pv in "${plist[@]}"; do
        pb=${pv%%|*}
        read -ra penv <<< "${pv#*|}"
        echo "### batch $pb ${penv[*]}" >> "$OUT/profile.log"
        env DS_CUDA_PROFILE=1 "${penv[@]}" timeout $((t / ${#plist[@]})) "${DSENV[@]}" "$BIN/deltaserve" bench -m configs/qwen3.5-35b-a3b --dummy-weights \
            --device cuda --prompt-len 1024 --steps 32 --warmup 4 --batch "$pb" --graphs 0 \
            >> "$OUT/profile.log" 2>&1
    done
    log "profile rc=$?"
fi
# the speculative verify and draft steps (issue 5): where their time goes, batch 1, k = 1 and 4
t=$(left); [ "$t" -gt 60 ] && t=60
if want profile_spec && [ "$t" -ge 30 ]; then
    log "profile of spec verify/draft (DS_CUDA_PROFILE=1, k 1 and 4)"
    for k in 1 4; do
        echo "### spec k=$k batch 1" >> "$OUT/profile_spec.log"
        DS_CUDA_PROFILE=1 timeout $((t / 2)) "${DSENV[@]}" "$BIN/deltaserve" bench -m configs/qwen3.5-35b-a3b --dummy-weights \
            --device cuda --prompt-len 256 --steps 16 --warmup 2 --batch 1 --graphs 0 --num-speculative-tokens $k \
            >> "$OUT/profile_spec.log" 2>&1
    done
    log "profile_spec rc=$?"
fi

# ---- 4b. Nsight Compute: device durations of every kernel of one decode step ----------------
# DS_CUDA_PROFILER_STEP brackets the 4th decode step with cudaProfilerStart/Stop, so
# --profile-from-start off sees exactly one step (eager: --graphs 0); batch 1 then batch 8.
# --cache-control none: the weights are not in L2 anyway (6 GB per step), and flushing would
# also evict the small activations a real step finds there.
t=$(left); [ "$t" -gt 240 ] && t=240
if want ncu && command -v ncu > /dev/null && [ "$t" -ge 60 ]; then
    read -ra nblist <<< "${DS_GPU_NCU_BATCHES:-1 8}"
    log "ncu (every kernel of one decode step at batch ${nblist[*]}, timeout $t s)"
    : > "$OUT/ncu.csv"
    for nb in "${nblist[@]}"; do
        echo "### batch $nb" >> "$OUT/ncu.csv"
        DS_CUDA_PROFILER_STEP=4 timeout $((t / ${#nblist[@]})) ncu --clock-control none --cache-control none --csv \
            --profile-from-start off \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
            "${DSENV[@]}" "$BIN/deltaserve" bench -m configs/qwen3.5-35b-a3b --dummy-weights --device cuda \
            --prompt-len 16 --steps 8 --warmup 2 --batch "$nb" --graphs 0 >> "$OUT/ncu.csv" 2>&1
        log "ncu batch $nb rc=$?"
    done
else
    log "ncu skipped"
fi

# one 1024-token prefill between cudaProfilerStart/Stop (the bench's second): ncu_detail with
# DS_GPU_NCU_PREFILL=1 and ncu_prefill below
PREFILL_WHICH=(DS_CUDA_PROFILER_PREFILL=2)
PREFILL_RUN=(--prompt-len 1024 --steps 2 --warmup 0 --batch 1)

# ncu_detail: ncu's memory, warp-stall and occupancy sections for the first DS_GPU_NCU_COUNT
# (default 4) kernels whose names match DS_GPU_NCU_KERNEL (regex, default the expert GEMVs) in
# one eager decode step at batch DS_GPU_NCU_BATCH (default 8) after a prompt of DS_GPU_NCU_PROMPT
# (default 16) tokens — or, with DS_GPU_NCU_PREFILL=1,
# in one 1024-token prefill — with the environment DS_GPU_NCU_ENV (e.g. a knob) → ncu_detail.txt
t=$(left); [ "$t" -gt 150 ] && t=150
if want ncu_detail && command -v ncu > /dev/null && [ "$t" -ge 60 ]; then
    if [ "${DS_GPU_NCU_PREFILL:-0}" = 1 ]; then
        NCU_WHICH=("${PREFILL_WHICH[@]}"); NCU_RUN=("${PREFILL_RUN[@]}")
    else
        NCU_WHICH=(DS_CUDA_PROFILER_STEP=4); NCU_RUN=(--prompt-len "${DS_GPU_NCU_PROMPT:-16}" --steps 8 --warmup 2 --batch "${DS_GPU_NCU_BATCH:-8}")
    fi
    log "ncu detail (${DS_GPU_NCU_KERNEL:-moe_expert_kernel}, ${NCU_RUN[*]}, ${DS_GPU_NCU_ENV:-}, timeout $t s)"
    # shellcheck disable=SC2086
    timeout "$t" env "${NCU_WHICH[@]}" ${DS_GPU_NCU_ENV:-} ncu --clock-control none --cache-control none \
        --profile-from-start off -k "regex:${DS_GPU_NCU_KERNEL:-moe_expert_kernel}" \
        --launch-count "${DS_GPU_NCU_COUNT:-4}" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section Occupancy --section LaunchStats --section SchedulerStats --section SourceCounters \
        "${DSENV[@]}" "$BIN/deltaserve" bench -m configs/qwen3.5-35b-a3b --dummy-weights --device cuda \
        "${NCU_RUN[@]}" --graphs 0 > "$OUT/ncu_detail.txt" 2>&1
    log "ncu detail rc=$?"
fi

# ncu_source: per-instruction (SASS) warp-stall samples of the first kernel matching each of
# DS_GPU_NCU_SOURCE (space-separated regexes, default the batch-1 routed gate_up and the first
# CUDA-core GEMV) in one eager decode step at batch DS_GPU_NCU_BATCH (default 1) — or, with
# DS_GPU_NCU_PREFILL=1, in one 1024-token prefill (e.g. gdn_prep_kernel) — with the environment
# DS_GPU_NCU_ENV → ncu_source_<n>.csv; tools/gpu/ncu_source_top.py lists the instructions where
# warps wait most (source lines need binaries packed with DS_PACK_LINEINFO=1
# tools/gpu/pack_carry.sh)
t=$(left); [ "$t" -gt 150 ] && t=150
if want ncu_source && command -v ncu > /dev/null && [ "$t" -ge 60 ]; then
    if [ "${DS_GPU_NCU_PREFILL:-0}" = 1 ]; then
        SRC_WHICH=("${PREFILL_WHICH[@]}"); SRC_RUN=("${PREFILL_RUN[@]}")
    else
        SRC_WHICH=(DS_CUDA_PROFILER_STEP=4); SRC_RUN=(--prompt-len 16 --steps 8 --warmup 2 --batch "${DS_GPU_NCU_BATCH:-1}")
    fi
    n=0
    for k in ${DS_GPU_NCU_SOURCE:-moe_gate_up_routed gemv_kernel}; do
        n=$((n + 1))
        log "ncu source ($k, ${SRC_RUN[*]}, ${DS_GPU_NCU_ENV:-}, timeout $((t / 2)) s)"
        # shellcheck disable=SC2086
        timeout $((t / 2)) env "${SRC_WHICH[@]}" ${DS_GPU_NCU_ENV:-} ncu --clock-control none --cache-control none \
            --profile-from-start off -k "regex:$k" --launch-count 1 --section SourceCounters \
            --section WarpStateStats --page source --print-source sass --csv \
            "${DSENV[@]}" "$BIN/deltaserve" bench -m configs/qwen3.5-35b-a3b --dummy-weights --device cuda \
            "${SRC_RUN[@]}" --graphs 0 > "$OUT/ncu_source_$n.csv" 2>&1
        log "ncu source ($k) rc=$?"
    done
fi

# ncu_prefill: every kernel of one 1024-token prefill (the bench's second), device time and DRAM
# bytes → ncu_prefill.csv (the profile part's event timings mis-time cuBLASLt, s7-run1)
t=$(left); [ "$t" -gt 150 ] && t=150
if want ncu_prefill && command -v ncu > /dev/null && [ "$t" -ge 60 ]; then
    log "ncu prefill (timeout $t s)"
    timeout "$t" env "${PREFILL_WHICH[@]}" ncu --clock-control none --cache-control none --csv \
        --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum \
        "${DSENV[@]}" "$BIN/deltaserve" bench -m configs/qwen3.5-35b-a3b --dummy-weights --device cuda \
        "${PREFILL_RUN[@]}" --graphs 0 > "$OUT/ncu_prefill.csv" 2>&1
    log "ncu prefill rc=$?"
fi

# ---- 5. serving and speculative decoding on the GPU (scripts of their own, if present) ------------
for part in serve_bench spec_checks serve_spec_check serve_prefix_check prefix_bench spec_accept_bench; do
    t=$(left)
    if want "$part" && [ -f "tools/gpu/$part.sh" ] && [ "$t" -ge 60 ]; then
        log "$part.sh ($t s left)"
        BIN=$BIN OUT=$OUT DS_PART_BUDGET_S=$((t > 170 ? 170 : t - 10)) timeout $((t > 180 ? 180 : t)) \
            bash "tools/gpu/$part.sh" >> "$OUT/gpu.txt" 2>&1
        rc=$?; log "$part.sh rc=$rc"; [ $rc -eq 0 ] || rc_all=1
    else
        log "$part.sh skipped ($t s left or absent)"
    fi
done

# ---- summary ---------------------------------------------------------------------------------------
{
    echo "# GPU run $(date -u +%F) on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    echo; echo "## Verdicts"; echo '```'
    grep -hE "^\[  (PASSED|FAILED) +\]|FAILED|skipped" "$OUT/test_cuda_ops.log" "$OUT/test_cuda_model.log" "$OUT/test_cuda_spec.log" 2>/dev/null
    echo '```'; echo; echo "## Whole model vs transformers, graphs, dummy weights"; echo '```'
    for f in test_cuda_model.log test_cuda_model_off.log; do
        [ -f "$OUT/$f" ] || continue
        echo "--- $f"; grep -hE "^\[  (PASSED|FAILED) +\]|worst sequence|decisive tokens|captures|dummy 4-layer|dummy seeds" "$OUT/$f"
    done
    echo '```'; echo; echo "## Op measurements"; echo '```'
    grep -hE "D2D|GEMV|lm_head|attention (decode|prefill)|gdn (decode|prefill)|moe decode" "$OUT/test_cuda_ops.log" 2>/dev/null
    echo '```'; echo; echo "## deltaserve bench (35B-A3B dummy weights)"; echo '```'
    grep -hE "^###|^prefill|^ *batch|^ *[0-9]+ +[0-9.]+ |bench: |^speculative|greedy generation" "$OUT/bench.log" 2>/dev/null
    echo '```'; echo; echo "## Long prompts"; echo '```'
    grep -hE "^###|^prefill|on NVIDIA" "$OUT/prefill_long.log" 2>/dev/null
    echo '```'; echo; echo "## Decode-step profile (eager, events)"; echo '```'
    grep -hE -A32 "^### batch|CUDA profile, decode" "$OUT/profile.log" 2>/dev/null | grep -vE "^(bench|prefill|batch|  *[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+e)" | head -240
    echo '```'; echo; echo "## Speculative verify/draft profile (eager, events)"; echo '```'
    grep -hE -A40 "^### spec|CUDA profile" "$OUT/profile_spec.log" 2>/dev/null | grep -vE "^(prefill|batch|  *[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+e)" | head -120
    echo '```'; echo; echo "## Ablation"; echo
    cat "$OUT/ablation.md" 2>/dev/null; tail -5 "$OUT/ablation.log" 2>/dev/null | sed 's/^/    /'
    echo; echo "## Nsight Compute, every kernel of one decode step (device time)"; echo '```'
    if [ -f "$OUT/ncu.csv" ]; then python3 tools/gpu/ncu_summary.py "$OUT/ncu.csv" 2>&1 | head -80; else echo "(part ncu not run)"; fi
    echo '```'; echo; echo "## Serving and speculative decoding"; echo '```'
    for f in serve_bench.log spec_checks.log serve_spec_check.log serve_prefix_check.log prefix_bench.log; do [ -f "$OUT/$f" ] && { echo "--- $f"; tail -40 "$OUT/$f"; }; done
    echo '```'; echo; echo "## Timeline"; echo '```'; grep "^\[" "$OUT/gpu.txt"; echo '```'
} > "$OUT/summary.md"
log "done, rc=$rc_all"
# at most 8 files come back: everything but the summary travels as one archive
(cd "$OUT" && tar -czf logs.tar.gz --exclude=summary.md --exclude=logs.tar.gz ./* && \
    find . -maxdepth 1 -type f ! -name summary.md ! -name logs.tar.gz ! -name bench.jsonl \
        ! -name 'ablation.*' -delete && rm -rf ablation)
exit $rc_all
