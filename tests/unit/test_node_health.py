"""The node agent's health (cudatrace/deploy/agent.py): /healthz fails once no pass has ended
for three intervals (30 s at least), which a liveness probe restarts; a pass whose events the
API server cannot take ends anyway, the events kept for a later pass."""

from __future__ import annotations

import time

from cudatrace.deploy.agent import EVENT_REASON_DENIED, Agent, Config, health
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
    def __init__(self):
        self.tries = 0

    def post_event(self, ev):
        self.tries += 1
        raise KubeError("POST /api/v1/namespaces/ml/events: timed out", retryable=True)


def test_events_wait_while_the_api_server_is_away():
    said: list[str] = []
    kube = AwayKube()
    agent = Agent(Config(node="n", kube=kube), say=said.append, nvml=object())
    p = Proc(pid=4242, ns_pid=7, start_ticks=1, pidns=1, container="ab" * 32,
             env={"CUDATRACE_K8S_NAMESPACE": "ml", "CUDATRACE_K8S_POD": "trainer"})  # fmt: skip
    agent._tell(p, 7, EVENT_REASON_DENIED, "1 GPU memory allocation denied", 1)
    agent._tell(p, 7, EVENT_REASON_DENIED, "1 GPU memory allocation denied", 1)
    assert kube.tries == 1 and len(agent.events.waiting) == 2
    assert sum("trying again in 1 s" in s for s in said) == 1
