/*
 * backend_cuda.h: the C entry points of the CUDA backend besides those
 * worker/backend.h declares (msv_backend_cuda_ops, msv_cuda_device_count).
 */

#ifndef MSV_BACKEND_CUDA_H
#define MSV_BACKEND_CUDA_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Page-locked host memory (cudaHostAlloc): logits copied into it arrive
 * at full link speed.  NULL on failure; free with msv_cuda_host_free. */
void *msv_cuda_host_alloc(size_t bytes);
void msv_cuda_host_free(void *p);

#ifdef __cplusplus
}
#endif

#endif /* MSV_BACKEND_CUDA_H */
