"""test_cli_tree.py — the `ddtree tree` command run as a subprocess: the README's input format
and output keys, trees and walks equal to the independent reference (ddtree_ref.py), --draw's
text shape, the chain, trees given directly, the auto budget with a cost model, and bad input
(not JSON, wrong types, wrong shapes, missing fields: {"error": ...} on stdout, exit 2; unknown
flags: a message on stderr, exit 2).

Every test name contains "cli": the sanitizer build runs `pytest -k cli`.  These tests use only
the command, never libddtree.so, so they run under AddressSanitizer as they are.
"""

import json
import os
import re
import subprocess

import numpy as np
import pytest

import ddtree_ref as ref
from conftest import quick


def run_cli(exe, stdin, *flags, timeout=60):
    # In a sanitizer build the command must also free everything on its error paths: turn leak
    # detection on for it (CI turns it off for the Python process itself, which is not
    # instrumented; a leak makes the command exit 23 instead of 0 or 2).
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=1:exitcode=23"
    p = subprocess.run([exe, "tree", *flags], input=stdin.encode() if isinstance(stdin, str) else stdin,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, env=env)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def f32_list(a):
    """Float32 values as JSON numbers that parse back to exactly the same float32."""
    return [[float(np.float32(x)) for x in row] for row in np.asarray(a, dtype=np.float32)]


def problem_json(logq, tokens, budget, root=0, **extra):
    obj = {"logq": f32_list(logq), "tokens": np.asarray(tokens).tolist(), "budget": budget, "root": root}
    obj.update(extra)
    return json.dumps(obj)


def run_ok(exe, stdin, *flags):
    rc, out, err = run_cli(exe, stdin, *flags)
    assert rc == 0, f"exit {rc}: stdout {out[:500]!r} stderr {err[:500]!r}"
    return out


def run_json_ok(exe, stdin):
    out = run_ok(exe, stdin)
    lines = out.strip().split("\n")
    assert len(lines) == 1, f"expected one JSON line, got {len(lines)}"
    return json.loads(lines[0])


def assert_cli_tree(got, want, what):
    assert got["tokens"] == want.tokens, f"{what}: tokens"
    assert got["parents"] == want.parents, f"{what}: parents"
    assert got["depth"] == want.depth, f"{what}: depth"
    gl = np.array(got["logw"], dtype=np.float64).astype(np.float32)
    wl = want.logw_f32()
    assert np.array_equal(gl.view(np.uint32), wl.view(np.uint32)), f"{what}: logw {gl} vs {wl}"


def run_json_error(exe, stdin, *flags):
    """Bad input: exit 2 and exactly {"error": "<non-empty message>"} on stdout."""
    rc, out, err = run_cli(exe, stdin, *flags)
    assert rc == 2, f"exit {rc} for bad input {stdin[:200]!r}: {out[:300]!r} stderr: {err[-1500:]}"
    lines = out.strip().split("\n")
    assert len(lines) == 1, f"stdout is not one line: {out!r}"
    obj = json.loads(lines[0])
    assert isinstance(obj, dict) and list(obj) == ["error"], f"not an error object: {obj!r}"
    assert isinstance(obj["error"], str) and obj["error"].strip(), obj
    return obj["error"]


def random_table(rng, D, K, V=None):
    z = rng.normal(0, rng.uniform(0.5, 4), (D, K + 8))
    ls = z - z.max(1, keepdims=True)
    ls -= np.log(np.exp(ls).sum(1, keepdims=True))
    logq = -np.sort(-ls, axis=1)[:, :K].astype(np.float32)
    if rng.random() < 0.3:  # exact ties
        logq = 0.0 - np.sort(rng.choice([0.0, 0.5, 1.0, 2.0], (D, K)), axis=1).astype(np.float32)
        # (0.0 - x, not -x: keeps 0 as +0.0; -0.0 is covered by test_tree_ref.py)
    V = V or K + 10
    tokens = np.argsort(rng.random((D, V)), axis=1)[:, :K].astype(np.int32)
    return logq, tokens, V


# ---------------------------------------------------------------------------- good input


def test_cli_example_problem(ddtree_exe, repo_root):
    """The shipped example: JSON keys as the README lists them, equal to the reference."""
    path = os.path.join(repo_root, "examples", "tree_problem.json")
    with open(path) as f:
        text = f.read()
    prob = json.loads(text)
    got = run_json_ok(ddtree_exe, text)
    assert set(got) == {"tokens", "parents", "depth", "logw", "accepted", "bonus"}
    want = ref.build_tree(prob["logq"], prob["tokens"], prob["budget"], prob["root"])
    assert_cli_tree(got, want, "example")
    path_, bonus = ref.walk(want.tokens, want.parents, prob["target_next"])
    assert got["accepted"] == path_ and got["bonus"] == bonus
    assert got["accepted"][0] == 0


