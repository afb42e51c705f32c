#!/usr/bin/env python3
"""dra_claim.py OUTDIR - a DRA claim's GPU memory as the budget of a process, on a CUDA machine.

No Kubernetes runs here; the pieces around the plugin are the tests': a fake API server over
HTTPS (tests/support/kube.py) holds the Node and a ResourceClaim, and this script calls the
plugin as the kubelet does, through its gRPC client (cudatrace/deploy/dra_grpc.py). Steps:

  1. `cudatrace dra-plugin` starts on the real NVML: its ResourceSlice offers each GPU's memory;
     printed beside nvidia-smi's total (they must be equal: NVML's figure, nothing added);
  2. a claim of CLAIM (default 8Gi) of GPU 0 is prepared: the plugin's CDI device ids, its spec;
  3. a process runs with the claim's CDI edits applied as a runtime applies them
     (tools/gpu/apply_cdi.py in a new mount and pid namespace, chrooted into the host's
     directories; the GPU's device nodes are the host's /dev): it sees the claim as the device's
     memory (cuMemGetInfo), holds half, then asks for more than the rest: denied, with the
     preload library's line;
  4. the claim is unprepared: its spec and ledger directory are gone.

Prints PASS/FAIL lines; exit 0 when all pass. Needs root, python3 with grpcio and protobuf
(pip install 'cudatrace[dra]'), openssl. About 20 seconds.

A dry run without a GPU, on the simulated driver of the tests: SIM_DIR=<a tests/support/
simbuild.py build, e.g. $CUDATRACE_SIM_BUILDDIR> (one simulated GPU of 16 GiB).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from cudatrace.deploy.dra import ClaimRef, parse_quantity  # noqa: E402
from cudatrace.deploy.dra_grpc import Client  # noqa: E402
from support.kube import FakeApiServer  # noqa: E402

NODE = "gpu-node"
UID = "d7a1c3e5-0000-4000-8000-000000000001"
fails = 0

WORKLOAD = r"""
import ctypes, sys
hold, extra = int(sys.argv[1]), int(sys.argv[2])
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
f, t = ctypes.c_size_t(), ctypes.c_size_t()
cu.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t))
print(f"mem_get_info total {t.value} free {f.value}", flush=True)
for n in (hold, extra):
    p = ctypes.c_uint64()
    rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n))
    print(f"alloc {n} rc {rc}", flush=True)
