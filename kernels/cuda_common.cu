/*
 * cuda_common.cu: error messages for failed CUDA and cuBLAS calls; the
 * programmatic-launch switch (cuda_common.cuh).
 */

#include <stdio.h>
#include <string.h>

#include "cuda_common.cuh"

int  msv_cuda_pdl;

static const char *
msv_base_name(const char *file)
{
    const char  *s;

    s = strrchr(file, '/');
    return s ? s + 1 : file;
}

int
msv_cuda_fail(char *err, size_t errlen, const char *what, const char *file,
    int line, cudaError_t e)
{
    if (err != NULL && errlen > 0) {
        snprintf(err, errlen, "cuda: %s:%d: %s: %s: %s", msv_base_name(file),
                 line, what, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    return -1;
}

int
msv_cublas_fail(char *err, size_t errlen, const char *what, const char *file,
    int line, cublasStatus_t s)
{
    if (err != NULL && errlen > 0) {
        snprintf(err, errlen, "cublas: %s:%d: %s: %s: %s",
                 msv_base_name(file), line, what, cublasGetStatusName(s),
                 cublasGetStatusString(s));
    }
    return -1;
}
