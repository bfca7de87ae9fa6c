"""bench/e2e.py --replot: the plot of a saved end-to-end table (the --out-md file) redrawn without
rerunning the benchmark; a table with no tree rows, or no --out-png, is refused with a message."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
E2E = os.path.join(ROOT, "bench", "e2e.py")

TABLE = """5 held-out prompts, 128 new tokens each; tokens/s counts decode (prompt pass excluded).

| T | mode | budget | tokens/s | speed-up vs ar | mean acceptance | lookup nodes per round | kernels per round | draft s | build s | verify s | walk s | commit s |
|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
| 0 | ar | - | 4012.4 | 1.00 | 1.00 | 0.00 | 80 | 0.000 | 0.000 | 0.152 | 0.000 | 0.000 |
| 0 | chain | - | 5648.5 | 1.41 | 2.77 | 0.00 | 128 | 0.031 | 0.005 | 0.068 | 0.001 | 0.004 |
| 0 | tree | 16 | 7715.7 | 1.92 | 3.88 | 3.00 | 129 | 0.023 | 0.004 | 0.049 | 0.001 | 0.003 |
| 0 | tree | 20 | 7930.6 | 1.98 | 4.06 | 3.01 | 129 | 0.022 | 0.004 | 0.048 | 0.001 | 0.003 |
| 0 | tree | auto | 7653.4 | 1.91 | 3.93 | 2.82 | 129 | 0.023 | 0.005 | 0.049 | 0.001 | 0.003 |
| 1 | ar | - | 3763.2 | 1.00 | 1.00 | 0.00 | 80 | 0.000 | 0.000 | 0.158 | 0.000 | 0.000 |
| 1 | chain | - | 2848.3 | 0.76 | 1.42 | 0.00 | 128 | 0.058 | 0.009 | 0.132 | 0.007 | 0.008 |
| 1 | tree | 16 | 3554.3 | 0.94 | 1.76 | 0.00 | 128 | 0.047 | 0.005 | 0.106 | 0.006 | 0.007 |
| 1 | tree | auto | 3648.2 | 0.97 | 1.72 | 0.00 | 128 | 0.040 | 0.007 | 0.108 | 0.006 | 0.006 |
"""


def e2e(*args):
    return subprocess.run([sys.executable, E2E, *args], capture_output=True, text=True, timeout=300)


def test_replot_draws_the_saved_table(tmp_path):
    md, png = tmp_path / "e2e.md", tmp_path / "e2e.png"
    md.write_text(TABLE)
    r = e2e("--replot", str(md), "--out-png", str(png))
    assert r.returncode == 0, r.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10000


def test_replot_refuses_a_table_without_tree_rows(tmp_path):
    md, png = tmp_path / "e2e.md", tmp_path / "e2e.png"
    md.write_text("\n".join(l for l in TABLE.splitlines() if "| tree |" not in l))
    r = e2e("--replot", str(md), "--out-png", str(png))
    assert r.returncode != 0 and "no tree rows" in r.stderr and str(md) in r.stderr
    assert not png.exists()
    r = e2e("--replot", str(md))
    assert r.returncode != 0 and "--replot needs --out-png" in r.stderr
