#!/usr/bin/env python3
"""targets.py - the CUDA backend's speed targets (docs/cuda-backend.md), read off one report.

    python3 bench/targets.py bench-gpu.md        # prints a "## Targets" section
    python3 bench/targets.py --self-test         # the parser against a made-up report

bench/bench_gpu.sh appends the section to its report.  Each target is judged per model from
the report's own tables, so every figure comes from the same run:
- end-to-end: mgc's median step against `torch.compile`'s (the same tokens a step, so the
  ratio of step times is the ratio of tokens/s), at least 1.0x;
- attention forward plus backward against PyTorch's SDPA at the model's shape, at least 0.8x
  (the attention table's last column);
- memory-bound kernels at 80% or more of the copy bandwidth measured in the run: the line
  `mgc profile` writes after each model's kernel table (every memory-bound kind, by its
  tensor bytes over its device time).
A target whose figures are missing (a failed row, a model not profiled) is "not measured",
never met.
"""
import re
import sys

MEM_LINE = re.compile(r"^Memory-bound kinds at 80% of copy or more: (\d+) of (\d+) \(([\d.]+)% of their time\)\.(.*)$")
KERNELS_HEAD = re.compile(r"^#+ Kernels of (\S+) measured on")


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def number(s):
    try:
        return float(s)
    except ValueError:
        return None


def parse(text):
    """{model: {"mgc": ms, "pytorch-compile": ms, "attention": ratio, "memory": (ok, n, share, below)}}"""
    models = {}
    section = None
    for line in text.splitlines():
        m = KERNELS_HEAD.match(line)
        if m:
            section = re.sub(r"\.plan$", "", m.group(1).rsplit("/", 1)[-1])
            continue
        m = MEM_LINE.match(line)
        if m and section:
            below = m.group(4).strip()
            below = below[len("Below:"):].strip().rstrip(".") if below.startswith("Below:") else ""
            models.setdefault(section, {})["memory"] = (int(m.group(1)), int(m.group(2)), float(m.group(3)), below)
            continue
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        c = cells(line)
        if len(c) == 5 and c[1] in ("mgc", "pytorch-compile", "pytorch-eager") and number(c[2]) is not None:
            models.setdefault(c[0], {})[c[1]] = number(c[2])
        elif len(c) == 7 and c[6].endswith("x") and number(c[6][:-1]) is not None:
            models.setdefault(c[0], {})["attention"] = number(c[6][:-1])
    return models


def verdict(ok):
    return "met" if ok else "not met"


def table(models):
    out = ["## Targets (docs/cuda-backend.md)", "",
           "| target | model | measured | verdict |", "|---|---|---|---|"]
    for name in sorted(models):
        m = models[name]
        a, t = m.get("mgc"), m.get("pytorch-compile")
        if a and t:
            r = t / a
            out.append("| end-to-end >= 1.0x torch.compile | %s | %.2fx (mgc %.2f ms, torch.compile %.2f ms a step) | %s |"
                       % (name, r, a, t, verdict(r >= 1.0)))
        else:
            out.append("| end-to-end >= 1.0x torch.compile | %s | | not measured |" % name)
        r = m.get("attention")
        if r is not None:
            out.append("| attention fwd+bwd >= 0.8x SDPA | %s | %.2fx | %s |" % (name, r, verdict(r >= 0.8)))
        else:
            out.append("| attention fwd+bwd >= 0.8x SDPA | %s | | not measured |" % name)
        mem = m.get("memory")
        if mem:
            ok, n, share, below = mem
            text = "%d of %d kinds (%.1f%% of their time)%s" % (ok, n, share, "; below: " + below if below else "")
            out.append("| memory-bound kernels >= 80%% of copy | %s | %s | %s |" % (name, text, verdict(ok == n)))
        else:
            out.append("| memory-bound kernels >= 80%% of copy | %s | | not measured |" % name)
    return "\n".join(out) + "\n"


