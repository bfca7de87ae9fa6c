#!/usr/bin/env python3
"""evaluate.py — measure the shipped pair with the C engine on held-out prompts.

    python3 train/evaluate.py --build build-train [--prompts 16] [--max-tokens 128] [--t1-seeds 2]
    python3 train/evaluate.py --build build --drafter DIR --prompts-in models/heldout_prompts.json \
        --results-out /tmp/eval.json          # a drafter on the shipped prompts, no training data needed

Prompts: from the held-out files (manifest order), one per file: the 4 lines starting at the first line
beginning with "def " or "    def " that lies at least 30 % into the file.  They are written to
models/heldout_prompts.json (the test tests/python/test_shipped_models.py uses the first 3).

For every prompt, `ddtree generate --json` runs greedy ar, chain, and tree at budgets 16, 32, 64 and auto
(the greedy trees under the drafter folder's draft calibration when it has one, as generate does by
default; --calibration none measures the drafter's own q);
the speculative outputs must equal ar's ids; the mean acceptance length (tokens committed per round,
bonus included) is averaged over prompts (each prompt weighted by its rounds: total tokens / total
rounds) and written to models/eval_results.json.

At T = 1 (--t1-seeds N, default 2; 0: none) chain and tree at budgets 16 and 32 run with seeds 0..N-1
and their mean acceptance goes to the summary as t1_chain, t1_tree_16, t1_tree_32: the number a drafter
trained for sampling should raise (issue 13's T = 1 target).  Sampled outputs are not compared with
ar's: sample-and-match keeps the target's distribution, not a given seed's tokens (tests/python and
the GPU tests check the distribution).
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddt_common as C  # noqa: E402
from prepare_data import read_split  # noqa: E402

MODES = {"chain": ["--mode", "chain"], "tree_16": ["--mode", "tree", "--budget", "16"],
         "tree_32": ["--mode", "tree", "--budget", "32"], "tree_64": ["--mode", "tree", "--budget", "64"],
         "tree_auto": ["--mode", "tree", "--budget", "auto"]}
T1_MODES = {"t1_chain": ["--mode", "chain"], "t1_tree_16": ["--mode", "tree", "--budget", "16"],
            "t1_tree_32": ["--mode", "tree", "--budget", "32"]}


def pick_prompts(manifest, n):
    out = []
    for path, text in read_split(manifest, "heldout"):
        lines = text.split("\n")
        start = int(len(lines) * 0.3)
        k = next((i for i in range(start, len(lines) - 4)
                  if lines[i].startswith("def ") or lines[i].startswith("    def ")), None)
        if k is None:
            continue
        out.append({"file": path, "line": k + 1, "text": "\n".join(lines[k:k + 4]) + "\n"})
        if len(out) == n:
            break
    return out


def read_prompts(path):
    """The prompts of a file --prompts-out wrote (a clear error for anything else)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"evaluate.py: --prompts-in {path}: {e}")
    prompts = doc.get("prompts") if isinstance(doc, dict) else None
    if not isinstance(prompts, list) or not prompts or not all(
            isinstance(p, dict) and isinstance(p.get("text"), str) and p["text"] for p in prompts):
        raise SystemExit(f"evaluate.py: --prompts-in {path}: expected {{\"prompts\": [{{\"text\": \"...\"}}, ...]}} "
                         "with at least one non-empty text")
    return [{"file": p.get("file", f"prompt {i}"), "line": p.get("line", 0), "text": p["text"]}
            for i, p in enumerate(prompts)]


