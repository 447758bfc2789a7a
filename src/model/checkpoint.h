/* checkpoint.h — the tensors of a Hugging Face model directory, by name.
 *
 * A directory holds either `model.safetensors` (preferred when both exist, as transformers does)
 * or `model.safetensors.index.json` whose "weight_map" maps every tensor name to a shard file in
 * the same directory. Each shard is memory-mapped once. Opening checks that every name in the
 * weight_map exists in the shard it points to, so a lookup can never dangle. */
#ifndef DS_CHECKPOINT_H
#define DS_CHECKPOINT_H

#include <stdbool.h>

#include "core/status.h"
#include "model/safetensors.h"

typedef struct ds_checkpoint ds_checkpoint;

/* Errors: DS_ERR_IO when neither file exists or a shard named by the index is missing or
 * unreadable (the message names the file); DS_ERR_FORMAT for a malformed index or shard. */
ds_status ds_checkpoint_open(const char *dir, ds_checkpoint **out, ds_error *err);
void ds_checkpoint_close(ds_checkpoint *ck); /* NULL is a no-op */

/* The tensor called `name` (its origin names the shard file), or NULL when absent. Turn it into a
 * ds_tensor with ds_st_tensor_view(). */
const ds_st_tensor *ds_checkpoint_find(const ds_checkpoint *ck, const char *name);

/* Whether any tensor name starts with `prefix`. */
bool ds_checkpoint_has_prefix(const ds_checkpoint *ck, const char *prefix);

/* All tensors in name order (for `deltaserve info` and tests). */
int ds_checkpoint_count(const ds_checkpoint *ck);
const ds_st_tensor *ds_checkpoint_at(const ds_checkpoint *ck, int i);
int ds_checkpoint_n_files(const ds_checkpoint *ck);
const char *ds_checkpoint_dir(const ds_checkpoint *ck);

#endif
