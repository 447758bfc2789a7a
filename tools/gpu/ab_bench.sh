#!/bin/bash
# A change against the defaults from one device run with two binaries, for changes that have no
# switch (the same bits by construction, so no knob is kept): the new binaries in .carry/gpu
# (tools/gpu/pack_carry.sh), the defaults' deltaserve in .carry/old/deltaserve.xz (packed from
# the build before the change; carry both folders). On the device, from the repository root:
#
#   bash tools/gpu/ab_bench.sh        → $OUT: run_all's ops + model logs (new binaries),
#                                        ids_{new,old}.txt (greedy ids of the demo model, which
#                                        must match), ab.log / ab.jsonl (bench new, old, new, old);
#                                        all but ab.log packed into ab.tar.gz at the end
#
# DS_AB_PARTS (default "ops model") goes to run_all.sh as DS_GPU_PARTS; DS_AB_NCU (a kernel
# regex) adds run_all's ncu_detail part for the new binary, unless DS_AB_NCU_DETAIL=0
# (DS_GPU_NCU_KERNEL; the prompt 1024 tokens and one launch unless DS_GPU_NCU_PROMPT /
# DS_GPU_NCU_COUNT say otherwise); DS_AB_BENCH_TIMEOUT (default 60 s a bench run); DS_AB_ENV
# (sets of switches separated by ';', e.g. "DS_CUDA_MOE_DOWN_EARLY=0;DS_CUDA_ATTN_FUSE_PREP1=0
# DS_CUDA_ATTN_SPLIT_GRAIN=32") adds a bench a round for each set: the new binary under those
# switches.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
PARTS=${DS_AB_PARTS:-ops model}
if [ -n "${DS_AB_NCU:-}" ]; then
    [ "${DS_AB_NCU_DETAIL:-1}" = 0 ] || PARTS="$PARTS ncu_detail"
    export DS_GPU_NCU_KERNEL=$DS_AB_NCU DS_GPU_NCU_PROMPT=${DS_GPU_NCU_PROMPT:-1024} \
        DS_GPU_NCU_COUNT=${DS_GPU_NCU_COUNT:-1}
fi
OUT=$OUT DS_GPU_PARTS="$PARTS" bash tools/gpu/run_all.sh # unpacks to /tmp/ds-gpu
BIN=/tmp/ds-gpu
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    .carry/old/deltaserve.xz "$BIN/deltaserve-old" || { echo "no .carry/old/deltaserve.xz" | tee -a "$OUT/ab.log"; exit 1; }
chmod +x "$BIN/deltaserve-old"
export LD_LIBRARY_PATH=$BIN/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DS_CUDA_REQUIRED=1
for b in deltaserve deltaserve-old; do
    tag=new; [ "$b" = deltaserve-old ] && tag=old
    timeout 60 "$BIN/$b" generate -m models/qwen35-demo -p "In the beginning" -n 300 --ignore-eos \
        --print-ids --device cuda > "$OUT/ids_$tag.txt" 2> "$OUT/ids_$tag.err"
done
if [ -s "$OUT/ids_new.txt" ] && cmp -s "$OUT/ids_new.txt" "$OUT/ids_old.txt"; then
    echo "greedy ids: identical" | tee -a "$OUT/ab.log"
else
    echo "greedy ids: DIFFER" | tee -a "$OUT/ab.log"
fi
IFS=';' read -ra ENV_SETS <<< "${DS_AB_ENV:-}"
RUNS=(deltaserve deltaserve-old)
for i in "${!ENV_SETS[@]}"; do RUNS+=("deltaserve+env$i"); done
for r in 1 2; do
    for b in "${RUNS[@]}"; do
        envs=()
        [[ "$b" == *+env* ]] && read -ra envs <<< "${ENV_SETS[${b##*+env}]}"
        echo "### $b run $r ${envs[*]}" >> "$OUT/ab.log"
        timeout "${DS_AB_BENCH_TIMEOUT:-60}" env "${envs[@]}" "$BIN/${b%+env*}" bench -m configs/qwen3.5-35b-a3b --dummy-weights \
            --device cuda --prompt-len 1024 --steps 512 --batch 1,4,8 --graphs 1 \
            --json-out "$OUT/ab.jsonl" >> "$OUT/ab.log" 2>&1
    done
done
# DS_AB_NCU also times that kernel in both binaries under ncu (one metric,
# gpu__time_duration.sum: a single pass, so no kernel replay and no save/restore of the 35B
# dummy's ~70 GB, which made SpeedOfLight's 10 passes take ~30 s a launch in s33-run1), for
# DS_AB_NCU_COUNT launches (default 10) of one eager step at batch DS_GPU_NCU_BATCH after
# DS_GPU_NCU_PROMPT tokens — the kernel's own before/after, below the step's noise
if [ -n "${DS_AB_NCU:-}" ] && command -v ncu > /dev/null; then
    for b in deltaserve deltaserve-old; do
        echo "### ncu $b" >> "$OUT/ab_ncu.txt"
        timeout 150 env DS_CUDA_PROFILER_STEP=4 ncu --clock-control none --cache-control none \
            --profile-from-start off -k "regex:$DS_AB_NCU" --launch-count "${DS_AB_NCU_COUNT:-10}" \
            --metrics gpu__time_duration.sum "$BIN/$b" bench -m configs/qwen3.5-35b-a3b --dummy-weights \
            --device cuda --prompt-len "${DS_GPU_NCU_PROMPT:-1024}" --steps 8 --warmup 2 \
            --batch "${DS_GPU_NCU_BATCH:-8}" --graphs 0 >> "$OUT/ab_ncu.txt" 2>&1
        echo "### ncu $b: kernel durations (us)" >> "$OUT/ab.log"
        awk '/^### ncu /{on = ($3 == b)} on && /gpu__time_duration.sum/{print $NF, $(NF-1)}' b="$b" "$OUT/ab_ncu.txt" \
            | tr '\n' ' ' >> "$OUT/ab.log"
        echo >> "$OUT/ab.log"
    done
fi
grep -E "^###|^ +[0-9]+ |^[0-9. a-z]+$" "$OUT/ab.log"
# at most 8 files come back from the device: run_all's archive, its summary, and the A/B files
# in one more archive (s31-run1 lost the summaries to that limit)
(cd "$OUT" && touch ab_ncu.txt && tar -czf ab.tar.gz ab.jsonl ab.log ab_ncu.txt ids_new.txt ids_old.txt ids_new.err ids_old.err &&
    rm -f ab.jsonl ab_ncu.txt ids_new.txt ids_old.txt ids_new.err ids_old.err)
