"""bench/experts_timeline.py: the expert CTAs' timeline (bench/experts-timeline.patch's file) summarised
per kernel, times relative to the first gate/up CTA, SMs with one CTA told from SMs with two; an empty
file or no argument is refused with a message."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "bench", "experts_timeline.py")


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=60)


def test_summary(tmp_path):
    t0 = 5_000_000_000
    lines = [
        # kernel, CTA, SM, item read, stream done, end (ns)
        f"0 0 7 {t0} {t0 + 40_000} {t0 + 42_000}",
        f"0 1 7 {t0 + 200} {t0 + 44_200} {t0 + 45_000}",
        f"0 2 9 {t0 + 400} {t0 + 42_400} {t0 + 43_000}",
        f"1 0 7 {t0 + 50_000} {t0 + 70_000} {t0 + 71_500}",
    ]
    f = tmp_path / "tl.txt"
    f.write_text("\n".join(lines) + "\n")
    r = run(str(f))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "gate/up: 3 CTAs on 2 SMs (1 with two)" in out
    assert "item read (us): first 0.0, last 0.4" in out
    assert "last 44.2; last CTA ends 45.0" in out
    assert "stream duration: min 40.0, p50 42.0, max 44.0" in out
    assert "mean stream duration on SMs with 1 CTA(s): 42.0" in out
    assert "mean stream duration on SMs with 2 CTA(s): 42.0" in out
    assert "down: 1 CTAs on 1 SMs (0 with two)" in out
    assert "item read (us): first 50.0, last 50.0" in out


def test_refusals(tmp_path):
    r = run()
    assert r.returncode != 0 and "usage" in r.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    r = run(str(empty))
    assert r.returncode != 0 and "no CTA lines" in r.stderr
