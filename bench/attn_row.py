#!/usr/bin/env python3
"""attn_row.py PROFILE SDPA LABEL - one row of the attention-against-SDPA tables of
bench/bench_gpu.sh and scripts/gpu.sh wide: mgc's attention and attention_bwd ops' mean device
time a call from an `mgc-run --profile` JSON-lines file, against SDPA's forward and backward
from `bench/torch_gpt_gpu.py --sdpa` at the same shape.

    | LABEL | shape | mgc fwd | SDPA fwd | mgc bwd | SDPA bwd | SDPA's time / mgc's (fwd+bwd) |

`--self-test` checks it on a made-up profile (CI: bench_attn_row).
"""
import json
import os
import sys
import tempfile


def row(profile, sdpa, label):
    ops = [json.loads(l) for l in open(profile) if l.strip()]
    ops = [o for o in ops if o.get("type") == "op"]

    def per_call(kind):
        v = [o["mean_s"] * 1e3 for o in ops if o["kind"] == kind]
        return sum(v) / len(v) if v else float("nan")

    f, b = per_call("attention"), per_call("attention_bwd")
    t = json.load(open(sdpa))
    sf, sb = t["sdpa_fwd_ms"], t["sdpa_bwd_ms"]
    return "| %s | %s | %.3f | %.3f | %.3f | %.3f | %.2fx |" % (
        label, "x".join(map(str, t["shape"])), f, sf, b, sb, (sf + sb) / (f + b))


def self_test():
    """Two forward calls of 0.1 and 0.3 ms (mean 0.2), one backward of 0.3, a step record
    (not an op) and SDPA's 0.1 + 0.25: 0.35 / 0.5 = 0.70x."""
    with tempfile.TemporaryDirectory() as d:
        p, s = os.path.join(d, "p.jsonl"), os.path.join(d, "s.json")
        with open(p, "w") as f:
            f.write('{"type":"op","kind":"attention","mean_s":0.0001}\n'
                    '{"type":"op","kind":"attention_bwd","mean_s":0.0003}\n\n'
                    '{"type":"op","kind":"attention","mean_s":0.0003}\n{"type":"step","mean_s":9}\n')
        with open(s, "w") as f:
            f.write('{"sdpa_fwd_ms":0.1,"sdpa_bwd_ms":0.25,"shape":[2,8,2048,256]}')
        got = row(p, s, "256")
    want = "| 256 | 2x8x2048x256 | 0.200 | 0.100 | 0.300 | 0.250 | 0.70x |"
    if got != want:
        sys.exit("attn_row.py self-test: got %s, want %s" % (got, want))
    print("attn_row.py self-test: ok")


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        return self_test()
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("\n\n")[0])
    print(row(sys.argv[1], sys.argv[2], sys.argv[3]))


if __name__ == "__main__":
    main()
