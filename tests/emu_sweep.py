#!/usr/bin/env python3
"""emu_sweep.py - random configurations of the tiny models through the CUDA emulator.

Each draw picks a tiny model and overrides its shape, its options (dropout, biases, norms,
rotary, grouped queries, windows, documents, MoE routing, recompute, loss chunks, logits dtype,
the optimizer's numbers), its layout (tensor with or without sequence parallelism, context,
pipeline with its schedule and stage layout, data, experts) and the precision it trains in,
keeps it when `mgc check` accepts it, compiles its kernels in that precision through NVRTC for
sm_80 and sm_90 (none may spill), and runs `test_cuda --emu sets` on it: every op of one step
replayed against the CPU in fp32, bf16 and fp16, on every rank of the layout, then the layout
trained in the drawn precision against the CPU's run. Not part of CI (a draw takes 10 s to a few minutes); a tool for hunting kernel
and launcher defects across shapes the fixed tests do not cover (docs/testing.md). With --gpu
the draws run on the GPU instead (`test_cuda sets`: a few seconds each; scripts/gpu.sh sweep).

    python3 tests/emu_sweep.py [--build build] [--seed S] [--draws N] [--budget SECONDS]
                               [--timeout SECONDS] [--out DIR] [--gpu]

Every draw prints one line; a failing one, or one cut by --timeout (TIMEOUT: inconclusive,
counted apart), also writes DIR/draw-S-I.txt with the command that replays it and the test's
output (a refused one is only counted in the summary). Exit status 1 when any draw failed.
"""
import argparse
import os
import random
import subprocess
import sys
import time

MODELS = ["examples/tiny-gpt.yaml", "models/tiny-llama.yaml", "models/tiny-moe.yaml"]


