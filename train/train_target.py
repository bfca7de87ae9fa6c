#!/usr/bin/env python3
"""train_target.py — train the DeepSeek-V3-architecture target on the stdlib corpus for a fixed
wall-clock budget, then export it as a bf16 Hugging Face checkpoint the C engine loads.

    python3 train/train_target.py --seconds 300 --out models/pystdlib-target     # on the H200
    python3 train/train_target.py --seconds 20 --tiny --out /tmp/t                # CPU smoke test

Model: transformers' DeepseekV3ForCausalLM with ddt_common.target_config() (MLA, 1 dense + 5 MoE layers,
8 routed experts top-2 + 1 shared, sigmoid noaux_tc router), about 10.2M parameters, not tied.
Data: windows of --seq + 1 tokens at uniformly random offsets of train/data/train.bin (files separated
by [EOS]; a window may span a file boundary).  Loss: next-token cross-entropy on every position.
Optimiser: AdamW (betas 0.9/0.95, weight decay 0.1 on matrices only), linear warm-up for --warmup steps,
then cosine decay to --min-lr-frac of the peak over the wall-clock budget (the schedule follows elapsed
time, so it ends at the budget whatever the step rate), gradient clipping at 1.0, bf16 autocast on CUDA.

Router bias.  DeepSeek-V3 balances experts without an auxiliary loss: e_score_correction_bias is not
trained by the gradient but nudged after every step, bias_e += gamma * sign(mean load - load_e), where
load_e counts the tokens routed to expert e in that step's forward pass (per MoE layer).  That rule is
used here with gamma = --bias-gamma (0 disables it and leaves the bias at 0).

Evaluation every --eval-seconds on fixed windows: the whole held-out split (non-overlapping windows)
and the same number of fixed train windows.  The weights with the best held-out loss are exported
(early stopping: the corpus is small, about 2.8M tokens, so the model can overfit within the budget).

Export: weights cast to bf16 (the router bias stays fp32, as DeepSeek ships it), save_pretrained with
max_shard_size 12MB, config.json as saved by transformers (num_nextn_predict_layers 0), the tokenizer
files copied in from --tokenizer, and metrics in <out>/../<name>_train_metrics.json unless --metrics.
"""

import argparse
import copy
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddt_common as C  # noqa: E402


