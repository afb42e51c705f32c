"""The Pod Events the node agent posts (cudatrace/deploy/agent.py) name a pod only where the API
server verified it: the process's cgroup names its container (and pod), the node's pod list has
that container id (deploy/identity.py). The pod's uid and the container's name are the API
server's, whatever the process's environment says; an environment naming another pod (a
spoofing process: no container, or another one) gets no Event at all."""

from __future__ import annotations

from pathlib import Path

from cudatrace.deploy.agent import EVENT_REASON_DENIED, Agent, Config
from cudatrace.deploy.procscan import Proc
from support.kube import validate

POD_UID = "5e1d2e4f-0000-4000-8000-00000000bbbb"
CID = "ab" * 32
CGROUP = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
    f"{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
)


class Kube:
    """The API server: this node's pods, and the Events posted."""

    def __init__(self, pods):
        self.events, self.pods, self.lists = [], pods, 0

    def request(self, method, path, body=None):
        assert method == "GET" and path.startswith("/api/v1/pods?fieldSelector=spec.nodeName")
        self.lists += 1
        return {"kind": "PodList", "items": self.pods}

    def post_event(self, ev):
        self.events.append(ev)
        return ev


def pod(name="trainer", ns="ml", uid=POD_UID, cid=CID, node="gpu-node-1", container="main"):
    return {
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"nodeName": node},
        "status": {
            "containerStatuses": [{"name": container, "containerID": f"containerd://{cid}"}]
        },
    }


def tell(tmp_path: Path, env: dict, cgroup: str = CGROUP, pods=None) -> list[dict]:
    (tmp_path / "4242").mkdir(parents=True)
    (tmp_path / "4242" / "cgroup").write_text(cgroup)
    kube = Kube([pod()] if pods is None else pods)
    agent = Agent(Config(node="gpu-node-1", kube=kube, proc=tmp_path), say=lambda s: None,
                  nvml=object())  # fmt: skip
    p = Proc(pid=4242, ns_pid=7, start_ticks=1, pidns=1, container=CID, env=env)
    agent._identify(_Scan(p), None)
    agent._tell(p, 7, EVENT_REASON_DENIED, "1 GPU memory allocation denied", 1)
    for ev in kube.events:
        validate(ev)
    return kube.events


class _Scan:
    def __init__(self, p):
        self.procs, self.unfenced = {p.pid: p}, []


def test_a_verified_container_gets_its_pods_event(tmp_path):
    (ev,) = tell(tmp_path, {})
    assert ev["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "ml",
                                    "name": "trainer", "uid": POD_UID,
                                    "fieldPath": "spec.containers{main}"}  # fmt: skip


def test_the_environment_never_names_the_pod(tmp_path):
    """The webhook's variables that agree change nothing; ones that name another pod are a
    mismatch: the verified pod is still the one told."""
    env = {"CUDATRACE_K8S_NAMESPACE": "kube-system", "CUDATRACE_K8S_POD": "coredns-1"}
    (ev,) = tell(tmp_path, env)
    assert ev["involvedObject"]["name"] == "trainer" and ev["metadata"]["namespace"] == "ml"


def test_a_spoofing_process_without_a_container_gets_no_event(tmp_path):
    env = {"CUDATRACE_K8S_NAMESPACE": "kube-system", "CUDATRACE_K8S_POD": "coredns-1",
           "CUDATRACE_K8S_POD_UID": POD_UID, "CUDATRACE_GROUP": POD_UID}  # fmt: skip
    assert tell(tmp_path, env, cgroup="0::/user.slice/user-1000.slice/session-3.scope\n") == []


def test_a_container_of_no_pod_of_this_node_gets_no_event(tmp_path):
    assert tell(tmp_path / "a", {}, pods=[pod(node="gpu-node-2")]) == []
    assert tell(tmp_path / "b", {}, pods=[pod(cid="cd" * 32)]) == []


def test_a_cgroup_naming_another_pod_than_the_list_is_not_verified(tmp_path):
    other = "99999999-0000-4000-8000-000000000000"
    assert tell(tmp_path, {}, pods=[pod(uid=other)]) == []


def test_an_event_waits_for_a_container_the_kubelet_has_not_listed_yet(tmp_path, monkeypatch):
    """The kubelet writes a new container's id into its pod's status a moment after it starts:
    an Event about it waits for its pod (then goes to it), up to VERIFY_WAIT_S."""
    from cudatrace.deploy import identity

    clock = [1000.0]
    monkeypatch.setattr(identity.time, "monotonic", lambda: clock[0])
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(CGROUP)
    kube = Kube([])
    said = []
    agent = Agent(Config(node="gpu-node-1", kube=kube, proc=tmp_path), say=said.append,
                  nvml=object())  # fmt: skip
    p = Proc(pid=4242, ns_pid=7, start_ticks=1, pidns=1, container=CID, env={})
    agent._identify(_Scan(p), None)
    agent._tell(p, 7, EVENT_REASON_DENIED, "1 GPU memory allocation denied", 1)
    assert kube.events == [] and said[-1].startswith(f"container {CID[:12]}: 1 GPU memory")
    kube.pods = [pod()]
    clock[0] += 1  # not listed again yet (at most every UNKNOWN_S)
    agent._identify(_Scan(p), None)
    assert kube.events == []
    clock[0] += identity.UNKNOWN_S
    agent._identify(_Scan(p), None)
    (ev,) = kube.events
    assert ev["involvedObject"]["name"] == "trainer"
    agent._identify(_Scan(p), None)
    assert len(kube.events) == 1  # sent once