def draw(rng):
    """One configuration: (model path, list of KEY=VALUE, training precision)."""
    model = rng.choice(MODELS)
    s = {}
    llama = "llama" in model
    moe = "moe" in model
    heads = rng.choice([1, 2, 3, 4, 6, 8])
    r = rng.random()
    if r < 0.85:
        d = rng.choice([16, 16, 32, 32, 64, 128])
    elif r < 0.95:
        d = rng.choice([8, 20, 24, 40, 48, 56, 72, 80, 96, 120])
    else:  # wide (past 128: the backward's dynamic shared memory and column slices); 264 refused
        d = rng.choice([136, 192, 200, 256, 264])
    s["model.num_attention_heads"] = heads
    s["model.head_dim"] = d
    # the residual width: usually heads x head dim, sometimes another multiple of 4 or 2
    h = heads * d if rng.random() < 0.7 else rng.choice([24, 40, 56, 72, 100, 120, 136, 200, 260])
    s["model.hidden_size"] = h
    groups = [g for g in range(1, heads + 1) if heads % g == 0]
    s["model.num_query_groups"] = rng.choice(groups)
    s["model.num_layers"] = rng.choice([2, 2, 3, 4] if moe else [1, 2, 2, 3, 4])
    seq = rng.choice([8, 16, 24, 32, 48, 64, 96, 128, 160])
    s["model.seq_length"] = seq
    s["model.max_position_embeddings"] = seq
    s["model.vocab_size"] = rng.choice([257, 300, 1000, 3001])
    s["model.make_vocab_size_divisible_by"] = rng.choice([1, 8, 64])
    if not moe:
        s["model.ffn_hidden_size"] = rng.choice([h, 2 * h, 4 * h, h + 8, 3 * h + 4, 200, 344])
    s["model.normalization"] = rng.choice(["layernorm", "rmsnorm"])
    s["model.activation"] = "swiglu" if llama or (moe and rng.random() < 0.5) else rng.choice(["gelu", "gelu", "swiglu"])
    s["model.add_bias_linear"] = rng.choice(["true", "false"])
    s["model.hidden_dropout"] = rng.choice([0, 0, 0.1])
    s["model.attention_dropout"] = rng.choice([0, 0, 0.1])
    if llama and rng.random() < 0.3:
        s["model.rotary_percent"] = 0.5
    if rng.random() < 0.15:
        s["model.qk_layernorm"] = "true"
    if rng.random() < 0.1:
        s["model.window_size"] = rng.choice([4, 8, 20])
    if not llama and not moe and rng.random() < 0.25:
        s["model.position_embedding"] = rng.choice(["rotary", "none"])
    if rng.random() < 0.2:
        s["model.tie_embeddings"] = rng.choice(["true", "false"])
    if rng.random() < 0.15:
        s["model.add_qkv_bias"] = "true"
    if "model.window_size" in s and s["model.num_layers"] > 1 and rng.random() < 0.5:
        s["model.window_layers"] = "[0]"
    if moe:
        e = rng.choice([2, 4, 8])
        s["moe.num_experts"] = e
        s["moe.top_k"] = rng.choice([k for k in (1, 2, 3) if k <= e])
        s["moe.ffn_hidden_size"] = rng.choice([16, 48, 64, 100])
        s["moe.shared_experts"] = rng.choice([0, 0, 1, 2])
        if s["moe.shared_experts"] and rng.random() < 0.5:
            s["moe.shared_expert_ffn_hidden_size"] = rng.choice([24, 72])
        if s["model.num_layers"] >= 3 and rng.random() < 0.3:
            s["moe.layer_freq"] = 2
        s["moe.first_dense_layers"] = rng.choice([0, 1])
        s["moe.router_score"] = rng.choice(["softmax", "softmax", "sigmoid", "presoftmax"])
        s["moe.aux_loss_scope"] = rng.choice(["microbatch", "sequence"])
        s["moe.router_dtype"] = rng.choice(["compute", "fp32"])
        s["moe.z_loss_coeff"] = rng.choice([0, 1e-3])
        if rng.random() < 0.3:
            s["moe.router_topk_scaling_factor"] = 2.5
        if e >= 4 and rng.random() < 0.25:  # group-limited routing: 2 groups, one or both
            s["moe.router_num_groups"] = 2
            s["moe.router_group_topk"] = rng.choice([g for g in (1, 2) if s["moe.top_k"] % g == 0])
        if s["moe.router_score"] == "sigmoid" and rng.random() < 0.5:
            s["moe.expert_bias_update_rate"] = 1e-3
        if rng.random() < 0.3:  # capacity mode
            s["moe.capacity_factor"] = rng.choice([0.5, 1.0, 1.5])
            s["moe.drop_policy"] = rng.choice(["probs", "position"])
    mbs = rng.choice([1, 2, 3])
    # the layout: two draws in three over several ranks, whose ops are replayed on each rank
    tp = cp = pp = dp = 1
    r = rng.random()
    if r < 0.35:
        pass
    elif r < 0.47:
        tp = 2
    elif r < 0.59:
        cp = 2
    elif r < 0.69:
        pp = 2
    elif r < 0.79:
        dp = 2
    elif r < 0.89:
        tp, dp = 2, 2
    else:
        tp, cp = 2, 2
    s["parallel.world_size"] = tp * cp * pp * dp
    s["parallel.tensor"] = tp
    s["parallel.context"] = cp
    s["parallel.pipeline"] = pp
    s["parallel.data"] = dp
    if tp > 1 and (moe or rng.random() < 0.5):
        s["parallel.sequence_parallel"] = "true"
    if moe and dp > 1 and rng.random() < 0.5:
        s["parallel.expert"] = 2
        if tp > 1 and rng.random() < 0.5:
            s["parallel.expert_tensor"] = rng.choice([1, 2])
    if pp > 1 and s["model.num_layers"] % 4 == 0 and rng.random() < 0.5:
        s["parallel.virtual_stages"] = 2
    if dp > 1 and rng.random() < 0.5:
        s["parallel.distributed_optimizer"] = "true"
    if dp > 1 and rng.random() < 0.3:
        s["parallel.grad_bucket_size"] = rng.choice([1000, 40000])
    s["training.micro_batch_size"] = mbs
    s["training.global_batch_size"] = mbs * dp * rng.choice([1, 2, 2, 4])
    s["training.recompute"] = rng.choice(["none", "none", "selective", "full"])
    if s["training.recompute"] == "full" and rng.random() < 0.5:
        s["training.recompute_method"] = rng.choice(["uniform", "block"])
        s["training.recompute_num_layers"] = 1
    if rng.random() < 0.15:
        s["training.recompute_modules"] = rng.choice(["[norm]", "[activation]", "[norm, activation]"]
                                                     + (["[dropout]"] if s["model.hidden_dropout"] else [])
                                                     + (["[moe]"] if moe else ["[mlp]"]))
    chunks = rng.choice([1, 1, 2, 3])  # each a multiple of 64 rows of the rank's positions
    s["training.loss_chunks"] = chunks if seq * mbs % (64 * chunks * cp) == 0 else 1
    s["training.logits_dtype"] = rng.choice(["fp32", "fp32", "compute"])
    if rng.random() < 0.15:
        s["data.reset_attention_mask"] = "true"
        s["data.reset_position_ids"] = rng.choice(["true", "false"])
    if rng.random() < 0.15:  # the loss without the tokens after an end of document
        s["data.eod_mask_loss"] = "true"
    # numbers the kernels and the optimizer take: eps, the rotary base, clipping that bites
    if rng.random() < 0.2:
        s["model.norm_eps"] = rng.choice([1e-6, 1e-2])
    if (llama or s.get("model.position_embedding") == "rotary") and rng.random() < 0.2:
        s["model.rotary_base"] = 500000
    if rng.random() < 0.3:
        s["optimizer.clip_grad"] = rng.choice([0, 0.05])
    if rng.random() < 0.2:
        s["optimizer.weight_decay"] = rng.choice([0, 0.3])
        s["optimizer.beta2"] = rng.choice([0.95, 0.999])
    # the pipeline's schedule, group size and explicit stage layouts
    if pp > 1 and rng.random() < 0.5:
        if "parallel.virtual_stages" in s:
            s["parallel.microbatch_group_size"] = rng.choice([1, 2, 4])
        else:
            s["parallel.schedule"] = rng.choice(["gpipe", "1f1b"])
    if pp > 1 and "parallel.virtual_stages" not in s and rng.random() < 0.3:
        n = s["model.num_layers"]
        first = rng.randint(0, n)  # a stage may hold no layer
        s["parallel.pipeline_layout"] = '["E%s", "%sL"]' % ("t*%d" % first if first else "",
                                                            "t*%d" % (n - first) if n > first else "")
    # the precision the layout trains in (every op is replayed in all three either way); fp16
    # with its dynamic loss scale, from the default 2^32 (the first steps overflow and are
    # skipped, on the GPU as on the CPU) or from 1024
    prec = rng.choice(["bf16"] * 7 + ["fp16"] * 2 + ["fp32"])
    if prec == "fp16":
        s["training.initial_loss_scale"] = rng.choice([4294967296, 1024])
        s["training.hysteresis"] = rng.choice([1, 2])
    # the GEMMs' epilogue fallbacks: a cuBLASLt without some of them at the draw's shapes (the
    # emulator's MGC_EMU_REFUSE_EPI; a GPU's cuBLASLt ignores it), or the bias gradients by
    # mgc's kernels (MGC_GEMM_BGRAD=0)
    env = {}
    if rng.random() < 0.15:
        env["MGC_EMU_REFUSE_EPI"] = ",".join(rng.sample(
            ["GELU_AUX", "GELU_AUX_BIAS", "DGELU", "BGRADB", "DGELU_BGRAD"], rng.randint(1, 3)))
    if rng.random() < 0.1:
        env["MGC_GEMM_BGRAD"] = "0"
    # a GPU with 100 KB of shared memory a multiprocessor (sm_86, sm_89), where the attention
    # launcher takes the one-buffer twins past head dim 64 to 128 (docs/cuda-backend.md; the
    # emulator's MGC_EMU_SMEM_PER_SM, which a GPU ignores)
    if rng.random() < 0.15:
        env["MGC_EMU_SMEM_PER_SM"] = "102400"
    return model, ["%s=%s" % kv for kv in s.items()], prec, env


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--draws", type=int, default=1000000)
    ap.add_argument("--budget", type=float, default=3600.0, help="seconds for the whole sweep")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds for one draw")
    ap.add_argument("--out", default="build/emu-sweep")
    ap.add_argument("--gpu", action="store_true", help="run the draws on the GPU, not the emulator")
    a = ap.parse_args()
    where = [] if a.gpu else ["--emu"]
    mgc = os.path.join(a.build, "compiler", "mgc")
    test = os.path.join(a.build, "tests", "test_cuda")
    for f in (mgc, test):
        if not os.access(f, os.X_OK):
            sys.exit("emu_sweep.py: %s is not built (cmake --build %s)" % (f, a.build))
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    t0 = time.time()
    ran = failed = refused = timed_out = 0
    print("emu_sweep: seed %d%s" % (a.seed, " on the GPU" if a.gpu else ""), flush=True)
    for i in range(a.draws):
        if time.time() - t0 > a.budget:
            break
        model, sets, prec, xenv = draw(rng)
        chk = subprocess.run([mgc, "check", "-q", model, "--set", "training.precision=" + prec]
                             + [x for kv in sets for x in ("--set", kv)],
                             capture_output=True, text=True)
        if chk.returncode != 0 or "cannot train on a GPU" in chk.stderr:
            refused += 1  # invalid, or (mgc check's warning) beyond what the CUDA kernels serve
            continue
        # the kernels through NVRTC for sm_80 and sm_90 in the draw's precision: none may spill
        # (test_kernels' rule for the models' shapes)
        plan = os.path.join(a.out, "draw.plan")
        comp = subprocess.run([mgc, "compile", model, "--arch", "80,90", "-o", plan,
                               "--set", "training.precision=" + prec] + [x for kv in sets for x in ("--set", kv)],
                              capture_output=True, text=True,
                              env=dict(os.environ, MGC_KERNEL_CACHE=os.path.join(a.out, "kernel-cache")))
        spill = [l for l in comp.stdout.splitlines() if l.startswith("kernels:") and not l.endswith(" 0 spill bytes")]
        if comp.returncode != 0 or spill:
            failed += 1
            path = os.path.join(a.out, "draw-%d-%d-compile.txt" % (a.seed, i))
            with open(path, "w") as f:
                f.write("%s compile %s --arch 80,90 --set training.precision=%s %s\n\n%s%s" % (
                    mgc, model, prec, " ".join("--set " + kv for kv in sets), comp.stdout, comp.stderr))
            print("FAILED %d compile %s %s -> %s" % (i, os.path.basename(model), " ".join(sets), path), flush=True)
        env = dict(os.environ, MGC_TEST_MODEL=model, MGC_TEST_SETS=";".join(sets),
                   MGC_TEST_SEED=str(a.seed + i), MGC_TEST_PRECISION=prec, **xenv)
        xs = "".join("%s=%s " % kv for kv in sorted(xenv.items()))
        cmd = "%sMGC_TEST_MODEL=%s MGC_TEST_SETS='%s' MGC_TEST_PRECISION=%s MGC_TEST_SEED=%d %s %ssets" % (
            xs, model, ";".join(sets), prec, a.seed + i, test, "" if a.gpu else "--emu ")
        t1 = time.time()
        try:
            for attempt in range(3):  # a rebuild may hold the binary for a moment
                try:
                    run = subprocess.run([test] + where + ["sets"], env=env, capture_output=True,
                                         text=True, timeout=a.timeout)
                    break
                except OSError:
                    if attempt == 2:
                        raise
                    time.sleep(10)
            out, rc = run.stdout + run.stderr, run.returncode
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc = "timeout"
        ran += 1
        tail = [l for l in out.splitlines() if "checks," in l]
        line = "%d %s%s %s %s: %s (%.0f s)" % (i, xs, os.path.basename(model), prec, " ".join(sets),
                                          tail[-1] if tail else "rc %s" % rc, time.time() - t1)
        if rc == 77:  # test_cuda without a GPU (--gpu on a machine without one)
            sys.exit("emu_sweep.py: %s sets skipped itself (77): no GPU" % test)
        if rc != 0:
            # a draw cut by --timeout proves nothing either way (a big one on a busy machine):
            # counted apart from the failures, its output kept all the same
            if rc == "timeout":
                timed_out += 1
            else:
                failed += 1
            path = os.path.join(a.out, "draw-%d-%d.txt" % (a.seed, i))
            with open(path, "w") as f:
                f.write(cmd + "\n\n" + out)
            line = ("TIMEOUT " if rc == "timeout" else "FAILED ") + line + " -> " + path
        print(line, flush=True)
    print("emu_sweep: seed %d: %d draws run, %d failed, %d timed out, %d refused by mgc check or not "
          "for a GPU, %.0f s" % (a.seed, ran, failed, timed_out, refused, time.time() - t0), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
