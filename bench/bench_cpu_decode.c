/*
 * bench_cpu_decode.c — autoregressive decode speed of the CPU target, and its
 * memory: resident set (VmRSS, split into file-backed RssFile and anonymous
 * RssAnon from /proc/self/status) against the checkpoint's weight bytes, to show
 * that weights are mapped from the file, not copied (they appear in RssFile;
 * RssAnon grows only by the run state).  The roofline ratio is the weight bytes
 * a decode step reads per second against this machine's measured memcpy read
 * bandwidth.
 *
 * usage: bench_cpu_decode [--model DIR | --synthetic] [--tokens N] [--prompt N] [--threads N]
 *   --model DIR    a model folder (default tests/fixtures/target/kimi, relative to the cwd)
 *   --synthetic    write a ~130M-parameter random BF16 DeepSeek-V3-style model to a temporary
 *                  folder and measure that (the fixtures are too small for memory figures)
 * Prints a table line for BENCHMARKS.md last.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/target.h"

/* ------------------------------------------------------------------ helpers */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct rss {
    long vm_kb, anon_kb, file_kb;
} rss;

static rss read_rss(void) {
    rss r = {-1, -1, -1};
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return r;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmRSS:", 6)) r.vm_kb = strtol(line + 6, NULL, 10);
        else if (!strncmp(line, "RssAnon:", 8)) r.anon_kb = strtol(line + 8, NULL, 10);
        else if (!strncmp(line, "RssFile:", 8)) r.file_kb = strtol(line + 8, NULL, 10);
    }
    fclose(f);
    return r;
}

/* Bytes read per second by memcpy over a buffer far larger than the caches. */
static double memcpy_read_gbs(void) {
    size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        double t0 = now_s();
        memcpy(b, a, n);
        double dt = now_s() - t0;
        if (dt < best) best = dt;
        a[r] = b[n - 1 - r]; /* keep the copies observable */
    }
    free(a);
    free(b);
    return (double)n / best / 1e9;
}

/* ------------------------------------------------------------------ synthetic model */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float rnd_unit(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) / 16777216.0 * 2.0 - 1.0);
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

typedef struct syn_tensor {
    char name[128];
    int64_t rows, cols; /* cols 0 = 1-D */
    int kind;           /* 0 linear (bf16, random), 1 norm (bf16 ones), 2 bias (f32 small) */
} syn_tensor;

enum { SYN_H = 1024, SYN_L = 4, SYN_HEADS = 8, SYN_QL = 384, SYN_KVL = 256, SYN_NOPE = 64, SYN_ROPE = 32,
       SYN_V = 64, SYN_E = 16, SYN_K = 4, SYN_MI = 512, SYN_I = 2816, SYN_VOCAB = 16384 };

static int syn_add(syn_tensor *t, int n, const char *name, int64_t rows, int64_t cols, int kind) {
    snprintf(t[n].name, sizeof t[n].name, "%s", name);
    t[n].rows = rows;
    t[n].cols = cols;
    t[n].kind = kind;
    return n + 1;
}

