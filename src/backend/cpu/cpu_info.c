/* cpu_info.c — what the CPU backend reports about itself for benchmarks: a device name and the
 * measured copy bandwidth (the roofline `deltaserve bench` compares against). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_internal.h"

const char *ds_cpu_device_name(ds_backend *be) {
    static _Thread_local char name[64];
    snprintf(name, sizeof name, "cpu: %d threads", ds_cpu_n_threads(be));
    return name;
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* memcpy of a buffer well past the last-level cache, best of a few runs; bytes read plus
 * written per second, the same convention as the CUDA backend's device-to-device copy. */
double ds_cpu_copy_bandwidth_gbps(ds_backend *be) {
    (void)be;
    const size_t bytes = (size_t)256 << 20;
    char *src = malloc(bytes), *dst = malloc(bytes);
    double best = 0;
    if (src && dst) {
        memset(src, 1, bytes);
        memset(dst, 2, bytes);
        for (int r = 0; r < 3; r++) {
            double t0 = seconds();
            memcpy(dst, src, bytes);
            double dt = seconds() - t0;
            double gbps = 2.0 * (double)bytes / dt * 1e-9;
            if (gbps > best) best = gbps;
        }
    }
    free(src);
    free(dst);
    return best;
}
