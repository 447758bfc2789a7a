/* CPU backend with every activation output rounded to bf16: how far does bf16 storage alone
 * move the fixture logits from fp32? */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "model/loader.h"
#include "model/model.h"
#include "testlib.h"
#include "bf16_emu.h" /* the emulation itself (shared with tests/test_cuda_model.c) */

/* Build (CPU-only library):  gcc -O2 -I src tools/gpu/bf16emu.c build-cpu/libdeltaserve_core.a
 *     tests/testlib.c -I tests -lcmocka -lcjson -lpcre2-8 -lutf8proc -lm -lpthread -o /tmp/bf16emu;  /tmp/bf16emu tiny-dense */

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "tiny-dense";
    char dir[512]; snprintf(dir, sizeof dir, "/work/main/tests/data/models/%s", name);
    ds_config cfg; ds_model_weights host; ds_error err = {0};
    if (ds_model_load(dir, &cfg, &host, &err)) { printf("%s\n", err.msg); return 1; }
    ds_backend *a, *b;
    ds_backend_cpu_create(2, &a, &err); ds_backend_cpu_create(2, &b, &err);
    bf16_emu_wrap(b);
    ds_model ma, mb; ds_cache *ca, *cb;
    ds_model_init(&ma, a, &cfg, &host, 64, 64, &err); ds_model_init(&mb, b, &cfg, &host, 64, 64, &err);
    ds_model_cache_create(&ma, 2, 512, 16, &ca, &err); ds_model_cache_create(&mb, 2, 512, 16, &cb, &err);
    for (int s = 0; s < 2; s++) { a->ops->cache_reset_slot(a, ca, s); a->ops->cache_reset_slot(b, cb, s); }
    int32_t tokens[64], pos[64], start[3] = {0, 20, 53}, slot[2] = {0, 1}, past[2] = {0, 0}, bt[2 * 32], out[64];
    test_rng rng = {77}; /* the token stream of tests/test_cuda_ops.c run_fixture */
    for (int i = 0; i < 53; i++) { tokens[i] = (int32_t)((test_rng_uniform(&rng) + 1.0f) * 0.5f * (float)(cfg.vocab - 1)); out[i] = i; }
    for (int i = 0; i < 20; i++) pos[i] = i;
    for (int i = 0; i < 33; i++) pos[20 + i] = i;
    for (int i = 0; i < 64; i++) bt[i] = i;
    ds_batch bb = {.n_tokens = 53, .n_seqs = 2, .tokens = tokens, .positions = pos, .seq_start = start,
                   .seq_slot = slot, .seq_n_past = past, .block_table = bt, .max_blocks = 32, .n_out = 53, .out_rows = out};
    int tot_bad = 0, tot_agree = 0, tot_rows = 0;
    for (int step = 0; step < 5; step++) {
        if (step > 0) { /* decode: one token per sequence */
            past[0] = step == 1 ? 20 : past[0] + 1;
            past[1] = step == 1 ? 33 : past[1] + 1;
            start[1] = 1; start[2] = 2; pos[0] = past[0]; pos[1] = past[1];
            bb.n_tokens = 2; bb.n_out = 2;
            for (int i = 0; i < 2; i++) tokens[i] = (int32_t)((test_rng_uniform(&rng) + 1.0f) * 0.5f * (float)(cfg.vocab - 1));
        }
        ds_model_forward(&ma, ca, &bb, &err); ds_model_forward(&mb, cb, &bb, &err);
        const float *la = ma.s.logits.data, *lb = mb.s.logits.data;
        const int R = bb.n_out;
        double rows[64]; int agree = 0;
        for (int r = 0; r < R; r++) {
            double num = 0, den = 0; int ia = 0, ib = 0;
            for (int v = 0; v < 512; v++) { double d = lb[r*512+v] - la[r*512+v]; num += d*d; den += (double)la[r*512+v]*la[r*512+v];
                if (la[r*512+v] > la[r*512+ia]) ia = v; if (lb[r*512+v] > lb[r*512+ib]) ib = v; }
            rows[r] = sqrt(num/den); agree += ia == ib;
        }
        for (int i = 1; i < R; i++) for (int j = i; j > 0 && rows[j] < rows[j-1]; j--) { double t = rows[j]; rows[j] = rows[j-1]; rows[j-1] = t; }
        int bad = 0; for (int i = 0; i < R; i++) bad += rows[i] > 0.2;
        tot_bad += bad; tot_agree += agree; tot_rows += R;
        printf("%s step %d: bf16-emulated CPU vs fp32 CPU: per-row median %.2e max %.2e, > 0.2: %d, argmax agree %d/%d\n", name, step, rows[R/2], rows[R-1], bad, agree, R);
    }
    printf("%s all %d rows: > 0.2: %d, argmax agree %d\n", name, tot_rows, tot_bad, tot_agree);
    return 0;
}
