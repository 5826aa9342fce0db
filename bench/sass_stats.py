#!/usr/bin/env python3
"""sass_stats.py - static instruction counts of mgc's compiled kernels, without a GPU.

    python3 bench/sass_stats.py CUBIN...      (kernel-cache files, *.cubin, or plain ELF cubins)

For each kernel: registers (from the cache header), the SASS instruction count, and the same
for its hot loop (the loop whose body holds the most tensor-core mma, else the most global
loads and stores), with the body's mma (HMMA), ldmatrix (LDSM), MUFU (exp2, reciprocals),
shuffles, barriers and branches.
The body is every path of the loop (masked and unmasked tiles both), so the figure is a size,
not a trace; comparing two builds of a kernel shows what a source change did to its inner loop.

The disassembler is cuobjdump from the CUDA toolkit, the copy the `triton` wheel ships (the
benchmark environment, bench/bench_gpu.sh), or NVIDIA's cuobjdump and nvdisasm wheels that
bench_sass.sh installs into build/sass-venv; MGC_CUOBJDUMP names another. Exit status 2 when
none is found."""
import collections
import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

INS = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def find_cuobjdump():
    cands = [os.environ.get("MGC_CUOBJDUMP"), shutil.which("cuobjdump"),
             "/usr/local/cuda/bin/cuobjdump"]
    here = os.path.dirname(os.path.abspath(__file__))
    cands += glob.glob(os.path.join(here, "..", "build", "bench-venv", "lib", "python3*",
                                    "site-packages", "triton", "backends", "nvidia", "bin",
                                    "cuobjdump"))
    cands += glob.glob(os.path.join(here, "..", "build", "sass-venv", "lib", "python3*",
                                    "site-packages", "nvidia", "cu*", "bin", "cuobjdump"))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def elf_of(path):
    """The cubin's ELF bytes and the registers the kernel cache's header records (or None)."""
    data = open(path, "rb").read()
    if data[:4] == b"\x7fELF":
        return data, None
    i = data.find(b"\x7fELF")
    if data[:4] != b"MGCK" or i < 0:
        raise ValueError("%s: neither an ELF cubin nor a kernel-cache entry" % path)
    regs = struct.unpack_from("<I", data, 16)[0] if i >= 20 else None
    return data[i:], regs


def parse(text):
    kernels, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = kernels.setdefault(m.group(1), [])
            continue
        m = INS.match(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2)))
    return kernels


def opcode(text):
    t = text.split()
    if t[0].startswith("@"):
        t = t[1:]
    return t[0]


def classes(ins):
    c = collections.Counter()
    for _, t in ins:
        op = opcode(t)
        base = op.split(".")[0]
        c["all"] += 1
        if base in ("HMMA", "LDSM", "SHFL", "BRA", "LDGSTS"):
            c[base] += 1
        elif base == "MUFU":
            c["MUFU." + op.split(".")[1]] += 1
        elif base == "BAR":
            c["BAR"] += 1
    return c


def hot_loop(ins):
    """(start, end) addresses of the loop (a backward branch and its target) whose body holds
    the most tensor-core mma (the shortest such), else the most global loads and stores."""
    best, span = None, None
    for a, t in ins:
        m = re.search(r"\bBRA\s+(?:\S+,\s*)?0x([0-9a-f]+)", t)
        if not m:
            continue
        tgt = int(m.group(1), 16)
        if tgt >= a:
            continue
        ops = [opcode(u).split(".")[0] for b, u in ins if tgt <= b <= a]
        mma = ops.count("HMMA")  # with mma: the innermost loop that holds the most of them
        key = (mma, 0 if mma else sum(ops.count(k) for k in ("LDG", "STG", "LDGSTS")), -len(ops))
        if best is None or key > best:
            best, span = key, (tgt, a)
    return span


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    tool = find_cuobjdump()
    if not tool:
        print("sass_stats: no cuobjdump (CUDA toolkit, or the triton wheel of bench/bench_gpu.sh's "
              "environment; MGC_CUOBJDUMP names one)", file=sys.stderr)
        return 2
    cols = ["all", "HMMA", "LDSM", "MUFU.EX2", "MUFU.RCP", "SHFL", "BAR", "BRA"]
    print("| kernel | regs | where | " + " | ".join(cols) + " |")
    print("|---|---:|---|" + "---:|" * len(cols))
    for path in argv[1:]:
        try:
            elf, regs = elf_of(path)
        except (OSError, ValueError) as e:
            print("sass_stats: %s" % e, file=sys.stderr)
            return 1
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(elf)
            f.flush()
            # its nvdisasm beside it first (the wheels put both in one folder)
            env = dict(os.environ, PATH=os.path.dirname(tool) + os.pathsep +
                       os.environ.get("PATH", ""))
            out = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True,
                                 env=env)
        if out.returncode != 0:
            print("sass_stats: %s: cuobjdump failed: %s" % (path, out.stderr.strip()),
                  file=sys.stderr)
            return 1
        for name, ins in parse(out.stdout).items():
            rows = [("kernel", ins)]
            span = hot_loop(ins)
            if span:
                rows.append(("hot loop", [x for x in ins if span[0] <= x[0] <= span[1]]))
            for where, part in rows:
                c = classes(part)
                print("| %s | %s | %s | %s |" % (name, regs if regs is not None else "", where,
                                                  " | ".join(str(c[k]) for k in cols)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
