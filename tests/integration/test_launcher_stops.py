"""A launcher that always stops: a signal meant for CMD reaches it whatever thread of the
launcher the kernel hands it to (record/signals.py).

Once, in a full test run, `cudatrace run` got SIGTERM after its command printed `ready` and
never forwarded it: the kernel gave the signal to a helper thread, CPython's handler waits for
the main thread, and that slept in waitpid() while the command slept waiting for the signal.
Both were alive six minutes later."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support import children

# SigBlk of /proc/PID/task/TID/status: bit N-1 is signal N
CAUGHT = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)


def _start(ct, sim, tmp_path, *opts, prog=("1", "1m")):
    """cudatrace run of hold, once hold waits for its signal (it printed ready)."""
    p = children.popen(
        [sys.executable, "-m", "cudatrace", "run", "-q", "-o", tmp_path / "t", *opts, "--",
         sim.progs["hold"], *prog],
        env=ct.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    while (line := children.readline(p)) and line.strip() != "ready":
        pass
    assert line, children.said(p)
    return p


def _blocked(pid: int, tid: str) -> int:
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        for line in f:
            if line.startswith("SigBlk:"):
                return int(line.split()[1], 16)
    return 0


def test_helper_threads_leave_the_signals_to_the_main_thread(ct, sim, tmp_path):
    # a run with every helper: sampler, sealer, exit watcher, denial watcher (a budget)
    p = _start(ct, sim, tmp_path, "--budget", "1GiB")
    tids = children.wait_until(
        lambda: (
            [t for t in os.listdir(f"/proc/{p.pid}/task") if t != str(p.pid)]
            if len(os.listdir(f"/proc/{p.pid}/task")) >= 5
            else None
        ),
        30,
        "the launcher's helper threads",
    )
    wanted = 0
    for sig in CAUGHT + (signal.SIGUSR2,):
        wanted |= 1 << (sig - 1)
    # the main thread blocks them for a moment while it starts a helper (which inherits the
    # mask), so it is read once the launcher has settled: unblocked, and for good
    (main,) = children.wait_until(
        lambda: (lambda m: None if m & wanted else (m,))(_blocked(p.pid, str(p.pid))),
        10,
        "the main thread taking the signals",
    )
    tids = [t for t in os.listdir(f"/proc/{p.pid}/task") if t != str(p.pid)]
    masks = {tid: _blocked(p.pid, tid) for tid in tids}
    children.stop(p)
    for sig in CAUGHT + (signal.SIGUSR2,):
        bit = 1 << (sig - 1)
        assert not main & bit, (sig, hex(main))
        assert all(m & bit for m in masks.values()), (sig, {t: hex(m) for t, m in masks.items()})
    assert p.returncode == 0, p.stderr  # hold ends on SIGTERM, forwarded


WAKE = textwrap.dedent(
    """
    import signal, sys, threading, time
    from cudatrace.record.launcher import RunOptions, run

    started = threading.Event()

    def library_thread():
        # a thread the launcher did not start (a library's): the kernel may hand it a signal
        # sent to the process; pthread_kill makes that choice here
        started.wait()
        time.sleep(0.5)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    threading.Thread(target=library_thread, daemon=True).start()
    cmd = [sys.executable, "-c", "import time; print('child', flush=True); time.sleep(20)"]
    t0 = time.monotonic()
    status, _ = run(RunOptions(cmd=cmd, out_dir=None, mode="none", quiet=True,
                               on_start=lambda proc, out: started.set()))
    print("status", status, "after %.1f s" % (time.monotonic() - t0), flush=True)
    """
)


def test_a_signal_taken_by_another_thread_wakes_the_wait(ct, tmp_path):
    p = children.popen(
        [sys.executable, "-c", WAKE],
        env=ct.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = children.communicate(p, 60)
    status, took = out.split("status ")[1].split(" after ")
    # forwarded at once: the child dies of it (143) well before its 20 s
    assert int(status) == 128 + signal.SIGTERM, (out, err)
    assert float(took.split()[0]) < 10, (out, err)


SETUP = textwrap.dedent(
    """
    import os, signal, sys
    from cudatrace.record import launcher
    from cudatrace.record.launcher import LaunchError, RunOptions, run

    mark, sig = sys.argv[1], int(sys.argv[2])
    write = launcher._write_run_info

    def while_set_up(*a, **kw):
        # the signal comes while the run is set up, inside code that drops what it raises (as
        # cffi drops an exception of a callback, printing it): a KeyboardInterrupt was lost so
        try:
            os.kill(os.getpid(), sig)
            sum(range(100000))  # a few bytecodes: a Python handler runs here
        except KeyboardInterrupt:
            print("dropped", flush=True)
        return write(*a, **kw)

    launcher._write_run_info = while_set_up
    cmd = [sys.executable, "-c", "open(%r, 'w')" % mark]
    try:
        status, _ = run(RunOptions(cmd=cmd, out_dir=None, mode="none", quiet=True))
        print("status", status, flush=True)
    except LaunchError as e:
        print("refused", e.status, e, flush=True)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_run_is_set_up_starts_nothing(ct, tmp_path, sig):
    # a SIGINT raised KeyboardInterrupt inside the setup, which a callback could drop: CMD was
    # then started, and waited for a signal that had come and gone
    mark = tmp_path / "started"
    p = children.popen(
        [sys.executable, "-c", SETUP, str(mark), str(int(sig))],
        env=ct.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = children.communicate(p, 60)
    assert "dropped" not in out, (out, err)
    assert out.startswith(f"refused {128 + sig} {sig.name} before the command started"), (out, err)
    assert not mark.exists(), (out, err)


# ---- the stress test: signals at random moments of many runs, under load ---------------------

RUNS = int(os.environ.get("STRESS_RUNS", "200"))
AT_ONCE = 16
# CMD's status (0: hold ends on the signal; 128+N: it died of it), or the launcher's own death by
# the signal (before its handlers were set, or once CMD had ended), or 130: Ctrl-C before CMD
STATUSES = {0, 128 + signal.SIGINT, 128 + signal.SIGTERM, -signal.SIGINT, -signal.SIGTERM}
LOAD = 2  # busy processes beside the runs (CPU load: the main thread is often not running)


def _launch(ct, sim, tmp_path: Path, i: int, token: str) -> tuple[subprocess.Popen, dict]:
    """One run of a short program, or of one that waits for the signal (hold, as in the hang);
    quiet or with its summary (a signal may come while the launcher summarizes)."""
    rnd = random.Random(i)
    hold = [str(sim.progs["hold"]), "1", "1m"]
    if rnd.random() < 0.3:
        hold[1:1] = ["--exit-after-ms", str(rnd.randrange(0, 300))]
    env = dict(ct.env(), CUDATRACE_STRESS_TOKEN=token)
    quiet = ["-q"] if rnd.random() < 0.5 else []
    with open(tmp_path / f"r{i}.err", "wb") as err:
        p = children.popen(
            [sys.executable, "-m", "cudatrace", "run", *quiet, "-o", tmp_path / f"r{i}", "--",
             *hold],
            env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
        )  # fmt: skip
    # two runs in three get their signal while CMD runs (a moment after the launcher started
    # it: the case of the hang); the others at any moment from the launcher's own start
    while_cmd = rnd.random() < 2 / 3
    plan = {
        "at": None if while_cmd else time.monotonic() + rnd.uniform(0, 1.5),
        "after": rnd.uniform(0, 0.3),  # after CMD was seen
        "sig": rnd.choice((signal.SIGTERM, signal.SIGINT)),
        "again": rnd.random() < 0.25,  # a second signal soon after: the main thread has one pending
        "sent": 0,
        "started": time.monotonic(),
    }
    return p, plan


def _marked(token: str) -> list[int]:
    """The processes whose environment carries the token (a run's launcher or command)."""
    found = []
    needle = f"CUDATRACE_STRESS_TOKEN={token}".encode()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(d))
            except OSError:
                pass
    return found


