#!/bin/bash
# Copies the CUDA test binary and the non-CUDA shared libraries it needs (absent from the GPU
# machine's image) into .carry/gpu/ (ignored by git), for the device tool's `carry`.
set -e
BUILD=${1:-build-cuda}
mkdir -p .carry/gpu
cp "$BUILD/test_cuda_ops" .carry/gpu/
for lib in libcjson.so.1 libcmocka.so.0 libpcre2-8.so.0 libutf8proc.so.2 libcudart.so.13; do
    p=$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')
    [ -z "$p" ] && p=$(ls /usr/local/cuda/lib64/$lib 2>/dev/null || true)
    [ -n "$p" ] && cp -L "$p" .carry/gpu/
done
du -sh .carry/gpu
