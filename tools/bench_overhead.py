#!/usr/bin/env python3
"""What cudatrace costs the program it traces: uninstrumented and instrumented runs, alternated,
compared within one invocation (docs/gpu-suite.md; figures for docs/performance.md).

    python3 tools/bench_overhead.py --out DIR [--rounds 5] [--cases a,b,...] [--configs ...]

Cases (tools/gpu/bench_alloc.cu measures its own loop with clock_gettime, after a warm-up):
  alloc_1MiB    cudaMalloc/cudaFree pairs of 1 MiB   (cuMemAlloc_v2/cuMemFree_v2)  ns per pair
  alloc_64MiB   the same, 64 MiB                                                   ns per pair
  async_1MiB    cudaMallocAsync/cudaFreeAsync pairs from a pool that keeps its memory  ns per pair
  async_1MiB_4t, async_1MiB_16t   the same on 4 and 16 threads at once, each on its own stream
                (the pool and the shim's shared counters under contention)   ns of one thread's pair
  meminfo       cudaMemGetInfo                                                     ns per call
  train         tools/gpu/workloads/torch_train.py: process wall time (and steps/s)
  startup       `bench_alloc startup` (cudaFree(0)): process wall time; with the shim preloaded
                directly (the process's own start-up) and through `cudatrace run` (the Python
                launcher included)
Configs: bare (uninstrumented), stacks (`cudatrace run`, default stacks), nostack
(`--stack-depth 0`), budget (`--budget 100GiB`, default stacks), shim (the shim preloaded
directly with CUDATRACE_DIR, no Python launcher: what the traced process itself pays; used for
startup and train, where the launcher's own start, a few hundred ms of Python, would otherwise
be counted).

Each round runs every config once, the order alternating from round to round; the table gives
medians, the spread (min-max) and the difference to the bare median of the same invocation.
Writes DIR/results.json and DIR/results.md (and prints the table). Exit status 0 when every
run worked, whatever the targets say; 1 if a run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPU_DIR = REPO / "tools" / "gpu"
TRAIN = GPU_DIR / "workloads" / "torch_train.py"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # cudatrace from this checkout

MICRO = {
    # case: (bench_alloc arguments without the count, default count, unit)
    "alloc_1MiB": (["alloc", "1M"], 3000, "pair"),
    "alloc_64MiB": (["alloc", "64M"], 2000, "pair"),
    "async_1MiB": (["async", "1M"], 200000, "pair"),
    # the same on 4 and 16 threads at once, each its own stream: ns of one thread's pair
    "async_1MiB_4t": (["async_threads", "1M", "4"], 50000, "pair"),
    "async_1MiB_16t": (["async_threads", "1M", "16"], 20000, "pair"),
    "meminfo": (["meminfo"], 50000, "call"),
}
ALL_CASES = list(MICRO) + ["train", "startup"]
CONFIG_ARGS = {
    "bare": None,
    "shim": None,  # LD_PRELOAD of the shim alone (what the traced process pays)
    "stacks": [],
    "nostack": ["--stack-depth", "0"],
    "budget": ["--budget", "100GiB"],
}


# targets: (kind, limit) with kind "added_ns" (per op), "pct" (of the bare median), "added_ms"
def target_for(case: str, config: str):
    if config == "bare":
        return None
    if case == "startup":  # the process's own start-up: the launcher's is shown apart
        return ("added_ms", 20.0) if config == "shim" else None
    if case.startswith("alloc_"):
        return ("pct", 3.0)
    if case == "async_1MiB":
        return ("added_ns", 500.0) if config == "nostack" else ("added_ns", 2000.0)
    if case == "train":
        return ("pct", 1.0)
    return None


def describe_target(t) -> str:
    if t is None:
        return "-"
    kind, lim = t
    if kind == "pct":
        return f"<= {lim:g}%"
    if kind == "added_ns":
        return "<= %g us added" % (lim / 1000.0)
    if kind == "added_ms":
        return f"<= {lim:g} ms added"
    return str(t)


# ---- running --------------------------------------------------------------------------------
def env_with_repo() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (
        (os.pathsep + env["PYTHONPATH"]) if env.get("PYTHONPATH") else ""
    )
    return env


class Runner:
    def __init__(self, args):
        self.args = args
        self.env = env_with_repo()
        self.failures = []
        self.tmp = Path(tempfile.mkdtemp(prefix="ct-bench-", dir=args.tmp))
        self.t_start = time.monotonic()

    def over_deadline(self) -> bool:
        return self.args.deadline > 0 and time.monotonic() - self.t_start > self.args.deadline

    def prepare(self, config: str, cmd: list, trace_dir: Path) -> tuple[list, dict]:
        """argv and environment of one run of cmd under config."""
        if config == "bare":
            return cmd, self.env
        if config == "shim":  # the shim preloaded directly: no Python launcher
            trace_dir.mkdir(parents=True, exist_ok=True)
            pre = self.env.get("LD_PRELOAD")
            env = dict(
                self.env,
                LD_PRELOAD=self.shim() + ((" " + pre) if pre else ""),
                CUDATRACE_DIR=str(trace_dir),
                CUDATRACE_STACK_DEPTH="64",
            )
            return cmd, env
        return (
            [
                sys.executable,
                "-m",
                "cudatrace",
                "run",
                "-o",
                str(trace_dir),
                "-q",
                "--force",
                *CONFIG_ARGS[config],
                "--",
                *cmd,
            ],
            self.env,
        )

    def shim(self) -> str:
        from cudatrace import native

        return str(native.shim_path())

    def run(self, label: str, argv_env: tuple, timeout: int = 300):
        """(wall seconds, stdout) or (None, None) on failure."""
        argv, env = argv_env
        t0 = time.perf_counter()
        try:
            r = subprocess.run(
                argv, capture_output=True, text=True, env=env, cwd=str(REPO), timeout=timeout
            )
        except subprocess.TimeoutExpired:
            self.failures.append("%s: timed out after %ds" % (label, timeout))
            print(f"  FAILED {label}: timeout", file=sys.stderr)
            return None, None
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            self.failures.append(
                "%s: status %d: %s" % (label, r.returncode, r.stderr.strip()[-600:])
            )
            print(
                "  FAILED %s (status %d):\n%s" % (label, r.returncode, r.stderr[-1500:]),
                file=sys.stderr,
            )
            return None, None
        return wall, r.stdout

    def count_events(self, trace_dir: Path) -> int | None:
        try:
            from cudatrace.analyze.read.trace import read_dir

            return sum(len(t.events) for t in read_dir(trace_dir).traces)
        except Exception as e:  # the count is a sanity check only
            print(f"  (could not read {trace_dir}: {e})", file=sys.stderr)
            return None


def parse_kv(text: str) -> dict:
    out = {}
    for line in (text or "").splitlines():
        f = line.split(None, 1)
        if len(f) == 2:
            out[f[0]] = f[1].strip()
    return out


def stats(values: list) -> dict:
    v = [x for x in values if x is not None]
    if not v:
        return {"n": 0}
    return {"n": len(v), "median": statistics.median(v), "min": min(v), "max": max(v), "values": v}


def order(configs: list, r: int) -> list:
    return configs if r % 2 == 0 else list(reversed(configs))


def bench_micro(R: Runner, case: str, bench: str, configs: list, rounds: int) -> dict:
    argv0, default_n, unit = MICRO[case]
    n = max(1, int(default_n * R.args.scale))
    cmd = [bench, *argv0, str(n)]
    vals = {c: [] for c in configs}
    walls = {c: [] for c in configs}
    events = {}
    for r in range(rounds):
        if R.over_deadline():
            print("  deadline reached: %s stops after %d round(s)" % (case, r), file=sys.stderr)
            break
        for c in order(configs, r):
            td = R.tmp / (f"{case}-{c}")
            wall, out = R.run("%s/%s round %d" % (case, c, r), R.prepare(c, cmd, td))
            if out is not None:
                kv = parse_kv(out)
                try:
                    vals[c].append(float(kv["ns_per_op"]))
                except (KeyError, ValueError):
                    R.failures.append(f"{case}/{c}: no ns_per_op in output")
                walls[c].append(wall)
                if c != "bare" and r == 0:
                    events[c] = R.count_events(td)
            if td.exists():
                shutil.rmtree(td, ignore_errors=True)
    expected = 2 * n if case != "meminfo" else n
    return {
        "case": case,
        "metric": "ns_per_" + unit,
        "unit": unit,
        "ops": n,
        "cmd": cmd,
        "configs": {
            c: dict(
                stats(vals[c]),
                wall_s=stats(walls[c]).get("median"),
                trace_events=events.get(c),
                expected_events=expected if c != "bare" else None,
            )
            for c in configs
        },
    }


def bench_train(R: Runner, configs: list, rounds: int) -> dict:
    cmd = [sys.executable, str(TRAIN), "--steps", str(R.args.train_steps)]
    walls = {c: [] for c in configs}
    sps = {c: [] for c in configs}
    for r in range(rounds):
        if R.over_deadline():
            print("  deadline reached: train stops after %d round(s)" % r, file=sys.stderr)
            break
        for c in order(configs, r):
            td = R.tmp / (f"train-{c}")
            wall, out = R.run("train/%s round %d" % (c, r), R.prepare(c, cmd, td), timeout=400)
            if out is not None:
                walls[c].append(wall)
                for line in out.splitlines():
                    if line.startswith("{"):
                        try:
                            d = json.loads(line)
                        except ValueError:
                            continue
                        if d.get("event") == "train":
                            sps[c].append(d["steps_per_s"])
            if td.exists():
                shutil.rmtree(td, ignore_errors=True)
    return {
        "case": "train",
        "metric": "wall_s",
        "unit": "run",
        "cmd": cmd,
        "configs": {c: dict(stats(walls[c]), steps_per_s=stats(sps[c])) for c in configs},
    }


def bench_startup(R: Runner, bench: str, rounds: int) -> dict:
    cmd = [bench, "startup"]
    kinds = ["bare", "shim", "stacks"]
    walls = {k: [] for k in kinds}
    for r in range(rounds):
        if R.over_deadline():
            print("  deadline reached: startup stops after %d round(s)" % r, file=sys.stderr)
            break
        for k in order(kinds, r):
            td = R.tmp / (f"startup-{k}")
            wall, _ = R.run("startup/%s round %d" % (k, r), R.prepare(k, cmd, td))
            if wall is not None:
                walls[k].append(wall * 1000.0)
            if td.exists():
                shutil.rmtree(td, ignore_errors=True)
    return {
        "case": "startup",
        "metric": "wall_ms",
        "unit": "process",
        "cmd": cmd,
        "configs": {k: stats(walls[k]) for k in kinds},
    }


# ---- the table --------------------------------------------------------------------------------
def rows_for(res: dict) -> list:
    case = res["case"]
    cfgs = res["configs"]
    base = cfgs.get("bare", {}).get("median")
    out = []
    for c, s in cfgs.items():
        if not s.get("n"):
            out.append({"case": case, "config": c, "missing": True})
            continue
        med = s["median"]
        row = {
            "case": case,
            "config": c,
            "metric": res["metric"],
            "median": med,
            "min": s["min"],
            "max": s["max"],
            "n": s["n"],
        }
        t = target_for(case, c)
        if base is not None and c != "bare":
            row["added"] = med - base
            row["ratio"] = med / base if base else None
            row["pct"] = 100.0 * (med - base) / base if base else None
            bs = cfgs["bare"]
            # the difference is within noise when the two spreads overlap
            row["within_noise"] = not (s["min"] > bs["max"] or s["max"] < bs["min"])
        row["target"] = describe_target(t)
        if t is not None and "added" in row:
            kind, lim = t
            val = row["pct"] if kind == "pct" else row["added"]
            row["meets_target"] = val <= lim
        if case == "train" and s.get("steps_per_s", {}).get("median"):
            row["steps_per_s"] = s["steps_per_s"]["median"]
            bsps = cfgs.get("bare", {}).get("steps_per_s", {}).get("median")
            if bsps and c != "bare":
                row["steps_per_s_pct"] = 100.0 * (bsps - row["steps_per_s"]) / bsps
        if s.get("trace_events") is not None:
            row["trace_events"] = s["trace_events"]
            row["expected_events"] = s.get("expected_events")
        out.append(row)
    return out


def fmt_val(metric: str, v) -> str:
    if v is None:
        return "-"
    if metric.startswith("ns_per"):
        return "%.2f us" % (v / 1000.0) if abs(v) >= 1000 else f"{v:.0f} ns"
    if metric == "wall_s":
        return f"{v:.3f} s"
    if metric == "wall_ms":
        return f"{v:.1f} ms"
    return f"{v:g}"


CONFIG_LABEL = {
    "bare": "uninstrumented",
    "stacks": "cudatrace run (stacks 64)",
    "nostack": "cudatrace run --stack-depth 0",
    "budget": "cudatrace run --budget 100GiB",
    "shim": "shim preloaded, no launcher (stacks 64)",
}


def markdown(rows: list, meta: dict) -> str:
    L = [
        "| case | config | median | spread (min-max) | added | ratio | target | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("missing"):
            L.append(
                "| {} | {} | (no successful run) | | | | | |".format(
                    r["case"], CONFIG_LABEL.get(r["config"], r["config"])
                )
            )
            continue
        m = r["metric"]
        added = "-"
        if "added" in r:
            sign = "+" if r["added"] >= 0 else "-"
            added = sign + fmt_val(m, abs(r["added"]))
            if r.get("pct") is not None:
                added += " ({:+.1f}%)".format(r["pct"])
        ratio = "{:.3f}".format(r["ratio"]) if r.get("ratio") else "-"
        verdict = "-"
        if "meets_target" in r:
            verdict = "meets" if r["meets_target"] else "MISSES"
            if r.get("within_noise"):
                verdict += " (within noise)"
        extra = ""
        if r.get("steps_per_s") is not None:
            extra = "; {:.1f} steps/s".format(r["steps_per_s"])
            if r.get("steps_per_s_pct") is not None:
                extra += " ({:+.1f}% slower)".format(r["steps_per_s_pct"])
        if r.get("trace_events") is not None and r.get("expected_events"):
            if r["trace_events"] < r["expected_events"]:
                extra += "; ONLY %d of %d events traced" % (r["trace_events"], r["expected_events"])
        L.append(
            "| {} | {} | {}{} | {} - {} | {} | {} | {} | {} |".format(
                r["case"],
                CONFIG_LABEL.get(r["config"], r["config"]),
                fmt_val(m, r["median"]),
                extra,
                fmt_val(m, r["min"]),
                fmt_val(m, r["max"]),
                added,
                ratio,
                r["target"],
                verdict,
            )
        )
    head = [
        "Overhead of cudatrace ({}; {}).".format(meta.get("gpu", "?"), meta.get("date", "")),
        "Medians of {} alternated rounds; 'added' is against the uninstrumented median of the "
        "same invocation; 'within noise' means the two spreads overlap. The 'cudatrace run' "
        "rows of startup and train include the Python launcher's own start "
        "(a few hundred ms); the 'shim preloaded' rows are what the traced process pays.".format(
            meta.get("rounds")
        ),
        "",
    ]
    return "\n".join(head + L) + "\n"


def environment(args) -> dict:
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "python": platform.python_version(),
        "rounds": args.rounds,
        "train_rounds": args.train_rounds,
        "scale": args.scale,
    }
    try:
        r = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total",
                "--format=csv,noheader",
                "-i",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        meta["gpu"] = r.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        meta["gpu"] = "?"
    try:
        r = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        meta["commit"] = r.stdout.strip()
        r = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        meta["dirty"] = bool(r.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    meta["nproc"] = os.cpu_count()
    return meta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="where results.json/.md go")
    ap.add_argument(
        "--cases",
        default=",".join(ALL_CASES),
        help="comma-separated, of: {} (default: all)".format(", ".join(ALL_CASES)),
    )
    ap.add_argument(
        "--configs",
        default="bare,stacks,nostack,budget",
        help="configs for the micro cases (default: bare,stacks,nostack,budget)",
    )
    ap.add_argument(
        "--train-configs",
        default="bare,shim,stacks",
        help="configs for the train case (default: bare,shim,stacks)",
    )
    ap.add_argument("--rounds", type=int, default=5, help="rounds per micro case (default 5)")
    ap.add_argument(
        "--train-rounds", type=int, default=3, help="rounds of the train case (default 3)"
    )
    ap.add_argument("--startup-rounds", type=int, default=10, help="rounds of startup (default 10)")
    ap.add_argument("--train-steps", type=int, default=400, help="timed steps per train run")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the micro loop counts")
    ap.add_argument("--bin", type=Path, help="bench_alloc already built (tools/gpu/build.sh DIR)")
    ap.add_argument(
        "--deadline",
        type=float,
        default=330.0,
        help="seconds after which no new round starts (0: none; default 330)",
    )
    ap.add_argument("--tmp", default=None, help="directory for the traces of the runs")
    args = ap.parse_args()

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in ALL_CASES]
    if bad:
        ap.error("unknown case(s): {}".format(", ".join(bad)))
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    tconfigs = [c.strip() for c in args.train_configs.split(",") if c.strip()]
    for c in configs + tconfigs:
        if c not in CONFIG_ARGS:
            ap.error("unknown config {} (of: {})".format(c, ", ".join(CONFIG_ARGS)))
    if "bare" not in configs:
        configs.insert(0, "bare")
    if "bare" not in tconfigs:
        tconfigs.insert(0, "bare")

    args.out.mkdir(parents=True, exist_ok=True)
    R = Runner(args)
    meta = environment(args)
    print(f"bench_overhead: {json.dumps(meta)}", flush=True)

    bench = None
    if any(c in MICRO or c == "startup" for c in cases):
        if args.bin:
            bench = str(args.bin / "bench_alloc")
        else:
            bdir = R.tmp / "bin"  # not under --out: only results go there
            t0 = time.monotonic()
            r = subprocess.run(
                ["bash", str(GPU_DIR / "build.sh"), str(bdir)], capture_output=True, text=True
            )
            if r.returncode != 0 and not (bdir / "bench_alloc").exists():
                print(
                    "bench_overhead: building bench_alloc failed:\n" + r.stdout + r.stderr,
                    file=sys.stderr,
                )
                return 1
            print("built tools/gpu in %.1fs" % (time.monotonic() - t0), flush=True)
            bench = str(bdir / "bench_alloc")

    results = []
    rows = []

    def save():
        doc = {
            "meta": meta,
            "results": results,
            "rows": rows,
            "failures": R.failures,
            "elapsed_s": round(time.monotonic() - R.t_start, 1),
        }
        (args.out / "results.json").write_text(json.dumps(doc, indent=2))
        (args.out / "results.md").write_text(markdown(rows, meta))

    for case in cases:
        t0 = time.monotonic()
        if R.over_deadline():
            print(f"deadline reached: {case} skipped", file=sys.stderr)
            continue
        print(f"== {case}", flush=True)
        if case in MICRO:
            res = bench_micro(R, case, bench, configs, args.rounds)
        elif case == "train":
            res = bench_train(R, tconfigs, args.train_rounds)
        else:
            res = bench_startup(R, bench, args.startup_rounds)
        res["elapsed_s"] = round(time.monotonic() - t0, 1)
        results.append(res)
        new = rows_for(res)
        rows.extend(new)
        print(markdown(new, meta).split("\n", 3)[-1], flush=True)
        print("   ({:.1f}s)".format(res["elapsed_s"]), flush=True)
        save()

    save()
    shutil.rmtree(R.tmp, ignore_errors=True)
    print("\n" + markdown(rows, meta))
    print(
        "results: {}, {} ({:.0f}s)".format(
            args.out / "results.json", args.out / "results.md", time.monotonic() - R.t_start
        )
    )
    if R.failures:
        print(
            "%d run(s) failed:\n  %s" % (len(R.failures), "\n  ".join(R.failures[:20])),
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
