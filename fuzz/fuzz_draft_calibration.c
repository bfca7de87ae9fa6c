/*
 * fuzz_draft_calibration.c — libFuzzer target for the draft calibration file
 * (io/draft_calibration.h): arbitrary bytes must give DDT_OK with weights that
 * pass ddt_cal_check, or an error with a message, never a crash, overrun or leak.
 * A parsed calibration is also applied to a small table: rows must come out
 * sorted and free of NaN.
 */
#include <stddef.h>
#include <stdint.h>

#include "core/calibration.h"
#include "io/draft_calibration.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ddt_draft_calibration c;
    ddt_error err;
    ddt_status st = ddt_calibration_parse((const char *)data, size, "fuzz.json", &c, &err);
    if (st != DDT_OK) {
        if (err.msg[0] == '\0') __builtin_trap(); /* every error names its cause */
        return 0;
    }
    if (ddt_cal_check(&c, &err) != DDT_OK) __builtin_trap();
    float t[2][12];
    for (int d = 0; d < 2; d++)
        for (int r = 0; r < 12; r++) t[d][r] = r == 11 ? -1.0f / 0.0f : -0.01f - 1.5f * (float)r;
    ddt_cal_apply(&c, &t[0][0], 2, 12, 12);
    for (int d = 0; d < 2; d++)
        for (int r = 0; r < 12; r++)
            if (t[d][r] != t[d][r] || t[d][r] > 0.0f || (r > 0 && t[d][r] > t[d][r - 1])) __builtin_trap();
    return 0;
}
