/*
 * mma.cuh: the tensor-core and asynchronous-copy instructions the
 * kernels share (attention.cu's tensor-core forms, gemv_fixed.cuh):
 * mma.m16n8k16 with bf16 inputs and fp32 accumulators, ldmatrix and
 * cp.async, as inline PTX (sm_80 and later).
 */

#ifndef MSV_MMA_CUH
#define MSV_MMA_CUH

#include "cuda_common.cuh"

/* c (16 x 8 fp32) += a (16 x 16 bf16, row) . b (16 x 8 bf16, col), in
 * the fragment layouts of the PTX ISA's mma.m16n8k16. */
static __device__ __forceinline__ void
msv_mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void
msv_ldmatrix_x4(uint32_t r[4], const void *p)
{
    uint32_t  s = (uint32_t) __cvta_generic_to_shared(p);

    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 "
                 "{%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

static __device__ __forceinline__ void
msv_ldmatrix_x4_trans(uint32_t r[4], const void *p)
{
    uint32_t  s = (uint32_t) __cvta_generic_to_shared(p);

    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 "
                 "{%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

/* 16 bytes global -> shared; n = 0 fills the 16 bytes with zeros. */
static __device__ __forceinline__ void
msv_cp_async16(void *dst, const void *src, uint32_t n)
{
    uint32_t  s = (uint32_t) __cvta_generic_to_shared(dst);

    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(s), "l"(src), "r"(n));
}

static __device__ __forceinline__ void
msv_cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}

static __device__ __forceinline__ void
msv_cp_async_wait_all(void)
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

/* Every group but the newest N complete. */
template <int N>
static __device__ __forceinline__ void
msv_cp_async_wait_newest(void)
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

#endif /* MSV_MMA_CUH */
