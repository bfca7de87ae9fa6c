/*
 * graph_cuda.cu — programmatic edges for a captured CUDA graph (see graph_cuda.h).
 *
 * Host code only.  Safe because every kernel of the backend opens with
 * griddepcontrol.wait (DDT_GRID_DEP_WAIT, cuda_check.h; or reaches it before its
 * first read of anything a predecessor writes: DDT_GRID_DEP_LATER, checked by
 * tests/python/test_cuda_sources.py), which holds it until every grid it depends
 * on has finished and flushed its writes.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/graph_cuda.h"
#include "backend/cuda/qmatmul_cuda.h"
#include "core/error.h"

extern "C" ddt_status ddt_cuda_graph_programmatic(void *graph, bool products_only, int32_t *converted,
                                                  ddt_error *err) {
    cudaGraph_t g = (cudaGraph_t)graph;
    if (!g) return ddt_fail(err, DDT_ERR_INVALID, "programmatic edges: no graph");
    size_t ne = 0;
    DDT_CUDA_TRY(cudaGraphGetEdges(g, NULL, NULL, NULL, &ne), err);
    if (ne == 0) return DDT_OK;
    cudaGraphNode_t *from = (cudaGraphNode_t *)calloc(ne, sizeof *from),
                    *to = (cudaGraphNode_t *)calloc(ne, sizeof *to);
    cudaGraphEdgeData *ed = (cudaGraphEdgeData *)calloc(ne, sizeof *ed);
    ddt_status st = DDT_OK;
    if (!from || !to || !ed) st = ddt_fail(err, DDT_ERR_NOMEM, "programmatic edges: %zu edges", ne);
    cudaError_t ce = st == DDT_OK ? cudaGraphGetEdges(g, from, to, ed, &ne) : cudaSuccess;
    int32_t n_conv = 0;
    for (size_t i = 0; st == DDT_OK && ce == cudaSuccess && i < ne; i++) {
        enum cudaGraphNodeType tf, tt;
        ce = cudaGraphNodeGetType(from[i], &tf);
        if (ce == cudaSuccess) ce = cudaGraphNodeGetType(to[i], &tt);
        if (ce != cudaSuccess || tf != cudaGraphNodeTypeKernel || tt != cudaGraphNodeTypeKernel ||
            ed[i].type != cudaGraphDependencyTypeDefault)
            continue;
        if (products_only) { /* only into a kernel with work before its wait */
            struct cudaKernelNodeParams kp;
            ce = cudaGraphKernelNodeGetParams(to[i], &kp);
            if (ce != cudaSuccess) break;
            if (!ddt_cuda_kernel_waits_late(kp.func)) continue;
        }
        ce = cudaGraphRemoveDependencies(g, &from[i], &to[i], &ed[i], 1);
        cudaGraphEdgeData p;
        memset(&p, 0, sizeof p);
        p.type = cudaGraphDependencyTypeProgrammatic;
        p.from_port = cudaGraphKernelNodePortLaunchCompletion;
        if (ce == cudaSuccess) ce = cudaGraphAddDependencies(g, &from[i], &to[i], &p, 1);
        if (ce == cudaSuccess) n_conv++;
    }
    if (st == DDT_OK && ce != cudaSuccess)
        st = ddt_fail(err, DDT_ERR_INTERNAL, "CUDA: programmatic edges of a graph: %s", cudaGetErrorString(ce));
    free(from);
    free(to);
    free(ed);
    if (converted) *converted += n_conv;
    return st;
}
