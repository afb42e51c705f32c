"""The watch on a plain host (record/watch.py through `cudatrace status` and the metrics'
collector): NVML's figures against the ledgers', on the simulated driver and NVML.

A member that joins its group with 1 MiB and then takes 8 MiB around the preload library
(libc's own dlsym reached by dlvsym; the driver's entry read from libcuda's own symbol table)
holds 9 MiB under a 4 MiB budget: `status` said a member with 1 MiB and nothing else. Now it
names the member holding more than its ledger counts and the group over its budget by NVML's
count; a process using the GPU with no fence is named beside them; a legitimate member (its
context counted, or not joined yet) is not. Where NVML cannot give per-process figures (a
Jetson Thor, a MIG instance, a driver without the query) the watch says so, never 0."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cudatrace import native
from support.cli import checkout_env, cudatrace

MiB = 1 << 20


@pytest.fixture
def host(sim, tmp_path):
    d = tmp_path / "ledgers"
    d.mkdir(mode=0o700)
    state = sim.new_state()
    procs: list[subprocess.Popen] = []

    def env(**opts):
        e = checkout_env(sim.env(state=state, **opts))
        e["CUDATRACE_LEDGER_DIR"] = str(d)
        return e

    def start(prog, *args, group=None, budget="4MiB", preload=True, **opts):
        e = env(**opts)
        if preload:
            e["LD_PRELOAD"] = str(native.shim_path())
        if group:
            e.update(CUDATRACE_GROUP=group, CUDATRACE_BUDGET=budget)
        p = subprocess.Popen([str(sim.progs[prog]), *map(str, args)], env=e,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        procs.append(p)
        out = []
        for line in p.stdout:
            out.append(line)
            if line.strip() == "ready":
                return p, "".join(out)
        raise AssertionError(f"{prog}: {''.join(out)} {p.stderr.read()}")

    def status(**opts):
        r = cudatrace(env(**opts), "status", "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def text(**opts):
        r = cudatrace(env(**opts), "status")
        assert r.returncode == 0, r.stderr
        return r.stdout

    yield {"env": env, "start": start, "status": status, "text": text}
    for p in procs:
        p.kill()
        p.communicate(timeout=30)


def kinds(st, pid=None):
    return sorted(f["kind"] for f in st["watch"]["findings"] if pid is None or f["pid"] == pid)


@pytest.mark.parametrize("via", ["dlvsym", "table"])
def test_a_member_that_allocates_around_the_library_is_named(host, via):
    p, out = host["start"]("bypass", "--join", "1m", "--via", via, "8m", group=f"g{via}")
    assert "alloc cuMemAlloc_v2 8388608 0x" in out and " 0\nbreach" in out, out
    st = host["status"]()
    (led,) = st["ledgers"]
    assert led["devices"][0]["in_use"] == 1 * MiB  # the ledger saw 1 MiB: the hole
    assert kinds(st, p.pid) == ["group_over_budget", "outside_ledger"], st["watch"]
    out_f = next(f for f in st["watch"]["findings"] if f["kind"] == "outside_ledger")
    assert (out_f["bytes"], out_f["counted"], out_f["excess"]) == (9 * MiB, 1 * MiB, 8 * MiB)
    assert out_f["uuid"].startswith("GPU-") and out_f["group"] == f"g{via}"
    grp = next(f for f in st["watch"]["findings"] if f["kind"] == "group_over_budget")
    assert (grp["bytes"], grp["counted"], grp["pid"]) == (9 * MiB, 4 * MiB, p.pid)
    text = host["text"]()
    assert (
        f"OUTSIDE THE LEDGER: pid {p.pid} (bypass) holds 9.00 MiB on GPU 0 by NVML, 8.00 MiB more than its ledger counts"
        in text
    ), text
    assert f"GROUP OVER BUDGET BY NVML: group g{via} holds 9.00 MiB on GPU 0" in text, text


def test_members_the_ledger_counts_whole_are_no_breach(host):
    """Contexts counted by each member's own library (300 MiB each): NVML's figure is the
    ledger's."""
    host["start"]("hold", "2", "100m", group="ok", budget="1GiB", ctx_bytes=300 * MiB)
    host["start"]("hold", "1", "50m", group="ok", budget="1GiB", ctx_bytes=300 * MiB)
    st = host["status"](ctx_bytes=300 * MiB)
    assert st["watch"]["findings"] == [], st["watch"]
    ((dev,),) = [st["watch"]["devices"]]
    assert dev["ledgers"] == 850 * MiB and dev["fenced"] and dev["per_process"]
    assert {p["fence"] for p in dev["processes"]} == {"member"}
    assert "OUTSIDE" not in host["text"](ctx_bytes=300 * MiB)


def test_a_process_without_a_fence_on_a_fenced_gpu(host):
    host["start"]("hold", "1", "10m", group="g", budget="1GiB")
    free, _ = host["start"]("hold", "1", "64m", preload=False)
    st = host["status"]()
    assert kinds(st) == ["unfenced"] and st["watch"]["findings"][0]["pid"] == free.pid
    assert [p["pid"] for p in st["unfenced"]["processes"]] == [free.pid]
    text = host["text"]()
    assert f"UNFENCED ON A FENCED GPU: pid {free.pid} (hold) holds 64.0 MiB on GPU 0" in text


def test_a_process_alone_on_a_gpu_is_listed_not_a_breach(host):
    free, _ = host["start"]("hold", "1", "64m", preload=False)
    st = host["status"]()
    assert st["watch"]["findings"] == [] and [p["pid"] for p in st["unfenced"]["processes"]] == [
        free.pid
    ]


