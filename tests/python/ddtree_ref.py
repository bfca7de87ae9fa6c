"""ddtree_ref.py — an independent numpy / pure-Python reference of the DDTree core.

Written from the algorithm as described in docs/reference.md section 1 and the contracts in
include/ddtree.h, not from src/core/*.c, so the tests in this folder compare two separate
implementations.  It covers:

  - the best-first tree (a heap, plus a brute-force enumeration of every prefix for small
    tables, so the reference itself is checked two ways),
  - the DFlash chain, trees given as parent arrays, visibility rows, the walk,
  - the cost-aware ("auto") budget of CaDDTree, in float64 math,
  - Philox4x32-R and the (seed, round, node, lane) uniform,
  - the sampler's documented float32 arithmetic, including the deterministic exp.

Float32 conventions.  A prefix weight is summed along its path in depth order, each addition
rounded to float32: w(u_1..u_d) = f32(w(u_1..u_{d-1}) + logq_d[r_d]) with w(root) = 0.  Adding two
float32 values in float64 and rounding once to float32 is exactly the float32 sum (double has more
than 2 * 24 + 2 bits), so plain Python floats followed by np.float32() give the IEEE result.

Every function raises RefError(kind, where, detail) on input the engine must reject, so tests can
check that the engine fails too and that its message names the same place.
"""

import heapq
import math

import numpy as np

F32 = np.float32
MAX_DEPTH = 31
MAX_TOPK = 1024
MAX_BUDGET = 1024
MAX_NODES = MAX_BUDGET + 1
MAX_PATH = MAX_DEPTH + 1
SAMPLE_CHUNK = 1024  # positions per chunk of the sampler's cumulative sums (sampler.c, step 3)

MASK32 = 0xFFFFFFFF


class RefError(Exception):
    """Input the engine must reject: `kind` names the check, `where` the place (row, node...)."""

    def __init__(self, kind, where, detail=""):
        super().__init__(f"{kind} at {where}: {detail}")
        self.kind = kind
        self.where = where
        self.detail = detail


def f32(x):
    """Round a Python float to the nearest float32 and return it as a Python float."""
    return float(F32(x))


# ---------------------------------------------------------------------------- draft tables


def check_table(logq, tokens, vocab=0, columns=None):
    """Check a draft table as the spec asks: D in 1..31, K in 1..1024, no NaN or +inf, rows
    non-increasing, token ids >= 0 and < vocab when vocab > 0.  `columns` limits the check to
    the first columns (the chain reads only rank 0).  Raises RefError at the first bad entry in
    row-major order."""
    logq = np.asarray(logq, dtype=F32)
    tokens = np.asarray(tokens)
    if logq.ndim != 2 or logq.shape != tokens.shape:
        raise RefError("shape", None, f"logq {logq.shape} vs tokens {tokens.shape}")
    D, K = logq.shape
    if not 1 <= D <= MAX_DEPTH:
        raise RefError("depth", D)
    if not 1 <= K <= MAX_TOPK:
        raise RefError("topk", K)
    kc = K if columns is None else min(columns, K)
    lq, tk = logq[:, :kc].astype(np.float64), tokens[:, :kc].astype(np.int64)
    bad_value = np.isnan(lq) | (lq == np.inf)
    unsorted = np.zeros_like(bad_value)
    unsorted[:, 1:] = lq[:, 1:] > lq[:, :-1]  # False next to a NaN: a NaN is reported itself
    bad_token = (tk < 0) | ((tk >= vocab) if vocab > 0 else False)
    first = None  # the first bad entry in row-major order; at one entry, the first check
    for kind, mask in (("nan_inf", bad_value), ("unsorted", unsorted), ("token_range", bad_token)):
        hits = np.flatnonzero(mask)
        if len(hits) and (first is None or hits[0] < first[1]):
            first = (kind, int(hits[0]))
    if first is not None:
        d, r = divmod(first[1], kc)
        raise RefError(first[0], (d, r), int(tokens[d, r]) if first[0] == "token_range" else "")