def _in_python_start(status: int, err: str) -> bool:
    """SIGINT while the interpreter starts (site, the imports before the command line runs)
    ends it with status 1 and a traceback of KeyboardInterrupt (or of the RuntimeError an
    import wraps it in): nothing was started yet."""
    return status == 1 and "KeyboardInterrupt" in err and "Traceback" in err


def _describe(p: subprocess.Popen) -> str:
    """What a hung launcher and its command were doing: each thread's state, wait channel and
    signals (pending, blocked, caught), and what the launcher said."""
    lines = []
    for pid in [p.pid, *children.descendants(p.pid)]:
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")[:120]
            lines.append(f"pid {pid}: {cmd.decode(errors='replace')}")
            for tid in sorted(os.listdir(f"/proc/{pid}/task")):
                st = open(f"/proc/{pid}/task/{tid}/status").read().splitlines()
                keep = [x for x in st if x.split(":")[0] in
                        ("Name", "State", "SigPnd", "ShdPnd", "SigBlk", "SigCgt")]  # fmt: skip
                wchan = open(f"/proc/{pid}/task/{tid}/wchan").read()
                lines.append(f"  tid {tid} wchan {wchan}: " + "; ".join(keep))
        except OSError as e:
            lines.append(f"pid {pid}: {e}")
    return "\n".join(lines)


