/* cpu_backend.h — CPU-backend extras beyond backend.h, for tests and tools.
 *
 * The model code only needs ds_backend_cpu_create (backend.h). These hooks let a test force
 * one of the two GDN algorithms and inspect the caches. */
#ifndef DS_CPU_BACKEND_H
#define DS_CPU_BACKEND_H

#include "backend/backend.h"

typedef enum ds_cpu_gdn_mode {
    DS_CPU_GDN_AUTO = 0,  /* chunked for sequences with >= DS_CPU_GDN_CHUNK_MIN tokens this step */
    DS_CPU_GDN_RECURRENT, /* token-by-token recurrence for every sequence */
    DS_CPU_GDN_CHUNKED,   /* chunked form (chunk 64) for every sequence */
} ds_cpu_gdn_mode;

#define DS_CPU_GDN_CHUNK     64 /* chunk length of the chunked form (transformers' default) */
#define DS_CPU_GDN_CHUNK_MIN 64 /* AUTO: tokens of one sequence in one step to go chunked */

/* be must come from ds_backend_cpu_create. */
void ds_cpu_set_gdn_mode(ds_backend *be, ds_cpu_gdn_mode mode);
int ds_cpu_n_threads(const ds_backend *be);

/* Views into a CPU cache for model layer `layer` (an index into cfg->layer_types; MTP layers
 * are numbered n_layers .. n_layers + n_mtp_layers - 1). NULL when the layer has no such pool. */
float *ds_cpu_cache_gdn_state(ds_cache *c, int layer, int slot); /* [Hv, dk, dv] */
float *ds_cpu_cache_gdn_conv(ds_cache *c, int layer, int slot);  /* [conv_dim, kernel-1] */
float *ds_cpu_cache_k(ds_cache *c, int layer); /* [n_blocks, block_size, n_kv_heads, head_dim] */
float *ds_cpu_cache_v(ds_cache *c, int layer); /* [n_blocks, block_size, n_kv_heads, head_dim] */

#endif