@pytest.mark.parametrize(
    ("view", "opts", "reason", "source"),
    [
        ("na", {"integrated": 1}, "na", "meminfo"),  # a Jetson Thor: unified memory
        ("mig", {}, "mig", "nvml"),
        ("unsupported", {}, "unsupported", "nvml"),
    ],
)
def test_where_nvml_cannot_see_per_process_the_watch_says_so(host, view, opts, reason, source):
    p, _ = host["start"]("bypass", "--join", "1m", "--via", "dlvsym", "8m", group="g",
                         nvml_procs=view, **opts)  # fmt: skip
    st = host["status"](nvml_procs=view, **opts)
    (dev,) = st["watch"]["devices"]
    assert not dev["per_process"] and dev["reason"] == reason and dev["why"], dev
    assert dev["source"] == source and dev["used"] > 0 and dev["ledgers"] == 1 * MiB
    assert st["watch"]["findings"] == []  # nothing judged from figures NVML did not give
    if view != "unsupported":  # listed, without a figure: unknown, not 0
        assert [(x["pid"], x["bytes"]) for x in dev["processes"]] == [(p.pid, None)]
    text = host["text"](nvml_procs=view, **opts)
    assert (
        f"gpu 0 ({dev['uuid']}): " in text
        and "the watch cannot tell what each process holds" in text
    )
    where = "the host's memory, which it shares" if source == "meminfo" else "the device"
    assert f"; {where}: " in text and "the ledgers count 1.00 MiB" in text, text


# ---- the same in `cudatrace metrics` ----------------------------------------------------------


def scrape(env) -> dict[tuple[str, frozenset], float]:
    """One scrape of a `cudatrace metrics` started for it: {(name, labels): value}."""
    import signal
    import socket
    import time
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "cudatrace", "metrics", "--listen",
                          f"127.0.0.1:{port}"], env=env, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as u:
                    text = u.read().decode()
                break
            except OSError:
                if time.monotonic() > deadline or p.poll() is not None:
                    raise
                time.sleep(0.2)
    finally:
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=30)
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def series(m, name, **labels) -> dict[frozenset, float]:
    return {ls: v for (n, ls), v in m.items() if n == name and set(labels.items()) <= set(ls)}


def test_metrics_carry_the_breaches_with_gpu_and_uuid(host):
    host["start"]("bypass", "--join", "1m", "--via", "table", "8m", group="g")
    host["start"]("hold", "1", "64m", preload=False)
    m = scrape(host["env"]())
    for kind, n, excess in (("outside_ledger", 1, 8 * MiB), ("unfenced", 1, 64 * MiB),
                            ("group_over_budget", 1, 5 * MiB)):  # fmt: skip
        ((labels, v),) = series(m, "cudatrace_watch_breaches", kind=kind).items()
        assert v == n and dict(labels)["gpu"] == "0", (kind, m)
        assert series(m, "cudatrace_watch_breach_bytes", kind=kind, gpu="0") == {labels: excess}
    assert list(series(m, "cudatrace_watch_per_process_known", gpu="0", reason="").values()) == [1]
    assert list(series(m, "cudatrace_unfenced_processes", gpu="0").values()) == [1]
    # every series with a device names its GPU's UUID (the simulated NVML has them)
    with_gpu = [(n, dict(ls)) for (n, ls), _ in m.items() if "gpu" in dict(ls)]
    assert {n for n, _ in with_gpu} >= {"cudatrace_budget_limit_bytes", "cudatrace_budget_member_in_use_bytes", "cudatrace_watch_ledger_bytes"}  # fmt: skip
    assert all(ls["UUID"].startswith("GPU-5ca1ab1e-") for _, ls in with_gpu), with_gpu


def test_metrics_where_nvml_gives_no_per_process_figure(host):
    host["start"]("bypass", "--join", "1m", "--via", "dlvsym", "8m", group="g", nvml_procs="na",
                  integrated=1)  # fmt: skip
    m = scrape(host["env"](nvml_procs="na", integrated=1))
    assert list(series(m, "cudatrace_watch_per_process_known", reason="na").values()) == [0]
    # what NVML cannot see is not reported as 0: no per-process breach series, no bytes
    assert not series(m, "cudatrace_watch_breaches", kind="outside_ledger")
    assert not series(m, "cudatrace_unfenced_bytes")
    assert list(series(m, "cudatrace_watch_breaches", kind="unfenced").values()) == [0]
    (used,) = series(m, "cudatrace_watch_device_used_bytes", source="meminfo").values()
    (free,) = series(m, "cudatrace_watch_unaccounted_bytes", source="meminfo").values()
    assert used > 0 and free == used - 1 * MiB


def test_ad_hoc_runs_are_one_group_and_their_denials_only_grow(host, sim):
    """Two `cudatrace run --budget`s: one group "@run" summed, not a series each; a run that
    ends takes its denials with it into the sum's counter, never down."""
    env = host["env"]()
    runs = []
    for n in ("30m", "20m"):
        p = subprocess.Popen([sys.executable, "-m", "cudatrace", "run", "--no-trace", "--budget", "40MiB",
                              "--", str(sim.progs["hold"]), "2", n], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        runs.append(p)
        for line in p.stdout:
            if line.strip() == "ready":
                break
    try:
        m = scrape(env)
        groups = {dict(ls)["group"] for ls in series(m, "cudatrace_budget_in_use_bytes")}
        assert groups == {"@run"}, groups
        assert list(series(m, "cudatrace_budget_in_use_bytes", group="@run").values()) == [70 * MiB]
        assert list(series(m, "cudatrace_budget_denials_total", group="@run").values()) == [1]
        assert not series(m, "cudatrace_budget_member_in_use_bytes", group="@run")
    finally:
        for p in runs:
            p.terminate()
            p.communicate(timeout=60)
