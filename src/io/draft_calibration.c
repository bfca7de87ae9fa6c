/*
 * draft_calibration.c — the draft calibration file's reader and writer (see
 * draft_calibration.h).
 */
#include "io/draft_calibration.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/file.h"

ddt_status ddt_calibration_parse(const char *text, size_t len, const char *where, ddt_draft_calibration *c,
                                 ddt_error *err) {
    if (!text || !c) return ddt_fail(err, DDT_ERR_INVALID, "ddt_calibration_parse: NULL argument");
    if (!where) where = DDT_CALIBRATION_FILE;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return ddt_fail(err, DDT_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", where, jerr.text, jerr.line);
    ddt_status st = DDT_OK;
    if (!json_is_object(root)) {
        st = ddt_fail(err, DDT_ERR_FORMAT, "%s: not a JSON object", where);
        goto out;
    }
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!fmt || strcmp(fmt, DDT_CALIBRATION_FORMAT) != 0) {
        st = ddt_fail(err, DDT_ERR_FORMAT, "%s: field format is not \"%s\"", where, DDT_CALIBRATION_FORMAT);
        goto out;
    }
    json_t *ver = json_object_get(root, "version");
    if (!json_is_integer(ver) || json_integer_value(ver) != 1) {
        st = ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s: field version must be the integer 1 (this build reads version 1)",
                      where);
        goto out;
    }
    json_t *temp = json_object_get(root, "temperature");
    if (!json_is_number(temp) || json_number_value(temp) != 0.0) {
        st = ddt_fail(err, DDT_ERR_UNSUPPORTED, "%s: field temperature must be 0 (version 1 calibrates greedy "
                      "decoding only)", where);
        goto out;
    }
    json_t *ws = json_object_get(root, "weights");
    if (!json_is_array(ws) || json_array_size(ws) != DDT_CAL_BUCKETS) {
        st = ddt_fail(err, DDT_ERR_FORMAT, "%s: field weights must be an array of %d rank buckets", where,
                      DDT_CAL_BUCKETS);
        goto out;
    }
    for (int b = 0; b < DDT_CAL_BUCKETS; b++) {
        json_t *row = json_array_get(ws, (size_t)b);
        if (!json_is_array(row) || json_array_size(row) != DDT_CAL_FEATURES) {
            st = ddt_fail(err, DDT_ERR_FORMAT, "%s: weights[%d] must be an array of %d numbers", where, b,
                          DDT_CAL_FEATURES);
            goto out;
        }
        for (int f = 0; f < DDT_CAL_FEATURES; f++) {
            json_t *v = json_array_get(row, (size_t)f);
            if (!json_is_number(v)) {
                st = ddt_fail(err, DDT_ERR_FORMAT, "%s: weights[%d][%d] is not a number", where, b, f);
                goto out;
            }
            const double x = json_number_value(v);
            if (!isfinite(x) || fabs(x) > 100.0) {
                st = ddt_fail(err, DDT_ERR_RANGE, "%s: weights[%d][%d] = %g is not within +-100", where, b, f, x);
                goto out;
            }
            c->w[b][f] = (float)x;
        }
    }
    c->lookup = 0;
    for (int m = 0; m < DDT_CAL_LOOKUP_LENS; m++) c->lookup_first[m] = 0.0f;
    c->lookup_next = 0.0f;
    json_t *lk = json_object_get(root, "lookup");
    if (lk && !json_is_null(lk)) {
        json_t *first = json_object_get(lk, "first"), *next = json_object_get(lk, "next");
        if (!json_is_object(lk) || !json_is_array(first) || json_array_size(first) != DDT_CAL_LOOKUP_LENS ||
            !json_is_number(next)) {
            st = ddt_fail(err, DDT_ERR_FORMAT, "%s: field lookup must be {\"first\": [%d numbers, one per match "
                          "length %d..%d], \"next\": a number}", where, DDT_CAL_LOOKUP_LENS, DDT_LOOKUP_MIN,
                          DDT_LOOKUP_MAX);
            goto out;
        }
        for (int m = 0; m < DDT_CAL_LOOKUP_LENS; m++) {
            json_t *v = json_array_get(first, (size_t)m);
            if (!json_is_number(v)) {
                st = ddt_fail(err, DDT_ERR_FORMAT, "%s: lookup.first[%d] is not a number", where, m);
                goto out;
            }
            c->lookup_first[m] = (float)json_number_value(v);
        }
        c->lookup_next = (float)json_number_value(next);
        c->lookup = 1;
    }
    if ((st = ddt_cal_check(c, err)) != DDT_OK) ddt_error_prefix(err, "%s: ", where);
