"""The node agent's watch on the host (no container needed: the processes are the host's, their
ledgers found through their mappings as any container's are), on the simulated driver and NVML:
a member that allocates around the library, a process without a fence on a fenced GPU and a
group over its budget by NVML's count each appear in the agent's first pass (its metrics,
`cudatrace status --node`, `cudatrace node --once`), and `--enforce` stops them: SIGTERM, then
SIGKILL after the grace period. The time from the breach to the stop, at the default interval,
is printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from cudatrace import native
from support.cli import checkout_env, cudatrace
from support.kube import FakeApiServer, pod

MiB = 1 << 20
# group names of this test's own: the agent sees every ledger of the host, other tests' too
GA, GB = f"wa{os.getpid()}", f"wb{os.getpid()}"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def series(m, name, **labels) -> list[float]:
    return [v for (n, ls), v in m.items() if n == name and set(labels.items()) <= set(ls)]


@pytest.fixture
def node(sim, tmp_path):
    base = tmp_path / "node"
    base.mkdir()
    state = sim.new_state()
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir(mode=0o700)
    procs: list[subprocess.Popen] = []

    def env(**opts):
        e = checkout_env(sim.env(state=state, **opts))
        e["CUDATRACE_LEDGER_DIR"] = str(ledgers)
        return e

    def args(*extra):
        kube = [] if "--kube-api" in extra else ["--kubernetes", "off"]
        return ["node", "--root", base / "root", "--state", base / "state", "--cdi-dir",
                base / "cdi", "--vendor", "w.cudatrace.dev", *kube, *extra]  # fmt: skip

    def agent(*extra):
        """`cudatrace node` serving metrics: (process, metrics URL, its log so far)."""
        port = free_port()
        cmd = [sys.executable, "-m", "cudatrace", *map(str, args("--listen", f"127.0.0.1:{port}", *extra))]  # fmt: skip
        p = subprocess.Popen(cmd, env=env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             text=True)  # fmt: skip
        procs.append(p)
        log: list[str] = []
        for line in p.stderr:
            log.append(line)
            if "serving metrics" in line:
                break
        else:
            raise AssertionError("".join(log))
        threading.Thread(target=lambda: log.extend(p.stderr), daemon=True).start()
        return p, f"http://127.0.0.1:{port}/metrics", log

    def popen(prog, *a, group=None, budget="4MiB", preload=True, **extra):
        e = dict(env(), **extra)
        if preload:
            e["LD_PRELOAD"] = str(native.shim_path())
        if group:
            e.update(CUDATRACE_GROUP=group, CUDATRACE_BUDGET=budget)
        p = subprocess.Popen([str(sim.progs[prog]), *map(str, a)], env=e, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
        procs.append(p)
        return p

    def ready(p):
        out = []
        for line in p.stdout:
            out.append(line)
            if line.strip() == "ready":
                return "".join(out)
        raise AssertionError(f"{p.args}: {''.join(out)} {p.stderr.read()}")

    def start(prog, *a, **kw):
        p = popen(prog, *a, **kw)
        return p, ready(p)

    def once(*extra):
        r = cudatrace(env(), *args("--once", *extra))
        assert r.returncode == 0, r.stderr
        return r

    yield {"env": env, "agent": agent, "start": start, "popen": popen, "ready": ready,
           "once": once, "state": base / "state"}  # fmt: skip
    for p in reversed(procs):
        p.terminate()
        try:
            p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()


def three_breaches(node):
    """A member that took 8 MiB around the library (group a, 4 MiB), a process without a fence
    on the GPU, and group b over its 4 MiB budget by NVML's count."""
    a, _ = node["start"]("bypass", "--join", "1m", "--via", "dlvsym", "8m", group=GA)
    free, _ = node["start"]("hold", "1", "16m", preload=False)
    b, _ = node["start"]("bypass", "--join", "3m", "--via", "table", "4m", group=GB)
    return a, free, b


