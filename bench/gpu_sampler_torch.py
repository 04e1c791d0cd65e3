#!/usr/bin/env python3
"""The PyTorch way of doing one step's sampling and mask capture, as the
seeds' systems do it, timed on the same shapes as bench/gpu_sampler.c:
temperature, top-k filter (torch.topk), sort-based top-p, min-p, a
multinomial draw, log_softmax, and packing the support (ids and logprobs
of every kept id, or ids and the sampled token's logprob) into flat
arrays copied to pinned host memory.

    python3 bench/gpu_sampler_torch.py [--vocab V] [--repeats R]
"""

import argparse

import torch

CASES = [
    ("top_k 20", 20, 1.0, 0.0),
    ("top_k 1000", 1000, 1.0, 0.0),
    ("top_k 8192", 8192, 1.0, 0.0),
    ("top_k 1024, top_p 0.95", 1024, 0.95, 0.0),
    ("min_p 0.05", 0, 1.0, 0.05),
    ("whole vocabulary", 0, 1.0, 0.0),
]
MODES = ["off", "selected", "support"]


def step(logits, top_k, top_p, min_p, mode):
    z = logits / 1.0
    keep = torch.ones_like(z, dtype=torch.bool)
    if top_k > 0:
        kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
        keep &= z >= kth
    if min_p > 0:
        p = torch.softmax(z, dim=-1)
        keep &= p >= min_p * p.max(dim=-1, keepdim=True).values
    if top_p < 1.0:
        zs, order = torch.sort(z.masked_fill(~keep, float("-inf")),
                               dim=-1, descending=True)
        cum = torch.softmax(zs, dim=-1).cumsum(dim=-1)
        drop = (cum - torch.softmax(zs, dim=-1)) > top_p
        drop_full = torch.zeros_like(drop).scatter(-1, order, drop)
        keep &= ~drop_full
    zm = z.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(zm, dim=-1)
    tok = torch.multinomial(probs, 1)
    out = [tok]
    if mode != "off":
        lp = torch.log_softmax(zm, dim=-1)
        lengths = keep.sum(dim=-1, dtype=torch.int32)
        ids = keep.nonzero()[:, 1].to(torch.int32)
        out += [lengths, ids]
        if mode == "support":
            out.append(lp[keep])
        else:
            out.append(lp.gather(-1, tok))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    base = (2.5 * torch.randn(256, a.vocab, device=dev)).float()
    rows = ["| batch | case | mask | torch kernels ms | torch copy ms | bytes |",
            "|---|---|---|---|---|---|"]
    for b in (64, 256):
        logits = base[:b].contiguous()
        for name, k, p, mp in CASES:
            for mode in MODES:
                kt, ct, nbytes = [], [], 0
                for r in range(a.repeats + 2):
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    e2 = torch.cuda.Event(enable_timing=True)
                    e0.record()
                    out = step(logits, k, p, mp, mode)
                    e1.record()
                    host = [t.to("cpu", non_blocking=True) for t in out]
                    e2.record()
                    torch.cuda.synchronize()
                    if r >= 2:
                        kt.append(e0.elapsed_time(e1))
                        ct.append(e1.elapsed_time(e2))
                    nbytes = sum(t.numel() * t.element_size() for t in host)
                kt.sort()
                ct.sort()
                km, cm = kt[len(kt) // 2], ct[len(ct) // 2]
                print(f"torch batch {b}, {name}, mask {mode}: kernels "
                      f"{km:.4f} ms, copy {cm:.4f} ms ({nbytes} bytes)",
                      flush=True)
                rows.append(f"| {b} | {name} | {mode} | {km:.4f} | {cm:.4f} "
                            f"| {nbytes} |")
    print()
    print("\n".join(rows))


if __name__ == "__main__":
    main()