def check_used_distinct(tokens, max_rank):
    """Siblings come from one row, so the ranks a depth actually uses (0..max_rank[d]) must
    hold distinct tokens.  Raises RefError("duplicate", (row, token)) for the first token seen
    twice, scanning rows in order and each row by rank."""
    for d, mr in enumerate(max_rank):
        seen = set()
        for r in range(mr + 1):
            t = int(tokens[d][r])
            if t in seen:
                raise RefError("duplicate", (d, t))
            seen.add(t)


class Tree:
    """A flattened tree: node 0 is the root; lists indexed by node."""

    def __init__(self, tokens, parents, depth, logw, ranks=None):
        self.tokens = list(tokens)
        self.parents = list(parents)
        self.depth = list(depth)
        self.logw = list(logw)  # Python floats holding float32 values
        self.ranks = ranks  # rank tuple per node, () for the root; None for given trees

    @property
    def n(self):
        return len(self.tokens)

    def logw_f32(self):
        return np.array(self.logw, dtype=F32)

    def max_rank(self, D):
        """Highest rank used at each depth (index d = depth - 1), -1 where none."""
        mr = [-1] * D
        for rt in self.ranks[1:]:
            d = len(rt) - 1
            mr[d] = max(mr[d], rt[-1])
        return mr

    def truncated(self, n_nodes):
        """The first n_nodes nodes (a prefix of pop order is itself a tree)."""
        return Tree(self.tokens[:n_nodes], self.parents[:n_nodes], self.depth[:n_nodes],
                    self.logw[:n_nodes], None if self.ranks is None else self.ranks[:n_nodes])


def table_size(D, K):
    """Number of prefixes a D x K table holds: sum_{d=1..D} K^d."""
    return sum(K ** d for d in range(1, D + 1))


def _tree_from_ranks(order, weights, logq_tokens, root):
    """Flatten rank tuples given in pop order into a Tree."""
    index = {(): 0}
    tokens, parents, depth, logw, ranks = [root], [-1], [0], [0.0], [()]
    for rt in order:
        p = index.get(rt[:-1])
        if p is None:
            raise AssertionError(f"reference: prefix {rt} popped before its parent")
        index[rt] = len(tokens)
        tokens.append(int(logq_tokens[len(rt) - 1][rt[-1]]))
        parents.append(p)
        depth.append(len(rt))
        logw.append(weights[rt])
        ranks.append(rt)
    return Tree(tokens, parents, depth, logw, ranks)


def build_tree(logq, tokens, budget, root, vocab=0, allow=None):
    """Best-first DDTree build with a heap keyed by (-logw, rank tuple): the `budget` heaviest
    prefixes (fewer if the table holds fewer), ties by the rank tuple lexicographically, a
    prefix before its extensions.  Nodes in pop order; the root is not counted in the budget.
    allow (ddt_tree_build_filtered): None, or a function of a prefix's token path (a tuple,
    root excluded) that is False for a refused prefix; a refused pop takes no budget and is not
    expanded, but the next rank at its depth is still pushed.
    Raises RefError for a table, root or used-duplicate problem."""
    logq = np.asarray(logq, dtype=F32)
    check_table(logq, tokens, vocab)
    if root < 0 or (vocab > 0 and root >= vocab):
        raise RefError("root_range", "root", root)
    if budget < 0:
        raise RefError("budget", budget)
    D, K = logq.shape
    lq = logq.tolist()  # Python floats, exactly the float32 values
    toks = np.asarray(tokens).tolist()
    weights = {}
    order = []
    heap = []

    def push(w, rt):
        weights[rt] = w
        heapq.heappush(heap, (-w, rt))

    if budget > 0:
        push(f32(0.0 + lq[0][0]), (0,))
    while heap and len(order) < budget:
        _, rt = heapq.heappop(heap)
        w = weights[rt]
        d = len(rt)  # depth of the popped node; its row is d - 1
        r = rt[-1]
        if r + 1 < K:  # next sibling: same parent, weight from the parent's weight
            parent_w = weights[rt[:-1]] if d > 1 else 0.0
            push(f32(parent_w + lq[d - 1][r + 1]), rt[:-1] + (r + 1,))
        if allow is not None and not allow(tuple(toks[i][rt[i]] for i in range(d))):
            continue  # refused: never a node, never a parent
        order.append(rt)
        if d < D:  # first child
            push(f32(w + lq[d][0]), rt + (0,))
    tree = _tree_from_ranks(order, weights, toks, root)
    check_used_distinct(toks, tree.max_rank(D))
    return tree


