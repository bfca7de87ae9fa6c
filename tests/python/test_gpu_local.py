"""test_gpu_local.py — scripts/gpu-local.sh, the way binaries built on this machine reach the
GPU machine: `pack` strips and compresses them with the libraries they need, `run` unpacks
them once and runs a command with DDT_BIN and LD_LIBRARY_PATH set.  Round trip on the CPU
build's `ddtree` (its --help needs no GPU); a missing binary and a missing pack are usage
errors.  Needs DDT_BUILD_DIR."""

import os
import subprocess

from ddt_paths import ddtree_path

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "gpu-local.sh")


def sh(*args, env_dir):
    env = dict(os.environ, GPU_LOCAL_DIR=str(env_dir), GPU_LOCAL_XZ_PRESET="0")  # merge: fast, still solid
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=env, timeout=300)


def test_pack_and_run_round_trip(tmp_path):
    build = os.path.dirname(ddtree_path())
    r = sh("pack", "t", build, "ddtree", env_dir=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    files = sorted(os.listdir(tmp_path / "t"))
    assert files == ["pack.tar.xz"], files
    # compressed and stripped: well under the binary's size
    assert os.path.getsize(tmp_path / "t" / "pack.tar.xz") < os.path.getsize(ddtree_path())
    r = sh("run", "t", '"$DDT_BIN/ddtree" --help; echo "LD=$LD_LIBRARY_PATH"', env_dir=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "usage: ddtree" in r.stdout
    assert f"LD={tmp_path}/t/lib" in r.stdout
    assert os.access(tmp_path / "t" / "bin" / "ddtree", os.X_OK)
    # no glibc / libstdc++ / NCCL among the carried libraries: the GPU machine has its own
    libs = os.listdir(tmp_path / "t" / "lib")
    assert not [l for l in libs if l.startswith(("libc.so", "libstdc++", "libnccl", "libcublas", "ld-linux"))], libs
    # a second run reuses the unpacked folder; the command's status is the script's
    r = sh("run", "t", "exit 7", env_dir=tmp_path)
    assert r.returncode == 7


def test_merge_and_run(tmp_path):
    """Two packs merged into one solid archive (smaller than the two: the same binary twice),
    the per-build packs gone; `run` of either name unpacks the archive and runs; a name the
    archive lacks is still a usage error; a third pack merges into the archive."""
    build = os.path.dirname(ddtree_path())
    for name in ("a", "b"):
        r = sh("pack", name, build, "ddtree", env_dir=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
    two = os.path.getsize(tmp_path / "a" / "pack.tar.xz") + os.path.getsize(tmp_path / "b" / "pack.tar.xz")
    r = sh("merge", env_dir=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(os.listdir(tmp_path)) == ["all.tar.xz"], os.listdir(tmp_path)
    assert os.path.getsize(tmp_path / "all.tar.xz") < two
    assert "a b" in r.stdout, r.stdout
    r = sh("run", "b", '"$DDT_BIN/ddtree" --help; echo "BIN=$DDT_BIN"', env_dir=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "usage: ddtree" in r.stdout and f"BIN={tmp_path}/b/bin" in r.stdout
    r = sh("run", "a", "exit 3", env_dir=tmp_path)
    assert r.returncode == 3
    r = sh("run", "c", "true", env_dir=tmp_path)
    assert r.returncode == 2 and "no packed build" in r.stdout
    r = sh("pack", "c", build, "ddtree", env_dir=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = sh("merge", env_dir=tmp_path)
    assert r.returncode == 0 and "a b c" in r.stdout, r.stdout + r.stderr
    os.makedirs(tmp_path / "empty")
    r = sh("merge", env_dir=tmp_path / "empty")
    assert r.returncode == 2 and "no packs" in r.stdout


def test_usage_errors(tmp_path):
    build = os.path.dirname(ddtree_path())
    r = sh("pack", "t", build, "no-such-binary", env_dir=tmp_path)
    assert r.returncode == 2 and "no executable" in r.stdout
    r = sh("run", "missing", "true", env_dir=tmp_path)
    assert r.returncode == 2 and "no packed build" in r.stdout
    r = sh("pack", "t", env_dir=tmp_path)
    assert r.returncode == 2 and "usage" in r.stdout


def test_no_packs_committed():
    """ab/ (the packs gpu-local.sh, gpu-ab.sh and gpu-patches.sh make) travels to the GPU machine as
    untracked files and must never be committed: 8 MB binaries a pack (it happened once, in the tenth
    session of 2026-12-04, through a `git add -A`)."""
    r = subprocess.run(["git", "-C", ROOT, "ls-files", "--", "ab"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "", "committed packs under ab/:\n" + r.stdout
