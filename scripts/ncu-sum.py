#!/usr/bin/env python3
"""ncu-sum.py — sums the per-kernel GPU times of `scripts/gpu-test.sh ncu-round` (Nsight Compute
CSV, one row per kernel launch with gpu__time_duration.sum, optionally gzipped) by kernel name, so
that two builds' rounds can be compared kernel by kernel without copying the raw CSV back.

    python3 scripts/ncu-sum.py FILE.csv[.gz]... [--top N]
    python3 scripts/ncu-sum.py --launches FILE.csv [BEFORE.csv]

Prints, per file, a table: kernel (template arguments cut), launches, total us, mean us, share.
--launches: every launch in order instead (kernel, grid, us: one layer's verify from
`gpu-test.sh ncu-layer`), with a second file's launch times beside it when given (a build
before a change; the rows pair by position, so the kernel names of both are printed).
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


def to_us(r):
    unit = r.get("Metric Unit", "ns")
    v = float(r["Metric Value"].replace(",", ""))
    return v / 1000.0 if unit in ("ns", "nsecond") else v * 1000.0 if unit in ("ms", "msecond") else v


def launches(path):
    """(kernel, grid, us) of every launch, in order."""
    return [(short_name(r["Kernel Name"]), r.get("Grid Size", ""), to_us(r)) for r in read_rows(path)
            if r.get("Metric Name") == "gpu__time_duration.sum"]


def list_launches(path, before=None):
    now = launches(path)
    old = launches(before) if before else []
    if before:
        print(f"## {path} against {before}: {len(now)} launches, {sum(u for _, _, u in now):.1f} us "
              f"(before: {len(old)}, {sum(u for _, _, u in old):.1f} us)")
        print("| # | kernel | grid | us | before: kernel | us |")
        print("|---:|---|---|---:|---|---:|")
    else:
        print(f"## {path}: {len(now)} launches, {sum(u for _, _, u in now):.1f} us")
        print("| # | kernel | grid | us |")
        print("|---:|---|---|---:|")
    for i in range(max(len(now), len(old))):
        k, g, u = now[i] if i < len(now) else ("", "", None)
        row = f"| {i} | {k} | {g} | {'' if u is None else f'{u:.1f}'} |"
        if before:
            ok, _, ou = old[i] if i < len(old) else ("", "", None)
            row += f" {ok} | {'' if ou is None else f'{ou:.1f}'} |"
        print(row)
    print()


def summarise(path, top):
    rows = read_rows(path)
    per = {}
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        us = to_us(r)
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
    listing = False
    it = iter(argv)
    for a in it:
        if a == "--top":
            top = int(next(it))
        elif a == "--launches":
            listing = True
        else:
            files.append(a)
    if not files or (listing and len(files) > 2):
        raise SystemExit(__doc__)
    if listing:
        list_launches(files[0], files[1] if len(files) > 1 else None)
        return
    for f in files:
        summarise(f, top)


if __name__ == "__main__":
    main(sys.argv[1:])
