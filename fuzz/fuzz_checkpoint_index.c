/*
 * fuzz_checkpoint_index.c — libFuzzer target for the shard index
 * (model.safetensors.index.json): the input becomes the index of a folder that
 * holds one small valid shard, and ddt_checkpoint_open must return a checkpoint
 * or an error with a message — never crash, read outside a file or leak.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"

static char g_dir[256];

/* A shard "a.safetensors" with one F32 tensor "w" of shape [2]. */
static int write_shard(void) {
    const char hdr[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    uint64_t n = sizeof hdr - 1;
    while (n % 8) n++; /* pad the header so the data is aligned */
    char path[300];
    snprintf(path, sizeof path, "%s/a.safetensors", g_dir);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(hdr, 1, sizeof hdr - 1, f);
    for (uint64_t i = sizeof hdr - 1; i < n; i++) fputc(' ', f);
    float v[2] = {1.0f, 2.0f};
    fwrite(v, sizeof v, 1, f);
    return fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/ddt_fuzz_index_%d", (int)getpid());
        char cmd[300];
        snprintf(cmd, sizeof cmd, "mkdir -p %s", g_dir);
        if (system(cmd) != 0 || write_shard() != 0) abort();
    }
    char path[300];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", g_dir);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    ddt_checkpoint *ck = NULL;
    ddt_error err;
    ddt_status st = ddt_checkpoint_open(g_dir, &ck, &err);
    if (st == DDT_OK) {
        const ddt_st_tensor *t = ddt_checkpoint_find(ck, "w");
        if (t && t->nbytes == 8 && ((const float *)t->data)[1] != 2.0f) __builtin_trap();
        ddt_checkpoint_close(ck);
    } else if (err.msg[0] == '\0') {
        __builtin_trap();
    }
    return 0;
}
