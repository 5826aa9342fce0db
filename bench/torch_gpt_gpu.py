"""PyTorch reference on the GPU for bench/bench_gpu.sh: a GPT-2-shaped model
(pre-norm LayerNorm, GELU tanh, learned positions, biases, tied embedding,
no dropout) trained with bf16 autocast, fp32 parameters and fused AdamW, with
SDPA (flash) attention; eager or torch.compile.  Also measures the device's
ceilings (--ceilings): device-to-device copy bandwidth and an 8192^3 bf16
matrix product; and SDPA alone (--sdpa): causal flash attention forward and
backward at the model's shape, bf16.  Prints one JSON line."""

import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def ceilings():
    dev = "cuda"
    n = 1 << 30  # 1 GiB
    a = torch.randn(n // 4, device=dev)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    copy_bw = 2 * n / statistics.median(ts)
    m = 8192
    x = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    y = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        x @ y
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    gemm = 2 * m**3 / statistics.median(ts)
    return {"copy_bytes_per_s": copy_bw, "bf16_gemm_flops": gemm, "device": torch.cuda.get_device_name()}


def sdpa(mbs, heads, seq, d, reps=50):
    """Median ms of one causal SDPA forward, and of its backward (forward+backward minus
    forward), q/k/v (mbs, heads, seq, d) bf16, fresh random values."""
    dev = "cuda"
    q, k, v = (torch.randn(mbs, heads, seq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(mbs, heads, seq, d, device=dev, dtype=torch.bfloat16)

    def timed(fn):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e))
        return statistics.median(ts)

    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    both = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout))
    return {"sdpa_fwd_ms": fwd, "sdpa_bwd_ms": both - fwd, "shape": [mbs, heads, seq, d]}


class Block(nn.Module):
    def __init__(s, h, heads, ffn):
        super().__init__()
        s.heads = heads
        s.ln1, s.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        s.qkv, s.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        s.fc1, s.fc2 = nn.Linear(h, ffn), nn.Linear(ffn, h)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.heads, C // s.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, vocab, seq, h, layers, heads, ffn):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(vocab, h), nn.Embedding(seq, h)
        s.blocks = nn.ModuleList(Block(h, heads, ffn) for _ in range(layers))
        s.lnf = nn.LayerNorm(h)

    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.blocks:
            x = b(x)
        logits = F.linear(s.lnf(x), s.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ceilings", action="store_true")
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ffn", type=int, default=3072)
    ap.add_argument("--mbs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--sdpa", action="store_true")
    a = ap.parse_args()
    if a.ceilings:
        print(json.dumps(ceilings()))
        return
    if a.sdpa:
        print(json.dumps(sdpa(a.mbs, a.heads, a.seq, a.hidden // a.heads)))
        return
    torch.manual_seed(1234)
    model = GPT(a.vocab, a.seq, a.hidden, a.layers, a.heads, a.ffn).cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if a.compile else model
    idx = torch.randint(0, 50257, (a.mbs, a.seq + 1), device="cuda")
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    torch.cuda.reset_peak_memory_stats()
    ts = []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= a.warmup:
            ts.append(time.perf_counter() - t0)
    med = statistics.median(ts)
    print(json.dumps({"impl": "pytorch-compile" if a.compile else "pytorch-eager", "params": params,
                      "tokens_per_step": a.mbs * a.seq, "median_step_ms": med * 1e3,
                      "tokens_per_s": a.mbs * a.seq / med, "loss": float(loss),
                      "max_memory_bytes": torch.cuda.max_memory_allocated(), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
