"""The Kubernetes client of the node agent and the DRA plugin (cudatrace/deploy/kube.py) against
the suite's fake API server (tests/support/kube.py) answering what a real one, or a proxy in
front of it, may: an answer that is not JSON, not an object, without the field read, a 503;
each a KubeError (retryable), never a KeyError, and tried again as asked. Events wait while the
API server is away; scrapes of the agent's metrics are authorized by token and access reviews."""

from __future__ import annotations

import time

import pytest

from cudatrace.deploy.kube import (
    Authorizer,
    Backoff,
    EventQueue,
    Kube,
    KubeError,
    PodContainer,
    Retry,
    need,
    pod_event,
)
from support.kube import FakeApiServer

NODE = "/api/v1/nodes/n1"


@pytest.fixture
def api(tmp_path):
    server = FakeApiServer(tmp_path)
    server.put(NODE, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "uid": "u"}})
    yield server
    server.close()


def kube(api) -> Kube:
    return Kube(api.url, api.token_file, api.ca_file, timeout=5)


@pytest.mark.parametrize(
    "status,raw,why",
    [
        (200, b"<html>a proxy's page</html>", "the answer is not JSON"),
        (200, b"[1, 2]", "the answer is not a JSON object"),
        (200, b"[" * 50000 + b"]" * 50000, "the answer is not JSON"),
        (503, b"etcd is away", "HTTP 503"),
        (429, b"slow down", "HTTP 429"),
    ],
)
def test_answers_that_cannot_be_used_are_retryable_errors(api, status, raw, why):
    api.answer("GET", NODE, status, raw)
    with pytest.raises(KubeError, match=why) as e:
        kube(api).request("GET", NODE)
    assert e.value.retryable
    assert kube(api).request("GET", NODE)["metadata"]["uid"] == "u"  # the next answer is whole


def test_refusals_are_not_retried(api):
    said: list[str] = []
    with pytest.raises(KubeError) as e:
        kube(api).request("GET", "/api/v1/nodes/n9", retry=Retry(3, 0.01, say=said.append))
    assert e.value.code == 404 and not e.value.retryable and said == []
    bad = Kube(api.url, api.token_file.parent / "missing", api.ca_file)
    with pytest.raises(KubeError, match="cannot read the token"):
        bad.request("GET", NODE)


def test_retries_with_growing_pauses_said_in_the_log(api):
    said: list[str] = []
    api.answer("GET", NODE, 502, b"", times=2)
    t0 = time.monotonic()
    got = kube(api).request("GET", NODE, retry=Retry(3, 0.1, say=said.append))
    assert got["metadata"]["name"] == "n1" and time.monotonic() - t0 >= 0.3
    assert [s.split("; ")[1] for s in said] == ["trying again in 0.1 s (2/3)",
                                                "trying again in 0.2 s (3/3)"]  # fmt: skip
    # the answer as expected, or tried again like a failure
    api.answer("GET", NODE, 200, b'{"kind": "Node"}', times=3)
    with pytest.raises(KubeError, match="node n1 has no metadata.uid"):
        kube(api).request("GET", NODE, retry=Retry(3, 0.01),
                          check=lambda o: need(o, "metadata", "uid", what="node n1"))  # fmt: skip
    assert kube(api).request("GET", NODE, check=lambda o: need(o, "metadata", "uid"))


def test_need_names_what_is_missing_or_wrong():
    obj = {"metadata": {"uid": "u", "labels": ["x"]}, "items": [{"a": 1}]}
    assert need(obj, "metadata", "uid") == "u" and need(obj, "items", 0, "a", typ=int) == 1
    for path, typ, why in [
        (("spec", "pool"), dict, "the answer has no spec.pool"),
        (("metadata", "labels", "app"), str, "has no metadata.labels.app"),
        (("items", 3), dict, "has no items.3"),
        (("metadata", "uid"), int, "metadata.uid is not a int"),
    ]:
        with pytest.raises(KubeError, match=why) as e:
            need(obj, *path, typ=typ)
        assert e.value.retryable


def test_backoff():
    b = Backoff(1, 8)
    assert [b.failed() for _ in range(5)] == [1, 2, 4, 8, 8]
    b.ok()
    assert b.failed() == 1


def event(pod: str) -> dict:
    return pod_event(PodContainer("team", pod, "main"), "GPUMemoryBudgetExceeded", "m", "n1")


def test_events_wait_while_the_api_server_is_away(api):
    said: list[str] = []
    q = EventQueue(kube(api), said.append, most=3)
    api.answer("POST", "/api/v1/namespaces/team/events", 503, b"", times=1)
    q.post(event("a"))
    assert len(q.waiting) == 1 and "trying again in 1 s" in said[-1]
    tried = len(api.events())
    q.post(event("b"))  # within the pause: kept, not tried
    assert len(q.waiting) == 2 and len(api.events()) == tried
    for p in "cd":
        q.post(event(p))
    assert [e["involvedObject"]["name"] for e in q.waiting] == ["b", "c", "d"] and q.dropped == 1
    q.next_try = 0
    q.flush()
    assert [e["involvedObject"]["name"] for e in api.events()[tried:]] == ["b", "c", "d"]
    assert not q.waiting and said[-1] == "the API server takes events again"
    # refused for good (here: 403): dropped and said, the next one goes
    api.answer("POST", "/api/v1/namespaces/team/events", 403, b"forbidden", times=1)
    q.post(event("e"))
    q.post(event("f"))
    assert "HTTP 403" in said[-1] and api.events()[-1]["involvedObject"]["name"] == "f"


def test_scrapes_are_authorized_by_token_and_access_reviews(api):
    auth = Authorizer(kube(api))
    prom = "system:serviceaccount:monitoring:prometheus"
    api.users = {"good": {"username": prom, "groups": ["system:serviceaccounts"]},
                 "other": {"username": "system:serviceaccount:team:app"}}  # fmt: skip
    api.allowed = {(prom, "/metrics")}
    assert auth.check("Bearer good", "/metrics") == (200, prom)
    code, why = auth.check("Bearer other", "/metrics")
    assert code == 403 and "team:app may not get /metrics" in why
    code, why = auth.check("Bearer forged", "/metrics")
    assert code == 401 and "not valid" in why
    assert auth.check("", "/metrics")[0] == 401 and auth.check("Basic eA==", "/metrics")[0] == 401
    # decisions are kept: no review for a token seen
    n = len(api.requests)
    assert auth.check("Bearer good", "/metrics")[0] == 200 and len(api.requests) == n
    # the API server cannot say: 503, and not kept
    api.answer("POST", "/apis/authentication.k8s.io/v1/tokenreviews", 500, b"", times=1)
    assert auth.check("Bearer new", "/metrics")[0] == 503
    api.users["new"] = {"username": prom}
    assert auth.check("Bearer new", "/metrics") == (200, prom)
