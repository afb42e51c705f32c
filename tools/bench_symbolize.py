#!/usr/bin/env python3
"""Benchmark cudatrace.symbols.Symbolizer against binutils addr2line (not a test).

Builds (once, cached under /tmp/cudatrace-bench) a C++ binary with over 100 MB of DWARF from
generated sources full of STL template instantiations (about 3 minutes on 2 cores the first
time), or takes --binary. Picks --count distinct addresses inside functions (random offsets in
sized STT_FUNC symbols of executable sections) and symbolizes them

  * with Symbolizer, cold (fresh process, no cache), cold writing a disk cache, and warm
    (fresh process, reading that cache);
  * with `addr2line -a -f -i -C -e BIN`, all addresses on stdin of one process;

each in a fresh process, --repeat times, interleaved, and prints the best and median wall times
(whole process: interpreter start-up and imports included) and the ratio, then compares every
result (function, file, line of each frame, inlined frames included) with addr2line's.

    python3 tools/bench_symbolize.py                 # build if needed, run
    python3 tools/bench_symbolize.py --binary /path/to/libbig.so --count 10000
    python3 tools/bench_symbolize.py --pyelftools-baseline --count 1000   # vs pyelftools
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_WORKDIR = Path("/tmp/cudatrace-bench")

HEADER = r"""
#include <map>
#include <vector>
#include <string>
#include <unordered_map>
#include <memory>
#include <algorithm>
#include <functional>
#include <sstream>
namespace bench%(t)d {
template <int N, typename T>
struct Widget {
    std::map<std::string, std::vector<T>> table;
    std::unordered_map<int, std::shared_ptr<std::string>> cache;
    std::function<T(T)> fn = [](T x) { return x + T(N); };
    __attribute__((noinline)) void add(const std::string &k, T v) {
        table[k].push_back(fn(v));
        cache.emplace(int(v) + N, std::make_shared<std::string>(k));
    }
    __attribute__((noinline)) T sum() const {
        T s = T();
        for (auto &kv : table)
            for (auto &x : kv.second)
                s += x;
        return s;
    }
    __attribute__((noinline)) std::string describe() const {
        std::ostringstream os;
        os << "widget" << N << ":" << table.size() << ":" << cache.size();
        return os.str();
    }
    __attribute__((noinline)) void sort_all() {
        for (auto &kv : table)
            std::sort(kv.second.begin(), kv.second.end());
    }
};
"""
TYPES = ("int", "long", "double", "float", "short", "unsigned")


def generate_unit(t, per_unit):
    lines = [HEADER % {"t": t}]
    for i in range(per_unit):
        lines.append(f"template struct Widget<{i}, {TYPES[(i + t) % len(TYPES)]}>;")
    lines.append('int touch() { Widget<0, int> w; w.add("x", 1); return w.sum(); }')
    lines.append(f"}}  // namespace bench{t}")
    return "\n".join(lines) + "\n"


def debug_size(path):
    out = subprocess.run(
        ["size", "-A", str(path)], capture_output=True, text=True, check=True
    ).stdout
    total = 0
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith(".debug_"):
            total += int(parts[1])
    return total


def build_binary(workdir, units, per_unit, jobs):
    workdir.mkdir(parents=True, exist_ok=True)
    tag = f"u{units}_p{per_unit}"
    binary = workdir / ("bigdwarf_" + tag)
    if binary.exists():
        return binary
    srcdir = workdir / f"src_p{per_unit}"
    srcdir.mkdir(exist_ok=True)
    objs = []
    cmds = []
    for t in range(units):
        src = srcdir / f"unit{t:03d}.cpp"
        if not src.exists():
            src.write_text(generate_unit(t, per_unit))
        obj = srcdir / f"unit{t:03d}.o"
        objs.append(obj)
        if not obj.exists():
            cmds.append(["g++", "-std=c++17", "-O1", "-g", "-c", str(src), "-o", str(obj) + ".tmp"])
    main_src = srcdir / "main.cpp"
    decls = "".join(f"namespace bench{t} {{ int touch(); }}\n" for t in range(units))
    calls = "".join(f"  s += bench{t}::touch();\n" for t in range(units))
    main_src.write_text(
        decls + "int main() {\n  int s = 0;\n" + calls + "  return s == 12345;\n}\n"
    )
    t0 = time.time()

    def run(cmd):
        subprocess.run(cmd, check=True)
        os.replace(cmd[-1], cmd[-1][:-4])
        print(
            f"  built {Path(cmd[-1][:-4]).name} ({time.time() - t0:.0f} s)",
            file=sys.stderr,
            flush=True,
        )

    print(f"building {len(cmds)} units with {jobs} jobs in {srcdir} ...", file=sys.stderr)
    with ThreadPoolExecutor(max_workers=jobs) as ex:
        list(ex.map(run, cmds))
    tmp = str(binary) + ".tmp"
    subprocess.run(
        ["g++", "-g", "-O1", "-Wl,--build-id", str(main_src)]
        + [str(o) for o in objs]
        + ["-o", tmp],
        check=True,
    )
    os.replace(tmp, binary)
    print(
        f"linked {binary} in {time.time() - t0:.0f} s, {debug_size(binary) / 1e6:.1f} MB of DWARF",
        file=sys.stderr,
    )
    return binary


def pick_addresses(binary, count, seed):
    from elftools.elf.elffile import ELFFile

    with open(binary, "rb") as f:
        elf = ELFFile(f)
        execs = set()
        for i, sec in enumerate(elf.iter_sections()):
            if sec["sh_flags"] & 0x4:
                execs.add(i)
        symtab = elf.get_section_by_name(".symtab") or elf.get_section_by_name(".dynsym")
        funcs = sorted(
            {
                (s["st_value"], s["st_size"])
                for s in symtab.iter_symbols()
                if s["st_info"]["type"] == "STT_FUNC"
                and s["st_size"] > 0
                and isinstance(s["st_shndx"], int)
                and s["st_shndx"] in execs
            }
        )
    total = sum(sz for _, sz in funcs)
    if total < count:
        raise SystemExit(f"binary has only {total} bytes of sized functions")
    rnd = random.Random(seed)
    picked = set()
    while len(picked) < count:
        v, sz = funcs[rnd.randrange(len(funcs))]
        picked.add(v + rnd.randrange(sz))
    return sorted(picked), len(funcs)


def worker(args):
    """Runs in a fresh process: symbolize, dump frames as JSON."""
    sys.path.insert(0, str(REPO))
    t0 = time.perf_counter()
    from cudatrace.symbols import ModuleRef, Symbolizer

    addrs = [int(x, 16) for x in Path(args.addrs).read_text().split()]
    t1 = time.perf_counter()
    sym = Symbolizer(cache_dir=args.cache or None, debug_dirs=(), progress=False)
    res = sym.symbolize(ModuleRef(args.binary, None, 0), addrs)
    t2 = time.perf_counter()
    out = {
        "import_s": t1 - t0,
        "symbolize_s": t2 - t1,
        "warnings": sym.warnings(),
        "frames": {
            hex(a): [[f.function, f.file, f.line, f.inlined] for f in fr] for a, fr in res.items()
        },
    }
    Path(args.out).write_text(json.dumps(out))


def pyelftools_worker(args):
    """Runs in a fresh process: the same addresses through pyelftools' DWARF API (aranges, CUs,
    line programs, DIE trees, references), with the same strategy as Symbolizer: group by CU,
    index the CU's concrete subprograms (namespaces entered), walk only the scopes holding an
    address. Names from DWARF (linkage name through abstract_origin/specification, demangled
    with the same demangler). Dumps frames as JSON."""
    sys.path.insert(0, str(REPO))
    t0 = time.perf_counter()
    import bisect

    from elftools.dwarf.ranges import BaseAddressEntry, RangeEntry
    from elftools.elf.elffile import ELFFile

    from cudatrace.symbols import demangle

    addrs = [int(x, 16) for x in Path(args.addrs).read_text().split()]
    t1 = time.perf_counter()
    frames = {}
    with open(args.binary, "rb") as f:
        dwi = ELFFile(f).get_dwarf_info()
        aranges = dwi.get_aranges()
        rlists = dwi.range_lists()
        groups = {}
        for a in addrs:
            groups.setdefault(aranges.cu_offset_at_addr(a) if aranges else None, []).append(a)
        names = {}
        scope_tags = (
            "DW_TAG_inlined_subroutine",
            "DW_TAG_lexical_block",
            "DW_TAG_try_block",
            "DW_TAG_catch_block",
        )

        def die_name(die, depth=0):
            key = die.offset
            if key not in names:
                at = die.attributes
                name = None
                link = at.get("DW_AT_linkage_name") or at.get("DW_AT_MIPS_linkage_name")
                if link is not None:
                    name = demangle(link.value.decode("utf-8", "replace"))
                for ref in ("DW_AT_specification", "DW_AT_abstract_origin"):
                    if name is None and depth < 8 and ref in at:
                        name = die_name(die.get_DIE_from_attribute(ref), depth + 1)
                if name is None and "DW_AT_name" in at:
                    name = at["DW_AT_name"].value.decode("utf-8", "replace")
                names[key] = name
            return names[key]

        for cu_off, ts in groups.items():
            if cu_off is None:
                for t in ts:
                    frames[t] = [(None, None, None, False)]
                continue
            cu = dwi.get_CU_at(cu_off)
            top = cu.get_top_DIE()
            cu_low = top.attributes["DW_AT_low_pc"].value if "DW_AT_low_pc" in top.attributes else 0
            comp_dir = (
                top.attributes["DW_AT_comp_dir"].value.decode()
                if ("DW_AT_comp_dir" in top.attributes)
                else ""
            )
            lp = dwi.line_program_for_CU(cu)
            v5 = lp["version"] >= 5
            dirs = [d.decode() for d in lp["include_directory"]]

            def path(index, lp=lp, v5=v5, dirs=dirs, comp_dir=comp_dir):
                i = index if v5 else index - 1
                if index is None or not 0 <= i < len(lp["file_entry"]):
                    return None
                e = lp["file_entry"][i]
                if v5:
                    d = dirs[e.dir_index] if e.dir_index < len(dirs) else ""
                else:
                    d = comp_dir if e.dir_index == 0 else dirs[e.dir_index - 1]
                p = os.path.join(d, e.name.decode())
                return p if os.path.isabs(p) else os.path.join(comp_dir, p)

            # Line table: every row of every sequence (pyelftools decodes the whole program).
            seqs, cur = [], []
            for entry in lp.get_entries():
                st = entry.state
                if st is None:
                    continue
                cur.append((st.address, st.file, st.line))
                if st.end_sequence:
                    if cur[0][0] != 0:
                        seqs.append(cur)
                    cur = []
            seqs.sort()
            seq_starts = [s[0][0] for s in seqs]
            loc = {}
            for t in ts:
                i = bisect.bisect_right(seq_starts, t) - 1
                if i >= 0 and t < seqs[i][-1][0]:
                    rows = seqs[i]
                    j = bisect.bisect_right(rows, (t, float("inf"))) - 1
                    loc[t] = (path(rows[j][1]), rows[j][2] or None)

            def ranges(die, cu=cu, cu_low=cu_low):
                at = die.attributes
                if "DW_AT_ranges" in at:
                    out, base = [], cu_low
                    for e in rlists.get_range_list_at_offset(at["DW_AT_ranges"].value, cu=cu):
                        if isinstance(e, BaseAddressEntry):
                            base = e.base_address
                        elif isinstance(e, RangeEntry):
                            b = 0 if e.is_absolute else base
                            out.append((b + e.begin_offset, b + e.end_offset))
                    return out
                if "DW_AT_low_pc" not in at:
                    return None
                lo = at["DW_AT_low_pc"].value
                hi = at.get("DW_AT_high_pc")
                if hi is None:
                    return [(lo, lo + 1)]
                return [(lo, hi.value if hi.form == "DW_FORM_addr" else lo + hi.value)]

            subs = []
            stack = [top]
            while stack:
                for die in stack.pop().iter_children():
                    if die.tag == "DW_TAG_subprogram":
                        for lo, hi in ranges(die) or ():
                            if lo < hi and lo != 0:
                                subs.append((lo, hi, die))
                    elif die.tag in ("DW_TAG_namespace", "DW_TAG_module"):
                        stack.append(die)
            subs.sort(key=lambda s: s[0])
            sub_starts = [s[0] for s in subs]

            def walk(die, inner, chains):
                for child in die.iter_children():
                    if child.tag not in scope_tags:
                        continue
                    rngs = ranges(child)
                    inlined = child.tag == "DW_TAG_inlined_subroutine"
                    if rngs is None:
                        inside = None if inlined else inner
                    else:
                        inside = [t for t in inner if any(lo <= t < hi for lo, hi in rngs)]
                    if not inside:
                        continue
                    if inlined:
                        at = child.attributes
                        rec = (
                            die_name(child),
                            at["DW_AT_call_file"].value if "DW_AT_call_file" in at else None,
                            at["DW_AT_call_line"].value if "DW_AT_call_line" in at else None,
                        )
                        for t in inside:
                            chains[t].append(rec)
                    if child.has_children:
                        walk(child, inside, chains)

            by_sub = {}
            for t in ts:
                i = bisect.bisect_right(sub_starts, t) - 1
                k = 0
                while i >= 0 and k < 8 and not subs[i][0] <= t < subs[i][1]:
                    i -= 1
                    k += 1
                by_sub.setdefault(subs[i][2].offset if i >= 0 and k < 8 else None, []).append(t)
            sub_die = {s[2].offset: s[2] for s in subs}
            for off, group in by_sub.items():
                chains = {t: [] for t in group}
                if off is not None and sub_die[off].has_children:
                    walk(sub_die[off], group, chains)
                func = die_name(sub_die[off]) if off is not None else None
                for t in group:
                    fl, ln = loc.get(t, (None, None))
                    out = []
                    for name, cfile, cline in reversed(chains[t]):
                        out.append((name, fl, ln, True))
                        fl, ln = path(cfile), cline or None
                    out.append((func, fl, ln, False))
                    frames[t] = out
    t2 = time.perf_counter()
    out = {
        "import_s": t1 - t0,
        "symbolize_s": t2 - t1,
        "warnings": [],
        "frames": {hex(a): [list(f) for f in fr] for a, fr in frames.items()},
    }
    Path(args.out).write_text(json.dumps(out))


def run_ours(binary, addr_file, cache, out, kind="--worker"):
    cmd = [
        sys.executable,
        __file__,
        kind,
        "--binary",
        str(binary),
        "--addrs",
        str(addr_file),
        "--out",
        str(out),
    ]
    if cache:
        cmd += ["--cache", str(cache)]
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t
    return wall, json.loads(Path(out).read_text())


def run_addr2line(binary, addrs):
    inp = "\n".join(hex(a) for a in addrs) + "\n"
    t = time.perf_counter()
    p = subprocess.run(
        ["addr2line", "-a", "-f", "-i", "-C", "-e", str(binary)],
        input=inp,
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - t, p.stdout


def parse_addr2line(text, addrs):
    wanted = set(addrs)
    res = {}
    cur = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("0x") and int(line, 16) in wanted and (cur is None or res[cur]):
            cur = int(line, 16)
            res[cur] = []
            i += 1
            continue
        fn, loc = line, lines[i + 1] if i + 1 < len(lines) else "??:0"
        i += 2
        f, _, ln = loc.rpartition(":")
        ln = ln.split()[0] if ln.split() else ""
        res[cur].append(
            (
                None if fn == "??" else fn,
                None if f in ("??", "") else f,
                int(ln) if ln.isdigit() and int(ln) else None,
            )
        )
    return res


def compare(ours, theirs, addrs, show):
    kinds = {"agree": 0, "depth": 0, "function": 0, "file": 0, "line": 0}
    examples = []
    for a in addrs:
        o = [(f[0], f[1], f[2]) for f in ours[hex(a)]]
        t = theirs.get(a, [])
        kind = "agree"
        if len(o) != len(t):
            kind = "depth"
        else:
            for x, y in zip(o, t):
                if x[2] != y[2]:
                    kind = "line"
                elif x[1] != y[1]:
                    kind = "file"
                elif x[0] != y[0]:
                    kind = "function"
                else:
                    continue
                break
        kinds[kind] += 1
        if kind != "agree" and len(examples) < show:
            examples.append((a, kind, o, t))
    return kinds, examples


def pyelftools_baseline(binary, addrs, tmp, repeat, show):
    """Symbolizer cold against pyelftools' DWARF API, same addresses, fresh processes."""
    addr_file = tmp / "addrs.txt"
    addr_file.write_text("\n".join(hex(x) for x in addrs))
    t_ours, t_pyelf, in_ours, in_pyelf = [], [], [], []
    ours = theirs = None
    for r in range(repeat):
        w, ours = run_ours(binary, addr_file, None, tmp / "ours.json")
        t_ours.append(w)
        in_ours.append(ours["symbolize_s"])
        w, theirs = run_ours(binary, addr_file, None, tmp / "pyelf.json", "--pyelftools-worker")
        t_pyelf.append(w)
        in_pyelf.append(theirs["symbolize_s"])
        print(
            f"  run {r + 1}: Symbolizer cold {t_ours[-1]:.2f} s | pyelftools {t_pyelf[-1]:.2f} s",
            flush=True,
        )
    print()
    print(
        f"Symbolizer cold (no cache): {fmt_times(t_ours)}  "
        f"(symbolize() alone: best {min(in_ours):.2f} s)"
    )
    print(
        f"pyelftools DWARF API:       {fmt_times(t_pyelf)}  "
        f"(resolution alone: best {min(in_pyelf):.2f} s)"
    )
    ratio = statistics.median(t_pyelf) / statistics.median(t_ours)
    print(
        f"ratio pyelftools / Symbolizer: {ratio:.1f}x (median, whole processes), "
        f"{min(in_pyelf) / min(in_ours):.1f}x (best, resolution alone)"
    )

    # The outermost function's name may differ by design: ours comes from the symbol table
    # (global alias, "foo.cold" clones), pyelftools' from DWARF. Compared apart.
    def outer_unnamed(frames):
        return {k: v[:-1] + [[None] + list(v[-1][1:])] for k, v in frames.items()}

    outer_names = sum(
        1 for a in addrs if ours["frames"][hex(a)][-1][0] != theirs["frames"][hex(a)][-1][0]
    )
    as_tuples = {
        int(k, 16): [tuple(f[:3]) for f in v] for k, v in outer_unnamed(theirs["frames"]).items()
    }
    kinds, examples = compare(outer_unnamed(ours["frames"]), as_tuples, addrs, show)
    diffs = ", ".join(f"{k} {v}" for k, v in kinds.items() if k != "agree" and v) or "none"
    print(
        "agreement (file and line of every frame, names of inlined frames): "
        f"{kinds['agree']}/{len(addrs)}; differences: {diffs}; "
        f"outermost function named differently: {outer_names}"
    )
    for addr, kind, o, t in examples:
        print(f"  0x{addr:x} ({kind})\n    ours:       {o}\n    pyelftools: {t}")


