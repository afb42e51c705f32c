"""watch_check.py OUTDIR - issue 41's GPU check: the node's watch (NVML against the ledgers) on
a real GPU, beside nvidia-smi.

Runs four processes of tools/gpu/watch_probe.c on GPU 0, each with its own CUDA context
(~518 MiB on an H100 or H200):
  fenced     256 MiB, a member of group watch-fenced (2 GiB), through the preload library
  around     64 MiB as a member of watch-around (1 GiB), then 1 GiB through libc's own dlsym
             reached by dlvsym: memory the library never sees
  unfenced   512 MiB, no preload library at all
  contained  128 MiB, a member of watch-ns (2 GiB), in a pid namespace of its own (unshare: the
             machine has no container runtime; root only), whose context the agent counts
and prints `nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid`, `cudatrace status`
(the ledger directory), a `cudatrace metrics` scrape, and, as root, the node agent's view
(`cudatrace node`: its metrics and `cudatrace status --node`) with the three breaches. Then
`cudatrace node --enforce` at the default interval stops a new `around` (its memory taken 5 s
after it joined) and a new unfenced process, and the time from each breach to the process gone
is printed; the fenced ones run on.

Checks (each printed "CHECK ok|FAIL ..."): every series with a `gpu` label carries the UUID
nvidia-smi gives for it (non-empty); the watch's per-process figures are nvidia-smi's; the
breaches are the expected ones and none names a fenced process; --enforce stops what breaches
and nothing else. Exit status 0 when all hold. WATCH_CONTAINED=0 leaves the contained member
out (a dry run on the simulated driver, whose state a process of another pid namespace would
read as its own). Needs a C compiler, the CUDA toolkit's cuda.h
(CUDA_HOME, default /usr/local/cuda), nvidia-smi, prometheus_client; root for the agent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MiB = 1 << 20
FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"CHECK {'ok' if ok else 'FAIL'}: {what}", flush=True)
    if not ok:
        FAILED.append(what)


def build(out: Path) -> Path:
    cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    nvcc = shutil.which("nvcc")
    if not (cuda / "include" / "cuda.h").is_file() and nvcc:
        cuda = Path(nvcc).resolve().parent.parent
    exe = out / "watch_probe"
    cmd = [os.environ.get("CC", "cc"), "-O1", "-g", "-Wall", f"-I{cuda / 'include'}",
           str(HERE / "watch_probe.c"), "-o", str(exe), f"-L{cuda / 'lib64' / 'stubs'}",
           f"-L{cuda / 'lib64'}", "-lcuda", "-ldl"]  # fmt: skip
    subprocess.run(cmd, check=True)
    return exe


class Procs:
    """The probes started, each read until "ready"; exits stamped (time.time_ns())."""

    def __init__(self, exe: Path, env: dict[str, str]):
        self.exe, self.env, self.all = exe, env, []
        self.gone: dict[int, int] = {}

    def start(self, name: str, *args: object, group: str | None = None, budget: str = "",
              wrap: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:  # fmt: skip
        from cudatrace import native

        env = dict(self.env)
        if group:
            env.update(LD_PRELOAD=str(native.shim_path()), CUDATRACE_GROUP=group,
                       CUDATRACE_BUDGET=budget)  # fmt: skip
        p = subprocess.Popen([*wrap, str(self.exe), *map(str, args)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        p.name = name  # type: ignore[attr-defined]
        self.all.append(p)

        def stamp() -> None:
            p.wait()
            self.gone[p.pid] = time.time_ns()

        threading.Thread(target=stamp, daemon=True).start()
        return p, ""

    @staticmethod
    def ready(p: subprocess.Popen) -> str:
        out = []
        for line in p.stdout:  # type: ignore[union-attr]
            out.append(line)
            if line.strip() == "ready":
                return "".join(out)
        raise SystemExit(f"{p.name}: {''.join(out)} {p.stderr.read()}")  # type: ignore[attr-defined,union-attr]

    def stop_all(self) -> None:
        for p in self.all:
            if p.poll() is None:
                p.terminate()
        for p in self.all:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def gpu_pid(p: subprocess.Popen) -> int:
    """The host pid that holds the GPU memory: the probe's own, or under unshare (which
    forks) its child's."""
    pid = p.pid
    for _ in range(8):
        try:
            if Path(f"/proc/{pid}/exe").resolve().name == "watch_probe":
                return pid
            pid = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            break
    return p.pid


