"""train/evaluate.py, the drafter's acceptance with the C engine: on the shipped pair and the shipped
held-out prompts (--prompts-in, no training data needed) it writes a summary with the greedy modes
(whose outputs it checks against ar) and the T = 1 pass (t1_chain, t1_tree_16, t1_tree_32), every
mean acceptance a number of tokens per round >= 1, and it refuses a bad prompts file and a negative
--t1-seeds with a message naming them.  Runs the script as a subprocess; needs DDT_BUILD_DIR."""

import json
import os
import subprocess
import sys

from ddt_paths import build_dir, ddtree_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "train", "evaluate.py")
PROMPTS = os.path.join(ROOT, "models", "heldout_prompts.json")


def run(tmp_path, *extra):
    ddtree_path()  # fails loudly when the build lacks the command
    out = tmp_path / "eval.json"
    cmd = [sys.executable, SCRIPT, "--build", build_dir(), "--results-out", str(out), "--max-tokens", "12",
           "--prompts", "1", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT), out


def test_summary_has_greedy_and_t1_modes(tmp_path):
    r, out = run(tmp_path, "--prompts-in", PROMPTS, "--t1-seeds", "1")
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["n_prompts"] == 1 and doc["t1_seeds"] == 1
    want = ["ar", "chain", "tree_16", "tree_32", "tree_64", "tree_auto", "t1_chain", "t1_tree_16", "t1_tree_32"]
    assert sorted(doc["summary"]) == sorted(want)
    for name in want:
        acc = doc["summary"][name]["mean_acceptance"]
        assert acc >= 1.0, (name, acc)
    assert doc["summary"]["ar"]["mean_acceptance"] < 1.1  # ar commits one token a round
    assert doc["summary"]["tree_32"]["mean_acceptance"] > 1.5  # the trained drafter is accepted
    row = doc["per_prompt"][0]
    assert set(want[1:]) <= set(row)


def test_no_t1_pass(tmp_path):
    r, out = run(tmp_path, "--prompts-in", PROMPTS, "--t1-seeds", "0")
    assert r.returncode == 0, r.stderr
    assert not any(k.startswith("t1_") for k in json.loads(out.read_text())["summary"])


def test_bad_input_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"prompts": [{"file": "x"}]}))
    r, _ = run(tmp_path, "--prompts-in", str(bad))
    assert r.returncode != 0 and "--prompts-in" in r.stderr and "text" in r.stderr, r.stderr
    r, _ = run(tmp_path, "--prompts-in", str(tmp_path / "missing.json"))
    assert r.returncode != 0 and "missing.json" in r.stderr, r.stderr
    r, _ = run(tmp_path, "--prompts-in", PROMPTS, "--t1-seeds", "-1")
    assert r.returncode != 0 and "--t1-seeds" in r.stderr, r.stderr
