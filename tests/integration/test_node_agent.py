"""`cudatrace node` with real Podman containers (tests/support/podman.py): the agent counts the
CUDA contexts of members in other pid namespaces (the simulated NVML names host pids, as the
real one does: CUDASIM_HOST_PROC), serves the budgets' metrics with namespace/pod/container
labels, and posts a denial as a Pod Event. No API server can run here: the Events go to a tiny
fake one over HTTPS (tests/support/kube.py), which checks the token and records them; the
Event is then validated against Kubernetes' schema.

Needs root (rootful Podman); with CI=true a missing piece fails, elsewhere it skips."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from support import children
from support.cli import checkout_env
from support.kube import FakeApiServer, validate
from support.kube import pod as kube_pod
from support.podman import podman  # noqa: F401  (fixture)

MiB = 1 << 20
# the budget group of this test's own: an agent sees every ledger of the host, other tests'
# agents' groups too, and a name two of them share is labelled by whichever it meets first
GROUP = f"train{os.getpid()}"
CDI_DIR = Path("/var/run/cdi")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def series(metrics, name: str, **labels) -> list[float]:
    want = set(labels.items())
    return [v for (n, ls), v in metrics.items() if n == name and want <= set(ls)]


def wait_for(fn, timeout: float, what: str, log=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; the agent said:\n{''.join(log)}")


def ready(p: subprocess.Popen) -> str:
    lines = []
    for line in children.lines(p):
        lines.append(line)
        if line.strip() == "ready":
            return "".join(lines)
    raise AssertionError(f"no ready: {lines} {children.said(p)}")


@pytest.fixture
def node_agent(podman, sim, tmp_path):  # noqa: F811
    """A factory: start(*extra) runs `cudatrace node` (these extra options) on a node of its own
    (root, state, CDI vendor, groups: GROUP = 1 GiB) with a fake API server."""
    base = tmp_path / "node"
    base.mkdir()
    base.chmod(0o755)
    vendor = f"a{os.getpid()}-{os.urandom(3).hex()}.cudatrace.dev"
    groups = base / "groups.conf"
    groups.write_text(f"[{GROUP}]\nbudget = 1GiB\n")
    api = FakeApiServer(tmp_path)
    state = sim.new_state()
    state.touch(mode=0o666)
    procs = []

    def start(*extra, ctx_bytes=300 * MiB):
        port = free_port()
        env = checkout_env(sim.env(state=state, ctx_bytes=ctx_bytes))
        cmd = [sys.executable, "-m", "cudatrace", "node", "--root", base / "root", "--state",
               base / "state", "--cdi-dir", CDI_DIR, "--vendor", vendor, "--groups", groups,
               "--budget", "1GiB", "--listen", f"127.0.0.1:{port}", "--interval", "0.2",
               "--kube-api", api.url, "--kube-token", api.token_file, "--kube-ca", api.ca_file,
               "--node-name", NODE, *extra]  # fmt: skip
        proc = children.popen([str(c) for c in cmd], env=env, stderr=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, text=True)  # fmt: skip
        procs.append(proc)
        log = []
        for line in children.lines(proc, proc.stderr):
            log.append(line)
            if "serving metrics" in line:
                break
        else:
            raise AssertionError("".join(log))
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()

        def host(prog: str, *a, **claims):
            """A program of the host (no container, no library) on this node's GPU, these
            variables in its environment."""
            e = dict(checkout_env(sim.env(state=state, ctx_bytes=ctx_bytes)), **claims)
            return children.popen([str(sim.progs[prog]), *map(str, a)], env=e,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip

        return {"url": f"http://127.0.0.1:{port}/metrics", "vendor": vendor, "state": state,
                "api": api, "log": lines, "base": base, "host": host}  # fmt: skip

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)
    api.close()
    for kind in ("budget", "group"):
        (CDI_DIR / f"{vendor}-{kind}.json").unlink(missing_ok=True)


@pytest.fixture
def agent(node_agent):
    return node_agent()


NODE = "gpu-node-1"


def in_pod(podman, api, ns: str, pod_name: str, container: str, *args, name: str):  # noqa: F811
    """A container created first (its id known), listed by the fake API server as `container`
    of pod ns/pod_name on this node, then started: (its process, its id)."""
    r = podman.podman("create", "--rm", "--network=none", "--name", name, *args)
    cid = r.stdout.strip().splitlines()[-1]
    assert len(cid) == 64, r.stdout
    api.put_pod(kube_pod(ns, pod_name, NODE, {container: cid}))
    p = children.popen(podman.cmd("start", "--attach", name), env=podman.env(),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    return p, cid


def pod_env(ns: str, pod: str, container: str) -> list[str]:
    return ["-e", f"CUDATRACE_K8S_NAMESPACE={ns}", "-e", f"CUDATRACE_K8S_POD={pod}",
            "-e", f"CUDATRACE_K8S_CONTAINER={container}"]  # fmt: skip


def test_agent_counts_contexts_in_containers_labels_metrics_and_posts_denials(
    podman,  # noqa: F811
    agent,
):
    """Two pods' containers in one group: the first's context counted, the second denied, its
    pod sent one Event. Beside them runs what once disturbed this test (the agent scans every
    process of the host, other tests' included): a process of the host whose environment names
    the second pod and the group, using the GPU without the library. Only what the cgroup
    names and the API server lists is a pod, so it is said (by pid) and sent nothing."""
    dev = f"{agent['vendor']}/group={GROUP}"
    sim_args = podman.sim_args(agent["state"], ctx_bytes=300 * MiB)
    a_name, b_name = podman.name(), podman.name()
    api = agent["api"]
    # pods the API server lists with these containers: their labels and Events name them
    a, _ = in_pod(podman, api, "team", "trainer-0", "main", "--device", dev, *sim_args,
                  *pod_env("team", "trainer-0", "main"), podman.image, "hold", "1", "300m",
                  name=a_name)  # fmt: skip
    b = None
    try:
        ready(a)
        # the agent finds A's host pid and counts its 300 MiB context in the group's ledger
        m = wait_for(
            lambda: (
                lambda ms: (
                    ms
                    if series(ms, "cudatrace_budget_context_bytes", group=GROUP) == [300 * MiB]
                    else None
                )
            )(scrape(agent["url"])),
            60,
            "the context of the container's member to be counted",
            agent["log"],
        )
        assert series(m, "cudatrace_budget_in_use_bytes", group=GROUP) == [600 * MiB]
        held = series(m, "cudatrace_budget_member_in_use_bytes", group=GROUP,
                      namespace="team", pod="trainer-0", container="main")  # fmt: skip
        assert held == [600 * MiB], m
        spoof = agent["host"]("hold", "1", "16m", CUDATRACE_GROUP=GROUP,
                              **dict(zip(("CUDATRACE_K8S_NAMESPACE", "CUDATRACE_K8S_POD",
                                          "CUDATRACE_K8S_CONTAINER"), ("team", "trainer-1", "main"))))  # fmt: skip
        ready(spoof)
        told = f"pid {spoof.pid}: a process given the budget group {GROUP} uses CUDA without"
        wait_for(
            lambda: told in "".join(agent["log"]), 30, "the spoofing process said", agent["log"]
        )
        # B, another pod on the node: 500 MiB fit beside A's 300 MiB of allocations, not beside
        # its context too
        b, b_cid = in_pod(podman, api, "team", "trainer-1", "main", "--device", dev, *sim_args,
                      *pod_env("team", "trainer-1", "main"), podman.image, "hold", "1", "500m",
                      name=b_name)  # fmt: skip
        out = ready(b)
        assert "alloc cuMemAlloc_v2 524288000 0x0 2" in out, out
        wait_for(lambda: agent["api"].events(), 60, "the denial's Pod Event", agent["log"])
        time.sleep(1.0)  # five passes more: any other Event would be there by now
        events = agent["api"].events()
        assert len(events) == 1, [(e["reason"], e["involvedObject"]["name"]) for e in events]
        (ev,) = events
        assert ev["reason"] == "GPUMemoryBudgetExceeded" and ev["type"] == "Warning"
        assert ev["involvedObject"]["name"] == "trainer-1"
        assert ev["involvedObject"]["namespace"] == "team"
        assert ev["involvedObject"]["fieldPath"] == "spec.containers{main}"
        assert (
            ev["involvedObject"]["uid"]
            == api.objects["/api/v1/namespaces/team/pods/trainer-1"]["metadata"]["uid"]
        )
        assert "denied on device 0: budget 1.00 GiB, in use " in ev["message"], ev["message"]
        assert ev["source"]["host"] == "gpu-node-1"
        validate(ev)
        # said at once, naming the container (its pod was listed after: the Event waited)
        assert any(b_cid[:12] in l and "denied" in l for l in agent["log"]), agent["log"]
        m = scrape(agent["url"])
        assert series(m, "cudatrace_budget_member_denials_total", group=GROUP,
                      pod="trainer-1", container="main") == [1.0], m  # fmt: skip
        assert series(m, "cudatrace_budget_members", group=GROUP) == [2.0]
        mismatch = f"pid {spoof.pid}: its environment names pod team/trainer-1, but it runs in no container"
        assert mismatch in "".join(agent["log"]), agent["log"]
        assert spoof.poll() is None  # said, not stopped: no --enforce
    finally:
        podman.remove(a_name)
        podman.remove(b_name)
        a.communicate(timeout=60)
        if b is not None:
            _, err = b.communicate(timeout=60)
            want = (
                "in use 600.00 MiB (allocations 300.00 MiB, CUDA contexts 300.00 MiB of 1 process)"
            )
            assert want in err and "at hold_alloc" in err, err


def test_agent_labels_a_container_budget_by_its_container(podman, agent):  # noqa: F811
    """A container's own budget (budget=1GiB: a ledger in its own tmpfs, which the agent reads
    through the member's mapping): its group label and member labels name the container."""
    name = podman.name()
    p = podman.popen("--device", f"{agent['vendor']}/budget=1GiB", *podman.sim_args(agent["state"]),
                     podman.image, "hold", "1", "100m", name=name)  # fmt: skip
    try:
        ready(p)
        cid = podman.podman("inspect", "--format", "{{.Id}}", name).stdout.strip()[:12]

        def seen():
            ms = scrape(agent["url"])
            return ms if series(ms, "cudatrace_budget_member_in_use_bytes", container=cid) else None

        m = wait_for(seen, 60, "the container's member in the metrics", agent["log"])
        assert series(m, "cudatrace_budget_member_in_use_bytes", container=cid,
                      group=f"container@{cid}") == [100 * MiB], m  # fmt: skip
        assert series(m, "cudatrace_budget_limit_bytes", group=f"container@{cid}") == [1 << 30]
    finally:
        podman.remove(name)
        p.communicate(timeout=60)


def test_a_containers_pod_is_the_one_the_api_server_lists(podman, agent):  # noqa: F811
    """Labels name a pod only where the API server lists the container (its cgroup names
    Podman's libpod-<id>): a container whose environment names a pod that lists another
    container gets its short id alone, and the claim is said as a mismatch."""
    api, dev = agent["api"], f"{agent['vendor']}/group={GROUP}"
    good, bad = podman.name(), podman.name()
    g, gid = in_pod(podman, api, "ml", "trainer", "main", "--device", dev,
                    *podman.sim_args(agent["state"]), podman.image, "hold", "1", "10m",
                    name=good)  # fmt: skip
    api.put_pod(kube_pod("kube-system", "coredns-1", NODE, {"coredns": "f" * 64}))
    b = podman.popen("--device", dev, *podman.sim_args(agent["state"]),
                     *pod_env("kube-system", "coredns-1", "coredns"), podman.image, "hold", "1",
                     "10m", name=bad)  # fmt: skip
    try:
        ready(g)
        ready(b)
        bid = podman.podman("inspect", "--format", "{{.Id}}", bad).stdout.strip()

        def both():  # each labelled as it will stay: the pod's once the API server lists it
            ms = scrape(agent["url"])
            rows = series_labels(ms, "cudatrace_budget_member_in_use_bytes", group=GROUP)
            names = [(r["namespace"], r["pod"], r["container"]) for r in rows]
            assert len(set(names)) == len(names), names  # never one's labels on the other
            return ms if {r["container"] for r in rows} == {"main", bid[:12]} else None

        m = wait_for(both, 60, "both members in the metrics", agent["log"])
        rows = {ls["container"]: ls for ls in series_labels(m, "cudatrace_budget_member_in_use_bytes", group=GROUP)}  # fmt: skip
        assert (rows["main"]["namespace"], rows["main"]["pod"]) == ("ml", "trainer"), rows
        assert bid[:12] in rows, (
            bid,
            series_labels(m, "cudatrace_budget_member_in_use_bytes", group=GROUP),
        )
        assert (rows[bid[:12]]["namespace"], rows[bid[:12]]["pod"]) == ("", ""), (bid, rows)
        assert all(ls["UUID"].startswith("GPU-5ca1ab1e-") for ls in rows.values()), rows
        # said once the kubelet had its time to list the container (identity.VERIFY_WAIT_S)
        want = "its environment names pod kube-system/coredns-1, but it runs in a container no pod of this node lists"
        said = wait_for(lambda: (lambda t: t if want in t else None)("".join(agent["log"])), 40,
                        "the mismatch said", agent["log"])  # fmt: skip
        assert gid[:12] not in said  # the verified one is nobody's mismatch
    finally:
        podman.remove(good)
        podman.remove(bad)
        g.communicate(timeout=60)
        b.communicate(timeout=60)


def test_containers_that_breach_the_fence_are_seen_and_stopped(podman, node_agent):  # noqa: F811
    """--enforce with containers: a fenced member of train; a container with no cudatrace
    device using the same GPU; a member that, once its context is counted, takes 256 MiB around
    the library (libc's dlsym through dlvsym). Both breaches are said, sent as Events to their
    pods, and the containers stopped; the fenced member runs on."""
    agent = node_agent("--enforce", "--grace", "2", ctx_bytes=0)
    api, dev, sim_args = (
        agent["api"],
        f"{agent['vendor']}/group={GROUP}",
        podman.sim_args(agent["state"]),
    )
    names = [podman.name() for _ in range(3)]
    m, _ = in_pod(podman, api, "ml", "fenced", "main", "--device", dev, *sim_args, podman.image,
                  "hold", "1", "100m", name=names[0])  # fmt: skip
    u, _ = in_pod(podman, api, "ml", "rogue", "main", *sim_args, podman.image, "hold", "1",
                  "64m", name=names[1])  # fmt: skip
    b, _ = in_pod(podman, api, "ml", "sly", "main", "--device", dev, *sim_args, podman.image,
                  "bypass", "--join", "1m", "--after-ms", "2000", "--via", "dlvsym", "256m",
                  name=names[2])  # fmt: skip
    try:
        for p in (m, u, b):
            ready(p)
        u.communicate(timeout=60)
        b.communicate(timeout=60)
        assert m.poll() is None
        want = {("GPUMemoryBudgetNotEnforced", "rogue"), ("GPUMemoryOutsideBudget", "sly"),
                ("GPUMemoryProcessStopped", "rogue"), ("GPUMemoryProcessStopped", "sly")}  # fmt: skip
        evs = wait_for(lambda: (lambda e: e if {(x["reason"], x["involvedObject"]["name"]) for x in e} >= want else None)(api.events()),
                       30, "the Events of both", agent["log"])  # fmt: skip
        for ev in evs:
            validate(ev)
            assert (
                ev["involvedObject"]["namespace"] == "ml"
                and ev["involvedObject"]["name"] != "fenced"
            )
        stopped = wait_for(lambda: (lambda ms: ms if sum(series(ms, "cudatrace_watch_stopped_total")) >= 2 else None)(scrape(agent["url"])),
                           30, "the stops counted", agent["log"])  # fmt: skip
        assert series(stopped, "cudatrace_watch_stopped_total", kind="unfenced") == [1]
        assert series(stopped, "cudatrace_watch_stopped_total", kind="outside_ledger") == [1]
        said = "".join(agent["log"])
        # the bypass is its container's pid 1, which SIGTERM's default action does not end
        assert re.search(r"pid \d+ stopped by SIGKILL, 2\.\d\d s after the SIGTERM", said), said
        assert "257.0 MiB on GPU 0 by NVML, 256.0 MiB more than its ledger counts" in said, said
    finally:
        for n in names:
            podman.remove(n)
        m.communicate(timeout=60)


def series_labels(metrics, name: str, **labels) -> list[dict]:
    want = set(labels.items())
    return [dict(ls) for (n, ls), _ in metrics.items() if n == name and want <= set(ls)]


def test_metrics_only_to_whom_the_api_server_allows_health_to_all(tmp_path):
    """--metrics-auth kubernetes: HTTPS (the certificate given), /metrics to a bearer token the
    API server says may get it (TokenReview, SubjectAccessReview), 401 and 403 otherwise;
    /healthz and /readyz answered to anyone (the kubelet's probes carry no token)."""
    import ssl
    import urllib.error

    from cudatrace.deploy.tls import make_tls

    api = FakeApiServer(tmp_path)
    prom = "system:serviceaccount:monitoring:prometheus"
    api.users = {"scraper": {"username": prom}, "tenant": {"username": "system:serviceaccount:t:a"}}
    api.allowed = {(prom, "/metrics")}
    tls = make_tls(tmp_path / "tls", ["localhost"], ("127.0.0.1",), name="metrics")
    port = free_port()
    base = tmp_path / "node"
    cmd = [sys.executable, "-m", "cudatrace", "node", "--root", base / "root", "--state",
           base / "state", "--cdi-dir", base / "cdi", "--listen", f"127.0.0.1:{port}",
           "--interval", "0.2", "--kube-api", api.url, "--kube-token", api.token_file,
           "--kube-ca", api.ca_file, "--metrics-auth", "kubernetes",
           "--metrics-cert", tls["metrics.crt"], "--metrics-key", tls["metrics.key"]]  # fmt: skip
    proc = subprocess.Popen([str(c) for c in cmd], env=checkout_env(), stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        log = []
        for line in proc.stderr:
            log.append(line)
            if "serving metrics" in line:
                break
        assert f"https://127.0.0.1:{port}/metrics" in log[-1], log
        ctx = ssl.create_default_context(cafile=str(tls["ca.crt"]))

        def get(path: str, token: str = "") -> tuple[int, str]:
            req = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
            if token:
                req.add_header("Authorization", f"Bearer {token}")
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        assert get("/healthz") == (200, "ok\n") and get("/readyz") == (200, "ok\n")
        code, body = get("/metrics")
        assert code == 401 and "a bearer token is needed" in body
        code, body = get("/metrics", "tenant")
        assert code == 403 and "system:serviceaccount:t:a may not get /metrics" in body
        code, body = get("/metrics", "forged")
        assert code == 401 and "not valid" in body
        code, body = get("/metrics", "scraper")
        assert code == 200 and "cudatrace_node_preload_info" in body
        # plain HTTP to the HTTPS port: no metrics, whatever it sends
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"cudatrace_" not in s.recv(65536)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        api.close()
    # HTTPS is required to read a token, and an API server to review it
    r = subprocess.run([str(c) for c in cmd[:-4]], env=checkout_env(), capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "a bearer token is never read over plain HTTP" in r.stderr
