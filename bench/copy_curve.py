#!/usr/bin/env python3
"""copy_curve.py - device-to-device copies of the sizes mgc's memory-bound kernels move, and
an empty kernel, for Nsight Compute to time (scripts/gpu.sh kern and quick):

    ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python3 bench/copy_curve.py > curve.csv
    python3 bench/ncu_table.py --curve curve.csv step.csv COPY_GBPS

The issue's ceiling is the bandwidth of a 1 GiB copy, where a launch's fixed costs (the grid's
start, the first loads' latency, the last wave's tail) vanish.  A norm of GPT-2 124M moves 25
to 52 MB, which the H200 copies in 6 to 12 us: there those costs are a share of the time, for
a copy as for any kernel.  ncu_table.py puts each kernel beside a copy of the same bytes (this
curve, interpolated) as well as beside the 1 GiB copy.  The copy is PyTorch's elementwise
kernel for b = a * 1 in fp32 (16-byte loads and stores; a same-type copy_ would be a
cudaMemcpy, which ncu does not time as a kernel), so the curve also says how near a plain
streaming kernel comes to the 1 GiB memcpy's bandwidth.  torch.cuda._sleep(0) is a kernel that
returns at once: the floor of a launch under ncu.  The copies are the script's last
launches, REPS of each size in the order of SIZES; ncu_table.py takes their medians."""
# bytes each copy moves (read + written: 8 bytes an fp32 element), 6.25 MB to 2 GB, each
# launched REPS times in this order (ncu_table.py reads them back by position)
SIZES = [6_250_000, 12_500_000, 25_000_000, 37_500_000, 50_000_000, 75_000_000,
         100_000_000, 200_000_000, 400_000_000, 2_000_000_000]
REPS = 3
FLOOR_KERNEL = "spin"  # in the name of torch.cuda._sleep's kernel


def main():
    import torch
    dev = "cuda"
    sizes = SIZES
    big = max(sizes) // 8
    a = torch.ones(big, dtype=torch.float32, device=dev)
    b = torch.empty_like(a)
    torch.cuda.synchronize()
    for _ in range(REPS):
        torch.cuda._sleep(0)
    for moved in sizes:
        n = moved // 8
        for _ in range(REPS):
            torch.mul(a[:n], 1.0, out=b[:n])
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
