"""What the DRA plugin makes of the node's GPUs and of a claim (cudatrace/deploy/dra.py): the
ResourceSlice and DeviceClass (valid Kubernetes objects), Kubernetes quantities, a claim's
budget per GPU, its CDI spec and the kubelet's devices, and prepare/unprepare on the files, with
the API server an object in this process (the gRPC and HTTPS paths: tests/integration/
test_dra_plugin.py)."""

from __future__ import annotations

import copy
import json
import stat

import pytest

from cudatrace import fence_record
from cudatrace.deploy import dra
from cudatrace.deploy.kube import KubeError
from support.kube import DRA_VERSION, K8S_VERSION, validate

GiB = 1 << 30
NODE = "gpu-node-1"
UID = "b07e4a52-5f0e-4c1a-9d3e-2f6b8a1c0d11"
POD_UID = "7d1c2b3a-0000-4000-8000-0000000000aa"
GPUS = [
    dra.Gpu(0, "GPU-5ca1ab1e-0000-4000-8000-000000000000", "NVIDIA H200", 141 * GiB),
    dra.Gpu(1, "GPU-5ca1ab1e-0000-4000-8000-000000000001", "NVIDIA H200", 141 * GiB),
]


def cfg(tmp_path=None, **kw) -> dra.PluginConfig:
    if tmp_path is not None:
        kw = dict(root=tmp_path / "root", state=tmp_path / "state", cdi_dir=tmp_path / "cdi", **kw)
    return dra.PluginConfig(node=NODE, **kw)


def claim(*results, uid=UID, owner=True) -> dict:
    """A ResourceClaim allocated on NODE: results (request, device, consumed memory or None)."""
    meta = {"name": "trainer-gpu", "namespace": "ml", "uid": uid}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "trainer",
                                    "uid": POD_UID, "controller": True,
                                    "blockOwnerDeletion": True}]  # fmt: skip
    out = []
    for request, device, memory in results:
        r = {"request": request, "driver": dra.DRIVER, "pool": NODE, "device": device}
        if memory is not None:
            r["consumedCapacity"] = {"memory": memory}
        out.append(r)
    requests = sorted({r[0] for r in results})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": {"requests": [
            {"name": n, "exactly": {"deviceClassName": dra.DEVICE_CLASS,
                                    "capacity": {"requests": {"memory": "8Gi"}}}}
            for n in requests]}},
        "status": {"allocation": {"devices": {"results": out}},
                   "reservedFor": [{"resource": "pods", "name": "trainer", "uid": POD_UID}]},
    }  # fmt: skip


REF = dra.ClaimRef("ml", UID, "trainer-gpu")


