"""top_check.py OUTDIR - issue 44's GPU check of `cudatrace top`: its per-process figures beside
nvidia-smi's on a real GPU, with a traced run in a budget group and a process without a fence.

Starts on GPU 0, each a PyTorch process holding memory until its stdin closes:
  plain    1 GiB (torch.empty), no cudatrace at all
  traced   512 MiB under `cudatrace run --budget 2GiB --group top-check`, then asks 4 GiB more,
           which the budget denies (PyTorch's OutOfMemoryError, caught): a denial with its site
Then prints `cudatrace top --once` (text) and `nvidia-smi --query-compute-apps=pid,used_memory
--format=csv`, and a table of each pid's figure by top (NVML's, through cudatrace's binding)
beside nvidia-smi's, in MiB.

Checks (each printed "CHECK ok|FAIL ..."): every pid nvidia-smi lists on GPU 0 is in top's view
with the same figure (nvidia-smi's MiB, top's bytes rounded down to MiB); the traced run is
among top's runs, its top site names this script's holder line; group top-check has the traced
process as its member, limit 2 GiB; the latest denial names a site. Exit status 0 when all hold.
Needs PyTorch with CUDA and nvidia-smi. Run from the repository root:

    python3 tools/gpu/top_check.py /tmp/top-check
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
FAILED: list[str] = []

HOLDER = """\
import sys
import torch
size, extra = int(sys.argv[1]), int(sys.argv[2])
held = torch.empty(size, dtype=torch.uint8, device="cuda")  # top-check: the held memory
if extra:
    try:
        more = torch.empty(extra, dtype=torch.uint8, device="cuda")  # top-check: denied
    except RuntimeError as e:
        print("denied:", str(e).splitlines()[0], flush=True)
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""


def check(ok: bool, what: str) -> None:
    print(f"CHECK {'ok' if ok else 'FAIL'}: {what}", flush=True)
    if not ok:
        FAILED.append(what)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    e["CUDA_VISIBLE_DEVICES"] = "0"
    return e


def start(args: list[str], e: dict[str, str]) -> subprocess.Popen:
    p = subprocess.Popen(args, env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)  # fmt: skip
    assert p.stdout is not None
    for line in p.stdout:
        print(f"  [{p.pid}] {line.rstrip()}", flush=True)
        if line.strip() == "ready":
            return p
    raise SystemExit(f"{args} ended before it was ready (exit {p.wait()})")


def nvidia_smi() -> dict[int, int]:
    """pid -> used_memory in MiB on GPU 0, as nvidia-smi lists them."""
    out = subprocess.run(
        ["nvidia-smi", "-i", "0", "--query-compute-apps=pid,used_memory", "--format=csv"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    print("$ nvidia-smi -i 0 --query-compute-apps=pid,used_memory --format=csv")
    print(out, end="")
    rows = list(csv.reader(io.StringIO(out)))[1:]
    return {
        int(r[0]): int(r[1].split()[0]) for r in rows if len(r) >= 2 and r[1].strip()[0].isdigit()
    }


def cudatrace(*args: str, e: dict[str, str]) -> str:
    r = subprocess.run([sys.executable, "-m", "cudatrace", *args], env=e, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"cudatrace {' '.join(args)}: exit {r.returncode}\n{r.stderr}")
    return r.stdout


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/top-check").resolve()
    out.mkdir(parents=True, exist_ok=True)
    holder = out / "holder.py"
    holder.write_text(HOLDER)
    e = env()
    e["CUDATRACE_LEDGER_DIR"] = str(out / "ledgers")
    run_dir = out / "run"
    procs = []
    try:
        plain = start([sys.executable, str(holder), str(1024 * MiB), "0"], e)
        procs.append(plain)
        launcher = start([sys.executable, "-m", "cudatrace", "run", "-o", str(run_dir), "--force",
                          "--budget", "2GiB", "--group", "top-check", "--", sys.executable,
                          str(holder), str(512 * MiB), str(4096 * MiB)], e)  # fmt: skip
        procs.append(launcher)
        time.sleep(2)  # NVML's figures settle; the launcher keeps the denial
        text = cudatrace("top", "--once", e=e)
        print("$ cudatrace top --once")
        print(text, end="")
        snap = json.loads(cudatrace("top", "--once", "--json", e=e))
        smi = nvidia_smi()
        compare(snap, smi)
        judge(snap, plain.pid, run_dir)
    finally:
        for p in procs:
            if p.stdin:
                p.stdin.close()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    print("top_check:", "all checks hold" if not FAILED else f"{len(FAILED)} FAILED")
    return 1 if FAILED else 0


def compare(snap: dict, smi: dict[int, int]) -> None:
    top = {p["pid"]: p for d in snap["devices"] if d["gpu"] == 0 for p in d["processes"]}
    print(f"\n{'pid':>8}  {'top (NVML) MiB':>15}  {'nvidia-smi MiB':>15}  command")
    for pid in sorted(set(top) | set(smi)):
        p = top.get(pid)
        mine = "-" if p is None else ("N/A" if p["bytes"] is None else str(p["bytes"] // MiB))
        print(f"{pid:>8}  {mine:>15}  {smi.get(pid, '-')!s:>15}  {p['command'] if p else ''}")
    for pid, mib in sorted(smi.items()):
        p = top.get(pid)
        got = None if p is None or p["bytes"] is None else p["bytes"] // MiB
        check(got == mib, f"pid {pid}: top says {got} MiB, nvidia-smi {mib} MiB")


def judge(snap: dict, plain: int, run_dir: Path) -> None:
    procs = {p["pid"]: p for d in snap["devices"] for p in d["processes"]}
    check(plain in procs and procs[plain]["fence"] == "unfenced",
          f"the plain process {plain} is listed, unfenced")  # fmt: skip
    runs = [r for r in snap["runs"] if Path(r["path"]) == run_dir]
    sites = [s["label"] for r in runs for d in r["devices"] for s in d["sites"]]
    check(bool(runs), f"the traced run {run_dir} is among top's runs")
    check(any("holder.py:4" in s for s in sites), f"its top site names holder.py:4 ({sites})")
    groups = [g for g in snap["groups"] if g["name"] == "top-check"]
    check(len(groups) == 1 and len(groups[0]["members"]) == 1, "group top-check, one member")
    if groups:
        member = groups[0]["members"][0]["pid"]
        check(procs.get(member, {}).get("group") == "top-check",
              f"the member {member} is listed on the GPU with its group")  # fmt: skip
        check(any(d["limit"] == 2 << 30 for d in groups[0]["devices"]), "its limit is 2 GiB")
    den = snap["denials"]
    check(bool(den) and bool(den[0]["label"]),
          f"the latest denial names a site ({den[0]['label'] if den else None})")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