def enumerate_tree(logq, tokens, budget, root, limit=200000, allow=None):
    """Second reference for small tables: list every prefix with its float32 path weight, sort
    by (-logw, rank tuple), keep the first `budget`.  Equal to build_tree whenever weights do
    not grow along a path (every logq <= 0), because then the order is a topological one.
    With allow (as build_tree's), only the prefixes whose every node it allows are listed.
    No input checks: call on valid tables."""
    logq = np.asarray(logq, dtype=F32)
    D, K = logq.shape
    if table_size(D, K) > limit:
        raise ValueError("table too large to enumerate")
    lq = logq.tolist()
    weights = {}
    level = [((), 0.0)]
    for d in range(D):
        nxt = []
        for rt, w in level:
            for r in range(K):
                c = rt + (r,)
                cw = f32(w + lq[d][r])
                weights[c] = cw
                nxt.append((c, cw))
        level = nxt
    toks = np.asarray(tokens).tolist()
    keys = sorted(weights, key=lambda rt: (-weights[rt], rt))
    if allow is not None:
        def path_ok(rt):
            return all(allow(tuple(toks[i][rt[i]] for i in range(d + 1))) for d in range(len(rt)))
        keys = [rt for rt in keys if path_ok(rt)]
    return _tree_from_ranks(keys[:budget], weights, toks, root)


def build_chain(logq, tokens, length, root, vocab=0):
    """The DFlash chain: rank 0 of depths 1..min(length, D), weights summed in float32."""
    logq = np.asarray(logq, dtype=F32)
    check_table(logq, tokens, vocab, columns=1)
    if root < 0 or (vocab > 0 and root >= vocab):
        raise RefError("root_range", "root", root)
    if length < 0:
        raise RefError("length", length)
    D = logq.shape[0]
    n = min(length, D)
    toks = [root] + [int(tokens[d][0]) for d in range(n)]
    logw = [0.0]
    for d in range(n):
        logw.append(f32(logw[-1] + float(logq[d, 0])))
    return Tree(toks, [-1] + list(range(n)), list(range(n + 1)), logw, [()] + [(0,) * (d + 1) for d in range(n)])


def tree_from_parents(tokens, parents, vocab=0):
    """Check and complete a tree given as tokens + parents (the ddt_tree_from_parents contract):
    root first with parent -1, every other parent an earlier node, depth <= 31, tokens in range,
    no two siblings with one token.  Raises RefError naming the node(s)."""
    n = len(tokens)
    if n != len(parents) or n < 1:
        raise RefError("size", n)
    if parents[0] != -1:
        raise RefError("root_parent", 0, parents[0])
    depth = [0] * n
    for i in range(n):
        t = tokens[i]
        if t < 0 or (vocab > 0 and t >= vocab):
            raise RefError("token_range", i, t)
        if i == 0:
            continue
        p = parents[i]
        if not 0 <= p < i:
            raise RefError("bad_parent", i, p)
        depth[i] = depth[p] + 1
        if depth[i] > MAX_DEPTH:
            raise RefError("too_deep", i, depth[i])
    seen = {}
    for i in range(1, n):
        key = (parents[i], tokens[i])
        if key in seen:
            raise RefError("dup_sibling", (seen[key], i), key)
        seen[key] = i
    return Tree(tokens, parents, depth, [0.0] * n)


def visibility(parents):
    """Boolean [n, n] matrix: vis[i, j] is true when j is i or an ancestor of i."""
    n = len(parents)
    vis = np.zeros((n, n), dtype=bool)
    for i in range(n):
        if i > 0:
            vis[i] = vis[parents[i]]
        vis[i, i] = True
    return vis


def visibility_words(parents, words):
    """The visibility rows as the engine stores them: `words` uint64 per row, bit j of row i
    in word j // 64 at bit j % 64."""
    n = len(parents)
    bits = np.zeros((n, words * 64), dtype=bool)
    bits[:, :n] = visibility(parents)
    return np.packbits(bits, axis=1, bitorder="little").view("<u8").reshape(n, words)


