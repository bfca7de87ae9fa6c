#!/usr/bin/env python3
"""prepare_data.py — the training corpus: the Python 3.11 standard library as Debian ships it.

Two steps (the tokenizer is trained between them, see train/README.md):

  python3 train/prepare_data.py collect     # file list, split, manifest -> train/data/manifest.json
  python3 train/prepare_data.py encode      # token ids -> train/data/{train,heldout}.bin

Corpus: every *.py file under /usr/lib/python3.11 that the Debian packages libpython3.11-minimal and
libpython3.11-stdlib install (both built from the source package python3.11 and installed together by
`apt-get install libpython3.11-stdlib`; licence PSF-2.0, see /usr/share/doc/libpython3.11-stdlib/copyright),
minus the test suites (test/, */tests/, idlelib/idle_test/) so the corpus is library code.  The package
file lists come from `dpkg -L`, so a machine with the same package versions gets the same corpus.

Split: a file is held out when the first 8 bytes of sha256(relative path), as a big-endian integer,
mod 10000 are < 500 (about 5 %).  The split depends on the path only, never on the content or order.

Encoding (`encode`): each file's text (UTF-8) is encoded with PyPI tiktoken over the trained ranks and the
Kimi pattern (no special tokens are parsed from the text), followed by [EOS]; files in manifest order.
Ids are stored as little-endian uint16.
"""

import argparse
import hashlib
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddt_common as C  # noqa: E402

PACKAGES = ["libpython3.11-minimal", "libpython3.11-stdlib"]
SRC_ROOT = "/usr/lib/python3.11/"
HELDOUT_PER_10000 = 500


def is_test_path(rel: str) -> bool:
    parts = rel.split("/")
    return parts[0] == "test" or "tests" in parts[:-1] or rel.startswith("idlelib/idle_test/")


def held_out(rel: str) -> bool:
    h = int.from_bytes(hashlib.sha256(rel.encode("utf-8")).digest()[:8], "big")
    return h % 10000 < HELDOUT_PER_10000


def package_files(pkg: str) -> list[str]:
    out = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"dpkg -L {pkg} failed ({out.stderr.strip()}): run `apt-get install libpython3.11-stdlib`")
    return out.stdout.split("\n")


def package_version(pkg: str) -> str:
    out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def collect(args):
    files = set()
    for pkg in PACKAGES:
        for path in package_files(pkg):
            if path.startswith(SRC_ROOT) and path.endswith(".py") and os.path.isfile(path):
                files.add(path[len(SRC_ROOT):])
    entries, skipped = [], []
    for rel in sorted(files):
        if is_test_path(rel):
            continue
        with open(SRC_ROOT + rel, "rb") as f:
            data = f.read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            skipped.append({"path": rel, "why": f"not UTF-8: {e}"})
            continue
        if not data.strip():
            skipped.append({"path": rel, "why": "empty"})
            continue
        entries.append({"path": rel, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                        "split": "heldout" if held_out(rel) else "train"})
    manifest = {
        "source": {"root": SRC_ROOT, "packages": {p: package_version(p) for p in PACKAGES},
                   "licence": "PSF-2.0 (/usr/share/doc/libpython3.11-stdlib/copyright)",
                   "excluded": "test/, */tests/, idlelib/idle_test/",
                   "split": f"sha256(path)[:8] big-endian mod 10000 < {HELDOUT_PER_10000} -> heldout"},
        "files": entries,
        "skipped": skipped,
        "totals": {s: {"files": sum(e["split"] == s for e in entries),
                       "bytes": sum(e["bytes"] for e in entries if e["split"] == s)} for s in ("train", "heldout")},
    }
    C.write_json(os.path.join(args.data, "manifest.json"), manifest)
    print(f"collect: {manifest['totals']}, skipped {len(skipped)}")


def read_split(manifest: dict, split: str) -> list[tuple[str, str]]:
    """(path, text) of one split, in manifest order; checks the content against the manifest."""
    out = []
    for e in manifest["files"]:
        if e["split"] != split:
            continue
        with open(manifest["source"]["root"] + e["path"], "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != e["sha256"]:
            raise SystemExit(f"{e['path']}: content differs from the manifest (another package version?)")
        out.append((e["path"], data.decode("utf-8")))
    return out


def encode(args):
    manifest = C.read_json(os.path.join(args.data, "manifest.json"))
    enc = C.tiktoken_encoding(args.tokenizer)
    stats = {}
    for split in ("train", "heldout"):
        docs = read_split(manifest, split)
        ids = []
        for _, text in docs:
            ids.extend(enc.encode_ordinary(text))
            ids.append(C.EOS_ID)
        arr = np.asarray(ids, dtype=np.int64)
        if arr.max() >= C.VOCAB:
            raise SystemExit(f"{split}: id {arr.max()} outside the vocabulary")
        arr.astype("<u2").tofile(os.path.join(args.data, f"{split}.bin"))
        n_bytes = sum(len(t.encode("utf-8")) for _, t in docs)
        stats[split] = {"files": len(docs), "tokens": int(arr.size), "bytes": n_bytes,
                        "bytes_per_token": round(n_bytes / max(1, arr.size - len(docs)), 3)}
        print(f"encode {split}: {stats[split]}")
    manifest["encoded"] = stats
    C.write_json(os.path.join(args.data, "manifest.json"), manifest)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["collect", "encode"])
    ap.add_argument("--data", default=C.DATA_DIR, help="output folder (default train/data)")
    ap.add_argument("--tokenizer", default=C.TOKENIZER_DIR, help="folder with tiktoken.model (encode)")
    args = ap.parse_args()
    os.makedirs(args.data, exist_ok=True)
    collect(args) if args.step == "collect" else encode(args)


if __name__ == "__main__":
    main()