def generate(exe, target, drafter, prompt, max_tokens, extra, threads, calibration=None, no_lookup=False):
    cmd = [exe, "generate", "--model", target, "--prompt", prompt, "--max-tokens", str(max_tokens), "--json",
           "--threads", str(threads)]
    if extra:
        cmd += ["--draft", drafter] + extra
        if calibration:
            cmd += ["--calibration", calibration]
        if no_lookup:
            cmd += ["--no-lookup"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:8])}...: exit {r.returncode}: {r.stderr}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(C.ROOT, "build-train"))
    ap.add_argument("--data", default=C.DATA_DIR)
    ap.add_argument("--target", default=C.TARGET_DIR)
    ap.add_argument("--drafter", default=C.DRAFTER_DIR)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--t1-seeds", type=int, default=2, help="seeds of the T = 1 pass (0: no T = 1 pass)")
    ap.add_argument("--prompts-in", default=None,
                    help="read the prompts from this JSON ({\"prompts\": [{\"text\": ...}]}, as --prompts-out "
                         "writes) instead of picking them from --data; nothing is written to --prompts-out")
    ap.add_argument("--prompts-out", default=os.path.join(C.MODELS_DIR, "heldout_prompts.json"))
    ap.add_argument("--results-out", default=os.path.join(C.MODELS_DIR, "eval_results.json"))
    ap.add_argument("--no-lookup", action="store_true",
                    help="graft no context-lookup path onto the greedy trees (ddtree generate --no-lookup)")
    ap.add_argument("--calibration", default=None,
                    help="the draft calibration the greedy trees use (FILE or none; default: the drafter folder's "
                         "draft_calibration.json when it has one, as ddtree generate does)")
    args = ap.parse_args()
    exe = os.path.join(args.build, "ddtree")
    if not os.path.isfile(exe):
        raise SystemExit(f"evaluate.py: no ddtree executable at {exe} (build first, or pass --build)")
    if args.t1_seeds < 0:
        raise SystemExit(f"evaluate.py: --t1-seeds {args.t1_seeds}: must be >= 0")
    if args.prompts_in:
        prompts = read_prompts(args.prompts_in)[:args.prompts]
    else:
        manifest = C.read_json(os.path.join(args.data, "manifest.json"))
        prompts = pick_prompts(manifest, args.prompts)
        C.write_json(args.prompts_out, {
            "what": "held-out prompts: 4 lines from a held-out stdlib file, starting at the first def at >= 30% "
                    "of the file (train/evaluate.py)", "prompts": prompts})
    t1 = T1_MODES if args.t1_seeds > 0 else {}
    totals = {m: {"tokens": 0, "rounds": 0, "seconds": 0.0} for m in ["ar", *MODES, *t1]}
    per_prompt = []
    for p in prompts:
        ar = generate(exe, args.target, args.drafter, p["text"], args.max_tokens, None, args.threads)
        row = {"file": p["file"], "ar_text": ar["text"]}
        totals["ar"]["tokens"] += ar["stats"]["tokens"]
        totals["ar"]["rounds"] += ar["stats"]["rounds"]
        totals["ar"]["seconds"] += ar["stats"]["seconds"]["total"]
        for name, extra in MODES.items():
            out = generate(exe, args.target, args.drafter, p["text"], args.max_tokens, extra, args.threads,
                           args.calibration, args.no_lookup)
            if out["ids"] != ar["ids"]:
                raise SystemExit(f"{name} output differs from ar on {p['file']}")
            st = out["stats"]
            row[name] = round(st["mean_acceptance"], 3)
            totals[name]["tokens"] += st["tokens"]
            totals[name]["rounds"] += st["rounds"]
            totals[name]["seconds"] += st["seconds"]["total"]
        for name, extra in t1.items():
            acc = []
            for seed in range(args.t1_seeds):
                out = generate(exe, args.target, args.drafter, p["text"], args.max_tokens,
                               extra + ["--temperature", "1", "--seed", str(seed)], args.threads, args.calibration,
                               args.no_lookup)
                st = out["stats"]
                acc.append(st["mean_acceptance"])
                totals[name]["tokens"] += st["tokens"]
                totals[name]["rounds"] += st["rounds"]
                totals[name]["seconds"] += st["seconds"]["total"]
            row[name] = round(sum(acc) / len(acc), 3)
        per_prompt.append(row)
        print(p["file"], {k: v for k, v in row.items() if k not in ("file", "ar_text")}, flush=True)
    summary = {m: {"mean_acceptance": round(t["tokens"] / max(1, t["rounds"]), 3),
                   "tokens_per_s": round(t["tokens"] / max(1e-9, t["seconds"]), 1)} for m, t in totals.items()}
    # Acceptance counts the tokens committed per round; the first token comes from the prefill.
    cal = args.calibration or os.path.join(args.drafter, "draft_calibration.json")
    calibrated = cal != "none" and os.path.isfile(cal)
    C.write_json(args.results_out, {"max_tokens": args.max_tokens, "threads": args.threads,
                                    "n_prompts": len(prompts), "t1_seeds": args.t1_seeds,
                                    "calibration": os.path.relpath(cal, C.ROOT) if calibrated else None,
                                    "lookup": calibrated and not args.no_lookup,
                                    "summary": summary,
                                    "per_prompt": per_prompt})
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
