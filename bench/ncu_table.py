#!/usr/bin/env python3
"""ncu_table.py - per-kernel device time and DRAM traffic of one profiled training step.

    ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        mgc-run PLAN --backend cuda --iterations 1 > step.csv
    python3 bench/ncu_table.py step.csv COPY_GBPS > kernels.md
    python3 bench/ncu_table.py --curve curve.csv step.csv COPY_GBPS   (curve: bench/copy_curve.py)

Each kernel launch's duration is measured by Nsight Compute on the device (no launch latency,
no host synchronisation; `mgc-run --profile` times each op on the device too, with CUDA events,
and `mgc profile` divides the op's tensor bytes by that time), with the bytes that reached DRAM.  A
kernel whose inputs the previous kernel left in L2 (50 MB on the H100) moves more bytes than
reach DRAM: its achieved bandwidth is its tensors' bytes over this duration, which
bench/results/gpu-h100.md works out for the memory-bound kernels.  The
table groups launches by kernel name (mgc's names carry the specialisation: entry, storage
type and constants), sums their time and traffic and gives the achieved bandwidth against
COPY_GBPS, the device-to-device copy bandwidth measured in the same run.

With --curve, the ncu CSV of bench/copy_curve.py run in the same call: a table of copy time
against size (and the floor: an empty kernel), and a column that puts each kernel beside a
copy of as many DRAM bytes (the curve interpolated linearly in bytes; below its first point,
between the floor and that point).  The 1 GiB copy's bandwidth stays the issue's ceiling; the
size-matched copy says how much of a kernel's shortfall any kernel of its size would have.
"""
import csv
import statistics
import sys
from collections import OrderedDict

TIME = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}
BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
         "KB": 1e3, "MB": 1e6, "GB": 1e9}