def _load(n: int) -> list[subprocess.Popen]:
    return [children.popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _drive(running: list, now: float) -> None:
    """Send each run's signal(s) when their moment has come."""
    for p, plan in running:
        if p.poll() is not None:
            continue
        if plan["at"] is None:
            if not children.descendants(p.pid):
                continue
            plan["at"] = now + plan["after"]  # CMD runs
        if plan["sent"] == 0 and now >= plan["at"]:
            os.kill(p.pid, plan["sig"])
            plan["sent"], plan["at"] = 1, now + random.uniform(0, 0.05)
        elif plan["sent"] == 1 and plan["again"] and now >= plan["at"]:
            os.kill(p.pid, plan["sig"])
            plan["sent"] = 2


def test_every_launcher_stops_on_signals_at_random_moments(ct, sim, tmp_path):
    token = "%d-%d" % (os.getpid(), time.monotonic_ns())
    load = _load(LOAD)
    hung, odd, statuses, t0 = [], [], {}, time.monotonic()
    todo, running = list(range(RUNS)), []
    try:
        while todo or running:
            while todo and len(running) < AT_ONCE:
                i = todo.pop(0)
                running.append((*_launch(ct, sim, tmp_path, i, token), i))
            now = time.monotonic()
            _drive([(p, plan) for p, plan, _ in running], now)
            for p, plan, i in list(running):
                if p.poll() is not None:
                    running.remove((p, plan, i))
                    statuses[p.returncode] = statuses.get(p.returncode, 0) + 1
                    err = (tmp_path / f"r{i}.err").read_text()
                    if p.returncode not in STATUSES and not _in_python_start(p.returncode, err):
                        odd.append((i, p.returncode, err[-600:]))
                elif now - plan["started"] > 120 or (plan["sent"] and now - plan["at"] > 60):
                    hung.append(  # a minute after its signal: what it was doing, what it said
                        (i, plan, _describe(p), children.kill_tree(p),
                         (tmp_path / f"r{i}.err").read_text()[-1500:])
                    )  # fmt: skip
                    running.remove((p, plan, i))
            time.sleep(0.005)
    finally:
        for p in load:
            children.kill_tree(p)
    took = time.monotonic() - t0
    # a killed launcher's command gets SIGTERM from the kernel (PDEATHSIG): give it a moment
    deadline = time.monotonic() + 10
    while (left := _marked(token)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    print(f"{RUNS} runs in {took:.1f} s beside {LOAD} busy processes; statuses {statuses}")
    assert not hung, (
        f"launchers that did not stop (run, plan, threads, pids killed, stderr): {hung}"
    )
    assert not left, f"processes of the runs left running: {left}"
    assert not odd, odd
