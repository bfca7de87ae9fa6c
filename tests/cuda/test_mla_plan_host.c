/*
 * test_mla_plan_host.c — the tree-verify attention's split plan (mla_verify_cuda.cu),
 * host side only: no GPU is needed, so it runs with the unit tests (ctest) wherever
 * the CUDA backend is built, CI included.
 *
 * Why: the kernel's grid is sized for max_prefix (ddt_cuda_mla_verify_grid_splits)
 * while each launch plans its splits from the n_prefix it reads on the device
 * (ddt_cuda_mla_verify_plan); a plan with more splits than the grid would leave
 * cache blocks unread with no fault at all, and one with an empty split or a block
 * in two splits would sum rows twice or not at all.  The two functions are
 * separate code (split_plan, grid_splits) that every plan change must keep in step
 * (a variant build that changes the plan: relink this test against it with
 * scripts/gpu-variant.sh and run it here).
 *
 * Checks, for token counts 1..64 at 64 heads and odd head counts, prefixes 0..70000
 * (every one to 2100, then strides) under grids of several max_prefix:
 *   - the splits cover the blocks (prefix blocks + the tree's tail block) exactly:
 *     S * bps >= blocks and (S - 1) * bps < blocks, S >= 1, bps >= 1;
 *   - S <= the grid's splits for every n_prefix <= max_prefix, and the grid's
 *     splits never shrink as max_prefix grows;
 *   - the workspace holds the grid's partials (splits x rows x (512 + 1) floats)
 *     for every token count up to the one it was sized for.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "backend/cuda/mla_verify_cuda.h"

static int64_t blocks_of(int64_t np) { return (np + 63) / 64 + 1; }

/* every n_prefix to 2100, then a stride that still lands on block edges' neighbours */
static int64_t next_prefix(int64_t np) {
    if (np < 2100) return np + 1;
    return np + (np % 64 == 63 ? 1 : 61);
}

static void check_plans(int32_t T, int32_t H) {
    int32_t prev_grid = 0;
    for (int64_t np = 0; np <= 70000; np = next_prefix(np)) {
        int32_t S = -1, bps = -1;
        ddt_cuda_mla_verify_plan(T, H, np, &S, &bps);
        const int64_t nb = blocks_of(np);
        if (S < 1 || bps < 1 || (int64_t)S * bps < nb || (int64_t)(S - 1) * bps >= nb)
            fail_msg("T %d H %d n_prefix %lld: %d splits of %d blocks for %lld blocks", T, H, (long long)np, S, bps,
                     (long long)nb);
        /* the grid sized for this prefix as max_prefix, and for larger ones */
        const int32_t grid = ddt_cuda_mla_verify_grid_splits(T, H, np);
        if (S > grid)
            fail_msg("T %d H %d n_prefix %lld: %d splits planned, grid of %d", T, H, (long long)np, S, grid);
        if (grid < prev_grid)
            fail_msg("T %d H %d: grid splits shrink from %d to %d at max_prefix %lld", T, H, prev_grid, grid,
                     (long long)np);
        prev_grid = grid;
    }
}

static void test_plans_cover_blocks_within_grid(void **state) {
    (void)state;
    for (int32_t T = 1; T <= 64; T++) check_plans(T, 64);
    const int32_t odd[][2] = {{3, 16}, {5, 24}, {9, 8}, {17, 64}, {64, 7}, {1, 1}, {64, 128}};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) check_plans(odd[i][0], odd[i][1]);
}

static void test_workspace_holds_grid_partials(void **state) {
    (void)state;
    const int64_t maxps[] = {0, 1, 64, 1000, 4096, 20001, 65536, 131072};
    for (size_t m = 0; m < sizeof maxps / sizeof maxps[0]; m++)
        for (int32_t T = 1; T <= 64; T += (T < 8 ? 1 : 7)) {
            const size_t ws = ddt_cuda_mla_verify_workspace(T, 64, maxps[m]);
            for (int32_t t = 1; t <= T; t++) {
                const size_t need = (size_t)ddt_cuda_mla_verify_grid_splits(t, 64, maxps[m]) * (size_t)t * 64 *
                                    (DDT_MLA_DV + 1) * sizeof(float);
                if (ws < need)
                    fail_msg("workspace for T %d, max_prefix %lld: %zu bytes, T' = %d needs %zu", T,
                             (long long)maxps[m], ws, t, need);
            }
        }
}

static void test_out_of_range(void **state) {
    (void)state;
    assert_int_equal(ddt_cuda_mla_verify_grid_splits(0, 64, 100), 0);
    assert_int_equal(ddt_cuda_mla_verify_grid_splits(1, 0, 100), 0);
    assert_int_equal(ddt_cuda_mla_verify_grid_splits(1, 64, -1), 0);
    assert_int_equal(ddt_cuda_mla_verify_workspace(0, 64, 100), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plans_cover_blocks_within_grid),
        cmocka_unit_test(test_workspace_holds_grid_partials),
        cmocka_unit_test(test_out_of_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