def read_launches(path):
    """ncu --csv output -> OrderedDict launch ID -> {name, t (s), rd, wr (bytes)}"""
    launches = OrderedDict()
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own notes precede the table
    for row in csv.DictReader(lines):
        try:
            lid = row["ID"]
            name = row["Kernel Name"]
            metric, unit = row["Metric Name"], row["Metric Unit"]
            val = float(row["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        e = launches.setdefault(lid, {"name": name, "t": 0.0, "rd": 0.0, "wr": 0.0})
        if metric == "gpu__time_duration.sum":
            e["t"] = val * TIME.get(unit, 1e-9)
        elif metric == "dram__bytes_read.sum":
            e["rd"] = val * BYTES.get(unit, 1.0)
        elif metric == "dram__bytes_write.sum":
            e["wr"] = val * BYTES.get(unit, 1.0)
    return launches


def read_curve(path):
    """bench/copy_curve.py under ncu -> (floor s, [(DRAM bytes, s, nominal bytes)] by size)"""
    import copy_curve as cc
    launches = list(read_launches(path).values())
    floor = [e["t"] for e in launches if cc.FLOOR_KERNEL in e["name"]]
    # the copies are the script's last launches (before them: the floor's, and PyTorch's own)
    n = len(cc.SIZES) * cc.REPS
    copies = [e for e in launches if cc.FLOOR_KERNEL not in e["name"]][-n:]
    if not floor or len(copies) != n or len(set(e["name"] for e in copies)) != 1:
        sys.exit("ncu_table.py: %s: expected launches of %s and then %d of one copy kernel, "
                 "found %d and %d of %d kernels" % (path, cc.FLOOR_KERNEL, n, len(floor),
                                                   len(copies), len(set(e["name"] for e in copies))))
    pts = []
    for i, nominal in enumerate(cc.SIZES):
        g = copies[i * cc.REPS:(i + 1) * cc.REPS]
        pts.append((statistics.median(e["rd"] + e["wr"] for e in g),
                    statistics.median(e["t"] for e in g), nominal))
    return statistics.median(floor), sorted(pts)


def copy_time(floor, pts, b):
    """a copy's time for b DRAM bytes: the curve interpolated (past its ends: the floor, or
    the last point's rate)"""
    prev = (0.0, floor)
    for x, t, _ in pts:
        if b <= x:
            return prev[1] + (t - prev[1]) * (b - prev[0]) / (x - prev[0]) if x > prev[0] else t
        prev = (x, t)
    return prev[1] * b / prev[0]


def self_test():
    """made-up ncu CSVs of a step and of copy_curve.py: the parse, the curve and the columns"""
    import io
    import os
    import tempfile
    import copy_curve as cc

    def csv_of(rows):  # rows: (name, us, read bytes, write bytes)
        out = ['"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n']
        for i, (name, us, rd, wr) in enumerate(rows):
            out.append('"%d","%s","gpu__time_duration.sum","usecond","%.4f"\n' % (i, name, us))
            out.append('"%d","%s","dram__bytes_read.sum","Mbyte","%.4f"\n' % (i, name, rd / 1e6))
            out.append('"%d","%s","dram__bytes_write.sum","byte","%s"\n' % (i, name, "{:,.0f}".format(wr)))
        return "==PROF== notes ncu prints first\n" + "".join(out)

    # copies at 4 TB/s plus 2 us, the floor 1.5 us; a torch fill kernel to be ignored
    rows = [("at::fill_kernel", 9.0, 0, 1e6)] + [("spin_kernel", 1.5, 0, 0)] * cc.REPS
    for b in cc.SIZES:
        rows += [("vectorized_elementwise_kernel<MulFunctor<float>>", 2.0 + b / 4e6, b / 2, b / 2)] * cc.REPS
    step = [("mgc_add_layernorm_fwd_bf16_H768", 15.0, 25e6, 25e6)] * 2 + \
           [("sm90_xmma_gemm_bf16(int)", 50.0, 10e6, 5e6)]
    with tempfile.TemporaryDirectory() as d:
        cp, sp = os.path.join(d, "curve.csv"), os.path.join(d, "step.csv")
        open(cp, "w").write(csv_of(rows))
        open(sp, "w").write(csv_of(step))
        floor, pts = read_curve(cp)
        assert abs(floor - 1.5e-6) < 1e-12, floor
        assert len(pts) == len(cc.SIZES) and pts[0][0] == cc.SIZES[0], pts[:2]
        t50 = copy_time(floor, pts, 50e6)  # a point of the curve
        assert abs(t50 - (2.0 + 12.5) * 1e-6) < 1e-12, t50
        t60 = copy_time(floor, pts, 60e6)  # between 50 and 75 MB: linear
        assert abs(t60 - (2.0 + 15.0) * 1e-6) < 1e-12, t60
        t0 = copy_time(floor, pts, 3.125e6)  # half way from the floor to the first point
        assert abs(t0 - (1.5 + (2.0 + 6.25 / 4 - 1.5) / 2) * 1e-6) < 1e-12, t0
        t4g = copy_time(floor, pts, 4e9)  # past the last: its rate
        assert abs(t4g - 2 * (2.0 + 500.0) * 1e-6) < 1e-9, t4g
        out = io.StringIO()
        old, sys.stdout, sys.argv = sys.stdout, out, ["ncu_table.py", "--curve", cp, sp, "4000"]
        try:
            main()
        finally:
            sys.stdout = old
        text = out.getvalue()
        # 50 MB in 15 us: 3333 GB/s, 83% of 4000; the 50 MB copy 14.5 us: 97% of it
        line = [l for l in text.splitlines() if l.startswith("| mgc_add_layernorm")][0]
        assert "| 2 | 30.0 | 15.00 |" in line and "| 3333 | 83% | 14.50 | 97% |" in line, line
        assert "| 50.0 MB | 50.0 MB | 14.50 | 3448 | 86% |" in text, text
        assert "empty kernel: 1.50 us" in text, text
    print("ncu_table.py: self-test passed")


def main():
    args = sys.argv[1:]
    if args == ["--self-test"]:
        self_test()
        return
    curve = None
    if len(args) == 4 and args[0] == "--curve":
        curve = read_curve(args[1])
        args = args[2:]
    if len(args) != 2:
        sys.exit("usage: ncu_table.py [--curve CURVE.csv] STEP.csv COPY_GBPS")
    copy = float(args[1])
    launches = read_launches(args[0])
    if not launches:
        sys.exit("ncu_table.py: %s: no kernel rows (was ncu run with --csv?)" % args[0])
    groups = {}
    for e in launches.values():
        name = e["name"]
        if not name.startswith("mgc_"):  # cuBLASLt and other library kernels: one row each
            name = name.split("(")[0][:60]
        g = groups.setdefault(name, {"n": 0, "t": 0.0, "b": 0.0})
        g["n"] += 1
        g["t"] += e["t"]
        g["b"] += e["rd"] + e["wr"]
    total = sum(g["t"] for g in groups.values())
    print("Kernel time of the step: %.3f ms over %d launches (ncu gpu__time_duration); copy "
          "ceiling %.0f GB/s." % (total * 1e3, len(launches), copy))
    print()
    if curve:
        floor, pts = curve
        print("Copies of each size (bench/copy_curve.py, PyTorch's fp32 b = a * 1, medians of "
              "its launches) and an empty kernel: %.2f us." % (floor * 1e6))
        print()
        print("| bytes moved | DRAM bytes | us | GB/s | % of copy ceiling |")
        print("|---:|---:|---:|---:|---:|")
        for x, t, nominal in pts:
            print("| %.1f MB | %.1f MB | %.2f | %.0f | %.0f%% |" % (
                nominal / 1e6, x / 1e6, t * 1e6, nominal / t / 1e9, 100 * nominal / t / 1e9 / copy))
        print()
        print("| kernel | launches | total us | us a launch | share | DRAM GB/s | % of copy | "
              "same-size copy us | % of same-size copy |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    else:
        print("| kernel | launches | total us | us a launch | share | DRAM GB/s | % of copy |")
        print("|---|---:|---:|---:|---:|---:|---:|")
    for name, g in sorted(groups.items(), key=lambda kv: -kv[1]["t"]):
        bw = g["b"] / g["t"] / 1e9 if g["t"] > 0 else 0.0
        row = "| %s | %d | %.1f | %.2f | %.1f%% | %.0f | %.0f%% |" % (
            name, g["n"], g["t"] * 1e6, g["t"] * 1e6 / g["n"], 100 * g["t"] / total, bw,
            100 * bw / copy)
        if curve:
            tc = copy_time(floor, pts, g["b"] / g["n"])
            row += " %.2f | %.0f%% |" % (tc * 1e6, 100 * tc * g["n"] / g["t"] if g["t"] > 0 else 0.0)
        print(row)


if __name__ == "__main__":
    main()