"""


def check(ok: bool, what: str) -> bool:
    global fails
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    fails += 0 if ok else 1
    return ok


def claim(memory: str) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "trainer-gpu", "namespace": "ml", "uid": UID},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu-memory.cudatrace.dev",
            "capacity": {"requests": {"memory": memory}}}}]}},
        "status": {"allocation": {"devices": {"results": [{
            "request": "gpu", "driver": "gpu.cudatrace.dev", "pool": NODE, "device": "gpu-0",
            "consumedCapacity": {"memory": memory}}]}}},
    }  # fmt: skip


def nvidia_smi_total() -> int | None:
    if os.environ.get("SIM_DIR") or not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits",
                          "-i", "0"], capture_output=True, text=True).stdout  # fmt: skip
    return int(out.split()[0]) << 20 if out.strip() else None


def start_plugin(
    out: Path, base: Path, api: FakeApiServer, vendor: str, env: dict
) -> subprocess.Popen:
    log = open(out / "plugin.log", "w")
    cmd = [sys.executable, "-m", "cudatrace", "dra-plugin", "--node-name", NODE,
           "--root", base / "root", "--state", base / "state", "--cdi-dir", "/var/run/cdi",
           "--vendor", vendor, "--gpu-cdi", "", "--kubelet-dir", base / "kubelet",
           "--kube-api", api.url, "--kube-token", api.token_file, "--kube-ca", api.ca_file]  # fmt: skip
    proc = subprocess.Popen([str(c) for c in cmd], env=env, stderr=log, stdout=log)
    for _ in range(240):
        if (
            "serving gpu.cudatrace.dev" in (out / "plugin.log").read_text()
            or proc.poll() is not None
        ):
            break
        time.sleep(0.25)
    return proc


def run_workload(out: Path, spec: Path, device: str, hold: int, extra: int, env: dict) -> str:
    (out / "take.py").write_text(WORKLOAD)
    binds = ":".join([str(out), *([os.environ["SIM_DIR"]] if os.environ.get("SIM_DIR") else [])])
    cmd = ["unshare", "--mount", "--pid", "--fork", "env", f"BIND={binds}",
           sys.executable, str(REPO / "tools" / "gpu" / "apply_cdi.py"), str(spec), device,
           str(out / "root.mnt"), "--", sys.executable, str(out / "take.py"), str(hold), str(extra)]  # fmt: skip
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    (out / "take.out").write_text(r.stdout)
    (out / "take.err").write_text(r.stderr)
    return r.stdout + r.stderr


def steps(out: Path, base: Path, api: FakeApiServer, env: dict) -> None:
    vendor = f"dra{os.getpid()}.cudatrace.dev"
    memory = os.environ.get("CLAIM", "8Gi")
    budget = parse_quantity(memory)
    plugin = start_plugin(out, base, api, vendor, env)
    try:
        if not check(
            plugin.poll() is None,
            "the plugin serves: " + (out / "plugin.log").read_text().strip().splitlines()[-1],
        ):
            return
        s = api.objects[f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-gpu.cudatrace.dev"]
        offered = int(s["spec"]["devices"][0]["capacity"]["memory"]["value"])
        smi = nvidia_smi_total()
        print(f"ResourceSlice gpu-0 memory {offered} bytes; nvidia-smi total {smi}")
        check(smi is None or offered == smi, "the slice offers NVML's total of GPU 0")
        api.put("/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/trainer-gpu", claim(memory))
        dra = Client(base / "kubelet" / "plugins" / "gpu.cudatrace.dev" / "dra.sock")
        resp = dra.prepare([ClaimRef("ml", UID, "trainer-gpu")]).claims[UID]
        ids = [i for d in resp.devices for i in d.cdi_device_ids]
        check(
            resp.error == "" and ids == [f"{vendor}/claim={UID}-gpu-0"],
            f"prepared: {ids} {resp.error}",
        )
        spec = Path("/var/run/cdi") / f"{vendor}-claim-{UID}.json"
        print(json.dumps(json.loads(spec.read_text())["containerEdits"]["env"]))
        hold = budget // 2
        text = run_workload(out, spec, f"{UID}-gpu-0", hold, budget - hold + (256 << 20), env)
        print(text.strip())
        check(
            f"mem_get_info total {budget} " in text,
            "the process sees the claim as the device's memory",
        )
        check(f"alloc {hold} rc 0" in text, "half the claim held")
        check(
            "rc 2" in text and "cudatrace: budget exceeded" in text,
            "more than the rest denied (CUDA_ERROR_OUT_OF_MEMORY) with the preload library's line",
        )
        un = dra.unprepare([ClaimRef("ml", UID, "trainer-gpu")]).claims[UID]
        check(
            un.error == "" and not spec.exists() and not (base / "state" / "claims" / UID).exists(),
            "unprepared: spec and ledger directory gone",
        )
        dra.close()
    finally:
        plugin.send_signal(signal.SIGTERM)
        plugin.wait(timeout=30)
        for f in Path("/var/run/cdi").glob(f"{vendor}-*.json"):
            f.unlink()


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: dra_claim.py OUTDIR")
    if os.geteuid() != 0:
        sys.exit("FAIL dra_claim.py needs root")
    out = Path(sys.argv[1]).absolute()
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o755)
    subprocess.run(
        ["make", "-s", "-C", str(REPO / "native"), "OUT=../cudatrace/_native"], check=True
    )
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{os.environ.get('PYTHONPATH', '')}")
    if os.environ.get("SIM_DIR"):
        (out / "sim.state").write_bytes(b"")
        (out / "sim.state").chmod(0o666)
        env.update(LD_LIBRARY_PATH=f"{os.environ['SIM_DIR']}/lib", CUDASIM_STATE=str(out / "sim.state"),
                   CUDASIM_TOTAL_BYTES=str(16 << 30))  # fmt: skip
    base = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # a unix socket's path is short
    base.chmod(0o755)
    api = FakeApiServer(out)
    api.put(f"/api/v1/nodes/{NODE}", {"apiVersion": "v1", "kind": "Node",
                                      "metadata": {"name": NODE, "uid": UID}})  # fmt: skip
    try:
        steps(out, base, api, env)
    finally:
        api.close()
        shutil.rmtree(base, ignore_errors=True)
    print(f"dra_claim: {fails} failure(s); outputs in {out}")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
