"""bench/make_dflash.py (random drafter folders of a real drafter's shape for cuda_bench_draft): the
folder it writes is one the engine loads (config and every tensor's name, dtype and shape; checked
by the loader, and the header read back here against the preset), and a tree decode with it gives
the autoregressive tokens (a random drafter's trees are rejected, the output stays the target's).
The K2.6 preset's header is checked without writing its 7 GB.  Needs DDT_BUILD_DIR."""

import json
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import make_dflash  # noqa: E402
from ddt_paths import ddtree_path  # noqa: E402


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def test_pystdlib_preset_loads_and_decodes(tmp_path):
    out = str(tmp_path / "d")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "make_dflash.py"), out, "--preset", "pystdlib"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    h, start = read_header(os.path.join(out, "model.safetensors"))
    want = dict(make_dflash.tensors(make_dflash.PRESETS["pystdlib"]))
    assert {k: v["shape"] for k, v in h.items()} == want
    assert all(v["dtype"] == "BF16" for v in h.values())
    size = os.path.getsize(os.path.join(out, "model.safetensors"))
    assert size == start + max(v["data_offsets"][1] for v in h.values())
    base = [ddtree_path(), "generate", "--model", os.path.join(ROOT, "models", "pystdlib-target"), "--prompt",
            "def main():", "--max-tokens", "24"]
    tree = subprocess.run(base + ["--draft", out, "--mode", "tree"], capture_output=True, text=True, timeout=300)
    ar = subprocess.run(base + ["--mode", "ar"], capture_output=True, text=True, timeout=300)
    assert tree.returncode == 0 and ar.returncode == 0, tree.stderr + ar.stderr
    assert tree.stdout == ar.stdout and tree.stdout.strip()
    assert "mode tree" in tree.stderr


def test_k26_preset_shapes():
    p = make_dflash.PRESETS["k26"]
    t = dict(make_dflash.tensors(p))
    assert t["fc.weight"] == [7168, 6 * 7168]
    assert t["layers.5.self_attn.q_proj.weight"] == [8192, 7168]
    assert t["layers.5.self_attn.k_proj.weight"] == [1024, 7168]
    assert t["layers.0.mlp.down_proj.weight"] == [7168, 18432]
    assert "layers.6.mlp.down_proj.weight" not in t
    c = make_dflash.config(p)
    assert c["dflash_config"]["target_layer_ids"] == [1, 12, 24, 35, 47, 58] and c["num_target_layers"] == 61
    # the draft's own weights, ~6.3 GB (fc, which only the append reads, ~0.6 GB more)
    draft = sum(2 * s[0] * s[1] for k, s in t.items() if len(s) == 2 and k != "fc.weight")
    assert 6.2e9 < draft < 6.5e9


def test_bad_layers(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "make_dflash.py"), str(tmp_path / "x"),
                        "--layers", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--layers" in r.stderr
