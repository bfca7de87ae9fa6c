"""test_ncu_sum.py — scripts/ncu-sum.py, which turns Nsight Compute's per-launch CSV (as
`scripts/gpu-test.sh ncu-round` / `ncu-layer` write it, the program's own output first) into
Markdown: per-kernel sums, and with --launches every launch in order, optionally beside a
second build's.  On synthetic CSVs: the program's output before the header is skipped, times
in ns and us convert, template arguments and parameter lists are cut, the rows pair by
position, and a bad invocation or a file without the header is an error."""

import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "ncu-sum.py")
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def row(i, name, grid, unit, value):
    return (f'"{i}","1","b","h","{name}","1","13","(256, 1, 1)","{grid}","0","9.0",'
            f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"')


def write(path, rows):
    path.write_text("profiled one MoE layer\n==PROF== Disconnected\n" + HEADER + "\n" + "\n".join(rows) + "\n")
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)


def test_launches_in_order_beside_a_second_build(tmp_path):
    now = write(tmp_path / "now.csv", [
        row(0, "void embed_kernel<512>(ddt_qweight, const int *)", "(1, 1, 1)", "ns", "11,400"),
        row(1, "void <unnamed>::wg_gemm_kernel<8>(CUtensorMap, WgArgs)", "(68, 1, 1)", "us", "14.7")])
    before = write(tmp_path / "before.csv", [
        row(0, "embed_kernel(ddt_qweight, const int *)", "(1, 1, 1)", "ns", "17,500"),
        row(1, "<unnamed>::wg_split_kernel(const float *)", "(7, 1, 1)", "ns", "2,800"),
        row(2, "void <unnamed>::wg_gemm_kernel<8>(CUtensorMap, WgArgs)", "(68, 1, 1)", "ns", "14,900")])
    r = run("--launches", now, before)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "2 launches, 26.1 us (before: 3, 35.2 us)" in lines[0], lines[0]
    assert lines[3] == "| 0 | embed_kernel<512> | (1, 1, 1) | 11.4 | embed_kernel | 17.5 |", lines[3]
    assert lines[4] == "| 1 | <unnamed>::wg_gemm_kernel<8> | (68, 1, 1) | 14.7 | <unnamed>::wg_split_kernel | 2.8 |"
    assert lines[5] == "| 2 |  |  |  | <unnamed>::wg_gemm_kernel<8> | 14.9 |", lines[5]
    r = run("--launches", now)
    assert r.returncode == 0 and "| 1 | <unnamed>::wg_gemm_kernel<8> | (68, 1, 1) | 14.7 |" in r.stdout, r.stdout


def test_sums_by_kernel(tmp_path):
    f = write(tmp_path / "r.csv", [row(0, "void k<1>(int)", "(1, 1, 1)", "ns", "1,000"),
                                   row(1, "void k<1>(int)", "(2, 1, 1)", "ns", "3,000"),
                                   row(2, "q(int)", "(1, 1, 1)", "us", "4")])
    r = run(f)
    assert r.returncode == 0, r.stderr
    assert "3 launches, 8.0 us of kernel time" in r.stdout
    assert "| k<1> | 2 | 4.0 | 2.00 | 50.0% |" in r.stdout, r.stdout


def test_errors(tmp_path):
    assert run().returncode != 0
    bad = tmp_path / "bad.csv"
    bad.write_text("no header here\n")
    r = run("--launches", str(bad))
    assert r.returncode != 0 and "no ncu CSV header" in (r.stdout + r.stderr)
    f = write(tmp_path / "r.csv", [row(0, "k(int)", "(1, 1, 1)", "ns", "1")])
    assert run("--launches", f, f, f).returncode != 0
