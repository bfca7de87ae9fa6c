/*
 * row_groups.h — the grouped row selection both backends' matmuls take (one
 * struct for the CPU's qmatmul.h and the GPU's qmatmul_cuda.h): group g uses
 * weight rows [g*w_row_stride + w_row_offset, ... + rows), reads x at column
 * offset g*x_stride of each x row and writes y at column offset g*y_stride.  MLA
 * uses it to apply kv_b_proj's per-head slices (W_UK, W_UV) without copying them.
 */
#ifndef DDT_BACKEND_ROW_GROUPS_H
#define DDT_BACKEND_ROW_GROUPS_H

#include <stdint.h>

typedef struct ddt_row_groups {
    int32_t count;          /* number of groups, >= 1 */
    int64_t w_row_stride;   /* weight rows between consecutive groups */
    int64_t w_row_offset;   /* first weight row of group 0 */
    int64_t rows;           /* weight rows per group */
    int64_t x_stride;       /* x columns between groups */
    int64_t y_stride;       /* y columns between groups */
} ddt_row_groups;

#endif
