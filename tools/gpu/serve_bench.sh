#!/bin/bash
# Serving benchmark on the GPU machine (tools/gpu/run_all.sh part 5; runnable alone or sourced):
#   1. deltaserve bench (offline decode steps) of the same shape, so step times sit beside the
#      serving numbers in the log;
#   2. deltaserve serve -m configs/qwen3.5-35b-a3b --dummy-weights --tokenizer models/qwen35-demo
#      --device cuda --max-num-seqs 8 --max-model-len 2048 in the background, wait for /health;
#   3. deltaserve bench serve, random dataset 1024 in / 512 out (ignore_eos), at max concurrency
#      1, 4, 8 with 2 x concurrency prompts each: one JSON line per level in serve_bench.jsonl;
#   4. the server is stopped (SIGTERM, then SIGKILL) and its log appended.
# Needs BIN (the directory holding deltaserve; $BIN/lib is added to LD_LIBRARY_PATH when present)
# and OUT; writes only $OUT/serve_bench.log and $OUT/serve_bench.jsonl. Every command has a
# timeout; the whole stays under DS_PART_BUDGET_S (default 150) seconds.
# Overrides (for a CPU check of the plumbing): DS_SB_MODEL, DS_SB_TOKENIZER, DS_SB_DEVICE,
# DS_SB_IN, DS_SB_OUT_LEN, DS_SB_LEVELS ("1 4 8"), DS_SB_MAX_LEN, DS_SB_MAX_SEQS, DS_SB_SPEC
# (--num-speculative-tokens, default 0), DS_SB_THREADS, DS_SB_OFFLINE=0 (skip step 1),
# DS_SB_BENCH_ARGS (extra bench serve flags, e.g. "--min-tokens 128", or "--multi-turn 4
# --turn-input-len 64" for the prefix cache), DS_SB_SERVE_ARGS (extra serve flags, e.g.
# "--no-enable-prefix-caching"), DS_SB_DUMMY=0 (serve the
# model's own weights: a checkpoint directory such as models/qwen35-demo).
serve_bench_main() {
    local bin=${BIN:?BIN must name the directory holding deltaserve}
    local out=${OUT:?OUT must be set}
    local model=${DS_SB_MODEL:-configs/qwen3.5-35b-a3b}
    local tokdir=${DS_SB_TOKENIZER:-models/qwen35-demo}
    local device=${DS_SB_DEVICE:-cuda}
    local in_len=${DS_SB_IN:-1024} out_len=${DS_SB_OUT_LEN:-512}
    local levels=${DS_SB_LEVELS:-1 4 8}
    local max_len=${DS_SB_MAX_LEN:-2048} max_seqs=${DS_SB_MAX_SEQS:-8}
    local spec=${DS_SB_SPEC:-0} threads=${DS_SB_THREADS:-0}
    local budget=${DS_PART_BUDGET_S:-150}
    local t0=$SECONDS
    local log="$out/serve_bench.log" jsonl="$out/serve_bench.jsonl"
    local ds="$bin/deltaserve"
    local -a envs=(env)
    [ -d "$bin/lib" ] && envs+=("LD_LIBRARY_PATH=$bin/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}")
    mkdir -p "$out"
    local work
    work=$(mktemp -d) || return 1
    sb_left() { echo $((budget - (SECONDS - t0))); }
    sb_log() { echo "[serve_bench $((SECONDS - t0)) s] $*" | tee -a "$log"; }
    # sb_cap N → min(N, time left - 5), at least 1
    sb_cap() { local l; l=$(( $(sb_left) - 5 )); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }
    # sb_get URL → body on stdout; fails unless HTTP 200 (curl, else python3)
    sb_get() {
        if command -v curl > /dev/null; then
            curl -sf --max-time 5 "$1"
        else
            python3 -c 'import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=5).read().decode())' "$1" 2> /dev/null
        fi
    }
    local rc_all=0 rc t

    # ---- 1. offline decode steps of the same shape -------------------------------------------
    if [ "${DS_SB_OFFLINE:-1}" != 0 ]; then
        t=$(sb_cap 45)
        sb_log "deltaserve bench (offline steps, timeout $t s)"
        echo "### deltaserve bench -m $model --dummy-weights --device $device --prompt-len $in_len --steps $out_len --batch ${levels// /,}" >> "$log"
        timeout "$t" "${envs[@]}" "$ds" bench -m "$model" --dummy-weights --device "$device" \
            --threads "$threads" --prompt-len "$in_len" --steps "$out_len" --batch "${levels// /,}" \
            >> "$log" 2>&1
        rc=$?; sb_log "bench rc=$rc"; [ $rc -eq 0 ] || rc_all=1
    fi

    # ---- 2. the server --------------------------------------------------------------------------
    local -a serve=("$ds" serve -m "$model" --tokenizer "$tokdir" --device "$device"
                    --threads "$threads" --max-num-seqs "$max_seqs" --max-model-len "$max_len"
                    --port 0 --served-model-name dummy)
    [ "${DS_SB_DUMMY:-1}" = 0 ] || serve+=(--dummy-weights)
    [ "$spec" -gt 0 ] && serve+=(--num-speculative-tokens "$spec")
    # shellcheck disable=SC2206 # DS_SB_SERVE_ARGS: extra serve flags, split on spaces
    [ -n "${DS_SB_SERVE_ARGS:-}" ] && serve+=(${DS_SB_SERVE_ARGS})
    echo "### ${serve[*]}" >> "$log"
    t=$(sb_cap 400)
    timeout "$t" "${envs[@]}" "${serve[@]}" > "$work/server.log" 2>&1 &
    local spid=$! port="" up=0
    local wait_s
    wait_s=$(sb_cap 60)
    sb_log "server pid $spid starting (waiting up to $wait_s s for /health)"
    local deadline=$((SECONDS + wait_s))
    while [ $SECONDS -lt $deadline ]; do
        kill -0 "$spid" 2>/dev/null || break
        [ -z "$port" ] && port=$(sed -n 's|.*listening on http://[^ ]*:\([0-9][0-9]*\)$|\1|p' "$work/server.log")
        if [ -n "$port" ] && sb_get "http://127.0.0.1:$port/health" > /dev/null; then
            up=1; break
        fi
        sleep 0.5
    done
    if [ "$up" != 1 ]; then
        sb_log "server did not become healthy (port '${port}')"
        rc_all=1
    else
        sb_log "server healthy on port $port"
        # ---- 3. bench serve per concurrency level ----------------------------------------------
        local c first=1
        for c in $levels; do
            t=$(sb_cap 60)
            if [ "$(sb_left)" -lt 15 ]; then sb_log "bench serve c=$c skipped (time)"; rc_all=1; continue; fi
            local -a bs=("$ds" bench serve --port "$port" --model dummy --dataset random
                         --random-input-len "$in_len" --random-output-len "$out_len" --ignore-eos
                         --num-prompts $((2 * c)) --max-concurrency "$c" --tokenizer "$tokdir"
                         --request-timeout "$t" --result-json "$work/result.json")
            # shellcheck disable=SC2206 # DS_SB_BENCH_ARGS: extra bench serve flags, split on spaces
            [ -n "${DS_SB_BENCH_ARGS:-}" ] && bs+=(${DS_SB_BENCH_ARGS})
            [ $first = 1 ] || bs+=(--no-warmup) # the first level's warm-up serves them all
            # dummy weights: random ids are mostly incomplete UTF-8, so text comes in bursts;
            # token ids in every chunk time each token (TTFT, ITL) as it is generated
            [ "${DS_SB_DUMMY:-1}" = 0 ] || bs+=(--return-token-ids)
            first=0
            rm -f "$work/result.json"
            sb_log "bench serve --max-concurrency $c --num-prompts $((2 * c)) (timeout $t s)"
            echo "### ${bs[*]}" >> "$log"
            timeout "$t" "${envs[@]}" "${bs[@]}" >> "$log" 2>&1
            rc=$?; sb_log "bench serve c=$c rc=$rc"; [ $rc -eq 0 ] || rc_all=1
            # one line per level: the pretty JSON has no raw newlines inside strings
            [ -s "$work/result.json" ] && { tr -d '\n' < "$work/result.json"; echo; } >> "$jsonl"
        done
        sb_get "http://127.0.0.1:$port/metrics" 2>/dev/null |
            grep -E '^(vllm:spec_decode|deltaserve:(engine_steps_total|generation_tokens_total|num_preemptions_total|spec_))' >> "$log"
    fi

    # ---- 4. stop the server -----------------------------------------------------------------------
    kill -TERM "$spid" 2>/dev/null
    local i
    for i in $(seq 1 50); do kill -0 "$spid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$spid" 2>/dev/null; then sb_log "server ignored SIGTERM: killed"; kill -KILL "$spid" 2>/dev/null; rc_all=1; fi
    wait "$spid" 2>/dev/null
    echo "### server log" >> "$log"
    cat "$work/server.log" >> "$log"
    rm -rf "$work"
    sb_log "done rc=$rc_all"
    return $rc_all
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -uo pipefail
    serve_bench_main
    exit $?
else
    serve_bench_main
fi
