"""test_gpu_variant.py — scripts/gpu-variant.sh, compile-time variants of the CUDA programs without a
second build tree: one source of libddt_cuda rebuilt with -D flags into a copy of the library and
the named CMake targets relinked against it.  On the CPU: the variant `ddtree` (target ddtree_cli,
binary ddtree) runs its --help, the copy of the library holds the rebuilt object (its bytes differ
from the build's: the define took), the build's own library is untouched; usage errors exit 2.
Needs DDT_BUILD_DIR with the CUDA backend built (nvcc found): a build without it fails."""

import filecmp
import os
import subprocess

import pytest

from ddt_paths import build_dir

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "gpu-variant.sh")
SRC = "src/backend/cuda/mla_verify_cuda.cu"


def sh(*args, out_dir):
    env = dict(os.environ, BUILD=build_dir(), GPU_VARIANT_DIR=str(out_dir))
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)


def cuda_lib():
    lib = os.path.join(build_dir(), "libddt_cuda.a")
    if not os.path.isfile(lib):
        pytest.fail(f"{lib} is missing: the build found no nvcc (the CUDA backend is part of the tests)",
                    pytrace=False)
    return lib


def member(lib, name, dest):
    subprocess.run(["ar", "x", lib, name], cwd=dest, check=True)
    return os.path.join(dest, name)


def test_variant_round_trip(tmp_path):
    lib = cuda_lib()
    before = os.path.getmtime(lib)
    r = sh("v", SRC, "-DDDT_MLA_MIN_BPS=2", "ddtree_cli", out_dir=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "v"
    assert sorted(os.listdir(out)) == ["ddtree", "libddt_cuda.a"], os.listdir(out)
    h = subprocess.run([str(out / "ddtree"), "--help"], capture_output=True, text=True, timeout=60)
    assert h.returncode == 0 and "usage: ddtree" in h.stdout
    # the define took: the rebuilt member differs from the build's, the build's library is as it was
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    obj = os.path.basename(SRC) + ".o"
    assert not filecmp.cmp(member(lib, obj, tmp_path / "a"), member(str(out / "libddt_cuda.a"), obj, tmp_path / "b"),
                           shallow=False)
    assert os.path.getmtime(lib) == before


def test_usage_errors(tmp_path):
    cuda_lib()
    r = sh("v", SRC, "-DX=1", out_dir=tmp_path)
    assert r.returncode == 2 and "usage" in r.stdout
    r = sh("v", "src/no_such.cu", "-DX=1", "ddtree_cli", out_dir=tmp_path)
    assert r.returncode == 2 and "no source" in r.stdout
    r = sh("v", SRC, "-DX=1", "no_such_program", out_dir=tmp_path)
    assert r.returncode == 2 and "no program no_such_program" in r.stdout
