"""The Pod Events the node agent posts (cudatrace/deploy/agent.py) name the right pod: the pod's
uid is the group's where the webhook fenced the pod (its group is the pod's uid), and the one
the DRA plugin told the container where a claim fenced it (its group is the claim's uid); the
container's name only where the webhook gave it (a DRA container's is not known)."""

from __future__ import annotations

from cudatrace.deploy.agent import EVENT_REASON_DENIED, Agent, Config
from cudatrace.deploy.procscan import Proc
from support.kube import validate

CLAIM_UID = "a1b2c3d4-0000-4000-8000-000000000001"
POD_UID = "5e1d2e4f-0000-4000-8000-00000000bbbb"


class Kube:
    def __init__(self):
        self.events = []

    def post_event(self, ev):
        self.events.append(ev)
        return ev


def tell(env: dict) -> dict:
    kube = Kube()
    agent = Agent(Config(node="gpu-node-1", kube=kube), say=lambda s: None, nvml=object())
    p = Proc(pid=4242, ns_pid=7, start_ticks=1, pidns=1, container="ab" * 32, env=env)
    agent._tell(p, 7, EVENT_REASON_DENIED, "1 GPU memory allocation denied", 1)
    (ev,) = kube.events
    validate(ev)
    return ev["involvedObject"]


def test_a_dra_claims_denial_names_the_claims_pod():
    involved = tell({"CUDATRACE_GROUP": CLAIM_UID, "CUDATRACE_K8S_NAMESPACE": "ml",
                     "CUDATRACE_K8S_POD": "trainer", "CUDATRACE_K8S_POD_UID": POD_UID})  # fmt: skip
    assert involved == {"apiVersion": "v1", "kind": "Pod", "namespace": "ml", "name": "trainer",
                        "uid": POD_UID}  # fmt: skip


def test_a_patched_pods_denial_names_its_container():
    involved = tell({"CUDATRACE_GROUP": POD_UID, "CUDATRACE_K8S_NAMESPACE": "ml",
                     "CUDATRACE_K8S_POD": "trainer", "CUDATRACE_K8S_CONTAINER": "main"})  # fmt: skip
    assert involved["uid"] == POD_UID and involved["fieldPath"] == "spec.containers{main}"
