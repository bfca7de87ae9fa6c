#!/usr/bin/env python3
"""Summarise the expert kernels' CTA timeline that bench/experts-timeline.patch records.

Each line of the file: kernel (0 gate/up, 1 down), CTA index, SM, then %globaltimer (ns) after the
CTA read its work item, when its weight stream was done, and at its end.  Prints, per kernel, when
the CTAs started and finished streaming relative to the first gate/up CTA, the spread of the stream
durations (CTAs with the same bytes), and the mean duration on SMs holding one CTA against two.
"""
import collections
import sys


def quantile(v, p):
    return v[min(len(v) - 1, int(p * len(v)))]


def summarise(path):
    rows = [list(map(int, line.split())) for line in open(path) if line.strip()]
    if not rows:
        raise SystemExit(f"{path}: no CTA lines")
    t0 = min(r[3] for r in rows)
    print(path)
    for k, name in ((0, "gate/up"), (1, "down")):
        ctas = [r for r in rows if r[0] == k]
        if not ctas:
            continue
        start = sorted((r[3] - t0) / 1e3 for r in ctas)
        done = sorted((r[4] - t0) / 1e3 for r in ctas)
        end = max((r[5] - t0) / 1e3 for r in ctas)
        dur = sorted((r[4] - r[3]) / 1e3 for r in ctas)
        per_sm = collections.Counter(r[2] for r in ctas)
        print(f"  {name}: {len(ctas)} CTAs on {len(per_sm)} SMs ({sum(c == 2 for c in per_sm.values())} with two)")
        print(f"    item read (us): first {start[0]:.1f}, last {start[-1]:.1f}")
        print(f"    stream done: first {done[0]:.1f}, p10 {quantile(done, .1):.1f}, p50 {quantile(done, .5):.1f}, "
              f"p90 {quantile(done, .9):.1f}, last {done[-1]:.1f}; last CTA ends {end:.1f}")
        print(f"    stream duration: min {dur[0]:.1f}, p50 {quantile(dur, .5):.1f}, max {dur[-1]:.1f}")
        for occ in (1, 2):
            d = [(r[4] - r[3]) / 1e3 for r in ctas if per_sm[r[2]] == occ]
            if d:
                print(f"    mean stream duration on SMs with {occ} CTA(s): {sum(d) / len(d):.1f}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: experts_timeline.py TIMELINE...")
    for p in sys.argv[1:]:
        summarise(p)
