#!/bin/bash
# Runs on the GPU machine from the repository root (device tool), with the binaries and the
# shared libraries a stock CUDA image lacks packed in .carry/gpu/bin.tar.xz (see
# docs/cuda_notes.md; tools/gpu/run_all.sh is the full phase-2 run):
#   tools/gpu/pack_carry.sh            # here: build + pack binaries and libs into .carry/gpu
#   run: bash tools/gpu/run_cuda_tests.sh [TESTS-for-memcheck, e.g. mixers,moe]
# Op tests only (+ optional compute-sanitizer memcheck). Writes logs under $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BIN=/tmp/ds-gpu
rm -rf "$BIN" && mkdir -p "$BIN"
tar -xJf .carry/gpu/bin.tar.xz -C "$BIN" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        .carry/gpu/bin.tar.xz "$BIN" || exit 1
export LD_LIBRARY_PATH=$BIN/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DS_TEST_DATA=$PWD/tests/data
export DS_CUDA_REQUIRED=1 # test_cuda_ops fails if its CUDA backend does not start (on CI it skips)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
ldd $BIN/test_cuda_ops | grep -i "not found" && exit 1
DS_CUDA_BENCH=1 timeout 400 $BIN/test_cuda_ops 2>&1 | tee "$OUT/test_cuda_ops.log"
rc=$?
if [ -n "${1:-}" ]; then
    DS_CUDA_BENCH=quick DS_CUDA_TESTS=$1 timeout 90 compute-sanitizer --tool memcheck \
        --print-limit 20 $BIN/test_cuda_ops 2>&1 | tail -40 | tee "$OUT/memcheck.log"
fi
exit $rc
