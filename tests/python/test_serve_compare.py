"""scripts/serve-compare.py, the GPU machine's check that a one-GPU server answers JSON mode, forced tool
calls, logit_bias and the penalties with a CPU server's tokens, run here on two CPU engines: tree 16
against ar (the rules and grammars are lossless under speculation, so every request agrees and passes
its own check: the JSON parses, the biased-out id is absent, the call's arguments follow the schema).
Needs DDT_BUILD_DIR."""

import os
import subprocess
import sys

from ddt_paths import build_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tree_and_ar_servers_agree():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "serve-compare.py"), "--build", build_dir(),
                        "--a", "--backend cpu", "--b", "--backend cpu --mode ar", "--threads", "2"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    for name in ("json_object 0", "json_object 1", "penalties 0", "penalties 1", "forced tool call", "logit_bias",
                 "speculative ar", "speculative chain", "speculative tree 8", "speculative tree 16"):
        assert any(l.startswith(name) and " ok " in l for l in lines), (name, r.stdout)
    assert lines[-1] == "serve-compare: all requests agree"