def make_model(cfg_kwargs: dict, device: str):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    cfg = DeepseekV3Config(**cfg_kwargs)
    impl = "grouped_mm" if device == "cuda" else "eager"
    try:
        model = DeepseekV3ForCausalLM._from_config(cfg, attn_implementation="sdpa", experts_implementation=impl)
        model.to(device)
        if device == "cuda":   # a quick forward/backward proves the fast path works here
            x = torch.randint(0, cfg.vocab_size, (2, 16), device=device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(x).logits.float().sum().backward()
            model.zero_grad(set_to_none=True)
    except Exception as e:  # noqa: BLE001 - any failure of the fast path falls back to eager
        print(f"experts_implementation {impl} failed ({e}); using eager")
        impl = "eager"
        model = DeepseekV3ForCausalLM._from_config(cfg, attn_implementation="sdpa", experts_implementation=impl)
        model.to(device)
    return model, impl


class RouterLoad:
    """Forward hooks on every MoE router that count the experts chosen (topk_indices)."""

    def __init__(self, model):
        self.gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
        self.loads = [None] * len(self.gates)
        self.enabled = True
        for i, g in enumerate(self.gates):
            g.register_forward_hook(self._hook(i))

    def _hook(self, i):
        def hook(mod, inp, out):
            if self.enabled:
                idx = out[2]
                cnt = torch.bincount(idx.reshape(-1), minlength=mod.num_experts).float()
                self.loads[i] = cnt if self.loads[i] is None else self.loads[i] + cnt
        return hook

    @torch.no_grad()
    def update_bias(self, gamma: float):
        """bias += gamma * sign(mean - load); returns the max/mean load ratio over layers."""
        worst = 0.0
        for g, load in zip(self.gates, self.loads):
            if load is None:
                continue
            worst = max(worst, float(load.max() / load.mean().clamp_min(1e-9)))
            if gamma > 0:
                g.e_score_correction_bias += gamma * torch.sign(load.mean() - load)
        self.loads = [None] * len(self.gates)
        return worst


def windows(stream: np.ndarray, starts: np.ndarray, n: int) -> torch.Tensor:
    idx = starts[:, None] + np.arange(n)[None, :]
    return torch.from_numpy(stream[idx].astype(np.int64))


@torch.no_grad()
def evaluate(model, batches, device, amp) -> float:
    model.eval()
    tot, cnt = 0.0, 0
    for xb in batches:
        xb = xb.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            logits = model(xb[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1), reduction="sum")
        tot += float(loss)
        cnt += xb[:, 1:].numel()
    model.train()
    return tot / cnt


def export(model, out: str, tokenizer: str | None, log):
    """bf16 HF checkpoint in shards <= 12MB, router bias fp32, tokenizer files copied in."""
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".safetensors") or f.endswith(".index.json"):
            os.remove(os.path.join(out, f))
    m = copy.deepcopy(model).to("cpu")
    biases = {n: b.detach().float().clone() for n, b in m.named_buffers() if n.endswith("e_score_correction_bias")}
    m = m.to(torch.bfloat16)
    for n, b in biases.items():
        mod = m.get_submodule(n.rsplit(".", 1)[0])
        mod.e_score_correction_bias = b
    m.config.torch_dtype = torch.bfloat16
    m.save_pretrained(out, max_shard_size="12MB")
    gen = os.path.join(out, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)   # not used by the engine; keeps the file count down
    if tokenizer:
        for f in ("tiktoken.model", "tokenizer_config.json"):
            shutil.copy(os.path.join(tokenizer, f), os.path.join(out, f))
    log("exported", out, sorted(os.listdir(out)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=C.DATA_DIR)
    ap.add_argument("--tokenizer", default=C.TOKENIZER_DIR)
    ap.add_argument("--out", default=C.TARGET_DIR)
    ap.add_argument("--metrics", default=None, help="metrics JSON (default: <out>_train_metrics.json)")
    ap.add_argument("--log", default=None)
    ap.add_argument("--seconds", type=float, default=300.0, help="wall-clock training budget")
    ap.add_argument("--tiny", action="store_true", help="tiny model + small batches: CPU smoke test")
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--bias-gamma", type=float, default=1e-3)
    ap.add_argument("--eval-seconds", type=float, default=30.0)
    ap.add_argument("--max-eval-windows", type=int, default=100000)
    args = ap.parse_args()

    log = C.Log(args.log)
    C.seed_everything(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    amp = device == "cuda"
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if args.tiny:
        args.batch = min(args.batch, 8)
        args.seq = min(args.seq, 64)
        args.warmup = min(args.warmup, 10)
        args.max_eval_windows = min(args.max_eval_windows, 16)
        args.eval_seconds = min(args.eval_seconds, args.seconds / 2)

    train = C.load_tokens("train", args.data)
    held = C.load_tokens("heldout", args.data)
    n = args.seq + 1
    rng = np.random.default_rng(args.seed)
    eval_bs = 64
    h_starts = np.arange(0, len(held) - n, n)[: args.max_eval_windows]
    t_starts = np.sort(rng.choice(len(train) - n, size=len(h_starts), replace=False))
    held_batches = [windows(held, h_starts[i:i + eval_bs], n) for i in range(0, len(h_starts), eval_bs)]
    train_eval_batches = [windows(train, t_starts[i:i + eval_bs], n) for i in range(0, len(t_starts), eval_bs)]

    cfg_kwargs = C.target_config(args.tiny)
    model, impl = make_model(cfg_kwargs, device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"device {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}), experts {impl}, "
        f"{n_params} parameters, train {len(train)} tokens, held-out {len(held)} tokens "
        f"({len(h_starts)} eval windows of {n})")
    router = RouterLoad(model)

    decay = [p for nme, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for nme, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device == "cuda")

    def lr_at(step, frac):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        cos = 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * cos)

    history = []
    best = {"heldout": float("inf")}
    best_state = None
    step, tokens_seen, ema = 0, 0, None
    t_start = time.time()
    next_eval = args.eval_seconds
    model.train()
    while True:
        elapsed = time.time() - t_start
        done = elapsed >= args.seconds
        if done or elapsed >= next_eval:
            router.enabled = False
            hl = evaluate(model, held_batches, device, amp)
            tl = evaluate(model, train_eval_batches, device, amp)
            router.enabled = True
            rec = {"step": step, "seconds": round(elapsed, 1), "tokens": tokens_seen, "train_loss": round(tl, 4),
                   "heldout_loss": round(hl, 4), "lr": lr_at(step, elapsed / args.seconds)}
            history.append(rec)
            log(f"eval {rec}")
            if hl < best["heldout"]:
                best = dict(rec, heldout=hl)
                best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            next_eval += args.eval_seconds
            if done:
                break
        xb = windows(train, rng.integers(0, len(train) - n, size=args.batch), n).to(device, non_blocking=True)
        lr = lr_at(step, elapsed / args.seconds)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            logits = model(xb[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        imbalance = router.update_bias(args.bias_gamma)
        step += 1
        tokens_seen += xb[:, 1:].numel()
        lv = float(loss.detach()) if step % 50 == 0 or args.tiny else None
        if lv is not None:
            ema = lv if ema is None else 0.9 * ema + 0.1 * lv
            if step % 200 == 0 or args.tiny:
                log(f"step {step} loss {lv:.4f} ema {ema:.4f} lr {lr:.2e} gnorm {float(gnorm):.2f} "
                    f"max/mean expert load {imbalance:.2f} {tokens_seen / (time.time() - t_start):.0f} tok/s")

    train_seconds = time.time() - t_start
    model.load_state_dict(best_state)
    log(f"best held-out {best['heldout']:.4f} at step {best['step']} ({best['seconds']} s); "
        f"{step} steps, {tokens_seen} tokens ({tokens_seen / len(train):.2f} epochs) in {train_seconds:.0f} s")

    export(model, args.out, args.tokenizer if os.path.isdir(args.tokenizer) else None, log)
    # The exported bf16 weights, reloaded, on the held-out split (fp32 compute).
    from transformers import DeepseekV3ForCausalLM
    back = DeepseekV3ForCausalLM.from_pretrained(args.out, dtype=torch.float32, attn_implementation="sdpa",
                                                 experts_implementation=impl).to(device)
    exported_held = evaluate(back, held_batches, device, False)
    exported_train = evaluate(back, train_eval_batches, device, False)
    log(f"exported bf16 weights, fp32 compute: held-out {exported_held:.4f}, train {exported_train:.4f}")
    biases = [b.tolist() for nme, b in back.named_buffers() if nme.endswith("e_score_correction_bias")]

    metrics = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__, "experts_implementation": impl, "tiny": args.tiny,
        "parameters": n_params, "config": cfg_kwargs,
        "args": {k: v for k, v in vars(args).items() if k not in ("log",)},
        "train_seconds": round(train_seconds, 1), "steps": step, "tokens_seen": tokens_seen,
        "epochs": round(tokens_seen / len(train), 3),
        "best": {k: v for k, v in best.items() if k != "heldout"},
        "exported": {"heldout_loss": round(exported_held, 4), "train_loss": round(exported_train, 4),
                     "eval_windows": len(h_starts), "window": n},
        "router_bias": {"rule": "bias += gamma*sign(mean load - load) per step", "gamma": args.bias_gamma,
                        "final_abs_max": max(max(abs(x) for x in b) for b in biases)},
        "history": history,
    }
    path = args.metrics or args.out.rstrip("/") + "_train_metrics.json"
    C.write_json(path, metrics)
    log("metrics", path)


if __name__ == "__main__":
    main()
