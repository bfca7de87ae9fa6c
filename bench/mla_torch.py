"""mla_torch.py — the baseline for bench/cuda_bench_mla.c: tree-verify MLA-absorb
attention in plain PyTorch (scores = einsum, ancestor mask, softmax, einsum, all
bf16), timed with torch.cuda.Event (median of 50 calls after warm-up) on the same
shapes: 64 heads, keys 576 wide, values 512, T in {1, 16, 32, 64} tree tokens x
N in {1024, 4096, 16384, 65536} prefix rows.  The roofline floor uses the same
formula as the C benchmark, with a 2 GiB device-to-device copy and an 8192^3 bf16
matmul measured in this run.  Prints a markdown table.

Usage: python3 bench/mla_torch.py [--quick]
"""
import sys

import torch

H, DK, DV = 64, 576, 512
SCALE = 0.14468


def attention(q, kv, mask):
    """q [T,H,576], kv [N+T,576], mask [T,N+T] bool -> [T,H,512]."""
    s = torch.einsum("thd,nd->thn", q, kv) * SCALE
    s = s.masked_fill(~mask[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("thn,nd->thd", p, kv[:, :DV])


def median_ms(fn, reps=50, warm=5):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    times.sort()
    return times[len(times) // 2]


def main():
    quick = "--quick" in sys.argv
    dev = torch.device("cuda")
    torch.manual_seed(0)

    nbytes = 2 << 30
    a = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    bw = 2 * nbytes / (median_ms(lambda: b.copy_(a), reps=5, warm=1) * 1e-3)
    del a, b
    m = 8192
    x = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    y = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    rate = 2 * m**3 / (median_ms(lambda: x @ y, reps=10, warm=3) * 1e-3)
    del x, y

    print(f"## Plain PyTorch {torch.__version__} baseline, {torch.cuda.get_device_name()}\n")
    print(f"Ceilings measured in this run: copy {bw * 1e-9:.0f} GB/s (read+write), "
          f"bf16 8192^3 matmul {rate * 1e-12:.0f} TFLOP/s.\n")
    print("| T | N | torch (us) | floor (us) | ratio |")
    print("|---|---|---|---|---|")
    for T in (1, 16, 32, 64):
        for N in (1024, 4096, 16384, 65536):
            if quick and not (T in (1, 16, 64) and N in (4096, 65536)):
                continue
            q = (torch.rand(T, H, DK, device=dev) * 2 - 1).to(torch.bfloat16)
            kv = (torch.rand(N + T, DK, device=dev) * 2 - 1).to(torch.bfloat16)
            mask = torch.ones(T, N + T, dtype=torch.bool, device=dev)
            mask[:, N:] = torch.tril(torch.ones(T, T, dtype=torch.bool, device=dev))  # a chain
            ms = median_ms(lambda: attention(q, kv, mask))
            nbytes_io = N * DK * 2 + T * H * DK * 2 + T * H * DV * 2
            flops = 2 * T * H * N * (DK + DV)
            floor = max(nbytes_io / bw, flops / rate)
            print(f"| {T} | {N} | {ms * 1e3:.1f} | {floor * 1e6:.1f} | {ms * 1e-3 / floor:.2f} |", flush=True)
            del q, kv, mask
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
