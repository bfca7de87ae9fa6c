/*
 * safetensors.h — memory-mapped, zero-copy reader of safetensors checkpoints
 * (one file or a shard set named by model.safetensors.index.json), treating every
 * file as hostile: the header length must lie inside the file, every tensor's
 * byte range inside the data section, ranges must not overlap, byte length must
 * equal element count x dtype size, and shape products are overflow-checked.
 *
 * Format: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {...}}, then the data section; offsets are relative to it.
 */
#ifndef DDT_IO_SAFETENSORS_H
#define DDT_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "ddtree.h"

typedef enum ddt_dtype {
    DDT_DTYPE_F32 = 0,
    DDT_DTYPE_BF16,
    DDT_DTYPE_F16,
    DDT_DTYPE_F8_E4M3,
    DDT_DTYPE_I64,
    DDT_DTYPE_I32,
    DDT_DTYPE_I16,
    DDT_DTYPE_I8,
    DDT_DTYPE_U8,
    DDT_DTYPE_BOOL,
    DDT_DTYPE_F64,
    DDT_DTYPE_COUNT
} ddt_dtype;

/* Bytes per element; "F8_E4M3" etc. names as in the safetensors spec. */
size_t ddt_dtype_size(ddt_dtype dt);
const char *ddt_dtype_name(ddt_dtype dt);

#define DDT_ST_MAX_DIMS 8

typedef struct ddt_st_tensor {
    char *name;                       /* owned, NUL-terminated */
    ddt_dtype dtype;
    int32_t ndim;                     /* 0..DDT_ST_MAX_DIMS */
    int64_t shape[DDT_ST_MAX_DIMS];
    int64_t numel;                    /* product of shape (1 for a scalar) */
    const void *data;                 /* borrowed: points into the file mapping */
    uint64_t nbytes;
    int32_t file_index;               /* which shard */
} ddt_st_tensor;

typedef struct ddt_checkpoint ddt_checkpoint;

/*
 * Open `path`: a .safetensors file, or a folder holding model.safetensors.index.json
 * (shards named by its weight_map) or a single model.safetensors.  All files are
 * mmapped read-only; nothing is copied.  Errors name the file and the tensor.
 */
ddt_status ddt_checkpoint_open(const char *path, ddt_checkpoint **out, ddt_error *err);
void ddt_checkpoint_close(ddt_checkpoint *ck);

int32_t ddt_checkpoint_count(const ddt_checkpoint *ck);
const ddt_st_tensor *ddt_checkpoint_at(const ddt_checkpoint *ck, int32_t i);
/* Tensor by exact name, NULL when absent. O(log n). */
const ddt_st_tensor *ddt_checkpoint_find(const ddt_checkpoint *ck, const char *name);
/* File name of shard i (for error messages). */
const char *ddt_checkpoint_file_name(const ddt_checkpoint *ck, int32_t file_index);

/*
 * Parse one safetensors file image held in memory (the fuzz entry point, and what
 * open uses per shard).  On success *out_tensors is an owned array of *out_count
 * tensors whose data pointers point into buf; free with ddt_st_tensors_free.
 * `file_name` is used in error messages only.
 */
ddt_status ddt_st_parse(const uint8_t *buf, size_t len, const char *file_name,
                        ddt_st_tensor **out_tensors, int32_t *out_count, ddt_error *err);
void ddt_st_tensors_free(ddt_st_tensor *tensors, int32_t count);

/* ---- quantised weight views ---------------------------------------------- */

#define DDT_FP8_BLOCK 128  /* edge of an FP8 scale block (DeepSeek-V3 weight_block_size) */
#define DDT_INT4_GROUP 32  /* columns per INT4 scale (compressed-tensors group_size) */

typedef enum ddt_qformat {
    DDT_Q_DENSE = 0,   /* F32 / BF16 / F16 [rows][cols] */
    DDT_Q_FP8_BLOCK,   /* F8_E4M3 [rows][cols] + weight_scale_inv F32 [ceil(rows/128)][ceil(cols/128)], w = q * s */
    DDT_Q_INT4_GROUP   /* compressed-tensors pack-quantized: weight_packed I32 [rows][cols/8],
                          weight_scale BF16 [rows][cols/group], weight_shape I64 [2];
                          value = (((w >> 4*(j%8)) & 0xF) - 8) * scale[row][j/group] */
} ddt_qformat;

