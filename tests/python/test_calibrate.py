"""The draft calibration from the command line: `ddtree calibrate` fits a drafter's calibration for a target
and writes the file; `ddtree generate` loads the drafter folder's own by default on the CPU, takes another
with --calibration FILE, none with --calibration none, and says in its stats whether the trees were built
calibrated and how many nodes the context lookup grafted (none with --no-lookup); greedy output stays ar's either way; the shipped pair's calibration (models/pystdlib-dflash/
draft_calibration.json, fitted on models/calibration_prompts.json) gives greedy trees more accepted tokens
a round on the held-out prompts; bad files and flags are refused with a message that names them.
Needs DDT_BUILD_DIR."""

import json
import os
import subprocess

from ddt_paths import ddtree_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "models")
TARGET = os.path.join(MODELS, "pystdlib-target")
DRAFTER = os.path.join(MODELS, "pystdlib-dflash")
SHIPPED = os.path.join(DRAFTER, "draft_calibration.json")


def ddtree(*args, timeout=600):
    return subprocess.run([ddtree_path(), *args], capture_output=True, text=True, timeout=timeout)


def heldout(n):
    with open(os.path.join(MODELS, "heldout_prompts.json"), encoding="utf-8") as f:
        return [p["text"] for p in json.load(f)["prompts"][:n]]


