#!/usr/bin/env python3
"""hf_reference.py DIR TOKENS - the mean next-token cross-entropy of the model mgc-export
wrote to DIR (model.safetensors and config.json, Hugging Face's layout) over the samples in
TOKENS (int32 little-endian: count, length, then count x length token ids; each sample's
first length - 1 tokens are the inputs and its last length - 1 the labels).

A reference written from the architectures' published definitions (Hugging Face's
GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM and
Qwen3MoeForCausalLM), in float64 NumPy, sharing no code with mgc: it
reads the safetensors file itself and runs the forward pass of every sample.  Prints the
loss on one line.  Exit 77 when NumPy is missing.

hf_reference.py --shard SRC DST N - SRC's export as N shards with their index in DST."""
import json
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("hf_reference: NumPy is missing: skipped")
    sys.exit(77)


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        buf = raw[base + a:base + b]
        if t["dtype"] == "F32":
            v = np.frombuffer(buf, dtype="<f4")
        elif t["dtype"] == "F16":
            v = np.frombuffer(buf, dtype="<f2")
        elif t["dtype"] == "BF16":  # the high half of a float32
            v = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError("dtype %s" % t["dtype"])
        out[name] = v.astype(np.float64).reshape(t["shape"])
    return out


def softmax_causal(scores, window=None):
    # scores (heads, s, s); row i sees columns 0..i, with a sliding window only i - window < j
    s = scores.shape[-1]
    mask = np.triu(np.ones((s, s), dtype=bool), k=1)
    if window:
        mask |= np.tril(np.ones((s, s), dtype=bool), k=-window)
    scores = np.where(mask, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x, w, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def gpt2_logits(W, cfg, tok):
    s, h, a = len(tok), cfg["n_embd"], cfg["n_head"]
    d, eps = h // a, cfg["layer_norm_epsilon"]
    x = W["transformer.wte.weight"][tok] + W["transformer.wpe.weight"][np.arange(s)]
    for l in range(cfg["n_layer"]):
        p = "transformer.h.%d." % l
        y = layer_norm(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = y @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]  # Conv1D: x W + b
        q, k, v = np.split(qkv, 3, axis=-1)
        q, k, v = (t.reshape(s, a, d).transpose(1, 0, 2) for t in (q, k, v))
        att = softmax_causal(q @ k.transpose(0, 2, 1) / np.sqrt(d))
        o = (att @ v).transpose(1, 0, 2).reshape(s, h)
        x = x + o @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        y = layer_norm(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        m = gelu_new(y @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"])
        x = x + m @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    x = layer_norm(x, W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], eps)
    head = W["lm_head.weight"] if "lm_head.weight" in W else W["transformer.wte.weight"]
    return x @ head.T


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def mixtral_moe(W, cfg, p, y, names=("w1", "w3", "w2"), renorm=True):
    # each token to its top-k experts by router logit (ties to the lower expert), weighted by
    # the softmax of the chosen logits (softmax over all, top-k, renormalised: the same; Qwen3-MoE
    # with norm_topk_prob), or without renorm by their softmax over all experts; names: the
    # experts' gate, up and down matrices
    k = cfg["num_experts_per_tok"]
    logits = y @ W[p + "gate.weight"].T  # (s, E)
    out = np.zeros_like(y)
    for t in range(y.shape[0]):
        order = np.argsort(-logits[t], kind="stable")[:k]
        if renorm:
            w = np.exp(logits[t, order] - logits[t, order].max())
            w = w / w.sum()
        else:
            m = logits[t].max()
            w = np.exp(logits[t, order] - m) / np.exp(logits[t] - m).sum()
        for e, we in zip(order, w):
            q = p + "experts.%d." % e
            g = y[t] @ W[q + names[0] + ".weight"].T
            u = y[t] @ W[q + names[1] + ".weight"].T
            out[t] += we * ((g / (1.0 + np.exp(-g)) * u) @ W[q + names[2] + ".weight"].T)
    return out


def llama_logits(W, cfg, tok):
    s, h = len(tok), cfg["hidden_size"]
    a, g = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim", h // a)
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.outer(np.arange(s, dtype=np.float64), inv)  # (s, d/2)
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)
    x = W["model.embed_tokens.weight"][tok]
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        y = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = (y @ W[p + "self_attn.q_proj.weight"].T).reshape(s, a, d).transpose(1, 0, 2)
        k = (y @ W[p + "self_attn.k_proj.weight"].T).reshape(s, g, d).transpose(1, 0, 2)
        v = (y @ W[p + "self_attn.v_proj.weight"].T).reshape(s, g, d).transpose(1, 0, 2)
        if cfg["model_type"] in ("qwen3", "qwen3_moe"):  # each head's d channels RMS-normalised, then rotated
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, a // g, axis=0)  # query head i reads key/value head i // (a / g)
        v = np.repeat(v, a // g, axis=0)
        att = softmax_causal(q @ k.transpose(0, 2, 1) / np.sqrt(d), cfg.get("sliding_window"))
        o = (att @ v).transpose(1, 0, 2).reshape(s, a * d)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        y = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        if cfg["model_type"] == "mixtral":
            x = x + mixtral_moe(W, cfg, p + "block_sparse_moe.", y)
        elif cfg["model_type"] == "qwen3_moe" and l not in cfg["mlp_only_layers"] and \
                (l + 1) % cfg["decoder_sparse_step"] == 0:
            x = x + mixtral_moe(W, cfg, p + "mlp.", y, ("gate_proj", "up_proj", "down_proj"),
                                cfg["norm_topk_prob"])
        else:
            gate = y @ W[p + "mlp.gate_proj.weight"].T
            up = y @ W[p + "mlp.up_proj.weight"].T
            x = x + (gate / (1.0 + np.exp(-gate)) * up) @ W[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["lm_head.weight"] if "lm_head.weight" in W else W["model.embed_tokens.weight"]
    return x @ head.T


def shard(src, dst, n):
    """src's model.safetensors as n shard files and model.safetensors.index.json in dst, as
    transformers' save_pretrained writes a large model (the bytes of each tensor kept)."""
    import os
    import shutil
    raw = open(src + "/model.safetensors", "rb").read()
    (hl,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hl].decode("utf-8"))
    names = [k for k in header if k != "__metadata__"]
    os.makedirs(dst, exist_ok=True)
    shutil.copy(src + "/config.json", dst + "/config.json")
    weight_map = {}
    for i in range(n):
        part = names[i::n]
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, n)
        h, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
        for k in part:
            a, b = header[k]["data_offsets"]
            h[k] = {"dtype": header[k]["dtype"], "shape": header[k]["shape"], "data_offsets": [off, off + b - a]}
            blobs.append(raw[8 + hl + a:8 + hl + b])
            off += b - a
            weight_map[k] = fn
        hb = json.dumps(h).encode("utf-8")
        hb += b" " * (-len(hb) % 8)
        with open(dst + "/" + fn, "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))
    with open(dst + "/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": len(raw) - 8 - hl}, "weight_map": weight_map}, f)


def main():
    if sys.argv[1] == "--shard":
        shard(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    d, path = sys.argv[1], sys.argv[2]
    cfg = json.load(open(d + "/config.json"))
    W = load_safetensors(d + "/model.safetensors")
    raw = open(path, "rb").read()
    count, length = struct.unpack("<ii", raw[:8])
    toks = np.frombuffer(raw[8:], dtype="<i4").reshape(count, length)
    forward = gpt2_logits if cfg["model_type"] == "gpt2" else llama_logits
    total, n = 0.0, 0
    for row in toks:
        logits = forward(W, cfg, row[:-1])
        m = logits.max(axis=-1, keepdims=True)
        lse = (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))[:, 0]
        total += float((lse - logits[np.arange(len(row) - 1), row[1:]]).sum())
        n += len(row) - 1
    print("%.10f" % (total / n))


if __name__ == "__main__":
    main()