def walk(tokens, parents, target_next):
    """Accept the longest path the target agrees with: from the root, while the target's next
    token at the current node is one of its children's tokens, move there.  Returns (path of
    node ids starting with 0, bonus token)."""
    children = {}
    for i in range(1, len(tokens)):
        children.setdefault(parents[i], {})[tokens[i]] = i
    cur, path = 0, [0]
    while True:
        nxt = children.get(cur, {}).get(target_next[cur])
        if nxt is None:
            return path, target_next[cur]
        path.append(nxt)
        cur = nxt


# ---------------------------------------------------------------------------- cost model


class CostModel:
    """CaDDTree cost model in float64: theta(n) = (1 + Phi(n)) / (draft + verify(n, ctx)),
    verify interpolated linearly in the node count and the context length, clamped at the
    table's ends."""

    def __init__(self, draft, nodes, verify, contexts=None, context_len=0.0):
        self.draft = float(draft)
        self.nodes = np.asarray(nodes, dtype=np.float64)
        v = np.asarray(verify, dtype=np.float64)
        self.verify_table = v.reshape(1, -1) if v.ndim == 1 else v
        self.contexts = None if contexts is None else np.asarray(contexts, dtype=np.float64)
        self.context_len = float(context_len)

    def verify(self, n):
        """Interpolated verify cost for node count(s) n (a number or an array)."""
        per_ctx = np.array([np.interp(n, self.nodes, row) for row in self.verify_table])
        if self.contexts is None or len(self.contexts) == 1:
            return per_ctx[0]
        cs, x = self.contexts, self.context_len  # then linearly across contexts, clamped
        if x <= cs[0]:
            return per_ctx[0]
        if x >= cs[-1]:
            return per_ctx[-1]
        j = int(np.searchsorted(cs, x, side="right")) - 1
        f = (x - cs[j]) / (cs[j + 1] - cs[j])
        return per_ctx[j] * (1.0 - f) + per_ctx[j + 1] * f

    def theta(self, n, phi):
        return (1.0 + np.asarray(phi, dtype=np.float64)) / (self.draft + self.verify(n))


def theta_curve(logw_popped, cost):
    """theta(0), theta(1), ..., theta(len) for the nodes in pop order: Phi(n) sums exp(logw)
    of the first n popped nodes in float64."""
    w = np.asarray(logw_popped, dtype=np.float64)
    phi = np.concatenate([[0.0], np.cumsum(np.exp(w))])
    return cost.theta(np.arange(len(w) + 1, dtype=np.float64), phi)


def theta_gaps(logw_popped, cost):
    """Relative change (theta(n+1) - theta(n)) / theta(n) for every n in 0..len-1, not stopping
    anywhere: what each step of the stop rule compares."""
    th = theta_curve(logw_popped, cost)
    return list((th[1:] - th[:-1]) / th[:-1])


def cost_stop(logw_popped, cost):
    """Node count of the auto budget: pop while theta rises, i.e. stop at the first n with
    theta(n + 1) <= theta(n).  `logw_popped` are the weights of the nodes in pop order (the
    budget cap already applied).  Returns (n, theta curve)."""
    th = theta_curve(logw_popped, cost)
    for n in range(len(th) - 1):
        if not th[n + 1] > th[n]:
            return n, th
    return len(th) - 1, th


# ---------------------------------------------------------------------------- Philox


PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers (Salmon et al., SC'11)
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments (golden ratio, sqrt(3)-1)


def philox4x32(counter, key, rounds=10):
    """Philox4x32-R on Python ints: each round multiplies words 0 and 2 by the constants, the
    high halves are xored with words 3 / 1 and the round key, the low halves move over; the key
    is bumped by the Weyl constants between rounds."""
    c0, c1, c2, c3 = (int(x) & MASK32 for x in counter)
    k0, k1 = (int(x) & MASK32 for x in key)
    for rnd in range(rounds):
        if rnd:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        p0 = PHILOX_M0 * c0
        p1 = PHILOX_M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32)
    return [c0, c1, c2, c3]