def gen_json(prompt, *args):
    r = ddtree("generate", "--model", TARGET, "--draft", DRAFTER, "--prompt", prompt, "--json", "--threads", "2",
               *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_calibrate_writes_a_file_generate_uses(tmp_path):
    prompts = tmp_path / "prompts.json"
    with open(os.path.join(MODELS, "calibration_prompts.json"), encoding="utf-8") as f:
        doc = json.load(f)
    prompts.write_text(json.dumps([p["text"] for p in doc["prompts"][:4]]))  # the plain-array form
    out = tmp_path / "cal.json"
    r = ddtree("calibrate", "--model", TARGET, "--draft", DRAFTER, "--prompts", str(prompts), "--max-tokens", "48",
               "--out", str(out), "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert "rank 0" in r.stderr and str(out) in r.stderr and "context lookup:" in r.stderr
    cal = json.loads(out.read_text())
    assert cal["format"] == "ddtree-draft-calibration" and cal["version"] == 1 and cal["temperature"] == 0
    assert len(cal["weights"]) == 5 and all(len(w) == 3 and w[1] > 0 for w in cal["weights"])
    assert "4 prompts" in cal["fit"]["note"]
    # the shipped folder is not touched when --out is given
    with open(SHIPPED, encoding="utf-8") as f:
        assert json.load(f)["weights"] != cal["weights"]

    prompt = heldout(1)[0]
    base = ["--max-tokens", "40"]
    ar = ddtree("generate", "--model", TARGET, "--prompt", prompt, "--json", "--threads", "2", *base)
    assert ar.returncode == 0, ar.stderr
    ar_ids = json.loads(ar.stdout)["ids"]
    for flag, want in ((["--calibration", str(out)], True), (["--calibration", "none"], False), ([], True),
                       (["--no-lookup"], True)):
        got = gen_json(prompt, "--mode", "tree", "--budget", "16", *base, *flag)
        assert got["ids"] == ar_ids, flag
        assert got["stats"]["draft_calibrated"] is want, flag
        if not want or flag == ["--no-lookup"]:
            assert got["stats"]["lookup_nodes"] == 0, flag
    # at T > 0 the drafter's own q: not applied
    t1 = gen_json(prompt, "--mode", "tree", "--budget", "16", *base, "--temperature", "1", "--seed", "3")
    assert t1["stats"]["draft_calibrated"] is False
    # the summary line says so too
    r = ddtree("generate", "--model", TARGET, "--draft", DRAFTER, "--prompt", prompt, "--mode", "tree", "--threads",
               "2", *base)
    assert r.returncode == 0 and "(calibrated)" in r.stderr, r.stderr


def test_shipped_calibration_accepts_more():
    """Greedy tree 16 over the first 6 held-out prompts (never used by the fit): more tokens a round with the
    shipped calibration than with the drafter's own q, and more again with its context lookup (the CPU engine
    is deterministic: one run decides)."""
    runs = {"plain": ["--calibration", "none"], "calibrated": ["--calibration", SHIPPED, "--no-lookup"],
            "lookup": ["--calibration", SHIPPED]}
    tok = dict.fromkeys(runs, 0)
    rounds = dict.fromkeys(runs, 0)
    grafted = 0
    for prompt in heldout(6):
        for name, flags in runs.items():
            st = gen_json(prompt, "--mode", "tree", "--budget", "16", "--max-tokens", "96", *flags)["stats"]
            assert st["draft_calibrated"] is (name != "plain")
            tok[name] += st["tokens"]
            rounds[name] += st["rounds"]
            if name == "lookup":
                grafted += st["lookup_nodes"]
    acc = {k: tok[k] / rounds[k] for k in runs}
    print(f"tree 16 mean acceptance: {acc}, {grafted} lookup nodes")
    assert acc["calibrated"] > acc["plain"] * 1.02, acc
    assert acc["lookup"] > acc["calibrated"] * 1.02 and grafted > 0, acc


def test_bad_calibration_input(tmp_path):
    prompt = heldout(1)[0]
    base = ["generate", "--model", TARGET, "--draft", DRAFTER, "--prompt", prompt, "--mode", "tree",
            "--max-tokens", "4"]
    r = ddtree(*base, "--calibration", "/nonexistent/cal.json")
    assert r.returncode == 2 and "/nonexistent/cal.json" in r.stderr, r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "ddtree-draft-calibration", "version": 1, "temperature": 0, '
                   '"weights": [[0,1,0],[0,1,0],[0,-1,0],[0,1,0],[0,1,0]]}')
    r = ddtree(*base, "--calibration", str(bad))
    assert r.returncode == 2 and "bad.json" in r.stderr and "bucket 2" in r.stderr, r.stderr
    r = ddtree(*base, "--calibration", "")
    assert r.returncode == 2 and "--calibration" in r.stderr
    # a broken file in the drafter folder, loaded by default: named, with the way around it
    folder = tmp_path / "drafter"
    folder.mkdir()
    for name in os.listdir(DRAFTER):
        if name != "draft_calibration.json":
            os.symlink(os.path.join(DRAFTER, name), folder / name)
    (folder / "draft_calibration.json").write_text("{")
    fb = ["generate", "--model", TARGET, "--draft", str(folder), "--prompt", prompt, "--mode", "tree",
          "--max-tokens", "4"]
    r = ddtree(*fb)
    assert r.returncode == 2 and "draft_calibration.json" in r.stderr and "--calibration none" in r.stderr, r.stderr
    r = ddtree(*fb, "--calibration", "none", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["stats"]["draft_calibrated"] is False, r.stderr
    # calibrate's own checks
    cal = ["calibrate", "--model", TARGET, "--draft", DRAFTER]
    r = ddtree(*cal)
    assert r.returncode == 2 and "--prompts" in r.stderr
    r = ddtree(*cal, "--prompts", str(bad), "--temperature", "1")
    assert r.returncode == 2 and "greedy" in r.stderr
    for text, needle in (("[", "not valid JSON"), ("[]", "non-empty array"), ('[1]', "prompt 0"),
                         ('{"prompts": [{"text": ""}]}', "prompt 0")):
        p = tmp_path / "p.json"
        p.write_text(text)
        r = ddtree(*cal, "--prompts", str(p), "--out", str(tmp_path / "o.json"))
        assert r.returncode == 2 and needle in r.stderr, (text, r.stderr)
    r = ddtree("calibrate", "--model", TARGET, "--prompts", str(bad))
    assert r.returncode == 2 and "--draft" in r.stderr
    r = ddtree(*cal, "--prompts", str(bad), "--max-tokens", "1")
    assert r.returncode == 2 and "--max-tokens" in r.stderr
