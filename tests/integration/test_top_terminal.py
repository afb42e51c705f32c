"""`cudatrace top` as a person uses it: in a real terminal (tmux), on the simulated driver and
NVML, beside a traced run in a budget group, a second run of the group that the budget denied,
and a process without a fence. The screen is read back with `tmux capture-pane -p`, keys are
sent with `tmux send-keys`; `--once` prints the same view as text. Also: NVML alone (no ledger,
no trace) and no NVML at all."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from cudatrace.record_types import TopSnapshot
from support import children
from support.cli import checkout_env, cudatrace
from support.paths import REPO


def _mismatches(value: object, cls: type) -> list[str]:
    """tests/unit/test_record_types.py's check: value's keys against the TypedDict's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "record_types_check", REPO / "tests" / "unit" / "test_record_types.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.mismatches(value, cls)


MiB = 1 << 20


def _tmux() -> str:
    path = shutil.which("tmux")
    if path is None:
        msg = "tmux is needed to drive `cudatrace top` in a terminal: tools/install-test-deps.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + " (CI=true: not skipped)")
        pytest.skip(msg)
    return path


@pytest.fixture
def box(sim, tmp_path):
    """A simulated GPU shared by every process of the test, a ledger directory of its own."""
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir(mode=0o700)
    state = sim.new_state()

    def env(**opts):
        e = checkout_env(sim.env(state=state, **opts), cache=tmp_path / "symcache")
        e["CUDATRACE_LEDGER_DIR"] = str(ledgers)
        return e

    def start(args, e=None):
        p = children.popen(args, env=e or env(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)  # fmt: skip
        out = []
        for line in p.stdout:
            out.append(line)
            if line.strip() == "ready":
                return p, "".join(out)
        raise AssertionError(f"{args}: {''.join(out)}")

    def traced(name, *opts, hold=("3", "10m")):
        d = tmp_path / name
        args = [sys.executable, "-m", "cudatrace", "run", "-o", d, *opts, "--"]
        return start([*map(str, args), str(sim.progs["hold"]), *hold])

    return {"env": env, "start": start, "traced": traced, "tmp": tmp_path, "sim": sim}


def _pid_of_child(launcher: subprocess.Popen) -> int:
    kids = children.descendants(launcher.pid)
    assert kids, "the launcher's command is gone"
    return kids[-1]


class Pane:
    """One tmux server of the test's own (its own socket), one window running a command."""

    def __init__(self, tmp, env, command: str, width: int = 200, height: int = 50):
        self.tmux = _tmux()
        self.sock = str(tmp / "tmux.sock")
        script = tmp / "pane.sh"
        script.write_text(f'{command}\necho "top exited $?"\nsleep 120\n')
        # curses takes an exported COLUMNS or LINES (pytest-xdist's workers have them) over the
        # terminal's own size, as every curses program does: a terminal has none
        env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES", "TMUX")}
        conf = tmp / "tmux.conf"  # the window's size is ours, whatever a client says
        conf.write_text(f"set -g default-size {width}x{height}\n")
        subprocess.run([self.tmux, "-S", self.sock, "-f", str(conf), "new-session", "-d",
                        "-x", str(width), "-y", str(height), "bash", str(script)],
                       env=dict(env, TERM="xterm-256color"), check=True, timeout=30)  # fmt: skip

    def size(self) -> str:
        r = subprocess.run([self.tmux, "-S", self.sock, "display", "-p", "#{pane_width}x#{pane_height}"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
        return r.stdout.strip()

    def screen(self) -> str:
        r = subprocess.run([self.tmux, "-S", self.sock, "capture-pane", "-p"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
        return r.stdout

    def wait_for(self, test, what: str, timeout: float = 60) -> str:
        end = time.monotonic() + timeout
        while True:
            text = self.screen()
            if test(text):
                return text
            if time.monotonic() > end:
                raise AssertionError(f"the screen never showed {what}:\n{text}")
            time.sleep(0.2)

    def keys(self, *keys: str) -> None:
        subprocess.run([self.tmux, "-S", self.sock, "send-keys", *keys], check=True, timeout=30)

    def close(self) -> None:
        subprocess.run([self.tmux, "-S", self.sock, "kill-server"], timeout=30,
                       capture_output=True)  # fmt: skip


def _process_pids(screen: str) -> list[int]:
    """The pids of the processes' table, in the order shown."""
    out = []
    lines = screen.splitlines()
    start = next(i for i, x in enumerate(lines) if x.split()[:2] == ["PID", "NVML"])
    for line in lines[start + 1 :]:
        m = re.match(r"\s+(\d+)\s", line)
        if not m:
            break
        out.append(int(m.group(1)))
    return out


def _words(text: str) -> str:
    return " ".join(text.split())


def test_top_in_a_terminal_shows_the_box_sorts_and_quits(box):
    free, _ = box["start"]([str(box["sim"].progs["hold"]), "1", "8m"])
    run1, out1 = box["traced"]("run1", "--budget", "64MiB", "--group", "g1")
    run2, out2 = box["traced"]("run2", "--group", "g1", hold=("2", "20m"))
    assert "budget exceeded" in out2, out2
    pid1, pid2 = _pid_of_child(run1), _pid_of_child(run2)
    pane = Pane(box["tmp"], box["env"](), f"{sys.executable} -m cudatrace top")
    try:
        first = pane.wait_for(lambda s: "LATEST DENIALS" in s and "TOP SITES" in s,
                              "the sites and the denials")  # fmt: skip
        assert "sort: NVML's memory" in first and pane.size() == "200x50", pane.size()
        # every process with NVML's figure, by memory: run1 (30 MiB), run2 (20), free (8)
        assert _process_pids(first) == [pid1, pid2, free.pid], first
        row = next(x for x in first.splitlines() if x.split()[:1] == [str(pid1)])
        assert row.split()[1:8] == ["30.0", "MiB", "30.0", "MiB", "g1", "run1", "hold"], row
        row = next(x for x in first.splitlines() if x.split()[:1] == [str(free.pid)])
        assert "UNFENCED" in row and "8.00 MiB" in row, row
        # the group: limit, in use, members, the unfenced process on its GPU
        g1 = next(x for x in first.splitlines() if x.split()[:1] == ["g1"])
        assert _words(g1) == "g1 0 0 64.0 MiB 50.0 MiB 78% 50.0 MiB 1 2 1", first
        # the traced runs' top sites, and the denial with its site
        assert "run1 (hold), device 0 (gpu 0): 30.0 MiB live" in first
        assert re.search(r"30\.0 MiB  hold_alloc \(hold\.c:\d+\)", first), first
        assert re.search(
            rf"pid {pid2} \(g1\): 20\.0 MiB cuMemAlloc_v2 at hold_alloc \(hold\.c:\d+\); in use "
            r"50\.0 MiB of 64\.0 MiB", first), first  # fmt: skip

        pane.keys("p")
        by_pid = pane.wait_for(lambda s: "sort: pid" in s, "the pid sort")
        assert _process_pids(by_pid) == sorted([pid1, pid2, free.pid]) != _process_pids(first)
        pane.keys("r")
        back = pane.wait_for(lambda s: "sort: pid, reversed" in s, "the reversed sort")
        assert _process_pids(back) == sorted([pid1, pid2, free.pid], reverse=True)
        pane.keys("g")
        one = pane.wait_for(lambda s: "group: g1" in s, "group g1 chosen")
        assert free.pid in _process_pids(one)  # unfenced on g1's GPU: shown with the group
        assert f"member pid {pid1} hold: 30.0 MiB" in one

        # --once: the same view as text
        once = cudatrace(box["env"](), "top", "--once")
        assert once.returncode == 0, once.stderr
        screen = _words("\n".join(first.splitlines()[1:]).replace(HELP_LINE, ""))
        text = once.stdout.splitlines()
        assert text[0].startswith("cudatrace top ") and "sort: NVML's memory" in text[0]
        for line in text[1:]:
            assert _words(line) in screen, (line, first)
        printed = _words("\n".join(text[1:]))
        for line in first.splitlines()[1:]:
            if line.strip() and line != HELP_LINE:
                assert _words(line) in printed, (line, once.stdout)

        pane.keys("q")
        pane.wait_for(lambda s: "top exited 0" in s, "top's exit on q", timeout=30)
    finally:
        pane.close()


HELP_LINE = (
    "keys: m l p n sort (memory, ledger, pid, name)  r reverse  d/D device  g/G group  q quit"
)


def test_once_json_is_the_snapshot(box):
    box["traced"]("run1", "--budget", "64MiB", "--group", "g1")
    r = cudatrace(box["env"](), "top", "--once", "--json")
    assert r.returncode == 0, r.stderr
    snap = json.loads(r.stdout)
    assert _mismatches(snap, TopSnapshot) == []
    ((run,),) = [snap["runs"]]
    assert run["run"] == "run1" and run["devices"][0]["live"] == 30 * MiB
    assert [g["name"] for g in snap["groups"]] == ["g1"]


def test_nvml_alone(box):
    """No ledger, no trace: the GPU and its processes, nothing else."""
    free, _ = box["start"]([str(box["sim"].progs["hold"]), "2", "16m"])
    r = cudatrace(box["env"](), "top", "--once")
    assert r.returncode == 0, r.stderr
    assert "GPU 0: cudasim" in r.stdout and str(free.pid) in r.stdout, r.stdout
    assert re.search(rf"{free.pid}\s+32\.0 MiB\s+-\s+UNFENCED\s+-\s+hold", r.stdout), r.stdout
    for absent in ("BUDGET GROUPS", "TOP SITES", "LATEST DENIALS"):
        assert absent not in r.stdout


def test_without_nvml_it_says_so(box, tmp_path):
    env = box["env"]()
    env["LD_LIBRARY_PATH"] = str(tmp_path)  # no libnvidia-ml.so.1 here
    r = cudatrace(env, "top", "--once")
    assert r.returncode == 0, r.stderr
    assert (
        "NVML: no NVIDIA driver here (libnvidia-ml.so.1 not found): no device figures" in r.stdout
    )


def test_top_needs_a_terminal_or_once(box):
    r = cudatrace(box["env"](), "top")
    assert r.returncode == 2 and "use --once" in r.stderr, r.stderr