def philox4x32_np(counters, keys, rounds=10):
    """Vectorised Philox4x32-R: counters [N, 4], keys [N, 2] (uint32) -> [N, 4] uint32."""
    c = np.asarray(counters, dtype=np.uint64) & MASK32
    k = np.asarray(keys, dtype=np.uint64) & MASK32
    c0, c1, c2, c3 = (c[:, i].copy() for i in range(4))
    k0, k1 = k[:, 0].copy(), k[:, 1].copy()
    m32 = np.uint64(MASK32)
    for rnd in range(rounds):
        if rnd:
            k0 = (k0 + np.uint64(PHILOX_W0)) & m32
            k1 = (k1 + np.uint64(PHILOX_W1)) & m32
        p0 = np.uint64(PHILOX_M0) * c0  # < 2^64: both factors < 2^32
        p1 = np.uint64(PHILOX_M1) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & m32,
                          (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & m32)
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


def rng_uniform(seed, rnd, node, lane=0):
    """The engine's uniform: Philox4x32-10 with counter (node, lane, round low, round high)
    and key (seed low, seed high); the top 24 bits of output word 0 scaled by 2^-24.
    The word layout is the engine's contract (sampler.c, ddt_rng_uniform); it is what makes a
    node's sample recomputable from (seed, round, node) alone."""
    out = philox4x32([node, lane, rnd & MASK32, (rnd >> 32) & MASK32],
                     [seed & MASK32, (seed >> 32) & MASK32])
    return F32(out[0] >> 8) * F32(1.0 / 16777216.0)


# ---------------------------------------------------------------------------- deterministic exp

_LOG2E = F32(1.44269504088896341)
_LN2_HI = F32(0.693145751953125)  # 12 significant bits: k * LN2_HI is exact for |k| < 2^12
_LN2_LO = F32(1.42860682030941723e-6)
_TAYLOR = [F32(1.0) / F32(d) for d in (720.0, 120.0, 24.0, 6.0)] + [F32(0.5), F32(1.0), F32(1.0)]
_EXP_LOW = F32(-87.3)
_EXP_HIGH = F32(88.7)


def _pow2(k):
    """2^k as float32 for integer array k in [-126, 127] (exact)."""
    return np.ldexp(np.ones(np.shape(k), dtype=F32), np.asarray(k, dtype=np.int32)).astype(F32)


def exp_det(x):
    """The deterministic float32 exp of detmath.h, one IEEE float32 operation at a time:
    k = round-half-away(x * log2 e); r = (x - k*ln2_hi) - k*ln2_lo; degree-6 Horner Taylor
    polynomial p(r); result p * 2^k (scaled in two steps near the ends of the range).
    0 below -87.3, +inf above 88.7, NaN for NaN."""
    x = np.atleast_1d(np.asarray(x, dtype=F32))
    out = np.zeros_like(x)
    with np.errstate(all="ignore"):
        nan = np.isnan(x)
        hi = x > _EXP_HIGH
        mid = ~nan & ~hi & ~(x < _EXP_LOW)
        xm = x[mid]
        t = xm * _LOG2E
        t = np.where(t < F32(0.0), t - F32(0.5), t + F32(0.5)).astype(F32)
        k = np.trunc(t).astype(np.int32)  # C's float -> int conversion truncates
        kf = k.astype(F32)
        r = (xm - kf * _LN2_HI) - kf * _LN2_LO
        p = np.full_like(xm, _TAYLOR[0])
        for c in _TAYLOR[1:]:
            p = p * r + c
        res = np.empty_like(xm)
        big = k > 127
        small = k < -125
        norm = ~big & ~small
        res[norm] = p[norm] * _pow2(k[norm])
        res[big] = (p[big] * _pow2(k[big] - 1)) * F32(2.0)
        res[small] = (p[small] * _pow2(k[small] + 64)) * _pow2(np.full(small.sum(), -64))
        out[mid] = res
        out[hi] = np.inf
        out[nan] = np.nan
    return out


# ---------------------------------------------------------------------------- sampler


def check_sampling(temperature, top_k, top_p):
    t, p = float(F32(temperature)), float(F32(top_p))
    if not (t >= 0.0) or math.isinf(t):
        raise RefError("temperature", "temperature", t)
    if top_k < 0:
        raise RefError("top_k", "top_k", top_k)
    if not (0.0 < p <= 1.0):
        raise RefError("top_p", "top_p", p)


