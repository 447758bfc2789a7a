/* probe_check.cuh — the GPU probes' error check (tools/gpu/probe_*.cu, each built alone with
 * nvcc): CK(call) prints the failing call's place and error and returns 1 from main. */
#ifndef DS_PROBE_CHECK_CUH
#define DS_PROBE_CHECK_CUH

#include <cstdio>
#include <cuda_runtime.h>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));        \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

#endif
