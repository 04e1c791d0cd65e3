/*
 * backend_select.c: which backends this build has.  The CUDA backend
 * lives in kernels/ and is linked in only when the build found nvcc
 * (MSV_HAVE_CUDA); without it the answers are "none" and "no GPU".
 */

#include <stddef.h>

#include "backend.h"


/* vLLM's default for gpu_memory_utilization */
static double  msv_cuda_mem_fraction = 0.9;


void
msv_cuda_set_memory_fraction(double f)
{
    if (f > 0.0 && f <= 1.0) {
        msv_cuda_mem_fraction = f;
    }
}


double
msv_cuda_memory_fraction(void)
{
    return msv_cuda_mem_fraction;
}


#ifdef MSV_HAVE_CUDA

const struct msv_backend_ops *
msv_backend_cuda(void)
{
    return msv_backend_cuda_ops();
}


int
msv_cuda_available(void)
{
    return msv_cuda_device_count() > 0;
}

#else

const struct msv_backend_ops *
msv_backend_cuda(void)
{
    return NULL;
}


int
msv_cuda_available(void)
{
    return 0;
}

#endif
