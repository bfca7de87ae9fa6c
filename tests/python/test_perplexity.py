"""`ddtree perplexity`: per-token log-probabilities against transformers' logits on every target fixture
(tests/fixtures/target/*/reference.json, float64 log-softmax), perplexity = exp(mean negative
log-likelihood), windows of --ctx scored from an empty context (a window's rows are the whole text's
rows at the same positions, bit for bit), and bad input (no text, two sources, a missing or NUL-holding
file, bad ids, the CUDA backend) exiting 2 with a message.  Needs DDT_BUILD_DIR."""

import json
import math
import os
import subprocess
import tempfile

import numpy as np
import pytest

from ddt_paths import ddtree_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "target")
TARGET = os.path.join(ROOT, "models", "pystdlib-target")
VARIANTS = ["fp32", "bf16", "fp8", "int4", "ngroup", "qlora_null", "yarn", "dense3", "sharded", "kimi"]


def run(*args, timeout=120):
    return subprocess.run([ddtree_path(), "perplexity", *args], capture_output=True, text=True, timeout=timeout)


def run_json(*args):
    r = run(*args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("variant", VARIANTS)
def test_logprobs_match_transformers(variant):
    with open(os.path.join(FIXTURES, variant, "reference.json")) as f:
        ref = json.load(f)
    for p in ref["prompts"]:
        ids = p["ids"]
        if len(ids) < 2:
            continue
        got = run_json("--model", os.path.join(FIXTURES, variant), "--ids", ",".join(map(str, ids)), "--threads", "2")
        logits = np.asarray(p["logits"], dtype=np.float64)
        logz = logits.max(axis=1) + np.log(np.exp(logits - logits.max(axis=1, keepdims=True)).sum(axis=1))
        want = [logits[i - 1, ids[i]] - logz[i - 1] for i in range(1, len(ids))]
        assert got["logprobs"][0] is None
        np.testing.assert_allclose(got["logprobs"][1:], want, atol=2e-5, rtol=0)
        assert got["scored"] == len(ids) - 1 and got["windows"] == 1
        assert math.isclose(got["perplexity"], math.exp(-np.mean(want)), rel_tol=1e-4)


def test_windows_and_text():
    text = open(os.path.join(ROOT, "examples", "heldout_prompt.py")).read()
    whole = run_json("--model", TARGET, "--text", text)
    n = whole["tokens"]
    assert n > 32 and whole["windows"] == 1 and whole["scored"] == n - 1
    lp = whole["logprobs"]
    assert math.isclose(whole["perplexity"], math.exp(-sum(lp[1:]) / (n - 1)), rel_tol=1e-9)
    # windows of 16: each starts from an empty context, so the first window's rows are the whole
    # text's (bit for bit) and every window's first token has no value
    w = run_json("--model", TARGET, "--text", text, "--ctx", "16")
    assert w["windows"] == (n + 15) // 16 and w["window"] == 16
    assert w["logprobs"][1:16] == lp[1:16]
    assert all(w["logprobs"][i] is None for i in range(0, n, 16))
    assert w["scored"] == sum(min(16, n - i) - 1 for i in range(0, n, 16))
    # --stride: the window's length is a stride of windows that each count what the one before did
    # not reach; stride = the window is the default; a shorter one counts every token but the first
    s16 = run_json("--model", TARGET, "--text", text, "--ctx", "16", "--stride", "16")
    assert s16["logprobs"] == w["logprobs"] and s16["scored"] == w["scored"] and s16["stride"] == 16
    s5 = run_json("--model", TARGET, "--text", text, "--ctx", "16", "--stride", "5")
    assert s5["scored"] == n - 1 and s5["logprobs"][0] is None and None not in s5["logprobs"][1:]
    assert s5["logprobs"][1:16] == lp[1:16]  # the first window is the whole text's start
    # token 16 counts in the window [5, 21) (the one at 0 reached 16): that window scored alone gives
    # the same value, and so does token 22 in [10, 26)
    ids = s5["ids"]
    assert ids == whole["ids"] and len(ids) == n
    for p, begin in ((16, 5), (22, 10)):
        alone = run_json("--model", TARGET, "--ids", ",".join(map(str, ids[begin:begin + 16])), "--ctx", "16")
        assert alone["logprobs"][p - begin] == s5["logprobs"][p], p
    assert s5["perplexity"] < w["perplexity"]  # longer contexts predict better, on this text
    for bad in (["--stride", "0"], ["--stride", "17"], ["--stride", "x"]):
        r = run("--model", TARGET, "--text", text, "--ctx", "16", *bad)
        assert r.returncode == 2 and "--stride" in r.stderr, (bad, r.stderr)
    # --file gives the same as --text; --max-tokens cuts the text
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    try:
        assert run_json("--model", TARGET, "--file", f.name)["logprobs"] == lp
    finally:
        os.unlink(f.name)
    cut = run_json("--model", TARGET, "--text", text, "--max-tokens", "20")
    assert cut["tokens"] == 20 and cut["logprobs"] == lp[:20]
    # plain output: one line with the perplexity, the summary on stderr
    r = run("--model", TARGET, "--text", text)
    assert r.returncode == 0 and r.stdout.startswith("perplexity ") and "scored" in r.stderr


def test_bad_input():
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(b"ab\0cd")
    cases = [
        ([], "a text is required"),
        (["--text", "ab cd", "--ids", "1,2"], "give one of"),
        (["--file", "/nonexistent/x.txt"], "No such file"),
        (["--file", f.name], "NUL"),
        (["--ids", "1,x"], "--ids"),
        (["--ids", "1,99999999"], "vocabulary"),
        (["--ids", "5"], "at least 2"),
        (["--text", "ab", "--max-tokens", "1"], "--max-tokens"),
        (["--text", "ab cd ef gh", "--backend", "cpu", "--gpus", "2"], "needs the CUDA backend"),
        (["--text", "ab", "--bogus"], "unknown option"),
    ]
    try:
        for extra, msg in cases:
            r = run("--model", TARGET, *extra)
            assert r.returncode == 2, (extra, r.stderr)
            assert msg in r.stderr, (extra, r.stderr)
    finally:
        os.unlink(f.name)
    r = run("--text", "ab")
    assert r.returncode == 2 and "--model" in r.stderr
