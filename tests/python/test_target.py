"""`ddtree generate` (the CPU target, --mode ar; the speculative modes are in test_generate.py) as a subprocess.

Greedy continuations must equal transformers' (tests/fixtures/target/*/reference.json) token for
token, up to the first step whose reference top-2 margin is below 1e-4; bad flags, a missing model
folder, ids outside the vocabulary and a prompt longer than the context exit with status 2 and a
message on stderr.  Needs DDT_BUILD_DIR (the build folder holding the `ddtree` binary).
"""

import json
import os
import subprocess

import pytest

from ddt_paths import ddtree_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "target")
MARGIN_MIN = 1e-4
VARIANTS = ["fp32", "bf16", "fp8", "int4", "ngroup", "qlora_null", "yarn", "dense3", "sharded", "kimi"]
QUICK = os.environ.get("DDT_PYTEST_QUICK") == "1"


def run(*args, timeout=120):
    return subprocess.run([ddtree_path(), "generate", *args], capture_output=True, text=True, timeout=timeout)


def reference(variant):
    with open(os.path.join(FIXTURES, variant, "reference.json")) as f:
        return json.load(f)


def comparable_steps(prompt):
    """Greedy steps that a float32 engine must reproduce: those before the first near-tie."""
    for s, m in enumerate(prompt["greedy_top2_margins"]):
        if m < MARGIN_MIN:
            print(f"stopping at step {s}: reference top-2 margin {m} < {MARGIN_MIN}")
            return s
    return len(prompt["greedy_tokens"])


def ids_arg(ids):
    return ",".join(str(i) for i in ids)


FUSED = os.path.join(ROOT, "tests", "fixtures", "fused")


@pytest.mark.parametrize("variant", VARIANTS[:2] if QUICK else VARIANTS)
def test_cli_greedy_matches_transformers(variant):
    check_greedy(os.path.join(FIXTURES, variant), reference(variant))


@pytest.mark.parametrize("variant", ["fp32", "bf16", "kimi"])
def test_cli_fused_experts_match_transformers(variant):
    """The same model with its experts in transformers 5's fused layout (tests/fixtures/fused) decodes the same."""
    check_greedy(os.path.join(FUSED, variant), reference(variant))


def test_cli_half_fused_checkpoint_exits_2(tmp_path):
    """A fused layer missing down_proj: exit 2 and a message naming the missing tensor, not a crash."""
    src = os.path.join(FUSED, "bf16")
    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        blob = f.read()
    hlen = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + hlen])
    data = blob[8 + hlen:]
    drop = "model.layers.2.mlp.experts.down_proj"
    kept, body = {"__metadata__": header.pop("__metadata__")}, b""
    for name, t in sorted(header.items()):
        if name == drop:
            continue
        b, e = t["data_offsets"]
        kept[name] = dict(t, data_offsets=[len(body), len(body) + e - b])
        body += data[b:e]
    text = json.dumps(kept).encode()
    text += b" " * (-len(text) % 8)
    (tmp_path / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + body)
    with open(os.path.join(src, "config.json")) as f:
        (tmp_path / "config.json").write_text(f.read())
    r = run("--model", str(tmp_path), "--prompt-ids", "5,6", "--max-tokens", "2")
    assert r.returncode == 2, r.stderr
    assert drop + " is missing" in r.stderr and "half-fused" in r.stderr


def check_greedy(model_dir, ref):
    for p in ref["prompts"]:
        steps = comparable_steps(p)
        if steps == 0:
            continue
        r = run("--model", model_dir, "--mode", "ar", "--temperature", "0",
                "--prompt-ids", ids_arg(p["ids"]), "--max-tokens", str(steps), "--json", "--threads", "2")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["ids"] == p["greedy_tokens"][:steps]
        assert out["stats"]["mode"] == "ar" and out["stats"]["tokens"] == steps
        assert "tokens/s" in r.stderr


def test_cli_plain_output_threads_and_sampling():
    model = os.path.join(FIXTURES, "fp32")
    p = reference("fp32")["prompts"][2]
    a = run("--model", model, "--prompt-ids", ids_arg(p["ids"]), "--max-tokens", "5", "--threads", "1")
    b = run("--model", model, "--prompt-ids", ids_arg(p["ids"]), "--max-tokens", "5", "--threads", "3")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout
    assert [int(x) for x in a.stdout.split()] == p["greedy_tokens"][:5]
    # sampling is reproducible from the seed and stays in the vocabulary
    s1 = run("--model", model, "--prompt-ids", "5,6,7", "--max-tokens", "12", "--temperature", "1.5",
             "--seed", "7", "--json")
    s2 = run("--model", model, "--prompt-ids", "5,6,7", "--max-tokens", "12", "--temperature", "1.5",
             "--seed", "7", "--json")
    assert s1.returncode == 0, s1.stderr
    ids = json.loads(s1.stdout)["ids"]
    assert ids == json.loads(s2.stdout)["ids"]
    assert len(ids) == 12 and all(0 <= i < 300 for i in ids)
    # zero tokens requested: an empty list
    z = run("--model", model, "--prompt-ids", "5", "--max-tokens", "0", "--json")
    assert z.returncode == 0 and json.loads(z.stdout)["ids"] == []