def smi() -> list[tuple[int, int, str]]:
    r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory,gpu_uuid",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True)  # fmt: skip
    rows = []
    for line in r.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit():
            rows.append((int(parts[0]), int(parts[1]) if parts[1].isdigit() else -1, parts[2]))
    return rows


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> tuple[str, list[tuple[str, dict, float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    rows = [(s.name, dict(s.labels), s.value)
            for fam in text_string_to_metric_families(text) for s in fam.samples]  # fmt: skip
    return text, rows


def serve(env: dict, *args: object) -> tuple[subprocess.Popen, str]:
    """`cudatrace ARGS --listen 127.0.0.1:PORT` until it serves: (process, metrics URL)."""
    n = port()
    p = subprocess.Popen([sys.executable, "-m", "cudatrace", *map(str, args), "--listen",
                          f"127.0.0.1:{n}"], env=env, stderr=subprocess.PIPE, text=True)  # fmt: skip
    log: list[str] = []
    for line in p.stderr:  # type: ignore[union-attr]
        log.append(line)
        if "serving metrics" in line:
            break
    else:
        raise SystemExit("".join(log))
    p.log = log  # type: ignore[attr-defined]
    threading.Thread(target=lambda: log.extend(p.stderr), daemon=True).start()  # type: ignore[arg-type]
    return p, f"http://127.0.0.1:{n}/metrics"


def check_uuids(name: str, rows: list[tuple[str, dict, float]], uuids: set[str]) -> None:
    with_gpu = [(n, ls) for n, ls, _ in rows if "gpu" in ls]
    bad = [(n, ls) for n, ls in with_gpu if ls.get("UUID") not in uuids]
    check(bool(with_gpu) and not bad,
          f"{name}: all {len(with_gpu)} series with a gpu label carry nvidia-smi's UUID"
          + (f" (not: {bad[:3]})" if bad else ""))  # fmt: skip


def side_by_side(smi_rows: list, watch: dict, names: dict[int, str]) -> None:
    seen = {(p["pid"], d["uuid"]): (p, d) for d in watch["devices"] for p in d["processes"]}
    found = {}
    for f in watch["findings"]:
        found.setdefault(f["pid"], []).append(f["kind"])
    print(
        f"{'pid':>8} {'who':10} {'nvidia-smi':>11} {'watch NVML':>11} {'ledger':>10}  fence, breaches"
    )
    for pid, mib, uuid in smi_rows:
        p, d = seen.get((pid, uuid), (None, None))
        nv = "-" if p is None or p["bytes"] is None else f"{p['bytes'] // MiB} MiB"
        led = "-" if p is None or not p["member"] else f"{p['member']['held'] // MiB} MiB"
        fence = "-" if p is None else p["fence"]
        print(f"{pid:>8} {names.get(pid, ''):10} {mib:>7} MiB {nv:>11} {led:>10}  {fence} "
              f"{','.join(found.get(pid, []))}   {uuid}")  # fmt: skip


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "watch-out").resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    sys.path.insert(0, str(REPO))
    subprocess.run(
        ["make", "-s", "-C", str(REPO / "native"), "OUT=../cudatrace/_native"], check=True
    )
    exe = build(out)
    ledgers = out / "ledgers"
    ledgers.mkdir(mode=0o700)
    pypath = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH", "")) if x)
    env = dict(os.environ, CUDATRACE_LEDGER_DIR=str(ledgers), PYTHONPATH=pypath)
    root = os.geteuid() == 0
    procs = Procs(exe, env)
    try:
        return run(out, env, procs, root)
    finally:
        procs.stop_all()


def run(out: Path, env: dict, procs: Procs, root: bool) -> int:
    fenced, _ = procs.start("fenced", 256, group="watch-fenced", budget="2GiB")
    around, _ = procs.start("around", 64, 1024, group="watch-around", budget="1GiB")
    unfenced, _ = procs.start("unfenced", 512)
    started = [fenced, around, unfenced]
    if root and shutil.which("unshare") and os.environ.get("WATCH_CONTAINED", "1") != "0":
        contained, _ = procs.start("contained", 128, group="watch-ns", budget="2GiB",
                                   wrap=("unshare", "--pid", "--fork", "--kill-child", "--mount-proc"))  # fmt: skip
        started.append(contained)
    for p in started:
        Procs.ready(p)
    names = {gpu_pid(p): p.name for p in started}  # type: ignore[attr-defined]
    pid_of = {v: k for k, v in names.items()}
    time.sleep(1)
    smi_rows = smi()
    uuids = {u for _, _, u in smi_rows}
    print("== nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv")
    print(subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory,gpu_uuid",
                          "--format=csv"], capture_output=True, text=True).stdout)  # fmt: skip
    print("== cudatrace status (the ledger directory)")
    print(subprocess.run([sys.executable, "-m", "cudatrace", "status"], env=env,
                         capture_output=True, text=True).stdout)  # fmt: skip
    st = json.loads(subprocess.run([sys.executable, "-m", "cudatrace", "status", "--json"], env=env,
                                   capture_output=True, text=True).stdout)  # fmt: skip
    print("== the watch beside nvidia-smi (cudatrace status --json)")
    side_by_side(smi_rows, st["watch"], names)
    for d in st["watch"]["devices"]:
        for p in d["processes"]:
            theirs = [m for pid, m, u in smi_rows if pid == p["pid"] and u == d["uuid"]]
            if p["pid"] in names and theirs:
                got = -1 if p["bytes"] is None else p["bytes"] // MiB
                check(abs(got - theirs[0]) <= 1, f"{names[p['pid']]}: the watch's NVML figure "
                      f"{got} MiB is nvidia-smi's {theirs[0]} MiB")  # fmt: skip
    kinds = {(f["kind"], names.get(f["pid"], f["pid"])) for f in st["watch"]["findings"]}
    check(("outside_ledger", "around") in kinds and ("unfenced", "unfenced") in kinds,
          f"status: the member around the library and the unfenced process are named: {sorted(kinds, key=str)}")  # fmt: skip
    check(not {k for k in kinds if k[1] == "fenced"}, "status: no breach names the fenced process")
    # the contained member's context is counted by the node agent alone (NVML names host pids):
    # until it runs, that context is memory outside the ledger, and status says so
    ns = [f for f in st["watch"]["findings"] if names.get(f["pid"]) == "contained"]
    check(all(f["kind"] == "outside_ledger" and "no CUDA context counted" in f["message"] for f in ns),
          f"status: the contained member is named only for its uncounted context: {[f['message'] for f in ns]}")  # fmt: skip
    metrics, url = serve(env, "metrics")
    try:
        text, rows = scrape(url)
        (out / "metrics.txt").write_text(text)
        print("== cudatrace metrics: the watch's series")
        print(
            "\n".join(
                l
                for l in text.splitlines()
                if l.startswith(("cudatrace_watch", "cudatrace_unfenced"))
            )
        )
        check_uuids("cudatrace metrics", rows, uuids)
    finally:
        metrics.terminate()
        metrics.wait(timeout=30)
    if not root:
        print("== not root: the node agent (cudatrace node) is not run")
        return 1 if FAILED else 0
    node_view(out, env, uuids, names, pid_of)
    enforce(out, env, procs, names)
    print(
        "\n".join(
            ["== summary"]
            + [f"FAILED: {f}" for f in FAILED]
            + (["all checks ok"] if not FAILED else [])
        )
    )
    return 1 if FAILED else 0


