#!/usr/bin/env python3
"""ncu_table.py - per-kernel device time and DRAM traffic of one profiled training step.

    ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        mgc-run PLAN --backend cuda --iterations 1 > step.csv
    python3 bench/ncu_table.py step.csv COPY_GBPS > kernels.md

Each kernel launch's duration is measured by Nsight Compute on the device (no launch latency,
no host synchronisation; `mgc-run --profile` times each op on the device too, with CUDA events,
and `mgc profile` divides the op's tensor bytes by that time), with the bytes that reached DRAM.  A
kernel whose inputs the previous kernel left in L2 (50 MB on the H100) moves more bytes than
reach DRAM: its achieved bandwidth is its tensors' bytes over this duration, which
bench/results/gpu-h100.md works out for the memory-bound kernels.  The
table groups launches by kernel name (mgc's names carry the specialisation: entry, storage
type and constants), sums their time and traffic and gives the achieved bandwidth against
COPY_GBPS, the device-to-device copy bandwidth measured in the same run.
"""
import csv
import sys
from collections import OrderedDict

TIME = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}
BYTES = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
         "KB": 1e3, "MB": 1e6, "GB": 1e9}


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: ncu_table.py STEP.csv COPY_GBPS")
    copy = float(sys.argv[2])
    launches = OrderedDict()  # ID -> {name, t, rd, wr}
    with open(sys.argv[1], newline="") as f:
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
    if not launches:
        sys.exit("ncu_table.py: %s: no kernel rows (was ncu run with --csv?)" % sys.argv[1])
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
    print("| kernel | launches | total us | us a launch | share | DRAM GB/s | % of copy |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, g in sorted(groups.items(), key=lambda kv: -kv[1]["t"]):
        bw = g["b"] / g["t"] / 1e9 if g["t"] > 0 else 0.0
        print("| %s | %d | %.1f | %.2f | %.1f%% | %.0f | %.0f%% |" % (
            name, g["n"], g["t"] * 1e6, g["t"] * 1e6 / g["n"], 100 * g["t"] / total, bw,
            100 * bw / copy))


if __name__ == "__main__":
    main()
