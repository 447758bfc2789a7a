#!/bin/bash
# Runs on the GPU machine from the repository root (device tool), with the binaries and the
# shared libraries a stock CUDA image lacks carried in .carry/gpu/ (see docs/cuda_notes.md):
#   tools/gpu/pack_carry.sh            # here: copy test binary + libs into .carry/gpu
#   run: bash tools/gpu/run_cuda_tests.sh [TESTS-for-memcheck, e.g. mixers,moe]
# Writes logs under $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.carry/gpu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DS_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
ldd .carry/gpu/test_cuda_ops | grep -i "not found" && exit 1
DS_CUDA_BENCH=1 timeout 400 .carry/gpu/test_cuda_ops 2>&1 | tee "$OUT/test_cuda_ops.log"
rc=$?
if [ -n "${1:-}" ]; then
    DS_CUDA_BENCH=quick DS_CUDA_TESTS=$1 timeout 90 compute-sanitizer --tool memcheck \
        --print-limit 20 .carry/gpu/test_cuda_ops 2>&1 | tail -40 | tee "$OUT/memcheck.log"
fi
exit $rc
