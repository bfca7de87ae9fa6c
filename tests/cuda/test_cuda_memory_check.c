/*
 * test_cuda_memory_check.c — the CUDA target's check before its upload
 * (target_cuda.c check_memory, model/shard.h ddt_shard_memory_check):
 *   - the lower bound holds: on every fixture format, with and without the tensor
 *     cores, the weight bytes the target counts once uploaded are at least the
 *     rank's stored bytes (ddt_shard_weight_bytes), and its state at least the KV
 *     cache (ddt_shard_kv_bytes; fp32, and bf16 with the fast attention where the
 *     fixture allows it);
 *   - the same for the shipped DFlash drafter (ddt_drafter_desc_weight_bytes and
 *     _cache_bytes, which the engine passes as the check's also_bytes);
 *   - a context no GPU holds (2^30 positions) fails the load with DDT_ERR_NOMEM
 *     at once, with the figures and the --ctx advice in the message, and leaves
 *     the GPU's free memory as it was (nothing allocated, nothing leaked).
 * --quick: the same (it is small; for compute-sanitizer).  Run from the repository root.
 */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cuda_test.h"
#include "model/drafter_cuda.h"
#include "model/drafter_desc.h"
#include "model/shard.h"
#include "model/target_cuda.h"
#include "model/target_desc.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void check_bound(const char *dir, bool tensor_cores, bool fast) {
    ddt_target_desc d;
    ddt_error err;
    OK(ddt_target_desc_load(dir, NULL, 0, &d, &err));
    ddt_shard_bytes b;
    ddt_shard_weight_bytes(&d, NULL, &b);
    const int32_t ctx = 256;
    const uint64_t kv = ddt_shard_kv_bytes(&d.dims, ctx, fast ? 2 : 4);
    ddt_cuda_target_options o = {.max_ctx = ctx, .max_tokens = 17, .tensor_cores = tensor_cores, .fast_attention = fast};
    ddt_cuda_target *t = NULL;
    ddt_status st = ddt_cuda_target_load(dir, &o, &t, &err);
    CHECK(st == DDT_OK, "%s: load: %s", dir, err.msg);
    if (st == DDT_OK) {
        const uint64_t w = ddt_cuda_target_weight_bytes(t), s = ddt_cuda_target_state_bytes(t);
        CHECK(w >= b.total, "%s tc %d: uploaded weights %llu bytes < stored %llu", dir, tensor_cores,
              (unsigned long long)w, (unsigned long long)b.total);
        CHECK(s >= kv, "%s: state %llu bytes < KV cache %llu", dir, (unsigned long long)s, (unsigned long long)kv);
        printf("%-36s tc %d fast %d: stored %9llu <= uploaded %9llu; KV %8llu <= state %9llu\n", dir, tensor_cores,
               fast, (unsigned long long)b.total, (unsigned long long)w, (unsigned long long)kv,
               (unsigned long long)s);
        ddt_cuda_target_free(t);
    }
    ddt_target_desc_free(&d);
}

static void check_drafter(void) {
    const char *tdir = "models/pystdlib-target", *ddir = "models/pystdlib-dflash";
    const int32_t ctx = 300;
    ddt_target_desc td;
    ddt_drafter_desc dd;
    ddt_error err;
    OK(ddt_target_desc_load(tdir, NULL, 0, &td, &err));
    const ddt_drafter_target ht = {td.dims.hidden, td.dims.n_layers, td.dims.vocab, &td.embed, &td.lm_head};
    OK(ddt_drafter_desc_load(ddir, &ht, &dd, &err));
    const uint64_t w = ddt_drafter_desc_weight_bytes(&dd), c = ddt_drafter_desc_cache_bytes(&dd, ctx);
    ddt_cuda_target_options o = {.max_ctx = ctx, .max_tokens = 17};
    ddt_cuda_target *t = NULL;
    OK(ddt_cuda_target_load(tdir, &o, &t, &err));
    const ddt_model_config *tc = ddt_cuda_target_config(t);
    ddt_cuda_drafter_target dt = {tc->hidden_size, tc->num_hidden_layers, ddt_cuda_target_vocab(t),
                                  ddt_cuda_target_embed(t), ddt_cuda_target_lm_head(t),
                                  o.tensor_cores ? DDT_CUDA_MM_TENSOR : DDT_CUDA_MM_FP32, 0};
    ddt_cuda_drafter *d = NULL;
    OK(ddt_cuda_drafter_load(ddir, &dt, ctx, &d, &err));
    const uint64_t dw = ddt_cuda_drafter_weight_bytes(d), ds = ddt_cuda_drafter_state_bytes(d);
    CHECK(dw >= w, "drafter: uploaded weights %llu < stored %llu", (unsigned long long)dw, (unsigned long long)w);
    CHECK(ds >= c, "drafter: state %llu < cache %llu", (unsigned long long)ds, (unsigned long long)c);
    printf("drafter: stored %llu <= uploaded %llu; cache %llu <= state %llu\n", (unsigned long long)w,
           (unsigned long long)dw, (unsigned long long)c, (unsigned long long)ds);
    ddt_cuda_drafter_free(d);
    ddt_cuda_target_free(t);
    ddt_drafter_desc_free(&dd);
    ddt_target_desc_free(&td);
}

static void check_refusal(const char *dir) {
    CU(cudaDeviceSynchronize());
    size_t free0 = 0, free1 = 0, total = 0;
    CU(cudaMemGetInfo(&free0, &total));
    ddt_cuda_target_options o = {.max_ctx = 1 << 30, .max_tokens = 17};
    ddt_cuda_target *t = NULL;
    ddt_error err = {0};
    const double t0 = now_s();
    const ddt_status st = ddt_cuda_target_load(dir, &o, &t, &err);
    const double secs = now_s() - t0;
    CHECK(st == DDT_ERR_NOMEM && t == NULL, "%s: a 2^30-position cache loaded (status %d)", dir, (int)st);
    CHECK(strstr(err.msg, "KV cache") && strstr(err.msg, "1073741824 positions") && strstr(err.msg, "--ctx"),
          "%s: message: %s", dir, err.msg);
    CHECK(secs < 10.0, "%s: the refusal took %.1f s", dir, secs);
    CU(cudaMemGetInfo(&free1, &total));
    CHECK(free1 == free0, "%s: free memory %zu -> %zu across the refused load", dir, free0, free1);
    printf("%s: refused in %.3f s: %s\n", dir, secs, err.msg);
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    static const char *const dirs[] = {"models/pystdlib-target", "tests/fixtures/target/fp32", "tests/fixtures/target/bf16",
                                       "tests/fixtures/target/fp8", "tests/fixtures/target/int4",
                                       "tests/fixtures/target/kimi", "tests/fixtures/target/dense3",
                                       "tests/fixtures/fused/fp8_fused"};
    /* paths from the repository root, where scripts/gpu-test.sh runs the tests */
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        check_bound(dirs[i], false, false);
        check_bound(dirs[i], true, false);
    }
    check_drafter();
    check_refusal("models/pystdlib-target");
    check_refusal("tests/fixtures/target/int4");
    return ct_report("test_cuda_memory_check");
}
