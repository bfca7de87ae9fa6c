"""Every patch in patches/ (GPU work written without a GPU, waiting for scripts/gpu-patches.sh to test it
on a device) applies to the tree as it is, alone and all together in the order gpu-patches.sh applies them
(sorted by name): a change to a file a patch touches must rebase the patch in the same commit, or the next
device session finds it broken (as the seventeenth session's review left mla-cluster-groups.patch)."""

import glob
import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATCHES = sorted(glob.glob(os.path.join(ROOT, "patches", "*.patch")))


def git_apply_check(cwd, patch):
    return subprocess.run(["git", "apply", "--check", patch], cwd=cwd, capture_output=True, text=True)


def test_each_patch_applies():
    """One test over every patch (none waiting is a pass, not a skip: there is nothing to rebase)."""
    broken = [f"{os.path.basename(p)}: {r.stderr}" for p in PATCHES for r in [git_apply_check(ROOT, p)] if r.returncode]
    assert not broken, "patches that do not apply:\n" + "\n".join(broken)


def test_patches_apply_together(tmp_path):
    """The files the patches touch, copied, then each patch applied in turn."""
    if len(PATCHES) < 2:
        return
    touched = set()
    for p in PATCHES:
        for line in open(p, encoding="utf-8", errors="replace"):
            if line.startswith("+++ b/") or line.startswith("--- a/"):
                touched.add(line[6:].strip())
    for f in touched:
        src = os.path.join(ROOT, f)
        if os.path.exists(src):
            os.makedirs(os.path.dirname(tmp_path / f), exist_ok=True)
            shutil.copy(src, tmp_path / f)
    for p in PATCHES:
        r = subprocess.run(["git", "apply", p], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 0, f"{os.path.basename(p)} does not apply after the ones before it: {r.stderr}"
