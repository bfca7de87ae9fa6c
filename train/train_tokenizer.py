#!/usr/bin/env python3
"""train_tokenizer.py — a byte-level BPE tokenizer in Kimi's format, trained on the train split.

    python3 train/train_tokenizer.py [--max-bytes 12000000] [--out train/data/tokenizer]

Pre-tokenisation: Kimi's pattern (ddt_common.KIMI_PAT_STR), run with the `regex` module in an
equivalent spelling.  Training: ranks 0..255 are the single bytes; then, 3840 times, the most frequent
adjacent pair inside the pre-tokenised words (counted with multiplicity; ties broken by the smaller
pair of byte strings) is merged into a new rank.  4096 ranks in all.

Output (same layout as tests/fixtures/tokenizer/):
  tiktoken.model         one "base64(bytes) rank" line per rank
  tokenizer_config.json  added_tokens_decoder with the named specials from id 4096 ([BOS], [EOS],
                         <|im_end|>, ... at Kimi's offsets); the other ids up to 4351 are
                         <|reserved_token_ID|> as tokenization_kimi.py names them.

The files are then checked: PyPI tiktoken over the ranks must round-trip the held-out text.
"""

import argparse
import base64
import heapq
import os
import sys
import time
from collections import defaultdict

import regex

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddt_common as C  # noqa: E402
from prepare_data import read_split  # noqa: E402


def count_words(texts, pattern) -> dict[bytes, int]:
    counts: dict[bytes, int] = defaultdict(int)
    for t in texts:
        for w in pattern.findall(t):
            counts[w.encode("utf-8")] += 1
    return counts


def train_bpe(word_counts: dict[bytes, int], n_ranks: int) -> dict[bytes, int]:
    """Merges until n_ranks ranks exist.  Pair counts are kept incrementally: a merge only
    revisits the words that hold the merged pair; a heap with lazy deletion finds the best pair."""
    ranks = {bytes([i]): i for i in range(256)}
    words = sorted(word_counts)                        # fixed order: reproducible ties
    seqs = [[bytes([b]) for b in w] for w in words]
    counts = [word_counts[w] for w in words]
    pair_count: dict[tuple[bytes, bytes], int] = defaultdict(int)
    where: dict[tuple[bytes, bytes], set[int]] = defaultdict(set)
    for wi, seq in enumerate(seqs):
        for pair in zip(seq, seq[1:]):
            pair_count[pair] += counts[wi]
            where[pair].add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    while len(ranks) < n_ranks and heap:
        negc, pair = heapq.heappop(heap)
        if negc == 0 or pair_count.get(pair, 0) != -negc:
            continue                                   # stale heap entry
        merged = pair[0] + pair[1]
        if merged not in ranks:
            ranks[merged] = len(ranks)
        touched = set()
        for wi in sorted(where.pop(pair, ())):
            seq, c = seqs[wi], counts[wi]
            for p in zip(seq, seq[1:]):
                pair_count[p] -= c
                touched.add(p)
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and seq[i] == pair[0] and seq[i + 1] == pair[1]:
                    out.append(merged)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[wi] = out
            for p in zip(out, out[1:]):
                pair_count[p] += c
                where[p].add(wi)
                touched.add(p)
        pair_count.pop(pair, None)
        for p in touched:
            if pair_count.get(p, 0) > 0:
                heapq.heappush(heap, (-pair_count[p], p))
    if len(ranks) < n_ranks:
        raise SystemExit(f"only {len(ranks)} ranks could be formed; need {n_ranks}")
    return ranks


def write_files(out_dir: str, ranks: dict[bytes, int]) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tiktoken.model"), "wb") as f:
        for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(tok) + b" " + str(rank).encode() + b"\n")
    decoder = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": True} for i, t in sorted(C.NAMED_SPECIALS.items())}
    C.write_json(os.path.join(out_dir, "tokenizer_config.json"), {
        "added_tokens_decoder": decoder,
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "model_max_length": 1024,
        "tokenizer_class": "TikTokenTokenizer",
    })


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=C.DATA_DIR)
    ap.add_argument("--out", default=C.TOKENIZER_DIR)
    ap.add_argument("--max-bytes", type=int, default=12_000_000,
                    help="train on at most this many bytes of the train split (whole files, manifest order)")
    args = ap.parse_args()
    t0 = time.time()
    manifest = C.read_json(os.path.join(args.data, "manifest.json"))
    texts, total = [], 0
    for _, t in read_split(manifest, "train"):
        if total + len(t) > args.max_bytes:
            continue
        texts.append(t)
        total += len(t)
    pattern = regex.compile(C.kimi_pattern_for_regex_module())
    wc = count_words(texts, pattern)
    print(f"{len(texts)} files, {total} chars, {len(wc)} distinct words ({time.time() - t0:.1f} s)")
    ranks = train_bpe(wc, C.N_RANKS)
    write_files(args.out, ranks)
    print(f"{len(ranks)} ranks written to {args.out} ({time.time() - t0:.1f} s)")

    # Check: tiktoken over these ranks round-trips the held-out text.
    enc = C.tiktoken_encoding(args.out)
    held = read_split(manifest, "heldout")
    n_tok = n_bytes = 0
    for path, t in held:
        ids = enc.encode_ordinary(t)
        if enc.decode(ids) != t:
            raise SystemExit(f"tiktoken does not round-trip held-out file {path}")
        n_tok += len(ids)
        n_bytes += len(t.encode("utf-8"))
    print(f"held-out: {n_tok} tokens, {n_bytes / n_tok:.3f} bytes/token; round trip ok")


if __name__ == "__main__":
    main()
