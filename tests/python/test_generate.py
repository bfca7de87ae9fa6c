"""`ddtree generate` in the speculative modes, as a subprocess: greedy `chain` and `tree`
(fixed and auto budgets) print exactly the ids of greedy `ar` with the DFlash fixture drafter;
--json carries the statistics; text prompts and the Kimi chat template go through the
model folder's tokenizer; sampling is reproducible per seed.  Needs DDT_BUILD_DIR."""

import json
import re
import os
import shutil
import subprocess

import pytest

import scripted_model as sm

from ddt_paths import ddtree_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = os.path.join(ROOT, "tests", "fixtures", "target", "fp32")
DRAFT = os.path.join(ROOT, "tests", "fixtures", "drafter", "fp32")
TOKENIZER = os.path.join(ROOT, "tests", "fixtures", "tokenizer")


def run(*args, timeout=300):
    return subprocess.run([ddtree_path(), "generate", *args], capture_output=True, text=True, timeout=timeout)


def gen_json(*args):
    r = run(*args, "--json", "--threads", "2")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


PROMPTS = ["5,6,7", "100,3,250,17,42,9,1,77", "299"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_cli_tree_and_chain_equal_ar(prompt):
    base = ["--model", TARGET, "--prompt-ids", prompt, "--max-tokens", "30"]
    ar = gen_json(*base)
    assert len(ar["ids"]) == 30
    runs = [["--mode", "chain"], ["--mode", "tree", "--budget", "4"], ["--mode", "tree", "--budget", "64"],
            ["--mode", "ddtree", "--budget", "auto", "--max-budget", "48"]]
    for extra in runs:
        out = gen_json(*base, "--draft", DRAFT, *extra)
        assert out["ids"] == ar["ids"], extra
        st = out["stats"]
        assert st["tokens"] == 30 and st["rounds"] >= 1
        assert st["mean_acceptance"] >= 1.0
        assert st["nodes_verified"] >= st["rounds"]
        assert st["auto_capped_rounds"] == 0  # the CPU verifies each round's own cut (the GPU's graphs lag)
        for phase in ("prefill", "draft", "build", "verify", "walk", "commit"):
            assert st["seconds"][phase] >= 0.0


def test_cli_logprobs():
    """--logprobs N with --json: each emitted token's log-probability and N alternatives, the same in
    every mode (tree verify rows are ar's, bit for bit); greedy, the token is the top one."""
    base = ["--model", TARGET, "--prompt-ids", PROMPTS[1], "--max-tokens", "20", "--logprobs", "3"]
    ar = gen_json(*base)
    lp = ar["logprobs"]
    assert [e["id"] for e in lp] == ar["ids"]
    for e in lp:
        assert e["logprob"] <= 0 and len(e["top"]) == 3
        assert e["top"][0] == [e["id"], e["logprob"]]
        assert e["top"][0][1] >= e["top"][1][1] >= e["top"][2][1]
    for extra in (["--mode", "tree", "--budget", "8"], ["--mode", "chain"]):
        assert gen_json(*base, "--draft", DRAFT, *extra)["logprobs"] == lp, extra
    assert "logprobs" not in gen_json("--model", TARGET, "--prompt-ids", PROMPTS[1], "--max-tokens", "4")
    for bad, msg in ((["--logprobs", "21"], "0..20"), (["--logprobs", "x"], "0..20")):
        r = run(*base[:-2], *bad, "--json")
        assert r.returncode == 2 and msg in r.stderr, r.stderr
    r = run("--model", TARGET, "--prompt-ids", PROMPTS[1], "--max-tokens", "4", "--logprobs", "2")
    assert r.returncode == 2 and "--json" in r.stderr


def test_cli_stop_reason():
    """--json's stop_reason is the engine's: max tokens, or a full context (also in tree mode)."""
    base = ["--model", TARGET, "--prompt-ids", "100,3,250,17,42,9,1,77"]
    for extra in ([], ["--draft", DRAFT, "--mode", "tree", "--budget", "8"]):
        out = gen_json(*base, *extra, "--max-tokens", "5")
        assert out["stop_reason"] == "max tokens" and len(out["ids"]) == 5
        out = gen_json(*base, *extra, "--max-tokens", "30", "--ctx", "12")
        assert out["stop_reason"] == "context full" and len(out["ids"]) == 12 - 8 + 1
    r = run(*base, "--max-tokens", "30", "--ctx", "12", "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert "the context of 12 tokens is full" in r.stderr and "(context full)" in r.stderr


def test_cli_streams_ids_and_summary():
    r = run("--model", TARGET, "--draft", DRAFT, "--mode", "tree", "--budget", "8", "--prompt-ids", "5,6,7",
            "--max-tokens", "12", "--threads", "2")
    assert r.returncode == 0, r.stderr
    ids = [int(x) for x in r.stdout.split()]
    assert len(ids) == 12
    assert "tokens/s" in r.stderr and "mean acceptance" in r.stderr and "verify" in r.stderr


def test_cli_sampling_reproducible_per_seed():
    args = ["--model", TARGET, "--draft", DRAFT, "--mode", "tree", "--budget", "16", "--prompt-ids", "5,6,7",
            "--max-tokens", "20", "--temperature", "1", "--top-p", "0.9"]
    a = gen_json(*args, "--seed", "11")
    b = gen_json(*args, "--seed", "11")
    c = gen_json(*args, "--seed", "12")
    assert a["ids"] == b["ids"]
    assert a["ids"] != c["ids"]


@pytest.fixture()
def model_with_tokenizer(tmp_path):
    d = tmp_path / "model"
    shutil.copytree(TARGET, d)
    for f in os.listdir(TOKENIZER):
        shutil.copy(os.path.join(TOKENIZER, f), d / f)
    return str(d)


def test_cli_text_and_chat_prompts(model_with_tokenizer):
    out = gen_json("--model", model_with_tokenizer, "--draft", DRAFT, "--mode", "tree", "--prompt",
                   "def main():", "--max-tokens", "10")
    assert len(out["ids"]) == 10 and isinstance(out["text"], str)
    assert out["stats"]["prompt_tokens"] >= 2
    chat = gen_json("--model", model_with_tokenizer, "--chat", "hello", "--max-tokens", "5")
    # the template wraps the message: system + user turns and the assistant header
    assert chat["stats"]["prompt_tokens"] > 8
    ar = gen_json("--model", model_with_tokenizer, "--prompt", "def main():", "--max-tokens", "10")
    assert ar["ids"] == out["ids"]


def test_cli_chat_template_flag(model_with_tokenizer, tmp_path):
    """--chat-template FILE replaces the folder's template: a template that writes the message as plain
    text gives the ids of that text as a --prompt; a template that does not parse, or a missing file,
    stops with the file named (exit 2)."""
    f = tmp_path / "plain.jinja"
    # (trim_blocks, as transformers sets it, drops a newline written right after a block tag)
    f.write_text("Q: {{ messages[-1].content }}{% if add_generation_prompt %}\n{{ '\\n' }}A:{% endif %}")
    a = gen_json("--model", model_with_tokenizer, "--chat", "def main():", "--chat-template", str(f),
                 "--max-tokens", "6")
    b = gen_json("--model", model_with_tokenizer, "--prompt", "Q: def main():\nA:", "--max-tokens", "6")
    assert a["ids"] == b["ids"] and a["stats"]["prompt_tokens"] == b["stats"]["prompt_tokens"]
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for %}")
    r = run("--model", model_with_tokenizer, "--chat", "x", "--chat-template", str(bad), "--max-tokens", "3")
    assert r.returncode == 2 and "bad.jinja: line 1" in r.stderr, r.stderr
    r = run("--model", model_with_tokenizer, "--chat", "x", "--chat-template", str(tmp_path / "none.jinja"),
            "--max-tokens", "3")
    assert r.returncode != 0 and "none.jinja" in r.stderr, r.stderr


def test_cli_chat_reasoning_and_tool_calls(tmp_path):
    """--chat with a model that thinks and calls a tool (scripted_model.py): the stream shows the
    thinking and tool-call markers (so the structure is visible), --json adds the chat message as serve
    returns it."""
    d = tmp_path / "scripted"
    d.mkdir()
    sm.scripted_model(d)
    r = run("--model", str(d), "--chat", "go", "--max-tokens", "30", "--stop-at-eos")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ("<think>r</think>A<|tool_calls_section_begin|><|tool_call_begin|>g:0"
                                "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>")
    out = gen_json("--model", str(d), "--chat", "go", "--max-tokens", "30", "--stop-at-eos")
    assert out["ids"] == sm.SCRIPT[1:] and out["stop_reason"] == "stop token"
    assert out["message"] == {"role": "assistant", "content": "A", "reasoning_content": "r",
                              "tool_calls": [{"id": "g:0", "type": "function",
                                              "function": {"name": "g", "arguments": "{}"}}]}
    # a plain prompt is not a chat: no message
    assert "message" not in gen_json("--model", str(d), "--prompt", "go", "--max-tokens", "2")


def chat_run(*args, stdin=""):
    return subprocess.run([ddtree_path(), "chat", *args], input=stdin, capture_output=True, text=True, timeout=300)


def test_cli_chat_conversation(tmp_path):
    """`ddtree chat`: each stdin line is a turn of one conversation through the chat template; a turn's
    answer is generate --chat's for the same conversation; the second turn reuses the first's context
    (prefix cache); /reset forgets; a tool-calling answer joins the history as a message."""
    shipped = os.path.join(ROOT, "models", "pystdlib-target")
    r = chat_run("--model", shipped, "--max-tokens", "8", stdin="def add(a, b):\n")
    g = run("--model", shipped, "--chat", "def add(a, b):", "--max-tokens", "8", "--stop-at-eos")
    assert r.returncode == 0 and g.returncode == 0, r.stderr + g.stderr
    assert r.stdout == g.stdout
    d = tmp_path / "scripted"
    d.mkdir()
    sm.scripted_model(d)
    r = chat_run("--model", str(d), "--max-tokens", "30", stdin="first\nsecond\n/reset\nthird\n/exit\nnever\n")
    assert r.returncode == 0, r.stderr
    answer = ("<think>r</think>A<|tool_calls_section_begin|><|tool_call_begin|>g:0<|tool_call_argument_begin|>{}"
              "<|tool_call_end|><|tool_calls_section_end|>\n")
    assert r.stdout == answer * 3
    turns = re.findall(r"(\d+) prompt tokens \((\d+) from the previous turn\)", r.stderr)
    assert len(turns) == 3, r.stderr
    # the second prompt holds the first turn and its answer ("firstA" before "second"), reusing its context
    assert int(turns[1][0]) > int(turns[0][0]) and int(turns[1][1]) > 0
    assert "starts afresh" in r.stderr
    r = chat_run("--model", str(d), "--template-kwargs", "[1]", stdin="x\n")
    assert r.returncode == 2 and "--template-kwargs" in r.stderr


def test_cli_bad_drafter_folder(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["DFlashDraftModel"]}')
    r = run("--model", TARGET, "--draft", str(tmp_path), "--mode", "tree", "--prompt-ids", "1", "--max-tokens", "3")
    assert r.returncode == 2
    assert "config.json" in r.stderr


def test_cli_prompt_file(model_with_tokenizer, tmp_path):
    f = tmp_path / "prompt.txt"
    f.write_text("def main():")
    a = gen_json("--model", model_with_tokenizer, "--prompt-file", str(f), "--max-tokens", "6")
    b = gen_json("--model", model_with_tokenizer, "--prompt", "def main():", "--max-tokens", "6")
    assert a["ids"] == b["ids"]
    r = run("--model", model_with_tokenizer, "--prompt-file", str(tmp_path / "missing"), "--max-tokens", "3")
    assert r.returncode == 2 and "missing" in r.stderr
    r = run("--model", model_with_tokenizer, "--prompt-file", str(f), "--prompt", "x", "--max-tokens", "3")
    assert r.returncode == 2 and "give one of" in r.stderr


def test_cli_backend_flag():
    """--backend cpu is the default's output; an unknown backend is a usage error; --backend cuda
    either runs on a GPU (and then gives the CPU's greedy ids on this fixture) or, on a machine
    without one (CI) or a build without nvcc, fails with exit 2 and a message naming CUDA."""
    base = ["--model", TARGET, "--prompt-ids", "5,6,7", "--max-tokens", "12"]
    cpu = gen_json(*base)
    assert gen_json(*base, "--backend", "cpu")["ids"] == cpu["ids"]
    auto = gen_json(*base, "--backend", "auto")  # cpu here unless a GPU is present
    assert auto["ids"] == cpu["ids"] and auto["stats"]["backend"] in ("cpu", "cuda")
    fast = run(*base, "--fast-attention")
    assert fast.returncode == 2 and "--backend cuda" in fast.stderr
    tc = run(*base, "--tensor-cores")
    assert tc.returncode == 2 and "--tensor-cores" in tc.stderr and "--backend cuda" in tc.stderr
    hs = run(*base, "--host-sampler", "--temperature", "1")
    assert hs.returncode == 2 and "--host-sampler" in hs.stderr and "--backend cuda" in hs.stderr
    npdl = run(*base, "--no-pdl")
    assert npdl.returncode == 2 and "--no-pdl" in npdl.stderr and "--backend cuda" in npdl.stderr
    pe = run(*base, "--pdl-edges", "products")
    assert pe.returncode == 2 and "--pdl-edges" in pe.stderr and "--backend cuda" in pe.stderr
    pe_bad = run(*base, "--pdl-edges", "some", "--backend", "cuda")
    assert pe_bad.returncode == 2 and "--pdl-edges 'some'" in pe_bad.stderr
    npt = run(*base, "--no-phase-times")
    assert npt.returncode == 2 and "--no-phase-times" in npt.stderr and "--backend cuda" in npt.stderr
    bad = run(*base, "--backend", "tpu")
    assert bad.returncode == 2 and "--backend 'tpu'" in bad.stderr
    for mode in (["--mode", "ar"], ["--mode", "tree", "--draft", DRAFT, "--budget", "8"]):
        r = run(*base, *mode, "--backend", "cuda", "--json")
        if r.returncode == 0:
            assert json.loads(r.stdout)["ids"] == cpu["ids"]
        else:
            assert r.returncode == 2, r.stderr
            assert "cuda" in r.stderr.lower(), r.stderr


SHIPPED_TARGET = os.path.join(ROOT, "models", "pystdlib-target")
SHIPPED_DRAFT = os.path.join(ROOT, "models", "pystdlib-dflash")


def test_cli_json_object():
    """--json-object: the answer is one JSON object ending at the EOS id, the same ids in ar, chain and
    tree (the mask is applied wherever the target chooses, so speculation stays lossless); a model
    without a tokenizer is refused with a message naming the flag."""
    eos = json.load(open(os.path.join(SHIPPED_TARGET, "config.json")))["eos_token_id"]
    for prompt in ["config = ", "import json\nresult = json.loads('", "def f(x):"]:
        base = ["--model", SHIPPED_TARGET, "--prompt", prompt, "--max-tokens", "96", "--json-object"]
        ar = gen_json(*base)
        for extra in (["--mode", "chain"], ["--mode", "tree", "--budget", "16"]):
            out = gen_json(*base, "--draft", SHIPPED_DRAFT, *extra)
            assert out["ids"] == ar["ids"], (prompt, extra)
        ids = ar["ids"]
        if ids and ids[-1] == eos:  # a complete document: everything before the EOS parses as an object
            text = ar["text"]
            body = text[: text.rindex("}") + 1]
            assert isinstance(json.loads(body), dict), text
            assert text[len(body):].strip() and "}" not in text[len(body):]  # only the EOS token's text
        else:
            assert len(ids) == 96  # cut by --max-tokens, never ended early without a whole object
    r = run("--model", TARGET, "--prompt-ids", "5,6", "--max-tokens", "4", "--json-object")
    assert r.returncode == 2 and "--json-object" in r.stderr, r.stderr


def test_cli_penalties():
    """--presence-penalty / --frequency-penalty / --repetition-penalty: the same ids in ar, chain and tree
    (the rules count each tree node's path), a different text than without them; values out of range
    are refused with exit status 2 naming the flag."""
    base = ["--model", SHIPPED_TARGET, "--prompt", "for i in range(10):\n    ", "--max-tokens", "64"]
    plain = gen_json(*base)
    pen = ["--frequency-penalty", "1.2", "--presence-penalty", "0.4", "--repetition-penalty", "1.1"]
    ar = gen_json(*base, *pen)
    assert ar["ids"] != plain["ids"]
    for extra in (["--mode", "chain"], ["--mode", "tree", "--budget", "16"]):
        assert gen_json(*base, *pen, "--draft", SHIPPED_DRAFT, *extra)["ids"] == ar["ids"], extra
    for flag, value in (("--presence-penalty", "2.5"), ("--frequency-penalty", "x"), ("--repetition-penalty", "0")):
        r = run("--model", TARGET, "--prompt-ids", "5,6", "--max-tokens", "4", flag, value)
        assert r.returncode == 2 and flag in r.stderr, r.stderr
