/*
 * rank_sum_cuda.c — the ranks' partial sums gathered over NCCL and added in rank
 * order (see rank_sum_cuda.h for why not ncclAllReduce).
 */
#include "engine/rank_sum_cuda.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/nn_cuda.h"

ddt_rank_sum ddt_rank_sum_make(struct ncclComm *comm, int32_t world) {
    return (ddt_rank_sum){.comm = comm, .world = world};
}

ddt_status ddt_rank_sum_allreduce(void *ctx, float *buf, int64_t count, void *stream, ddt_error *err) {
    ddt_rank_sum *c = ctx;
    if (!buf) { /* the reservation, at load, on this rank's device */
        const int64_t cap = count > DDT_RANK_SUM_MIN ? count : DDT_RANK_SUM_MIN;
        if (cap <= c->cap) return DDT_OK;
        ddt_rank_sum_release(c);
        const ddt_status st =
            ddt_cuda_malloc_array((void **)&c->gather, (size_t)c->world * (size_t)cap, sizeof(float), NULL, err);
        if (st == DDT_OK) c->cap = cap;
        return st;
    }
    if (count > c->cap)
        return ddt_fail(err, DDT_ERR_INTERNAL, "all-reduce of %lld floats past the %lld reserved", (long long)count,
                        (long long)c->cap);
    ncclResult_t r = ncclAllGather(buf, c->gather, (size_t)count, ncclFloat32, c->comm, (cudaStream_t)stream);
    if (r != ncclSuccess)
        return ddt_fail(err, DDT_ERR_INTERNAL, "NCCL: ncclAllGather of %lld floats failed: %s", (long long)count,
                        ncclGetErrorString(r));
    return ddt_cuda_sum_parts(c->gather, c->world, count, buf, stream, err);
}

ddt_status ddt_rank_sum_allgather(void *ctx, const float *send, int64_t count, float *recv, void *stream,
                                  ddt_error *err) {
    const ddt_rank_sum *c = ctx;
    ncclResult_t r = ncclAllGather(send, recv, (size_t)count, ncclFloat32, c->comm, (cudaStream_t)stream);
    if (r != ncclSuccess)
        return ddt_fail(err, DDT_ERR_INTERNAL, "NCCL: ncclAllGather of %lld logits failed: %s", (long long)count,
                        ncclGetErrorString(r));
    return DDT_OK;
}

void ddt_rank_sum_release(ddt_rank_sum *s) {
    cudaFree(s->gather);
    s->gather = NULL;
    s->cap = 0;
}
