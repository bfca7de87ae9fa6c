"""test_gpu_record.py — scripts/gpu-record.sh, the one device call that records the open issues'
numbers: it parses (bash -n); without $OUT (the device tool's result folder) it is a usage error,
exit 2, naming the variable; with REQUIRE naming a card that nvidia-smi does not report (a fake
nvidia-smi on PATH reporting an H100) it runs nothing, exits 0, and writes only the card log, which
says so."""

import os
import stat
import subprocess

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "gpu-record.sh")


def fake_smi(tmp_path):
    b = tmp_path / "bin"
    b.mkdir()
    smi = b / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'name, clocks.max.sm [MHz], clocks.max.memory [MHz]'\n"
                   "echo 'NVIDIA H100 80GB HBM3, 1980 MHz, 2619 MHz'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    return str(b)


def run(env):
    return subprocess.run(["bash", SCRIPT], capture_output=True, text=True, env=env, timeout=60)


def test_parses():
    r = subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_without_out_is_a_usage_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    r = run(env)
    assert r.returncode == 2
    assert "$OUT" in r.stdout + r.stderr


def test_require_another_card_runs_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), REQUIRE="H200", PATH=fake_smi(tmp_path) + os.pathsep + os.environ["PATH"])
    r = run(env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(os.listdir(out)) == ["record-card.log"]
    card = (out / "record-card.log").read_text()
    assert "H100" in card and "not a H200: nothing run" in card
