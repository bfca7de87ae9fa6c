/*
 * test_files.h — file helpers the model tests share when they build damaged or
 * re-laid-out checkpoint folders: whole-file read and write (failing the cmocka
 * test on error) and the removal of a folder holding model.safetensors and
 * config.json.  Include after <cmocka.h>.
 */
#ifndef DDT_TESTS_MODEL_TEST_FILES_H
#define DDT_TESTS_MODEL_TEST_FILES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The whole file, NUL-terminated one byte past *len (so a JSON file reads as text). */
static inline uint8_t *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) fail_msg("cannot read %s", path);
    fclose(f);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

static inline void write_all(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len) fail_msg("cannot write %s", path);
    fclose(f);
}

/* dir/model.safetensors, dir/config.json, then dir itself */
static inline void remove_checkpoint_dir(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

#endif
