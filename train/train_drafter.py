#!/usr/bin/env python3
"""train_drafter.py — train the DFlash drafter on the target's own continuations (greedy, optionally some
sampled at T = 1; hard or soft labels) and export it
in the HF DFlash layout the C engine loads.

    python3 train/train_drafter.py --seconds 240 --target models/pystdlib-target --out models/pystdlib-dflash
    python3 train/train_drafter.py --seconds 20 --tiny --target /tmp/t/target --out /tmp/t/drafter   # CPU test

1. Data.  --prompts windows from the train split (uniform random offsets, no [EOS] inside) with prompt
   lengths cycling over 8/16/32/48 per generation batch; the target (loaded from --target, bf16 weights
   computed in fp32, as the engine computes) continues each greedily, with its KV cache, to --seq-len
   tokens in all.  One more full forward pass over each sequence gives the features: the hidden states
   output by target layers target_layer_ids (default [1, 3]; HF hidden_states[id + 1], so never the last
   layer, whose HF hidden state is after the final norm), concatenated.  The same is done for
   --heldout-prompts windows of the held-out split (evaluation only).  --data-cache keeps the generated
   sequences in a file, so several drafters (--layers, --intermediate, --target-layers) can be trained on
   one generation, e.g. side by side after a --generate-only run.
   --sampled-frac f: a random f of the --prompts are continued by sampling the target at T = 1 (its full
   softmax) instead of greedily, so the drafter also learns the contexts it meets when decoding at T = 1;
   the held-out prompts are continued both ways (greedy for the T = 0 numbers, sampled for the T = 1
   proxies; --no-t1-eval skips the latter).
2. Training example.  For an anchor a (prompt length <= a <= seq_len - L): context = features of
   positions < a; block = [token a, MASK x 15] at positions a..a+15 (MASK = [UNK], id 4350, as Kimi's
   drafter uses [UNK]); labels = tokens a+1..a+15, i.e. the target's own greedy tokens.  --anchors
   anchors per sequence share one pass (explicit mask: a block sees context < its anchor and its own
   block, non-causally).  Loss: cross-entropy weighted by exp(-(i-1)/7) over block position i = 1..15
   (the DFlash paper's decay), normalised by the weight sum.  --kd-weight w > 0 (distillation) mixes in
   soft labels: (1 - w) * that + w * cross-entropy against the target's full next-token distribution at
   each labelled position (T = 1), i.e. forward KL(p_target || q_drafter) up to p's entropy.  p is not
   stored (N x S x V floats): the feature pass also keeps the target's last hidden state (after its final
   norm, fp32), and each step computes p = softmax(h @ lm_head.T) for its blocks on the device (block_loss,
   target_probs).  The target's embed_tokens and lm_head are used frozen.  AdamW, warm-up then cosine
   over the wall-clock budget, bf16 autocast on CUDA.  --init DIR starts from an exported drafter's
   weights (config.json + model.safetensors, bf16, as the C engine loads them; load_init) instead of a
   random init, for fine-tuning; its shape must be the requested one (--layers, --intermediate,
   --target-layers), else the run stops before making any data.
3. Check.  dflash_torch.check_against_reference: the module equals the fixture reference drafter.
4. Evaluation, on every anchor of the held-out continuations.  Held-out loss; per anchor, acc = 1 + the
   number of leading positions whose argmax equals the target's token (what one greedy DFlash round
   anchored there commits); and the chain acceptance the C engine would report, tokens / rounds of the
   rounds greedy decoding actually runs (ddt_common.chain_walk: each round starts where the last one
   ended).  The mean of acc over anchors (reported as anchor_mean) is not that: the shipped drafter has
   anchor mean 3.87 but chain acceptance 2.16 on the same continuations, because acc is bimodal (38 %
   of anchors 1, 8 % 16) and one round crosses a run of easy positions that the mean counts one by one.
   On the held-out continuations sampled at T = 1, two expected tokens-per-round proxies (evaluate(),
   expected_walk): t1_match (the engine's sample-and-match verification of a greedy-drafted chain:
   position i goes on with probability p_i(argmax q_i)) and t1_minpq (rejection-sampling verification:
   sum_x min(p_i, q_i)), plus the KL; p along the sampled tokens (teacher-forced), so proxies, not
   the engine's number.  --compare DIR evaluates an existing drafter (e.g. the shipped one) on the same sets.
5. Export: the evaluated weights with the best held-out score, select_score: --select chain (greedy chain
   acceptance, the default), t1 (t1_match), both (their sum) or loss (the first drafter was chosen so):
   config.json (ddt_common.drafter_config) + model.safetensors in bf16, the same format as before.
"""

import argparse
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddt_common as C  # noqa: E402
from dflash_torch import DFlashDrafter, check_against_reference  # noqa: E402

PROMPT_LENS = (8, 16, 32, 48)