def test_each_breach_appears_in_the_first_pass(node):
    a, free, b = three_breaches(node)
    want = {("outside_ledger", a.pid), ("group_over_budget", a.pid), ("unfenced", free.pid),
            ("outside_ledger", b.pid), ("group_over_budget", b.pid)}  # fmt: skip
    # one read-only pass
    st = json.loads(node["once"]("--json").stdout)
    assert {(f["kind"], f["pid"]) for f in st["watch"]["findings"]} == want, st["watch"]
    assert not (node["state"] / "node-status.json").exists()  # --once writes nothing
    # the agent: its first pass is done before it serves
    p, url, log = node["agent"]()
    m = scrape(url)
    for kind, n in (("outside_ledger", 2), ("unfenced", 1), ("group_over_budget", 2)):
        (v,) = series(m, "cudatrace_watch_breaches", kind=kind, gpu="0")
        assert v == n, (kind, m)
    assert series(m, "cudatrace_unfenced_processes", gpu="0") == [1]
    assert series(m, "cudatrace_watch_stopped_total", kind="unfenced") == [0]  # no --enforce
    with_gpu = [dict(ls) for (n, ls) in m if "gpu" in dict(ls)]
    assert with_gpu and all(ls["UUID"].startswith("GPU-5ca1ab1e-") for ls in with_gpu), with_gpu
    said = "".join(log)
    assert f"pid {a.pid}: pid {a.pid} (bypass) holds 9.00 MiB on GPU 0 by NVML" in said, said
    assert f"pid {free.pid}: pid {free.pid} (hold) holds 16.0 MiB on GPU 0" in said, said
    r = cudatrace(node["env"](), "status", "--node", node["state"])
    assert r.returncode == 0, r.stderr
    assert f"OUTSIDE THE LEDGER: pid {a.pid} (bypass)" in r.stdout, r.stdout
    assert f"UNFENCED ON A FENCED GPU: pid {free.pid} (hold)" in r.stdout
    assert f"GROUP OVER BUDGET BY NVML: group {GB} holds 7.00 MiB on GPU 0" in r.stdout
    # nothing was stopped
    assert all(x.poll() is None for x in (a, free, b))


def _breach_ns(out: str) -> int:
    return int(next(line.split()[1] for line in out.splitlines() if line.startswith("breach ")))


def _stamp_exit(p: subprocess.Popen, at: dict) -> None:
    def wait():
        p.wait()
        at[p.pid] = time.time_ns()

    threading.Thread(target=wait, daemon=True).start()


def test_enforce_stops_each_breach_and_prints_the_time_to_the_stop(node, capsys):
    """Members that joined a while ago (seen by the agent's passes) take memory around the
    library at a moment of no relation to the passes; so does a process without a fence."""
    interval = 2.0  # the default: not given
    p, url, log = node["agent"]("--enforce")
    gone: dict[int, int] = {}
    a = node["popen"]("bypass", "--join", "1m", "--after-ms", "3000", "--via", "dlvsym", "8m",
                      group=GA)  # fmt: skip
    b = node["popen"]("bypass", "--join", "3m", "--after-ms", "4000", "--via", "table", "4m",
                      group=GB)  # fmt: skip
    _stamp_exit(a, gone)
    _stamp_exit(b, gone)
    time.sleep(1.5)
    free, _ = node["start"]("hold", "1", "16m", preload=False)
    free_at = time.time_ns()  # it holds its 16 MiB from "ready" on
    _stamp_exit(free, gone)
    out = {x.pid: node["ready"](x) for x in (a, b)}
    for x in (a, free, b):
        x.wait(timeout=30)
    deadline = time.monotonic() + 10
    while len(gone) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    took = {
        "a member allocating around the library (dlvsym)": (gone[a.pid] - _breach_ns(out[a.pid])) / 1e9,
        "a process without a fence": (gone[free.pid] - free_at) / 1e9,
        "a member taking its group over budget (its own table)": (gone[b.pid] - _breach_ns(out[b.pid])) / 1e9,
    }  # fmt: skip
    with capsys.disabled():
        print(f"\nbreach to stop, --enforce at the default interval ({interval:g} s):")
        for what, s in took.items():
            print(f"  {what}: {s:.2f} s")
    # a pass every interval, the breach held over 3 readings 0.1 s apart, then SIGTERM
    assert all(0 < s < interval + 3 for s in took.values()), took
    assert (a.returncode, b.returncode, free.returncode) == (-15, -15, 0)  # hold ends on SIGTERM
    deadline = time.monotonic() + 10  # counted once the agent has seen them end
    while sum(series(m := scrape(url), "cudatrace_watch_stopped_total")) < 3:
        assert time.monotonic() < deadline, m
        time.sleep(0.1)
    assert series(m, "cudatrace_watch_stopped_total", kind="outside_ledger", gpu="0") == [2]
    assert series(m, "cudatrace_watch_stopped_total", kind="unfenced", gpu="0") == [1]
    assert series(m, "cudatrace_watch_stopped_total", kind="group_over_budget", gpu="0") == [0]
    said = "".join(log)
    for x in (a, free, b):
        assert f"stopping pid {x.pid} (SIGTERM; SIGKILL after 5 s)" in said, said
        assert f"pid {x.pid} stopped by SIGTERM" in said, said


