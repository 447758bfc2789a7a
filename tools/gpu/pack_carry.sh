#!/bin/bash
# Packs the GPU binaries for the device tool's `carry` into .carry/gpu/ (ignored by git):
#   .carry/gpu/bin.tar.xz  test_cuda_ops, test_cuda_model, deltaserve (stripped) and the shared
#                          libraries the GPU image lacks (cjson, cmocka, pcre2, utf8proc,
#                          microhttpd, curl and its chain, cudart) under lib/.
# The binaries each embed the same CUDA fatbin (~11 MB each, ~17 MB with line tables): xz with a
# 64 MiB window stores it about once (four binaries and the libraries: 7.2 MB), which keeps the
# travelling tree (the repository is ~50 MiB with the demo model; old GPU logs packed, tools/gpu/logs/README.md) under the tool's 64 MiB. cuBLASLt (500 MB) is not carried: the
# GPU image has it in /usr/local/cuda/lib64. Carry `.carry/gpu` only (other helpers' folders
# under .carry would push the tree over the limit).
#
#   tools/gpu/pack_carry.sh [BUILD_DIR]   (default build-cuda; configured -DDS_CUDA=ON
#                                          -DDS_NATIVE=OFF so the host code runs on the GPU
#                                          machine's CPU, -DDS_CUDA_ARCHS=90a-real; builds the
#                                          targets first)
set -euo pipefail
BUILD=${1:-build-cuda}
cd "$(dirname "$0")/../.."
# line tables only when a source-level profile is wanted (ncu_source): they cost ~MBs of carry
LINEINFO=OFF; [ -n "${DS_PACK_LINEINFO:-}" ] && LINEINFO=ON
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S . -B "$BUILD" -DDS_CUDA=ON -DDS_NATIVE=OFF -DDS_CUDA_ARCHS=90a-real -DDS_CUDA_LINEINFO=$LINEINFO
else
    # configure again: the binaries' commit id (bench JSON "commit") is taken at configure time,
    # and session 9's results read a commit four kernel changes old without this
    cmake -S . -B "$BUILD" -DDS_CUDA_LINEINFO=$LINEINFO > /dev/null
fi
grep -q '^DS_NATIVE:BOOL=OFF' "$BUILD/CMakeCache.txt" || { echo "$BUILD: configure with -DDS_NATIVE=OFF" >&2; exit 1; }
grep -q '^DS_CUDA:STRING=ON' "$BUILD/CMakeCache.txt" || { echo "$BUILD: configure with -DDS_CUDA=ON" >&2; exit 1; }
# the H200's sm_90a code only (the default build also has sm_90 code and PTX: three copies of
# every kernel, which no longer fit the 64 MiB the device tool carries)
grep -q '^DS_CUDA_ARCHS:STRING=90a-real' "$BUILD/CMakeCache.txt" ||
    { echo "$BUILD: configure with -DDS_CUDA_ARCHS=90a-real" >&2; exit 1; }
# test_cuda_spec (MTP on CUDA) travels when the tree has it
BINS="test_cuda_ops test_cuda_model deltaserve"
[ -f tests/test_cuda_spec.c ] && [ -z "${DS_PACK_NO_SPEC:-}" ] && BINS="$BINS test_cuda_spec"
cmake --build "$BUILD" -j2 --target $BINS

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/lib"
for b in $BINS; do
    cp "$BUILD/$b" "$STAGE/"
    strip "$STAGE/$b"
done
# every shared library the binaries need except glibc's, the C++ runtime (the image's is used,
# as in phase 1) and cuBLAS (in the image)
for b in $BINS; do
    ldd "$BUILD/$b" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
    case "$name" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libstdc++.so.*|libgcc_s.so.*|libcublas*) ;;
    *) cp -L "$path" "$STAGE/lib/$name" ;;
    esac
done
rm -rf .carry/gpu
mkdir -p .carry/gpu
tar -C "$STAGE" -cf - $BINS lib |
    xz -9 --lzma2=dict=64MiB -T1 > .carry/gpu/bin.tar.xz
# the commit the binaries were built from (the device's copy of .git may be older: run_all.sh)
git describe --always --dirty --abbrev=12 > .carry/gpu/COMMIT
ls -la .carry/gpu
ls "$STAGE/lib"
# what the device tool sends: tracked + untracked-not-ignored files + the carry
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 stat -c %s 2>/dev/null |
        awk '{s += $1} END {print s}') || true
carry=$(du -sb .carry/gpu | cut -f1)
total=$((tree + carry))
echo "travelling tree: $((tree / 1048576)) MiB + carry $((carry / 1048576)) MiB = $((total / 1048576)) MiB (limit 64)"
[ "$total" -lt $((64 * 1048576)) ] || { echo "over the 64 MiB limit" >&2; exit 1; }
