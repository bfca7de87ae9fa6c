"""conftest.py — shared fixtures of the Python tests: the build folder ($DDT_BUILD_DIR), the
`ddtree` command, and ctypes bindings of libddtree.so whose structs mirror include/ddtree.h
field for field.

A missing build folder, library or command fails the tests that need it, loudly; nothing is
skipped.  DDT_PYTEST_QUICK=1 (the sanitizer run) asks randomised tests for fewer cases.
"""

import ctypes
import os
from ctypes import POINTER, c_char, c_float, c_int, c_int32, c_uint32, c_uint64

import numpy as np
import pytest

import ddt_paths

# ---------------------------------------------------------------------------- ctypes mirror of ddtree.h

DDT_ERROR_MSG_MAX = 512
DDT_MAX_DEPTH = 31
DDT_MAX_TOPK = 1024
DDT_MAX_BUDGET = 1024
DDT_MAX_NODES = DDT_MAX_BUDGET + 1
DDT_MAX_PATH = DDT_MAX_DEPTH + 1

DDT_OK = 0
STATUS_NAMES = {0: "ok", 1: "invalid", 2: "range", 3: "nomem", 4: "io", 5: "format",
                6: "unsupported", 7: "internal"}


class DdtError(ctypes.Structure):
    _fields_ = [("status", c_int), ("msg", c_char * DDT_ERROR_MSG_MAX)]


class DdtDraftTable(ctypes.Structure):
    _fields_ = [("depth", c_int32), ("k", c_int32), ("logq", POINTER(c_float)),
                ("token", POINTER(c_int32))]


class DdtTree(ctypes.Structure):
    _fields_ = [("n_nodes", c_int32), ("capacity", c_int32), ("vis_words", c_int32),
                ("max_depth", c_int32), ("token", POINTER(c_int32)), ("parent", POINTER(c_int32)),
                ("depth", POINTER(c_int32)), ("rank", POINTER(c_int32)), ("logw", POINTER(c_float)),
                ("first_child", POINTER(c_int32)), ("next_sibling", POINTER(c_int32)),
                ("vis", POINTER(c_uint64))]


class DdtCostModel(ctypes.Structure):
    _fields_ = [("draft", c_float), ("n_nodes", c_int32), ("nodes", POINTER(c_float)),
                ("n_contexts", c_int32), ("contexts", POINTER(c_float)),
                ("verify", POINTER(c_float)), ("context_len", c_float)]


class DdtWalkResult(ctypes.Structure):
    _fields_ = [("path", c_int32 * DDT_MAX_PATH), ("length", c_int32), ("bonus", c_int32)]


class DdtSampling(ctypes.Structure):
    _fields_ = [("temperature", c_float), ("top_k", c_int32), ("top_p", c_float),
                ("seed", c_uint64)]


# ddt_tree_allow_fn: bool (*)(void *ctx, int32_t parent, int32_t node, int32_t token)
ALLOW_FN = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, c_int32, c_int32, c_int32)


def _ptr(arr, ctype):
    return arr.ctypes.data_as(POINTER(ctype))


class EngineError(Exception):
    """A non-zero ddt_status; .status and .msg carry the engine's answer."""

    def __init__(self, status, msg):
        super().__init__(f"{STATUS_NAMES.get(status, status)}: {msg}")
        self.status = status
        self.msg = msg


class TreeView:
    """Copies of a ddt_tree's arrays (n_nodes entries) as numpy arrays."""

    def __init__(self, t):
        n = t.n_nodes
        self.n = n
        self.capacity = t.capacity
        self.vis_words = t.vis_words
        self.max_depth = t.max_depth

        def grab(p, dtype, count):
            if count == 0:
                return np.zeros(0, dtype=dtype)
            return np.ctypeslib.as_array(p, shape=(count,)).astype(dtype, copy=True)

        self.tokens = grab(t.token, np.int32, n)
        self.parents = grab(t.parent, np.int32, n)
        self.depth = grab(t.depth, np.int32, n)
        self.rank = grab(t.rank, np.int32, n)
        self.logw = grab(t.logw, np.float32, n)
        self.first_child = grab(t.first_child, np.int32, n)
        self.next_sibling = grab(t.next_sibling, np.int32, n)
        self.vis = grab(t.vis, np.uint64, n * t.vis_words).reshape(n, t.vis_words)