def sample_prompts(stream: np.ndarray, n: int, rng, seq_len: int):
    """n (start, prompt_len) pairs; windows of seq_len tokens hold no [EOS] in the prompt part."""
    out = []
    while len(out) < n:
        plen = PROMPT_LENS[len(out) // 1 % len(PROMPT_LENS)]
        s = int(rng.integers(0, len(stream) - seq_len))
        if (stream[s:s + plen] == C.EOS_ID).any():
            continue
        out.append((s, plen))
    return out


@torch.no_grad()
def generate(model, stream, prompts, seq_len, batch, device, log, sampled=None, seed=0):
    """Continuations to seq_len tokens: tokens [N, seq_len] int64 (CPU) and prompt lengths [N].  Greedy,
    except the sequences with sampled[i] True, which are continued by sampling the target's full
    distribution at temperature 1 (no top-k/top-p; the contexts the drafter meets at T = 1).  Batches
    hold one prompt length and one mode; sampling draws from one seeded generator on the device."""
    from transformers import DynamicCache
    sampled = [False] * len(prompts) if sampled is None else [bool(v) for v in sampled]
    g = torch.Generator(device=device).manual_seed(seed)

    def next_token(logits, smp):
        if not smp:
            return logits.argmax(-1, keepdim=True)
        return torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=g)

    by_len = {}
    for i, (s, plen) in enumerate(prompts):
        by_len.setdefault((plen, sampled[i]), []).append(i)
    tokens = torch.zeros(len(prompts), seq_len, dtype=torch.int64)
    plens = torch.zeros(len(prompts), dtype=torch.int64)
    t0 = time.time()
    for (plen, smp), idx in sorted(by_len.items()):
        for j in range(0, len(idx), batch):
            ids = idx[j:j + batch]
            x = torch.from_numpy(np.stack([stream[prompts[i][0]:prompts[i][0] + plen] for i in ids]).astype(np.int64))
            x = x.to(device)
            cache = DynamicCache(config=model.config)
            out = model(input_ids=x, past_key_values=cache, use_cache=True)
            seq = [x]
            nxt = next_token(out.logits[:, -1], smp)
            for _ in range(seq_len - plen):
                seq.append(nxt)
                if sum(t.shape[1] for t in seq) == seq_len:
                    break
                out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
                nxt = next_token(out.logits[:, -1], smp)
            tokens[ids] = torch.cat(seq, 1).cpu()
            plens[ids] = plen
    log(f"generated {len(prompts)} sequences of {seq_len} tokens ({sum(sampled)} sampled at T = 1) "
        f"in {time.time() - t0:.1f} s")
    return tokens, plens


@torch.no_grad()
def features_of(model, tokens, layer_ids, batch, device, dtype, final=False):
    """Target features [N, S, len(ids)*H] (dtype, on device).  With final=True also the target's last
    hidden state [N, S, H] (fp32, on device): HF's hidden_states[-1] is after the final norm, so
    final[:, j] @ lm_head.T are exactly the target's logits for token j + 1 (checked on the tiny target).
    That is what the soft labels are computed from, per batch (all logits would be N x S x V floats)."""
    N, S, H = len(tokens), tokens.shape[1], model.config.hidden_size
    feats = torch.empty(N, S, len(layer_ids) * H, dtype=dtype, device=device)   # filled in place: no
    fin = torch.empty(N, S, H, dtype=torch.float32, device=device) if final else None   # 2x peak from cat
    for j in range(0, N, batch):
        x = tokens[j:j + batch].to(device)
        out = model(input_ids=x, output_hidden_states=True, use_cache=False)
        feats[j:j + batch] = torch.cat([out.hidden_states[i + 1] for i in layer_ids], -1).to(dtype)
        if final:
            fin[j:j + batch] = out.hidden_states[-1].float()
    return (feats, fin) if final else feats


def target_probs(final, anchors, L, lm_head):
    """The target's next-token distributions (temperature 1, fp32) for the labelled tokens a+1..a+L-1 of
    each block: [B, A, L-1, V] from final [B, S, H] at positions a..a+L-2 (device tensors)."""
    idx = anchors[:, :, None] + torch.arange(L - 1, device=final.device)                  # [B, A, L-1]
    h = torch.gather(final, 1, idx.reshape(len(final), -1, 1).expand(-1, -1, final.shape[-1]))
    return torch.softmax(h.float() @ lm_head.float().T, -1).view(*idx.shape, -1)


def pick_anchors(plens, seq_len, L, A, gen):
    """[B, A] distinct anchors per sequence, uniform in [plen, seq_len - L], sorted."""
    out = []
    for p in plens.tolist():
        hi = seq_len - L
        cand = torch.randperm(hi - p + 1, generator=gen)[:A] + p
        if len(cand) < A:  # too few positions: repeat (only with tiny settings)
            cand = cand[torch.arange(A) % len(cand)]
        out.append(torch.sort(cand).values)
    return torch.stack(out)