def test_cli_stops_when_context_is_full():
    model = os.path.join(FIXTURES, "fp32")
    p = reference("fp32")["prompts"][0]
    n = len(p["ids"])
    r = run("--model", model, "--prompt-ids", ids_arg(p["ids"]), "--max-tokens", "10", "--ctx", str(n + 2), "--json")
    assert r.returncode == 0, r.stderr
    # n + 2 positions: the prompt, then two generated tokens fed back, the third never fed
    assert json.loads(r.stdout)["ids"] == p["greedy_tokens"][:3]
    assert "context" in r.stderr


def test_cli_help():
    r = run("--help")
    assert r.returncode == 0 and "--prompt-ids" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["--bogus"], "unknown option"),
    (["--model"], "needs a value"),
    (["--prompt-ids", "1,2", "--max-tokens", "3"], "--model is required"),
    (["--model", "@FP32", "--max-tokens", "3"], "a prompt is required"),
    (["--model", "@FP32", "--prompt-ids", "1,2"], "--max-tokens is required"),
    (["--model", "@FP32", "--prompt-ids", "1,,2", "--max-tokens", "3"], "--prompt-ids"),
    (["--model", "@FP32", "--prompt-ids", "1,x", "--max-tokens", "3"], "--prompt-ids"),
    (["--model", "@FP32", "--prompt-ids", "", "--max-tokens", "3"], "--prompt-ids"),
    (["--model", "@FP32", "--prompt-ids", "1", "--max-tokens", "-1"], "--max-tokens"),
    (["--model", "@FP32", "--prompt-ids", "1", "--max-tokens", "3", "--threads", "0"], "--threads"),
    (["--model", "@FP32", "--prompt-ids", "1", "--max-tokens", "3", "--temperature", "-1"], "--temperature"),
    (["--model", "@FP32", "--prompt-ids", "1", "--max-tokens", "3", "--top-p", "0"], "--top-p"),
    (["--model", "@FP32", "--prompt-ids", "1", "--max-tokens", "3", "--mode", "ddtree"], "needs a drafter"),
    (["--model", "@FP32", "--prompt-ids", "1", "--max-tokens", "3", "--mode", "dflash"], "needs a drafter"),
    (["--model", "@FP32", "--prompt-ids", "1", "--max-tokens", "3", "--mode", "tree", "--draft", "/nonexistent/d"], "/nonexistent/d"),
    (["--model", "@FP32", "--prompt-ids", "1", "--max-tokens", "3", "--mode", "tree", "--draft", "@FP32", "--budget", "0"], "--budget"),
    (["--model", "@FP32", "--prompt-ids", "1", "--max-tokens", "3", "--mode", "tree", "--draft", "@FP32", "--budget", "x"], "--budget"),
    (["--model", "@FP32", "--prompt-ids", "1", "--max-tokens", "3", "--mode", "tree", "--draft", "@FP32"], "DFlashDraftModel"),
    (["--model", "@FP32", "--prompt", "hello", "--max-tokens", "3"], "tokenizer"),
    (["--model", "@FP32", "--prompt", "hello", "--prompt-ids", "1", "--max-tokens", "3"], "give one of"),
    (["--model", "@FP32", "--prompt-ids", "1", "--max-tokens", "3", "--mode", "fast"], "unknown"),
    (["--model", "/nonexistent/model", "--prompt-ids", "1", "--max-tokens", "3"], "/nonexistent/model"),
    (["--model", "@FP32", "--prompt-ids", "1,300", "--max-tokens", "3"], "vocabulary"),
    (["--model", "@FP32", "--prompt-ids", "-1", "--max-tokens", "3"], "vocabulary"),
    (["--model", "@FP32", "--prompt-ids", "1,2,3,4", "--max-tokens", "3", "--ctx", "3"], "longer than the context"),
    (["--model", "@EMPTY", "--prompt-ids", "1", "--max-tokens", "3"], "config.json"),
])
def test_cli_bad_input_exits_2(args, needle, tmp_path):
    subst = {"@FP32": os.path.join(FIXTURES, "fp32"), "@EMPTY": str(tmp_path)}
    r = run(*[subst.get(a, a) for a in args])
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert needle in r.stderr, r.stderr
    assert r.stdout == ""


def test_cli_damaged_checkpoint_exits_2(tmp_path):
    # config present, weights file cut short
    src = os.path.join(FIXTURES, "fp32")
    with open(os.path.join(src, "config.json")) as f:
        (tmp_path / "config.json").write_text(f.read())
    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        data = f.read()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    r = run("--model", str(tmp_path), "--prompt-ids", "1,2", "--max-tokens", "2")
    assert r.returncode == 2
    assert "model.safetensors" in r.stderr