out:
    json_decref(root);
    return st;
}

ddt_status ddt_calibration_load(const char *path, ddt_draft_calibration *c, ddt_error *err) {
    if (!path || !c) return ddt_fail(err, DDT_ERR_INVALID, "ddt_calibration_load: NULL argument");
    char *data = NULL;
    size_t len = 0;
    ddt_status st = ddt_read_file(path, (size_t)1 << 20, false, &data, &len, err);
    if (st) return st;
    st = ddt_calibration_parse(data, len, path, c, err);
    free(data);
    return st;
}

ddt_status ddt_calibration_save(const char *path, const ddt_draft_calibration *c, const ddt_cal_fit_info *info,
                                const char *note, ddt_error *err) {
    if (!path || !c) return ddt_fail(err, DDT_ERR_INVALID, "ddt_calibration_save: NULL argument");
    ddt_status st = ddt_cal_check(c, err);
    if (st) return st;
    json_t *root = json_object(), *ws = json_array();
    for (int b = 0; b < DDT_CAL_BUCKETS; b++) {
        json_t *row = json_array();
        for (int f = 0; f < DDT_CAL_FEATURES; f++) json_array_append_new(row, json_real((double)c->w[b][f]));
        json_array_append_new(ws, row);
    }
    json_object_set_new(root, "format", json_string(DDT_CALIBRATION_FORMAT));
    json_object_set_new(root, "version", json_integer(1));
    json_object_set_new(root, "temperature", json_integer(0));
    json_object_set_new(root, "rank_buckets", json_string("0, 1, 2-3, 4-7, 8+"));
    json_object_set_new(root, "model", json_string("p = sigmoid(w0 + w1 * logit(q) + w2 * min(depth - 1, 8) / 8)"));
    json_object_set_new(root, "weights", ws);
    if (c->lookup) {
        json_t *first = json_array();
        for (int m = 0; m < DDT_CAL_LOOKUP_LENS; m++) json_array_append_new(first, json_real((double)c->lookup_first[m]));
        json_object_set_new(root, "lookup", json_pack("{s:o, s:f, s:s}", "first", first, "next", (double)c->lookup_next,
                                                      "what", "chance the first token after a match of 2..8 tokens "
                                                      "is accepted; chance each next one is"));
    }
    if (info || note) {
        json_t *fit = json_object();
        if (note) json_object_set_new(fit, "note", json_string(note));
        if (info) {
            json_t *cells = json_array(), *hits = json_array(), *ll = json_array(), *lli = json_array(),
                   *idn = json_array();
            for (int b = 0; b < DDT_CAL_BUCKETS; b++) {
                json_array_append_new(cells, json_real(info->cells[b]));
                json_array_append_new(hits, json_real(info->hits[b]));
                json_array_append_new(ll, json_real(info->loglik[b]));
                json_array_append_new(lli, json_real(info->loglik_identity[b]));
                json_array_append_new(idn, json_boolean(info->identity[b]));
            }
            json_object_set_new(fit, "cells", cells);
            json_object_set_new(fit, "hits", hits);
            json_object_set_new(fit, "mean_loglik", ll);
            json_object_set_new(fit, "mean_loglik_uncalibrated", lli);
            json_object_set_new(fit, "identity", idn);
            json_object_set_new(fit, "lookup_proposals", json_real(info->lookup_proposals));
            json_object_set_new(fit, "lookup_tokens", json_real(info->lookup_tokens));
        }
        json_object_set_new(root, "fit", fit);
    }
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(root);
    if (!text) return ddt_fail(err, DDT_ERR_NOMEM, "%s: out of memory writing the calibration", path);
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(text);
        return ddt_fail(err, DDT_ERR_IO, "%s: cannot open for writing", path);
    }
    const size_t n = strlen(text);
    const bool ok = fwrite(text, 1, n, f) == n && fputc('\n', f) != EOF;
    free(text);
    if (fclose(f) != 0 || !ok) return ddt_fail(err, DDT_ERR_IO, "%s: write failed", path);
    return DDT_OK;
}