SAMPLE = """# GPU training throughput

| model | implementation | median step ms | tokens/s | memory bytes |
|---|---|---:|---:|---:|
| gpt2-124m | mgc | 20.05 | 408600 | 5560000000 |
| gpt2-124m | mgc, MGC_GEMM_EPILOGUES=0 | 20.60 | 397700 | 5560000000 |
| gpt2-124m | pytorch-eager | 33.73 | 242860 | 9530000000 |
| gpt2-124m | pytorch-compile | 20.83 | 392600 | 5490000000 |
| gpt2-1.5b | mgc | 126.00 | 32500 | 39090000000 |
| gpt2-1.5b | pytorch-compile | 122.33 | 33483 | 34380000000 |

| model | shape | mgc fwd | SDPA fwd | mgc bwd | SDPA bwd | mgc speed vs SDPA (fwd+bwd) |
|---|---|---:|---:|---:|---:|---:|
| gpt2-124m | 8x12x1024x64 | 0.122 | 0.081 | 0.295 | 0.341 | 1.02x |
| gpt2-1.5b | 4x25x1024x64 | 0.500 | 0.093 | 0.600 | 0.352 | 0.40x |

## Kernels of out/gpt2-124m.plan measured on NVIDIA H100 80GB HBM3 (cuda backend)

| kernel | pass | ops | ms/step | share | GB/s | % of copy | TFLOP/s | % of GEMM |
| norm_bwd | bwd | 25 | 0.500 | 2.5% | 2400.0 | 81% |  |  |

Memory-bound kinds at 80% of copy or more: 7 of 7 (100.0% of their time).

## Kernels of out/gpt2-1.5b.plan measured on NVIDIA H100 80GB HBM3 (cuda backend)

Memory-bound kinds at 80% of copy or more: 5 of 7 (91.5% of their time). Below: norm fwd 60% (0.014 ms), embedding fwd 67% (0.019 ms).
"""


def self_test():
    got = table(parse(SAMPLE))
    want = [
        "| end-to-end >= 1.0x torch.compile | gpt2-1.5b | 0.97x (mgc 126.00 ms, torch.compile 122.33 ms a step) | not met |",
        "| attention fwd+bwd >= 0.8x SDPA | gpt2-1.5b | 0.40x | not met |",
        "| memory-bound kernels >= 80% of copy | gpt2-1.5b | 5 of 7 kinds (91.5% of their time); below: "
        "norm fwd 60% (0.014 ms), embedding fwd 67% (0.019 ms) | not met |",
        "| end-to-end >= 1.0x torch.compile | gpt2-124m | 1.04x (mgc 20.05 ms, torch.compile 20.83 ms a step) | met |",
        "| attention fwd+bwd >= 0.8x SDPA | gpt2-124m | 1.02x | met |",
        "| memory-bound kernels >= 80% of copy | gpt2-124m | 7 of 7 kinds (100.0% of their time) | met |",
    ]
    rows = [l for l in got.splitlines() if l.startswith("| ") and not l.startswith("| target")]
    bad = [w for w in want if w not in rows] + [r for r in rows if r not in want]
    # a model whose rows failed is not measured, not met
    lone = table(parse("| gpt2-7b | mgc | failed: out of memory |\n| gpt2-7b | pytorch-compile | 50.0 | 1 | 1 |\n"))
    if "| end-to-end >= 1.0x torch.compile | gpt2-7b | | not measured |" not in lone:
        bad.append("a failed mgc row: " + lone)
    for b in bad:
        print("targets.py self-test: " + b)
    print("targets.py self-test: %s (%d rows)" % ("FAILED" if bad else "ok", len(rows)))
    return 1 if bad else 0


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        sys.exit(self_test())
    if len(sys.argv) != 2:
        sys.exit("usage: targets.py REPORT.md | --self-test")
    try:
        text = open(sys.argv[1]).read()
    except OSError as e:
        sys.exit("targets.py: cannot read %s: %s" % (sys.argv[1], e.strerror))
    sys.stdout.write(table(parse(text)))


if __name__ == "__main__":
    main()
