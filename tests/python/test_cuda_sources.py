"""test_cuda_sources.py — source rules of the CUDA backend that no CPU run can observe.

The engine turns the kernel-to-kernel edges of its round graphs into programmatic edges
(programmatic dependent launch, engine_cuda.c): a kernel's blocks may start while the kernel
before it still runs.  That is safe only because every kernel opens with DDT_GRID_DEP_WAIT()
(griddepcontrol.wait), which holds it until its predecessors have finished.  A kernel that
forgets it would read half-written inputs, a race no test on the CPU (and few on the GPU) can
catch, so this test reads the sources: every __global__ function under src/backend/cuda must
make the wait its first statement, or mark with DDT_GRID_DEP_LATER() that it waits after loading
the model's weights (mm_kernel), or with DDT_GRID_DEP_FLAGS() that it learns from flags in global
memory that its inputs are written and executes the wait only at its end (the wgmma experts' down
launch); such a kernel may take no __restrict__ pointer, because ptxas hoists those reads
(ld.global.nc) above the wait, and a FLAGS kernel must still contain the wait.
"""

import glob
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
CUDA_DIR = os.path.join(HERE, "..", "..", "src", "backend", "cuda")


def strip_comments(src):
    """Blank out /* */ and // comments, keeping line numbers."""
    src = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def kernel_definitions(code):
    """(line, name, parameter text, body from its opening brace on) of every __global__
    function defined in comment-free code."""
    for m in re.finditer(r"\b__global__\b", code):
        brace = code.find("{", m.end())
        semi = code.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            continue  # a declaration, not a definition
        head = code[m.end():brace]
        name = [n for n in re.findall(r"(\w+)\s*\(", head) if n != "__launch_bounds__"]
        yield code.count("\n", 0, m.start()) + 1, name[0] if name else "?", head, code[brace + 1:]


def kernels_without_wait(src):
    """(line, kernel name) of every __global__ function whose body does not open with the wait
    (or with DDT_GRID_DEP_LATER(): a kernel that waits after loading the model's weights)."""
    return [(line, name) for line, name, _, body in kernel_definitions(strip_comments(src))
            if not re.match(r"\s*DDT_GRID_DEP_(WAIT|LATER|FLAGS)\(\)\s*;", body)]


def late_kernels_with_restrict(src):
    """(line, kernel name) of every kernel that opens with DDT_GRID_DEP_LATER() or
    DDT_GRID_DEP_FLAGS() and takes a __restrict__ pointer: ptxas may hoist such a read
    (ld.global.nc) above the late wait."""
    return [(line, name) for line, name, head, body in kernel_definitions(strip_comments(src))
            if re.match(r"\s*DDT_GRID_DEP_(LATER|FLAGS)\(\)\s*;", body) and "__restrict__" in head]


def kernel_body(body):
    """The text of a kernel body (from after its opening brace) up to its closing brace."""
    depth = 1
    for i, c in enumerate(body):
        depth += c == "{"
        depth -= c == "}"
        if depth == 0:
            return body[:i]
    return body


def flag_kernels_without_wait(src):
    """(line, kernel name) of every kernel that opens with DDT_GRID_DEP_FLAGS() but never
    executes the grid wait: its end would no longer imply its predecessors' ends."""
    return [(line, name) for line, name, _, body in kernel_definitions(strip_comments(src))
            if re.match(r"\s*DDT_GRID_DEP_FLAGS\(\)\s*;", body)
            and not re.search(r"DDT_GRID_DEP_WAIT\(\)\s*;", kernel_body(body))]


def test_flag_kernels_still_wait_at_their_end():
    flags, bad = scan_backend(r"DDT_GRID_DEP_FLAGS\(\)\s*;", flag_kernels_without_wait)
    assert flags >= 1, "no kernel starts by flags: is the check still needed?"
    assert not bad, "kernels that start by flags and never wait for their grid:\n" + "\n".join(bad)
    good = "__global__ void f(int *p) {\n    DDT_GRID_DEP_FLAGS();\n    if (*p) { p[1] = 0; }\n    DDT_GRID_DEP_WAIT();\n}\n"
    bad_src = ("__global__ void g(int *p) {\n    DDT_GRID_DEP_FLAGS();\n    if (*p) { p[1] = 0; }\n}\n"
               "__global__ void h(int *p) {\n    DDT_GRID_DEP_WAIT();\n}\n")
    assert flag_kernels_without_wait(good) == []
    assert flag_kernels_without_wait(bad_src) == [(1, "g")]


def scan_backend(pattern, check):
    """Over every CUDA source of the backend: the count of `pattern` in its comment-free code
    and the "file:line name" of every kernel `check` reports."""
    files = sorted(glob.glob(os.path.join(CUDA_DIR, "*.cu")) + glob.glob(os.path.join(CUDA_DIR, "*.cuh")))
    assert files, f"no CUDA sources under {CUDA_DIR}"
    count, found = 0, []
    for f in files:
        src = open(f, encoding="utf-8").read()
        count += len(re.findall(pattern, strip_comments(src)))
        found += [f"{os.path.relpath(f, CUDA_DIR)}:{line} {name}" for line, name in check(src)]
    return count, found


def test_late_waiting_kernels_take_no_restrict_pointers():
    late, bad = scan_backend(r"DDT_GRID_DEP_LATER\(\)\s*;", late_kernels_with_restrict)
    assert late >= 1, "no kernel waits late: is the check still needed?"
    assert not bad, "late-waiting kernels with __restrict__ pointers:\n" + "\n".join(bad)
    good = "static __global__ void k(const float *x, float *y) {\n    DDT_GRID_DEP_LATER();\n    y[0] = x[0];\n}\n"
    worse = "static __global__ void k2(const float *__restrict__ x, float *y) {\n    DDT_GRID_DEP_LATER();\n}\n"
    assert late_kernels_with_restrict(good) == []
    assert late_kernels_with_restrict(worse) == [(1, "k2")]


def test_every_kernel_waits_for_its_predecessors():
    n_kernels, missing = scan_backend(r"\b__global__\b", kernels_without_wait)
    assert n_kernels >= 30, f"found only {n_kernels} kernels: is {CUDA_DIR} the backend?"
    assert not missing, "kernels that open with neither DDT_GRID_DEP_WAIT() nor DDT_GRID_DEP_LATER():\n" + "\n".join(missing)


def test_the_check_finds_a_kernel_without_the_wait():
    good = ("static __global__ void __launch_bounds__(128) a_kernel(int *p) {\n"
            "    DDT_GRID_DEP_WAIT();\n    *p = 1;\n}\n")
    bad = ("template <int N>\nstatic __global__ void b_kernel(const float *x, float *y) {\n"
           "    /* DDT_GRID_DEP_WAIT(); in a comment does not count */\n    y[0] = x[0];\n}\n")
    late = "__global__ void c_kernel(int *p) {\n    int i = 0;\n    DDT_GRID_DEP_WAIT();\n    p[i] = 0;\n}\n"
    decl = "__global__ void d_kernel(int *p);\n"
    assert kernels_without_wait(good) == []
    assert kernels_without_wait(bad) == [(2, "b_kernel")]
    assert kernels_without_wait(late) == [(1, "c_kernel")]
    assert kernels_without_wait(decl) == []