typedef struct ddt_qweight {
    ddt_qformat format;
    ddt_dtype dtype;          /* element dtype of data: F32/BF16/F16, F8_E4M3, or I32 (int4 packed) */
    int64_t rows, cols;       /* logical [out, in] */
    const void *data;         /* borrowed */
    const float *scale_inv;   /* FP8: [ceil(rows/128)][ceil(cols/128)] */
    const uint16_t *scale;    /* INT4: bf16 [rows][cols/group] */
    int32_t block;            /* FP8 block edge (128) */
    int32_t group;            /* INT4 group size (32) */
    /* The CUDA tensor-core layout (backend/cuda/wstream.cuh), device memory made
     * by ddt_cuda_qweight_pack beside the row-major data; NULL everywhere else.
     * mma_scale: INT4's scales in the same tile order. */
    const void *mma;
    const void *mma_scale;
} ddt_qweight;

/*
 * Resolve the weight named `base` (e.g. "model.layers.3.mlp.experts.7.up_proj"):
 * `base.weight` (dense, or FP8 with `base.weight_scale_inv`) or
 * `base.weight_packed` + `base.weight_scale` + `base.weight_shape` (INT4).
 * Checks dtypes and that the shape is [rows, cols] when rows/cols > 0.
 * Errors name the tensor, the expected and the found shape and dtype.
 */
ddt_status ddt_checkpoint_weight(const ddt_checkpoint *ck, const char *base, int64_t rows,
                                 int64_t cols, ddt_qweight *out, ddt_error *err);

/*
 * A stack of `count` equal matrices in one 3-D tensor [count][rows][cols]: how
 * transformers 5 stores a MoE layer's routed experts when it saves its own
 * module layout (`mlp.experts.gate_up_proj` [E, 2I, H], gate rows first, and
 * `mlp.experts.down_proj` [E, H, I]; no `.weight` suffix).  Dense (F32, BF16,
 * F16) or FP8 block with `<name>_scale_inv` F32 [count][ceil(rows/128)][ceil(cols/128)]
 * (transformers' FP8 experts: one scale grid per matrix).  Borrowed like ddt_qweight.
 */
typedef struct ddt_qweight_stack {
    ddt_qformat format;       /* DDT_Q_DENSE or DDT_Q_FP8_BLOCK */
    ddt_dtype dtype;
    int64_t count, rows, cols;
    const void *data;         /* [count][rows][cols] */
    const float *scale_inv;   /* FP8: [count][ceil(rows/128)][ceil(cols/128)] */
    int32_t block;            /* FP8 block edge (128) */
    const char *name;         /* the tensor's name (owned by the checkpoint), for messages */
} ddt_qweight_stack;

/*
 * Resolve the 3-D tensor `name` (exact name, no suffix added) as a stack of
 * count x [rows][cols]; every dimension must be > 0 and equal the tensor's.
 * An F8_E4M3 tensor needs `<name>_scale_inv`; an integer tensor (a packed INT4
 * stack, for which no checkpoint layout is defined) is refused as unsupported.
 * Errors name the tensor, the expected and the found shape and dtype.
 */
ddt_status ddt_checkpoint_weight_stack(const ddt_checkpoint *ck, const char *name, int64_t count, int64_t rows,
                                       int64_t cols, ddt_qweight_stack *out, ddt_error *err);

/*
 * out = rows [row0, row0 + n_rows) of matrix i of the stack, as a weight view
 * (no copy).  FP8 views need block-aligned row ranges (row0 a multiple of the
 * block, and n_rows too unless the range ends the matrix), since a view's scale
 * grid must start at a block row; otherwise DDT_ERR_UNSUPPORTED naming the tensor.
 */
ddt_status ddt_qweight_stack_view(const ddt_qweight_stack *s, int64_t i, int64_t row0, int64_t n_rows,
                                  ddt_qweight *out, ddt_error *err);

/*
 * The tensors whose names start with `prefix` are contiguous in the sorted
 * table: *first = the index (for ddt_checkpoint_at) of the first of them;
 * returns how many there are (0: none, *first is then unspecified).
 */
int32_t ddt_checkpoint_prefix_range(const ddt_checkpoint *ck, const char *prefix, int32_t *first);

/* Plain tensor lookup with a dtype and shape check (ndim entries of shape; -1 = any).
 * dtype DDT_DTYPE_COUNT accepts any dtype; ndim < 0 skips the shape check; shape
 * NULL with ndim >= 0 checks only the rank. */
ddt_status ddt_checkpoint_tensor(const ddt_checkpoint *ck, const char *name, ddt_dtype dtype,
                                 int32_t ndim, const int64_t *shape, const ddt_st_tensor **out,
                                 ddt_error *err);

/* Scalar conversions used by every backend. */
float ddt_bf16_to_f32(uint16_t v);
uint16_t ddt_f32_to_bf16(float v);        /* round to nearest even */
float ddt_f16_to_f32(uint16_t v);
float ddt_fp8_e4m3_to_f32(uint8_t v);

#endif