class Lib:
    """libddtree.so with argument types declared, plus helpers that raise EngineError."""

    def __init__(self, path):
        self.path = path
        L = ctypes.CDLL(path)
        self.L = L
        L.ddt_status_name.argtypes = [c_int]
        L.ddt_status_name.restype = ctypes.c_char_p
        L.ddt_tree_alloc.argtypes = [c_int32, POINTER(DdtTree), POINTER(DdtError)]
        L.ddt_tree_alloc.restype = c_int
        L.ddt_tree_free.argtypes = [POINTER(DdtTree)]
        L.ddt_tree_free.restype = None
        L.ddt_builder_create.argtypes = [c_int32, POINTER(ctypes.c_void_p), POINTER(DdtError)]
        L.ddt_builder_create.restype = c_int
        L.ddt_builder_destroy.argtypes = [ctypes.c_void_p]
        L.ddt_builder_destroy.restype = None
        L.ddt_tree_build.argtypes = [ctypes.c_void_p, POINTER(DdtDraftTable), c_int32, c_int32,
                                     POINTER(DdtCostModel), c_int32, POINTER(DdtTree),
                                     POINTER(DdtError)]
        L.ddt_tree_build.restype = c_int
        L.ddt_tree_build_filtered.argtypes = [ctypes.c_void_p, POINTER(DdtDraftTable), c_int32, c_int32,
                                              POINTER(DdtCostModel), c_int32, ALLOW_FN, ctypes.c_void_p,
                                              POINTER(DdtTree), POINTER(DdtError)]
        L.ddt_tree_build_filtered.restype = c_int
        L.ddt_tree_build_chain.argtypes = [POINTER(DdtDraftTable), c_int32, c_int32, c_int32,
                                           POINTER(DdtTree), POINTER(DdtError)]
        L.ddt_tree_build_chain.restype = c_int
        L.ddt_tree_from_parents.argtypes = [POINTER(c_int32), POINTER(c_int32), c_int32, c_int32,
                                            POINTER(DdtTree), POINTER(DdtError)]
        L.ddt_tree_from_parents.restype = c_int
        L.ddt_tree_walk.argtypes = [POINTER(DdtTree), POINTER(c_int32), c_int32,
                                    POINTER(DdtWalkResult), POINTER(DdtError)]
        L.ddt_tree_walk.restype = c_int
        L.ddt_cost_check.argtypes = [POINTER(DdtCostModel), POINTER(DdtError)]
        L.ddt_cost_check.restype = c_int
        L.ddt_cost_verify.argtypes = [POINTER(DdtCostModel), c_float]
        L.ddt_cost_verify.restype = c_float
        L.ddt_cost_theta.argtypes = [POINTER(DdtCostModel), c_float, c_float]
        L.ddt_cost_theta.restype = c_float
        L.ddt_philox4x32_10.argtypes = [POINTER(c_uint32), POINTER(c_uint32), POINTER(c_uint32)]
        L.ddt_philox4x32_10.restype = None
        L.ddt_rng_uniform.argtypes = [c_uint64, c_uint64, c_uint32, c_uint32]
        L.ddt_rng_uniform.restype = c_float
        L.ddt_sampling_check.argtypes = [POINTER(DdtSampling), POINTER(DdtError)]
        L.ddt_sampling_check.restype = c_int
        L.ddt_sampler_create.argtypes = [c_int32, POINTER(ctypes.c_void_p), POINTER(DdtError)]
        L.ddt_sampler_create.restype = c_int
        L.ddt_sampler_destroy.argtypes = [ctypes.c_void_p]
        L.ddt_sampler_destroy.restype = None
        L.ddt_sample_token.argtypes = [ctypes.c_void_p, POINTER(c_float), c_int32,
                                       POINTER(DdtSampling), c_uint64, c_uint32, POINTER(c_int32),
                                       POINTER(DdtError)]
        L.ddt_sample_token.restype = c_int

    # -- helpers -----------------------------------------------------------------

    @staticmethod
    def check(status, err):
        if status != DDT_OK:
            raise EngineError(status, err.msg.decode("utf-8", "replace"))

    def status_name(self, status):
        return self.L.ddt_status_name(status).decode()

    def tree_alloc(self, capacity):
        t, e = DdtTree(), DdtError()
        self.check(self.L.ddt_tree_alloc(capacity, ctypes.byref(t), ctypes.byref(e)), e)
        return t

    def tree_free(self, t):
        self.L.ddt_tree_free(ctypes.byref(t))

    def builder_create(self, max_budget):
        b, e = ctypes.c_void_p(), DdtError()
        self.check(self.L.ddt_builder_create(max_budget, ctypes.byref(b), ctypes.byref(e)), e)
        return b

    def builder_destroy(self, b):
        self.L.ddt_builder_destroy(b)

    @staticmethod
    def table(logq, tokens):
        """A DdtDraftTable over contiguous copies; returns (table, keepalive)."""
        lq = np.ascontiguousarray(logq, dtype=np.float32)
        tk = np.ascontiguousarray(tokens, dtype=np.int32)
        D, K = lq.shape
        return DdtDraftTable(D, K, _ptr(lq, c_float), _ptr(tk, c_int32)), (lq, tk)

    @staticmethod
    def cost_model(draft, nodes, verify, contexts=None, context_len=0.0):
        """A DdtCostModel; returns (model, keepalive)."""
        nd = np.ascontiguousarray(nodes, dtype=np.float32)
        vf = np.ascontiguousarray(verify, dtype=np.float32)
        cx = None if contexts is None else np.ascontiguousarray(contexts, dtype=np.float32)
        cm = DdtCostModel(draft, len(nd), _ptr(nd, c_float), 1 if cx is None else len(cx),
                          None if cx is None else _ptr(cx, c_float), _ptr(vf, c_float), context_len)
        return cm, (nd, vf, cx)

    def build(self, builder, tree, logq, tokens, budget, root, vocab=0, cost=None):
        """ddt_tree_build; `cost` is a (DdtCostModel, keepalive) pair or None."""
        tb, keep = self.table(logq, tokens)
        e = DdtError()
        cptr = ctypes.byref(cost[0]) if cost is not None else None
        st = self.L.ddt_tree_build(builder, ctypes.byref(tb), root, budget, cptr, vocab,
                                   ctypes.byref(tree), ctypes.byref(e))
        del keep
        self.check(st, e)
        return TreeView(tree)

    def build_filtered(self, builder, tree, logq, tokens, budget, root, allow, vocab=0, cost=None):
        """ddt_tree_build_filtered; allow(parent, node, token) -> bool is the predicate (None: a
        NULL one).  An exception inside allow cannot cross the C frames: it is kept, the
        candidate refused, and raised after the build."""
        tb, keep = self.table(logq, tokens)
        e = DdtError()
        cptr = ctypes.byref(cost[0]) if cost is not None else None
        raised = []

        def cb(_ctx, parent, node, token):
            if raised:
                return False
            try:
                return bool(allow(parent, node, token))
            except BaseException as x:  # noqa: BLE001 — re-raised below
                raised.append(x)
                return False

        fn = ALLOW_FN(cb) if allow is not None else ALLOW_FN()
        st = self.L.ddt_tree_build_filtered(builder, ctypes.byref(tb), root, budget, cptr, vocab, fn, None,
                                            ctypes.byref(tree), ctypes.byref(e))
        del keep
        if raised:
            raise raised[0]
        self.check(st, e)
        return TreeView(tree)

    def chain(self, tree, logq, tokens, length, root, vocab=0):
        tb, keep = self.table(logq, tokens)
        e = DdtError()
        st = self.L.ddt_tree_build_chain(ctypes.byref(tb), root, length, vocab,
                                         ctypes.byref(tree), ctypes.byref(e))
        del keep
        self.check(st, e)
        return TreeView(tree)

    def from_parents(self, tree, tokens, parents, vocab=0, n=None):
        tk = np.ascontiguousarray(tokens, dtype=np.int32)
        pa = np.ascontiguousarray(parents, dtype=np.int32)
        e = DdtError()
        st = self.L.ddt_tree_from_parents(_ptr(tk, c_int32), _ptr(pa, c_int32),
                                          len(tk) if n is None else n, vocab,
                                          ctypes.byref(tree), ctypes.byref(e))
        self.check(st, e)
        return TreeView(tree)

    def walk(self, tree, target_next, vocab=0):
        tn = np.ascontiguousarray(target_next, dtype=np.int32)
        w, e = DdtWalkResult(), DdtError()
        self.check(self.L.ddt_tree_walk(ctypes.byref(tree), _ptr(tn, c_int32), vocab,
                                        ctypes.byref(w), ctypes.byref(e)), e)
        return list(w.path[:w.length]), w.bonus

    def philox(self, counter, key):
        c = (c_uint32 * 4)(*counter)
        k = (c_uint32 * 2)(*key)
        o = (c_uint32 * 4)()
        self.L.ddt_philox4x32_10(c, k, o)
        return list(o)

    def uniform(self, seed, rnd, node, lane):
        return np.float32(self.L.ddt_rng_uniform(seed, rnd, node, lane))

    def sampler_create(self, vocab):
        s, e = ctypes.c_void_p(), DdtError()
        self.check(self.L.ddt_sampler_create(vocab, ctypes.byref(s), ctypes.byref(e)), e)
        return s

    def sampler_destroy(self, s):
        self.L.ddt_sampler_destroy(s)

    def sample(self, sampler, logits, temperature, top_k, top_p, seed, rnd, node, vocab=None):
        z = np.ascontiguousarray(logits, dtype=np.float32)
        s = DdtSampling(temperature, top_k, top_p, seed)
        out, e = c_int32(-1), DdtError()
        st = self.L.ddt_sample_token(sampler, _ptr(z, c_float), len(z) if vocab is None else vocab,
                                     ctypes.byref(s), rnd, node, ctypes.byref(out), ctypes.byref(e))
        self.check(st, e)
        return out.value


# ---------------------------------------------------------------------------- fixtures


def quick():
    """True for the sanitizer run, which asks randomised tests for fewer cases."""
    return os.environ.get("DDT_PYTEST_QUICK", "") not in ("", "0")


@pytest.fixture(scope="session")
def build_dir():
    return ddt_paths.build_dir()


@pytest.fixture(scope="session")
def libddtree_path(build_dir):
    p = os.path.join(build_dir, "libddtree.so")
    if not os.path.isfile(p):
        pytest.fail(f"{p} is missing: build the 'ddtree' target", pytrace=False)
    return p


@pytest.fixture(scope="session")
def ddtree_exe(build_dir):
    return ddt_paths.ddtree_path()


@pytest.fixture(scope="session")
def lib(libddtree_path):
    return Lib(libddtree_path)


@pytest.fixture(scope="session")
def repo_root():
    return os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
