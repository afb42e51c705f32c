"""The numbers and words of small places of the commands: the sample interval the summary
names, --until-url refused at once, --watch that ends, a group's status, a context's denial."""

from __future__ import annotations

import io
import subprocess
import sys
import time

import pytest

from cudatrace.errors import RUN_FAILED
from support import children


def test_summary_names_the_sample_interval_asked_for(ct, sim):
    # the memory lives between two samples: 0.3 s after the first, gone before the second
    cmd = ["sh", "-c", f"sleep 0.3; {sim.progs['hold']} --exit-after-ms 1 1 1m"]
    r = ct.run(cmd, "--sample-ms", "1500")
    assert r.returncode == 0, r.stderr
    assert "~100 ms" not in r.stderr
    assert "less than one sample interval (1500 ms)" in r.stderr, r.stderr


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999/", "http://[::1", "http:///x"])
def test_until_url_that_cannot_answer_is_refused_at_once(ct, sim, tmp_path, url):
    r = ct.cli(
        "sweep", "--values", "1m,2m", "--until-url", url, "--url-timeout", "60s",
        "-o", tmp_path / "sw", "--", sim.progs["hold"], "1", "{}",
    )  # fmt: skip
    assert r.returncode == 2 and "--until-url" in r.stderr, r.stderr
    assert not (tmp_path / "sw").exists()  # refused before the first run: nothing was started


def test_watch_ends_when_the_launcher_was_killed(ct, sim, tmp_path):
    out = tmp_path / "t"
    p = children.popen(
        [
            sys.executable,
            "-m",
            "cudatrace",
            "run",
            "-q",
            "-o",
            out,
            "--",
            sim.progs["hold"],
            "1",
            "1m",
        ],
        env=ct.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 30
    while time.time() < deadline and not list(out.glob("*.ctrace")):
        time.sleep(0.05)
    time.sleep(0.3)
    p.kill()
    p.wait()
    r = ct.cli("report", out, "--watch", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "the launcher is gone" in r.stdout, r.stdout


def test_watch_of_a_directory_that_never_appears_ends(tmp_path, monkeypatch):
    from cudatrace.commands import report as report_cmd
    from cudatrace.errors import CudatraceError

    monkeypatch.setattr(report_cmd, "MISSING_WAIT_S", 0.3)
    out = io.StringIO()
    with pytest.raises(CudatraceError, match="no such trace directory"):
        report_cmd.watch_report(tmp_path / "never", interval=0.05, out=out)


def test_a_group_named_like_an_option_is_refused(ct, sim, tmp_path):
    """A group named `-x` read as an option everywhere it was named (status took it only by
    ignoring unknown options): refused, as a name starting with '.' is."""
    led = tmp_path / "ledgers"
    led.mkdir(mode=0o700)
    env = ct.env()
    env["CUDATRACE_LEDGER_DIR"] = str(led)
    r = ct.cli(
        "run", "-q", "-o", tmp_path / "t", "--group", "-x", "--budget", "4MiB", "--",
        sim.progs["hold"], "--exit-after-ms", "1", "1", "1m", env=env,
    )  # fmt: skip
    assert r.returncode == RUN_FAILED and "not starting with '.' or '-'" in r.stderr, r.stderr
    assert not list(led.iterdir()), list(led.iterdir())
    s = ct.cli("status", "-x", env=env)
    assert s.returncode == 2 and "No such option" in s.stderr, s.stdout + s.stderr


def test_a_denial_by_the_context_names_the_context(ct, sim, tmp_path):
    # each process's context costs 8 MiB here; under a 4 MiB budget the first allocation is
    # denied while nothing is allocated: the summary says what the "in use" was
    r = ct.run(
        [sim.progs["hold"], "--exit-after-ms", "1", "1", "1m"],
        "--budget", "4MiB", sim_opts={"ctx_bytes": 8 << 20},
    )  # fmt: skip
    assert "denied by the budget: 1" in r.stderr, r.stderr
    assert "not traced in this run: CUDA contexts" in r.stderr, r.stderr
    assert "the budget must hold them too" in r.stderr, r.stderr