/* Write config.json and model.safetensors of the synthetic model into dir. */
static int write_synthetic(const char *dir) {
    static syn_tensor ts[1024];
    int n = 0;
    char nm[128];
    n = syn_add(ts, n, "model.embed_tokens.weight", SYN_VOCAB, SYN_H, 0);
    n = syn_add(ts, n, "model.norm.weight", SYN_H, 0, 1);
    n = syn_add(ts, n, "lm_head.weight", SYN_VOCAB, SYN_H, 0);
    for (int l = 0; l < SYN_L; l++) {
#define ADD(suffix, r, c, k) (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix), n = syn_add(ts, n, nm, r, c, k))
        ADD("input_layernorm.weight", SYN_H, 0, 1);
        ADD("post_attention_layernorm.weight", SYN_H, 0, 1);
        ADD("self_attn.q_a_proj.weight", SYN_QL, SYN_H, 0);
        ADD("self_attn.q_a_layernorm.weight", SYN_QL, 0, 1);
        ADD("self_attn.q_b_proj.weight", SYN_HEADS * (SYN_NOPE + SYN_ROPE), SYN_QL, 0);
        ADD("self_attn.kv_a_proj_with_mqa.weight", SYN_KVL + SYN_ROPE, SYN_H, 0);
        ADD("self_attn.kv_a_layernorm.weight", SYN_KVL, 0, 1);
        ADD("self_attn.kv_b_proj.weight", SYN_HEADS * (SYN_NOPE + SYN_V), SYN_KVL, 0);
        ADD("self_attn.o_proj.weight", SYN_H, SYN_HEADS * SYN_V, 0);
        if (l == 0) {
            ADD("mlp.gate_proj.weight", SYN_I, SYN_H, 0);
            ADD("mlp.up_proj.weight", SYN_I, SYN_H, 0);
            ADD("mlp.down_proj.weight", SYN_H, SYN_I, 0);
        } else {
            ADD("mlp.gate.weight", SYN_E, SYN_H, 0);
            ADD("mlp.gate.e_score_correction_bias", SYN_E, 0, 2);
            for (int e = 0; e < SYN_E; e++) {
                char sfx[96];
                snprintf(sfx, sizeof sfx, "mlp.experts.%d.gate_proj.weight", e);
                ADD(sfx, SYN_MI, SYN_H, 0);
                snprintf(sfx, sizeof sfx, "mlp.experts.%d.up_proj.weight", e);
                ADD(sfx, SYN_MI, SYN_H, 0);
                snprintf(sfx, sizeof sfx, "mlp.experts.%d.down_proj.weight", e);
                ADD(sfx, SYN_H, SYN_MI, 0);
            }
            ADD("mlp.shared_experts.gate_proj.weight", SYN_MI, SYN_H, 0);
            ADD("mlp.shared_experts.up_proj.weight", SYN_MI, SYN_H, 0);
            ADD("mlp.shared_experts.down_proj.weight", SYN_H, SYN_MI, 0);
        }
#undef ADD
    }
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f,
            "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", "
            "\"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, \"moe_intermediate_size\": %d, "
            "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, "
            "\"n_shared_experts\": 1, \"n_routed_experts\": %d, \"num_experts_per_tok\": %d, "
            "\"routed_scaling_factor\": 2.5, \"kv_lora_rank\": %d, \"q_lora_rank\": %d, \"qk_rope_head_dim\": %d, "
            "\"qk_nope_head_dim\": %d, \"v_head_dim\": %d, \"topk_method\": \"noaux_tc\", \"scoring_func\": \"sigmoid\", "
            "\"n_group\": 1, \"topk_group\": 1, \"norm_topk_prob\": true, \"moe_layer_freq\": 1, "
            "\"first_k_dense_replace\": 1, \"hidden_act\": \"silu\", \"max_position_embeddings\": 4096, "
            "\"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"rope_scaling\": null, \"rope_interleave\": true, "
            "\"attention_bias\": false, \"bos_token_id\": 0, \"eos_token_id\": 1, \"tie_word_embeddings\": false, "
            "\"torch_dtype\": \"bfloat16\"}\n",
            SYN_VOCAB, SYN_H, SYN_I, SYN_MI, SYN_L, SYN_HEADS, SYN_HEADS, SYN_E, SYN_K, SYN_KVL, SYN_QL, SYN_ROPE,
            SYN_NOPE, SYN_V);
    fclose(f);

    /* header */
    size_t cap = 1 << 20, len = 0;
    char *hdr = malloc(cap);
    if (!hdr) return -1;
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t numel = (uint64_t)ts[i].rows * (uint64_t)(ts[i].cols ? ts[i].cols : 1);
        uint64_t bytes = numel * (ts[i].kind == 2 ? 4u : 2u);
        if (ts[i].cols)
            len += (size_t)snprintf(hdr + len, cap - len,
                                    "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld,%lld],\"data_offsets\":[%llu,%llu]}",
                                    i ? "," : "", ts[i].name, (long long)ts[i].rows, (long long)ts[i].cols,
                                    (unsigned long long)off, (unsigned long long)(off + bytes));
        else
            len += (size_t)snprintf(hdr + len, cap - len,
                                    "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],\"data_offsets\":[%llu,%llu]}",
                                    i ? "," : "", ts[i].name, ts[i].kind == 2 ? "F32" : "BF16", (long long)ts[i].rows,
                                    (unsigned long long)off, (unsigned long long)(off + bytes));
        off += bytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return -1;
    }
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)len >> (8 * i));
    fwrite(lenb, 1, 8, f);
    fwrite(hdr, 1, len, f);
    free(hdr);
    uint16_t *buf = malloc(sizeof(uint16_t) * (size_t)SYN_VOCAB * SYN_H);
    for (int i = 0; i < n && buf; i++) {
        size_t numel = (size_t)ts[i].rows * (size_t)(ts[i].cols ? ts[i].cols : 1);
        if (ts[i].kind == 2) {
            float *fb = (float *)buf;
            for (size_t j = 0; j < numel; j++) fb[j] = 0.05f * rnd_unit();
            fwrite(fb, 4, numel, f);
            continue;
        }
        /* uniform with variance 1/cols keeps activations O(1) */
        float a = ts[i].kind == 1 ? 0.0f : sqrtf(3.0f / (float)ts[i].cols);
        for (size_t j = 0; j < numel; j++) buf[j] = to_bf16(ts[i].kind == 1 ? 1.0f : a * rnd_unit());
        fwrite(buf, 2, numel, f);
    }
    free(buf);
    return fclose(f) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    const char *model = "tests/fixtures/target/kimi";
    bool synthetic = false;
    int tokens = 64, prompt = 16, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--synthetic")) synthetic = true;
        else if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_cpu_decode [--model DIR | --synthetic] [--tokens N] [--prompt N] [--threads N]\n");
            return 2;
        }
    }
    if (tokens < 1 || prompt < 1) {
        fprintf(stderr, "bench_cpu_decode: --tokens and --prompt must be >= 1\n");
        return 2;
    }
    char tmpdir[] = "/tmp/ddt_bench_model_XXXXXX";
    if (synthetic) {
        if (!mkdtemp(tmpdir)) {
            perror("mkdtemp");
            return 1;
        }
        double t0 = now_s();
        if (write_synthetic(tmpdir) != 0) {
            fprintf(stderr, "bench_cpu_decode: cannot write the synthetic model to %s\n", tmpdir);
            return 1;
        }
        fprintf(stderr, "wrote synthetic model to %s in %.1f s\n", tmpdir, now_s() - t0);
        model = tmpdir;
    }
    rss r0 = read_rss();
    ddt_target_options o = {.max_ctx = prompt + tokens, .max_tokens = prompt, .n_threads = threads};
    ddt_target *t = NULL;
    ddt_error err = {0};
    double tl = now_s();
    if (ddt_target_load(model, &o, &t, &err) != DDT_OK) {
        fprintf(stderr, "bench_cpu_decode: %s\n", err.msg);
        return 1;
    }
    tl = now_s() - tl;
    rss r1 = read_rss();
    const int32_t V = ddt_target_vocab(t);
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)prompt);
    for (int i = 0; i < prompt; i++) ids[i] = (int32_t)((uint32_t)(i * 2654435761u) % (uint32_t)V);
    double tp = now_s();
    if (ddt_target_prefill(t, ids, prompt, logits, false, &err) != DDT_OK) {
        fprintf(stderr, "bench_cpu_decode: prefill: %s\n", err.msg);
        return 1;
    }
    tp = now_s() - tp;
    double td = now_s();
    for (int s = 0; s < tokens; s++) {
        int32_t best = 0;
        for (int32_t v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        if (ddt_target_prefill(t, &best, 1, logits, false, &err) != DDT_OK) {
            fprintf(stderr, "bench_cpu_decode: decode: %s\n", err.msg);
            return 1;
        }
    }
    td = now_s() - td;
    rss r2 = read_rss();
    double tps = tokens / td;
    double wmb = ddt_target_weight_bytes(t) / 1e6, smb = ddt_target_state_bytes(t) / 1e6;
    double dgbs = ddt_target_decode_bytes(t) * tps / 1e9;
    double peak = memcpy_read_gbs();
    int nthreads = ddt_target_threads(t);
    printf("model            %s%s\n", synthetic ? "synthetic " : "", model);
    printf("threads          %d\n", nthreads);
    printf("load             %.3f s\n", tl);
    printf("prefill          %d tokens in %.3f s (%.1f tokens/s)\n", prompt, tp, prompt / tp);
    printf("decode           %d tokens in %.3f s: %.2f tokens/s\n", tokens, td, tps);
    printf("weights          %.1f MB in the checkpoint, %.1f MB read per decoded token\n", wmb,
           ddt_target_decode_bytes(t) / 1e6);
    printf("run state        %.1f MB allocated (activations + latent cache)\n", smb);
    printf("VmRSS            %.1f -> %.1f -> %.1f MB (before load, after load, after decode)\n", r0.vm_kb / 1e3,
           r1.vm_kb / 1e3, r2.vm_kb / 1e3);
    printf("RssFile (mapped) %.1f -> %.1f -> %.1f MB\n", r0.file_kb / 1e3, r1.file_kb / 1e3, r2.file_kb / 1e3);
    /* anonymous growth beyond the run state is what a copy of the weights would show up as */
    double extra = (r2.anon_kb - r0.anon_kb) / 1e3 - smb;
    const char *verdict = wmb < 16.0 ? "weights too small to tell; try --synthetic"
                          : extra < 0.1 * wmb ? "weights are mapped, not copied"
                                              : "WEIGHTS APPEAR COPIED";
    printf("RssAnon (owned)  %.1f -> %.1f -> %.1f MB: grew %.1f MB (run state %.1f MB) for %.1f MB of weights: %s\n",
           r0.anon_kb / 1e3, r1.anon_kb / 1e3, r2.anon_kb / 1e3, (r2.anon_kb - r0.anon_kb) / 1e3, smb, wmb, verdict);
    printf("bandwidth        %.2f GB/s of weights read vs memcpy %.2f GB/s: %.0f%% of roofline\n", dgbs, peak,
           peak > 0 ? 100.0 * dgbs / peak : 0.0);
    printf("| cpu AR decode | %s | %d threads | %.2f tokens/s | %.1f MB weights, %.1f MB/token | RssAnon +%.1f MB, "
           "RssFile +%.1f MB | %.0f%% of memcpy bandwidth |\n",
           synthetic ? "synthetic 130M bf16" : model, nthreads, tps, wmb, ddt_target_decode_bytes(t) / 1e6,
           (r2.anon_kb - r0.anon_kb) / 1e3, (r2.file_kb - r0.file_kb) / 1e3, peak > 0 ? 100.0 * dgbs / peak : 0.0);
    free(logits);
    free(ids);
    ddt_target_free(t);
    if (synthetic) {
        char p[1100];
        snprintf(p, sizeof p, "%s/model.safetensors", tmpdir);
        unlink(p);
        snprintf(p, sizeof p, "%s/config.json", tmpdir);
        unlink(p);
        rmdir(tmpdir);
    }
    return 0;
}
