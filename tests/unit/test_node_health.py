"""The node agent's health (cudatrace/deploy/agentserve.py): /healthz fails once no pass has ended
for three intervals (30 s at least), which a liveness probe restarts; a pass whose events the
API server cannot take ends anyway, the events kept for a later pass."""

from __future__ import annotations

import time

from cudatrace.deploy.agent import EVENT_REASON_DENIED, Agent, Config
from cudatrace.deploy.agentserve import health
from cudatrace.deploy.kube import KubeError
from cudatrace.deploy.procscan import Proc


def test_health_follows_the_passes():
    agent = Agent(Config(interval=2.0), say=lambda s: None, nvml=object())
    assert health(agent) == (503, "no pass has finished yet")
    agent.pass_ended = time.monotonic()
    assert health(agent) == (200, "ok")
    agent.pass_ended = time.monotonic() - 31
    code, why = health(agent)
    assert code == 503 and "no pass finished for 31 s (at most 30)" in why
    slow = Agent(Config(interval=20.0), say=lambda s: None, nvml=object())
    slow.pass_ended = time.monotonic() - 31
    assert health(slow) == (200, "ok")


class AwayKube:
    """Lists the node's pods (the container's, verified), cannot take Events."""

    def __init__(self):
        self.tries = 0

    def request(self, method, path, body=None):
        status = {
            "containerStatuses": [{"name": "main", "containerID": "containerd://" + "ab" * 32}]
        }
        meta = {"name": "trainer", "namespace": "ml", "uid": "5e1d2e4f-0000-4000-8000-00000000bbbb"}
        return {"items": [{"metadata": meta, "spec": {"nodeName": "n"}, "status": status}]}

    def post_event(self, ev):
        self.tries += 1
        raise KubeError("POST /api/v1/namespaces/ml/events: timed out", retryable=True)


class _Scan:
    def __init__(self, p):
        self.procs, self.unfenced = {p.pid: p}, []


def test_events_wait_while_the_api_server_is_away(tmp_path):
    said: list[str] = []
    kube = AwayKube()
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(
        f"0::/kubepods/pod5e1d2e4f-0000-4000-8000-00000000bbbb/{'ab' * 32}\n"
    )
    agent = Agent(Config(node="n", kube=kube, proc=tmp_path), say=said.append, nvml=object())
    p = Proc(pid=4242, ns_pid=7, start_ticks=1, pidns=1, container="ab" * 32, env={})
    agent._identify(_Scan(p), None)
    agent._tell(p, 7, EVENT_REASON_DENIED, "1 GPU memory allocation denied", 1)
    agent._tell(p, 7, EVENT_REASON_DENIED, "1 GPU memory allocation denied", 1)
    assert kube.tries == 1 and len(agent.events.waiting) == 2
    assert sum("trying again in 1 s" in s for s in said) == 1
