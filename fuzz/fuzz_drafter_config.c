/*
 * fuzz_drafter_config.c — libFuzzer target for the DFlash drafter's config.json
 * parser: arbitrary bytes must give DDT_OK or an error with a message, never a
 * crash, overrun or leak.
 */
#include <stddef.h>
#include <stdint.h>

#include "io/drafter_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ddt_drafter_config cfg;
    ddt_error err;
    ddt_status st = ddt_drafter_config_parse((const char *)data, size, "fuzz.json", &cfg, &err);
    if (st != DDT_OK && err.msg[0] == '\0') __builtin_trap(); /* every error names its cause */
    return 0;
}
