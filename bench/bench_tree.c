/*
 * bench_tree.c — CPU time of one DDTree round's host-side tree work: the
 * best-first build from a depth-15 table with K = B, then the walk, for budgets
 * 16..1024, single-threaded.  Tables are log-softmaxes of random logits with a
 * peaked head (like a drafter that is often right); the walk follows a random
 * path.  Prints a Markdown table for BENCHMARKS.md.  Usage: bench_tree [reps]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ddtree.h"

#define D 15

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 2000;
    if (reps < 10) reps = 10;
    static float logq[D * DDT_MAX_TOPK];
    static int32_t tok[D * DDT_MAX_TOPK];
    static int32_t next[DDT_MAX_NODES];
    double *t_build = malloc((size_t)reps * sizeof(double));
    double *t_walk = malloc((size_t)reps * sizeof(double));
    ddt_builder *b;
    ddt_tree tree;
    if (!t_build || !t_walk || ddt_builder_create(DDT_MAX_BUDGET, &b, NULL) ||
        ddt_tree_alloc(DDT_MAX_NODES, &tree, NULL)) {
        fprintf(stderr, "bench_tree: setup failed\n");
        return 1;
    }
    srand(1);
    printf("| budget B | K | nodes | build median (us) | walk median (us) | build+walk (us) |\n");
    printf("|---:|---:|---:|---:|---:|---:|\n");
    for (int32_t B = 16; B <= 1024; B *= 2) {
        int32_t K = B;
        for (int d = 0; d < D; d++) {
            float *row = logq + d * K;
            double lse = 0.0;
            for (int r = 0; r < K; r++) {
                row[r] = (r == 0 ? 3.0f : 0.0f) + 2.0f * (float)rand() / (float)RAND_MAX;
                lse += exp((double)row[r]);
            }
            for (int r = 0; r < K; r++) row[r] -= (float)log(lse);
            qsort(row, (size_t)K, sizeof(float), cmp_desc);
            for (int r = 0; r < K; r++) tok[d * K + r] = r * 7 + d;
        }
        ddt_draft_table tb = {D, K, logq, tok};
        for (int i = 0; i < reps; i++) {
            double t0 = now_us();
            if (ddt_tree_build(b, &tb, 1, B, NULL, 0, &tree, NULL)) return 1;
            double t1 = now_us();
            /* the target agrees with the first child at every node: the longest walk */
            for (int32_t n = 0; n < tree.n_nodes; n++)
                next[n] = tree.first_child[n] >= 0 ? tree.token[tree.first_child[n]] : 0;
            double t2 = now_us();
            ddt_walk_result w;
            if (ddt_tree_walk(&tree, next, 0, &w, NULL)) return 1;
            double t3 = now_us();
            t_build[i] = t1 - t0;
            t_walk[i] = t3 - t2;
        }
        qsort(t_build, (size_t)reps, sizeof(double), cmp_double);
        qsort(t_walk, (size_t)reps, sizeof(double), cmp_double);
        printf("| %d | %d | %d | %.2f | %.2f | %.2f |\n", B, K, tree.n_nodes, t_build[reps / 2],
               t_walk[reps / 2], t_build[reps / 2] + t_walk[reps / 2]);
    }
    ddt_tree_free(&tree);
    ddt_builder_destroy(b);
    free(t_build);
    free(t_walk);
    return 0;
}
