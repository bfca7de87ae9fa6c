/*
 * rank_sum_cuda.h — the sharded target's all-reduce (model/target_cuda.h's
 * ddt_cuda_allreduce_fn) over NCCL, adding the ranks' partials in rank order,
 * and its logits' all-gather (ddt_cuda_allgather_fn): the multi-GPU engine's and
 * cuda_bench_multi's one implementation.
 *
 * Each rank gathers every rank's partial into a [world][cap] buffer on its GPU
 * (ncclAllGather), then adds them in rank order (ddt_cuda_sum_parts), in place.
 * Not ncclAllReduce: from three ranks on, the order in which it adds an element's
 * partials depends on the element's place in the message, hence on the token
 * count, so a tree's verify and an ar step would round a token's sums
 * differently, and greedy tree decoding could leave ar's tokens at a near tie.
 * Rank order is the same at every count (and is what the one-GPU emulation of the
 * ranks in test_cuda_multi computes).  At one and two ranks the bytes are
 * ncclAllReduce's (a copy; a + b = b + a).  The cost: each rank receives every
 * other rank's partial, (world - 1) x count floats, where a ring all-reduce moves
 * ~2 x count; at decode's few tokens both are latency (cuda_bench_multi's real
 * worlds measure the two side by side).
 */
#ifndef DDT_ENGINE_RANK_SUM_CUDA_H
#define DDT_ENGINE_RANK_SUM_CUDA_H

#include <stdint.h>

#include "core/error.h"

struct ncclComm; /* nccl.h's ncclComm_t is a pointer to it */

/* Floats every rank's gather buffer holds at least: the engine's own sums (the
 * stop flag, the auto budget's packed cost table) beside the forwards'. */
#define DDT_RANK_SUM_MIN 4096

/* One rank's side: its communicator and its gather buffer, on its GPU. */
typedef struct ddt_rank_sum {
    struct ncclComm *comm;
    int32_t world;
    float *gather; /* [world][cap], NULL until reserved */
    int64_t cap;
} ddt_rank_sum;

/* A rank's side over comm, nothing reserved. */
ddt_rank_sum ddt_rank_sum_make(struct ncclComm *comm, int32_t world);

/* The all-reduce contract with ctx a ddt_rank_sum.  buf == NULL reserves room for
 * count floats a rank (at least DDT_RANK_SUM_MIN) on the current device, growing
 * only; otherwise buf's count floats are summed over the ranks in place on
 * stream.  A count past the reservation is an error (a sum must never allocate:
 * it runs inside captured rounds). */
ddt_status ddt_rank_sum_allreduce(void *ctx, float *buf, int64_t count, void *stream, ddt_error *err);

/* The all-gather contract (model/target_cuda.h ddt_cuda_allgather_fn) with ctx a
 * ddt_rank_sum: ncclAllGather of send's count floats into recv [world][count]. */
ddt_status ddt_rank_sum_allgather(void *ctx, const float *send, int64_t count, float *recv, void *stream,
                                  ddt_error *err);

/* Frees the gather buffer (the caller's device must be the rank's); the
 * communicator stays the caller's. */
void ddt_rank_sum_release(ddt_rank_sum *s);

#endif
