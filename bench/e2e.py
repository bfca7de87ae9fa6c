#!/usr/bin/env python3
"""End-to-end decoding benchmark: `ddtree generate` in ar, chain and tree modes (budgets 8..256
and auto) at T = 0 and T = 1 on held-out prompts, on the machine it runs on, with Hugging Face
transformers' `generate` on the same target (and the same machine) as the PyTorch baseline.
Prints a Markdown table (tokens/s, speed-up over ar, mean acceptance length, time per phase)
and writes a PNG plot of speed-up against budget.

    python3 bench/e2e.py --build build --model models/X --draft models/Y \
        --prompts models/heldout_prompts.json --max-tokens 128 --out-md e2e.md --out-png e2e.png
    (on the GPU: --build build-gpu --backend cuda, after scripts/gpu-test.sh build)

Needs the built `ddtree`; the baseline needs torch + transformers (skipped with --no-hf, and
the table says so); the plot needs matplotlib.  Python drives the binary here and measures;
nothing of it is on the inference path."""

import argparse
import json
import os
import subprocess
import sys
import time


def run_generate(args, prompt, mode, budget, temperature, seed):
    cmd = [os.path.join(args.build, "ddtree"), "generate", "--model", args.model, "--max-tokens",
           str(args.max_tokens), "--json", "--mode", mode, "--temperature", str(temperature), "--seed", str(seed)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.backend != "cpu":
        cmd += ["--backend", args.backend]
    if mode != "ar":
        cmd += ["--draft", args.draft]
    if mode == "tree":
        cmd += (["--budget", "auto", "--max-budget", str(args.max_auto_budget)] if budget == "auto"
                else ["--budget", str(budget)])
    cmd += ["--prompt-ids", ",".join(map(str, prompt))] if isinstance(prompt, list) else ["--prompt", prompt]
    cmd += args.extra_args.split()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"e2e: {' '.join(cmd)} failed:\n{r.stderr}")
    return json.loads(r.stdout)


def aggregate(outs):
    tokens = sum(max(o["stats"]["tokens"] - 1, 0) for o in outs)  # the first token comes from the prompt pass
    decode = sum(o["stats"]["seconds"]["total"] - o["stats"]["seconds"]["prefill"] for o in outs)
    rounds = sum(o["stats"]["rounds"] for o in outs)
    acc = sum(o["stats"]["mean_acceptance"] * o["stats"]["rounds"] for o in outs)
    phases = {p: sum(o["stats"]["seconds"][p] for o in outs) for p in ("draft", "build", "verify", "walk", "commit")}
    kernels = max((o["stats"].get("round_kernels", 0) for o in outs), default=0)
    lookup = sum(o["stats"].get("lookup_nodes", 0) for o in outs)  # nodes the context lookup grafted
    return {"tps": tokens / decode if decode > 0 else 0.0, "tau": acc / rounds if rounds else 0.0,
            "phases": phases, "decode": decode, "kernels": kernels, "lookup": lookup / rounds if rounds else 0.0}


def encode(model_dir, prompt):
    """Token ids of a prompt with the model folder's tiktoken ranks and Kimi's pattern (the
    C tokenizer gives the same ids: tests/python/test_tokenizer.py)."""
    if isinstance(prompt, list):
        return prompt
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train"))
    from ddt_common import KIMI_PAT_STR
    ranks = load_tiktoken_bpe(os.path.join(model_dir, "tiktoken.model"))
    enc = tiktoken.Encoding("ddt", pat_str=KIMI_PAT_STR, mergeable_ranks=ranks, special_tokens={})
    return enc.encode(prompt)


