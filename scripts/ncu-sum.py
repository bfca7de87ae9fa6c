#!/usr/bin/env python3
"""ncu-sum.py — sums the per-kernel GPU times of `scripts/gpu-test.sh ncu-round` (Nsight Compute
CSV, one row per kernel launch with gpu__time_duration.sum, optionally gzipped) by kernel name, so
that two builds' rounds can be compared kernel by kernel without copying the raw CSV back.

    python3 scripts/ncu-sum.py FILE.csv[.gz]... [--top N]

Prints, per file, a table: kernel (template arguments cut), launches, total us, mean us, share.
"""
import csv
import gzip
import io
import re
import sys


def read_rows(path):
    raw = gzip.open(path, "rt", errors="replace") if path.endswith(".gz") else open(path, errors="replace")
    with raw:
        lines = raw.read().splitlines()
    # ncu prints the program's own output before the CSV: start at the header row
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        raise SystemExit(f"{path}: no ncu CSV header (\"ID\",...) found")
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def short_name(name):
    # "void foo_kernel<float, 4>(args...)" -> "foo_kernel<float, 4>"
    name = re.sub(r"^void ", "", name)
    depth, out = 0, []
    for ch in name:
        if ch == "(" and depth == 0:
            break
        depth += ch == "<"
        depth -= ch == ">"
        out.append(ch)
    return "".join(out)[:90]


def summarise(path, top):
    rows = read_rows(path)
    per = {}
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "ns")
        v = float(r["Metric Value"].replace(",", ""))
        us = v / 1000.0 if unit == "ns" else v * 1000.0 if unit == "ms" else v
        k = short_name(r["Kernel Name"])
        n, t = per.get(k, (0, 0.0))
        per[k] = (n + 1, t + us)
    total = sum(t for _, t in per.values())
    launches = sum(n for n, _ in per.values())
    print(f"## {path}: {launches} launches, {total:.1f} us of kernel time")
    print("| kernel | launches | total us | mean us | share |")
    print("|---|---:|---:|---:|---:|")
    for k, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"| {k} | {n} | {t:.1f} | {t / n:.2f} | {100 * t / total:.1f}% |")
    print()


def main(argv):
    top = 40
    files = []
    it = iter(argv)
    for a in it:
        if a == "--top":
            top = int(next(it))
        else:
            files.append(a)
    if not files:
        raise SystemExit(__doc__)
    for f in files:
        summarise(f, top)


if __name__ == "__main__":
    main(sys.argv[1:])