def agent_args(out: Path, *extra: object) -> list[object]:
    return ["node", "--root", out / "root", "--state", out / "state", "--cdi-dir", out / "cdi",
            "--vendor", "watch.cudatrace.dev", "--kubernetes", "off", *extra]  # fmt: skip


def node_view(out: Path, env: dict, uuids: set[str], names: dict, pid_of: dict) -> None:
    agent, url = serve(env, *agent_args(out, "--interval", "1"))
    try:
        time.sleep(3.5)  # passes enough for the contained member's context to be counted
        text, rows = scrape(url)
        (out / "node-metrics.txt").write_text(text)
        print("== cudatrace node: its metrics (the watch's, and the contained member's)")
        print("\n".join(l for l in text.splitlines() if l.startswith(("cudatrace_watch_b", "cudatrace_unfenced"))
                        or ("watch-ns" in l and "member_in_use" in l)))  # fmt: skip
        check_uuids("cudatrace node", rows, uuids)
        breaches = {(ls["kind"], v) for n, ls, v in rows if n == "cudatrace_watch_breaches"}
        check(("outside_ledger", 1.0) in breaches and ("unfenced", 1.0) in breaches,
              f"cudatrace node: one member outside its ledger, one unfenced process: {sorted(breaches)}")  # fmt: skip
        r = subprocess.run([sys.executable, "-m", "cudatrace", "status", "--node", out / "state"],
                           env=env, capture_output=True, text=True)  # fmt: skip
        print("== cudatrace status --node")
        print(r.stdout, r.stderr)
        ns = pid_of.get("contained")
        if ns is not None:
            heads = ("OUTSIDE THE LEDGER", "UNFENCED ON A FENCED GPU", "GROUP OVER BUDGET")
            named = [l for l in r.stdout.splitlines() if l.startswith(heads) and f"pid {ns} " in l]
            check(not named, f"cudatrace node: the contained member (its context counted by the agent) is no breach: {named}")  # fmt: skip
        print("".join(agent.log))  # type: ignore[attr-defined]
    finally:
        agent.terminate()
        agent.wait(timeout=30)


