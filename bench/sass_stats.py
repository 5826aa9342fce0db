#!/usr/bin/env python3
"""sass_stats.py - static instruction counts of mgc's compiled kernels, without a GPU.

    python3 bench/sass_stats.py CUBIN...      (kernel-cache files, *.cubin, or plain ELF cubins)

For each kernel: registers (from the cache header), the SASS instruction count, and the same
for its hot loop (the loop whose body holds the most tensor-core mma, else the most global
loads and stores), with the body's mma (HMMA), ldmatrix (LDSM), MUFU (exp2, reciprocals),
shuffles, barriers and branches; and its global loads (LDG) with the waits they cause (LDG
waits: instructions that read a register some load since the last wait writes).  A batch of
loads issued before any of them is used is one wait; a load used at once is a wait of its own.
Many waits for few loads in a loop meant to read ahead is a kernel that waits for its rows one
at a time: embedding_bwd_sorted's loop (both paths of a batch of 8 rows) had 44 waits for 136
loads when each row's bf16 conversion sat beside its load (32.7 us on the H100), 9 once the
conversions moved to the additions (10.8 us).
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


NO_DEST = ("ST", "STG", "STS", "STL", "RED", "BRA", "BAR", "EXIT", "BSYNC", "BSSY", "WARPSYNC",
           "CALL", "RET", "MEMBAR", "DEPBAR", "NOP", "YIELD", "PREEXIT", "ACQBULK", "ERRBAR")
REG = re.compile(r"\bR(\d+)(\.64)?")


def regs_of(operand):
    """the general registers an operand names (R10.64: R10 and R11; RZ none)"""
    out = []
    for m in REG.finditer(operand):
        r = int(m.group(1))
        out += [r, r + 1] if m.group(2) else [r]
    return out


def load_waits(ins):
    """(global loads, waits): walking the code in address order, a wait is an instruction that
    reads a register some global load since the last wait writes.  A batch of loads issued
    before the first use of any counts one wait; loads each used before the next is issued
    count one wait each, and their warp waits for memory that many times.  Static: every path
    of a branch is walked, once."""
    pending, loads, waits = set(), 0, 0
    for _, t in ins:
        tok = t.split(None, 1)
        if tok[0].startswith("@"):
            tok = tok[1].split(None, 1)
        op, ops = tok[0], (tok[1] if len(tok) > 1 else "")
        operands = [o.strip() for o in ops.split(",")] if ops else []
        base = op.split(".")[0]
        srcs = operands if base in NO_DEST else operands[1:]
        if pending and any(r in pending for o in srcs for r in regs_of(o)):
            waits += 1
            pending.clear()
        if base == "LDG" and operands:
            loads += 1
            width = 4 if ".128" in op else 2 if ".64" in op else 1
            r0 = regs_of(operands[0])
            if r0:
                pending.update(range(r0[0], r0[0] + width))
    return loads, waits


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


def self_test():
    """load_waits and hot_loop on made-up SASS: a batch read ahead, rows used one at a time"""
    def sass(lines):
        return parse("\tFunction : k\n" + "".join(
            "        /*%04x*/                   %s ;\n" % (16 * i, t) for i, t in enumerate(lines)))["k"]
    batched = sass(["LDG.E.U16.CONSTANT R4, desc[UR4][R2.64]",
                    "@!P0 LDG.E.U16.CONSTANT R5, desc[UR4][R2.64+0x180]",
                    "LDG.E.128 R8, desc[UR4][R6.64]",
                    "IMAD.U32 R4, R4, 0x10000, RZ",  # the first use: one wait for all three
                    "FADD R20, R5, R11",
                    "STG.E desc[UR4][R2.64], R20",
                    "BRA 0x0"])
    serial = sass(["LDG.E.U16.CONSTANT R4, desc[UR4][R2.64]",
                   "@!P1 IMAD.U32 R12, R4, 0x10000, RZ",  # used at once
                   "LDG.E.U16.CONSTANT R5, desc[UR4][R2.64+0x180]",
                   "IMAD.U32 R13, R5, 0x10000, RZ",
                   "LDG.E.64 R14, desc[UR4][R6.64]",  # a pointer
                   "STG.E desc[UR4][R14.64], R2",  # a store reads its address and value
                   "PRMT R4, RZ, 0x7610, R4",  # no load pending: not a wait
                   "BRA 0x0"])
    checks = [(load_waits(batched), (3, 1)), (load_waits(serial), (3, 3)),
              (hot_loop(batched), (0, 0x60)), (regs_of("desc[UR4][R2.64+0x10]"), [2, 3]),
              (regs_of("RZ"), [])]
    for got, want in checks:
        if got != want:
            sys.exit("sass_stats.py: self-test failed: %r, expected %r" % (got, want))
    print("sass_stats.py: self-test passed")


def main(argv):
    if argv[1:] == ["--self-test"]:
        self_test()
        return 0
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) >= 2 else 2
    tool = find_cuobjdump()
    if not tool:
        print("sass_stats: no cuobjdump (CUDA toolkit, or the triton wheel of bench/bench_gpu.sh's "
              "environment; MGC_CUOBJDUMP names one)", file=sys.stderr)
        return 2
    cols = ["all", "HMMA", "LDSM", "MUFU.EX2", "MUFU.RCP", "SHFL", "BAR", "BRA"]
    print("| kernel | regs | where | " + " | ".join(cols) + " | LDG | LDG waits |")
    print("|---|---:|---|" + "---:|" * (len(cols) + 2))
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
                ld, wt = load_waits(part)
                print("| %s | %s | %s | %s | %d | %d |" % (
                    name, regs if regs is not None else "", where,
                    " | ".join(str(c[k]) for k in cols), ld, wt))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
