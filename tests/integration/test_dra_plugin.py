"""`cudatrace dra-plugin`, the kubelet plugin of the DRA driver, run as its own process and talked
to as the kubelet does: through its gRPC services on unix sockets (its own client,
cudatrace/deploy/dra_grpc.py), with the claims on a fake API server over HTTPS
(tests/support/kube.py) and the containers run for real with Podman and runc, given the CDI
devices the plugin answered (tests/support/podman.py).

The node has two simulated GPUs of 4 GiB (NVML is the simulated one). The GPUs reach the
containers through a CDI spec of the test's own (as nvidia-ctk's gives real GPUs:
`--gpu-cdi <vendor>/gpu={index}`): the simulated GPU's state file and the host's /proc.
Two claims share GPU 0 (1 GiB and 1.5 GiB of it): each container is fenced at its claim's
memory; two containers of one claim share its budget.

Needs root (rootful Podman); with CI=true a missing piece fails, elsewhere it skips."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from support import children
from support.cli import checkout_env
from support.kube import DRA_VERSION, FakeApiServer, validate
from support.podman import podman  # noqa: F401  (fixture)

MiB = 1 << 20
GiB = 1 << 30
CDI_DIR = Path("/var/run/cdi")
NODE = "gpu-node-1"
NODE_UID = "3c1d2e4f-0000-4000-8000-00000000aaaa"
POD_UID = "5e1d2e4f-0000-4000-8000-00000000bbbb"
CLAIMS = {  # name -> (uid, memory consumed of gpu-0)
    "train": ("a1b2c3d4-0000-4000-8000-000000000001", "1Gi"),
    "serve": ("b1b2c3d4-0000-4000-8000-000000000002", "1536Mi"),
}


def allocs(out: str) -> list[str]:
    return [l.split()[4] for l in out.splitlines() if l.startswith("alloc ")]


def gpu_spec(vendor: str, state: Path) -> dict:
    """The simulated GPUs as CDI devices: what they all need once (the state file, the
    host's /proc for host pids), and a device per GPU."""
    return {
        "cdiVersion": "0.5.0",
        "kind": f"{vendor}/gpu",
        "containerEdits": {
            "env": ["CUDASIM_STATE=/sim/state", "CUDASIM_HOST_PROC=/host/proc"],
            "mounts": [
                {"hostPath": str(state), "containerPath": "/sim/state", "options": ["rw", "bind"]},
                {"hostPath": "/proc", "containerPath": "/host/proc", "options": ["ro", "rbind"]},
            ],
        },
        "devices": [
            {"name": str(i), "containerEdits": {"env": [f"SIM_GPU_{i}=1"]}} for i in (0, 1)
        ],
    }


def claim(name: str, uid: str, memory: str) -> dict:
    """A ResourceClaim made from a template for pod trainer, allocated on gpu-0."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name, "namespace": "ml", "uid": uid,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "trainer",
                                 "uid": POD_UID, "controller": True}],
        },
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu-memory.cudatrace.dev",
            "capacity": {"requests": {"memory": memory}}}}]}},
        "status": {
            "allocation": {"devices": {"results": [{
                "request": "gpu", "driver": "gpu.cudatrace.dev", "pool": NODE,
                "device": "gpu-0", "shareID": uid[:8], "consumedCapacity": {"memory": memory}}]}},
            "reservedFor": [{"resource": "pods", "name": "trainer", "uid": POD_UID}],
        },
    }  # fmt: skip


class Node:
    def __init__(self, base: Path, api: FakeApiServer, state: Path, proc: subprocess.Popen):
        self.base, self.api, self.state, self.proc = base, api, state, proc
        self.log: list[str] = []

    @property
    def kubelet(self) -> Path:
        return self.base / "kubelet"

    def said(self, text: str, timeout: float = 10) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.log):
                if text in line:
                    return line
            time.sleep(0.05)
        raise AssertionError(f"the plugin did not say {text!r}:\n{''.join(self.log)}")


@pytest.fixture
def node(podman, sim, tmp_path):  # noqa: F811
    # a short directory: a unix socket's path is at most 107 bytes
    base = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    base.chmod(0o755)
    tag = f"{os.getpid()}-{os.urandom(3).hex()}"
    vendor, gpu_vendor = f"d{tag}.cudatrace.dev", f"g{tag}.cudatrace.dev"
    api = FakeApiServer(tmp_path)
    api.put(f"/api/v1/nodes/{NODE}", {"apiVersion": "v1", "kind": "Node",
                                      "metadata": {"name": NODE, "uid": NODE_UID}})  # fmt: skip
    state = sim.new_state()
    state.touch(mode=0o666)
    gpu_file = CDI_DIR / f"{gpu_vendor}-gpu.json"
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    gpu_file.write_text(json.dumps(gpu_spec(gpu_vendor, state)))
    env = checkout_env(sim.env(state=state, devices=2, total_bytes=4 * GiB))
    cmd = [sys.executable, "-m", "cudatrace", "dra-plugin", "--node-name", NODE,
           "--root", base / "root", "--state", base / "state", "--cdi-dir", CDI_DIR,
           "--vendor", vendor, "--gpu-cdi", f"{gpu_vendor}/gpu={{index}}",
           "--kubelet-dir", base / "kubelet", "--resync", "0.3", "--kube-api", api.url,
           "--kube-token", api.token_file, "--kube-ca", api.ca_file]  # fmt: skip
    proc = children.popen(
        [str(c) for c in cmd], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    n = Node(base, api, state, proc)
    n.vendor, n.gpu_vendor = vendor, gpu_vendor
    threading.Thread(target=lambda: n.log.extend(proc.stderr), daemon=True).start()
    try:
        n.said("serving gpu.cudatrace.dev", timeout=60)
        yield n
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        api.close()
        gpu_file.unlink(missing_ok=True)
        for f in CDI_DIR.glob(f"{vendor}-*.json"):
            f.unlink()
        shutil.rmtree(base, ignore_errors=True)


def client(path: Path):
    from cudatrace.deploy.dra_grpc import Client

    return Client(path)


def run_claimed(podman, ids: list[str], *cmd: str, name: str | None = None):  # noqa: F811
    devices = [a for i in ids for a in ("--device", i)]
    if name is not None:
        return podman.popen(*devices, podman.image, *cmd, name=name)
    return podman.run(*devices, podman.image, *cmd)


def test_the_kubelet_registers_the_plugin_and_its_slice_is_published(node):
    from cudatrace.deploy import dra_grpc

    reg = client(node.kubelet / "plugins_registry" / "gpu.cudatrace.dev-reg.sock")
    info = reg.get_info()
    assert info.type == "DRAPlugin" and info.name == "gpu.cudatrace.dev"
    assert info.endpoint == str(node.kubelet / "plugins" / "gpu.cudatrace.dev" / "dra.sock")
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    reg.notify(True)
    node.said("the kubelet registered the driver gpu.cudatrace.dev")
    reg.notify(False, "no such version")
    node.said("the kubelet refused the driver gpu.cudatrace.dev: no such version")
    reg.close()
    # the ResourceSlice: both GPUs, their memory as consumable capacity, owned by the node
    path = f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-gpu.cudatrace.dev"
    s = node.api.objects[path]
    validate({k: v for k, v in s.items()}, DRA_VERSION)
    assert [(d["name"], d["capacity"]["memory"]["value"], d["allowMultipleAllocations"])
            for d in s["spec"]["devices"]] == [("gpu-0", str(4 * GiB), True),
                                               ("gpu-1", str(4 * GiB), True)]  # fmt: skip
    assert s["metadata"]["ownerReferences"][0]["uid"] == NODE_UID
    # the kubelet removes a driver's slices while its plugin is away: made again
    del node.api.objects[path]
    deadline = time.monotonic() + 10
    while path not in node.api.objects and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path in node.api.objects, "".join(node.log)
    assert node.api.objects[path]["spec"]["pool"]["generation"] == 2
    # sockets: the kubelet (root) alone
    assert oct(os.stat(info.endpoint).st_mode & 0o777) == "0o600"
    # the plugin stops on SIGTERM and takes its registration away first
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(timeout=30) == 0
    assert not (node.kubelet / "plugins_registry" / "gpu.cudatrace.dev-reg.sock").exists()
    assert dra_grpc.SERVICES  # (the module imported in this process too)


def test_claims_prepared_fence_their_containers_and_are_cleaned_up(node, podman, sim):  # noqa: F811
    from cudatrace.deploy.dra import ClaimRef

    for name, (uid, memory) in CLAIMS.items():
        c = claim(name, uid, memory)
        validate(c, DRA_VERSION)
        node.api.put(f"/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/{name}", c)
    refs = {name: ClaimRef("ml", uid, name) for name, (uid, _) in CLAIMS.items()}
    gone = ClaimRef("ml", "c1b2c3d4-0000-4000-8000-000000000003", "gone")
    dra = client(node.kubelet / "plugins" / "gpu.cudatrace.dev" / "dra.sock")
    resp = dra.prepare([refs["train"], refs["serve"], gone])
    assert set(resp.claims) == {r.uid for r in [*refs.values(), gone]}
    assert "HTTP 404" in resp.claims[gone.uid].error
    ids = {}
    for name, ref in refs.items():
        entry = resp.claims[ref.uid]
        assert entry.error == "", entry.error
        (dev,) = entry.devices
        assert (list(dev.request_names), dev.pool_name, dev.device_name) == (["gpu"], NODE, "gpu-0")
        assert list(dev.cdi_device_ids) == [
            f"{node.gpu_vendor}/gpu=0",
            f"{node.vendor}/claim={ref.uid}-gpu-0",
        ]
        ids[name] = list(dev.cdi_device_ids)
        spec = json.loads((CDI_DIR / f"{node.vendor}-claim-{ref.uid}.json").read_text())
        assert spec["kind"] == f"{node.vendor}/claim" and spec["cdiVersion"] == "0.3.0"

    # train (1 GiB): the third 400 MiB is denied, with the attributed line
    r = run_claimed(podman, ids["train"], "hold", "--exit-after-ms", "10", "--free", "3", "400m")
    assert allocs(r.stdout) == ["0", "0", "2"], (r.stdout, r.stderr)
    (line,) = [l for l in r.stderr.splitlines() if "budget exceeded" in l]
    assert "budget 1.00 GiB, in use 800.00 MiB" in line and "at hold_alloc" in line, line
    # serve (1.5 GiB of the same GPU): three granted, the fourth denied
    r = run_claimed(podman, ids["serve"], "hold", "--exit-after-ms", "10", "--free", "4", "400m")
    assert allocs(r.stdout) == ["0", "0", "0", "2"], (r.stdout, r.stderr)
    assert "budget 1.50 GiB, in use 1.17 GiB" in r.stderr, r.stderr
    # two containers of one claim share its budget: the second is denied what the first holds
    first = podman.name()
    a = run_claimed(podman, ids["train"], "hold", "1", "700m", name=first)
    try:
        lines = []
        for l in a.stdout:
            lines.append(l)
            if l.strip() == "ready":
                break
        assert allocs("".join(lines)) == ["0"], lines
        b = run_claimed(podman, ids["train"], "sh", "-c",
                        "env; exec hold --exit-after-ms 10 --free 1 700m")  # fmt: skip
        assert allocs(b.stdout) == ["2"] and "in use 700.00 MiB" in b.stderr, (b.stdout, b.stderr)
        assert (
            "CUDATRACE_K8S_NAMESPACE=ml" in b.stdout
            and f"CUDATRACE_K8S_POD_UID={POD_UID}" in b.stdout
        )
    finally:
        podman.remove(first)
        a.communicate(timeout=60)
    # a container given two claims (docs: one per container): Podman keeps one claim's edits,
    # consistently (its group, budget and ledger directory), so it is fenced by that claim
    both = run_claimed(podman, ids["train"] + ids["serve"][1:], "sh", "-c",
                       "env; ls /run/cudatrace/ledger; exec hold --exit-after-ms 10 --free 4 400m")  # fmt: skip
    group = [
        l.split("=", 1)[1] for l in both.stdout.splitlines() if l.startswith("CUDATRACE_GROUP=")
    ]
    assert len(group) == 1 and group[0] in {r.uid for r in refs.values()}, both.stdout
    assert f"{group[0]}@0.ledger" in both.stdout.split(), both.stdout  # the containers' user
    assert "budget exceeded" in both.stderr and allocs(both.stdout)[-1] == "2", both.stderr
    ledger = node.base / "state" / "claims" / refs["train"].uid
    assert (ledger / f"{refs['train'].uid}@0.ledger").is_file()
    # the device held what was granted, never more
    assert sim.stats(node.state)[0]["hwm"] <= 1200 * MiB

    # unprepared through the v1beta1 service (the kubelets of 1.32 and 1.33 call it)
    un = dra.unprepare([refs["train"], refs["serve"]], version="v1beta1.DRAPlugin")
    assert {u: e.error for u, e in un.claims.items()} == {r.uid: "" for r in refs.values()}
    for ref in refs.values():
        assert not (CDI_DIR / f"{node.vendor}-claim-{ref.uid}.json").exists()
        assert not (node.base / "state" / "claims" / ref.uid).exists()
    dra.close()


def test_print_shows_the_slice_of_the_nodes_gpus(sim):
    """--print: the ResourceSlice of the node's GPUs from NVML (the simulated one, two GPUs of
    3 GiB and 5 GiB), less --reserve, without serving anything."""
    from support.cli import cudatrace

    env = checkout_env(sim.env(state=sim.new_state(), devices=2, total_bytes=[3 * GiB, 5 * GiB]))
    r = cudatrace(env, "dra-plugin", "--print", "--node-name", NODE, "--reserve", "512MiB")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    validate(s, DRA_VERSION)
    assert [(d["name"], d["capacity"]["memory"]["value"]) for d in s["spec"]["devices"]] == [
        ("gpu-0", str(3 * GiB - 512 * MiB)),
        ("gpu-1", str(5 * GiB - 512 * MiB)),
    ]
    assert s["spec"]["devices"][1]["attributes"]["uuid"] == {
        "string": "GPU-5ca1ab1e-0000-4000-8000-000000000001"
    }
    r = cudatrace(env, "dra-plugin", "--print", "--reserve", "3GiB")
    assert r.returncode == 2 and "nothing left past --reserve" in r.stderr, r.stderr


@pytest.fixture
def lone_plugin(sim, tmp_path):
    """The plugin as its own process with no container runtime: its CDI specs in a folder of
    the test's own, the API server the fake one, which a test may have answer anything first
    (start(api) is called once the test has set its answers up)."""
    base = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    api = FakeApiServer(tmp_path)
    api.put(f"/api/v1/nodes/{NODE}", {"apiVersion": "v1", "kind": "Node",
                                      "metadata": {"name": NODE, "uid": NODE_UID}})  # fmt: skip
    state = sim.new_state()
    env = checkout_env(sim.env(state=state, devices=2, total_bytes=4 * GiB))
    procs = []

    def start(*extra: str) -> Node:
        cmd = [sys.executable, "-m", "cudatrace", "dra-plugin", "--node-name", NODE,
               "--root", base / "root", "--state", base / "state", "--cdi-dir", base / "cdi",
               "--kubelet-dir", base / "kubelet", "--resync", "0.3", "--kube-api", api.url,
               "--kube-token", api.token_file, "--kube-ca", api.ca_file, *extra]  # fmt: skip
        proc = subprocess.Popen([str(c) for c in cmd], env=env, stderr=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, text=True)  # fmt: skip
        procs.append(proc)
        n = Node(base, api, state, proc)
        threading.Thread(target=lambda: n.log.extend(proc.stderr), daemon=True).start()
        n.said("serving gpu.cudatrace.dev", timeout=60)
        return n

    yield api, start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    api.close()
    shutil.rmtree(base, ignore_errors=True)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_plugin_survives_api_answers_it_cannot_read(lone_plugin):
    """An answer without metadata, not JSON, a 503: said in the log, tried again after a
    pause, never the end of the plugin (it exited on a KeyError before)."""
    import urllib.error
    import urllib.request

    from cudatrace.deploy.dra import ClaimRef

    api, start = lone_plugin
    slice_path = f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-gpu.cudatrace.dev"
    api.answer("GET", slice_path, 200, b'{"kind": "ResourceSlice", "spec": {}}')
    api.answer("GET", slice_path, 503, b"the etcd is away", times=1)
    port = free_port()
    n = start("--health-listen", f"127.0.0.1:{port}")
    n.said("has no metadata.resourceVersion; trying again in 1 s")
    n.said("HTTP 503")
    n.said("published the ResourceSlice gpu-node-1-gpu.cudatrace.dev again", timeout=20)
    assert slice_path in api.objects and n.proc.poll() is None

    name, (uid, memory) = "train", CLAIMS["train"]
    claim_path = f"/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/{name}"
    api.put(claim_path, claim(name, uid, memory))
    ref = ClaimRef("ml", uid, name)
    dra = client(n.kubelet / "plugins" / "gpu.cudatrace.dev" / "dra.sock")
    # three answers without metadata: the claim is refused with the reason, the plugin lives
    api.answer("GET", claim_path, 200, b'{"apiVersion": "resource.k8s.io/v1"}', times=3)
    err = dra.prepare([ref]).claims[uid].error
    assert "the ResourceClaim has no metadata.uid" in err, err
    # not JSON, then a 502: tried again within the call, then prepared
    api.answer("GET", claim_path, 200, b"<html>proxy</html>", times=1)
    api.answer("GET", claim_path, 502, b"", times=1)
    entry = dra.prepare([ref]).claims[uid]
    assert entry.error == "" and entry.devices[0].device_name == "gpu-0", entry
    n.said("the answer is not JSON")
    n.said("HTTP 502")
    assert n.proc.poll() is None and "Traceback" not in "".join(n.log)
    # health: the loop turns and both sockets answer; ready once the kubelet registered it
    url = f"http://127.0.0.1:{port}"
    assert urllib.request.urlopen(f"{url}/healthz", timeout=10).read() == b"ok\n"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{url}/readyz", timeout=10)
    assert e.value.code == 503 and b"has not registered" in e.value.read()
    reg = client(n.kubelet / "plugins_registry" / "gpu.cudatrace.dev-reg.sock")
    reg.notify(True)
    assert urllib.request.urlopen(f"{url}/readyz", timeout=10).read() == b"ok\n"
    dra.close()
    reg.close()


def test_a_claims_containers_cannot_raise_its_budget(node, podman, sim):  # noqa: F811
    """A claim of 1 GiB: its container's processes, as two ordinary uids, name a larger budget,
    another group and another ledger directory; the claim's sealed record holds them to 1 GiB
    and one line says what was ignored."""
    from cudatrace.deploy.dra import ClaimRef

    name, (uid, memory) = "train", CLAIMS["train"]
    node.api.put(f"/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/{name}",
                 claim(name, uid, memory))  # fmt: skip
    dra = client(node.kubelet / "plugins" / "gpu.cudatrace.dev" / "dra.sock")
    resp = dra.prepare([ClaimRef("ml", uid, name)])
    ids = list(resp.claims[uid].devices[0].cdi_device_ids)
    node.state.chmod(0o666)  # the simulated GPU, for any uid in the container
    for user in ("65534:65534", "1000:1000"):
        devices = [a for i in ids for a in ("--device", i)]
        r = podman.run(*devices, "--user", user, podman.image, "sh", "-c",
                       "CUDATRACE_BUDGET=8GiB CUDATRACE_GROUP=mine CUDATRACE_LEDGER_DIR=/tmp "
                       "exec hold --exit-after-ms 10 3 400m")  # fmt: skip
        assert allocs(r.stdout) == ["0", "0", "2"], (user, r.stdout, r.stderr)
        (line,) = [ln for ln in r.stderr.splitlines() if "the sealed fence" in ln]
        assert "CUDATRACE_BUDGET='8GiB'" in line and "CUDATRACE_GROUP='mine'" in line, line
    dra.unprepare([ClaimRef("ml", uid, name)])
    dra.close()
