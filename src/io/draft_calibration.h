/*
 * draft_calibration.h — the draft calibration file (core/calibration.h is the
 * model), `draft_calibration.json` in a drafter's folder, written by `ddtree
 * calibrate` and read by the engines' callers (the CLI loads the drafter folder's
 * own by default).
 *
 *   {"format": "ddtree-draft-calibration", "version": 1, "temperature": 0,
 *    "weights": [[w0, w1, w2], ... 5 rank buckets: 0, 1, 2-3, 4-7, 8+],
 *    "lookup": {"first": [7 chances, match lengths 2..8], "next": chance},
 *    "fit": {...}}
 *
 * temperature: the sampling temperature the weights were fitted for; version 1
 * fits greedy decodes only, so it must be 0.  "lookup" (optional: without it the
 * engine grafts no lookup path) rates the context lookup (core/lookup.h), each
 * chance in (0, 1].  "fit" (what the fit saw) and any
 * other key are informational and ignored.  Every weight a finite number, each
 * bucket's w1 > 0 (ddt_cal_check); anything else is an error naming the file and
 * the field.
 */
#ifndef DDT_IO_DRAFT_CALIBRATION_H
#define DDT_IO_DRAFT_CALIBRATION_H

#include <stddef.h>

#include "core/calibration.h"
#include "ddtree.h"

#define DDT_CALIBRATION_FILE "draft_calibration.json"
#define DDT_CALIBRATION_FORMAT "ddtree-draft-calibration"

/* Parse the file's text; `where` names it in messages. */
ddt_status ddt_calibration_parse(const char *text, size_t len, const char *where, ddt_draft_calibration *c,
                                 ddt_error *err);
/* Read and parse `path`. */
ddt_status ddt_calibration_load(const char *path, ddt_draft_calibration *c, ddt_error *err);
/* Write c to `path` (replacing it), with a "fit" object of what the fit saw
 * (info may be NULL) and a free-text note (may be NULL). */
ddt_status ddt_calibration_save(const char *path, const ddt_draft_calibration *c, const ddt_cal_fit_info *info,
                                const char *note, ddt_error *err);

#endif