def hf_baseline(args, prompts):
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        return None, f"not run: {e}"
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.bfloat16).to(dev).eval()
    total, secs = 0, 0.0
    for p in prompts:
        ids = torch.tensor([p], device=dev)
        model.generate(ids, max_new_tokens=4, do_sample=False)  # warm-up
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.time()
        out = model.generate(ids, max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens, do_sample=False)
        if dev == "cuda":
            torch.cuda.synchronize()
        secs += time.time() - t0
        total += out.shape[1] - len(p)
    return total / secs, f"transformers {__import__('transformers').__version__}, bf16, {dev}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompts", required=True, help="JSON list of token-id lists (or of strings)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--backend", default="cpu", help="cpu or cuda (ddtree generate --backend)")
    ap.add_argument("--budgets", default="8,16,32,64,128,256,auto")
    ap.add_argument("--max-auto-budget", type=int, default=32)  # the CLI default (ddtree generate)
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--n-prompts", type=int, default=0, help="use the first N prompts (0 = all)")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--extra-args", default="", help="more `ddtree generate` flags for every run (e.g. --no-pdl)")
    ap.add_argument("--out-md")
    ap.add_argument("--out-png")
    ap.add_argument("--replot", metavar="MD", help="only redraw --out-png from a table --out-md saved")
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--replot")
    pre.add_argument("--out-png")
    known, _ = pre.parse_known_args()
    if known.replot:
        if not known.out_png:
            ap.error("--replot needs --out-png")
        replot(known.replot, known.out_png)
        return
    args = ap.parse_args()
    with open(args.prompts) as f:
        prompts = json.load(f)
    if isinstance(prompts, dict):  # models/heldout_prompts.json: {"prompts": [{"text": ...}, ...]}
        prompts = [p["text"] for p in prompts["prompts"]]
    if args.n_prompts:
        prompts = prompts[:args.n_prompts]
    budgets = [b if b == "auto" else int(b) for b in args.budgets.split(",")]
    temps = [float(t) for t in args.temperatures.split(",")]
    rows, curves = [], {}
    for t in temps:
        configs = [("ar", None), ("chain", None)] + [("tree", b) for b in budgets]
        base = None
        for mode, b in configs:
            outs = [run_generate(args, p, mode, b, t, 1 + i) for i, p in enumerate(prompts)]
            a = aggregate(outs)
            if mode == "ar":
                base = a["tps"]
            a.update(mode=mode, budget=b, temp=t, speedup=a["tps"] / base if base else 0.0)
            rows.append(a)
            if mode == "tree":
                curves.setdefault(t, []).append((b, a["speedup"]))
            print(f"T={t} {mode} {b if b is not None else ''}: {a['tps']:.1f} tokens/s, x{a['speedup']:.2f}, "
                  f"tau {a['tau']:.2f}", file=sys.stderr)
    hf_tps, hf_note = (None, "not run (--no-hf)") if args.no_hf else hf_baseline(args, [encode(args.model, p) for p in prompts])
    lines = [f"{len(prompts)} held-out prompts, {args.max_tokens} new tokens each; tokens/s counts decode "
             "(prompt pass excluded).", "",
             "| T | mode | budget | tokens/s | speed-up vs ar | mean acceptance | lookup nodes per round | "
             "kernels per round | draft s | build s | verify s | walk s | commit s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ph = r["phases"]
        lines.append(f"| {r['temp']:g} | {r['mode']} | {r['budget'] if r['budget'] is not None else '-'} | "
                     f"{r['tps']:.1f} | {r['speedup']:.2f} | {r['tau']:.2f} | {r['lookup']:.2f} | "
                     f"{r.get('kernels') or '-'} | "
                     f"{ph['draft']:.3f} | {ph['build']:.3f} | "
                     f"{ph['verify']:.3f} | {ph['walk']:.3f} | {ph['commit']:.3f} |")
    ar0 = next(r["tps"] for r in rows if r["mode"] == "ar" and r["temp"] == temps[0])
    lines += ["", f"Hugging Face generate baseline: " + (f"{hf_tps:.1f} tokens/s ({hf_note}); ar is "
              f"{ar0 / hf_tps:.1f}x faster" if hf_tps else hf_note)]
    md = "\n".join(lines)
    print(md)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write(md + "\n")
    if args.out_png:
        plot(rows, curves, args.out_png)


def plot(rows, curves, path):
    """Speed-up over ar against the tree budget, one colour per temperature: the fixed budgets
    as points, auto dashed and chain dotted in the same colour, ar at 1."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ticks = set()
    for t, pts in curves.items():
        fixed = [(b, s) for b, s in pts if b != "auto"]
        ticks.update(b for b, _ in fixed)
        line, = ax.plot([b for b, _ in fixed], [s for _, s in fixed], marker="o", label=f"tree, T={t:g}")
        for b, s in pts:
            if b == "auto":
                ax.axhline(s, linestyle="--", linewidth=1, color=line.get_color(), label=f"tree auto, T={t:g}")
        chain = next(r["speedup"] for r in rows if r["mode"] == "chain" and r["temp"] == t)
        ax.axhline(chain, linestyle=":", linewidth=1, color=line.get_color(), label=f"chain, T={t:g}")
    ax.axhline(1.0, color="grey", linewidth=0.8, label="ar")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ticks))
    ax.set_xticklabels([str(b) for b in sorted(ticks)])
    ax.minorticks_off()
    ax.set_xlabel("tree budget (nodes)")
    ax.set_ylabel("speed-up over ar (tokens/s)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def replot(md_path, png_path):
    """The plot of a saved run: the table --out-md wrote (T, mode, budget, ..., speed-up vs ar, ...)."""
    rows, curves = [], {}
    with open(md_path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 5 or cells[1] not in ("ar", "chain", "tree"):
                continue
            t, mode, b, sp = float(cells[0]), cells[1], cells[2], float(cells[4])
            b = None if b == "-" else (b if b == "auto" else int(b))
            rows.append({"temp": t, "mode": mode, "budget": b, "speedup": sp})
            if mode == "tree":
                curves.setdefault(t, []).append((b, sp))
    if not curves:
        raise SystemExit(f"{md_path}: no tree rows in an e2e table")
    plot(rows, curves, png_path)

if __name__ == "__main__":
    main()
