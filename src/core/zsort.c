/*
 * zsort.c — non-allocating heapsorts (see zsort.h).
 */
#include "core/zsort.h"

/* x comes before y in the output */
static inline int zid_first(ddt_zid x, ddt_zid y) { return x.z > y.z || (x.z == y.z && x.id < y.id); }

/* max-heap on "comes later", so repeatedly moving the root to the end sorts ascending in "first" order */
static void zid_down(ddt_zid *a, int32_t n, int32_t i) {
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && zid_first(a[c], a[c + 1])) c++;
        if (!zid_first(a[i], a[c])) return;
        ddt_zid t = a[i];
        a[i] = a[c];
        a[c] = t;
        i = c;
    }
}

void ddt_zid_sort_desc(ddt_zid *a, int32_t n) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) zid_down(a, n, i);
    for (int32_t end = n - 1; end > 0; end--) {
        ddt_zid t = a[0];
        a[0] = a[end];
        a[end] = t;
        zid_down(a, end, 0);
    }
}

/* Sift-down of a heap whose root is the last kept in output order (the worst). */
static void worst_down(ddt_zid *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && zid_first(h[c], h[c + 1])) c++;
        if (!zid_first(h[i], h[c])) return;
        ddt_zid t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

void ddt_zid_top_k(const float *z, int32_t v, int32_t k, ddt_zid *out) {
    for (int32_t i = 0; i < k; i++) out[i] = (ddt_zid){z[i], i};
    for (int32_t i = k / 2 - 1; i >= 0; i--) worst_down(out, k, i);
    for (int32_t i = k; i < v; i++) {
        ddt_zid c = {z[i], i};
        if (zid_first(c, out[0])) {
            out[0] = c;
            worst_down(out, k, 0);
        }
    }
    ddt_zid_sort_desc(out, k);
}

static void i32_down(int32_t *a, int32_t n, int32_t i) {
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && a[c + 1] > a[c]) c++;
        if (a[i] >= a[c]) return;
        int32_t t = a[i];
        a[i] = a[c];
        a[c] = t;
        i = c;
    }
}

void ddt_i32_sort_asc(int32_t *a, int32_t n) {
    for (int32_t i = n / 2 - 1; i >= 0; i--) i32_down(a, n, i);
    for (int32_t end = n - 1; end > 0; end--) {
        int32_t t = a[0];
        a[0] = a[end];
        a[end] = t;
        i32_down(a, end, 0);
    }
}
