/* Linked when deltaserve is built without the CUDA toolkit. */
#include "backend/backend.h"

ds_status ds_backend_cuda_create(int device, ds_backend **out, ds_error *err) {
    (void)device;
    *out = NULL;
    return ds_error_set(err, DS_ERR_UNSUPPORTED,
                        "this deltaserve was built without CUDA (rebuild with the CUDA toolkit)");
}
