"""The shipped model pair in models/ (trained by train/, see models/README.md): it loads in the C engine,
greedy `tree` (budgets 8, 64, auto) and `chain` decoding print exactly the ids of greedy `ar` on held-out
prompts, the trained drafter is accepted (mean acceptance length of the tree > 1.5 tokens per round), and
the folder stays within its size limit, and the chain acceptance that train/train_drafter.py reports
(ddt_common.chain_walk over per-anchor acceptances) is the one the engine measures.  Runs `ddtree
generate` as a subprocess; needs DDT_BUILD_DIR."""

import json
import os
import subprocess
import sys

import pytest

from ddt_paths import ddtree_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "train"))
import ddt_common  # noqa: E402
MODELS = os.path.join(ROOT, "models")
TARGET = os.path.join(MODELS, "pystdlib-target")
DRAFTER = os.path.join(MODELS, "pystdlib-dflash")
MAX_BYTES = 32 * 1000 * 1000
N_TOKENS = 48


def prompts():
    with open(os.path.join(MODELS, "heldout_prompts.json"), encoding="utf-8") as f:
        return [p["text"] for p in json.load(f)["prompts"][:3]]


def gen_json(*args):
    r = subprocess.run([ddtree_path(), "generate", "--model", TARGET, "--json", "--threads", "2", *args],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_models_folder_size():
    total = 0
    for dirpath, _, files in os.walk(MODELS):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    assert total <= MAX_BYTES, f"models/ holds {total} bytes, over {MAX_BYTES}"


def test_pair_configs_agree():
    with open(os.path.join(TARGET, "config.json")) as f:
        t = json.load(f)
    with open(os.path.join(DRAFTER, "config.json")) as f:
        d = json.load(f)
    assert t["architectures"] == ["DeepseekV3ForCausalLM"]
    assert d["architectures"] == ["DFlashDraftModel"]
    assert d["hidden_size"] == t["hidden_size"]
    assert d["num_target_layers"] == t["num_hidden_layers"]
    assert d["vocab_size"] == t["vocab_size"]
    assert all(0 <= i < t["num_hidden_layers"] for i in d["dflash_config"]["target_layer_ids"])
    assert os.path.exists(os.path.join(TARGET, "tiktoken.model"))
    assert len(prompts()) == 3


@pytest.mark.parametrize("index", [0, 1, 2])
def test_speculative_equals_ar_and_drafter_is_accepted(index):
    prompt = prompts()[index]
    base = ["--prompt", prompt, "--max-tokens", str(N_TOKENS)]
    ar = gen_json(*base)
    assert len(ar["ids"]) == N_TOKENS
    assert ar["stats"]["mean_acceptance"] == pytest.approx(1.0)
    assert ar["stats"]["expected_acceptance"] == 0.0  # no drafter, no forecast
    # The trained target writes Python: its continuation decodes to text that is not one repeated byte.
    assert len(set(ar["text"])) > 5, ar["text"]
    tree_acceptance = {}
    for extra in (["--mode", "chain"], ["--mode", "tree", "--budget", "8"], ["--mode", "tree", "--budget", "64"],
                  ["--mode", "tree", "--budget", "auto"]):
        out = gen_json(*base, "--draft", DRAFTER, *extra)
        assert out["ids"] == ar["ids"], extra
        st = out["stats"]
        if extra[-1] == "auto":  # the cost model the stop rule weighs, as measured at create
            cm = st["cost_model"]
            assert cm["draft"] > 0 and len(cm["verify"]) == len(cm["nodes"]) * cm["contexts"] >= 1, cm
            assert all(b > a for a, b in zip(cm["nodes"], cm["nodes"][1:])), cm
        else:
            assert "cost_model" not in st, st
        assert st["tokens"] == N_TOKENS and st["rounds"] >= 1
        if extra[-1] in ("8", "64"):
            tree_acceptance[extra[-1]] = st["mean_acceptance"]
            # the drafter's forecast: the bonus plus each node's path probability, so above 1 and
            # below the nodes a round verifies
            assert 1.0 < st["expected_acceptance"] < int(extra[-1]) + 1, st
        if extra[-1] == "64":  # more nodes, more forecast acceptance
            assert st["expected_acceptance"] > forecast_8, (st, forecast_8)
        if extra[-1] == "8":
            forecast_8 = st["expected_acceptance"]
    # A trained drafter must get more than the bonus token accepted per round on average.
    assert tree_acceptance["64"] > 1.5, tree_acceptance
    assert tree_acceptance["8"] > 1.5, tree_acceptance


def test_chain_walk_counts_rounds_not_anchors():
    # Rounds start at 0, then where the last one ended: 0 (1 token), 1 (3), 4 (1), 5 (2); 7 is past the end.
    assert ddt_common.chain_walk([1, 3, 9, 9, 1, 2, 2]) == (7, 4)
    # One round crosses a run of easy anchors: 17 tokens in 2 rounds, although the anchor mean is 14.1.
    assert ddt_common.chain_walk([1] + [16] * 16) == (17, 2)
    assert ddt_common.chain_walk([]) == (0, 0)
    with pytest.raises(ValueError):
        ddt_common.chain_walk([1, 0, 1])


def test_training_chain_acceptance_is_the_engines():
    """train_drafter.py measures acc[j] (the tokens one greedy chain round anchored at generated token j
    commits) for every j and reports chain_walk(acc).  Measure acc[j] with the engine itself (prompt +
    the first j greedy tokens, one round) and check that chain_walk gives the engine's own rounds and
    committed tokens over the whole continuation."""
    seed = gen_json("--prompt", prompts()[0], "--max-tokens", "12")["ids"]
    n = 24
    ids_arg = lambda ids: ",".join(str(t) for t in ids)  # noqa: E731
    greedy = gen_json("--prompt-ids", ids_arg(seed), "--max-tokens", str(n))["ids"]
    chain = gen_json("--prompt-ids", ids_arg(seed), "--max-tokens", str(n), "--draft", DRAFTER, "--mode", "chain")
    assert chain["ids"] == greedy
    acc = []
    for j in range(n - 1):
        one = gen_json("--prompt-ids", ids_arg(seed + greedy[:j]), "--max-tokens", "2", "--draft", DRAFTER,
                       "--mode", "chain")
        assert one["ids"][0] == greedy[j] and one["stats"]["rounds"] == 1
        acc.append(round(one["stats"]["mean_acceptance"]))
    tokens, rounds = ddt_common.chain_walk(acc)
    st = chain["stats"]
    assert rounds == st["rounds"], (acc, st)
    assert tokens == round(st["mean_acceptance"] * st["rounds"]), (acc, st)
