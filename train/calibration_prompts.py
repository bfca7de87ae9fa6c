#!/usr/bin/env python3
"""calibration_prompts.py — the prompts `ddtree calibrate` fits the shipped pair's draft calibration on.

    python3 train/prepare_data.py collect            # train/data/manifest.json (the held-out file list)
    python3 train/calibration_prompts.py             # -> models/calibration_prompts.json
    ./build/ddtree calibrate --model models/pystdlib-target --draft models/pystdlib-dflash \
        --prompts models/calibration_prompts.json --max-tokens 160   # -> models/pystdlib-dflash/draft_calibration.json

From the held-out files (never trained on), the 4 lines starting at the first "def " or "    def " line
at >= 55 % and at >= 80 % of each file, except where that is one of the evaluation prompts
(models/heldout_prompts.json, train/evaluate.py's at >= 30 %): the calibration is fitted on other text
than the acceptance it is judged by.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddt_common as C  # noqa: E402
from prepare_data import read_split  # noqa: E402


def pick(manifest, exclude):
    out, seen = [], set(exclude)
    for path, text in read_split(manifest, "heldout"):
        lines = text.split("\n")
        for frac in (0.55, 0.8):
            start = int(len(lines) * frac)
            k = next((i for i in range(start, len(lines) - 4)
                      if lines[i].startswith("def ") or lines[i].startswith("    def ")), None)
            if k is None or (path, k + 1) in seen:
                continue
            seen.add((path, k + 1))
            out.append({"file": path, "line": k + 1, "text": "\n".join(lines[k:k + 4]) + "\n"})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=C.DATA_DIR)
    ap.add_argument("--eval-prompts", default=os.path.join(C.MODELS_DIR, "heldout_prompts.json"))
    ap.add_argument("--out", default=os.path.join(C.MODELS_DIR, "calibration_prompts.json"))
    args = ap.parse_args()
    with open(os.path.join(args.data, "manifest.json")) as f:
        manifest = json.load(f)
    with open(args.eval_prompts) as f:
        exclude = [(p["file"], p["line"]) for p in json.load(f)["prompts"]]
    prompts = pick(manifest, exclude)
    C.write_json(args.out, {"what": "calibration prompts: 4 lines from a held-out stdlib file, starting at the first "
                            "def at >= 55% and >= 80% of the file, none of the evaluation prompts "
                            "(train/calibration_prompts.py)", "prompts": prompts})
    print(f"calibration_prompts: {len(prompts)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