def test_cli_random_problems_match_reference(ddtree_exe):
    n = 15 if quick() else 60
    walked = 0
    for i in range(n):
        rng = np.random.default_rng([77, i])
        D, K = int(rng.integers(1, 16)), int(rng.integers(1, 20))
        logq, tokens, V = random_table(rng, D, K)
        B = int(rng.integers(0, 300))
        root = int(rng.integers(0, V))
        extra = {}
        if rng.random() < 0.5:
            extra["vocab"] = V
        want = ref.build_tree(logq, tokens, B, root)
        walk = rng.random() < 0.6
        if walk:
            tn = [int(rng.integers(V)) for _ in range(want.n)]
            for j in range(want.n):  # follow the tree most of the time
                kids = [want.tokens[c] for c in range(1, want.n) if want.parents[c] == j]
                if kids and rng.random() < 0.8:
                    tn[j] = kids[int(rng.integers(len(kids)))]
            extra["target_next"] = tn
        got = run_json_ok(ddtree_exe, problem_json(logq, tokens, B, root, **extra))
        assert_cli_tree(got, want, f"problem {i}")
        if walk:
            path, bonus = ref.walk(want.tokens, want.parents, extra["target_next"])
            assert got["accepted"] == path and got["bonus"] == bonus, f"problem {i}: walk"
            walked += len(path) > 1
        else:
            assert set(got) == {"tokens", "parents", "depth", "logw"}
    assert walked > 0


def preorder(parents):
    kids = {}
    for i in range(1, len(parents)):
        kids.setdefault(parents[i], []).append(i)
    out, stack = [], [0]
    while stack:
        v = stack.pop()
        out.append(v)
        stack.extend(reversed(kids.get(v, [])))
    return out


def test_cli_draw_shape(ddtree_exe):
    """--draw: one line per node in depth-first order (children in index order), indented two
    spaces per depth, "[i] token t", the root marked (root), other nodes with logw; walked nodes
    start with "* " and a last line gives the accepted count and bonus."""
    rng = np.random.default_rng(5)
    logq, tokens, V = random_table(rng, 4, 3)
    want = ref.build_tree(logq, tokens, 12, 2)
    tn = [0] * want.n
    node = 0
    for _ in range(2):  # accept two levels
        kid = next(c for c in range(1, want.n) if want.parents[c] == node)
        tn[node] = want.tokens[kid]
        node = kid
    tn[node] = V + 5  # no child has it: the bonus
    path, bonus = ref.walk(want.tokens, want.parents, tn)
    for with_walk in (False, True):
        extra = {"target_next": tn} if with_walk else {}
        out = run_ok(ddtree_exe, problem_json(logq, tokens, 12, 2, **extra), "--draw")
        lines = out.rstrip("\n").split("\n")
        assert len(lines) == want.n + (1 if with_walk else 0), out
        for line, i in zip(lines, preorder(want.parents)):
            m = re.match(r"^( *)(\* )?\[(\d+)\] token (-?\d+)(.*)$", line)
            assert m, f"line {line!r}"
            assert len(m.group(1)) == 2 * want.depth[i], f"indent of node {i}: {line!r}"
            assert int(m.group(3)) == i and int(m.group(4)) == want.tokens[i], line
            assert bool(m.group(2)) == (with_walk and i in path), f"accepted mark: {line!r}"
            if i == 0:
                assert "(root)" in m.group(5)
            else:
                lw = re.search(r"logw (-?\d+\.\d{4})", m.group(5))
                assert lw and abs(float(lw.group(1)) - want.logw[i]) <= 5e-5, line
        if with_walk:
            assert re.fullmatch(rf"accepted {len(path)} node\(s\), bonus token {bonus}", lines[-1]), lines[-1]
    assert bonus == V + 5 and len(path) == 3


