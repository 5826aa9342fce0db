"""PyTorch (CPU) reference for the training throughput of examples/tiny-gpt.yaml.

The model and training step match the YAML exactly: vocab 257 padded to 264
embedding rows, seq 96, hidden 96, 4 layers, 6 heads of 16, ffn 384, pre-norm
LayerNorm (eps 1e-5), GELU (tanh), learned positions, biases on every linear,
tied input/output embedding, no dropout, fp32, micro batch 4, global batch 8
(2 microbatches of gradient accumulation), AdamW (lr 1e-3, betas 0.9/0.95,
eps 1e-8, weight decay 0.1 except biases and norm weights), grad clip 1.0.

Timed per step: forward+backward of both microbatches, clipping and the
optimizer step.  Tokens are generated once; data loading is not measured.
The learning-rate schedule is left out (constant lr): it costs nothing.

Prints one JSON line on stdout, e.g.
  {"impl": "pytorch-eager", "threads": 1, "tokens_per_step": 768, ...}
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 257
PADDED_VOCAB = 264  # 257 rounded up to a multiple of 8
SEQ = 96
HIDDEN = 96
LAYERS = 4
HEADS = 6
HEAD_DIM = HIDDEN // HEADS  # 16
FFN = 384
EPS = 1e-5
INIT_STD = 0.02

MICRO_BATCH = 4
GLOBAL_BATCH = 8
MICROBATCHES = GLOBAL_BATCH // MICRO_BATCH  # 2
TOKENS_PER_STEP = GLOBAL_BATCH * SEQ  # 768

LR = 1e-3
BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.1
CLIP_GRAD = 1.0
SEED = 1234


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(HIDDEN, eps=EPS)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN, bias=True)
        self.proj = nn.Linear(HIDDEN, HIDDEN, bias=True)
        self.ln2 = nn.LayerNorm(HIDDEN, eps=EPS)
        self.fc1 = nn.Linear(HIDDEN, FFN, bias=True)
        self.fc2 = nn.Linear(FFN, HIDDEN, bias=True)

    def forward(self, x):
        b, s, h = x.shape
        qkv = self.qkv(self.ln1(x))
        # [b, s, 3h] -> three tensors of [b, heads, s, head_dim]
        qkv = qkv.view(b, s, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        attn = attn.transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(attn)
        y = self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
        return x + y


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(PADDED_VOCAB, HIDDEN)
        self.wpe = nn.Embedding(SEQ, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(HIDDEN, eps=EPS)
        self.reset_parameters()

    def reset_parameters(self):
        # Megatron-style init: normal(0, std) for weights, zero biases; the
        # output projections of each layer get std / sqrt(2 * layers).
        out_std = INIT_STD / math.sqrt(2.0 * LAYERS)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("ln_"):
                nn.init.ones_(p)
            elif name.endswith("proj.weight") or name.endswith("fc2.weight"):
                nn.init.normal_(p, 0.0, out_std)
            else:
                nn.init.normal_(p, 0.0, INIT_STD)

    def forward(self, tokens, labels):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        # Tied output layer: logits over the padded vocabulary.
        logits = F.linear(x, self.wte.weight)
        return F.cross_entropy(logits.view(-1, PADDED_VOCAB), labels.reshape(-1))


def make_optimizer(model):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        # Biases and LayerNorm weights are 1-D; matrices and embeddings are 2-D.
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": WEIGHT_DECAY},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=ADAM_EPS)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=60,
                        help="timed steps (after warmup)")
    parser.add_argument("--warmup", type=int, default=10,
                        help="untimed steps before the timed ones")
    parser.add_argument("--compile", action="store_true",
                        help="wrap the model in torch.compile")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)

    model = TinyGPT()
    optimizer = make_optimizer(model)

    impl = "pytorch-eager"
    forward = model
    if args.compile:
        try:
            forward = torch.compile(model)
            impl = "pytorch-compile"
        except Exception as e:  # noqa: BLE001 - any failure means "skip"
            print(f"torch.compile unavailable: {e}", file=sys.stderr)
            return 2

    # Random tokens, generated once: sequences of SEQ + 1 tokens give inputs
    # and next-token labels.
    n_batches = 4
    data = torch.randint(0, VOCAB, (n_batches, MICROBATCHES, MICRO_BATCH, SEQ + 1))

    def train_step(step):
        batch = data[step % n_batches]
        optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for m in range(MICROBATCHES):
            tokens = batch[m, :, :-1]
            labels = batch[m, :, 1:]
            loss = forward(tokens, labels) / MICROBATCHES
            loss.backward()
            loss_sum += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_GRAD)
        optimizer.step()
        return loss_sum

    times_ms = []
    try:
        for step in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            loss = train_step(step)
            t1 = time.perf_counter()
            if step >= args.warmup:
                times_ms.append((t1 - t0) * 1000.0)
    except Exception as e:  # noqa: BLE001
        if args.compile:
            # torch.compile compiles lazily, so failures show up here.
            print(f"torch.compile failed: {e}", file=sys.stderr)
            return 2
        raise

    median_ms = statistics.median(times_ms)
    result = {
        "impl": impl,
        "threads": args.threads,
        "tokens_per_step": TOKENS_PER_STEP,
        "steps": args.steps,
        "median_step_ms": round(median_ms, 3),
        "tokens_per_s": round(TOKENS_PER_STEP / (median_ms / 1000.0), 1),
        "final_loss": round(float(loss), 4),
        "torch": torch.__version__,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
