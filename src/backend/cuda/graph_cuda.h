/*
 * graph_cuda.h — programmatic dependent launch (PDL) for a captured CUDA graph.
 *
 * The engine captures each round into a graph and turns its kernel-to-kernel
 * edges into programmatic ones; the K2.6 benchmark does the same to one verify
 * forward, so that the layer time it reports is the time the engine would see
 * (a product's first weight tiles stream while its predecessor runs) and not a
 * plain stream's, where every kernel starts only after the one before has ended.
 */
#ifndef DDT_BACKEND_CUDA_GRAPH_CUDA_H
#define DDT_BACKEND_CUDA_GRAPH_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every plain edge from a kernel node to a kernel node of graph (a cudaGraph_t)
 * becomes a programmatic edge from the first kernel's launch completion, so the
 * second kernel's blocks are resident and waiting (griddepcontrol.wait, which
 * every kernel of the backend opens with or reaches before reading its inputs)
 * while the first one runs.  products_only: only the edges into kernels that do
 * work before their wait (ddt_cuda_kernel_waits_late).  Edges from or to other
 * nodes (copies, events, NCCL's kernels are not ours: never call this on a graph
 * holding them) stay full dependencies.  *converted (may be NULL) counts the edges
 * changed.  Never for a graph with kernels that do not wait on their grid
 * dependencies. */
ddt_status ddt_cuda_graph_programmatic(void *graph, bool products_only, int32_t *converted, ddt_error *err);

#ifdef __cplusplus
}
#endif

#endif
