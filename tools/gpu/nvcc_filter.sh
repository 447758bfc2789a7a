#!/bin/sh
# nvcc wrapper: drops the host-only warning flags that CMakeLists.txt's add_compile_options()
# also hands to nvcc (nvcc rejects "-Werror -Wshadow"). Use until CMakeLists.txt limits those
# options to C:  cmake -DCMAKE_CUDA_COMPILER=$PWD/tools/gpu/nvcc_filter.sh ...
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
for a in "$@"; do
    shift
    case "$a" in
    -Wall | -Wextra | -Werror | -Wshadow | -Wno-unused-parameter | -Wstrict-prototypes | -Wvla | \
        -Wformat=2 | -fno-strict-aliasing) ;;
    *) set -- "$@" "$a" ;;
    esac
done
exec "$NVCC" "$@"
