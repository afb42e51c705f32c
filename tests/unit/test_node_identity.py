"""Identities the node can verify (cudatrace/cgroups.py, cudatrace/deploy/identity.py): a
process's container and pod read from its cgroup path in every runtime's naming, cgroup v1 and
v2; the container is the outermost one named (what a container may write below its own scope
never changes it); the node's pods index their containers; the environment is only checked."""

from __future__ import annotations

import pytest

from cudatrace import cgroups
from cudatrace.deploy.identity import PodIndex, PodRef, _mismatch, index_pods

UID = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0"
CID = "3b" * 32
OTHER = "c0" * 32


@pytest.mark.parametrize(
    ("text", "runtime", "pod"),
    [
        # containerd, systemd driver, cgroup v2
        (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope", "containerd", UID),
        # a Guaranteed pod (no QoS slice), v1 hierarchies
        (f"12:memory:/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
         f"1:name=systemd:/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope", "containerd", UID),
        # CRI-O
        (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope", "cri-o", UID),
        # cgroupfs driver: /kubepods/<qos>/pod<uid>/<id>
        (f"4:memory:/kubepods/burstable/pod{UID}/{CID}", "kubernetes", UID),
        (f"4:memory:/kubepods/pod{UID}/crio-{CID}", "cri-o", UID),
        # seen through a cgroup namespace
        (f"0::/../../kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope", "containerd", UID),
        # Podman: systemd, cgroupfs, rootless
        (f"0::/machine.slice/libpod-{CID}.scope", "podman", ""),
        (f"4:memory:/libpod_parent/libpod-{CID}", "podman", ""),
        (f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container", "podman", ""),
        # Docker
        (f"0::/system.slice/docker-{CID}.scope", "docker", ""),
        (f"4:memory:/docker/{CID}", "docker", ""),
    ],
)  # fmt: skip
def test_runtimes_naming(text, runtime, pod):
    assert cgroups.parse(text) == cgroups.CgroupIdentity(CID, runtime, pod)


def test_what_a_container_writes_below_its_own_scope_changes_nothing():
    """A container that may write its cgroup (systemd inside, a privileged one) makes a child
    named after another container, or another pod: the outer names stand."""
    base = (
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope"
    )
    assert cgroups.parse(f"{base}/cri-containerd-{OTHER}.scope").container == CID
    assert cgroups.parse(f"{base}/pod{'1' * 8}-0000-4000-8000-{'2' * 12}/{OTHER}").pod_uid == UID


def test_no_container_and_conmon_are_none():
    for text in ("0::/user.slice/user-1000.slice/session-3.scope", "0::/",
                 f"0::/machine.slice/libpod-conmon-{CID}.scope",
                 f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-conmon-{CID}.scope",
                 f"0::/init.scope/{CID}"):  # fmt: skip
        assert cgroups.parse(text).container == "", text


def test_hierarchies_that_disagree_are_no_identity():
    text = f"4:memory:/docker/{CID}\n1:name=systemd:/docker/{OTHER}"
    assert cgroups.parse(text) == cgroups.CgroupIdentity(conflict=True)


def _pod(cid=CID, node="n1", uid=UID, name="trainer"):
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid}, "spec": {"nodeName": node},
            "status": {"containerStatuses": [{"name": "main", "containerID": f"cri-o://{cid}"}],
                       "initContainerStatuses": [{"name": "init", "containerID": f"containerd://{OTHER}"}]}}  # fmt: skip


def test_the_index_takes_this_nodes_pods_and_passes_over_what_is_not_a_pod():
    items = [_pod(), _pod(cid="d" * 64, node="n2"), {"metadata": None}, "x", {"status": {"containerStatuses": [{"containerID": 7}]}}]  # fmt: skip
    got = index_pods(items, "n1")
    assert got == {CID: PodRef("ml", "trainer", UID, "main", "n1"),
                   OTHER: PodRef("ml", "trainer", UID, "init", "n1")}  # fmt: skip
    assert index_pods({"not": "a list"}, "n1") == {}


def test_the_node_is_listed_again_only_for_an_unknown_container(monkeypatch):
    class Kube:
        lists = 0

        def request(self, method, path, body=None):
            Kube.lists += 1
            return {"items": [_pod()]}

    clock = [1000.0]
    monkeypatch.setattr("cudatrace.deploy.identity.time.monotonic", lambda: clock[0])
    idx = PodIndex(Kube(), "n1", lambda s: None)
    assert idx.lookup(CID).pod == "trainer" and Kube.lists == 1
    assert idx.lookup(CID) and idx.lookup("e" * 64) is None and Kube.lists == 1
    clock[0] += 6  # past UNKNOWN_S: an unknown container lists again, a known one does not
    assert idx.lookup(CID) and Kube.lists == 1
    assert idx.lookup("e" * 64) is None and Kube.lists == 2


def test_an_environment_is_only_checked():
    ref = PodRef("ml", "trainer", UID, "main", "n1")
    assert _mismatch({}, ref, CID) == ""
    assert _mismatch({"K8S_NAMESPACE": "ml", "K8S_POD": "trainer"}, ref, CID) == ""
    said = _mismatch({"K8S_NAMESPACE": "kube-system", "K8S_POD": "coredns-1"}, ref, CID)
    assert "kube-system/coredns-1" in said and "it is pod ml/trainer" in said
    said = _mismatch({"K8S_NAMESPACE": "kube-system", "K8S_POD": "coredns-1"}, None, "")
    assert said == "its environment names pod kube-system/coredns-1, but it runs in no container"
