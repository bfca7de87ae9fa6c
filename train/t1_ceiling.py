#!/usr/bin/env python3
"""t1_ceiling.py — how much a DDTree round can accept at T = 1 on the shipped target with a perfect DFlash drafter.

A DFlash drafter gives one distribution per depth of the block (conditioned on the context and the
round's root token, not on the tokens it drafts before that depth), and DDTree builds its tree from
those per-depth tables: every node at depth d has the same candidate children, the ranks of table d+1.
A DFlash drafter's per-position loss is minimised by the target's own marginals of the token at
each depth: those are the tables of a perfect drafter (tables tuned to the tree's acceptance rule could
do a little better; no drafter of this kind is trained so).  This script estimates
them by sampling: at a context (a held-out prompt, continued at T = 1 by the target for `--offsets`
tokens, then one more sampled token as the round's root), it draws `--rollouts` continuations of the
block's depth with `ddtree generate --mode ar --temperature 1` (one seed each), builds the tables from
the first half (empirical frequencies), builds the best-first tree of each budget from them exactly as
DDTree does (node weight = the sum of log q over its path; children of a node at depth d = table d+1's
ranks), and walks the second half's continuations down the tree (sample-and-match: a round accepts the
longest prefix of the target's own samples that the tree holds, plus the bonus token).  The mean is an
estimate of the ceiling of mean acceptance at T = 1 for that budget: the held-out half keeps it honest
(an estimate from below: more rollouts sharpen the tables).

    python3 train/t1_ceiling.py --build build [--prompts 8] [--offsets 0,32,64] [--rollouts 300]

Prints, per budget, the ceiling and (from models/eval_results.json, when it has them) what the shipped
drafter gets at T = 1 with the C engine.  Needs only the shipped target and a built `ddtree`.
"""

import argparse
import heapq
import json
import math
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")


def generate_ids(exe, target, ids, n, seed, temperature):
    cmd = [exe, "generate", "--model", target, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(n),
           "--temperature", str(temperature), "--seed", str(seed), "--threads", "1", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"t1_ceiling.py: ddtree generate failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout)["ids"]


def encoder(target):
    """The prompts' tokenizer: the model folder's tiktoken ranks with Kimi's pattern (the C
    tokenizer gives the same ids: tests/python/test_tokenizer.py)."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    sys.path.insert(0, os.path.join(ROOT, "train"))
    from ddt_common import KIMI_PAT_STR
    ranks = load_tiktoken_bpe(os.path.join(target, "tiktoken.model"))
    return tiktoken.Encoding("ddt", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks, special_tokens={})


def build_tree(tables, budget):
    """Best-first tree over per-depth tables (lists of (token, logq), descending): a node is a tuple of
    ranks; its weight the sum of the logq of its ranks; children of a node at depth d are table d's
    ranks.  Returns the set of token paths (tuples of tokens) of the `budget` heaviest nodes."""
    depth = len(tables)
    nodes = set()
    heap = []
    if depth and tables[0]:
        heapq.heappush(heap, (-tables[0][0][1], (0,)))
    while heap and len(nodes) < budget:
        negw, ranks = heapq.heappop(heap)
        d = len(ranks)
        nodes.add(tuple(tables[i][r][0] for i, r in enumerate(ranks)))
        w = -negw
        # next sibling (same parent, next rank at this depth)
        r = ranks[-1]
        if r + 1 < len(tables[d - 1]):
            heapq.heappush(heap, (-(w - tables[d - 1][r][1] + tables[d - 1][r + 1][1]), ranks[:-1] + (r + 1,)))
        # first child
        if d < depth and tables[d]:
            heapq.heappush(heap, (-(w + tables[d][0][1]), ranks + (0,)))
    return nodes


def accept(nodes, cont):
    k = 0
    while k < len(cont) and tuple(cont[:k + 1]) in nodes:
        k += 1
    return k + 1  # the bonus token


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--target", default=os.path.join(MODELS, "pystdlib-target"))
    ap.add_argument("--prompts-in", default=os.path.join(MODELS, "heldout_prompts.json"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--offsets", default="0,32,64", help="tokens of T = 1 continuation before each context")
    ap.add_argument("--rollouts", type=int, default=300, help="continuations per context (half build, half eval)")
    ap.add_argument("--depth", type=int, default=15, help="the block's drafted depth (block size - 1)")
    ap.add_argument("--budgets", default="15,16,32,64,256")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    exe = os.path.join(args.build, "ddtree")
    if not os.path.isfile(exe):
        raise SystemExit(f"t1_ceiling.py: no ddtree executable at {exe}")
    if args.rollouts < 4 or args.depth < 1 or args.prompts < 1:
        raise SystemExit("t1_ceiling.py: --rollouts >= 4, --depth >= 1 and --prompts >= 1")
    offsets = [int(x) for x in args.offsets.split(",")]
    budgets = [int(x) for x in args.budgets.split(",")]
    with open(args.prompts_in) as f:
        texts = [p["text"] for p in json.load(f)["prompts"]][:args.prompts]

    pool = ThreadPoolExecutor(max_workers=args.jobs)
    enc = encoder(args.target)
    contexts = [(i, enc.encode(text)) for i, text in enumerate(texts)]
    results = {b: [] for b in budgets}
    per_context = []
    for i, base in contexts:
        # one T = 1 continuation per prompt gives the contexts at each offset, plus the root token
        cont = generate_ids(exe, args.target, base, max(offsets) + 1, 1000 + i, 1.0)
        for off in offsets:
            ctx = base + cont[:off + 1]  # the last one is the round's root (the bonus token)
            seeds = range(args.rollouts)
            rolls = list(pool.map(lambda s: generate_ids(exe, args.target, ctx, args.depth, 7919 * (i + 1) + s, 1.0),
                                  seeds))
            half = len(rolls) // 2
            build, held = rolls[:half], rolls[half:]
            tables = []
            for d in range(args.depth):
                c = Counter(r[d] for r in build if len(r) > d)
                tot = sum(c.values())
                tables.append(sorted(((t, math.log(n / tot)) for t, n in c.items()), key=lambda x: (-x[1], x[0])))
            row = {"prompt": i, "offset": off}
            chain = {tuple(t[0][0] for t in tables[:d + 1]) for d in range(args.depth) if all(tables[:d + 1])}
            acc = [accept(chain, r) for r in held]
            results.setdefault("chain", []).append(sum(acc) / len(acc))
            row["chain"] = round(results["chain"][-1], 3)
            for b in budgets:
                nodes = build_tree(tables, b)
                acc = [accept(nodes, r) for r in held]
                m = sum(acc) / len(acc)
                results[b].append(m)
                row[f"budget_{b}"] = round(m, 3)
            per_context.append(row)
            print(json.dumps(row), flush=True)
    summary = {(k if k == "chain" else f"budget_{k}"): round(sum(v) / len(v), 3) for k, v in results.items()}
    print("ceiling of mean acceptance at T = 1 (a perfect DFlash drafter: the target's marginals):", json.dumps(summary))
    ev = os.path.join(MODELS, "eval_results.json")
    if os.path.isfile(ev):
        s = json.load(open(ev)).get("summary", {})
        have = {k: s[k]["mean_acceptance"] for k in ("t1_chain", "t1_tree_16", "t1_tree_32") if k in s}
        if have:
            print("the shipped drafter at T = 1 (eval_results.json, C engine):", json.dumps(have))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rollouts": args.rollouts, "depth": args.depth, "offsets": offsets, "summary": summary,
                       "per_context": per_context}, f, indent=1)


if __name__ == "__main__":
    main()