@pytest.mark.parametrize(
    "text,value",
    [("8Gi", 8 * GiB), ("8G", 8 * 10**9), ("1.5Gi", 3 * GiB // 2), ("8589934592", 8 * GiB),
     ("5e9", 5 * 10**9), ("100m", 1), ("1Ki", 1024), ("0.5Mi", 1 << 19), ("1E", 10**18)],
)  # fmt: skip
def test_quantities(text, value):
    assert dra.parse_quantity(text) == value


@pytest.mark.parametrize("text", ["8GiB", "-1Gi", "", "Gi", "8 Gi", "1e", "0x10"])
def test_quantities_refused(text):
    with pytest.raises(dra.DraError, match="quantity"):
        dra.parse_quantity(text)


def test_slice_and_class_are_valid_objects():
    s = dra.resource_slice(cfg(), GPUS, generation=3,
                           owner={"apiVersion": "v1", "kind": "Node", "name": NODE,
                                  "uid": POD_UID, "controller": True})  # fmt: skip
    for version in (K8S_VERSION, DRA_VERSION):
        validate(s, version)
        validate(dra.device_class(), version)
    spec = s["spec"]
    assert s["metadata"]["name"] == f"{NODE}-{dra.DRIVER}"
    assert spec["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 1}
    assert spec["driver"] == dra.DRIVER and spec["nodeName"] == NODE
    d0 = spec["devices"][0]
    assert d0["name"] == "gpu-0" and d0["allowMultipleAllocations"] is True
    assert d0["capacity"] == {"memory": {"value": str(141 * GiB)}}
    assert d0["attributes"]["uuid"] == {"string": GPUS[0].uuid}
    assert d0["attributes"]["index"] == {"int": 0}
    sel = dra.device_class()["spec"]["selectors"][0]["cel"]["expression"]
    assert sel == "device.driver == 'gpu.cudatrace.dev'"


def test_the_claim_example_is_a_valid_claim():
    validate(claim(("gpu", "gpu-0", "8Gi")), DRA_VERSION)


class FakeNvml:
    available = True
    why = ""

    def __init__(self, totals):
        self.totals = totals

    def memory(self):
        return [{"index": i, "total": t, "free": t, "used": 0} for i, t in enumerate(self.totals)]

    def uuids(self):
        return {i: f"GPU-{i}" for i in range(len(self.totals))}

    def names(self):
        return {0: "NVIDIA H200"}


def test_node_gpus_offer_nvml_totals_less_the_reserve():
    gpus = dra.node_gpus(FakeNvml([80 * GiB, 40 * GiB]), reserve=GiB)
    assert [(g.device, g.memory, g.uuid, g.product) for g in gpus] == [
        ("gpu-0", 79 * GiB, "GPU-0", "NVIDIA H200"),
        ("gpu-1", 39 * GiB, "GPU-1", ""),
    ]
    with pytest.raises(dra.DraError, match="nothing left"):
        dra.node_gpus(FakeNvml([GiB]), reserve=GiB)
    none = FakeNvml([])
    none.available, none.why = False, "no NVIDIA driver here"
    with pytest.raises(dra.DraError, match="no NVIDIA driver"):
        dra.node_gpus(none)


def test_claim_plan_budget_per_gpu():
    c = cfg()
    one = dra.claim_plan(claim(("gpu", "gpu-0", "8Gi")), REF, c, GPUS)
    assert one.per_gpu() == {0: 8 * GiB} and one.budget() == str(8 * GiB)
    assert one.pod == ("trainer", POD_UID)
    # two requests on one GPU add up; the same size on every GPU is one size
    two = dra.claim_plan(
        claim(("a", "gpu-0", "4Gi"), ("b", "gpu-0", "4Gi"), ("c", "gpu-1", "8Gi")), REF, c, GPUS
    )
    assert two.per_gpu() == {0: 8 * GiB, 1: 8 * GiB} and two.budget() == str(8 * GiB)
    # different sizes: per CUDA ordinal, in NVML's order
    mixed = dra.claim_plan(claim(("b", "gpu-1", "2Gi"), ("a", "gpu-0", "6Gi")), REF, c, GPUS)
    assert mixed.budget() == f"0={6 * GiB},1={2 * GiB}"
    # no consumed capacity (a cluster without consumable capacity): the whole device
    whole = dra.claim_plan(claim(("gpu", "gpu-1", None), owner=False), REF, c, GPUS)
    assert whole.budget() == str(141 * GiB) and whole.pod is None
    # another driver's devices are not ours
    other = claim(("gpu", "gpu-0", "8Gi"))
    other["status"]["allocation"]["devices"]["results"][0]["driver"] = "gpu.nvidia.com"
    assert dra.claim_plan(other, REF, c, GPUS).shares == ()


@pytest.mark.parametrize(
    "change,why",
    [
        (lambda o: o["metadata"].update(uid="other"), "deleted and made again"),
        (lambda o: o["status"].pop("allocation"), "not allocated"),
        (lambda o: o["status"]["allocation"]["devices"]["results"][0].update(pool="node-9"),
         "pool 'node-9'"),
        (lambda o: o["status"]["allocation"]["devices"]["results"][0].update(device="gpu-7"),
         "no device 'gpu-7'"),
        (lambda o: o["status"]["allocation"]["devices"]["results"][0].update(
            consumedCapacity={"memory": "512Ki"}), "a budget needs 1 MiB"),
        (lambda o: o["status"]["allocation"]["devices"]["results"][0].update(
            consumedCapacity={"memory": "lots"}), "not a Kubernetes quantity"),
    ],
)  # fmt: skip
def test_claims_that_cannot_be_prepared(change, why):
    c = claim(("gpu", "gpu-0", "8Gi"))
    change(c)
    with pytest.raises(dra.DraError, match=why):
        dra.claim_plan(c, REF, cfg(), GPUS)


def test_claim_spec_and_devices(tmp_path):
    from cudatrace.deploy.install import Installed

    c = cfg(tmp_path)
    plan = dra.claim_plan(claim(("gpu", "gpu-1", "8Gi"), ("aux", "gpu-0", "8Gi")), REF, c, GPUS)
    inst = Installed(tmp_path / "root", "0.1.0-0123456789ab")
    spec = dra.claim_spec(plan, c, inst)
    assert spec["kind"] == "cudatrace.dev/claim"
    assert spec["cdiVersion"] == "0.3.0"  # names beginning with a letter, no typed mount
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-0", f"{UID}-gpu-1"]
    assert all(d["containerEdits"] == {"env": ["CUDA_DEVICE_ORDER=PCI_BUS_ID"]}
               for d in spec["devices"])  # fmt: skip
    env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
    assert env["CUDATRACE_GROUP"] == UID and env["CUDATRACE_BUDGET"] == str(8 * GiB)
    assert env["CUDATRACE_LEDGER_DIR"] == "/run/cudatrace/ledger"
    assert env["CUDATRACE_ON_FENCE_ERROR"] == "refuse"
    assert env["CUDATRACE_K8S_NAMESPACE"] == "ml" and env["CUDATRACE_K8S_POD"] == "trainer"
    assert env["CUDATRACE_K8S_POD_UID"] == POD_UID
    mounts = {m["containerPath"]: m for m in spec["containerEdits"]["mounts"]}
    assert mounts["/run/cudatrace/ledger"]["hostPath"] == str(
        (tmp_path / "state").absolute() / "claims" / UID
    )
    assert mounts["/etc/ld.so.preload"]["hostPath"] == str(inst.preload)
    # the claim's sealed record, read-only where the preload library reads it
    assert (
        mounts["/etc/cudatrace/fence"]["hostPath"]
        == str((tmp_path / "state").absolute() / "fences" / f"claim-{UID}")
        and "ro" in mounts["/etc/cudatrace/fence"]["options"]
    )
    rec = fence_record.parse(dra.claim_record(plan, c))
    assert (rec.group, rec.budget, rec.ledger_dir) == (UID, str(8 * GiB), "/run/cudatrace/ledger")
    assert rec.owner == f"claim ml/trainer-gpu ({UID})" and rec.on_fence_error == "refuse"
    # the kubelet's devices: one per allocation result, the GPU's own CDI device first
    assert dra.prepared(plan, c).devices == (
        (("gpu",), NODE, "gpu-1", ("nvidia.com/gpu=1", f"cudatrace.dev/claim={UID}-gpu-1")),
        (("aux",), NODE, "gpu-0", ("nvidia.com/gpu=0", f"cudatrace.dev/claim={UID}-gpu-0")),
    )
    bare = cfg(tmp_path, gpu_cdi="", vendor="t.cudatrace.dev")
    assert dra.prepared(plan, bare).devices[0][3] == (f"t.cudatrace.dev/claim={UID}-gpu-1",)
    by_uuid = cfg(tmp_path, gpu_cdi="example.com/gpu={uuid}")
    assert dra.prepared(plan, by_uuid).devices[0][3][0] == f"example.com/gpu={GPUS[1].uuid}"


def test_a_uid_beginning_with_a_digit_needs_cdi_0_5(tmp_path):
    from cudatrace.deploy.install import Installed

    uid = "9" + UID[1:]
    ref = dra.ClaimRef("ml", uid, "trainer-gpu")
    plan = dra.claim_plan(claim(("gpu", "gpu-0", "8Gi"), uid=uid), ref, cfg(), GPUS)
    spec = dra.claim_spec(plan, cfg(tmp_path), Installed(tmp_path, "0.1.0-0123456789ab"))
    assert spec["cdiVersion"] == "0.5.0"


class FakeKube:
    """The API server as dra.Plugin asks it: GET of an object by path."""

    def __init__(self):
        self.objects: dict[str, dict] = {}

    def request(self, method, path, body=None, retry=None, check=None):
        assert method == "GET", method
        if path not in self.objects:
            raise KubeError(f"GET {path}: HTTP 404", 404)
        obj = copy.deepcopy(self.objects[path])
        if check is not None:
            check(obj)
        return obj


def claim_path(ref: dra.ClaimRef) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{ref.namespace}/resourceclaims/{ref.name}"


def test_prepare_and_unprepare_files(tmp_path):
    kube = FakeKube()
    kube.objects[claim_path(REF)] = claim(("gpu", "gpu-0", "8Gi"))
    said = []
    plugin = dra.Plugin(cfg(tmp_path), GPUS, kube, said.append)
    plugin.setup()
    missing = dra.ClaimRef("ml", "1" + UID[1:], "gone")
    bad = dra.ClaimRef("ML/../x", "2" + UID[1:], "c")
    out = plugin.prepare([REF, missing, bad])
    assert isinstance(out[REF.uid], dra.Prepared)
    assert "HTTP 404" in out[missing.uid] and "not a namespace and a name" in out[bad.uid]
    spec_file = tmp_path / "cdi" / f"cudatrace.dev-claim-{UID}.json"
    spec = json.loads(spec_file.read_text())
    assert spec["devices"][0]["name"] == f"{UID}-gpu-0"
    ledger = tmp_path / "state" / "claims" / UID
    assert stat.S_IMODE(ledger.stat().st_mode) == 0o1777
    record = tmp_path / "state" / "fences" / f"claim-{UID}"
    assert fence_record.parse(record.read_text()).group == UID
    assert stat.S_IMODE(record.stat().st_mode) == 0o644
    assert any("prepared: 8589934592 bytes of GPU 0" in s for s in said), said
    # again: the same answer, the same file
    assert plugin.prepare([REF])[REF.uid] == out[REF.uid]
    assert plugin.unprepare([REF, missing]) == {REF.uid: "", missing.uid: ""}
    assert not spec_file.exists() and not ledger.exists() and not record.exists()


def test_sweep_removes_directories_of_claims_not_prepared(tmp_path):
    plugin = dra.Plugin(cfg(tmp_path), GPUS, FakeKube(), lambda s: None)
    plugin.setup()
    left = tmp_path / "state" / "claims" / UID
    left.mkdir()
    kept = tmp_path / "state" / "claims" / ("1" + UID[1:])
    kept.mkdir()
    (tmp_path / "cdi" / f"cudatrace.dev-claim-{kept.name}.json").write_text("{}")
    plugin.sweep()
    assert not left.exists() and kept.exists()


def test_no_api_server_is_said():
    plugin = dra.Plugin(cfg(), GPUS, None, lambda s: None)
    assert "no API server" in plugin.prepare([REF])[REF.uid]


@pytest.mark.parametrize(
    "change,why",
    [
        (lambda o: o.pop("metadata"), "the ResourceClaim has no metadata.uid"),
        (lambda o: o["metadata"].update(uid=7), "metadata.uid is not a str"),
        (lambda o: o["metadata"].update(ownerReferences={"kind": "Pod"}), "ownerReferences is not"),
        (lambda o: o["status"]["allocation"].update(devices=[]), "devices is not a dict"),
        (lambda o: o["status"]["allocation"]["devices"].update(results={}), "results is not a list"),
        (lambda o: o["status"]["allocation"]["devices"]["results"].append("gpu-0"),
         "results.1 is not a dict"),
        (lambda o: o.update(status=["allocated"]), "status is not a dict"),
        (lambda o: o["status"]["allocation"]["devices"]["results"][0].update(device=0),
         "results.0.device is not a str"),
        (lambda o: o["status"]["allocation"]["devices"]["results"][0].update(
            consumedCapacity={"memory": ["8Gi"]}), "consumedCapacity.memory is not a str or int"),
    ],
)  # fmt: skip
def test_claims_the_api_server_answered_askew_are_refused_not_raised(tmp_path, change, why):
    """An answer that is not a ResourceClaim as read: the claim is refused with the field
    named, the plugin goes on (a KeyError or TypeError before)."""
    kube = FakeKube()
    c = claim(("gpu", "gpu-0", "8Gi"))
    change(c)
    kube.objects[claim_path(REF)] = c
    said = []
    plugin = dra.Plugin(cfg(tmp_path), GPUS, kube, said.append)
    plugin.setup()
    out = plugin.prepare([REF])
    assert isinstance(out[REF.uid], str) and why in out[REF.uid], out
    assert said and "not prepared" in said[-1]
