/*
 * cuda_types.h — the CUDA backend's one vocabulary of handle types for C callers
 * that do not include the CUDA headers: a stream is a ddt_cuda_stream everywhere
 * (cudaStream_t is a pointer to the same opaque struct, so the two convert freely).
 */
#ifndef DDT_CUDA_TYPES_H
#define DDT_CUDA_TYPES_H

typedef struct CUstream_st *ddt_cuda_stream; /* cudaStream_t without including CUDA */

#endif
