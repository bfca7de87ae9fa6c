#!/usr/bin/env python3
"""check_tokenizer.py — the C tokenizer (libddtree.so) must give exactly the ids that PyPI tiktoken
gave when the corpus was encoded: every held-out file is re-encoded by the C code and compared with
its slice of train/data/heldout.bin; the named specials must map to their ids.

    DDT_BUILD_DIR=build-train python3 train/check_tokenizer.py [--tokenizer DIR]
"""

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))
import ddt_common as C  # noqa: E402
from prepare_data import read_split  # noqa: E402
from tok_util import CTokenizer  # noqa: E402  (ctypes binding of the C tokenizer)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default=C.DATA_DIR)
    ap.add_argument("--tokenizer", default=C.TOKENIZER_DIR)
    args = ap.parse_args()
    manifest = C.read_json(os.path.join(args.data, "manifest.json"))
    stream = C.load_tokens("heldout", args.data).astype(np.int64)
    ends = np.flatnonzero(stream == C.EOS_ID)
    docs = read_split(manifest, "heldout")
    if len(ends) != len(docs):
        raise SystemExit(f"heldout.bin holds {len(ends)} files, the manifest {len(docs)}")
    start, n = 0, 0
    with CTokenizer(args.tokenizer) as tok:
        if tok.vocab_size() != C.VOCAB:
            raise SystemExit(f"C tokenizer vocab {tok.vocab_size()} != {C.VOCAB}")
        for i, name in C.NAMED_SPECIALS.items():
            if tok.token_id(name) != i:
                raise SystemExit(f"special {name}: C id {tok.token_id(name)} != {i}")
        for (path, text), end in zip(docs, ends):
            want = stream[start:end].tolist()
            got = tok.encode(text.encode("utf-8"))
            if got != want:
                k = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                raise SystemExit(f"{path}: C and tiktoken ids differ at token {k}")
            if tok.decode(got) != text.encode("utf-8"):
                raise SystemExit(f"{path}: C decode does not round-trip")
            start = end + 1
            n += len(got)
    print(f"C tokenizer == tiktoken on {len(docs)} held-out files ({n} tokens); specials ok")


if __name__ == "__main__":
    main()
