#!/usr/bin/env bash
# gpu-cost-probe.sh — the auto budget's cost table beside measured round times, on the GPU.
# For each of the first N_PROMPTS held-out prompts and each budget in BUDGETS (auto included),
# runs `ddtree generate --backend cuda --mode tree --json` and writes one JSON line of stats per
# run to $OUT/${PROBE_NAME:-cost_probe}.jsonl: the cost_model the auto budget measured at start
# (draft seconds, verify seconds at each node bucket) next to what a round really cost (seconds
# per phase, rounds, nodes verified, acceptance), so the table's error can be fitted (NOTES 0b).
# Builds first if needed.  Env: N_PROMPTS (3), BUDGETS (auto,8,16,32,64), MAX_TOKENS (128),
# PROBE_EXTRA (more generate flags).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
[ -x build-gpu/ddtree ] || bash scripts/gpu-test.sh build || exit 1
out="$OUT/${PROBE_NAME:-cost_probe}.jsonl"
: > "$out"
python3 - "$out" "${N_PROMPTS:-3}" "${BUDGETS:-auto,8,16,32,64}" "${MAX_TOKENS:-128}" "${PROBE_EXTRA:-}" <<'PY'
import json, subprocess, sys
out, n, budgets, max_tokens, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4], sys.argv[5].split()
prompts = [p["text"] for p in json.load(open("models/heldout_prompts.json"))["prompts"]][:n]
with open(out, "a") as f:
    for i, p in enumerate(prompts):
        for b in budgets:
            cmd = ["build-gpu/ddtree", "generate", "--backend", "cuda", "--model", "models/pystdlib-target",
                   "--draft", "models/pystdlib-dflash", "--mode", "tree", "--budget", b, "--prompt", p,
                   "--max-tokens", max_tokens, "--json"] + extra
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"cost-probe: prompt {i} budget {b}: exit {r.returncode}: {r.stderr[-400:]}")
                continue
            s = json.loads(r.stdout)["stats"]
            s.update(prompt=i, budget_arg=b)
            f.write(json.dumps(s) + "\n")
            sec = s["seconds"]; rounds = max(s["rounds"], 1)
            print(f"prompt {i} budget {b:>4}: tau {s['mean_acceptance']:.2f} tok/s {s['tokens_per_s']:.0f} "
                  f"round {1e6 * (sec['total'] - sec['prefill']) / rounds:.1f} us "
                  f"(draft {1e6 * sec['draft'] / rounds:.1f} verify {1e6 * sec['verify'] / rounds:.1f} "
                  f"build {1e6 * sec['build'] / rounds:.1f} walk {1e6 * sec['walk'] / rounds:.1f} "
                  f"commit {1e6 * sec['commit'] / rounds:.1f}) nodes/round {s['nodes_verified'] / rounds:.1f}")
            if b == "auto":
                cm = s.get("cost_model", {})
                print("  cost_model draft %.1f us; verify(n) us: %s" % (1e6 * cm.get("draft", 0), ", ".join(
                    f"{int(x)}:{1e6 * y:.1f}" for x, y in zip(cm.get("nodes", []), cm.get("verify", [])))))
PY