def blocks_and_labels(tokens, anchors, L):
    """block ids [B, A, L] = [token a, MASK...]; labels [B, A, L-1] = tokens a+1..a+L-1."""
    idx = anchors[:, :, None] + torch.arange(L)
    full = torch.gather(tokens, 1, idx.reshape(len(tokens), -1)).view(idx.shape)
    block = torch.full_like(full, C.MASK_ID)
    block[:, :, 0] = full[:, :, 0]
    return block, full[:, :, 1:]


def block_loss(logits, labels, weights, p_soft=None, kd_weight=0.0):
    """Weighted cross-entropy over the block positions.  kd_weight = 0: against the hard labels (the
    target's own tokens, as the shipped drafter was trained).  kd_weight > 0: (1 - w) * that +
    w * cross-entropy against p_soft, the target's full distribution at each labelled position
    (temperature 1); the soft part is KL(p_target || q_drafter) + H(p_target), i.e. forward KL up to a
    term the drafter cannot change."""
    V = logits.shape[-1]
    lg = logits.float().reshape(-1, V)
    ce = F.cross_entropy(lg, labels.reshape(-1), reduction="none") if kd_weight < 1 else 0.0
    if kd_weight > 0:
        soft = F.cross_entropy(lg, p_soft.reshape(-1, V), reduction="none")
        ce = (1 - kd_weight) * ce + kd_weight * soft if kd_weight < 1 else soft
    ce = ce.view(labels.shape)
    return (ce * weights).sum() / (weights.sum() * labels.shape[0] * labels.shape[1])


def expected_walk(alpha, starts):
    """Expected (tokens, rounds) of chain decoding over continuations whose rounds are random: alpha
    [R, n, L-1] is, for the anchor at index k of row r, the probability that draft position i is
    accepted given positions < i were (so one round there commits acc = 1 + m tokens with
    P(m) = c_m - c_{m+1}, c_m = prod_{i<m} alpha_i, c_L-1 = P(all)); rounds start at index starts[r]
    and each next one where the last ended, as ddt_common.chain_walk.  Backward recursion over k:
    Rnd[k] = 1 + sum_m P_k(m) Rnd[k+1+m], Tok[k] = sum_m P_k(m) (1 + m + Tok[k+1+m]), 0 past the end.
    With alpha in {0, 1} this is chain_walk exactly (checked in evaluate()).  Returns two floats:
    sum over rows of Tok[starts] and of Rnd[starts]."""
    R, n, D = alpha.shape
    a = alpha.double().cpu()
    c = torch.cat([torch.ones(R, n, 1, dtype=a.dtype), a.cumprod(-1)], -1)          # c_0..c_D
    P = torch.cat([c[..., :-1] - c[..., 1:], c[..., -1:]], -1)                      # P(m), m = 0..D
    steps = torch.arange(1, D + 2, dtype=a.dtype)                                   # acc = 1 + m
    rnd = torch.zeros(R, n + D + 1, dtype=a.dtype)
    tok = torch.zeros(R, n + D + 1, dtype=a.dtype)
    for k in range(n - 1, -1, -1):
        rnd[:, k] = 1 + (P[:, k] * rnd[:, k + 1:k + D + 2]).sum(-1)
        tok[:, k] = (P[:, k] * (steps + tok[:, k + 1:k + D + 2])).sum(-1)
    st = torch.as_tensor(starts, dtype=torch.int64)
    rows = torch.arange(R)
    return float(tok[rows, st].sum()), float(rnd[rows, st].sum())