def test_cli_chain(ddtree_exe):
    rng = np.random.default_rng(6)
    for length in (0, 1, 5, 40):
        logq, tokens, V = random_table(rng, 9, 4)
        want = ref.build_chain(logq, tokens, length, 3)
        tn = [want.tokens[i + 1] if i + 1 < want.n else 1 for i in range(want.n)]
        got = run_json_ok(ddtree_exe, problem_json(logq, tokens, length, 3, chain=True, target_next=tn))
        assert_cli_tree(got, want, f"chain {length}")
        assert got["accepted"] == list(range(want.n)) and got["bonus"] == 1
    # chain false is an ordinary tree
    got = run_json_ok(ddtree_exe, problem_json(logq, tokens, 7, 3, chain=False))
    assert_cli_tree(got, ref.build_tree(logq, tokens, 7, 3), "chain false")


def test_cli_integer_logq_and_defaults(ddtree_exe):
    """JSON integers are numbers too; root defaults to 0; no walk without target_next."""
    got = run_json_ok(ddtree_exe, json.dumps({"logq": [[0, -1], [-2, -3]], "tokens": [[5, 6], [7, 8]],
                                              "budget": 3}))
    want = ref.build_tree([[0.0, -1.0], [-2.0, -3.0]], [[5, 6], [7, 8]], 3, 0)
    assert_cli_tree(got, want, "integer logq")
    assert set(got) == {"tokens", "parents", "depth", "logw"}


def test_cli_given_tree(ddtree_exe):
    tokens = [9, 4, 5, 6, 4, 7]
    parents = [-1, 0, 0, 1, 2, 3]
    want = ref.tree_from_parents(tokens, parents)
    for tn, vocab in (([4, 6, 0, 7, 0, 1], 10), ([5, 1, 4, 0, 2, 3], None), ([3, 3, 3, 3, 3, 3], None)):
        obj = {"tree": {"tokens": tokens, "parents": parents}, "target_next": tn}
        if vocab:
            obj["vocab"] = vocab
        got = run_json_ok(ddtree_exe, json.dumps(obj))
        assert got["tokens"] == tokens and got["parents"] == parents and got["depth"] == want.depth
        assert got["logw"] == [0.0] * len(tokens)
        path, bonus = ref.walk(tokens, parents, tn)
        assert got["accepted"] == path and got["bonus"] == bonus
    got = run_json_ok(ddtree_exe, json.dumps({"tree": {"tokens": [3], "parents": [-1]}}))
    assert got == {"tokens": [3], "parents": [-1], "depth": [0], "logw": [0.0]}


def cost_obj(rng, two_d):
    nodes = sorted(int(x) for x in rng.choice(np.arange(0, 1025), int(rng.integers(2, 6)), replace=False))
    a, b, c = rng.uniform(0.5, 3), rng.uniform(0.0, 0.05), rng.uniform(0, 1e-4)
    row = [float(np.float32(a + b * n + c * n * n)) for n in nodes]
    obj = {"draft": float(np.float32(rng.uniform(0.1, 4))), "nodes": nodes}
    if two_d:
        obj["contexts"] = [0, 4096]
        obj["verify"] = [row, [float(np.float32(v * 1.5)) for v in row]]
        obj["context_len"] = float(np.float32(rng.uniform(0, 6000)))
    else:
        obj["verify"] = row
    return obj


def test_cli_auto_budget_with_cost(ddtree_exe):
    """budget "auto": the node count where theta stops rising, capped by max_budget; every stop
    decision agrees with the float64 reference up to 1e-6 relative (a float32 near-tie)."""
    n = 8 if quick() else 30
    stops = 0
    for i in range(n):
        rng = np.random.default_rng([88, i])
        logq, tokens, V = random_table(rng, int(rng.integers(2, 16)), int(rng.integers(2, 24)))
        cost = cost_obj(rng, two_d=i % 2 == 1)
        extra = {"cost": cost}
        cap = 1024
        if rng.random() < 0.4:
            cap = int(rng.integers(0, 200))
            extra["max_budget"] = cap
        got = run_json_ok(ddtree_exe, problem_json(logq, tokens, "auto", 1, **extra))
        n_c = len(got["tokens"]) - 1
        cm = ref.CostModel(cost["draft"], cost["nodes"], cost["verify"], cost.get("contexts"),
                           cost.get("context_len", 0.0))
        full = ref.build_tree(logq, tokens, min(cap, n_c + 64), 1)
        gaps = ref.theta_gaps(full.logw[1:], cm)
        assert n_c <= cap
        assert all(g > -1e-6 for g in gaps[:n_c]), f"auto {i}: kept a node that lowers theta"
        if n_c < len(gaps):
            assert gaps[n_c] <= 1e-6, f"auto {i}: stopped at {n_c} though theta rises ({gaps[n_c]:.3g})"
        assert_cli_tree(got, full.truncated(n_c + 1), f"auto {i}")
        stops += 0 < n_c < min(cap, ref.table_size(*logq.shape))
    assert stops > 0