def fmt_times(ts):
    return f"best {min(ts):.2f} s, median {statistics.median(ts):.2f} s"


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--binary", help="use this ELF file instead of the generated one")
    ap.add_argument("--units", type=int, default=26, help="generated translation units")
    ap.add_argument("--per-unit", type=int, default=400, help="template instantiations per unit")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--show", type=int, default=5, help="disagreements to print")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument(
        "--pyelftools-baseline",
        action="store_true",
        help="compare with the same addresses resolved through pyelftools' DWARF API "
        "instead of addr2line",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pyelftools-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--addrs", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    if a.pyelftools_worker:
        return pyelftools_worker(a)
    if shutil.which("addr2line") is None and not a.pyelftools_baseline:
        raise SystemExit("addr2line (binutils) not found")
    binary = Path(a.binary) if a.binary else build_binary(a.workdir, a.units, a.per_unit, a.jobs)
    dsize = debug_size(binary)
    print(f"binary: {binary} ({binary.stat().st_size / 1e6:.1f} MB, {dsize / 1e6:.1f} MB of DWARF)")
    if a.build_only:
        return
    addrs, nfuncs = pick_addresses(binary, a.count, a.seed)
    print(f"addresses: {len(addrs)} distinct, inside {nfuncs} sized functions (seed {a.seed})")
    tmp = Path(tempfile.mkdtemp(prefix="cudatrace-bench-"))
    if a.pyelftools_baseline:
        try:
            return pyelftools_baseline(binary, addrs, tmp, a.repeat, a.show)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    try:
        addr_file = tmp / "addrs.txt"
        addr_file.write_text("\n".join(hex(x) for x in addrs))
        t_a2l, t_cold, t_coldw, t_warm, in_cold, in_warm = [], [], [], [], [], []
        a2l_out = cold = warm = None
        for r in range(a.repeat):
            w, a2l_out = run_addr2line(binary, addrs)
            t_a2l.append(w)
            w, cold = run_ours(binary, addr_file, None, tmp / "cold.json")
            t_cold.append(w)
            in_cold.append(cold["symbolize_s"])
            cache = tmp / f"cache{r}"
            w, _ = run_ours(binary, addr_file, cache, tmp / "coldw.json")
            t_coldw.append(w)
            w, warm = run_ours(binary, addr_file, cache, tmp / "warm.json")
            t_warm.append(w)
            in_warm.append(warm["symbolize_s"])
            print(
                f"  run {r + 1}: addr2line {t_a2l[-1]:.2f} s | Symbolizer cold {t_cold[-1]:.2f} s, "
                f"cold+cache write {t_coldw[-1]:.2f} s, warm {t_warm[-1]:.2f} s",
                flush=True,
            )
        print()
        print(f"addr2line -f -i -C (cold):      {fmt_times(t_a2l)}")
        print(
            f"Symbolizer cold (no cache):     {fmt_times(t_cold)}  "
            f"(symbolize() alone: best {min(in_cold):.2f} s)"
        )
        print(f"Symbolizer cold, writing cache: {fmt_times(t_coldw)}")
        print(
            f"Symbolizer warm (disk cache):   {fmt_times(t_warm)}  "
            f"(symbolize() alone: best {min(in_warm):.2f} s)"
        )
        print(
            "ratio addr2line / Symbolizer cold: "
            f"{statistics.median(t_a2l) / statistics.median(t_cold):.2f}x (median), "
            f"{min(t_a2l) / min(t_cold):.2f}x (best)"
        )
        print(
            "ratio addr2line / Symbolizer warm: "
            f"{statistics.median(t_a2l) / statistics.median(t_warm):.2f}x (median)"
        )
        if cold["warnings"]:
            print("warnings:", cold["warnings"])
        assert cold["frames"] == warm["frames"], "warm (cached) results differ from cold ones"
        theirs = parse_addr2line(a2l_out, addrs)
        kinds, examples = compare(cold["frames"], theirs, addrs, a.show)
        nframes = sum(len(v) for v in cold["frames"].values())
        print(
            f"frames: {nframes} for {len(addrs)} addresses "
            f"({sum(1 for v in cold['frames'].values() if len(v) > 1)} with inlined frames)"
        )
        diffs = ", ".join(f"{k} {v}" for k, v in kinds.items() if k != "agree" and v) or "none"
        print(
            "agreement with addr2line (function, file, line of every frame): "
            f"{kinds['agree']}/{len(addrs)} ({100.0 * kinds['agree'] / len(addrs):.2f}%); "
            f"differences: {diffs}"
        )
        for addr, kind, o, t in examples:
            print(f"  0x{addr:x} ({kind})\n    ours:      {o}\n    addr2line: {t}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