@torch.no_grad()
def evaluate(drafter, he, embed, lm_head, weights, L, device, amp, bs, chunk=32):
    """Every anchor (plen <= a <= seq_len - L) of every held-out continuation.

    he["greedy"] = (feats, tokens, plens): the target's greedy continuations (T = 0).  The weighted loss
    against the target's tokens, the acceptance acc[a] = 1 + leading argmax matches of the block at a,
    and the greedy chain decoding's rounds over the continuation (ddt_common.chain_walk: a round starts
    where the previous one ended).  "chain_acceptance" = tokens / rounds, what the C engine reports;
    "anchor_mean" = mean of acc over all anchors (the pre-fix metric, much higher because one round
    crosses a run of easy positions that the mean counts position by position).

    he["sampled"] = (feats, tokens, plens, final), optional: continuations of the same prompts sampled
    from the target at T = 1, with its last hidden states (so p_target at every position).  T = 1
    proxies, teacher-forced along the sampled continuation (p_i = the target's distribution for token
    a+i given the sampled tokens before it, q_i = the drafter's softmax at block position i), each turned
    into tokens per round by expected_walk (rounds start where the last one ended, as in decoding):
      "t1_match"  alpha_i = p_i(argmax q_i): the engine's verification at T > 0 is sample-and-match
                  (src/core/walk.c: the target samples its token at each node and the walk follows the
                  child holding it), so a greedy-drafted chain goes on with probability p(draft token).
                  The tree does better (it covers several tokens per depth), but this ranks drafters.
      "t1_minpq"  alpha_i = sum_x min(p_i(x), q_i(x)): rejection-sampling chain verification (drafts
                  sampled from q; Leviathan et al.), for comparison with the literature.
      "t1_kl"     weighted KL(p || q) per block position, nats.
    Both proxies take p along the sampled tokens, not along the drafted ones (which would need a target
    pass per anchor); a round that has accepted i drafts has a prefix drawn from p, as the stored one
    is, but not the same prefix.  With alpha in {0, 1} expected_walk is chain_walk; that is checked
    here on the greedy set every time."""
    drafter.eval()
    out = {}
    for name in ("greedy", "sampled"):
        if he.get(name) is None:
            continue
        feats, tokens, plens = he[name][:3]
        final = he[name][3] if name == "sampled" else None
        S = tokens.shape[1]
        hi = S - L
        loss_sum, n_anchor, acc_sum, walk_tokens, walk_rounds = 0.0, 0, 0, 0, 0
        ex = {"match": [0.0, 0.0], "minpq": [0.0, 0.0], "check": [0.0, 0.0]}
        kl_sum = 0.0
        for j in range(0, len(tokens), bs):
            tok, pl = tokens[j:j + bs], plens[j:j + bs]
            lo = int(pl.min())
            f = feats[j:j + bs] if amp else feats[j:j + bs].float()   # bf16 features, fp32 compute
            losses, accs, a_match, a_minpq, kls = [], [], [], [], []
            for a0 in range(lo, hi + 1, chunk):
                an = torch.arange(a0, min(a0 + chunk, hi + 1))[None].expand(len(tok), -1).contiguous()
                blk, lab = blocks_and_labels(tok, an, L)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                    logits = drafter(f, an.to(device), blk.to(device), embed, lm_head)
                lab = lab.to(device)
                ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), lab.reshape(-1), reduction="none")
                losses.append(((ce.view(lab.shape) * weights).sum(-1) / weights.sum()).cpu())
                accs.append((1 + (logits.argmax(-1) == lab).int().cumprod(-1).sum(-1)).cpu())
                if final is not None:
                    p = target_probs(final[j:j + bs], an.to(device), L, lm_head)          # [b, c, L-1, V]
                    logq = torch.log_softmax(logits.float(), -1)
                    q = logq.exp()
                    a_match.append(p.gather(-1, q.argmax(-1, keepdim=True))[..., 0].cpu())
                    a_minpq.append(torch.minimum(p, q).sum(-1).cpu())
                    kl = (p * (torch.log(p.clamp_min(1e-30)) - logq)).sum(-1)
                    kls.append(((kl * weights).sum(-1) / weights.sum()).cpu())
                    del p, q, logq
            losses, accs = torch.cat(losses, 1), torch.cat(accs, 1)          # [b, hi - lo + 1]
            starts = (pl - lo).tolist()
            for r in range(len(tok)):
                k = starts[r]
                loss_sum += float(losses[r, k:].sum())
                acc_sum += int(accs[r, k:].sum())
                n_anchor += accs.shape[1] - k
                t, n = C.chain_walk(accs[r, k:].tolist())
                walk_tokens += t
                walk_rounds += n
            if name == "greedy":   # expected_walk on 0/1 alphas must reproduce chain_walk
                hit = (torch.arange(L - 1)[None, None] < (accs - 1)[..., None]).double()
                t, n = expected_walk(hit, starts)
                ex["check"][0] += t
                ex["check"][1] += n
            else:
                for key, al in (("match", a_match), ("minpq", a_minpq)):
                    t, n = expected_walk(torch.cat(al, 1), starts)
                    ex[key][0] += t
                    ex[key][1] += n
                kls = torch.cat(kls, 1)
                kl_sum += sum(float(kls[r, starts[r]:].sum()) for r in range(len(tok)))
        if name == "greedy":
            if (abs(ex["check"][0] - walk_tokens) > 1e-6 * walk_tokens
                    or abs(ex["check"][1] - walk_rounds) > 1e-6 * walk_rounds):
                raise SystemExit(f"expected_walk {ex['check']} != chain_walk {(walk_tokens, walk_rounds)}")
            out.update({"loss": loss_sum / n_anchor, "chain_acceptance": walk_tokens / walk_rounds,
                        "anchor_mean": acc_sum / n_anchor})
        else:
            out.update({"t1_match": ex["match"][0] / ex["match"][1], "t1_minpq": ex["minpq"][0] / ex["minpq"][1],
                        "t1_kl": kl_sum / n_anchor})
    drafter.train()
    return out