def chunked_cumsum(w):
    """Cumulative sums in float32, chunked: cum(i) = P(c) + s_c(i), s_c the sequential sum
    within chunk c up to i, P(c) the sequential sum of the totals of chunks before c."""
    w = np.asarray(w, dtype=F32)
    cum = np.empty_like(w)
    prefix = F32(0.0)
    for c0 in range(0, len(w), SAMPLE_CHUNK):
        s = np.add.accumulate(w[c0:c0 + SAMPLE_CHUNK], dtype=F32)  # sequential, left to right
        cum[c0:c0 + SAMPLE_CHUNK] = prefix + s
        prefix = F32(prefix + s[-1])
    return cum


def sample_token(logits, temperature, top_k, top_p, seed, rnd, node):
    """The target's next token at a node, following the arithmetic documented in sampler.c:
    greedy at T = 0 (lowest id on ties); else e_i = exp_det((z_i - max z) / T) over the
    candidates (all, or the top_k by (z desc, id asc)) in canonical order (id ascending, or
    (z desc, id asc) with top-p), chunked float32 cumulative sums, top-p cut at the first cum
    >= top_p * total, and the first kept position whose cum exceeds u * kept mass."""
    z = np.asarray(logits, dtype=F32)
    V = len(z)
    check_sampling(temperature, top_k, top_p)
    if V < 1:
        raise RefError("vocab", V)
    nan = np.flatnonzero(np.isnan(z))
    if len(nan):
        raise RefError("nan_logit", int(nan[0]))
    if F32(temperature) == 0:
        return int(np.argmax(z))  # first maximum: lowest id on ties
    m = z.max()
    if m == -np.inf:
        raise RefError("all_neg_inf", None)
    if m == np.inf:
        raise RefError("pos_inf_logit", int(np.argmax(z)))
    use_topk = 0 < top_k < V
    use_topp = F32(top_p) < F32(1.0)
    ids = np.arange(V)
    if use_topk or use_topp:
        order = np.lexsort((ids, -z))  # z descending, then id ascending
        if use_topk:
            order = order[:top_k]
        if not use_topp:
            order = np.sort(order)
    else:
        order = ids
    with np.errstate(all="ignore"):
        w = exp_det((z[order] - m) / F32(temperature))
    cum = chunked_cumsum(w)
    n = len(order)
    if use_topp:
        limit = F32(top_p) * cum[-1]
        j = int(np.argmax(cum >= limit))  # exists: top_p <= 1 so limit <= cum[-1]
        n = j + 1
    mass = cum[n - 1]
    target = rng_uniform(seed, rnd, node, 0) * mass
    above = np.flatnonzero(cum[:n] > target)
    pick = int(above[0]) if len(above) else n - 1
    return int(order[pick])


def softmax_restricted(logits, temperature, top_k=0, top_p=1.0):
    """Exact (float64) sampling distribution of softmax(z / T) restricted by top-k then top-p,
    for the statistical test."""
    z = np.asarray(logits, dtype=np.float64)
    V = len(z)
    order = np.lexsort((np.arange(V), -z))
    if 0 < top_k < V:
        order = order[:top_k]
    p = np.exp((z[order] - z.max()) / temperature)
    p /= p.sum()
    if top_p < 1.0:
        j = int(np.argmax(np.cumsum(p) >= top_p * (1 - 1e-12)))
        order, p = order[:j + 1], p[:j + 1] / p[:j + 1].sum()
    out = np.zeros(V)
    out[order] = p
    return out


# ---------------------------------------------------------------------------- statistics


def gamma_q(a, x):
    """Regularised upper incomplete gamma Q(a, x): a power series for P when x < a + 1, else a
    continued fraction for Q evaluated with the modified Lentz method."""
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        ap = a
        for _ in range(10000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def chi_square_pvalue(observed, expected):
    """Pearson chi-square goodness of fit over categories with expected > 0; returns
    (statistic, degrees of freedom, p-value).  Observed counts in a zero-expectation category
    give p = 0."""
    observed = np.asarray(observed, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if np.any(observed[expected == 0] > 0):
        return math.inf, 0, 0.0
    m = expected > 0
    stat = float(np.sum((observed[m] - expected[m]) ** 2 / expected[m]))
    dof = int(m.sum()) - 1
    return stat, dof, gamma_q(dof / 2.0, stat / 2.0)
