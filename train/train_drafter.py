#!/usr/bin/env python3
"""train_drafter.py — train the DFlash drafter on the target's own greedy continuations and export it
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
2. Training example.  For an anchor a (prompt length <= a <= seq_len - L): context = features of
   positions < a; block = [token a, MASK x 15] at positions a..a+15 (MASK = [UNK], id 4350, as Kimi's
   drafter uses [UNK]); labels = tokens a+1..a+15, i.e. the target's own greedy tokens.  --anchors
   anchors per sequence share one pass (explicit mask: a block sees context < its anchor and its own
   block, non-causally).  Loss: cross-entropy weighted by exp(-(i-1)/7) over block position i = 1..15
   (the DFlash paper's decay), normalised by the weight sum.  The target's embed_tokens and lm_head are
   used frozen.  AdamW, warm-up then cosine over the wall-clock budget, bf16 autocast on CUDA.
3. Check.  dflash_torch.check_against_reference: the module equals the fixture reference drafter.
4. Evaluation, on every anchor of the held-out continuations.  Held-out loss; per anchor, acc = 1 + the
   number of leading positions whose argmax equals the target's token (what one greedy DFlash round
   anchored there commits); and the chain acceptance the C engine would report, tokens / rounds of the
   rounds greedy decoding actually runs (ddt_common.chain_walk: each round starts where the last one
   ended).  The mean of acc over anchors (reported as anchor_mean) is not that: the shipped drafter has
   anchor mean 3.87 but chain acceptance 2.16 on the same continuations, because acc is bimodal (38 %
   of anchors 1, 8 % 16) and one round crosses a run of easy positions that the mean counts one by one.
5. Export: the evaluated weights with the best held-out chain acceptance (--select chain, the default)
   or loss (--select loss; the shipped drafter was chosen so): config.json (ddt_common.drafter_config)
   + model.safetensors in bf16.
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
def generate(model, stream, prompts, seq_len, batch, device, log):
    """Greedy continuations to seq_len tokens: tokens [N, seq_len] int64 (CPU) and prompt lengths [N]."""
    from transformers import DynamicCache
    by_len = {}
    for i, (s, plen) in enumerate(prompts):
        by_len.setdefault(plen, []).append(i)
    tokens = torch.zeros(len(prompts), seq_len, dtype=torch.int64)
    plens = torch.zeros(len(prompts), dtype=torch.int64)
    t0 = time.time()
    for plen, idx in sorted(by_len.items()):
        for j in range(0, len(idx), batch):
            ids = idx[j:j + batch]
            x = torch.from_numpy(np.stack([stream[prompts[i][0]:prompts[i][0] + plen] for i in ids]).astype(np.int64))
            x = x.to(device)
            cache = DynamicCache(config=model.config)
            out = model(input_ids=x, past_key_values=cache, use_cache=True)
            seq = [x]
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(seq_len - plen):
                seq.append(nxt)
                if sum(t.shape[1] for t in seq) == seq_len:
                    break
                out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens[ids] = torch.cat(seq, 1).cpu()
            plens[ids] = plen
    log(f"generated {len(prompts)} sequences of {seq_len} tokens in {time.time() - t0:.1f} s")
    return tokens, plens


@torch.no_grad()
def features_of(model, tokens, layer_ids, batch, device, dtype):
    """Target features [N, S, len(ids)*H] (dtype, on device) and how many greedy tokens the full pass
    would predict differently from the cached generation (near-ties only)."""
    feats = []
    for j in range(0, len(tokens), batch):
        x = tokens[j:j + batch].to(device)
        out = model(input_ids=x, output_hidden_states=True, use_cache=False)
        feats.append(torch.cat([out.hidden_states[i + 1] for i in layer_ids], -1).to(dtype))
    return torch.cat(feats, 0)


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


def block_loss(logits, labels, weights):
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    ce = ce.view(labels.shape)
    return (ce * weights).sum() / (weights.sum() * labels.shape[0] * labels.shape[1])


@torch.no_grad()
def evaluate(drafter, feats, tokens, plens, embed, lm_head, weights, L, device, amp, bs, chunk=32):
    """Every anchor of every held-out continuation (plen <= a <= seq_len - L): the weighted loss, the
    acceptance acc[a] = 1 + leading argmax matches of the block at a, and the greedy chain decoding's
    rounds over the continuation (ddt_common.chain_walk: a round starts where the previous one ended).
    Returns {"loss", "chain_acceptance" (tokens / rounds, what the C engine reports), "anchor_mean"
    (mean of acc over all anchors: the pre-fix metric, much higher because one round crosses a run
    of easy positions that the mean counts position by position)}."""
    drafter.eval()
    S = tokens.shape[1]
    hi = S - L
    loss_sum, n_anchor, acc_sum, walk_tokens, walk_rounds = 0.0, 0, 0, 0, 0
    for j in range(0, len(tokens), bs):
        tok, pl = tokens[j:j + bs], plens[j:j + bs]
        lo = int(pl.min())
        f = feats[j:j + bs] if amp else feats[j:j + bs].float()   # bf16 features, fp32 compute
        losses, accs = [], []
        for a0 in range(lo, hi + 1, chunk):
            an = torch.arange(a0, min(a0 + chunk, hi + 1))[None].expand(len(tok), -1).contiguous()
            blk, lab = blocks_and_labels(tok, an, L)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                logits = drafter(f, an.to(device), blk.to(device), embed, lm_head)
            lab = lab.to(device)
            ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), lab.reshape(-1), reduction="none")
            losses.append(((ce.view(lab.shape) * weights).sum(-1) / weights.sum()).cpu())
            accs.append((1 + (logits.argmax(-1) == lab).int().cumprod(-1).sum(-1)).cpu())
        losses, accs = torch.cat(losses, 1), torch.cat(accs, 1)          # [b, hi - lo + 1]
        for r in range(len(tok)):
            k = int(pl[r]) - lo
            loss_sum += float(losses[r, k:].sum())
            acc_sum += int(accs[r, k:].sum())
            n_anchor += accs.shape[1] - k
            t, n = C.chain_walk(accs[r, k:].tolist())
            walk_tokens += t
            walk_rounds += n
    drafter.train()
    return {"loss": loss_sum / n_anchor, "chain_acceptance": walk_tokens / walk_rounds,
            "anchor_mean": acc_sum / n_anchor}


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
    ap.add_argument("--select", choices=("chain", "loss"), default="chain",
                    help="export the evaluated weights with the best held-out chain acceptance (tokens per "
                         "round of greedy chain decoding, as the engine counts) or the best held-out loss")
    ap.add_argument("--generate-only", action="store_true",
                    help="stop after writing --data-cache (then run drafters on it, e.g. side by side)")
    ap.add_argument("--feature-batch", type=int, default=128, help="sequences per feature pass")
    ap.add_argument("--data-cache", default=None,
                    help="file of the generated token sequences: read when it exists and was made with the same "
                         "target, seed, prompts and lengths, else written; lets several drafter runs share one "
                         "generation")
    args = ap.parse_args()

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
    cache_key = {"target": os.path.abspath(args.target), "seed": args.seed, "seq_len": args.seq_len,
                 "train": tr_prompts, "heldout": he_prompts}
    cached = torch.load(args.data_cache) if args.data_cache and os.path.exists(args.data_cache) else None
    if cached is not None and cached["key"] == cache_key:
        tr_tok, tr_pl, he_tok, he_pl = cached["tr_tok"], cached["tr_pl"], cached["he_tok"], cached["he_pl"]
        log(f"sequences read from {args.data_cache}")
    else:
        tr_tok, tr_pl = generate(target, train_stream, tr_prompts, args.seq_len, args.gen_batch, device, log)
        he_tok, he_pl = generate(target, held_stream, he_prompts, args.seq_len, args.gen_batch, device, log)
        if args.data_cache:
            torch.save({"key": cache_key, "tr_tok": tr_tok, "tr_pl": tr_pl, "he_tok": he_tok, "he_pl": he_pl},
                       args.data_cache)
            log(f"sequences written to {args.data_cache}")
    if args.generate_only:
        if not args.data_cache:
            raise SystemExit("--generate-only needs --data-cache")
        return
    feat_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tr_feat = features_of(target, tr_tok, layer_ids, args.feature_batch, device, feat_dtype)
    he_feat = features_of(target, he_tok, layer_ids, args.feature_batch, device, feat_dtype)
    data_seconds = time.time() - t_data
    # How repetitive are the continuations? (distinct 4-grams per generated token)
    gen_part = [tr_tok[i, tr_pl[i]:].tolist() for i in range(min(512, len(tr_tok)))]
    distinct = np.mean([len({tuple(g[k:k + 4]) for k in range(len(g) - 3)}) / max(1, len(g) - 3) for g in gen_part])
    log(f"features {tuple(tr_feat.shape)} {feat_dtype}; data took {data_seconds:.1f} s; "
        f"distinct 4-grams per generated position {distinct:.3f}")
    del target
    if device == "cuda":
        torch.cuda.empty_cache()

    drafter = DFlashDrafter(dcfg).to(device)
    ref_err = check_against_reference(drafter, tr_feat[0], tr_tok[0], int(tr_pl[0]) + 3, embed, lm_head)
    log(f"drafter module vs fixture reference (random init): rel err {ref_err:.2e}")
    if ref_err > 1e-5:
        raise SystemExit("the training module does not compute what the reference drafter computes")
    n_params = sum(p.numel() for p in drafter.parameters())
    embed, lm_head = embed.to(device), lm_head.to(device)
    weights = torch.exp(-torch.arange(L - 1, dtype=torch.float32) / args.decay_gamma).to(device)

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
        if best is None:
            return True
        if args.select == "loss":
            return rec["heldout_loss"] < best["heldout_loss"]
        return rec["heldout_chain_acceptance"] > best["heldout_chain_acceptance"]
    step, t0, next_eval = 0, time.time(), args.eval_seconds
    ev_bs = 16 if device == "cuda" else 4
    while True:
        elapsed = time.time() - t0
        done = elapsed >= args.seconds
        if done or elapsed >= next_eval:
            ev = evaluate(drafter, he_feat, he_tok, he_pl, embed, lm_head, weights, L, device, amp, ev_bs)
            rec = {"step": step, "seconds": round(elapsed, 1), "heldout_loss": round(ev["loss"], 4),
                   "heldout_chain_acceptance": round(ev["chain_acceptance"], 3),
                   "heldout_anchor_mean_acceptance": round(ev["anchor_mean"], 3)}
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
        loss = block_loss(logits, lab.to(device), weights)
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
    ev = evaluate(drafter, he_feat, he_tok, he_pl, embed, lm_head, weights, L, device, False, ev_bs)
    exported = {"heldout_loss": round(ev["loss"], 4), "heldout_chain_acceptance": round(ev["chain_acceptance"], 3),
                "heldout_anchor_mean_acceptance": round(ev["anchor_mean"], 3)}
    log(f"exported {args.out}: bf16 weights, fp32 compute: {exported}")
    metrics = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
        "tiny": args.tiny, "parameters": n_params, "config": dcfg,
        "args": {k: v for k, v in vars(args).items() if k != "log"},
        "data": {"train_sequences": len(tr_tok), "heldout_sequences": len(he_tok), "seq_len": args.seq_len,
                 "prompt_lengths": list(PROMPT_LENS), "seconds": round(data_seconds, 1),
                 "distinct_4grams_per_generated_position": round(float(distinct), 3)},
        "reference_check_rel_err": {"random_init": ref_err, "trained": ref_err_trained},
        "train_seconds": round(train_seconds, 1), "steps": step, "best": best,
        "exported": exported,
        "history": history,
    }
    path = args.metrics or args.out.rstrip("/") + "_train_metrics.json"
    C.write_json(path, metrics)
    log("metrics", path)


if __name__ == "__main__":
    main()