def enforce(out: Path, env: dict, procs: Procs, names: dict) -> None:
    for p in procs.all:
        if getattr(p, "name", "") in ("around", "unfenced"):
            p.terminate()
            p.wait(timeout=30)
    agent, _url = serve(env, *agent_args(out, "--enforce"))  # the default interval, 2 s
    try:
        around, _ = procs.start("around2", 64, 1024, 5000, group="watch-around", budget="1GiB")
        time.sleep(2.7)
        free, _ = procs.start("unfenced2", 512)
        free_ready = Procs.ready(free) and time.time_ns()
        out_around = Procs.ready(around)
        breach = int(re.search(r"^breach (\d+)", out_around, re.M).group(1))  # type: ignore[union-attr]
        for p in (around, free):
            p.wait(timeout=60)
        time.sleep(0.1)
        took = {"a member's 1 GiB around the library": (procs.gone[around.pid] - breach) / 1e9,
                "an unfenced process's 512 MiB": (procs.gone[free.pid] - free_ready) / 1e9}  # fmt: skip
        print("== --enforce at the default interval (2 s): breach to stop")
        for what, s in took.items():
            print(f"  {what}: {s:.2f} s")
        check(
            all(0 < s < 6 for s in took.values()),
            "--enforce stopped both within a pass and its readings",
        )
        alive = [p.name for p in procs.all if p.poll() is None]  # type: ignore[attr-defined]
        check(sorted(alive) == sorted(n for n in ("fenced", "contained") if n in names.values()),
              f"--enforce left the fenced processes running: {alive}")  # fmt: skip
        print("".join(agent.log))  # type: ignore[attr-defined]
    finally:
        agent.terminate()
        agent.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
