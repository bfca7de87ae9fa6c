"""train/t1_ceiling.py: its best-first tree over per-depth tables is the engine's (the same node set as
`ddtree tree` on random tables with distinct weights, budgets 1..40), its walk accepts the longest
prefix the tree holds plus the bonus token, and a short run on the shipped target prints a ceiling for
every budget, non-decreasing in the budget.  Needs DDT_BUILD_DIR."""

import json
import os
import random
import subprocess
import sys

from ddt_paths import build_dir, ddtree_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "train"))
import t1_ceiling  # noqa: E402


def engine_paths(tables, budget, root=7):
    """The token paths (root excluded) of the C builder's tree."""
    prob = {"logq": [[w for _, w in row] for row in tables], "tokens": [[t for t, _ in row] for row in tables],
            "budget": budget, "root": root}
    r = subprocess.run([ddtree_path(), "tree"], input=json.dumps(prob), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    toks, parents = out["tokens"], out["parents"]
    paths = set()
    for i in range(1, len(toks)):
        p, j = [], i
        while j > 0:
            p.append(toks[j])
            j = parents[j]
        paths.add(tuple(reversed(p)))
    return paths


def test_tree_matches_engine():
    rng = random.Random(5)
    for case in range(40):
        depth, k = rng.randint(1, 6), rng.randint(1, 6)
        tables = []
        for d in range(depth):
            ws = sorted((-rng.uniform(0.01, 4.0) for _ in range(k)), reverse=True)
            toks = rng.sample(range(100 * d, 100 * d + 50), k)
            tables.append(list(zip(toks, ws)))
        budget = rng.randint(1, 40)
        assert t1_ceiling.build_tree(tables, budget) == engine_paths(tables, budget), (case, depth, k, budget)


def test_accept_is_longest_prefix_plus_bonus():
    nodes = {(1,), (1, 2), (1, 2, 3), (4,)}
    assert t1_ceiling.accept(nodes, [1, 2, 3, 9]) == 4
    assert t1_ceiling.accept(nodes, [1, 5]) == 2
    assert t1_ceiling.accept(nodes, [4, 2]) == 2
    assert t1_ceiling.accept(nodes, [9]) == 1


def test_short_run_prints_ceilings(tmp_path):
    out = tmp_path / "c.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train", "t1_ceiling.py"), "--build", build_dir(),
                        "--prompts", "1", "--offsets", "0", "--rollouts", "24", "--depth", "4", "--budgets", "1,4,16",
                        "--jobs", "2", "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    s = json.loads(out.read_text())["summary"]
    assert set(s) == {"chain", "budget_1", "budget_4", "budget_16"}
    assert 1.0 <= s["budget_1"] <= s["budget_4"] <= s["budget_16"] <= 5.0, s
