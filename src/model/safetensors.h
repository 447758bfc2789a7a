/* safetensors.h — a parser for the safetensors format that trusts nothing.
 *
 * Layout: u64 little-endian header length N, N bytes of JSON header, then the data section.
 * The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} with offsets
 * relative to the data section; "__metadata__" is ignored.
 *
 * What parsing checks (any failure → DS_ERR_FORMAT naming the origin and the tensor):
 *  - N fits in the buffer (and is at most 100 MB), the header is one JSON object followed only by
 *    whitespace padding, every entry has the three fields with the right JSON types;
 *  - shape dims and offsets are non-negative integers, rank ≤ DS_ST_MAX_RANK;
 *  - begin ≤ end ≤ size of the data section, and end − begin == numel · element size, with
 *    overflow-checked arithmetic (skipped only for dtype strings whose size we do not know);
 *  - no two tensors' byte ranges overlap and no name appears twice.
 * Gaps between tensors and trailing bytes are tolerated (they harm nothing).
 *
 * What parsing does NOT reject: dtypes other than F32/BF16/F16, and rank > DS_MAX_DIMS. Real
 * checkpoints carry such tensors (e.g. the 5-D Conv3d weight of the vision tower, I64 buffers)
 * that a text engine never asks for; ds_st_tensor_view() reports them as DS_ERR_UNSUPPORTED only
 * when they are actually requested. */
#ifndef DS_SAFETENSORS_H
#define DS_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

#define DS_ST_MAX_RANK 8                        /* ranks parsed; views need ≤ DS_MAX_DIMS */
#define DS_ST_MAX_HEADER (100u * 1000u * 1000u) /* same cap as the reference implementation */

typedef struct ds_st_file ds_st_file;

/* One header entry. All pointers are owned by the ds_st_file and valid until ds_st_close. */
typedef struct ds_st_tensor {
    const char *name;
    const char *dtype_name; /* as written in the header, e.g. "BF16", "I64" */
    bool dtype_ok;          /* F32, BF16 or F16: `dtype` is valid */
    ds_dtype dtype;
    int ndim; /* 0 (scalar) .. DS_ST_MAX_RANK */
    int64_t shape[DS_ST_MAX_RANK];
    const uint8_t *data; /* first byte (may be unaligned; read through memcpy) */
    size_t nbytes;
    const char *origin; /* file path or label, for error messages */
} ds_st_tensor;

/* Parses a safetensors image held in memory. The file does not copy `buf`: buf must outlive it.
 * `origin` names the image in error messages. */
ds_status ds_st_parse(const uint8_t *buf, size_t len, const char *origin, ds_st_file **out,
                      ds_error *err);

/* Memory-maps `path` read-only and parses it. DS_ERR_IO when it cannot be opened or mapped. */
ds_status ds_st_open(const char *path, ds_st_file **out, ds_error *err);

/* Frees the file (and its mapping). NULL is a no-op. */
void ds_st_close(ds_st_file *f);

const char *ds_st_origin(const ds_st_file *f);
int ds_st_count(const ds_st_file *f);
/* Tensors in name order, i in [0, ds_st_count). */
const ds_st_tensor *ds_st_at(const ds_st_file *f, int i);
/* Lookup by exact name (binary search); NULL when absent. */
const ds_st_tensor *ds_st_find(const ds_st_file *f, const char *name);

/* A read-only ds_tensor view of t (data points into the file: never write through it).
 * DS_ERR_UNSUPPORTED naming the tensor when its dtype is not F32/BF16/F16 or its rank exceeds
 * DS_MAX_DIMS. Unused trailing ne[] entries are set to 1. */
ds_status ds_st_tensor_view(const ds_st_tensor *t, ds_tensor *out, ds_error *err);

/* Element i of a float tensor as f32 (any of F32/BF16/F16, unaligned-safe). t->dtype_ok must
 * hold and i < numel. */
float ds_st_tensor_get_f32(const ds_st_tensor *t, int64_t i);

/* Formats a shape as "[a, b, c]" into buf; returns buf. */
char *ds_st_shape_str(const int64_t *shape, int ndim, char *buf, size_t size);

#endif