# ---------------------------------------------------------------------------- bad input

GOOD = {"logq": [[-0.1, -2.0], [-0.5, -1.0]], "tokens": [[1, 2], [3, 4]], "budget": 4, "root": 0}


def with_(**kw):
    obj = json.loads(json.dumps(GOOD))
    for k, v in kw.items():
        if v is KeyError:
            obj.pop(k, None)
        else:
            obj[k] = v
    return json.dumps(obj)


BAD_INPUTS = [
    # (name, stdin, a word the message must contain or None)
    ("empty", "", None),
    ("not json", "{logq: [[1]]", "JSON"),
    ("truncated json", json.dumps(GOOD)[:-5], "JSON"),
    ("array", "[1, 2, 3]", "object"),
    ("string", '"hello"', "expected"),
    ("missing logq", with_(logq=KeyError), "logq"),
    ("missing tokens", with_(tokens=KeyError), "tokens"),
    ("missing budget", with_(budget=KeyError), "budget"),
    ("logq not array", with_(logq="x"), "logq"),
    ("logq empty", with_(logq=[], tokens=[]), "logq"),
    ("logq row empty", with_(logq=[[]], tokens=[[]]), "logq"),
    ("logq ragged", with_(logq=[[-0.1, -2.0], [-0.5]]), "logq[1]"),
    ("logq string entry", with_(logq=[[-0.1, "a"], [-0.5, -1.0]]), "logq[0][1]"),
    ("logq null entry", with_(logq=[[-0.1, None], [-0.5, -1.0]]), "logq[0][1]"),
    ("logq row not array", with_(logq=[-0.1, -2.0]), "logq"),
    ("tokens float", with_(tokens=[[1, 2.5], [3, 4]]), "tokens[0][1]"),
    ("tokens huge", with_(tokens=[[1, 2], [3, 2 ** 40]]), "tokens[1][1]"),
    ("shape mismatch", with_(tokens=[[1, 2]]), "tokens"),
    ("shape mismatch cols", with_(tokens=[[1, 2, 3], [4, 5, 6]]), "tokens"),
    ("too deep", with_(logq=[[-1.0]] * 32, tokens=[[1]] * 32), "32"),
    ("too wide", with_(logq=[[-1.0] * 1025], tokens=[list(range(1025))]), "1025"),
    ("budget float", with_(budget=3.5), "budget"),
    ("budget string", with_(budget="many"), "budget"),
    ("budget bool", with_(budget=True), "budget"),
    ("budget negative", with_(budget=-1), "budget"),
    ("budget too big", with_(budget=1025), "budget"),
    ("root string", with_(root="0"), "root"),
    ("root out of vocab", with_(root=9, vocab=5), "root"),
    ("chain not bool", with_(chain="yes"), "chain"),
    ("chain auto", with_(chain=True, budget="auto"), "auto"),
    ("auto without cost", with_(budget="auto"), "cost"),
    ("cost not object", with_(budget="auto", cost=[1]), "cost"),
    ("cost missing nodes", with_(budget="auto", cost={"draft": 1.0, "verify": [1.0]}), "nodes"),
    ("cost bad verify len", with_(budget="auto", cost={"draft": 1.0, "nodes": [0, 10], "verify": [1.0]}), "verify"),
    ("cost verify zero", with_(budget="auto", cost={"draft": 1.0, "nodes": [0, 10], "verify": [1.0, 0.0]}), "verify"),
    ("cost nodes unsorted", with_(budget="auto", cost={"draft": 1.0, "nodes": [10, 0], "verify": [1.0, 2.0]}), "nodes"),
    ("cost draft string", with_(budget="auto", cost={"draft": "1", "nodes": [0], "verify": [1.0]}), "draft"),
    ("cost verify entry string", with_(budget="auto", cost={"draft": 1.0, "nodes": [0, 10], "verify": [1.0, "x"]}), "verify[1]"),
    ("cost 2d verify entry string", with_(budget="auto", cost={"draft": 1.0, "nodes": [0, 10], "contexts": [0], "verify": [[1.0, "x"]]}), "verify[0][1]"),
    ("cost 2d verify row not array", with_(budget="auto", cost={"draft": 1.0, "nodes": [0, 10], "contexts": [0], "verify": [1.0]}), "verify[0]"),
    ("cost 2d short row", with_(budget="auto", cost={"draft": 1.0, "nodes": [0, 10], "contexts": [0, 5], "verify": [[1.0, 2.0], [1.0]]}), "verify[1]"),
    ("cost nodes empty", with_(budget="auto", cost={"draft": 1.0, "nodes": [], "verify": []}), "nodes"),
    ("cost 2d wrong rows", with_(budget="auto", cost={"draft": 1.0, "nodes": [0], "contexts": [0, 10], "verify": [[1.0]]}), "verify"),
    ("max_budget too big", with_(budget="auto", cost={"draft": 1.0, "nodes": [0], "verify": [1.0]}, max_budget=5000), "max_budget"),
    ("vocab zero", with_(vocab=0), "vocab"),
    ("vocab string", with_(vocab="big"), "vocab"),
    ("token out of vocab", with_(vocab=4), "[1][1]"),
    ("negative token", with_(tokens=[[1, -2], [3, 4]]), "[0][1]"),
    ("unsorted row", with_(logq=[[-0.1, -2.0], [-1.0, -0.5]]), "row 1"),
    ("logq +inf after float cast", with_(logq=[[1e39, -2.0], [-0.5, -1.0]]), "inf"),
    ("duplicate tokens used", with_(tokens=[[1, 1], [3, 4]]), "row 0"),
    ("target_next too short", with_(target_next=[1, 2]), "target_next"),
    ("target_next not array", with_(target_next=5), "target_next"),
    ("target_next string", with_(target_next=["a", 0, 0, 0, 0]), "target_next[0]"),
    ("target_next out of vocab", with_(vocab=5, target_next=[1, 2, 3, 4, 9]), "target_next[4]"),
    ("tree not object", json.dumps({"tree": [1, 2]}), "tree"),
    ("tree missing parents", json.dumps({"tree": {"tokens": [1, 2]}}), "parents"),
    ("tree length mismatch", json.dumps({"tree": {"tokens": [1, 2], "parents": [-1]}}), "tree"),
    ("tree empty", json.dumps({"tree": {"tokens": [], "parents": []}}), "root"),
    ("tree bad root", json.dumps({"tree": {"tokens": [1, 2], "parents": [0, 0]}}), "node 0"),
    ("tree parent after", json.dumps({"tree": {"tokens": [1, 2, 3], "parents": [-1, 2, 0]}}), "node 1"),
    ("tree parent -2", json.dumps({"tree": {"tokens": [1, 2, 3], "parents": [-1, 0, -2]}}), "node 2"),
    ("tree dup siblings", json.dumps({"tree": {"tokens": [1, 2, 2], "parents": [-1, 0, 0]}}), "token 2"),
    ("tree too deep", json.dumps({"tree": {"tokens": list(range(33)), "parents": list(range(-1, 32))}}), "node 32"),
    ("tree too big", json.dumps({"tree": {"tokens": [0] * 1026, "parents": [-1] + [0] * 1025}}), "1026"),
]