def test_enforce_kills_what_ignores_sigterm(node):
    p, url, log = node["agent"]("--enforce", "--grace", "0.5", "--interval", "0.2")
    a, _ = node["start"]("bypass", "--ignore-term", "--join", "1m", "--via", "dlvsym", "8m",
                         group=GA)  # fmt: skip
    a.wait(timeout=30)
    assert a.returncode == -9
    deadline = time.monotonic() + 10
    while f"pid {a.pid} stopped by SIGKILL" not in "".join(log) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f"pid {a.pid} stopped by SIGKILL" in "".join(log), log


def test_a_legitimate_member_and_a_warn_group_are_not_stopped(node):
    """--enforce stops what breaches a fence, never a member the ledger counts whole, nor a
    group its operator let pass its budget (--on-exceed warn: said, no one to stop)."""
    p, url, log = node["agent"]("--enforce", "--interval", "0.2")
    ok, _ = node["start"]("hold", "2", "1m", group=GA, budget="8MiB")
    w, _ = node["start"]("hold", "2", "4m", group=GB, budget="4MiB", CUDATRACE_ON_EXCEED="warn")
    time.sleep(1.0)  # five passes
    assert ok.poll() is None and w.poll() is None
    m = scrape(url)
    assert series(m, "cudatrace_watch_breaches", kind="group_over_budget") == [1]
    assert series(m, "cudatrace_watch_breaches", kind="outside_ledger") == [0]
    assert "stopping" not in "".join(log)


def test_a_spoofing_process_gets_no_event_and_no_pod_labels(node, tmp_path):
    """A plain process of the host (no container, no library) whose environment names
    kube-system's coredns pod: the agent used to post a Warning Event into kube-system against
    coredns, with text of the tenant's choosing, and label its series with that pod."""
    api = FakeApiServer(tmp_path)
    coredns = pod("kube-system", "coredns-5d78c9869d-x7k2p", "gpu-node-1", {"coredns": "e" * 64})
    api.put_pod(coredns)
    try:
        p, url, log = node["agent"]("--kube-api", api.url, "--kube-token", api.token_file,
                                    "--kube-ca", api.ca_file, "--node-name", "gpu-node-1",
                                    "--interval", "0.2")  # fmt: skip
        node["start"]("hold", "1", "1m", group=GA, budget="1GiB")  # the GPU is fenced
        claims = {"CUDATRACE_K8S_NAMESPACE": "kube-system",
                  "CUDATRACE_K8S_POD": coredns["metadata"]["name"], "CUDATRACE_K8S_CONTAINER": "coredns",
                  "CUDATRACE_K8S_POD_UID": coredns["metadata"]["uid"],
                  "CUDATRACE_GROUP": coredns["metadata"]["uid"]}  # fmt: skip
        spoof, _ = node["start"]("hold", "1", "16m", preload=False, **claims)
        told = f"a process given the budget group {claims['CUDATRACE_GROUP']} uses CUDA without"
        deadline = time.monotonic() + 30
        while told not in "".join(log):  # the agent has seen it
            assert time.monotonic() < deadline, "".join(log)
            time.sleep(0.1)
        time.sleep(1.0)  # five more passes
        assert api.events() == []  # neither the library's nor the watch's: no pod verified
        said = "".join(log)
        assert f"pid {spoof.pid}: {told}" in said, said
        want = f"pid {spoof.pid}: its environment names pod kube-system/coredns-5d78c9869d-x7k2p, but it runs in no container"
        assert want in said, said
        m = scrape(url)
        assert not [ls for (_, ls) in m if ("namespace", "kube-system") in ls], m
        # (other tests' processes of this host may be counted beside it)
        assert sum(series(m, "cudatrace_node_unfenced_processes", namespace="", pod="")) >= 1
        assert sum(series(m, "cudatrace_node_identities", state="mismatch")) >= 1
        assert not [r for r in api.requests if r[0] != "GET"]  # nothing was written to the API
    finally:
        api.close()
