"""Time to first token of a growing conversation through `ddtree serve`, with the prefix cache (the
default) and with --no-prefix-cache, in one run on this machine: each turn re-sends the whole
conversation plus 100 new tokens and asks for one token, as a chat client does.  Prints one row per
turn: prompt tokens, cached tokens, request latency of both servers and their ratio.

    DDT_BUILD_DIR=build python3 bench/serve_prefix_cache.py [--turns 8] [--step 100]

Python drives the binary over HTTP and measures; nothing of it is on the inference path."""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "python"))
os.environ.setdefault("DDT_BUILD_DIR", os.path.abspath("build"))
from test_serve import Server, complete, generate_json  # noqa: E402


def run(extra, base, turns, step, reps):
    s = Server(*extra)
    try:
        rows = []
        for t in range(turns):
            conv = base[:step * (t + 1)]
            best = None
            for _ in range(reps):
                # the turn before, so the context holds the conversation up to here (before
                # the first turn an unrelated prompt)
                complete(s, base[:step * t] if t > 0 else [base[0] ^ 1], max_tokens=1)
                t0 = time.perf_counter()
                r = complete(s, conv, max_tokens=1)
                dt = time.perf_counter() - t0
                best = dt if best is None or dt < best else best
            rows.append((len(conv), r["usage"]["prompt_tokens_details"]["cached_tokens"], best))
        return rows
    finally:
        s.stop()
        s.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--step", type=int, default=100)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    base = generate_json("--prompt", "class Queue:\n    def __init__(self", "--max-tokens",
                         str(a.turns * a.step))["ids"]
    with_cache = run([], base, a.turns, a.step, a.reps)
    without = run(["--no-prefix-cache"], base, a.turns, a.step, a.reps)
    print("| prompt tokens | cached tokens | latency, prefix cache (ms) | latency, --no-prefix-cache (ms) | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for (n, c, t1), (_, _, t2) in zip(with_cache, without):
        print(f"| {n} | {c} | {t1 * 1e3:.1f} | {t2 * 1e3:.1f} | {t2 / t1:.2f} |")


if __name__ == "__main__":
    main()
