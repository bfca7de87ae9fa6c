/*
 * cp_async_dev.cuh — the asynchronous global -> shared copies (sm_80's cp.async) and their
 * group waits, in one place for every kernel that streams through shared memory: the weight
 * streams (wstream.cuh), the tensor-core experts (wgmma_experts.cuh), the MLA merge of many
 * splits (mla_verify_cuda.cu), the drafter's attention tiles (dflash_cuda.cu) and the
 * streaming probe (bench/cuda_bench_inflight_kernels.cu).  Each was a one-line asm written
 * again where it was used.  Destinations are 32-bit shared addresses (__cvta_generic_to_shared)
 * so a caller computes a stage's address once and adds offsets in 32 bits.
 *
 * .cg copies bypass L1 (streamed data read once: weights, partials); .ca copies keep it in L1
 * (4-byte copies, which .cg does not allow, and tiles read again).  The "_fill" forms copy
 * `valid` bytes (0..16) and zero the rest of the 16: a row's tail past K, or no read at all.
 */
#ifndef DDT_CUDA_CP_ASYNC_DEV_CUH
#define DDT_CUDA_CP_ASYNC_DEV_CUH

#include <stdint.h>

/* 16 bytes, L1 bypassed */
static __device__ __forceinline__ void cp_async_cg16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
/* the first `valid` of 16 bytes, the rest zero, L1 bypassed */
static __device__ __forceinline__ void cp_async_cg16_fill(uint32_t dst, const void *src, int valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid) : "memory");
}
/* the first `valid` of 16 bytes, the rest zero, through L1 */
static __device__ __forceinline__ void cp_async_ca16_fill(uint32_t dst, const void *src, int valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid) : "memory");
}
/* 4 bytes, through L1 */
static __device__ __forceinline__ void cp_async_ca4(uint32_t dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
/* closes this thread's copies issued since the last commit into one group */
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* until at most N of this thread's groups are still in flight */
template <int N> static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* until all of this thread's copies have landed, committed or not */
static __device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

#endif
