/*
 * kv_read_rate.cu: the read-only ceilings that the decode attention's
 * floor leans on, on a machine with an NVIDIA GPU: a sequential read of
 * 4 GB, and reads in the attention's pattern at batch 256 of qwen3-8b (a
 * one-warp block per (token, kv head) reading 24 pages of 4 KB of K and
 * of V, 8 kv heads, rotating over 8 sets of 400 MB), grid in token and in
 * head order, with as many warps an SM as registers allow and with 8 (the
 * walking kernel's occupancy, held by 26 KB of dynamic shared memory).
 * Median of 12 launches by CUDA events.
 *
 *   nvcc -O2 -gencode arch=compute_90,code=sm_90 -o kv_read_rate \
 *       bench/kv_read_rate.cu && ./kv_read_rate
 */
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
/* every CUDA call checked; a failure ends the run (also inside the timing lambda) */
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "kv_read_rate: %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

__global__ void seq_read(const uint4 *p, size_t n, uint32_t *out) {
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x * blockDim.x) {
        uint4 v = __ldcs(p + i); acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}
// one warp a block: (token, head) reads npg pages of K and V (4 KB each at HD 128, 8 heads)
__global__ void kv_read(const uint4 *k, const uint4 *v, int npg, int heads_inner, int nheads, uint32_t *out) {
    int t = heads_inner ? blockIdx.y : blockIdx.x, h = heads_inner ? blockIdx.x : blockIdx.y;
    uint32_t acc = 0;
    for (int p = 0; p < npg; p++) {
        size_t base = (((size_t) t * npg + p) * nheads + h) * 256;   // 256 uint4 = 4 KB
        uint4 a[8], b[8];
#pragma unroll
        for (int c = 0; c < 8; c++) { a[c] = __ldcs(k + base + c * 32 + threadIdx.x); b[c] = __ldcs(v + base + c * 32 + threadIdx.x); }
#pragma unroll
        for (int c = 0; c < 8; c++) acc ^= a[c].x ^ a[c].w ^ b[c].y ^ b[c].z;
    }
    if (acc == 0x12345678u) out[0] = acc;
}
int main() {
    size_t bytes = (size_t) 4 << 30; uint4 *buf; uint32_t *o;
    CK(cudaMalloc(&buf, bytes)); CK(cudaMalloc(&o, 4)); CK(cudaMemset(buf, 0x5a, bytes));
    cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    auto med = [&](auto fn) { std::vector<float> ms; for (int r = 0; r < 12; r++) { CK(cudaEventRecord(a)); fn(); CK(cudaGetLastError()); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b)); float m; CK(cudaEventElapsedTime(&m, a, b)); ms.push_back(m); } std::sort(ms.begin(), ms.end()); return ms[6]; };
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    float m = med([&] { seq_read<<<sms * 8, 512>>>(buf, bytes / 16, o); });
    CK(cudaGetLastError());
    printf("sequential read %.3f ms %.3f TB/s\n", m, bytes / m / 1e9);
    // batch 256 x 24 pages x 8 heads x 4 KB = 201 MB each for K and V; rotate over 8 sets (3.2 GB)
    int T = 256, npg = 24, H = 8; size_t set = (size_t) T * npg * H * 256; // uint4 per K set
    CK(cudaFuncSetAttribute(kv_read, cudaFuncAttributeMaxDynamicSharedMemorySize, 27000));
    for (int sm = 0; sm < 2; sm++)
    for (int hi = 0; hi < 2; hi++) {
        int r = 0; size_t smem = sm ? 26112 : 0;
        float mm = med([&] { const uint4 *kk = buf + (size_t) (r % 8) * 2 * set; r++; dim3 g = hi ? dim3(H, T) : dim3(T, H); kv_read<<<g, 32, smem>>>(kk, kk + set, npg, hi, H, o); });
        CK(cudaGetLastError());
        printf("kv pattern %s-major, %s: %.4f ms a layer, %.3f TB/s (x36 = %.3f ms)\n", hi ? "head-inner" : "token", sm ? "8 warps an SM" : "32 warps an SM", mm, 2.0 * set * 16 / mm / 1e9, mm * 36);
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