@pytest.mark.parametrize("name,stdin,word", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_cli_bad_input(ddtree_exe, name, stdin, word):
    msg = run_json_error(ddtree_exe, stdin)
    if word is not None:
        assert word in msg, f"{name}: message {msg!r} does not mention {word!r}"
    # --draw reports errors the same way
    assert run_json_error(ddtree_exe, stdin, "--draw") == msg


def test_cli_binary_garbage(ddtree_exe):
    rng = np.random.default_rng(3)
    for i in range(5 if quick() else 20):
        blob = rng.integers(0, 256, int(rng.integers(1, 400)), dtype=np.uint8).tobytes()
        rc, out, err = run_cli(ddtree_exe, blob)
        assert rc == 2 and "error" in json.loads(out), (i, out, err)


def test_cli_unknown_flag(ddtree_exe):
    for flag in ("--bogus", "-x", "--draw=1", "extra"):
        rc, out, err = run_cli(ddtree_exe, json.dumps(GOOD), flag)
        assert rc == 2, f"{flag}: exit {rc}"
        assert flag in err and "usage" in err, f"{flag}: stderr {err!r}"
        assert out == "", f"{flag}: stdout {out!r}"


def test_cli_help(ddtree_exe):
    for flag in ("--help", "-h"):
        rc, out, err = run_cli(ddtree_exe, "", flag)
        assert rc == 0 and out.startswith("usage: ddtree tree") and "--draw" in out