def eval_record(ev):
    """The evaluate() numbers under the names the metrics JSON uses (rounded)."""
    rec = {"heldout_loss": round(ev["loss"], 4), "heldout_chain_acceptance": round(ev["chain_acceptance"], 3),
           "heldout_anchor_mean_acceptance": round(ev["anchor_mean"], 3)}
    if "t1_match" in ev:
        rec.update({"heldout_t1_match_acceptance": round(ev["t1_match"], 3),
                    "heldout_t1_minpq_acceptance": round(ev["t1_minpq"], 3),
                    "heldout_t1_kl": round(ev["t1_kl"], 4)})
    return rec


def select_score(rec, select):
    """Higher is better.  chain: held-out greedy chain acceptance (T = 0, the default, as before);
    t1: the T = 1 proxy heldout_t1_match_acceptance; both: their sum (equal weight in tokens per round);
    loss: minus the held-out loss."""
    if select == "loss":
        return -rec["heldout_loss"]
    if select == "chain":
        return rec["heldout_chain_acceptance"]
    if select == "t1":
        return rec["heldout_t1_match_acceptance"]
    return rec["heldout_chain_acceptance"] + rec["heldout_t1_match_acceptance"]


SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size", "block_size", "num_target_layers")


def load_init(folder, dcfg):
    """The fp32 state dict of an exported drafter (config.json + model.safetensors, bf16 as written below
    and as the C engine loads it), for fine-tuning from it.  Its config must give the shape dcfg asks
    for (SHAPE_KEYS, target_layer_ids, mask token) and every tensor the module's shape; SystemExit names
    what differs otherwise."""
    from safetensors.torch import load_file
    cfg_path, w_path = os.path.join(folder, "config.json"), os.path.join(folder, "model.safetensors")
    for f in (cfg_path, w_path):
        if not os.path.exists(f):
            raise SystemExit(f"--init {folder}: {f} not found (want config.json + model.safetensors)")
    icfg = C.read_json(cfg_path)
    diff = [f"{k} {icfg.get(k)} != {dcfg[k]}" for k in SHAPE_KEYS if icfg.get(k) != dcfg[k]]
    for k in ("target_layer_ids", "mask_token_id"):
        got = icfg.get("dflash_config", {}).get(k)
        if got != dcfg["dflash_config"][k]:
            diff.append(f"{k} {got} != {dcfg['dflash_config'][k]}")
    if diff:
        raise SystemExit(f"--init {folder}: its shape is not the requested one ({'; '.join(diff)}); "
                         f"pass the matching --layers / --intermediate / --target-layers")
    want = {k: tuple(v.shape) for k, v in DFlashDrafter(dcfg).state_dict().items()}
    got = {k: v.float() for k, v in load_file(w_path).items()}
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    bad = [f"{k} {tuple(got[k].shape)} != {want[k]}" for k in want if k in got and tuple(got[k].shape) != want[k]]
    if missing or extra or bad:
        raise SystemExit(f"--init {folder}: weights do not match the requested drafter (missing {missing[:4]}, "
                         f"unexpected {extra[:4]}, shapes {bad[:4]})")
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=C.DATA_DIR)
    ap.add_argument("--target", default=C.TARGET_DIR)
    ap.add_argument("--out", default=C.DRAFTER_DIR)
    ap.add_argument("--metrics", default=None, help="metrics JSON (default: <out>_train_metrics.json)")
    ap.add_argument("--log", default=None)
    ap.add_argument("--seconds", type=float, default=240.0, help="wall-clock training budget (after the data)")
    ap.add_argument("--tiny", action="store_true", help="tiny drafter, few sequences: CPU smoke test")
    ap.add_argument("--seed", type=int, default=20240612)
    ap.add_argument("--prompts", type=int, default=4096)
    ap.add_argument("--heldout-prompts", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=192, help="prompt + greedy continuation")
    ap.add_argument("--gen-batch", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64, help="sequences per step")
    ap.add_argument("--anchors", type=int, default=16, help="blocks per sequence per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--decay-gamma", type=float, default=7.0, help="loss weight exp(-(i-1)/gamma)")
    ap.add_argument("--eval-seconds", type=float, default=30.0)
    ap.add_argument("--layers", type=int, default=2, help="drafter layers")
    ap.add_argument("--intermediate", type=int, default=0, help="drafter MLP width (0: 768, tiny 128)")
    ap.add_argument("--target-layers", default="",
                    help="comma-separated target layers whose outputs are the features (default: the rule "
                         "round(1 + i*(T-4)/(N-1)) over the drafter's N layers); each < T - 1")
    ap.add_argument("--select", choices=("chain", "t1", "both", "loss"), default="chain",
                    help="export the evaluated weights with the best held-out score (select_score): chain = "
                         "greedy chain acceptance (tokens per round of greedy chain decoding, as the engine "
                         "counts; the default), t1 = the T = 1 proxy heldout_t1_match_acceptance, both = their "
                         "sum, loss = the lowest held-out loss")
    ap.add_argument("--kd-weight", type=float, default=0.0,
                    help="distillation: weight of the soft labels (the target's full next-token distribution, "
                         "T = 1, from its last hidden state through lm_head) against the hard labels (its own "
                         "tokens); 0 = hard labels only (the shipped drafter), 1 = soft labels only")
    ap.add_argument("--sampled-frac", type=float, default=0.0,
                    help="fraction of the --prompts continued by sampling the target at T = 1 instead of "
                         "greedily (random subset, seeded)")
    ap.add_argument("--init", default="",
                    help="a drafter folder in the exported format (config.json + model.safetensors, as the C "
                         "engine loads it) whose weights are the starting point (fine-tuning); its shape must "
                         "be the one this run asks for (--layers, --intermediate, --target-layers)")
    ap.add_argument("--no-t1-eval", action="store_true",
                    help="skip the held-out continuations sampled at T = 1 and the T = 1 proxies")
    ap.add_argument("--compare", default="",
                    help="a drafter folder (e.g. models/pystdlib-dflash) to evaluate once on the same held-out "
                         "sets before training (recorded as 'compare' in the metrics); skipped when its "
                         "target_layer_ids differ from this run's")
    ap.add_argument("--generate-only", action="store_true",
                    help="stop after writing --data-cache (then run drafters on it, e.g. side by side)")
    ap.add_argument("--feature-batch", type=int, default=128, help="sequences per feature pass")
    ap.add_argument("--data-cache", default=None,
                    help="file of the generated token sequences: read when it exists and was made with the same "
                         "target, seed, prompts and lengths, else written; lets several drafter runs share one "
                         "generation")
    args = ap.parse_args()
    if args.select in ("t1", "both") and args.no_t1_eval:
        raise SystemExit(f"--select {args.select} needs the T = 1 evaluation (drop --no-t1-eval)")
    if not 0 <= args.kd_weight <= 1 or not 0 <= args.sampled_frac <= 1:
        raise SystemExit("--kd-weight and --sampled-frac must be in [0, 1]")

    log = C.Log(args.log)
    C.seed_everything(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    amp = device == "cuda"
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False   # the features must be fp32, as the engine's
    if args.tiny:
        args.prompts, args.heldout_prompts = min(args.prompts, 32), min(args.heldout_prompts, 8)
        args.seq_len, args.gen_batch, args.batch = min(args.seq_len, 80), min(args.gen_batch, 16), min(args.batch, 4)
        args.anchors, args.warmup = min(args.anchors, 4), min(args.warmup, 5)
        args.eval_seconds = min(args.eval_seconds, args.seconds / 2)

    from transformers import DeepseekV3ForCausalLM
    impl = "grouped_mm" if device == "cuda" else "eager"
    target = DeepseekV3ForCausalLM.from_pretrained(args.target, dtype=torch.float32, attn_implementation="sdpa",
                                                   experts_implementation=impl).to(device).eval()
    tcfg = target.config.to_dict()
    tcfg_min = {"hidden_size": tcfg["hidden_size"], "num_hidden_layers": tcfg["num_hidden_layers"],
                "vocab_size": tcfg["vocab_size"], "max_position_embeddings": tcfg["max_position_embeddings"]}
    ids_arg = [int(x) for x in args.target_layers.split(",")] if args.target_layers else None
    dcfg = C.drafter_config(tcfg_min, args.tiny, args.layers, args.intermediate or None, ids_arg)
    tl = dcfg["dflash_config"]["target_layer_ids"]
    # HF's last hidden state is after the final norm, the engine captures layer outputs before it.
    if not all(0 <= i < tcfg["num_hidden_layers"] - 1 for i in tl):
        raise SystemExit(f"target layers {tl}: ids must be in 0..{tcfg['num_hidden_layers'] - 2}")
    L = dcfg["block_size"]
    layer_ids = dcfg["dflash_config"]["target_layer_ids"]
    init_state = load_init(args.init, dcfg) if args.init else None   # checked before the data is made
    embed = target.model.embed_tokens.weight.detach().float()
    lm_head = target.lm_head.weight.detach().float()
    log(f"target {args.target}: {tcfg['num_hidden_layers']} layers, hidden {tcfg['hidden_size']}; "
        f"drafter layers {dcfg['num_hidden_layers']}, block {L}, target_layer_ids {layer_ids}, mask {C.MASK_ID}")

    rng = np.random.default_rng(args.seed)
    train_stream = C.load_tokens("train", args.data)
    held_stream = C.load_tokens("heldout", args.data)
    t_data = time.time()
    tr_prompts = sample_prompts(train_stream, args.prompts, rng, args.seq_len)
    he_prompts = sample_prompts(held_stream, args.heldout_prompts, rng, args.seq_len)
    # Which train prompts are continued by sampling: its own generator, so that the prompts above (and
    # the held-out greedy set the exported numbers are compared on) are those of --sampled-frac 0.
    n_smp = int(round(args.sampled_frac * len(tr_prompts)))
    tr_smp = np.zeros(len(tr_prompts), dtype=bool)
    tr_smp[np.random.default_rng(args.seed + 1).permutation(len(tr_prompts))[:n_smp]] = True
    t1_eval = not args.no_t1_eval
    cache_key = {"target": os.path.abspath(args.target), "seed": args.seed, "seq_len": args.seq_len,
                 "train": tr_prompts, "heldout": he_prompts, "sampled_frac": args.sampled_frac, "t1_eval": t1_eval}
    cached = torch.load(args.data_cache) if args.data_cache and os.path.exists(args.data_cache) else None
    if cached is not None and cached["key"] == cache_key:
        tr_tok, tr_pl, he_tok, he_pl = cached["tr_tok"], cached["tr_pl"], cached["he_tok"], cached["he_pl"]
        hs_tok, hs_pl = cached["hs_tok"], cached["hs_pl"]
        log(f"sequences read from {args.data_cache}")
    else:
        tr_tok, tr_pl = generate(target, train_stream, tr_prompts, args.seq_len, args.gen_batch, device, log,
                                 sampled=tr_smp, seed=args.seed)
        he_tok, he_pl = generate(target, held_stream, he_prompts, args.seq_len, args.gen_batch, device, log)
        # The same held-out prompts continued at T = 1, for the T = 1 proxies of evaluate().
        hs_tok, hs_pl = (generate(target, held_stream, he_prompts, args.seq_len, args.gen_batch, device, log,
                                  sampled=[True] * len(he_prompts), seed=args.seed + 2)
                         if t1_eval else (None, None))
        if args.data_cache:
            torch.save({"key": cache_key, "tr_tok": tr_tok, "tr_pl": tr_pl, "he_tok": he_tok, "he_pl": he_pl,
                        "hs_tok": hs_tok, "hs_pl": hs_pl}, args.data_cache)
            log(f"sequences written to {args.data_cache}")
    if args.generate_only:
        if not args.data_cache:
            raise SystemExit("--generate-only needs --data-cache")
        return
    feat_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    kd = args.kd_weight > 0
    # With --kd-weight, also the target's last hidden states [N, S, H] fp32 (6.4 GB for 32768 x 192 on
    # the GPU), from which each step computes the soft labels; the held-out sampled set needs them too.
    tr_out = features_of(target, tr_tok, layer_ids, args.feature_batch, device, feat_dtype, final=kd)
    tr_feat, tr_final = tr_out if kd else (tr_out, None)
    he_feat = features_of(target, he_tok, layer_ids, args.feature_batch, device, feat_dtype)
    he = {"greedy": (he_feat, he_tok, he_pl)}
    if t1_eval:
        hs_feat, hs_final = features_of(target, hs_tok, layer_ids, args.feature_batch, device, feat_dtype, final=True)
        he["sampled"] = (hs_feat, hs_tok, hs_pl, hs_final)
    data_seconds = time.time() - t_data

    # How repetitive are the continuations? (distinct 4-grams per generated token, greedy and sampled)
    def distinct4(rows):
        gen_part = [tr_tok[i, tr_pl[i]:].tolist() for i in rows[:512]]
        if not gen_part:
            return None
        return round(float(np.mean([len({tuple(g[k:k + 4]) for k in range(len(g) - 3)}) / max(1, len(g) - 3)
                                    for g in gen_part])), 3)
    distinct = distinct4(np.flatnonzero(~tr_smp).tolist())
    distinct_smp = distinct4(np.flatnonzero(tr_smp).tolist())
    log(f"features {tuple(tr_feat.shape)} {feat_dtype}; data took {data_seconds:.1f} s; "
        f"distinct 4-grams per generated position: greedy {distinct}, sampled {distinct_smp}")
    del target
    if device == "cuda":
        torch.cuda.empty_cache()

    drafter = DFlashDrafter(dcfg).to(device)
    ref_err = check_against_reference(drafter, tr_feat[0], tr_tok[0], int(tr_pl[0]) + 3, embed, lm_head)
    log(f"drafter module vs fixture reference (random init): rel err {ref_err:.2e}")
    if ref_err > 1e-5:
        raise SystemExit("the training module does not compute what the reference drafter computes")
    if init_state is not None:
        drafter.load_state_dict(init_state)
        log(f"initial weights from {args.init} ({len(init_state)} tensors)")
    n_params = sum(p.numel() for p in drafter.parameters())
    embed, lm_head = embed.to(device), lm_head.to(device)
    weights = torch.exp(-torch.arange(L - 1, dtype=torch.float32) / args.decay_gamma).to(device)
    ev_bs = 16 if device == "cuda" else 4

    compare = None
    if args.compare:   # an existing drafter on the same held-out sets, fp32 compute as "exported" below
        from safetensors.torch import load_file
        ccfg = C.read_json(os.path.join(args.compare, "config.json"))
        if ccfg["dflash_config"]["target_layer_ids"] != layer_ids:
            log(f"--compare {args.compare}: target_layer_ids {ccfg['dflash_config']['target_layer_ids']} "
                f"!= {layer_ids}, skipped")
        else:
            other = DFlashDrafter(ccfg).to(device)
            w_other = load_file(os.path.join(args.compare, "model.safetensors"))
            other.load_state_dict({k: v.float() for k, v in w_other.items()})
            compare = {"dir": args.compare, **eval_record(evaluate(other, he, embed, lm_head, weights, L, device,
                                                                   False, ev_bs))}
            log(f"compare {compare}")
            del other

    gen = torch.Generator().manual_seed(args.seed)
    decay = [p for p in drafter.parameters() if p.ndim >= 2]
    no_decay = [p for p in drafter.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95),
                            fused=device == "cuda")

    def lr_at(step, frac):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    history, best, best_state = [], None, None

    def better(rec):
        return best is None or select_score(rec, args.select) > select_score(best, args.select)
    step, t0, next_eval = 0, time.time(), args.eval_seconds
    while True:
        elapsed = time.time() - t0
        done = elapsed >= args.seconds
        if done or elapsed >= next_eval:
            ev = evaluate(drafter, he, embed, lm_head, weights, L, device, amp, ev_bs)
            rec = {"step": step, "seconds": round(elapsed, 1), **eval_record(ev)}
            history.append(rec)
            log(f"eval {rec}")
            if better(rec):
                best = rec
                best_state = {k: v.detach().to("cpu", copy=True) for k, v in drafter.state_dict().items()}
            next_eval += args.eval_seconds
            if done:
                break
        sel = torch.randint(0, len(tr_tok), (args.batch,), generator=gen)
        an = pick_anchors(tr_pl[sel], args.seq_len, L, args.anchors, gen)
        blk, lab = blocks_and_labels(tr_tok[sel], an, L)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, elapsed / args.seconds)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            logits = drafter(tr_feat[sel.to(tr_feat.device)], an.to(device), blk.to(device), embed, lm_head)
        # Soft labels, fp32 outside autocast: the target's distribution at every labelled position.
        p_soft = target_probs(tr_final[sel.to(tr_final.device)], an.to(device), L, lm_head) if kd else None
        loss = block_loss(logits, lab.to(device), weights, p_soft, args.kd_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 200 == 0 or args.tiny:
            log(f"step {step} loss {float(loss.detach()):.4f} lr {opt.param_groups[0]['lr']:.2e}")
    train_seconds = time.time() - t0
    drafter.load_state_dict(best_state)
    ref_err_trained = check_against_reference(drafter, he_feat[0], he_tok[0], int(he_pl[0]) + 5, embed, lm_head)
    log(f"best held-out {best}; {step} steps in {train_seconds:.0f} s; trained module vs reference {ref_err_trained:.2e}")

    os.makedirs(args.out, exist_ok=True)
    C.write_json(os.path.join(args.out, "config.json"), dcfg)
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in drafter.state_dict().items()}
    save_file(state, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    # Held-out numbers of the exported bf16 weights (fp32 compute).
    drafter.load_state_dict({k: v.float() for k, v in state.items()})
    exported = eval_record(evaluate(drafter, he, embed, lm_head, weights, L, device, False, ev_bs))
    log(f"exported {args.out}: bf16 weights, fp32 compute: {exported}")
    metrics = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
        "tiny": args.tiny, "parameters": n_params, "config": dcfg,
        "args": {k: v for k, v in vars(args).items() if k != "log"},
        "data": {"train_sequences": len(tr_tok), "train_sampled_sequences": int(tr_smp.sum()),
                 "heldout_sequences": len(he_tok), "heldout_sampled_sequences": len(hs_tok) if t1_eval else 0,
                 "seq_len": args.seq_len, "prompt_lengths": list(PROMPT_LENS), "seconds": round(data_seconds, 1),
                 "distinct_4grams_per_generated_position": distinct,
                 "distinct_4grams_per_sampled_position": distinct_smp},
        "loss": {"kd_weight": args.kd_weight, "soft_label_temperature": 1.0},
        "select": args.select,
        "reference_check_rel_err": {"random_init": ref_err, "trained": ref_err_trained},
        "train_seconds": round(train_seconds, 1), "steps": step, "best": best,
        "exported": exported,
        "compare": compare,
        "history": history,
    }
    path = args.metrics or args.out.rstrip("/") + "_train_metrics.json"
    C.write_json(path, metrics)
    log("metrics", path)


if __name__ == "__main__":
    main()
